"""The hand-written ModelInfer codec (trident.protocol.grpc_codec) against google protobuf (upb).

tritonclient's generated ``service_pb2`` classes are the reference: requests they encode must
decode into the same InferenceRequest, responses we encode must parse back in upb unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc.service_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trident.errors import Code, TritonError
from trident.protocol import datatypes
from trident.protocol.grpc_codec import (
    DecodeError,
    decode_model_infer_request,
    encode_model_infer_response,
    encode_model_stream_infer_response,
    join,
)
from trident.types import InferenceResponse, Tensor

CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                  "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
                  "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
                  "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}

param_values = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=8), st.floats(allow_nan=False)
)
params = st.dictionaries(st.text(max_size=6), param_values, max_size=3)


def set_param(message, key, value):
    p = message[key]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        if value > 2**63 - 1:
            p.uint64_param = value
        else:
            p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = value


@st.composite
def tensors(draw, raw: bool | None = None):
    datatype = draw(st.sampled_from(datatypes.DATATYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    count = datatypes.element_count(shape)
    if datatype == "BYTES":
        data = np.empty(count, dtype=object)
        data[:] = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
    else:
        dtype = datatypes.numpy_dtype(datatype)
        data = np.frombuffer(draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize)),
                             dtype=dtype)
        if datatype == "BOOL":
            data = data.view(np.uint8) % 2 == 1
    use_raw = draw(st.booleans()) if raw is None else raw
    if datatype in ("FP16", "BF16"):
        use_raw = True
    return datatype, tuple(shape), data.reshape(shape), draw(params), use_raw


def raw_bytes(datatype: str, data: np.ndarray) -> bytes:
    return datatypes.serialize_bytes(data) if datatype == "BYTES" else data.tobytes()


@st.composite
def requests(draw):
    raw = draw(st.booleans())
    items = draw(st.lists(tensors(raw=raw), max_size=4))
    if any(use_raw for *_, use_raw in items):
        items = [(dt, shape, data, p, True) for dt, shape, data, p, _ in items]
    message = pb.ModelInferRequest(model_name=draw(st.text(max_size=8)), model_version=draw(st.text(max_size=3)),
                                   id=draw(st.text(max_size=5)))
    request_params = draw(params)
    for k, v in request_params.items():
        set_param(message.parameters, k, v)
    for i, (datatype, shape, data, p, use_raw) in enumerate(items):
        t = message.inputs.add(name=f"IN{i}", datatype=datatype, shape=list(shape))
        for k, v in p.items():
            set_param(t.parameters, k, v)
        if use_raw:
            message.raw_input_contents.append(raw_bytes(datatype, data))
        elif data.size:
            values = data.reshape(-1).tolist()
            getattr(t.contents, CONTENTS_FIELD[datatype]).extend(values)
    outputs = draw(st.lists(params, max_size=2))
    for i, p in enumerate(outputs):
        o = message.outputs.add(name=f"OUT{i}")
        for k, v in p.items():
            set_param(o.parameters, k, v)
    return message, request_params, items, outputs


def same_params(decoded, expected):
    assert decoded.keys() == expected.keys()
    for k, v in expected.items():
        assert decoded[k] == v and type(decoded[k]) is type(v)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_decode_matches_what_upb_encodes(case):
    message, request_params, items, outputs = case
    request = decode_model_infer_request(bytearray(message.SerializeToString()))
    assert (request.model_name, request.model_version, request.id) == (
        message.model_name, message.model_version, message.id)
    same_params(request.parameters, request_params)
    assert len(request.inputs) == len(items)
    for i, (tensor, (datatype, shape, data, p, use_raw)) in enumerate(zip(request.inputs, items, strict=True)):
        assert (tensor.name, tensor.datatype, tensor.shape) == (f"IN{i}", datatype, shape)
        assert tensor.data.shape == shape
        same_params(tensor.parameters, p)
        if datatype == "BYTES":
            assert tensor.data.dtype == object and tensor.data.reshape(-1).tolist() == data.reshape(-1).tolist()
        elif use_raw or datatype not in ("FP32", "FP64"):
            assert tensor.data.dtype == datatypes.numpy_dtype(datatype)
            assert tensor.data.tobytes() == data.tobytes()
        else:  # floats through Python lists: NaN payloads may change, values may not
            np.testing.assert_array_equal(tensor.data, data)
    assert [o.name for o in request.outputs] == [f"OUT{i}" for i in range(len(outputs))]
    for o, p in zip(request.outputs, outputs, strict=True):
        same_params(o.parameters, p)


def test_raw_inputs_view_the_received_buffer():
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="A", datatype="FP32", shape=[4, 4])
    message.raw_input_contents.append(np.arange(16, dtype="<f4").tobytes())
    buffer = bytearray(message.SerializeToString())
    tensor = decode_model_infer_request(buffer).inputs[0]
    assert np.shares_memory(tensor.data, np.frombuffer(buffer, dtype=np.uint8))
    assert tensor.data.flags.writeable
    np.testing.assert_array_equal(tensor.data, np.arange(16, dtype=np.float32).reshape(4, 4))


def test_a_repeated_input_is_checked_against_each_requests_raw_contents():
    # the second message's tensor metadata comes from the decode cache, with its checks done once
    for size, expected in ((8, None), (6, "Expected 8, got 6"), (8, None), (12, "Expected 8, got 12")):
        m = request_with(datatype="FP32", shape=[1, 2])
        m.raw_input_contents.append(np.arange(size // 4, dtype="<f4").tobytes() + b"\x00" * (size % 4))
        if expected is None:
            tensor = decode_model_infer_request(m.SerializeToString()).inputs[0]
            assert tensor.shape == (1, 2) and tensor.data.shape == (1, 2) and tensor.data.tolist() == [[0.0, 1.0]]
        else:
            assert expected in error_of(m).message


def test_a_zero_sized_input_with_dimensions_numpy_cannot_hold_is_invalid_arg():
    m = request_with(datatype="FP32", shape=[0, 1 << 62, 1 << 62])
    m.raw_input_contents.append(b"")
    error = error_of(m)
    assert error.code == Code.INVALID_ARG and "invalid shape" in error.message


def test_unpacked_repeated_fields_decode_too():
    # proto2-style writers send repeated scalars one by one; the wire format allows it
    body = b"\x0a\x01A" + b"\x12\x05INT64" + b"\x18\x03" + b"\x2a\x06" + b"\x18\x01\x18\x02\x18\x7f"
    data = b"\x0a\x01m" + b"\x2a" + bytes([len(body)]) + body
    tensor = decode_model_infer_request(data).inputs[0]
    assert tensor.shape == (3,) and tensor.data.tolist() == [1, 2, 127]


def request_with(**tensor_kwargs) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="X", **tensor_kwargs)
    return message


def error_of(message: pb.ModelInferRequest) -> TritonError:
    with pytest.raises(TritonError) as e:
        decode_model_infer_request(message.SerializeToString())
    return e.value


def test_invalid_requests_get_tritons_messages():
    m = request_with(datatype="FP32", shape=[2])
    m.raw_input_contents.extend([b"\x00" * 8, b"\x00" * 8])
    assert error_of(m).message == "expected 1 inputs but got 2 raw input contents for model 'm'"

    m = request_with(datatype="FP32", shape=[2])
    m.raw_input_contents.append(b"\x00" * 6)
    assert error_of(m).message == "input byte size mismatch for input 'X' for model 'm'. Expected 8, got 6"

    m = request_with(datatype="FP32", shape=[2], contents=pb.InferTensorContents(fp32_contents=[1, 2]))
    m.raw_input_contents.append(b"\x00" * 8)
    assert "contents field must not be specified when using raw_input_contents" in error_of(m).message

    m = request_with(datatype="FP16", shape=[2], contents=pb.InferTensorContents(fp32_contents=[1, 2]))
    assert error_of(m).message == (
        "unexpected explicit tensor data for input tensor 'X' for model 'm' of type 'FP32', expected datatype 'FP16'")

    m = request_with(datatype="INT32", shape=[1], contents=pb.InferTensorContents(int_contents=[1], int64_contents=[1]))
    assert "binary data was already supplied" in error_of(m).message

    m = request_with(datatype="INT32", shape=[3], contents=pb.InferTensorContents(int_contents=[1]))
    assert "input byte size mismatch" in error_of(m).message

    assert error_of(request_with(datatype="FP32", shape=[2])).message == (
        "expected tensor data for input tensor 'X' for model 'm'")
    assert "invalid datatype 'FP8'" in error_of(request_with(datatype="FP8", shape=[0])).message
    assert "invalid shape" in error_of(request_with(datatype="FP32", shape=[-1])).message

    m = request_with(datatype="BYTES", shape=[2])
    m.raw_input_contents.append(b"\x05\x00\x00\x00ab")
    assert "BYTES" in error_of(m).message

    m = request_with(datatype="FP32", shape=[1])
    m.inputs[0].parameters["shared_memory_region"].string_param = "r"
    assert error_of(m).code == Code.UNSUPPORTED
    assert all(e.code == Code.INVALID_ARG for e in [error_of(request_with(datatype="FP32", shape=[2]))])


@pytest.mark.parametrize("shape", [[2**62, 2**62, 0], [0] * 70, [2**63 - 1, 0]])
def test_shapes_numpy_cannot_hold_are_invalid(shape):
    message = request_with(datatype="FP32", shape=shape)
    message.raw_input_contents.append(b"")
    error = error_of(message)
    assert error.code == Code.INVALID_ARG and "invalid shape" in error.message


def test_empty_tensors_need_no_data():
    tensor = decode_model_infer_request(request_with(datatype="FP32", shape=[0, 3]).SerializeToString()).inputs[0]
    assert tensor.data.shape == (0, 3)


@given(st.binary(max_size=200))
def test_garbage_raises_only_decode_or_triton_errors(data):
    try:
        decode_model_infer_request(data)
    except (DecodeError, TritonError):
        pass


def test_every_truncation_of_a_valid_request_is_rejected_cleanly():
    message = request_with(datatype="INT32", shape=[3], contents=pb.InferTensorContents(int_contents=[-1, 300, 7]))
    message.parameters["p"].string_param = "value"
    message.outputs.add(name="O").parameters["classification"].int64_param = 2
    data = message.SerializeToString()
    for n in range(len(data)):
        try:
            decode_model_infer_request(data[:n])
        except (DecodeError, TritonError):
            pass
    assert decode_model_infer_request(data).inputs[0].data.tolist() == [-1, 300, 7]


@st.composite
def responses(draw):
    outputs = []
    for i, (datatype, shape, data, p, _) in enumerate(draw(st.lists(tensors(), max_size=4))):
        if datatype == "BYTES" and data.size and draw(st.booleans()):
            data = data.astype(object)
            data.reshape(-1)[0] = "ünï"  # str elements are sent UTF-8 encoded
        outputs.append(Tensor(f"OUT{i}", datatype, shape, data, p))
    return InferenceResponse(draw(st.text(max_size=8)), draw(st.text(max_size=3)), draw(st.text(max_size=5)),
                             outputs, draw(params))


def upb_params(message) -> dict:
    out = {}
    for k, v in message.items():
        out[k] = getattr(v, v.WhichOneof("parameter_choice"))
    return out


def check_response(decoded: pb.ModelInferResponse, response: InferenceResponse, parameters=None) -> None:
    assert (decoded.model_name, decoded.model_version, decoded.id) == (
        response.model_name, response.model_version, response.id)
    assert upb_params(decoded.parameters) == (response.parameters if parameters is None else parameters)
    assert len(decoded.outputs) == len(decoded.raw_output_contents) == len(response.outputs)
    for out, raw, tensor in zip(decoded.outputs, decoded.raw_output_contents, response.outputs, strict=True):
        assert (out.name, out.datatype, tuple(out.shape)) == (tensor.name, tensor.datatype, tensor.shape)
        assert upb_params(out.parameters) == tensor.parameters
        assert raw == raw_bytes(tensor.datatype, tensor.data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_encoded_responses_parse_in_upb(response):
    parts, size = encode_model_infer_response(response)
    data = join(parts)
    assert len(data) == size
    check_response(pb.ModelInferResponse.FromString(data), response)


@given(responses(), st.text(max_size=20), st.booleans())
def test_stream_responses_parse_in_upb(response, error, final):
    params = {**response.parameters, "triton_final_response": final}
    parts, size = encode_model_stream_infer_response(response, error_message=error, parameters=params)
    data = join(parts)
    assert len(data) == size
    decoded = pb.ModelStreamInferResponse.FromString(data)
    assert decoded.error_message == error
    check_response(decoded.infer_response, response, params)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(responses())
def test_a_response_encoded_again_from_the_metadata_caches_is_the_same(response):
    first = join(encode_model_infer_response(response)[0])
    again = join(encode_model_infer_response(response)[0])  # names and output metadata cached now
    assert again == first
    check_response(pb.ModelInferResponse.FromString(again), response)


def test_the_metadata_caches_are_bounded():
    from trident.protocol import grpc_codec

    for i in range(grpc_codec._CACHED_ENCODINGS + 10):
        response = InferenceResponse(f"m{i}", "1", "", [Tensor(f"O{i}", "INT8", (1,), np.zeros(1, np.int8))])
        decoded = pb.ModelInferResponse.FromString(join(encode_model_infer_response(response)[0]))
        assert (decoded.model_name, decoded.outputs[0].name) == (f"m{i}", f"O{i}")
    assert len(grpc_codec._NAMES) <= grpc_codec._CACHED_ENCODINGS
    assert len(grpc_codec._OUTPUTS) <= grpc_codec._CACHED_ENCODINGS


def test_response_parts_view_output_arrays():
    array = np.arange(1 << 16, dtype=np.float32)
    parts, _ = encode_model_infer_response(InferenceResponse("m", "1", "", [Tensor.from_numpy("O", array)]))
    assert any(isinstance(p, np.ndarray) and np.shares_memory(p, array) for p in parts)
    big_endian = np.arange(4, dtype=">i4")
    data = join(encode_model_infer_response(InferenceResponse(outputs=[Tensor("B", "INT32", (4,), big_endian)]))[0])
    assert pb.ModelInferResponse.FromString(data).raw_output_contents[0] == np.arange(4, dtype="<i4").tobytes()


# ---- malformed bytes: what upb rejects is DecodeError, what upb accepts is not -------------

VALID = request_with(datatype="INT32", shape=[2], contents=pb.InferTensorContents(int_contents=[-1, 300]))
VALID_BYTES = VALID.SerializeToString()


@pytest.mark.parametrize("data", [
    # fp64_contents declaring 8 bytes where 0 remain (found by the fuzzer: was a plain ValueError)
    bytes.fromhex("0a0d6964656e746974795f667033322a160a06494e505554301204465036341a01012a033a0800"),
    bytes.fromhex("0a016d2a160a01491204465033321a01022a083204000000003204"),  # fp32 contents past the end
    VALID_BYTES + b"\x00\x01",  # field number 0, varint
    b"\x02\x01x" + VALID_BYTES,  # field number 0, bytes
    VALID_BYTES + b"\x4b\x08\x01\x54",  # group closed by another field's end-group tag
    VALID_BYTES + b"\x4b\x08\x01",  # group never closed
    VALID_BYTES + b"\x4c",  # end-group tag outside a group
    VALID_BYTES + b"\x4e\x00",  # wire type 6
    VALID_BYTES + b"\x4f\x00",  # wire type 7
    b"\x8a\x80\x80\x80\x80\x00\x01m",  # a tag of 6 bytes
    b"\xfa\xff\xff\xff\x1f\x00",  # a tag over 32 bits
    VALID_BYTES + b"\x48" + b"\xff" * 10 + b"\x01",  # an 11-byte varint
    VALID_BYTES + b"\x3a\xff\xff\xff\xff\x0f",  # a length past the end
    b"\x2a\x05\x0a\x09XXXX",  # a name running past the end of its tensor
    b"\x2a\x0b\x12\x05INT32\x2a\x02\x21\x00",  # a fixed64 running past the end of the contents
    b"\x22\x06\x0a\x01k\x12\x02\x21",  # a double parameter running past the end
    b"\x2a\x04\x1a\x02\x80\x80",  # a truncated packed shape
], ids=lambda d: d.hex()[:24])
def test_malformed_bytes_are_decode_errors_as_in_upb(data):
    with pytest.raises(Exception):  # noqa: B017 - any upb error
        pb.ModelInferRequest.FromString(data)
    with pytest.raises(DecodeError):
        decode_model_infer_request(bytearray(data))


def test_unknown_fields_and_groups_are_skipped_as_in_upb():
    data = VALID_BYTES + b"\x4b\x08\x01\x52\x01x\x5b\x5c\x4c" + b"\x48" + b"\xff" * 9 + b"\x7f" + b"\x8a\x80\x80\x80\x00\x00"
    pb.ModelInferRequest.FromString(data)
    assert decode_model_infer_request(data).inputs[0].data.tolist() == [-1, 300]


def test_a_repeated_parameter_merges_as_in_upb():
    entry = b"\x0a\x01k" + b"\x12\x02\x10\x05" + b"\x12\x03\x1a\x01v" + b"\x12\x00"  # int, then string, then empty
    data = b"\x0a\x01m\x22" + bytes([len(entry)]) + entry
    assert pb.ModelInferRequest.FromString(data).parameters["k"].string_param == "v"
    assert decode_model_infer_request(data).parameters == {"k": "v"}


def test_long_shapes_are_invalid_without_multiplying_their_dims():
    # 100k dims of 2**62 once cost minutes of big-integer products on the event loop
    error = error_of(request_with(datatype="FP32", shape=[2**62] * 100_000))
    assert error.message == "invalid shape for input 'X' for model 'm': 100000 dimensions, at most 64 are supported"
    m = request_with(datatype="FP32", shape=[1] * 65)
    m.raw_input_contents.append(b"\x00" * 4)
    assert "65 dimensions" in error_of(m).message


def test_a_huge_declared_size_is_invalid_arg():
    m = request_with(datatype="FP32", shape=[2**62] * 60)  # its byte count: 1130 digits
    m.raw_input_contents.append(b"\x00" * 12)
    assert "input byte size mismatch" in error_of(m).message


def test_long_packed_varint_runs_decode_in_pieces():
    values = np.arange(-(1 << 62), (1 << 62), (1 << 63) // 300_000, dtype=np.int64)[:300_000]  # ~10 bytes each
    m = request_with(datatype="INT64", shape=[values.size], contents=pb.InferTensorContents(int64_contents=values))
    assert len(m.SerializeToString()) > 2 << 20
    np.testing.assert_array_equal(decode_model_infer_request(m.SerializeToString()).inputs[0].data, values)


@settings(max_examples=500)
@given(st.binary(max_size=60).map(lambda tail: VALID_BYTES + tail))
def test_decode_error_exactly_when_upb_rejects(data):
    try:
        pb.ModelInferRequest.FromString(data)
        upb_ok = True
    except Exception:
        upb_ok = False
    try:
        decode_model_infer_request(data)
    except DecodeError:
        assert not upb_ok
    except TritonError:
        pass
    else:
        assert upb_ok


def test_is_heavy_tells_raw_tensors_from_contents_and_bytes():
    """Raw fixed-size tensors decode as views (never heavy); typed contents or BYTES of the
    threshold's size are; so is a malformed message (its decode raises wherever it runs)."""
    from trident.protocol.grpc_codec import is_heavy

    def message(datatype: str, raw: bytes | None = None, contents: list[float] | None = None) -> bytes:
        req = pb.ModelInferRequest(model_name="m")
        t = req.inputs.add(name="IN", datatype=datatype, shape=[1])
        if contents is not None:
            t.contents.fp32_contents.extend(contents)
        if raw is not None:
            req.raw_input_contents.append(raw)
        return req.SerializeToString()

    big_raw = message("FP32", raw=bytes(200_000))
    assert not is_heavy(big_raw, 100_000)
    assert not is_heavy(message("FP32", raw=bytes(10)), 100_000)  # small: never
    assert is_heavy(message("FP32", contents=[1.0] * 50_000), 100_000)
    assert is_heavy(message("BYTES", raw=bytes(200_000)), 100_000)
    assert is_heavy(big_raw[:-10], 100_000)  # the raw field runs past the end
    assert not is_heavy(bytearray(big_raw), 100_000) and not is_heavy(memoryview(big_raw), 100_000)


