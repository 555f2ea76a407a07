"""Forwarded requests and responses on the wire, and the shared-memory arena under them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trident.cluster.arena import GRANULE, Allocator, Arena
from trident.cluster.forward_wire import (
    SHARED_MIN,
    ForwardWireError,
    FrameReader,
    decode_request,
    decode_response,
    encode_control,
    encode_request,
    encode_response,
)
from trident.errors import Code, invalid_arg
from trident.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor


def _join(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


def _request(big: int = 4) -> InferenceRequest:
    return InferenceRequest(
        model_name="m", model_version="1", id="r-1", parameters={"sequence_id": 7, "sequence_start": True},
        outputs=[RequestedOutput("OUT", {"binary_data": True})],
        inputs=[Tensor.from_numpy("A", np.arange(big, dtype=np.float32)),
                Tensor.from_numpy("S", np.array([b"x", b"", b"\x00yz"], dtype=object), "BYTES"),
                Tensor.from_numpy("H", np.ones((2, 3), np.float16))])


def _one(frame) -> tuple[dict, bytearray]:
    frames = FrameReader().feed(_join(frame))
    assert len(frames) == 1
    return frames[0]


def test_a_small_request_travels_inline():
    frame, used = encode_request(3, _request(), stream=False)
    assert used == []
    header, payload = _one(frame)
    got = decode_request(header, payload, None)
    assert (got.model_name, got.model_version, got.id) == ("m", "1", "r-1")
    assert got.parameters == {"sequence_id": 7, "sequence_start": True}
    assert got.outputs[0].name == "OUT" and got.outputs[0].parameters == {"binary_data": True}
    assert got.inputs[0].data.tolist() == [0, 1, 2, 3] and got.inputs[1].data.tolist() == [b"x", b"", b"\x00yz"]
    assert got.inputs[2].data.dtype == np.float16 and got.inputs[2].shape == (2, 3)
    got.inputs[0].data[0] = 9  # a model may write to its inputs


def test_the_clients_trace_context_goes_along():
    from trident.observability.trace import parse_traceparent

    request = _request()
    request.trace = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v")
    got = decode_request(*_one(encode_request(1, request, stream=False)[0]), None)
    assert got.trace.traceparent() == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert got.trace.tracestate == "k=v"
    assert decode_request(*_one(encode_request(1, _request(), stream=False)[0]), None).trace is None


def test_a_large_tensor_goes_through_the_arena():
    arena = Arena(8 * SHARED_MIN)
    try:
        frame, used = encode_request(1, _request(SHARED_MIN), stream=True, allocate=arena.allocate, arena=arena.view)
        assert len(used) == 1
        header, payload = _one(frame)
        assert len(payload) < 1024  # only the small tensors inline
        got = decode_request(header, payload, arena.view)
        assert np.array_equal(got.inputs[0].data, np.arange(SHARED_MIN, dtype=np.float32))
        # no room: inline instead
        full = Arena(SHARED_MIN)
        frame, used = encode_request(2, _request(SHARED_MIN), stream=True, allocate=full.allocate, arena=full.view)
        assert used == [] and len(_one(frame)[1]) > SHARED_MIN * 4
        full.close()
    finally:
        arena.close()


def test_responses_round_trip_with_errors_and_copy_out_of_the_arena():
    arena = Arena(4 * SHARED_MIN)
    try:
        response = InferenceResponse("m", "1", "r-1", [Tensor.from_numpy("OUT", np.arange(SHARED_MIN, dtype=np.int32))],
                                     {"p": 1}, final=False)
        frame, used = encode_response(5, response, done=False, allocate=arena.allocate, arena=arena.view)
        header, payload = _one(frame)
        got = decode_response(header, payload, arena.view)
        arena.view[used[0]:used[0] + 8] = b"\xff" * 8  # the space is reused: the copy is the response's
        assert got.outputs[0].data[:2].tolist() == [0, 1] and got.final is False and got.parameters == {"p": 1}
        frame, _ = encode_response(5, InferenceResponse(error=invalid_arg("nope"), flag_only=True), done=True)
        got = decode_response(*_one(frame), None)
        assert got.error is not None and got.error.code is Code.INVALID_ARG and got.error.message == "nope"
    finally:
        arena.close()


def test_control_frames_and_any_split():
    data = encode_control("cancel", rid=4) + encode_control("rel", offs=[0, 4096]) + _join(
        encode_request(9, _request(), stream=True)[0])
    reader = FrameReader()
    frames = []
    for i in range(0, len(data), 3):
        frames += reader.feed(data[i:i + 3])
    assert [h["k"] for h, _ in frames] == ["cancel", "rel", "req"] and frames[1][0]["offs"] == [0, 4096]


@pytest.mark.parametrize("tamper", [
    lambda d: d.__setitem__("inputs", [["A", "FP32", [4], "i", 0, 15, None]]),  # size does not fit the shape
    lambda d: d.__setitem__("inputs", [["A", "FP32", [4], "i", 10_000, 16, None]]),  # outside the payload
    lambda d: d.__setitem__("inputs", [["A", "FP32", [4], "s", 0, 16, None]]),  # no arena here
    lambda d: d.__setitem__("inputs", [["A", "NOPE", [4], "i", 0, 16, None]]),
    lambda d: d.__setitem__("inputs", [["A", "FP32", [-4], "i", 0, 16, None]]),
    lambda d: d.__setitem__("inputs", "x"),
    lambda d: d.pop("model"),
])
def test_a_bad_request_header_is_refused(tamper):
    header, payload = _one(encode_request(1, _request(), stream=False)[0])
    tamper(header)
    with pytest.raises(ForwardWireError):
        decode_request(header, payload, None)


def test_oversized_and_garbage_frames_are_refused():
    with pytest.raises(ForwardWireError):
        FrameReader().feed((2**31).to_bytes(4, "big") + (0).to_bytes(4, "big"))
    with pytest.raises(ForwardWireError):
        FrameReader().feed((3).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"{x!")


def test_the_allocator_reuses_and_coalesces():
    a = Allocator(10 * GRANULE)
    x, y, z = a.allocate(1), a.allocate(GRANULE + 1), a.allocate(GRANULE)
    assert (x, y, z) == (0, GRANULE, 3 * GRANULE) and a.in_use == 4 * GRANULE
    assert a.allocate(7 * GRANULE) is None
    a.free(y)
    a.free(x)
    assert a.allocate(3 * GRANULE) == 0  # x and y merged
    a.free(12345)  # not allocated: ignored
    a.free(z)
    a.free(0)
    assert a.allocate(10 * GRANULE) == 0


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5 * GRANULE)), max_size=60))
def test_the_allocator_never_hands_out_overlapping_space(ops):
    a = Allocator(32 * GRANULE)
    live: dict[int, int] = {}
    for allocate, size in ops:
        if allocate or not live:
            off = a.allocate(size)
            if off is not None:
                end = off + size
                assert all(end <= o or off >= o + n for o, n in live.items())
                assert end <= a.size
                live[off] = size
        else:
            off = next(iter(live))
            a.free(off)
            del live[off]
    for off in list(live):
        a.free(off)
    assert a.in_use == 0 and a.allocate(32 * GRANULE) == 0
