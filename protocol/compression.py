"""HTTP body compression (``Content-Encoding`` / ``Accept-Encoding``) and base64, sans-IO.

Like Triton: request bodies may be gzip or deflate (any other coding is UNSUPPORTED); the
response coding is the supported one with the highest q-value in ``Accept-Encoding``.
Decompression is bounded so a small compressed body cannot expand past the input limit, and
incremental (:class:`Inflater`) so a caller can keep a small body inline and move the rest of a
large one off its event loop.
Re-exported by :mod:`trident.protocol.kserve`.
"""

from __future__ import annotations

import base64
import binascii
import zlib

from trident.errors import invalid_arg, unsupported
from trident.protocol.buffers import Buffer, join_pieces

__all__ = ["BoundedInflater", "Inflater", "OutputTooLarge", "choose_encoding", "compress", "decode_base64", "decompress"]


def decompress(
    body: bytes | bytearray | memoryview, content_encoding: str | None, max_size: int | None = None
) -> bytes | bytearray | memoryview:
    """Undo ``Content-Encoding`` gzip or deflate (identity/absent returns ``body`` unchanged).

    Raises TritonError UNSUPPORTED for any other encoding ("Unsupported compression type"),
    INVALID_ARG for corrupt data or when the decompressed size would exceed ``max_size``.
    """
    inflater = Inflater(body, content_encoding, max_size)
    inflater.run()
    return inflater.result


class OutputTooLarge(Exception):
    """The inflated output would pass its limit."""


class BoundedInflater:
    """One zlib stream inflated in steps of bounded output, never past ``max_size`` bytes.

    ``wbits`` as :func:`zlib.decompressobj` takes it (gzip, zlib or raw deflate); ``max_size``
    None is unbounded. :meth:`step` inflates up to ``max_output`` more bytes and says whether
    the stream is whole; ``size`` counts the bytes inflated so far. Knows no protocol: raises
    OutputTooLarge, or zlib.error for corrupt or truncated data (and, with ``strict``, data
    after the end of the stream). Both the HTTP body (:class:`Inflater`) and the gRPC message
    (grpc_framing.GzipInflater) use it.

    The output, writable (so decoded tensors are too), is either ``output``, a ``bytearray``
    that grows at each step, or, with ``pieces``, the steps' pieces kept apart and joined by
    :meth:`joined` a piece at a time into one buffer (:func:`~trident.protocol.buffers.join_pieces`):
    a growing ``bytearray`` is moved whole by ``realloc`` each time it outgrows its place in the
    heap (glibc serves blocks up to the server's 32 MiB mmap threshold from it), tens of
    milliseconds of copying with the GIL held for a 60 MiB body. :meth:`take_pieces` hands the
    pieces themselves to a caller that joins them its own way (the gRPC message decoder wants
    a ``bytearray``: joined from ``bytes`` pieces, CPython copies them without the GIL).
    """

    __slots__ = ("output", "size", "_pieces", "_max_size", "_d", "_tail", "_strict")

    def __init__(self, data: bytes | bytearray | memoryview, wbits: int, max_size: int | None, *,
                 strict: bool = False, pieces: bool = False) -> None:
        self.output = bytearray()
        self.size = 0
        self._pieces: list[Buffer] | None = [] if pieces else None
        self._max_size = max_size
        self._d = zlib.decompressobj(wbits)
        self._tail: bytes | bytearray | memoryview = data
        self._strict = strict

    def step(self, max_output: int) -> bool:
        """Inflate up to ``max_output`` (> 0) more bytes; True once the stream is whole."""
        d = self._d
        if self._max_size is not None:
            max_output = min(max_output, self._max_size + 1 - self.size)
        chunk = d.decompress(self._tail, max_output)
        self._tail = d.unconsumed_tail
        if not chunk and not self._tail and not d.eof:
            chunk = d.flush()
            if not d.eof:
                raise zlib.error("incomplete or truncated stream")
        if chunk:
            if self._pieces is None:
                self.output += chunk
            else:
                self._pieces.append(chunk)
            self.size += len(chunk)
        if self._max_size is not None and self.size > self._max_size:
            if self._pieces is not None:
                self._pieces.clear()
            raise OutputTooLarge()
        if d.eof and self._strict and d.unused_data:
            raise zlib.error("trailing data after the end of the stream")
        return d.eof

    def take_pieces(self) -> list[Buffer]:
        """With ``pieces``: the pieces inflated so far, in order (this inflater lets go of them)."""
        assert self._pieces is not None, "take_pieces needs pieces=True"
        pieces, self._pieces = self._pieces, []
        return pieces

    def joined(self) -> bytearray | memoryview:
        """With ``pieces``: what was inflated, as one buffer (the pieces are let go as they are
        copied; call it once, when :meth:`step` has returned True). Without: ``output``."""
        if self._pieces is None:
            return self.output
        return join_pieces(self._pieces, self.size)


