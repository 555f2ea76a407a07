"""gRPC against the real server: malformed input over raw HTTP/2, cancellation, deadlines, load.

Malformed requests get the right status, the server survives, and a well-behaved client on
another connection keeps being served while the bad ones are pending.
"""

from __future__ import annotations

import asyncio
import struct
import time

import grpc
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.grpc.service_pb2 as pb
from e2e.grpc_raw import frame, open_raw
from e2e.models import SLOW_CONFIG, SLOW_PY, write_identity, write_model
from tritonclient.utils import InferenceServerException

from trident.errors import (
    GRPC_INTERNAL,
    GRPC_INVALID_ARGUMENT,
    GRPC_NOT_FOUND,
    GRPC_OK,
    GRPC_RESOURCE_EXHAUSTED,
    GRPC_UNIMPLEMENTED,
)

MAX_MESSAGE = 1 << 20
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation


@pytest.fixture(scope="module")
def server(tmp_path_factory, grpc_http2):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("grpc-robust")
    write_identity(repo, "FP32")
    write_model(repo, "slow", SLOW_CONFIG, SLOW_PY)
    s = start_server(f"--grpc-max-message-size={MAX_MESSAGE}", repo=repo)
    yield s
    s.stop()


def infer_request(values: np.ndarray, model: str = "identity_fp32", name: str = "INPUT0", **kw) -> bytes:
    message = pb.ModelInferRequest(model_name=model, **kw)
    message.inputs.add(name=name, datatype="FP32", shape=list(values.shape))
    message.raw_input_contents.append(values.astype(np.float32).tobytes())
    return message.SerializeToString()


def slow_stats(server) -> tuple[int, int]:
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        s = c.get_inference_statistics("slow").model_stats[0].inference_stats
        return s.success.count, s.fail.count


async def healthy_call(port: int) -> None:
    """A well-behaved request on its own connection; fails the test if it is not served."""
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    with trio.fail_after(10):
        async with open_raw(port) as c:
            s = await c.unary(INFER, infer_request(x))
    assert s.status == GRPC_OK
    assert pb.ModelInferResponse.FromString(s.messages()[0]).raw_output_contents[0] == x.tobytes()


async def test_malformed_requests_get_statuses_and_others_are_served(server):
    port = server.grpc_port
    async with open_raw(port) as c:
        # undecodable protobuf
        s = await c.unary(INFER, b"\x0a\xff\xff\xff")
        assert s.status == GRPC_INVALID_ARGUMENT and "failed to parse ModelInferRequest" in s.message
        # a packed FP64 contents field declaring more bytes than remain (found by fuzzing: was a
        # ValueError answered INTERNAL with a traceback per request)
        s = await c.unary(INFER, bytes.fromhex(
            "0a0d6964656e746974795f667033322a160a06494e505554301204465036341a01012a033a0800"))
        assert s.status == GRPC_INVALID_ARGUMENT and "runs past the end of its message" in s.message
        s = await c.unary("/inference.GRPCInferenceService/ModelMetadata", b"\x0a\xff\xff\xff")
        assert s.status == GRPC_INVALID_ARGUMENT and "failed to parse ModelMetadataRequest" in s.message
        # a valid message that is not a valid request
        s = await c.unary(INFER, infer_request(np.zeros((1, 2)), name="NOPE"))
        assert s.status == GRPC_INVALID_ARGUMENT
        s = await c.unary(INFER, infer_request(np.zeros((1, 2)), model="missing"))
        assert s.status == GRPC_NOT_FOUND
        # wrong content type
        s = await c.unary(INFER, infer_request(np.zeros((1, 2))), content_type=b"text/plain")
        assert s.headers[b":status"] == b"415" and s.status == GRPC_INVALID_ARGUMENT
        # declared length beyond the limit: answered before any payload is sent
        s = await c.open(INFER)
        await c.send(s, struct.pack(">BI", 0, MAX_MESSAGE + 1))
        await s.closed.wait()
        assert s.status == GRPC_RESOURCE_EXHAUSTED
        # truncated message, then a bad length prefix (flag byte 7, then a prefix cut short)
        s = await c.open(INFER)
        await c.send(s, struct.pack(">BI", 0, 500) + b"\x0a\x01m", end_stream=True)
        await s.closed.wait()
        assert s.status == GRPC_INTERNAL and "incomplete" in s.message
        s = await c.open(INFER)
        await c.send(s, b"\x07\x00\x00\x00\x01x", end_stream=True)
        await s.closed.wait()
        assert s.status == GRPC_INTERNAL
        s = await c.open(INFER)
        await c.send(s, b"\x00\x00\x00", end_stream=True)
        await s.closed.wait()
        assert s.status == GRPC_INTERNAL
        # unknown method and unsupported compression
        s = await c.unary("/inference.GRPCInferenceService/ModelTrain", b"")
        assert s.status == GRPC_UNIMPLEMENTED
        s = await c.unary(INFER, b"", extra=[(b"grpc-encoding", b"zstd")])
        assert s.status == GRPC_UNIMPLEMENTED
        # RST_STREAM in the middle of a message
        s = await c.open(INFER)
        await c.send(s, struct.pack(">BI", 0, 4096) + b"\x0a\x05")
        await c.reset(s)
        # the same connection still works
        await healthy_call(port)
        ok = await c.unary(INFER, infer_request(np.ones((1, 3))))
        assert ok.status == GRPC_OK