def test_repeated_tensor_metadata_decodes_alike_and_apart():
    """The same InferInputTensor bytes again (a client's usual request) decode from a cache: equal
    tensors over each message's own data, parameters that are each request's own, and typed
    contents (spans of their own message) decoded every time."""
    def message(values, raw=True):
        request = pb.ModelInferRequest(model_name="m")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[2])
        set_param(tensor.parameters, "tag", "t")
        array = np.array(values, np.float32)
        if raw:
            request.raw_input_contents.append(array.tobytes())
        else:
            tensor.contents.fp32_contents.extend(values)
        return request.SerializeToString()

    first = decode_model_infer_request(bytearray(message([1, 2])))
    second = decode_model_infer_request(bytearray(message([3, 4])))
    assert first.inputs[0].data.tolist() == [1, 2] and second.inputs[0].data.tolist() == [3, 4]
    assert (first.inputs[0].name, first.inputs[0].shape) == (second.inputs[0].name, second.inputs[0].shape)
    assert first.inputs[0].parameters == second.inputs[0].parameters == {"tag": "t"}
    first.inputs[0].parameters["changed"] = True
    assert "changed" not in decode_model_infer_request(message([5, 6])).inputs[0].parameters
    typed = [decode_model_infer_request(message(v, raw=False)).inputs[0].data.tolist() for v in ([7, 8], [9, 10])]
    assert typed == [[7, 8], [9, 10]]


