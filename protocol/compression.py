"""HTTP body compression (``Content-Encoding`` / ``Accept-Encoding``) and base64, sans-IO.

Like Triton: request bodies may be gzip or deflate (any other coding is UNSUPPORTED); the
response coding is the supported one with the highest q-value in ``Accept-Encoding``.
Decompression is bounded so a small compressed body cannot expand past the input limit.
Re-exported by :mod:`trident.protocol.kserve`.
"""

from __future__ import annotations

import base64
import binascii
import zlib

from trident.errors import invalid_arg, unsupported

__all__ = ["choose_encoding", "compress", "decode_base64", "decompress"]


def decompress(
    body: bytes | bytearray | memoryview, content_encoding: str | None, max_size: int | None = None
) -> bytes | bytearray | memoryview:
    """Undo ``Content-Encoding`` gzip or deflate (identity/absent returns ``body`` unchanged).

    Raises TritonError UNSUPPORTED for any other encoding ("Unsupported compression type"),
    INVALID_ARG for corrupt data or when the decompressed size would exceed ``max_size``.
    """
    if not content_encoding:
        return body
    encoding = content_encoding.strip().lower()
    if encoding == "identity":
        return body
    if encoding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise unsupported(f"Unsupported compression type '{content_encoding}'")
    try:
        return _inflate(body, wbits, max_size)
    except zlib.error as exc:
        if encoding == "deflate":  # some clients send raw deflate without the zlib wrapper
            try:
                return _inflate(body, -zlib.MAX_WBITS, max_size)
            except zlib.error:
                pass
        raise invalid_arg(f"failed to decompress the {encoding} request body: {exc}") from None


def _inflate(body: bytes | bytearray | memoryview, wbits: int, max_size: int | None) -> bytearray:
    d = zlib.decompressobj(wbits)
    limit = 0 if max_size is None else max_size + 1
    out = bytearray(d.decompress(body, limit))  # writable, so decoded tensors are too
    if max_size is not None and (len(out) > max_size or d.unconsumed_tail):
        raise invalid_arg(f"the decompressed request body exceeds the maximum input size of {max_size} bytes")
    out += d.flush()
    if max_size is not None and len(out) > max_size:
        raise invalid_arg(f"the decompressed request body exceeds the maximum input size of {max_size} bytes")
    if not d.eof:
        raise zlib.error("incomplete or truncated stream")
    return out


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
