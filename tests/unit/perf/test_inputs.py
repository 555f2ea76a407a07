"""trident.perf.inputs: random/zero data, --shape, perf_analyzer's --input-data JSON, bad input."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from trident.perf.inputs import InputSpec, ModelInfo, build_requests, parse_shapes
from trident.perf.wire import PerfError
from trident.protocol.datatypes import deserialize_bytes

ADD_SUB = ModelInfo("add_sub", "", (InputSpec("INPUT0", "FP32", (16,)), InputSpec("INPUT1", "FP32", (16,))),
                    ("OUTPUT0", "OUTPUT1"), 8)
VAR = ModelInfo("v", "", (InputSpec("X", "INT32", (-1, 2)), InputSpec("S", "BYTES", (1,))), ("Y",), 0)


def test_random_and_zero():
    [tensors] = build_requests(ADD_SUB, 4, {}, "random")
    assert [t.shape for t in tensors] == [(4, 16), (4, 16)]
    x = np.frombuffer(tensors[0].data, np.float32).reshape(4, 16)
    assert (x[0] == x[3]).all() and x.any()  # one element repeated for the batch
    [zeros] = build_requests(ADD_SUB, 1, {}, "zero")
    assert zeros[0].data == bytes(64)


def test_variable_shapes_need_shape():
    with pytest.raises(PerfError, match="variable shape"):
        build_requests(VAR, 1, {}, "random")
    [t] = build_requests(VAR, 1, parse_shapes(["X:3,2"]), "random", string_length=5)
    assert t[0].shape == (3, 2) and len(t[0].data) == 24
    assert [len(v) for v in deserialize_bytes(t[1].data)] == [5]
    [t] = build_requests(VAR, 1, parse_shapes(["X:1,2"]), "random", string_data="hi")
    assert list(deserialize_bytes(t[1].data)) == [b"hi"]


@pytest.mark.parametrize("shapes, batch, message", [
    (["X:3,3"], 1, "does not match"), (["Q:1"], 1, "does not have"), (["X:3,2"], 2, "does not support batching"),
    (["X"], 1, "NAME:"), (["X:a"], 1, "integers"), (["X:-1,2"], 1, "negative"),
])
def test_bad_shapes_and_batch(shapes, batch, message):
    with pytest.raises(PerfError, match=message):
        build_requests(VAR, batch, parse_shapes(shapes), "random")


def test_batch_bounds():
    with pytest.raises(PerfError, match="max_batch_size"):
        build_requests(ADD_SUB, 9, {}, "random")
    with pytest.raises(PerfError, match="at least 1"):
        build_requests(ADD_SUB, 0, {}, "random")


def test_input_data_file(tmp_path):
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"data": [
        {"X": [1, 2, 3, 4], "S": ["a"]},
        {"X": {"content": [5, 6], "shape": [1, 2]}, "S": {"content": ["bc"], "shape": [1]}},
        {"X": {"b64": base64.b64encode(np.array([7, 8], np.int32).tobytes()).decode(), "shape": [1, 2]}, "S": ["d"]},
    ]}))
    variants = build_requests(VAR, 1, parse_shapes(["X:2,2"]), str(f))
    assert len(variants) == 3
    assert variants[0][0].shape == (2, 2) and np.frombuffer(variants[0][0].data, np.int32).tolist() == [1, 2, 3, 4]
    assert variants[1][0].shape == (1, 2) and list(deserialize_bytes(variants[1][1].data)) == [b"bc"]
    assert np.frombuffer(variants[2][0].data, np.int32).tolist() == [7, 8]


@pytest.mark.parametrize("doc, message", [
    ("not json", "not valid JSON"), ({"data": []}, "expected"), ({"data": [{"X": [1, 2]}]}, "lacks"),
    ({"data": [{"X": [1, 2, 3], "S": ["a"]}]}, "values, shape"), ({"data": [{"X": ["x", "y"], "S": ["a"]}]}, "fit INT32"),
    ({"data": [{"X": {"b64": "%%"}, "S": ["a"]}]}, "base64"), ({"data": [{"X": {"shape": [1, 2]}, "S": ["a"]}]}, "content"),
    ({"data": [{"X": [1, 2], "S": ["a"]}], "validation_data": []}, "validation_data"),
    ({"data": [{"X": {"content": [1, 2, 3], "shape": [3]}, "S": ["a"]}]}, "does not match"),
])
def test_bad_input_data(tmp_path, doc, message):
    f = tmp_path / "d.json"
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(PerfError, match=message):
        build_requests(VAR, 1, parse_shapes(["X:1,2"]), str(f))


def test_missing_file():
    with pytest.raises(PerfError, match="cannot read"):
        build_requests(VAR, 1, {}, "/nonexistent/data.json")
