"""gRPC over HTTP/2, sans-IO: message framing, deadlines, status text and metadata encodings.

What a gRPC transport needs besides HTTP/2 itself (grpc/doc/PROTOCOL-HTTP2.md):

* every message travels as a 1-byte compressed flag, a 4-byte big-endian length and the payload;
  :class:`MessageDecoder` reassembles them from DATA chunks and enforces the maximum size;
* ``grpc-timeout`` ("1S", "250m", at most 8 digits and a unit) -> :func:`parse_timeout`;
* ``grpc-message`` is percent-encoded UTF-8 -> :func:`encode_grpc_message` / :func:`decode_grpc_message`;
* metadata keys ending in ``-bin`` carry base64 (padding optional) -> :func:`decode_binary_header`;
* ``grpc-encoding: gzip`` -> :func:`gzip_decompress` with the size limit applied to the output.

Nothing here does I/O. Errors are :class:`FramingError` carrying the gRPC status to answer.
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Iterable, Sequence

from trident.errors import GRPC_INTERNAL, GRPC_RESOURCE_EXHAUSTED, GRPC_UNIMPLEMENTED
from trident.protocol.buffers import join_pieces
from trident.protocol.compression import BoundedInflater, OutputTooLarge

Buffer = bytes | bytearray | memoryview

PREFIX = struct.Struct(">BI")
PREFIX_SIZE = PREFIX.size

# Default maximum size of one received or sent message (after decompression). Triton allows
# INT32_MAX; trident defaults lower (ServerOptions.grpc_max_message_size, --grpc-max-message-size)
# because a message is buffered whole before it is decoded.
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024 * 1024

SUPPORTED_ENCODINGS = ("identity", "deflate", "gzip")  # gRPC's deflate is zlib (RFC 1950), as Triton's
ACCEPT_ENCODING = ",".join(SUPPORTED_ENCODINGS)


class FramingError(Exception):
    """A message cannot be accepted; ``status`` is the gRPC status code to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def frame_prefix(length: int, compressed: bool = False) -> bytes:
    """The 5-byte prefix of a message of ``length`` bytes."""
    return PREFIX.pack(1 if compressed else 0, length)


def frame(parts: Sequence[Buffer], size: int, compressed: bool = False) -> bytes:
    """One length-prefixed message from its parts (``size`` = their total length), copied once."""
    return b"".join([PREFIX.pack(1 if compressed else 0, size), *parts])


JOIN_WHOLE = 4 << 20  # payload bytes a MessageDecoder joins itself; larger ones come as Pieces


def check_size(size: int, limit: int, what: str = "received") -> None:
    """Raises FramingError(RESOURCE_EXHAUSTED) when a message of ``size`` bytes exceeds ``limit``."""
    if size > limit:
        raise FramingError(
            GRPC_RESOURCE_EXHAUSTED, f"{what} message larger than max ({size} vs. {limit})"
        )


