"""json_slices.loads: the same document as one parse, with no long parse call on a flat "data" list."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trident.protocol import json_slices


def _loads(data, slice_size=16):
    calls: list[int] = []

    def parse(text):
        calls.append(len(text))
        return orjson.loads(text)

    return json_slices.loads(data, parse, slice_size=slice_size), calls


def _doc(data, **extra):
    return {"id": "r", "inputs": [{"name": "IN", "shape": [len(data)], "datatype": "X", "data": data}], **extra}


@pytest.mark.parametrize("data", [
    list(range(500)),
    [1.5, -2e-3, 0, 1e300] * 100,
    ["", "a", 'q"uote', "back\\slash", '","', ",", '\\",', "é", "\\\\", '"'] * 40,
    [True, False, None] * 100,
])
def test_flat_lists_are_parsed_in_slices_to_the_same_document(data):
    text = orjson.dumps(_doc(data, parameters={"data": [1, 2]}))
    got, calls = _loads(text)
    assert got == orjson.loads(text)
    assert len(calls) > 10  # the list went in many slices...
    assert max(calls[1:]) < 200  # ...none much longer than the slice size (calls[0]: the rest)


def test_whitespace_and_several_tensors():
    text = b'{"inputs": [ {"name": "A", "data" : [ ' + b" , ".join(b'"x%d"' % i for i in range(300)) + \
        b' ] }, {"name": "B", "data":[' + b",".join(b"%d" % i for i in range(300)) + b"]}]}"
    got, calls = _loads(text)
    assert got == orjson.loads(text) and len(calls) > 20


@pytest.mark.parametrize("text", [
    orjson.dumps(_doc([[1, 2], [3, 4]] * 100)),  # nested: parsed whole
    orjson.dumps(_doc([{"a": 1}] * 100)),
    orjson.dumps(_doc(["\x00trident-json-slice:0"] * 100)),  # a client string that looks like a marker
    orjson.dumps({"inputs": [], "data": "[not a list]"}),
    orjson.dumps(_doc([1, 2, 3])),  # short: parsed whole
    orjson.dumps(_doc(["a]", "[b"] * 100)),  # brackets inside strings: parsed whole
])
def test_what_it_does_not_slice_is_parsed_whole(text):
    got, _ = _loads(text)
    assert got == orjson.loads(text)


@pytest.mark.parametrize("text", [
    b'{"inputs":[{"data":[' + b"1," * 200 + b"]}]}",  # trailing comma
    b'{"inputs":[{"data":[' + b'"a",' * 200 + b'"unterminated]}]}',
    b'{"inputs":[{"data":[' + b"1," * 200 + b"1]}",  # unbalanced
    b'{"inputs":[{"data":[' + b"1," * 200 + b"1]}]} trailing",
])
def test_invalid_documents_raise_as_one_parse_does(text):
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    with pytest.raises(ValueError):
        _loads(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet='ab",\\]x[ \n\u00e9', max_size=6),
                          st.floats(allow_nan=False, allow_infinity=False), st.integers(-10**6, 10**6)),
                max_size=120),
       st.integers(4, 64))
def test_any_flat_list_round_trips(data, slice_size):
    text = orjson.dumps(_doc(data))
    got, _ = _loads(text, slice_size)
    assert got == orjson.loads(text)


def test_convert_keeps_each_list_as_its_converted_slices():
    """With convert, a long list becomes a SlicedList: each slice converted as it is parsed (no
    list of all elements is built), in order, its length and whole() the list's."""
    data = list(range(3000))
    text = orjson.dumps({"inputs": [{"name": "A", "data": data}, {"name": "B", "data": [1, 2]}]})
    seen: list[int] = []

    def convert(items):
        seen.append(len(items))
        return ("slice", items[0], items[-1])

    doc = json_slices.loads(text, orjson.loads, slice_size=256, convert=convert)
    sliced = doc["inputs"][0]["data"]
    assert isinstance(sliced, json_slices.SlicedList)
    assert len(sliced) == sliced.length == 3000 and sum(seen) == 3000 and len(seen) > 20
    assert max(seen) < 100  # about 256 bytes of text per slice
    assert sliced.parts[0] == ("slice", 0, seen[0] - 1) and sliced.parts[-1][2] == 2999
    assert sliced.whole() == data
    assert doc["inputs"][1]["data"] == [1, 2]  # short lists stay lists


def test_windowed_find_equals_find():
    buf = b"x" * 50 + b'"data"' + b"y" * 50
    for window in (1, 3, 7, 64, 1 << 20):
        old = json_slices.SCAN_WINDOW
        json_slices.SCAN_WINDOW = window
        try:
            for needle in (b'"data"', b"y", b"z", b"x"):
                for start in (0, 10, 49, 53, 60):
                    assert json_slices._find(buf, needle, start, len(buf)) == buf.find(needle, start), (window, needle)
                    view = memoryview(bytearray(buf))[:]  # a memoryview is searched window by window too
                    assert json_slices._find(view, needle, start, len(buf)) == buf.find(needle, start), (window, needle)
        finally:
            json_slices.SCAN_WINDOW = old


def test_a_body_in_a_numpy_buffer_is_parsed_without_a_copy_of_it():
    """A large body received into a numpy buffer (trident.http.fast_infer) arrives as a
    memoryview of it: parsed in place, never copied whole (one copy holds the GIL for tens of
    milliseconds at 45 MiB), to the same document."""
    import tracemalloc

    import numpy as np

    text = orjson.dumps({"inputs": [{"name": "A", "shape": [400_000], "datatype": "BYTES",
                                     "data": ["ab"] * 400_000},
                                    {"name": "B", "shape": [300_000], "datatype": "FP32",
                                     "data": [0.5] * 300_000}]})
    body = np.frombuffer(text, dtype=np.uint8).copy()
    view = memoryview(body)
    tracemalloc.start()
    try:
        doc = json_slices.loads(view, orjson.loads, json_slices.SLICE_SIZE, lambda items: len(items))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(text) // 2, (peak, len(text))  # a window of the search at most, not the body
    assert doc["inputs"][0]["data"].length == 400_000 and doc["inputs"][1]["data"].length == 300_000
    assert sum(doc["inputs"][0]["data"].parts) == 400_000
    assert json_slices.loads(view, orjson.loads) == orjson.loads(text)
