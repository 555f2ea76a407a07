"""HPACK header block decoding (RFC 7541), sans-IO, linear in the block and table-driven.

:class:`Decoder` replaces ``hpack.Decoder`` on the server's receive path (it raises the same
exception classes, so callers catch ``hpack.exceptions.HPACKError``). What differs is cost:

* one pass over the block with integer offsets: ``hpack`` copies the rest of the block for
  every literal field, so a block of many small literals cost time quadratic in its size
  (80 KB of 5-byte literals: ~430 ms);
* Huffman strings (§5.2) decode a byte at a time through a 257-state x 256-byte transition
  table built once at import (:func:`decode_huffman`; ~100 ms on a loaded 2-core machine), not a nibble at a time: a 60 KB Huffman-coded value decodes
  in a fraction of ``hpack``'s time.

The dynamic table (§2.3.2, §4) evicts oldest first; an entry larger than the table empties it
(§4.4). A dynamic table size update (§6.3) is accepted only before the first field of a block
and up to ``max_allowed_table_size`` (the SETTINGS_HEADER_TABLE_SIZE the server announced,
4096 by default). Integers beyond 2**32 or encoded in more than 6 bytes, indices outside the
tables, truncated strings and bad Huffman strings (EOS inside, padding longer than 7 bits or not
all ones) raise HPACKDecodingError (or a subclass); a decoded list larger than
``max_header_list_size`` (each field counted as name + value + 32 bytes, §4.1) raises
OversizedHeaderListError as soon as it is exceeded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator

from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndex,
    InvalidTableSizeError,
    OversizedHeaderListError,
)
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

Field = tuple[bytes, bytes]

_STATIC: tuple[Field, ...] = tuple(HeaderTable.STATIC_TABLE)  # RFC 7541 Appendix A, index 1..61
_STATIC_COUNT = len(_STATIC)
_ENTRY_OVERHEAD = 32  # §4.1
_INT_MAX = 1 << 32
_EOS = 256


class Decoder:
    """One connection's HPACK decoding context (see the module docstring)."""

    __slots__ = ("max_header_list_size", "max_allowed_table_size", "_max_size", "_size", "_dynamic")

    def __init__(self, max_header_list_size: int, max_allowed_table_size: int = 4096) -> None:
        self.max_header_list_size = max_header_list_size
        self.max_allowed_table_size = max_allowed_table_size
        self._max_size = max_allowed_table_size  # the table's current maximum (§4.2)
        self._size = 0
        self._dynamic: deque[Field] = deque()  # newest first: dynamic index 62 is [0]

    @property
    def header_table_size(self) -> int:
        """The dynamic table's current maximum size (set by the encoder's size updates)."""
        return self._max_size

    @property
    def table_entries(self) -> tuple[Field, ...]:
        """The dynamic table, newest first (for tests)."""
        return tuple(self._dynamic)

    def decode(self, block: bytes | bytearray | memoryview) -> list[Field]:
        """The fields of one complete header block, in order; the dynamic table follows it.

        Raises HPACKDecodingError (InvalidTableIndex, InvalidTableSizeError) for a malformed
        block and OversizedHeaderListError past ``max_header_list_size``; after either the
        table may be out of step with the peer's, so the connection must end."""
        steps = self.decode_steps(block, 0)
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        raise AssertionError("unreachable: a step of 0 never pauses")

    def decode_steps(self, block: bytes | bytearray | memoryview, step: int) -> Generator[None, None, list[Field]]:
        """:meth:`decode` in pieces: a generator that pauses (yields None) each time about
        ``step`` more bytes of the block have been decoded (a Huffman string longer than that
        in pieces too; 0: never) and returns the fields. Decode no other block on this decoder
        until it has finished. Raises what :meth:`decode` raises, from the step that finds it."""
        data = bytes(block) if not isinstance(block, bytes) else block
        end = len(data)
        mark = step if step else end + 1  # the position after which the next field pauses first
        pos = 0
        fields: list[Field] = []
        size = 0
        limit = self.max_header_list_size
        dynamic = self._dynamic
        while pos < end:
            first = data[pos]
            if first & 0x80:  # §6.1 indexed field
                index = first & 0x7F
                pos += 1
                if index == 0x7F:
                    index, pos = _integer(data, pos, index)
                if 0 < index <= _STATIC_COUNT:
                    field = _STATIC[index - 1]
                elif _STATIC_COUNT < index <= _STATIC_COUNT + len(dynamic):
                    field = dynamic[index - _STATIC_COUNT - 1]
                else:
                    raise InvalidTableIndex(f"invalid table index {index}")
            elif first & 0x40 or not first & 0x20:  # §6.2.1 incremental indexing; §6.2.2, §6.2.3 not indexed
                if first & 0x40:
                    index, mask = first & 0x3F, 0x3F
                else:
                    index, mask = first & 0x0F, 0x0F
                pos += 1
                if index == mask:
                    index, pos = _integer(data, pos, index)
                if index == 0:
                    start, pos, huffman = _string(data, pos, end)
                    if not huffman:
                        name = data[start:pos]
                    elif pos - start <= step or not step:
                        name = decode_huffman(data[start:pos])
                    else:
                        name = yield from _huffman_steps(data, start, pos, step)
                elif index <= _STATIC_COUNT:
                    name = _STATIC[index - 1][0]
                elif index <= _STATIC_COUNT + len(dynamic):
                    name = dynamic[index - _STATIC_COUNT - 1][0]
                else:
                    raise InvalidTableIndex(f"invalid table index {index}")
                start, pos, huffman = _string(data, pos, end)
                if not huffman:
                    value = data[start:pos]
                elif pos - start <= step or not step:
                    value = decode_huffman(data[start:pos])
                else:
                    value = yield from _huffman_steps(data, start, pos, step)
                field = (name, value)
                if first & 0x40:
                    self._add(field)
            else:  # §6.3 dynamic table size update: only before the block's first field
                if fields:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                new_size = first & 0x1F
                pos += 1
                if new_size == 0x1F:
                    new_size, pos = _integer(data, pos, new_size)
                if new_size > self.max_allowed_table_size:
                    raise InvalidTableSizeError(
                        f"encoder exceeded the maximum table size: {new_size} > {self.max_allowed_table_size}")
                self._max_size = new_size
                self._evict()
                continue
            fields.append(field)
            size += len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
            if size > limit:
                raise OversizedHeaderListError(f"A header list larger than {limit} has been received")
            if pos >= mark:
                mark = pos + step
                yield
        return fields

    def _add(self, field: Field) -> None:
        entry = len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
        if entry > self._max_size:  # §4.4: the table is emptied, the entry not added
            self._dynamic.clear()
            self._size = 0
            return
        self._dynamic.appendleft(field)
        self._size += entry
        self._evict()

    def _evict(self) -> None:
        dynamic = self._dynamic
        while self._size > self._max_size:
            name, value = dynamic.pop()
            self._size -= len(name) + len(value) + _ENTRY_OVERHEAD