class MessageDecoder:
    """Reassembles length-prefixed messages from the DATA chunks of one stream.

    :meth:`feed` returns the messages completed by a chunk as ``(compressed, payload)`` with
    ``payload`` a fresh ``bytearray`` (so numpy arrays decoded from it are writable and own
    no memory of the transport). A declared length above ``max_message_size`` raises
    FramingError(RESOURCE_EXHAUSTED) as soon as the prefix is seen, before the payload arrives.
    Nothing is allocated on a declaration, so :attr:`buffered` is what the peer actually sent:
    a payload that arrives within one :meth:`feed` call is copied once, at its exact size. One
    spread over several calls keeps each call's part of it until it completes, then joins the
    parts once (no reallocation on the way). A call's part is kept as the chunks themselves
    (views, no copy) when they are immutable (``bytes``, or views of one ``bytes`` object: a
    read) and cover at least half of that object, else as one copy: the memory a decoder holds
    (:attr:`held`) is at most twice :attr:`buffered`, and a payload read in large pieces is
    copied once, not twice. A payload of more than ``join_whole`` bytes spread over several
    calls is not joined here: it comes as :class:`Pieces`, which its receiver joins off its
    event loop.
    """

    __slots__ = ("max_message_size", "join_whole", "_prefix", "_chunks", "_filled", "_length", "_compressed")

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE, join_whole: int = JOIN_WHOLE) -> None:
        self.max_message_size = max_message_size
        self.join_whole = join_whole
        self._prefix = bytearray()
        self._chunks: list[Buffer] = []  # earlier calls' parts of the payload in progress (copies or views)
        self._filled = 0  # payload bytes received of the message in progress
        self._length = -1  # its declared length; -1 between messages
        self._compressed = False

    @property
    def partial(self) -> bool:
        """True while part of a message (or of its prefix) is buffered."""
        return bool(self._prefix) or self._length >= 0

    @property
    def buffered(self) -> int:
        """Bytes held for the message in progress (prefix or payload)."""
        return len(self._prefix) if self._length < 0 else self._filled

    @property
    def held(self) -> int:
        """Bytes of memory the message in progress keeps alive: its copies, and the whole of
        each ``bytes`` object its kept views come from (at most twice :attr:`buffered`)."""
        total = len(self._prefix)
        bases: dict[int, int] = {}
        for chunk in self._chunks:
            if type(chunk) is memoryview:
                bases[id(chunk.obj)] = len(chunk.obj)  # type: ignore[arg-type]
            else:
                total += len(chunk)
        return total + sum(bases.values())

    def discard(self) -> None:
        """Drop the message in progress (the stream failed)."""
        self._prefix.clear()
        self._chunks = []
        self._filled = 0
        self._length = -1

    def feed(self, data: Buffer | list[Buffer]) -> list[tuple[bool, bytearray | Pieces]]:
        """Consume one chunk (or a list of chunks, in order); returns the messages it completed.
        Raises FramingError (the decoder is then to be discarded)."""
        out: list[tuple[bool, bytearray | Pieces]] = []
        pending: list[Buffer] = []  # this call's parts of the payload in progress
        length = self._length
        filled = self._filled
        parts: Iterable[Buffer] = data if isinstance(data, list) else (data,)
        for part in parts:
            if length >= 0:
                size = len(part)
                if filled + size < length:  # inside a payload that goes on past this part (most of a large one)
                    pending.append(part)
                    filled += size
                    continue
            view = memoryview(part)
            end = len(view)
            pos = 0
            while pos < end:
                if length < 0:
                    prefix = self._prefix
                    if not prefix and end - pos >= PREFIX_SIZE:
                        flag, length = PREFIX.unpack_from(view, pos)
                        pos += PREFIX_SIZE
                    else:
                        need = PREFIX_SIZE - len(prefix)
                        prefix += view[pos : pos + need]
                        pos += min(need, end - pos)
                        if len(prefix) < PREFIX_SIZE:
                            break
                        flag, length = PREFIX.unpack(prefix)
                        prefix.clear()
                    self._start(flag, length)
                    filled = 0
                    if end - pos >= length:  # the whole payload is here: one copy, exact size
                        out.append((self._compressed, bytearray(view[pos : pos + length])))
                        pos += length
                        length = -1
                        continue
                take = min(length - filled, end - pos)
                pending.append(view[pos : pos + take])
                filled += take
                pos += take
                if filled == length:
                    out.append((self._compressed, self._join(pending, length)))
                    pending = []
                    length = -1
                    filled = 0
        self._length = length
        self._filled = filled
        if pending:  # the payload goes on in a later call: keep this call's part
            if _holdable(pending):
                self._chunks += pending
            else:
                self._chunks.append(b"".join(pending))
        return out

    def _start(self, flag: int, length: int) -> None:
        if flag not in (0, 1):
            raise FramingError(GRPC_INTERNAL, f"invalid gRPC message flag {flag:#x}")
        check_size(length, self.max_message_size)
        self._compressed = flag == 1

    def _join(self, pending: list[Buffer], length: int) -> bytearray | Pieces:
        """The completed payload: the earlier calls' copies and this call's parts, copied once
        (here, or by :meth:`Pieces.join` past ``join_whole`` bytes)."""
        chunks = self._chunks
        self._chunks = []
        if length > self.join_whole:
            if not _holdable(pending):  # views of a buffer its reader may reuse: copied now
                pending = [b"".join(pending)]
            return Pieces(chunks + pending, length)
        chunks += pending
        return bytearray().join(chunks)

    def close(self) -> None:
        """The stream ended: raises FramingError(INTERNAL) if a message is incomplete."""
        if self.partial:
            if self._length < 0:
                got, want = len(self._prefix), PREFIX_SIZE
            else:
                got, want = self._filled, self._length
            raise FramingError(GRPC_INTERNAL, f"incomplete gRPC message: stream ended after {got} of {want} bytes")


