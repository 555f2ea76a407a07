"""gRPC end to end with grpclib (an asyncio client on h2): unary, bidi streaming, errors, health."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc.service_pb2 as pb
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from trident.protocol import datatypes

SERVICE = "/inference.GRPCInferenceService/"
pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation


@pytest.fixture(scope="module")
def server(grpc_http2):
    from e2e.conftest import start_server

    s = start_server()
    yield s
    s.stop()


def run(server, body):
    async def main():
        channel = Channel("127.0.0.1", server.grpc_port)
        try:
            return await body(channel)
        finally:
            channel.close()

    return asyncio.run(main())


async def call(channel: Channel, method: str, request, reply_type, metadata=None):
    async with channel.request(SERVICE + method, Cardinality.UNARY_UNARY, type(request), reply_type,
                               metadata=metadata) as stream:
        await stream.send_message(request, end=True)
        reply = await stream.recv_message()
        await stream.recv_trailing_metadata()
        return reply


def fp32_request(model: str, name: str, values: np.ndarray, request_id: str = "") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    message.inputs.add(name=name, datatype="FP32", shape=list(values.shape))
    message.raw_input_contents.append(values.astype(np.float32).tobytes())
    return message


def test_unary_rpcs(server):
    async def body(channel):
        live = await call(channel, "ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse)
        meta = await call(channel, "ServerMetadata", pb.ServerMetadataRequest(), pb.ServerMetadataResponse)
        model = await call(channel, "ModelMetadata", pb.ModelMetadataRequest(name="bytes_echo"),
                           pb.ModelMetadataResponse)
        x = np.arange(8, dtype=np.float32)
        reply = await call(channel, "ModelInfer", fp32_request("identity_fp32", "INPUT0", x, "g1"),
                           pb.ModelInferResponse, metadata={"x-trace": "1"})
        strings = pb.ModelInferRequest(model_name="bytes_echo")
        strings.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend([b"ab", b"c"])
        echoed = await call(channel, "ModelInfer", strings, pb.ModelInferResponse)
        health = await HealthStub(channel).Check(HealthCheckRequest())
        return live, meta, model, reply, echoed, health

    live, meta, model, reply, echoed, health = run(server, body)
    assert live.live and meta.name == "triton"
    assert [o.datatype for o in model.outputs] == ["BYTES", "INT32"]
    assert reply.id == "g1" and reply.raw_output_contents[0] == np.arange(8, dtype=np.float32).tobytes()
    out = {o.name: raw for o, raw in zip(echoed.outputs, echoed.raw_output_contents, strict=True)}
    assert datatypes.deserialize_bytes(out["OUTPUT0"]).tolist() == [b"AB", b"C"]
    assert np.frombuffer(out["OUTPUT1"], np.int32).tolist() == [2, 1]
    assert health.status == HealthCheckResponse.SERVING


def test_errors_carry_status_and_message(server):
    async def body(channel):
        errors = []
        for request in (fp32_request("missing", "INPUT0", np.zeros(2)), fp32_request("identity_fp32", "BAD", np.zeros(2))):
            with pytest.raises(GRPCError) as e:
                await call(channel, "ModelInfer", request, pb.ModelInferResponse)
            errors.append((e.value.status, e.value.message))
        with pytest.raises(GRPCError) as e:
            await call(channel, "CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(),
                       pb.CudaSharedMemoryStatusResponse)
        errors.append((e.value.status, e.value.message))
        return errors

    (missing, bad, shm) = run(server, body)
    assert missing[0] == Status.NOT_FOUND and "missing" in missing[1]
    assert bad[0] == Status.INVALID_ARGUMENT
    assert shm[0] == Status.UNIMPLEMENTED


def test_bidi_stream(server):
    async def body(channel):
        async with channel.request(SERVICE + "ModelStreamInfer", Cardinality.STREAM_STREAM,
                                   pb.ModelInferRequest, pb.ModelStreamInferResponse) as stream:
            for i in range(10):
                await stream.send_message(fp32_request("identity_fp32", "INPUT0", np.full(4, i), str(i)))
            await stream.send_message(fp32_request("missing", "INPUT0", np.zeros(1), "bad"))
            replies = [await stream.recv_message() for _ in range(11)]
            await stream.end()
            assert await stream.recv_message() is None
            await stream.recv_trailing_metadata()
            return replies

    replies = run(server, body)
    errors = [r for r in replies if r.error_message]
    assert len(errors) == 1 and "missing" in errors[0].error_message
    ok = {r.infer_response.id: r.infer_response for r in replies if not r.error_message}
    assert sorted(ok, key=int) == [str(i) for i in range(10)]
    assert ok["3"].raw_output_contents[0] == np.full(4, 3, np.float32).tobytes()
    assert all(r.parameters["triton_final_response"].bool_param for r in ok.values())
