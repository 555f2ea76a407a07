"""KServe v2 HTTP codec: requests as clients encode them, responses as tritonclient parses them."""

from __future__ import annotations

import json
import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.http._utils import _get_inference_request
from tritonclient.utils import np_to_triton_dtype

from trident.errors import Code, TritonError
from trident.protocol import datatypes, json_slices, kserve
from trident.types import InferenceResponse, RequestedOutput, Tensor

NUMERIC = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"]
ALL = [*NUMERIC, "FP16", "BF16", "BYTES"]


# ---- a small client-side encoder (what a KServe client puts on the wire) ---------------------


def _bytes_blob(array: np.ndarray) -> bytes:
    out = bytearray()
    for item in array.reshape(-1):
        out += struct.pack("<I", len(item)) + item
    return bytes(out)


def _blob(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return _bytes_blob(array)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


def _json_values(datatype: str, array: np.ndarray) -> list[Any]:
    if datatype == "BYTES":
        return [x.decode("utf-8") for x in array.reshape(-1)]
    return array.reshape(-1).tolist()


def client_encode(
    inputs: list[tuple[str, str, np.ndarray, str]],
    *,
    outputs: list[dict[str, Any]] | None = None,
    parameters: dict[str, Any] | None = None,
    request_id: str | None = None,
) -> tuple[bytes, int | None]:
    """inputs: (name, datatype, array, mode) with mode "json", "nested" or "binary"."""
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = parameters
    blobs: list[bytes] = []
    doc["inputs"] = []
    for name, datatype, array, mode in inputs:
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        if mode == "binary":
            blob = _blob(datatype, array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif mode == "nested" and array.ndim > 0:
            entry["data"] = (
                np.asarray(_json_values(datatype, array), dtype=object).reshape(array.shape).tolist()
            )
        else:
            entry["data"] = _json_values(datatype, array)
        doc["inputs"].append(entry)
    if outputs is not None:
        doc["outputs"] = outputs
    header = json.dumps(doc).encode()
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def decode(body: bytes, header_length: int | None) -> Any:
    return kserve.decode_infer_request(bytearray(body), header_length, "m", "1")


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    n = datatypes.element_count(shape)
    if datatype == "BYTES":
        arr = np.empty(n, dtype=object)
        arr[:] = [f"s{i}é".encode() for i in range(n)]
        return arr.reshape(shape)
    if datatype == "BOOL":
        return (np.arange(n) % 2 == 0).reshape(shape)
    if datatype == "BF16":
        return datatypes.float32_to_bf16(np.linspace(-2, 2, n, dtype=np.float32)).reshape(shape)
    dt = datatypes.numpy_dtype(datatype)
    if dt.kind == "f":
        return np.linspace(-2.5, 2.5, n).astype(dt).reshape(shape)
    info = np.iinfo(dt)
    step = (int(info.max) - int(info.min)) // max(n - 1, 1)
    return np.array([int(info.min) + i * step for i in range(n)], dtype=dt).reshape(shape)


def assert_invalid(
    body: bytes, header_length: int | None, *fragments: str, code: Code = Code.INVALID_ARG
) -> None:
    with pytest.raises(TritonError) as info:
        decode(body, header_length)
    assert info.value.code is code, info.value
    for fragment in fragments:
        assert fragment in info.value.message, info.value.message


# ---- requests: every datatype, both forms ------------------------------------------------------


@pytest.mark.parametrize("datatype", [*NUMERIC, "BYTES"])
@pytest.mark.parametrize("mode", ["json", "nested", "binary"])
def test_every_datatype_json_and_binary(datatype: str, mode: str) -> None:
    array = sample(datatype)
    body, hl = client_encode([("X", datatype, array, mode)])
    request = decode(body, hl)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, (2, 3))
    assert tensor.data.dtype == datatypes.numpy_dtype(datatype)
    np.testing.assert_array_equal(tensor.data, array)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_types_binary_ok_json_rejected(datatype: str) -> None:
    array = sample(datatype)
    body, hl = client_encode([("X", datatype, array, "binary")])
    np.testing.assert_array_equal(decode(body, hl).inputs[0].data, array)
    doc = {"inputs": [{"name": "X", "shape": [1], "datatype": datatype, "data": [1.0]}]}
    assert_invalid(
        json.dumps(doc).encode(), None, f"receiving {datatype} data via JSON is not supported", "X"
    )


def test_binary_views_the_body_without_copy() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    body, hl = client_encode([("X", "FP32", array, "binary")])
    buffer = bytearray(body)
    tensor = kserve.decode_infer_request(buffer, hl, "m", "").inputs[0]
    assert np.shares_memory(tensor.data, np.frombuffer(buffer, dtype=np.uint8))
    assert tensor.data.flags.writeable


def test_mixed_binary_and_json_inputs_keep_blob_order() -> None:
    a, b, c, d = sample("INT32"), sample("BYTES"), sample("FP64", (4,)), sample("BOOL", (1, 2))
    body, hl = client_encode(
        [
            ("A", "INT32", a, "binary"),
            ("B", "BYTES", b, "json"),
            ("C", "FP64", c, "binary"),
            ("D", "BOOL", d, "binary"),
        ],
        outputs=[{"name": "OUT", "parameters": {"binary_data": True, "classification": 2}}, {"name": "O2"}],
        parameters={"sequence_id": 7, "sequence_start": True, "custom": "x", "f": 1.5},
        request_id="req-1",
    )
    request = decode(body, hl)
    assert [t.name for t in request.inputs] == ["A", "B", "C", "D"]
    for tensor, expected in zip(request.inputs, (a, b, c, d), strict=True):
        np.testing.assert_array_equal(tensor.data, expected)
    assert request.id == "req-1"
    assert (request.model_name, request.model_version) == ("m", "1")
    assert request.parameters == {"sequence_id": 7, "sequence_start": True, "custom": "x", "f": 1.5}
    assert [(o.name, o.parameters) for o in request.outputs] == [
        ("OUT", {"binary_data": True, "classification": 2}),
        ("O2", {}),
    ]


def test_tritonclient_request_encoding_decodes() -> None:
    """The real client library's request body (binary and JSON inputs) decodes to its arrays."""
    arrays = {
        "F": np.arange(16, dtype=np.float32).reshape(1, 16),
        "I": np.array([[1, -2, 3]], dtype=np.int64),
        "S": np.array([[b"a", b"\xff\x00", b""]], dtype=object),
        "H": np.array([0.5, -1.25], dtype=np.float16),
        "T": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
        "B": np.array([True, False, True]),
    }
    inputs = []
    for i, (name, array) in enumerate(arrays.items()):
        inp = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        binary = name in ("S", "H", "T") or i % 2 == 0
        inp.set_data_from_numpy(array, binary_data=binary)
        inputs.append(inp)
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=False, class_count=3)]
    body, hl = _get_inference_request(inputs, "id7", outputs, 5, True, False, 0, None, {"p": 1})
    request = decode(body, hl)
    got = {t.name: t for t in request.inputs}
    for name, array in arrays.items():
        data = got[name].data
        if name == "T":
            data = data.view(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(data, array)
    assert got["T"].datatype == "BF16" and got["S"].datatype == "BYTES"
    assert request.id == "id7"
    assert request.parameters["sequence_id"] == 5 and request.parameters["p"] == 1
    assert request.outputs[0].parameters == {"classification": 3, "binary_data": False}


# ---- requests: BYTES edge cases --------------------------------------------------------------


def test_bytes_edge_cases() -> None:
    binary = np.array([b"", b"\x00\xff\xfe", "ünï".encode(), b"x" * 1000], dtype=object)
    body, hl = client_encode([("B", "BYTES", binary, "binary")])
    np.testing.assert_array_equal(decode(body, hl).inputs[0].data, binary)
    unicode = np.array(["", "日本語", "a\u0000b"], dtype=object)
    doc = {"inputs": [{"name": "U", "shape": [3], "datatype": "BYTES", "data": list(unicode)}]}
    got = decode(json.dumps(doc).encode(), None).inputs[0].data
    assert list(got) == [s.encode("utf-8") for s in unicode]
    empty = {"inputs": [{"name": "E", "shape": [0, 4], "datatype": "BYTES", "data": []}]}
    assert decode(json.dumps(empty).encode(), None).inputs[0].data.shape == (0, 4)


@pytest.mark.parametrize(
    ("blob", "fragment"),
    [
        (b"\x05\x00\x00\x00ab", "truncated"),
        (b"\x01\x00", "truncated"),
        (struct.pack("<I", 1) + b"a", "holds 1 elements, its shape declares 2"),
        (struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b" + struct.pack("<I", 0), "more than the 2"),
    ],
)
def test_bad_bytes_blobs(blob: bytes, fragment: str) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "S",
                    "shape": [2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    assert_invalid(header + blob, len(header), "BYTES input 'S'", fragment)


def test_bytes_json_needs_strings() -> None:
    doc = {"inputs": [{"name": "S", "shape": [2], "datatype": "BYTES", "data": ["a", 1]}]}
    assert_invalid(json.dumps(doc).encode(), None, "input 'S'", "expected JSON strings")


# ---- requests: raw binary body ---------------------------------------------------------------


def test_raw_body_deduces_the_variable_dimension() -> None:
    array = np.arange(12, dtype=np.float32)
    request = kserve.decode_raw_request(bytearray(array.tobytes()), "m", "", "IN", "FP32", [1, -1, 3])
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("IN", "FP32", (1, 4, 3))
    np.testing.assert_array_equal(tensor.data.reshape(-1), array)
    fixed = kserve.decode_raw_request(array.tobytes(), "m", "", "IN", "FP32", [12])
    assert fixed.inputs[0].shape == (12,)


def test_raw_body_bytes_is_one_element() -> None:
    request = kserve.decode_raw_request(b"\xffraw bytes", "m", "", "IN", "BYTES", [1, 1])
    assert request.inputs[0].shape == (1, 1)
    assert request.inputs[0].data[0, 0] == b"\xffraw bytes"


@pytest.mark.parametrize(
    ("datatype", "shape", "size", "fragment"),
    [
        ("FP32", [-1, -1], 16, "more than one variable-sized dimension"),
        ("FP32", [-1, 3], 16, "not a whole number"),
        ("FP32", [4], 12, "need 16"),
        ("BYTES", [2], 3, "must have input shape [1]"),
        ("BYTES", [-1], 3, "must have input shape [1]"),
        ("NOPE", [1], 4, "invalid datatype"),
    ],
)
def test_raw_body_errors(datatype: str, shape: list[int], size: int, fragment: str) -> None:
    with pytest.raises(TritonError) as info:
        kserve.decode_raw_request(b"\x00" * size, "m", "", "IN", datatype, shape)
    assert info.value.code is Code.INVALID_ARG
    assert fragment in info.value.message and "IN" in info.value.message


def test_decode_infer_request_refuses_raw_header() -> None:
    assert_invalid(b"\x00\x00\x80\x3f", 0, "decode_raw_request")


# ---- requests: bad input -----------------------------------------------------------------------

GOOD_INPUT = {"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2]}


def _with(**changes: Any) -> bytes:
    entry = {**GOOD_INPUT, **changes}
    return json.dumps({"inputs": [{k: v for k, v in entry.items() if v is not None}]}).encode()


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        (b"{not json", ["failed to parse the request JSON buffer"]),
        (b"\xff\xfe", ["failed to parse the request JSON buffer"]),
        (b"[1, 2]", ["must be a JSON object"]),
        (b"{}", ["Unable to parse 'inputs'"]),
        (b'{"inputs": {}}', ["Unable to parse 'inputs'"]),
        (b'{"inputs": [5]}', ["each input must be a JSON object"]),
        (b'{"id": 5, "inputs": []}', ["Unable to parse 'id'"]),
        (_with(name=None), ["Unable to parse 'name'"]),
        (_with(datatype="FP128"), ["invalid datatype 'FP128'", "'X'"]),
        (_with(datatype=None), ["Unable to parse 'datatype'", "'X'"]),
        (_with(shape=[-1]), ["Unable to parse 'shape'", "'X'"]),
        (_with(shape=[True, 2]), ["Unable to parse 'shape'"]),
        (_with(shape="2"), ["Unable to parse 'shape'"]),
        (_with(shape=[3]), ["Shape does not match", "needs 3 elements, 'data' holds 2", "'X'"]),
        (_with(data=None), ["no field is set", "'X'"]),
        (_with(data=5), ["expected a JSON array", "'X'"]),
        (_with(data=[1.5, 2]), ["expected integers", "INT32", "'X'"]),
        (_with(data=["1", "2"]), ["expected integers", "'X'"]),
        (_with(data=[True, False]), ["expected integers"]),
        (_with(data=[1, None]), ["expected numbers", "'X'"]),
        (_with(data=[2**31, 0]), ["out of range", "'X'"]),
        (_with(data=[1, 2], datatype="UINT8", shape=[2], parameters=None) + b"", []),
        (_with(data=[-1, 2], datatype="UINT8"), ["out of range"]),
        (_with(data=[1, 2], datatype="BOOL"), ["expected true/false"]),
        (_with(data=[True, 2.5], datatype="FP32"), []),
        (_with(data=["a", "b"], datatype="FP32"), ["expected numbers"]),
        (
            _with(parameters={"binary_data_size": 8}),
            ["only one of the following fields", "'data' 'binary_data_size'"],
        ),
        (_with(data=None, parameters={"shared_memory_region": "r"}), []),
        (_with(parameters=[1]), ["Unable to parse 'parameters' of input 'X'"]),
        (_with(parameters={"p": [1]}), ["has invalid type"]),
        (b'{"parameters": {"triton_x": 1}, "inputs": []}', ["reserved for Triton"]),
        (b'{"parameters": {"sequence_start": 1}, "inputs": []}', ["'sequence_start'"]),
        (b'{"parameters": {"priority": -1}, "inputs": []}', ["'priority'"]),
        (b'{"parameters": {"timeout": 1.5}, "inputs": []}', ["'timeout'"]),
        (b'{"parameters": {"sequence_id": -3}, "inputs": []}', ["'sequence_id'"]),
        (b'{"parameters": {"binary_data_output": "yes"}, "inputs": []}', ["'binary_data_output'"]),
        (b'{"parameters": {"x": null}, "inputs": []}', ["parameter 'x' has invalid type"]),
        (b'{"parameters": [], "inputs": []}', ["Unable to parse 'parameters'"]),
        (b'{"inputs": [], "outputs": {}}', ["Unable to parse 'outputs'"]),
        (b'{"inputs": [], "outputs": [{"n": 1}]}', ["requested output needs a string 'name'"]),
        (b'{"inputs": [], "outputs": [{"name": "o", "parameters": {"binary_data": 1}}]}', ["'binary_data'"]),
        (
            b'{"inputs": [], "outputs": [{"name": "o", "parameters": {"classification": -2}}]}',
            ["'classification'"],
        ),
        (b'{"inputs": [], "outputs": [{"name": "o", "parameters": 3}]}', ["'parameters' of output 'o'"]),
    ],
)
def test_bad_json_requests(body: bytes, fragments: list[str]) -> None:
    if not fragments:  # these are fine: small sanity cases mixed into the table
        try:
            decode(body, None)
        except TritonError as exc:
            assert exc.code is Code.UNSUPPORTED and "shared memory" in exc.message
        return
    assert_invalid(body, None, *fragments)


def test_duplicate_inputs_rejected_duplicate_outputs_merged() -> None:
    doc = {"inputs": [GOOD_INPUT, GOOD_INPUT]}
    assert_invalid(json.dumps(doc).encode(), None, "input 'X' appears more than once")
    doc = {"inputs": [GOOD_INPUT], "outputs": [{"name": "o"}, {"name": "o"}]}
    assert [o.name for o in decode(json.dumps(doc).encode(), None).outputs] == ["o"]


def test_shared_memory_without_a_registry_is_unsupported_and_parameters_are_checked() -> None:
    assert_invalid(
        _with(data=None, parameters={"shared_memory_region": "r", "shared_memory_byte_size": 4}),
        None,
        "shared memory",
        code=Code.UNSUPPORTED,
    )
    for params, fragment in (({"shared_memory_region": "r"}, "'shared_memory_byte_size' must be set"),
                             ({"shared_memory_region": 3, "shared_memory_byte_size": 4}, "shared_memory_region"),
                             ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative"),
                             ({"shared_memory_byte_size": 4}, "'shared_memory_region' must be set")):
        doc = {"inputs": [GOOD_INPUT], "outputs": [{"name": "o", "parameters": params}]}
        assert_invalid(json.dumps(doc).encode(), None, "output 'o'", fragment, code=Code.INVALID_ARG)


def test_shared_memory_inputs_are_views_of_the_region_and_outputs_are_written_in_place() -> None:
    region = bytearray(128)
    region[16:32] = np.arange(4, dtype=np.float32).tobytes()
    seen: list[tuple[str, int, int]] = []

    def lookup(name: str, offset: int, size: int) -> memoryview:
        seen.append((name, offset, size))
        return memoryview(region)[offset:offset + size]

    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [4], "parameters": {
        "shared_memory_region": "r", "shared_memory_offset": 16, "shared_memory_byte_size": 16}}]}).encode()
    request = kserve.decode_infer_request(body, None, "m", "1", lookup)
    x = request.inputs[0].data
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0] and seen == [("r", 16, 16)]
    region[16:20] = np.float32(9).tobytes()
    assert x[0] == 9.0  # a view of the region, not a copy
    assert request.inputs[0].parameters == {}
    wrong = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [4], "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 12}}]}).encode()
    with pytest.raises(TritonError) as info:
        kserve.decode_infer_request(wrong, None, "m", "1", lookup)
    assert info.value.message == "input byte size mismatch for input 'X' for model 'm'. Expected 16, got 12"
    out = Tensor.from_numpy("Y", np.array([5.0, 6.0], np.float32))
    response = InferenceResponse("m", "1", "", [out])
    requested = [RequestedOutput("Y", {"shared_memory_region": "r", "shared_memory_offset": 64,
                                       "shared_memory_byte_size": 8})]
    parts, header_length = kserve.encode_infer_response(response, requested, False, lookup)
    assert header_length is None
    assert json.loads(b"".join(bytes(p) for p in parts)) == {
        "model_name": "m", "model_version": "1", "outputs": [{"name": "Y", "datatype": "FP32", "shape": [2]}]}
    assert np.frombuffer(region[64:72], np.float32).tolist() == [5.0, 6.0]
    small = [RequestedOutput("Y", {"shared_memory_region": "r", "shared_memory_byte_size": 4})]
    with pytest.raises(TritonError) as info:
        kserve.encode_infer_response(response, small, False, lookup)
    assert info.value.code is Code.INTERNAL and "should be at least 8 bytes" in info.value.message