class Pieces:
    """A message payload of ``size`` bytes in the pieces it arrived in, not joined yet.

    :meth:`join` copies them into one ``bytearray`` a piece at a time (~50 ms for 60 MiB, the
    GIL free between two pieces), so a receiver joins a large payload in a worker thread and its
    event loop serves others meanwhile (joined on the loop in one call, it stalled every other
    client as long).
    """

    __slots__ = ("_parts", "size")

    def __init__(self, parts: list[Buffer], size: int) -> None:
        self._parts = parts
        self.size = size

    def __len__(self) -> int:
        return self.size

    def join(self) -> bytearray:
        """The payload, once (the pieces are let go as they are copied:
        :func:`~trident.protocol.buffers.join_pieces`)."""
        parts, self._parts = self._parts, []
        return join_pieces(parts, self.size)


def _holdable(parts: list[Buffer]) -> bool:
    """Whether ``parts`` may be kept as they are: ``bytes`` objects, or views of one ``bytes``
    object that they cover at least half of (so keeping them alive holds at most twice their
    length)."""
    base: object = None
    size = 0
    for part in parts:
        kind = type(part)
        if kind is bytes:
            continue
        if kind is not memoryview:
            return False
        obj = part.obj  # type: ignore[union-attr]
        if type(obj) is not bytes or (base is not None and obj is not base):
            return False
        base = obj
        size += part.nbytes  # type: ignore[union-attr]
    return base is None or 2 * size >= len(base)  # type: ignore[arg-type]


# ---- grpc-timeout ------------------------------------------------------------------------

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str | bytes) -> float:
    """``grpc-timeout`` header value -> seconds. Raises ValueError when malformed."""
    text = value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else value
    digits, unit = text[:-1], text[-1:]
    if not (1 <= len(digits) <= 8 and digits.isdigit() and digits.isascii()) or unit not in _TIMEOUT_UNITS:
        raise ValueError(f"malformed grpc-timeout {text!r}: expected 1 to 8 digits and a unit (H, M, S, m, u or n)")
    return int(digits) * _TIMEOUT_UNITS[unit]


def format_timeout(seconds: float) -> str:
    """Seconds -> the most precise ``grpc-timeout`` value that fits in 8 digits."""
    if seconds < 0:
        raise ValueError("a timeout cannot be negative")
    for unit, scale in (("n", 1e-9), ("u", 1e-6), ("m", 1e-3), ("S", 1.0), ("M", 60.0)):
        count = math.ceil(round(seconds / scale, 6))
        if count < 100_000_000:
            return f"{count}{unit}"
    return f"{min(math.ceil(seconds / 3600), 99_999_999)}H"


# ---- grpc-message --------------------------------------------------------------------------

_UNRESERVED = frozenset(range(0x20, 0x7F)) - {ord("%")}


def encode_grpc_message(text: str) -> str:
    """Percent-encode a status message: UTF-8, bytes outside 0x20-0x7E and '%' escaped."""
    raw = text.encode("utf-8", errors="replace")
    if all(b in _UNRESERVED for b in raw):
        return text
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in raw)


def decode_grpc_message(value: str | bytes) -> str:
    """Inverse of :func:`encode_grpc_message`; malformed escapes are kept as they are."""
    raw = value.encode("latin-1") if isinstance(value, str) else bytes(value)
    out = bytearray()
    i = 0
    while i < len(raw):
        b = raw[i]
        if b == 0x25 and _is_hex(raw[i + 1 : i + 3]):
            out.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            out.append(b)
            i += 1
    return out.decode("utf-8", errors="replace")


def _is_hex(pair: bytes) -> bool:
    return len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair)


# ---- metadata ----------------------------------------------------------------------------

# headers that belong to HTTP/2 or gRPC itself and are never application metadata
RESERVED_HEADERS = frozenset(
    {"content-type", "te", "user-agent", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding",
     "grpc-message-type", "content-length", "host", "connection", "accept-encoding"}
)


def encode_binary_header(value: bytes) -> bytes:
    """Binary metadata value -> unpadded base64 (what gRPC implementations send)."""
    return base64.b64encode(value).rstrip(b"=")