async def test_a_request_read_at_once_is_answered_as_one_read_in_parts(server):
    """A unary request whose HEADERS and DATA (END_STREAM) arrive in one read runs at once;
    every answer, good or bad, is the one it gets when its message comes in a later read."""
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    good = infer_request(x)
    cases = [
        (INFER, frame(good), None),
        (INFER, b"", None),  # no message at all
        (INFER, frame(b""), None),  # an empty ModelInferRequest
        (INFER, frame(b"\x0a\xff\xff\xff"), None),  # undecodable protobuf
        (INFER, frame(infer_request(x, model="missing")), None),
        (INFER, frame(infer_request(x, name="NOPE")), None),
        (INFER, frame(good, compressed=True), None),  # compressed without a grpc-encoding
        (INFER, frame(good)[:-1], None),  # the prefix declares one byte more than was sent
        (INFER, frame(good) + b"\x00", None),  # a second message begins
        (INFER, frame(good) + frame(good), None),  # two messages in a unary call
        (INFER, struct.pack(">BI", 0, MAX_MESSAGE + 1) + good, None),  # declared over the limit
        (INFER, b"\x07" + frame(good)[1:], None),  # a bad flag byte
        (INFER, frame(good), [(b"grpc-encoding", b"zstd")]),
        (INFER, frame(good), [(b"grpc-timeout", b"bogus")]),
        (INFER, frame(good), [(b"grpc-timeout", b"10S")]),  # a deadline far off
        ("/inference.GRPCInferenceService/ModelTrain", frame(good), None),
        ("/inference.GRPCInferenceService/ServerLive", frame(b""), None),
    ]
    async with open_raw(server.grpc_port) as c:
        for path, body, extra in cases:
            with trio.fail_after(10):
                together = await c.at_once(path, body, extra=extra)
                apart = await c.open(path, extra=extra)
                await trio.sleep(0.02)  # the message comes in a later read
                await c.send(apart, body, end_stream=True)
                await apart.closed.wait()
            assert together.status is not None, (path, body[:12])
            assert (together.status, together.message) == (apart.status, apart.message), (path, body[:12])
            assert together.messages() == apart.messages(), (path, body[:12])
            assert together.reset_code is None  # the client had ended its side: nothing to reset
        ok = await c.at_once(INFER, frame(good))
    assert ok.status == GRPC_OK
    assert pb.ModelInferResponse.FromString(ok.messages()[0]).raw_output_contents[0] == x.tobytes()
    await healthy_call(server.grpc_port)