def test_header_length_errors() -> None:
    body, hl = client_encode([("X", "FP32", sample("FP32"), "binary")])
    assert hl is not None
    assert_invalid(body, len(body) + 1, "inference header size should be in range")
    assert_invalid(body, -4, "inference header size should be in range")
    assert_invalid(body, hl - 1, "failed to parse the request JSON buffer")
    assert_invalid(body + b"\x00", hl, "unexpected additional input data for model 'm'", "1 bytes")
    assert_invalid(body[:-1], hl, "unexpected size for input 'X'", "expecting 1 additional bytes")
    # a binary input without the header: the whole body is JSON, so the blob cannot exist
    assert_invalid(body[:hl], None, "input 'X' declares binary_data_size", "Inference-Header-Content-Length")


def test_blob_size_must_match_datatype_and_shape() -> None:
    header = json.dumps(
        {"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
    ).encode()
    assert_invalid(header + b"\x00" * 4, len(header), "input 'X' has binary_data_size 4", "need 8 bytes")
    bad = json.dumps(
        {"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": -1}}]}
    ).encode()
    assert_invalid(bad, None, "Unable to parse 'binary_data_size' of input 'X'")


def test_zero_size_inputs() -> None:
    header = json.dumps(
        {
            "inputs": [
                {"name": "A", "shape": [0, 3], "datatype": "FP32", "parameters": {"binary_data_size": 0}},
                {"name": "B", "shape": [0], "datatype": "INT8", "data": []},
            ]
        }
    ).encode()
    request = decode(header, len(header))
    assert [t.data.shape for t in request.inputs] == [(0, 3), (0,)]