def decode_binary_header(value: str | bytes) -> bytes:
    """base64 metadata value (padded or not) -> bytes. Raises ValueError when malformed."""
    raw = value.encode("ascii") if isinstance(value, str) else bytes(value)
    raw = raw.rstrip(b"=")
    try:
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (ValueError, TypeError) as e:
        raise ValueError(f"malformed base64 in binary metadata: {e}") from None


def decode_metadata(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str | bytes]]:
    """Application metadata from request headers: pseudo-headers and gRPC's own headers are
    dropped, ``-bin`` values are base64-decoded to bytes, others decoded as ASCII/latin-1 text.
    Raises ValueError for a malformed ``-bin`` value."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        key = name.decode("latin-1")
        if key.startswith(":") or key in RESERVED_HEADERS:
            continue
        if key.endswith("-bin"):
            out.append((key, decode_binary_header(value)))
        else:
            out.append((key, value.decode("latin-1")))
    return out


# ---- compression -------------------------------------------------------------------------


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def gzip_compress(data: Buffer, level: int = 6, encoding: str = "gzip") -> bytes:
    """gzip (RFC 1952) of one message, or with ``encoding="deflate"`` its zlib (RFC 1950) form."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, _WBITS[encoding])
    return compressor.compress(data) + compressor.flush()


def response_encoding(accept: bytes) -> str | None:
    """The encoding for compressed responses from a ``grpc-accept-encoding`` value: gzip when
    the client takes it, else deflate, else None (responses stay uncompressed)."""
    names = {part.strip() for part in accept.split(b",")}
    if b"gzip" in names:
        return "gzip"
    return "deflate" if b"deflate" in names else None


class GzipInflater:
    """Inflates one gzip message in steps of bounded output, so that a caller can run the first
    step inline and the rest in a worker thread, checking for cancellation in between.

    The output never exceeds ``max_size`` (checked while inflating, so a small bomb never grows
    large). It is inflated ``STEP`` bytes per zlib call (zlib releases the GIL while it inflates,
    but copies each call's output into one object holding it) and kept in those pieces; the
    step that ends the message joins them into ``output``, a ``bytearray``, a piece at a time
    (:func:`~trident.protocol.buffers.join_pieces`; a growing ``bytearray`` would be moved
    whole, with the GIL held, each time it outgrew its place). :meth:`step` raises FramingError: RESOURCE_EXHAUSTED when the output
    would exceed ``max_size``, INTERNAL when the data is not valid gzip.
    """

    __slots__ = ("max_size", "encoding", "output", "_inflater")

    STEP = 1 << 20  # output bytes per zlib call

    def __init__(self, data: Buffer, max_size: int, encoding: str = "gzip") -> None:
        self.max_size = max_size
        self.encoding = encoding
        self.output = bytearray()  # the message, once step() has returned True
        self._inflater = BoundedInflater(data, _WBITS[encoding], max_size, strict=True, pieces=True)

    @property
    def inflated(self) -> int:
        """Bytes inflated so far."""
        return self._inflater.size

    def step(self, max_output: int) -> bool:
        """Inflate up to ``max_output`` (> 0) more bytes; True once the message is whole."""
        inflater = self._inflater
        goal = inflater.size + max_output
        try:
            while True:
                if inflater.step(min(self.STEP, goal - inflater.size)):
                    self.output = join_pieces(inflater.take_pieces(), inflater.size)
                    return True
                if inflater.size >= goal:
                    return False
        except OutputTooLarge:
            check_size(self.max_size + 1, self.max_size, "decompressed")
            raise
        except zlib.error as e:
            raise FramingError(GRPC_INTERNAL, f"could not decompress {self.encoding} message: {e}") from None


def gzip_decompress(data: Buffer, max_size: int, encoding: str = "gzip") -> bytes:
    """Inflate one gzip (or deflate) message at once. Raises FramingError like :class:`GzipInflater`."""
    inflater = GzipInflater(data, max_size, encoding)
    while not inflater.step(max_size + 1):
        pass
    return bytes(inflater.output)


def check_encoding(encoding: str | None) -> None:
    """Raises FramingError(UNIMPLEMENTED) for a ``grpc-encoding`` trident does not support."""
    if encoding is not None and encoding not in SUPPORTED_ENCODINGS:
        raise FramingError(
            GRPC_UNIMPLEMENTED,
            f"grpc-encoding '{encoding}' is not supported (supported: {ACCEPT_ENCODING})",
        )
