"""Parsing a large KServe JSON document in slices, so a worker thread never holds the GIL long.

A C JSON parser (orjson) holds the GIL for the whole document: 0.3-0.5 s for a 45 MiB body of
15M strings or 12M numbers, during which the event loop cannot run even though the parse is in
a worker thread. Nearly all of such a body is the flat ``"data": [...]`` lists of its tensors,
so :func:`loads` cuts each long flat list out of the text, parses the small rest of the
document, then parses each list in slices of about ``slice_size`` bytes; between two slices
the thread runs Python code, where the interpreter hands the GIL to the loop's thread.

The result is exactly what parsing the whole document gives: anything this module does not
recognise (nested lists or objects, a ``[`` or ``]`` inside a string element, a cut that is
not between two elements) makes it parse the whole document instead.

With ``convert``, no long list is ever built either: each parsed slice goes through
``convert`` at once (e.g. to a small numpy array) and the document holds a :class:`SlicedList`
of the converted slices where the list was. A list of 12M Python floats costs ~300 MiB and,
worse, ~110 ms of GIL to free in one C call; its slices cost neither. The scans that find the
lists are windowed too (no ``find`` over more than ``SCAN_WINDOW`` bytes at once). Sans-IO;
pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Loads = Callable[[bytes | bytearray | memoryview], Any]
Searchable = bytes | bytearray | memoryview  # a memoryview: contiguous, of unsigned bytes
Convert = Callable[[list[Any]], Any]

SLICE_SIZE = 1 << 15  # bytes of list text parsed at once (~8k numbers: a fraction of a millisecond)
SCAN_WINDOW = 1 << 20  # bytes searched by one find call
_KEY = b'"data"'
_COLON_BRACKET = re.compile(rb'\s*:\s*\[')
_STRING_BOUNDARY = re.compile(rb'"\s*,\s*"')
_MARKER = "\x00trident-json-slice:"


class _Fallback(Exception):
    """The text is not what the slicing understands: parse the whole document."""


class SlicedList:
    """A long flat JSON list, as the ``convert``-ed results of its parsed slices, in order.

    ``parts`` are what ``convert`` returned for each slice; ``length`` is the number of
    elements of the list (the sum of the slices' lengths); :meth:`whole` parses the list's
    text in one go, for the rare consumer that needs the JSON values themselves.
    """

    __slots__ = ("parts", "length", "_text", "_parse")

    def __init__(self, parts: list[Any], length: int, text: memoryview, parse: Loads) -> None:
        self.parts = parts
        self.length = length
        self._text = text
        self._parse = parse

    def whole(self) -> list[Any]:
        """The list's elements as one parse of its text gives them (a long list: slow)."""
        out = self._parse(b"[" + bytes(self._text) + b"]")
        assert isinstance(out, list)
        return out

    def release(self) -> None:
        """Drop the parts one at a time. Freed all at once, with the list, the parts of a long
        list of strings (object arrays: one reference per element) are freed in one C call that
        holds the GIL: ~70 ms for 15M elements; one at a time, the interpreter may hand the GIL
        over between two of them."""
        parts = self.parts
        while parts:
            parts.pop()

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"SlicedList({len(self.parts)} slices, {self.length} elements)"


def loads(data: bytes | bytearray | memoryview, parse: Loads, slice_size: int = SLICE_SIZE,
          convert: Convert | None = None) -> Any:
    """``parse(data)``, computed with no single ``parse`` call on more than about ``slice_size``
    bytes of a long flat ``"data"`` list. With ``convert``, each such list is a
    :class:`SlicedList` of ``convert(slice)`` results instead (shorter lists stay lists).
    Raises what ``parse`` raises for invalid JSON."""
    buf = _searchable(data)
    spans: list[tuple[int, int, bool]] = []  # (the '[' index, the ']' index, holds strings)
    key = _find(buf, _KEY, 0, len(buf))
    while key >= 0:  # bytes.find, not a regex scan: the lists themselves are skipped, never searched
        match = _COLON_BRACKET.match(buf, key + len(_KEY))
        following = key + len(_KEY)
        if match is not None:
            start = match.end() - 1
            end = _find(buf, b"]", start, len(buf))
            if end < 0:
                break
            following = end + 1
            flat = _find(buf, b"[", start + 1, end) < 0 and _find(buf, b"{", start + 1, end) < 0
            if flat and end - start >= slice_size:
                spans.append((start, end, _find(buf, b'"', start + 1, end) >= 0))
            elif not flat:
                following = start + 1  # nested: look for keys inside it too
        key = _find(buf, _KEY, following, len(buf))
    if not spans:
        return parse(data)
    try:
        skeleton = bytearray()
        pos = 0
        for i, (start, end, _) in enumerate(spans):
            skeleton += buf[pos:start]
            skeleton += b'"\\u0000trident-json-slice:%d"' % i
            pos = end + 1
        skeleton += buf[pos:]
        doc = parse(skeleton)
        lists = [_parse_list(buf, start + 1, end, strings, parse, slice_size, convert)
                 for start, end, strings in spans]
        found = _substitute(doc, lists)
    except (_Fallback, ValueError):
        return parse(data)
    if found != len(lists):
        return parse(data)
    return doc


def _find(buf: Searchable, needle: bytes, start: int, end: int) -> int:
    """``buf.find(needle, start, end)``, in windows of ``SCAN_WINDOW`` bytes (a thread running
    it can hand the GIL over between two windows); a memoryview's windows are copied to search
    them (it has no ``find``)."""
    overlap = len(needle) - 1
    while start < end:
        stop = min(end, start + SCAN_WINDOW)
        if isinstance(buf, memoryview):
            at = bytes(buf[start:min(end, stop + overlap)]).find(needle)
            at = at + start if at >= 0 else -1
        else:
            at = buf.find(needle, start, min(end, stop + overlap))
        if at >= 0 or stop >= end:
            return at
        start = stop
    return -1


def _searchable(data: bytes | bytearray | memoryview) -> Searchable:
    """``data`` as :func:`_find` and the regular expressions search it, never copied whole
    (one copy of a 45 MiB body holds the GIL for tens of milliseconds): the bytes or bytearray
    under a memoryview of a whole one, else the memoryview as bytes (a body received into a
    numpy buffer)."""
    if not isinstance(data, memoryview):
        return data
    base = data.obj
    if isinstance(base, (bytes, bytearray)) and data.contiguous and data.nbytes == len(base):
        return base
    if data.contiguous:
        return data.cast("B") if data.format != "B" or data.ndim != 1 else data
    return bytes(data)


def _parse_list(buf: Searchable, start: int, end: int, strings: bool, parse: Loads,
                slice_size: int, convert: Convert | None) -> list[Any] | SlicedList:
    """The elements of the flat list whose text is ``buf[start:end]``, parsed slice by slice
    (a SlicedList of the converted slices with ``convert``). Raises _Fallback when a slice is
    not a run of whole elements."""
    out: list[Any] = []
    count = 0
    pos = start
    while pos < end:
        cut = pos + slice_size
        piece_end, following = end, end
        if cut < end:
            if strings:  # the next '","' that closes an element (a parse of the slice proves it)
                match = _STRING_BOUNDARY.search(buf, cut, end)
                if match is not None:
                    piece_end, following = match.start() + 1, match.end() - 1
            else:
                comma = _find(buf, b",", cut, end)
                if comma >= 0:
                    piece_end, following = comma, comma + 1
        try:
            items = parse(b"[" + buf[pos:piece_end] + b"]")
        except ValueError:
            if not strings or piece_end == end:
                raise _Fallback() from None
            # the '","' was inside a string element: take one more element into this slice
            match = _STRING_BOUNDARY.search(buf, piece_end + 1, end)
            if match is None:
                piece_end = following = end
            else:
                piece_end, following = match.start() + 1, match.end() - 1
            try:
                items = parse(b"[" + buf[pos:piece_end] + b"]")
            except ValueError:
                raise _Fallback() from None
        if not isinstance(items, list):
            raise _Fallback()
        if convert is None:
            out.extend(items)
        else:
            count += len(items)
            out.append(convert(items))
            del items  # freed now, a slice at a time
        pos = following
    return out if convert is None else SlicedList(out, count, memoryview(buf)[start:end], parse)


def _substitute(node: Any, lists: list[list[Any] | SlicedList]) -> int:
    """Put the parsed lists back where their markers are; returns how many were placed."""
    placed = 0
    if isinstance(node, dict):
        items: Any = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return 0
    for key, value in list(items):
        if isinstance(value, str) and value.startswith(_MARKER):
            index = int(value[len(_MARKER):])
            if index >= len(lists):
                raise _Fallback()
            node[key] = lists[index]
            placed += 1
        elif isinstance(value, (dict, list)):
            placed += _substitute(value, lists)
    return placed
