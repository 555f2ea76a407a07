"""HTTP/2 header blocks, sans-IO: HPACK (RFC 7541: decoding :mod:`trident.protocol.hpack_decoder`,
encoding the ``hpack`` library's) with caches, and the
request/trailer validation of RFC 9113 §8 (the checks h2 makes, as gRPC needs them).

:class:`HeaderCodec` decodes the client's header blocks and encodes the server's. Its decode
cache maps a block's bytes to the decoded (and validated) header tuple; its encode cache maps a
header tuple to its block. An entry is only made for a block that leaves its HPACK table
unchanged (:func:`table_neutral`: only indexed fields and literals without indexing), and a
cache is cleared whenever its table changes (a block that changes it; for the encoder also a
new SETTINGS_HEADER_TABLE_SIZE from the peer), so a cached result is always exactly what
decoding or encoding would give. Both caches are bounded in entries and in what they hold.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence

import hpack
from hpack.exceptions import HPACKDecodingError

from trident.protocol.hpack_decoder import Decoder

_CONNECTION_HEADERS = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                 b"upgrade"})
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
_BAD_NAME = re.compile(rb"[\x00-\x20A-Z\x7f-\xff]")
_BAD_VALUE = re.compile(rb"[\x00\r\n]")

# per connection: a few distinct blocks (a client repeats one per method and metadata set),
# so at most ~16 x (2 KiB + its decoded fields) held
_DECODE_CACHE_ENTRIES = 16
_DECODE_CACHE_BLOCK = 2048  # blocks larger than this are not cached
_DECODE_CACHE_LIST = 16 * 1024  # nor are header lists larger than this (RFC 9113 §6.5.2 size)
_CHECK_STEP = 1024  # fields checked per piece of HeaderCodec.decode_steps
_ENCODE_CACHE_ENTRIES = 16  # the server's own constant blocks
_MAX_ENCODER_TABLE = 1 << 16  # the encoder's table never exceeds this, whatever the peer allows

Headers = tuple[tuple[bytes, bytes], ...]


class HeaderCodec:
    """One connection's HPACK state (see the module docstring). ``max_header_list`` bounds a
    decoded list (OversizedHeaderListError beyond it); ``cache=False`` turns the
    caches off."""

    def __init__(self, max_header_list: int, *, cache: bool = True) -> None:
        self.decoder = Decoder(max_header_list)
        self.encoder = hpack.Encoder()
        self.decode_cache: dict[bytes, tuple[Headers, str | None]] = {}
        self.encode_cache: dict[Headers, bytes] = {}
        self._decode_entries = _DECODE_CACHE_ENTRIES if cache else 0
        self._encode_entries = _ENCODE_CACHE_ENTRIES if cache else 0
        #: decode cache statistics, for tests and benchmarks
        self.hits = 0
        self.misses = 0

    def decode(self, block: bytes) -> tuple[Headers, str | None]:
        """The header tuple of a block and what is wrong with it as a request (None: a valid
        request; see :func:`validate_request_headers`). The tuple is shared with the cache:
        never mutate it. Raises hpack's HPACKError (OversizedHeaderListError over the limit)."""
        cache = self.decode_cache
        hit = cache.get(block)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        try:
            headers = tuple(self.decoder.decode(block))
        except (IndexError, TypeError, ValueError) as e:  # none expected: kept as a safety net
            raise HPACKDecodingError(str(e)) from None
        return self._decoded(block, headers)

    def decode_steps(self, block: bytes, step: int) -> Generator[None, None, tuple[Headers, str | None]]:
        """:meth:`decode` in pieces of about ``step`` bytes of the block (a generator that
        pauses between them; see :meth:`~trident.protocol.hpack_decoder.Decoder.decode_steps`),
        for a block too large to decode in one go. Decode no other block until it has
        finished. Raises what :meth:`decode` raises."""
        self.misses += 1
        try:
            headers = tuple((yield from self.decoder.decode_steps(block, step)))
        except (IndexError, TypeError, ValueError) as e:  # none expected: kept as a safety net
            raise HPACKDecodingError(str(e)) from None
        error = None
        for start in range(0, len(headers), _CHECK_STEP):  # the per-field checks, in pieces too
            yield
            error = _check_fields(headers[start : start + _CHECK_STEP])
            if error is not None:
                break
        if error is None:
            error = validate_request_headers(headers, fields_checked=True) if headers else "empty header block"
        self.decode_cache.clear()  # not worth a table_neutral scan: a block this large is not cached
        return headers, error

    def _decoded(self, block: bytes, headers: Headers) -> tuple[Headers, str | None]:
        """The entry of a block just decoded; cached, or the cache cleared, as the module says."""
        cache = self.decode_cache
        entry = (headers, validate_request_headers(headers) if headers else "empty header block")
        if table_neutral(block):
            if self._decode_entries and len(block) <= _DECODE_CACHE_BLOCK:
                size = 0
                for name, value in headers:
                    size += len(name) + len(value) + 32
                if size <= _DECODE_CACHE_LIST:
                    if len(cache) >= self._decode_entries:
                        cache.clear()
                    cache[block] = entry
        else:
            cache.clear()  # the table changed: what was cached may decode differently now
        return entry

    def encode(self, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
        """The HPACK block of ``headers`` (from the encode cache when that is exact: a tuple of
        headers whose last encoding left the table unchanged)."""
        key = headers if isinstance(headers, tuple) else None
        if key is not None:
            block = self.encode_cache.get(key)
            if block is not None:
                return block
        block = self.encoder.encode(headers, huffman=True)
        if table_neutral(block):
            if key is not None and self._encode_entries:
                cache = self.encode_cache
                if len(cache) >= self._encode_entries:
                    cache.clear()
                cache[key] = block
        else:
            self.encode_cache.clear()
        return block

    def set_peer_table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: the encoder's table is resized (the size update
        goes at the start of the next block) and the encode cache cleared."""
        size = min(size, _MAX_ENCODER_TABLE)
        if size != self.encoder.header_table_size:
            self.encoder.header_table_size = size
            self.encode_cache.clear()


def _read_int(block: bytes, pos: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer (RFC 7541 §5.1) at ``pos`` with an N-bit prefix: (value, next position);
    position -1 when it runs past the end or beyond 2**32."""
    mask = (1 << prefix) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    end = len(block)
    while pos < end:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            break
    return 0, -1