def test_ragged_nested_json_is_flattened_like_triton() -> None:
    doc = {"inputs": [{"name": "X", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2, 3], [4]]}]}
    got = decode(json.dumps(doc).encode(), None).inputs[0].data
    np.testing.assert_array_equal(got, np.array([[1, 2], [3, 4]], dtype=np.float32))


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
@pytest.mark.parametrize(
    "data",
    [
        [0.1, -2.5, 1e-40, 3.4e38, 1e300, -0.0],  # flat floats: the direct conversion
        [0.1, 2, -3.5, 4, 5.25, 6],  # ints among them: numpy's reading, then the cast
        [[0.1, 2.5, 3.5], [4.5, 5.5, 6.5]],  # nested
        [1, 2, 3, 4, 5, 6],  # ints only
        [True, 2.5, 3.5, 4.5, 5.5, 6.5],  # a bool among floats: a number, as before
    ],
)
def test_json_float_inputs_convert_as_a_float64_reading_cast(datatype: str, data: list[Any]) -> None:
    doc = {"inputs": [{"name": "X", "shape": [2, 3], "datatype": datatype, "data": data}]}
    with np.errstate(over="ignore"):  # 1e300 is inf in FP32, either way
        got = decode(json.dumps(doc).encode(), None).inputs[0].data
        want = np.asarray(data, dtype=np.float64).astype(datatypes.numpy_dtype(datatype)).reshape(2, 3)
    assert got.dtype == want.dtype and got.shape == (2, 3)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ([0.5, 1.5, "2.5", 3.5], "expected numbers"),  # a string past the first element
        ([0.5, 1.5, None, 3.5], "expected numbers"),
        ([0.5, 1.5, 2.5], "data"),  # one short of the shape
        ([0.5, 1.5, 2.5, 3.5, 4.5], "data"),  # one too many
    ],
)
def test_json_float_inputs_still_checked(data: list[Any], fragment: str) -> None:
    assert_invalid(_with(data=data, datatype="FP32", shape=[4]), None, fragment)