class Inflater:
    """Incremental :func:`decompress` of one body, so a caller can bound the work done per step.

    ``run(budget)`` inflates until the body is done (True) or ``budget`` more output bytes were
    produced (False: call again); ``result`` is the decoded body once done. A caller keeps small
    bodies inline and moves what is left of a large one elsewhere (a worker thread).

    Raises TritonError UNSUPPORTED from the constructor for an unsupported coding; ``run``
    raises INVALID_ARG for corrupt data or output beyond ``max_size``.
    """

    STEP = 1 << 20  # output bytes per zlib call

    def __init__(
        self, body: bytes | bytearray | memoryview, content_encoding: str | None, max_size: int | None = None
    ) -> None:
        self._body = body
        self._max_size = max_size
        self.result: bytes | bytearray | memoryview = body
        self.done = True
        self._inflater: BoundedInflater | None = None
        encoding = content_encoding.strip().lower() if content_encoding else "identity"
        if encoding == "identity":
            return
        if encoding == "gzip":
            wbits = 16 + zlib.MAX_WBITS
        elif encoding == "deflate":
            wbits = zlib.MAX_WBITS
        else:
            raise unsupported(f"Unsupported compression type '{content_encoding}'")
        self._encoding = encoding
        self._start(wbits)

    def _start(self, wbits: int) -> None:
        self._wbits = wbits
        self._inflater = BoundedInflater(self._body, wbits, self._max_size, pieces=True)
        self.done = False

    def run(self, budget: int | None = None) -> bool:
        """Inflate up to ``budget`` more output bytes (all when None); True once the body is done."""
        if self.done or self._inflater is None:
            return True
        start = self._inflater.size
        while not self.done:
            inflater = self._inflater  # a new one when raw deflate is retried
            if budget is not None and inflater.size - start >= budget:
                return False
            try:
                self.done = inflater.step(self.STEP)
            except OutputTooLarge:
                raise invalid_arg(
                    f"the decompressed request body exceeds the maximum input size of {self._max_size} bytes"
                ) from None
            except zlib.error as exc:
                if self._encoding == "deflate" and self._wbits > 0:
                    # some clients send raw deflate without the zlib wrapper
                    self._start(-zlib.MAX_WBITS)
                    start = 0
                    continue
                raise invalid_arg(f"failed to decompress the {self._encoding} request body: {exc}") from None
        self.result = self._inflater.joined()
        return True


def choose_encoding(accept_encoding: str | None) -> str | None:
    """Pick gzip or deflate from an ``Accept-Encoding`` value, None for identity.

    Like Triton: the supported coding with the highest q-value wins (first one on ties);
    q=0 excludes a coding; anything else is ignored.
    """
    if not accept_encoding:
        return None
    best = "identity"
    weight = 0.0
    for item in accept_encoding.split(","):
        coding, _, rest = item.partition(";")
        coding = coding.strip().lower()
        if coding not in ("gzip", "deflate", "identity"):
            continue
        q = 1.0
        rest = rest.strip()
        if rest:
            key, _, value = rest.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    continue
        if q > weight:
            best, weight = coding, q
    return None if best == "identity" else best


def compress(
    body: bytes | bytearray | memoryview, accept_encoding: str | None
) -> tuple[bytes | bytearray | memoryview, str | None]:
    """Compress a response body per ``Accept-Encoding``: returns ``(data, encoding or None)``."""
    encoding = choose_encoding(accept_encoding)
    if encoding is None:
        return body, None
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    return c.compress(body) + c.flush(), encoding


def decode_base64(value: str, what: str) -> bytes:
    """Strict base64 decode; raises INVALID_ARG naming ``what`` on bad input."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_arg(f"failed to decode base64 value of '{what}'") from None