async def test_a_client_that_never_reads_does_not_delay_others(server):
    x = np.zeros((1, 1 << 17), np.float32)  # 512 KiB responses, far beyond a 64 KiB window
    async with open_raw(server.grpc_port, read_window=False) as stuck:
        streams = []
        for _ in range(4):
            s = await stuck.open(INFER)
            await stuck.send(s, frame(infer_request(x)), end_stream=True)
            streams.append(s)
        with trio.fail_after(10):
            while sum(len(s.data) for s in streams) < 65535:
                await trio.sleep(0.01)
        for _ in range(3):
            await healthy_call(server.grpc_port)
        assert all(s.status is None for s in streams)


async def test_garbage_connection_does_not_hurt_the_server(server):
    sock = await trio.open_tcp_stream("127.0.0.1", server.grpc_port)
    await sock.send_all(b"\x00" * 100 + b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 100)
    with trio.fail_after(10):
        while await sock.receive_some(4096):
            pass
    await sock.aclose()
    await healthy_call(server.grpc_port)


def test_cancel_and_deadline_cancel_the_server_side_request(server):
    success, fail = slow_stats(server)
    x = np.array([30.0], np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        inp = grpcclient.InferInput("X", [1], "FP32")
        inp.set_data_from_numpy(x)
        # deadline
        with pytest.raises(InferenceServerException) as e:
            c.infer("slow", [inp], client_timeout=0.5)
        assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        # client cancellation of an async call
        done = []
        ctx = c.async_infer("slow", [inp], callback=lambda result, error: done.append(error))
        time.sleep(0.5)
        ctx.cancel()
        # closing a stream with requests in flight
        c.start_stream(lambda result, error: None)
        c.async_stream_infer("slow", [inp])
        time.sleep(0.5)
        c.stop_stream(cancel_requests=True)
        # the slow model polls is_cancelled(): three cancelled requests are failures, and the
        # model is free again long before its 30 s
        inp.set_data_from_numpy(np.array([0.0], np.float32))
        deadline = time.monotonic() + 20
        while slow_stats(server)[1] < fail + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.infer("slow", [inp], client_timeout=20).as_numpy("Y").tolist() == [0.0]
    new_success, new_fail = slow_stats(server)
    assert new_fail == fail + 3
    assert new_success == success + 1
    assert done and done[0] is not None


def test_2000_sequential_calls_on_one_connection(server):
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary(INFER)
        request = infer_request(x)
        expected = x.tobytes()
        for _ in range(2000):
            assert pb.ModelInferResponse.FromString(infer(request)).raw_output_contents[0] == expected


def test_200_concurrent_streams_on_one_connection(server):
    async def main():
        async with aioclient.InferenceServerClient(server.grpc_url) as c:
            async def one(i: int):
                x = np.full((1, 8), i, np.float32)
                inp = aioclient.InferInput("INPUT0", [1, 8], "FP32")
                inp.set_data_from_numpy(x)
                result = await c.infer("identity_fp32", [inp], request_id=str(i))
                return result.get_response().id, result.as_numpy("OUTPUT0")

            results = await asyncio.gather(*(one(i) for i in range(200)))
        assert len(results) == 200
        for i, (rid, out) in enumerate(results):
            assert rid == str(i) and out.tolist() == [[float(i)] * 8]

    asyncio.run(main())


def test_200_concurrent_requests_on_one_bidi_stream(server):
    async def main():
        async with aioclient.InferenceServerClient(server.grpc_url) as c:
            async def requests():
                for i in range(200):
                    inp = aioclient.InferInput("INPUT0", [1, 4], "FP32")
                    inp.set_data_from_numpy(np.full((1, 4), i, np.float32))
                    yield {"model_name": "identity_fp32", "inputs": [inp], "request_id": str(i)}

            seen = {}
            async for result, error in c.stream_infer(requests()):
                assert error is None
                seen[int(result.get_response().id)] = result.as_numpy("OUTPUT0")
                if len(seen) == 200:
                    break
        assert sorted(seen) == list(range(200))
        assert all(v.tolist() == [[float(i)] * 4] for i, v in seen.items())

    asyncio.run(main())