# ---- requests: hypothesis round trip ----------------------------------------------------------

_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensors(draw: st.DrawFn) -> tuple[str, np.ndarray, str]:
    datatype = draw(st.sampled_from(ALL))
    shape = draw(_shapes)
    if datatype == "BYTES":
        items = draw(
            st.lists(st.binary(max_size=6), min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))
        )
        array = np.empty(len(items), dtype=object)
        array[:] = items
        array = array.reshape(shape)
        json_ok = all(_is_utf8(x) for x in items)
    else:
        dtype = datatypes.numpy_dtype(datatype)
        elements = None
        if dtype.kind == "f":
            elements = st.floats(allow_nan=False, allow_infinity=False, width=dtype.itemsize * 8)
        array = draw(hnp.arrays(dtype, shape, elements=elements))
        json_ok = datatype not in ("FP16", "BF16")
    mode = draw(st.sampled_from(["json", "nested", "binary"] if json_ok else ["binary"]))
    return datatype, array, mode


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(tensors(), min_size=1, max_size=4))
def test_request_round_trip(items: list[tuple[str, np.ndarray, str]]) -> None:
    inputs = [(f"in{i}", datatype, array, mode) for i, (datatype, array, mode) in enumerate(items)]
    body, hl = client_encode(inputs)
    request = decode(body, hl)
    assert len(request.inputs) == len(inputs)
    for tensor, (name, datatype, array, _) in zip(request.inputs, inputs, strict=True):
        assert (tensor.name, tensor.datatype, tensor.shape) == (name, datatype, array.shape)
        assert tensor.data.dtype == datatypes.numpy_dtype(datatype)
        np.testing.assert_array_equal(tensor.data, array)


# ---- responses: parsed by tritonclient itself --------------------------------------------------


def client_parse(parts: list[bytes | memoryview], header_length: int | None) -> httpclient.InferResult:
    body = b"".join(bytes(p) for p in parts)
    return httpclient.InferResult.from_response_body(body, header_length=header_length)


def as_expected(datatype: str, array: np.ndarray, binary: bool) -> np.ndarray:
    """What tritonclient's as_numpy gives back for our array."""
    if datatype == "BF16":
        return array.view(ml_dtypes.bfloat16)
    if datatype == "BYTES" and not binary:
        out = np.empty(array.size, dtype=object)
        out[:] = [x.decode("utf-8") for x in array.reshape(-1)]
        return out.reshape(array.shape)
    return array


