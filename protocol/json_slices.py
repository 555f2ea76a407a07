"""Parsing a large KServe JSON document in slices, so a worker thread never holds the GIL long.

A C JSON parser (orjson) holds the GIL for the whole document: 0.3-0.5 s for a 45 MiB body of
15M strings or 12M numbers, during which the event loop cannot run even though the parse is in
a worker thread. Nearly all of such a body is the flat ``"data": [...]`` lists of its tensors,
so :func:`loads` cuts each long flat list out of the text, parses the small rest of the
document, then parses each list in slices of about ``slice_size`` bytes; between two slices
the thread runs Python code, where the interpreter hands the GIL to the loop's thread.

The result is exactly what parsing the whole document gives: anything this module does not
recognise (nested lists or objects, a ``[`` or ``]`` inside a string element, a cut that is
not between two elements) makes it parse the whole document instead. Sans-IO; pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Loads = Callable[[bytes | bytearray | memoryview], Any]

SLICE_SIZE = 1 << 18  # bytes of list text parsed at once
_KEY = b'"data"'
_COLON_BRACKET = re.compile(rb'\s*:\s*\[')
_STRING_BOUNDARY = re.compile(rb'"\s*,\s*"')
_MARKER = "\x00trident-json-slice:"


class _Fallback(Exception):
    """The text is not what the slicing understands: parse the whole document."""


def loads(data: bytes | bytearray | memoryview, parse: Loads, slice_size: int = SLICE_SIZE) -> Any:
    """``parse(data)``, computed with no single ``parse`` call on more than about ``slice_size``
    bytes of a long flat ``"data"`` list. Raises what ``parse`` raises for invalid JSON."""
    buf = _searchable(data)
    spans: list[tuple[int, int, bool]] = []  # (the '[' index, the ']' index, holds strings)
    key = buf.find(_KEY)
    while key >= 0:  # bytes.find, not a regex scan: the lists themselves are skipped, never searched
        match = _COLON_BRACKET.match(buf, key + len(_KEY))
        following = key + len(_KEY)
        if match is not None:
            start = match.end() - 1
            end = buf.find(b"]", start)
            if end < 0:
                break
            following = end + 1
            flat = buf.find(b"[", start + 1, end) < 0 and buf.find(b"{", start + 1, end) < 0
            if flat and end - start >= slice_size:
                spans.append((start, end, buf.find(b'"', start + 1, end) >= 0))
            elif not flat:
                following = start + 1  # nested: look for keys inside it too
        key = buf.find(_KEY, following)
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
        lists = [_parse_list(buf, start + 1, end, strings, parse, slice_size) for start, end, strings in spans]
        found = _substitute(doc, lists)
    except (_Fallback, ValueError):
        return parse(data)
    if found != len(lists):
        return parse(data)
    return doc


def _searchable(data: bytes | bytearray | memoryview) -> bytes | bytearray:
    """``data`` as something with ``find``: the object under a memoryview of a whole bytes or
    bytearray (no copy of a large body), else a copy."""
    if not isinstance(data, memoryview):
        return data
    base = data.obj
    if isinstance(base, (bytes, bytearray)) and data.contiguous and data.nbytes == len(base):
        return base
    return bytes(data)


def _parse_list(buf: bytes | bytearray, start: int, end: int, strings: bool, parse: Loads,
                slice_size: int) -> list[Any]:
    """The elements of the flat list whose text is ``buf[start:end]``, parsed slice by slice.
    Raises _Fallback when a slice is not a run of whole elements."""
    out: list[Any] = []
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
                comma = buf.find(b",", cut, end)
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
        out.extend(items)
        pos = following
    return out


def _substitute(node: Any, lists: list[list[Any]]) -> int:
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