def _integer(data: bytes, pos: int, value: int) -> tuple[int, int]:
    """The continuation bytes of an HPACK integer (§5.1) whose prefix was full (``value``)."""
    end = len(data)
    shift = 0
    while pos < end:
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            if value >= _INT_MAX:
                break
            return value, pos
        shift += 7
        if shift > 28:
            break
    raise HPACKDecodingError("HPACK integer truncated, too long or too large")


def _string(data: bytes, pos: int, end: int) -> tuple[int, int, bool]:
    """A string literal (§5.2) at ``pos``: (where its bytes start, where they end, Huffman-coded)."""
    if pos >= end:
        raise HPACKDecodingError("Truncated header block")
    first = data[pos]
    length = first & 0x7F
    pos += 1
    if length == 0x7F:
        length, pos = _integer(data, pos, length)
    stop = pos + length
    if stop > end:
        raise HPACKDecodingError("Truncated header block")
    return pos, stop, bool(first & 0x80)


# ---- Huffman (RFC 7541 §5.2, Appendix B) ------------------------------------------------------

_TABLE: list[tuple[int, bytes]] = []  # (next state x 256, bytes emitted) at [state x 256 + input byte]
_ACCEPT: frozenset[int] = frozenset()  # states (x 256) a string may end in: padding of <= 7 one bits
_FAIL = 0  # the state (x 256) after EOS was decoded; set by _build


def decode_huffman(data: bytes | bytearray | memoryview) -> bytes:
    """The bytes a Huffman-coded HPACK string stands for. Raises HPACKDecodingError for EOS
    inside the string or padding that is longer than 7 bits or not the most significant bits
    of EOS (all ones)."""
    table = _TABLE
    out = bytearray()
    state = 0
    for byte in data:
        state, emitted = table[state + byte]
        out += emitted
    if state not in _ACCEPT:
        raise HPACKDecodingError("Invalid Huffman string")
    return bytes(out)


def _huffman_steps(data: bytes, start: int, stop: int, step: int) -> Generator[None, None, bytes]:
    """:func:`decode_huffman` of ``data[start:stop]``, pausing after each ``step`` bytes."""
    table = _TABLE
    out = bytearray()
    state = 0
    for piece in range(start, stop, step):
        if piece > start:
            yield
        for byte in data[piece : min(piece + step, stop)]:
            state, emitted = table[state + byte]
            out += emitted
    if state not in _ACCEPT:
        raise HPACKDecodingError("Invalid Huffman string")
    return bytes(out)


def _build() -> list[tuple[int, bytes]]:
    """Build the byte-at-a-time transition table from the code (at import: a 4-bit table first,
    each byte entry then two of its steps)."""
    global _ACCEPT, _FAIL
    # the code tree: internal node -> [child for bit 0, child for bit 1]; a leaf is ~symbol (negative)
    tree: list[list[int]] = [[0, 0]]
    for symbol, (code, length) in enumerate(zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=True)):
        node = 0
        for shift in range(length - 1, 0, -1):
            bit = (code >> shift) & 1
            child = tree[node][bit]
            if child == 0:
                child = len(tree)
                tree.append([0, 0])
                tree[node][bit] = child
            node = child
        tree[node][code & 1] = ~symbol
    fail = len(tree)
    nibbles: list[tuple[int, bytes]] = []  # (next state, emitted) at [state x 16 + nibble]
    for state in range(fail + 1):
        for nibble in range(16):
            node, emitted = state, bytearray()
            if state != fail:
                for shift in (3, 2, 1, 0):
                    child = tree[node][(nibble >> shift) & 1]
                    if child >= 0:
                        node = child
                    elif ~child == _EOS:
                        node = fail
                        emitted.clear()
                        break
                    else:
                        emitted.append(~child)
                        node = 0
            nibbles.append((node, bytes(emitted)))
    table: list[tuple[int, bytes]] = []
    for state in range(fail + 1):
        row = nibbles[state * 16 : state * 16 + 16]
        for high, first in row:
            step = nibbles[high * 16 : high * 16 + 16]
            for low, second in step:
                table.append((low << 8, first + second if low != fail else b""))
    accept, node = {0}, 0
    for _ in range(7):  # the all-ones path: EOS's first 7 bits
        node = tree[node][1]
        accept.add(node << 8)
    _ACCEPT = frozenset(accept)
    _FAIL = fail << 8
    _TABLE[:] = table
    return _TABLE


_build()