@pytest.mark.parametrize("datatype", ALL)
@pytest.mark.parametrize("binary", [False, True])
def test_response_every_datatype_with_tritonclient(datatype: str, binary: bool) -> None:
    array = sample(datatype)
    response = InferenceResponse("m", "1", "", [Tensor("OUT", datatype, array.shape, array)])
    if datatype in ("FP16", "BF16") and not binary:  # refused as Triton does (the binary extension only)
        with pytest.raises(TritonError) as info:
            kserve.encode_infer_response(response, [RequestedOutput("OUT", {"binary_data": binary})], False)
        assert info.value.code is Code.INVALID_ARG and info.value.message == (
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output")
        return
    parts, hl = kserve.encode_infer_response(
        response, [RequestedOutput("OUT", {"binary_data": binary})], False
    )
    assert (hl is not None) == binary
    result = client_parse(parts, hl)
    got = result.as_numpy("OUT")
    assert got.shape == array.shape
    np.testing.assert_array_equal(got, as_expected(datatype, array, binary))
    doc = result.get_response()
    assert doc["model_name"] == "m" and doc["model_version"] == "1" and "id" not in doc
    assert doc["outputs"][0]["datatype"] == datatype


def test_response_layout_and_defaults() -> None:
    a = np.arange(4, dtype=np.int32)
    b = np.array([1.5], dtype=np.float64)
    response = InferenceResponse(
        "m", "3", "rid", [Tensor("A", "INT32", (4,), a), Tensor("B", "FP64", (1,), b, {"p": "q"})], {"r": 1}
    )
    # binary_data_output default, overridden for B
    parts, hl = kserve.encode_infer_response(response, [RequestedOutput("B", {"binary_data": False})], True)
    assert hl is not None and len(parts) == 2
    header = json.loads(bytes(parts[0]))
    assert list(header) == ["id", "model_name", "model_version", "parameters", "outputs"]
    assert header["id"] == "rid" and header["parameters"] == {"r": 1}
    assert header["outputs"][0] == {
        "name": "A",
        "datatype": "INT32",
        "shape": [4],
        "parameters": {"binary_data_size": 16},
    }
    assert header["outputs"][1] == {
        "name": "B",
        "datatype": "FP64",
        "shape": [1],
        "parameters": {"p": "q"},
        "data": [1.5],
    }
    assert bytes(parts[1]) == a.tobytes()
    # everything JSON: one part, no header length
    parts, hl = kserve.encode_infer_response(response, [], False)
    assert hl is None and len(parts) == 1
    assert json.loads(parts[0])["outputs"][0]["data"] == [0, 1, 2, 3]


def test_response_special_values() -> None:
    floats = np.array([np.nan, np.inf, -1.0], dtype=np.float32)
    not_utf8 = np.array([b"ok", b"\xff"], dtype=object)
    empty = np.zeros((0, 2), dtype=np.float32)
    response = InferenceResponse(
        "m",
        "1",
        outputs=[
            Tensor("F", "FP32", (3,), floats),
            Tensor("S", "BYTES", (2,), not_utf8),
            Tensor("E", "FP32", (0, 2), empty),
        ],
    )
    parts, hl = kserve.encode_infer_response(response, [], False)
    doc = json.loads(bytes(parts[0])[:hl])
    assert doc["outputs"][0]["data"] == [None, None, -1.0]
    assert doc["outputs"][1]["parameters"]["binary_data_size"] == 11  # not UTF-8: sent binary
    assert doc["outputs"][2]["data"] == []
    result = client_parse(parts, hl)
    np.testing.assert_array_equal(result.as_numpy("S"), not_utf8)
    assert result.as_numpy("E").shape == (0, 2)
    # a zero-size binary output carries binary_data_size 0 and no blob
    response = InferenceResponse("m", "1", outputs=[Tensor("E", "FP32", (0, 2), empty)])
    parts, hl = kserve.encode_infer_response(response, [], True)
    assert hl is None and json.loads(parts[0])["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert client_parse(parts, hl).as_numpy("E").shape == (0, 2)


def test_response_errors() -> None:
    with pytest.raises(TritonError) as info:
        kserve.encode_infer_response(
            InferenceResponse(error=TritonError(Code.UNAVAILABLE, "gone")), [], False
        )
    assert info.value.code is Code.UNAVAILABLE
    bad = InferenceResponse("m", "1", outputs=[Tensor("X", "FP32", (3,), np.zeros(2, dtype=np.float32))])
    with pytest.raises(TritonError) as info:
        kserve.encode_infer_response(bad, [], False)
    assert info.value.code is Code.INTERNAL and "'X'" in info.value.message


def test_non_contiguous_and_big_endian_outputs() -> None:
    base = np.arange(12, dtype=">i4").reshape(3, 4)
    view = base[:, ::2]
    response = InferenceResponse("m", "1", outputs=[Tensor("X", "INT32", (3, 2), view)])
    for binary in (False, True):
        parts, hl = kserve.encode_infer_response(response, [], binary)
        np.testing.assert_array_equal(client_parse(parts, hl).as_numpy("X"), view.astype("<i4"))


@st.composite
def outputs(draw: st.DrawFn) -> tuple[str, np.ndarray, bool]:
    datatype = draw(st.sampled_from(ALL))
    shape = draw(_shapes)
    if datatype == "BYTES":
        n = int(np.prod(shape))
        array = np.empty(n, dtype=object)
        array[:] = draw(st.lists(st.binary(max_size=6), min_size=n, max_size=n))
        return datatype, array.reshape(shape), draw(st.booleans())
    dtype = datatypes.numpy_dtype(datatype)
    elements = None
    if dtype.kind == "f":
        elements = st.floats(allow_nan=False, allow_infinity=False, width=dtype.itemsize * 8)
    if datatype == "BF16":  # finite bfloat16 bit patterns
        elements = st.floats(-1e30, 1e30).map(lambda v: int(datatypes.float32_to_bf16(np.float32(v))))
    return datatype, draw(hnp.arrays(dtype, shape, elements=elements)), draw(st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(outputs(), min_size=1, max_size=4), st.booleans(), st.text(max_size=5))
def test_response_round_trip_through_tritonclient(
    items: list[tuple[str, np.ndarray, bool]], default: bool, request_id: str
) -> None:
    tensors_ = [Tensor(f"o{i}", dt, array.shape, array) for i, (dt, array, _) in enumerate(items)]
    requested = [
        RequestedOutput(f"o{i}", {"binary_data": b}) for i, (_, _, b) in enumerate(items) if i % 2 == 0
    ]
    response = InferenceResponse("model", "2", request_id, tensors_)
    as_json = [dt for i, (dt, _, b) in enumerate(items) if not (b if i % 2 == 0 else default)]
    if "FP16" in as_json or "BF16" in as_json:  # JSON cannot carry them: refused
        with pytest.raises(TritonError) as info:
            kserve.encode_infer_response(response, requested, default)
        assert info.value.code is Code.INVALID_ARG and "via JSON is not supported" in info.value.message
        return
    parts, hl = kserve.encode_infer_response(response, requested, default)
    result = client_parse(parts, hl)
    assert result.get_response().get("id", "") == request_id
    for i, (datatype, array, binary) in enumerate(items):
        sent_binary = binary if i % 2 == 0 else default
        entry = result.get_output(f"o{i}")
        is_binary = "binary_data_size" in entry.get("parameters", {})
        if datatype != "BYTES" or array.size == 0:
            assert is_binary == sent_binary
        got = result.as_numpy(f"o{i}")
        if is_binary and array.size == 0:
            assert got.size == 0
            continue
        expected = as_expected(datatype, array, is_binary)
        assert got.shape == array.shape
        if datatype == "BF16":
            np.testing.assert_array_equal(got.view(np.uint16), array)
        else:
            np.testing.assert_array_equal(got, expected)


# ---- compressed responses and error bodies --------------------------------------------------------------


def test_compress_is_readable_by_tritonclient() -> None:
    array = np.arange(100, dtype=np.float32)
    parts, hl = kserve.encode_infer_response(
        InferenceResponse("m", "1", outputs=[Tensor("X", "FP32", (100,), array)]), [], True
    )
    body = b"".join(bytes(p) for p in parts)
    for accept, encoding in (("gzip", "gzip"), ("deflate", "deflate")):
        data, used = kserve.compress(body, accept)
        assert used == encoding and len(data) < len(body)
        result = httpclient.InferResult.from_response_body(data, header_length=hl, content_encoding=encoding)
        np.testing.assert_array_equal(result.as_numpy("X"), array)
    assert kserve.compress(body, "identity") == (body, None)


def test_error_body_and_base64() -> None:
    assert json.loads(kserve.error_body('bad "x" ü')) == {"error": 'bad "x" ü'}
    assert kserve.decode_base64("aGk=", "file:1/a") == b"hi"
    with pytest.raises(TritonError) as info:
        kserve.decode_base64("a$b", "file:1/a")
    assert info.value.code is Code.INVALID_ARG and "file:1/a" in info.value.message


# ---- hardening: shape edge cases are INVALID_ARG, large data converts in slices ------------------


def _one_input(**entry: Any) -> bytes:
    return json.dumps({"inputs": [{"name": "X", "datatype": "FP32", **entry}]}).encode()


def _binary_input(datatype: str, shape: list[int], blob: bytes) -> tuple[bytes, int]:
    header = json.dumps({"inputs": [{"name": "X", "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(blob)}}]}).encode()
    return header + blob, len(header)


@pytest.mark.parametrize(
    ("body", "header_length", "fragments"),
    [
        (_one_input(shape=[1] * 10_000, data=[1.0]), None, ["10000 dimensions, at most 64", "'X'"]),
        (_one_input(shape=[1] * 65, data=[1.0]), None, ["65 dimensions"]),
        (_one_input(shape=[0] + [1] * 64, data=[]), None, ["65 dimensions"]),
        (*_binary_input("FP32", [1] * 65, b"\0" * 4), ["65 dimensions"]),
        (*_binary_input("BYTES", [1] * 65, b"\1\0\0\0a"), ["65 dimensions"]),
        (_one_input(shape=[2**63], data=[1.0]), None, ["a dimension exceeds"]),
        (_one_input(shape=[-1], data=[1.0]), None, ["Unable to parse 'shape'"]),
        (_one_input(shape=[2**62, 2**62], data=[1.0]), None, ["needs 21267647932558653966460912964485513216"]),
        (*_binary_input("FP32", [2**62, 4], b"\0" * 4), ["need 73786976294838206464 bytes"]),
        (*_binary_input("BYTES", [2**62, 4], b"\1\0\0\0a"), ["holds 1 elements"]),
        (*_binary_input("FP32", [2], b"\0" * 4), ["binary_data_size 4", "need 8 bytes"]),
        (_one_input(shape=[0], data=[1.0]), None, ["needs 0 elements, 'data' holds 1"]),
        (_one_input(shape=[0], datatype="BYTES", data=["a"]), None, ["needs 0 elements, 'data' holds 1"]),
        (_one_input(shape=[3], data=[1.0]), None, ["needs 3 elements, 'data' holds 1"]),
        (_one_input(shape=[1], datatype="BYTES", data=[["a", "b"]]), None, ["needs 1 elements, 'data' holds 2"]),
        (_one_input(shape=[2], datatype="BYTES", data=["a", 2]), None, ["expected JSON strings"]),
        (_one_input(shape=[1], data=[1.0]), 10**12, ["inference header size should be in range"]),
    ],
)
def test_shape_and_size_edge_cases_are_invalid_arg(body: bytes, header_length: int | None,
                                                   fragments: list[str]) -> None:
    """Each was a 500 (numpy's 64-dimension limit) or silently accepted (data for a zero shape)."""
    assert_invalid(body, header_length, *fragments)


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "BOOL", "BYTES", "UINT8"])
def test_long_json_data_converts_in_slices_to_the_same_array(datatype: str) -> None:
    n = 3 * 65536 + 11
    if datatype == "BYTES":
        values: list[Any] = [str(i % 7) for i in range(n)]
        expected = np.array([v.encode() for v in values], dtype=object)
    elif datatype == "BOOL":
        values = [i % 3 == 0 for i in range(n)]
        expected = np.array(values)
    elif datatype == "FP32":
        values = [i if i % 2 else i + 0.5 for i in range(n)]  # ints and floats mixed across slices
        expected = np.array(values, dtype=np.float32)
    else:
        values = [i % 200 for i in range(n)]
        expected = np.array(values, dtype=datatypes.numpy_dtype(datatype))
    got = decode(_one_input(datatype=datatype, shape=[1, n], data=values), None).inputs[0].data
    assert got.shape == (1, n) and got.dtype == expected.dtype
    np.testing.assert_array_equal(got.reshape(-1), expected)
    nested = decode(_one_input(datatype=datatype, shape=[n, 1], data=[[v] for v in values]), None).inputs[0].data
    np.testing.assert_array_equal(nested.reshape(-1), expected)


def _decode_both_ways(monkeypatch: pytest.MonkeyPatch, body: bytes) -> tuple[Any, Any]:
    """``body`` decoded whole, then with its lists parsed in slices of 64 bytes: each result
    is the decoded input array or the TritonError raised."""
    def run() -> Any:
        try:
            return decode(body, None).inputs[0].data
        except TritonError as exc:
            return exc
    whole = run()
    monkeypatch.setattr(kserve, "LARGE_JSON", 0)
    monkeypatch.setattr(json_slices, "SLICE_SIZE", 64)
    doc = kserve.parse_json(body, kserve._convert_slice)
    assert isinstance(doc["inputs"][0]["data"], json_slices.SlicedList)  # the sliced path is taken
    sliced = run()
    return whole, sliced


_SLICED_CASES = [
    ("FP32", [i if i % 2 else i + 0.5 for i in range(400)]),  # ints and floats mixed
    ("FP32", [0.25] * 200 + [1] * 200),  # float slices, then int slices
    ("INT64", list(range(-200, 200))),
    ("UINT64", [1] * 300 + [2**63 + 1, 2**64 - 1]),  # exact beyond float64 (numpy reads float64)
    ("UINT64", [1] * 300 + [2**64]),  # out of range
    ("INT32", [1] * 300 + [2**40]),
    ("INT32", [1] * 300 + [1.5]),
    ("INT32", [1] * 300 + ["x"]),
    ("INT32", [1] * 300 + [None]),
    ("BOOL", [True, False, False] * 100),
    ("BOOL", [True] * 300 + [1]),
    ("BYTES", [f"s{i}é" for i in range(300)]),
    ("BYTES", ["a"] * 300 + [2]),
    ("BYTES", [2] + ["a"] * 300),
    ("FP32", ["a"] * 300),
]


@pytest.mark.parametrize(("datatype", "values"), _SLICED_CASES)
def test_long_json_lists_parsed_in_slices_decode_as_whole(monkeypatch: pytest.MonkeyPatch, datatype: str,
                                                          values: list[Any]) -> None:
    """A long list parsed and converted slice by slice (never one Python list) gives the same
    array, or the same error, as the whole list."""
    body = _one_input(datatype=datatype, shape=[len(values)], data=values)
    whole, sliced = _decode_both_ways(monkeypatch, body)
    if isinstance(whole, TritonError):
        assert isinstance(sliced, TritonError) and (sliced.code, sliced.message) == (whole.code, whole.message)
    else:
        assert isinstance(sliced, np.ndarray) and sliced.dtype == whole.dtype and sliced.shape == whole.shape
        np.testing.assert_array_equal(sliced, whole)
    wrong_count = _one_input(datatype=datatype, shape=[len(values) + 1], data=values)
    whole, sliced = _decode_both_ways(monkeypatch, wrong_count)
    assert isinstance(whole, TritonError) and isinstance(sliced, TritonError)
    assert sliced.message == whole.message


def test_long_json_data_is_still_checked() -> None:
    n = 2 * 65536 + 5
    values: list[Any] = list(range(n))
    values[-1] = 2**40
    assert_invalid(_one_input(datatype="INT32", shape=[n], data=values), None, "out of range")
    values[-1] = "x"
    assert_invalid(_one_input(datatype="INT32", shape=[n], data=values), None, "expected integers")
    values[-1] = None
    assert_invalid(_one_input(datatype="INT32", shape=[n], data=values), None, "expected numbers")
    values[-1] = 1.5
    assert_invalid(_one_input(datatype="INT32", shape=[n], data=values), None, "expected integers")


def test_is_heavy() -> None:
    small, _ = client_encode([("X", "FP32", sample("FP32"), "json")])
    assert not kserve.is_heavy(small, None, 1 << 20)
    big_json = b" " * (1 << 20) + small
    assert kserve.is_heavy(big_json, None, 1 << 20)
    fixed, hl = client_encode([("X", "FP32", np.zeros(1 << 19, np.float32), "binary")])
    assert not kserve.is_heavy(fixed, hl, 1 << 20)  # a view over the body: cheap at any size
    strings, hl = client_encode([("X", "BYTES", np.array([b""] * (1 << 18), dtype=object), "binary")])
    assert kserve.is_heavy(strings, hl, 1 << 20)  # split element by element


def test_inflater_works_in_bounded_steps() -> None:
    import gzip
    import zlib

    body = bytes(range(256)) * 20_000  # ~5 MiB
    inflater = kserve.Inflater(gzip.compress(body), "gzip", len(body))
    steps = 0
    while not inflater.run(1 << 20):
        steps += 1
    assert steps >= 4 and inflater.result == body
    assert kserve.Inflater(body, None).run(1) and kserve.Inflater(body, "identity").result is body
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    inflater = kserve.Inflater(raw.compress(body) + raw.flush(), "deflate", None)
    assert not inflater.run(1 << 20) and inflater.run() and inflater.result == body
    bomb = kserve.Inflater(gzip.compress(b"\0" * (8 << 20)), "gzip", 4 << 20)
    assert not bomb.run(1 << 20)
    with pytest.raises(TritonError) as info:
        bomb.run()
    assert info.value.code is Code.INVALID_ARG and "maximum input size of 4194304" in info.value.message
    truncated = kserve.Inflater(gzip.compress(body)[:-100], "gzip", None)
    with pytest.raises(TritonError) as info:
        truncated.run()
    assert "failed to decompress the gzip request body" in info.value.message


def test_long_json_output_data_is_encoded_in_slices_to_the_same_text(monkeypatch: pytest.MonkeyPatch):
    """Outputs longer than one encode slice are spliced in slice by slice; the body is unchanged."""
    import orjson

    n = 3 * kserve._ENCODE_SLICE + 7
    a = (np.arange(n, dtype=np.float32) / 3).astype(np.float32)
    b = np.arange(n, dtype=np.int64) - n // 2
    response = InferenceResponse(model_name="m", model_version="1", id="r",
                                 outputs=[Tensor.from_numpy("A", a), Tensor.from_numpy("SMALL", a[:4]),
                                          Tensor.from_numpy("B", b)])
    parts, header_length = kserve.encode_infer_response(response, [], False)
    expected = orjson.dumps({"id": "r", "model_name": "m", "model_version": "1", "outputs": [
        {"name": "A", "datatype": "FP32", "shape": [n], "data": a},
        {"name": "SMALL", "datatype": "FP32", "shape": [4], "data": a[:4]},
        {"name": "B", "datatype": "INT64", "shape": [n], "data": b}]}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert header_length is None and b"".join(parts) == expected
    monkeypatch.setattr(kserve, "_SPLICE_PIECE", 4096)
    parts, header_length = kserve.encode_infer_response(response, [], False)
    assert header_length is None and len(parts) >= 6 and b"".join(parts) == expected
    binary = [RequestedOutput("SMALL", {"binary_data": True})]
    parts, header_length = kserve.encode_infer_response(response, binary, False)
    assert len(parts) >= 7 and header_length == sum(len(p) for p in parts[:-1])
    assert bytes(parts[-1]) == a[:4].tobytes()
    assert kserve.response_is_large(response) == (a.nbytes + b.nbytes + 16 >= kserve.LARGE_JSON)


def test_only_costly_encodes_are_large() -> None:
    """JSON from LARGE_JSON bytes, shared-memory copies from SHM_COPY_LARGE, compression of a
    large body; binary outputs are views and never make a response large."""
    big = np.zeros(kserve.LARGE_JSON // 4, np.float32)
    huge = np.zeros(kserve.SHM_COPY_LARGE // 4, np.float32)
    response = InferenceResponse("m", "1", outputs=[Tensor.from_numpy("A", big)])
    assert kserve.response_is_large(response)
    assert not kserve.response_is_large(response, binary_default=True)
    assert not kserve.response_is_large(response, [RequestedOutput("A", {"binary_data": True})])
    assert kserve.response_is_large(response, [RequestedOutput("A", {"binary_data": False})], True)
    assert kserve.response_is_large(response, binary_default=True, compressed=True)
    in_shm = [RequestedOutput("A", {"shared_memory_region": "r", "shared_memory_byte_size": big.nbytes})]
    assert not kserve.response_is_large(response, in_shm)
    huge_response = InferenceResponse("m", "1", outputs=[Tensor.from_numpy("A", huge)])
    assert kserve.response_is_large(huge_response, in_shm)
    assert not kserve.response_is_large(InferenceResponse("m", "1", outputs=[Tensor.from_numpy("A", big[:16])]))


def test_the_input_check_runs_before_an_inputs_data_is_read():
    """``check`` (protocol.kserve.InputCheck) is called with each input's name, datatype and
    shape before its data is decoded: BYTES data cut short is not even looked at when the check
    refuses the input."""
    header = json.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 6}}]}).encode()
    body = header + b"\x05\x00\x00\x00ab"
    with pytest.raises(TritonError) as plain:
        kserve.decode_infer_request(body, len(header), "m", "")
    assert "BYTES" in plain.value.message
    seen: list[tuple[str, str, tuple[int, ...]]] = []

    def check(name: str, datatype: str, shape: tuple[int, ...]) -> None:
        seen.append((name, datatype, shape))
        if datatype != "FP32":
            raise TritonError(Code.INVALID_ARG, f"refused {name} {datatype}")

    with pytest.raises(TritonError) as refused:
        kserve.decode_infer_request(body, len(header), "m", "", check=check)
    assert refused.value.message == "refused X BYTES" and seen == [("X", "BYTES", (2,))]
    # an accepted input (JSON data here) decodes as without the check
    accepted = json.dumps({"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    seen.clear()
    request = kserve.decode_infer_request(accepted, None, "m", "", check=check)
    assert request.inputs[0].data.tolist() == [[1.0, 2.0]] and seen == [("X", "FP32", (1, 2))]


def test_a_long_json_bytes_list_decodes_to_its_strings():
    """A JSON document past LARGE_JSON is parsed in slices and a long BYTES list is made an
    object array from them (datatypes.object_array: past FILL_SLICE elements, filled as the
    slices come); the elements are the strings, UTF-8 encoded, in order."""
    n = 200_000
    values = [f"é{i}" for i in range(n)]
    body = json.dumps({"inputs": [{"name": "X", "shape": [2, n // 2], "datatype": "BYTES", "data": values}]}).encode()
    assert len(body) >= kserve.LARGE_JSON
    tensor = kserve.decode_infer_request(body, None, "m", "").inputs[0]
    assert tensor.data.shape == (2, n // 2) and tensor.data.dtype == object
    assert tensor.data.reshape(-1).tolist() == [v.encode() for v in values]


def test_a_long_bytes_output_is_json_strings_encoded_a_slice_at_a_time():
    """A BYTES output longer than one encode slice is decoded to str and encoded slice by slice;
    the document is what one encode of the list gives. An element that is not UTF-8 makes the
    output binary, as for a short one."""
    n = 3 * kserve._ENCODE_SLICE + 3
    values = np.array([f"s{i}é".encode() for i in range(n)], dtype=object).reshape(1, n)
    response = InferenceResponse(model_name="m", model_version="1", outputs=[Tensor("O", "BYTES", (1, n), values)])
    parts, header_length = kserve.encode_infer_response(response, [], False)
    assert header_length is None and len(parts) >= 1
    assert json.loads(b"".join(parts))["outputs"][0]["data"] == [f"s{i}é" for i in range(n)]
    values[0, n - 1] = b"\xff"
    parts, header_length = kserve.encode_infer_response(response, [], False)
    assert header_length is not None  # binary: the JSON header, then the elements
    doc = json.loads(b"".join(parts)[:header_length])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == len(b"".join(parts)) - header_length