def table_neutral(block: bytes) -> bool:
    """Whether an HPACK block (RFC 7541 §6) leaves the dynamic table as it was: it holds only
    indexed fields (§6.1) and literals without indexing or never indexed (§6.2.2, §6.2.3), no
    literal with incremental indexing (§6.2.1) and no dynamic table size update (§6.3).
    A malformed block is not neutral."""
    pos, end = 0, len(block)
    while pos < end:
        first = block[pos]
        if first & 0x80:
            _, pos = _read_int(block, pos, 7)
        elif first & 0xE0:  # 01xxxxxx incremental indexing, 001xxxxx size update
            return False
        else:
            index, pos = _read_int(block, pos, 4)
            if pos >= 0 and index == 0:
                pos = _skip_string(block, pos)
            if pos >= 0:
                pos = _skip_string(block, pos)
        if pos < 0:
            return False
    return pos == end


def _skip_string(block: bytes, pos: int) -> int:
    if pos >= len(block):
        return -1
    length, pos = _read_int(block, pos, 7)
    if pos < 0 or pos + length > len(block):
        return -1
    return pos + length


def validate_request_headers(headers: Sequence[tuple[bytes, bytes]], *, fields_checked: bool = False) -> str | None:
    """What is wrong with a request header list (RFC 9113 §8.2, §8.3.1), None when it is valid.

    The checks h2 makes: names non-empty, lowercase, without control characters, spaces or a
    colon past the first character; values without NUL/CR/LF or surrounding whitespace; no
    connection-specific fields, TE only ``trailers``; pseudo-header fields first, known, not
    repeated, ``:method``, ``:scheme`` and a non-empty ``:path`` present (CONNECT is not
    served); ``:authority`` or ``host`` present and equal when both are. ``fields_checked``:
    the caller has checked each field itself (names, values, connection-specific fields)."""
    if not fields_checked:
        error = _check_fields(headers)
        if error is not None:
            return error
    seen: set[bytes] = set()
    regular = False
    authority = host = None
    for name, value in headers:
        if name[0] == 0x3A:  # ':'
            if regular:
                return f"pseudo-header field {name!r} after a regular field"
            if name in seen:
                return f"duplicate pseudo-header field {name!r}"
            if name not in _REQUEST_PSEUDO:
                return f"pseudo-header field {name!r} not allowed in a request"
            seen.add(name)
            if name == b":authority":
                authority = value
            elif name == b":path" and not value:
                return "empty :path"
        else:
            regular = True
            if name == b"host":
                host = value
    for name in (b":method", b":scheme", b":path"):
        if name not in seen:
            return f"request without {name.decode()}"
    if authority is None and host is None:
        return "request without :authority or host"
    if authority is not None and host is not None and authority != host:
        return "request :authority and host differ"
    return None


def validate_trailers(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """What is wrong with a trailer list (RFC 9113 §8.1: no pseudo-header fields), None if valid."""
    error = _check_fields(headers)
    if error is not None:
        return error
    for name, _ in headers:
        if name[0] == 0x3A:
            return f"pseudo-header field {name!r} in trailers"
    return None


def _check_fields(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if not name:
            return "empty header name"
        if _BAD_NAME.search(name) is not None or name.find(b":", 1) != -1:
            return f"invalid header name {name!r}"
        if value and (_BAD_VALUE.search(value) is not None or value[0] in (0x20, 0x09)
                      or value[-1] in (0x20, 0x09)):
            return f"invalid value of header {name!r}"
        if name in _CONNECTION_HEADERS:
            return f"connection-specific header {name!r}"
        if name == b"te" and value.lower() != b"trailers":
            return f"invalid TE header {value!r}"
    return None