def test_model_of_names_the_model_as_the_decode_does():
    message = pb.ModelInferRequest(model_name="first", model_version="2")
    message.inputs.add(name="X", datatype="FP32", shape=[1])
    message.raw_input_contents.append(b"\x00" * 4)
    data = message.SerializeToString()
    # a repeated singular field: the last one wins, in the decode and here
    data += pb.ModelInferRequest(model_name="last").SerializeToString()
    from trident.protocol.grpc_codec import model_of
    assert model_of(data) == ("last", "2") == (decode_model_infer_request(data).model_name, "2")
    assert model_of(b"") == ("", "")
    assert model_of(b"\x0a\x05ab") is None  # a string cut short: malformed


def refuse_unless(name: str, datatype: str):
    """An input check (protocol.kserve.InputCheck) that accepts one input, as a model's admission
    would, and refuses the rest with its own error."""
    seen: list[tuple[str, str, tuple[int, ...]]] = []

    def check(input_name: str, input_datatype: str, shape: tuple[int, ...]) -> None:
        seen.append((input_name, input_datatype, shape))
        if (input_name, input_datatype) != (name, datatype):
            raise TritonError(Code.INVALID_ARG, f"refused {input_name} {input_datatype} {list(shape)}")

    return check, seen


def test_the_input_check_runs_before_any_data_is_read():
    # BYTES data cut short: without the check the decode says so; with it, the check's refusal
    # comes first, as no element was read
    m = request_with(datatype="BYTES", shape=[2])
    m.raw_input_contents.append(b"\x05\x00\x00\x00ab")
    assert "BYTES" in error_of(m).message
    check, seen = refuse_unless("X", "FP32")
    with pytest.raises(TritonError) as e:
        decode_model_infer_request(m.SerializeToString(), check=check)
    assert e.value.message == "refused X BYTES [2]" and seen == [("X", "BYTES", (2,))]
    # an accepted input decodes as before; an unknown datatype or a bad shape is refused as such
    ok = request_with(datatype="FP32", shape=[1, 2])
    ok.raw_input_contents.append(np.arange(2, dtype="<f4").tobytes())
    check, seen = refuse_unless("X", "FP32")
    assert decode_model_infer_request(ok.SerializeToString(), check=check).inputs[0].data.tolist() == [[0.0, 1.0]]
    assert seen == [("X", "FP32", (1, 2))]
    for bad in (request_with(datatype="FP99", shape=[1]), request_with(datatype="FP32", shape=[-1])):
        bad.raw_input_contents.append(b"\x00" * 4)
        check, seen = refuse_unless("X", "FP32")
        with pytest.raises(TritonError) as e:
            decode_model_infer_request(bad.SerializeToString(), check=check)
        assert not seen and not e.value.message.startswith("refused")


def test_is_heavy_weighs_typed_contents_and_bytes_not_raw_tensors():
    from trident.protocol.grpc_codec import is_heavy

    raw = pb.ModelInferRequest(model_name="m")
    raw.inputs.add(name="X", datatype="FP32", shape=[1 << 18])
    raw.raw_input_contents.append(b"\x00" * (1 << 20))
    assert not is_heavy(raw.SerializeToString(), 1 << 20)  # a view over the message: cheap
    strings = pb.ModelInferRequest(model_name="m")
    strings.inputs.add(name="X", datatype="BYTES", shape=[1 << 18])
    strings.raw_input_contents.append(b"\x00" * (1 << 20))
    assert is_heavy(strings.SerializeToString(), 1 << 20)  # split element by element
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="X", datatype="FP32", shape=[1 << 18]).contents.fp32_contents.extend([0.5] * (1 << 18))
    assert is_heavy(typed.SerializeToString(), 1 << 20)
    assert not is_heavy(typed.SerializeToString(), 1 << 22)
    assert is_heavy(b"\x3a\xff\xff\xff\x0f" + b"\x00" * (1 << 20), 1 << 20)  # malformed: the decode raises
