"""The gRPC service in-process: a real Server and serve_grpc on port 0, driven by raw HTTP/2.

Covers what the CLI does not expose yet (response compression level, header forwarding), the
statistics conversion and a graceful drain with a model request in flight.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import trio
import tritonclient.grpc.service_pb2 as pb
from e2e.grpc_raw import frame, open_raw
from e2e.models import RAISES_CONFIG, RAISES_PY, SLOW_CONFIG, SLOW_PY, write_model

from trident.errors import GRPC_OK
from trident.grpc.serve import serve_grpc, transport_config
from trident.observability.stats import BatchStats, Duration, ModelStatistics
from trident.options import ServerOptions
from trident.protocol import grpc_messages
from trident.server import open_server

INFER = "/inference.GRPCInferenceService/ModelInfer"


def request(model: str, value: float, **kw) -> bytes:
    message = pb.ModelInferRequest(model_name=model, **kw)
    message.inputs.add(name="X", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.array([value], np.float32).tobytes())
    return message.SerializeToString()


@pytest.fixture
def repo(tmp_path):
    write_model(tmp_path, "raises", RAISES_CONFIG, RAISES_PY)
    write_model(tmp_path, "slow", SLOW_CONFIG, SLOW_PY)
    return tmp_path


async def start(nursery, options: ServerOptions, scope: trio.CancelScope | None = None):
    server = await nursery.start(_run_server, options)

    async def run(task_status):
        with scope or trio.CancelScope():
            await serve_grpc(server, host="127.0.0.1", port=0, task_status=task_status)

    return server, await nursery.start(run)


async def _run_server(options, task_status):
    async with open_server(options) as server:
        task_status.started(server)
        await trio.sleep_forever()


async def test_compressed_responses_and_forwarded_headers(nursery, repo):
    options = ServerOptions(model_repositories=[str(repo)])
    options.grpc_infer_response_compression_level = "high"  # type: ignore[attr-defined]
    options.grpc_header_forward_pattern = "x-fwd-.*"  # type: ignore[attr-defined]
    _, port = await start(nursery, options)
    async with open_raw(port) as c:
        s = await c.unary(INFER, request("raises", 2.0), extra=[(b"grpc-accept-encoding", b"gzip"),
                                                                 (b"x-fwd-user", b"bob"), (b"x-other", b"no")])
        assert s.status == GRPC_OK
        assert s.headers[b"grpc-encoding"] == b"gzip" and s.data[0] == 1
        response = pb.ModelInferResponse.FromString(gzip.decompress(s.messages()[0]))
        assert json.loads(response.parameters["echo"].string_param) == {"x-fwd-user": "bob"}
        plain = await c.unary(INFER, request("raises", 2.0))
        assert b"grpc-encoding" not in plain.headers and plain.data[0] == 0


def test_transport_options():
    assert transport_config(ServerOptions()).compression_level == 0
    assert transport_config(ServerOptions(grpc_max_message_size=1234)).max_message_size == 1234
    options = ServerOptions()
    options.grpc_infer_response_compression_level = "extreme"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="compression"):
        transport_config(options)


def test_statistics_message():
    d = Duration(3, 300)
    stats = ModelStatistics("m", "2", last_inference=17, inference_count=9, execution_count=4, success=d,
                            fail=Duration(1, 5), queue=d, compute_input=d, compute_infer=d, compute_output=d,
                            batch_stats=(BatchStats(2, d, Duration(2, 20), d),))
    message = pb.ModelStatistics.FromString(bytes(grpc_messages.statistics_entry(stats)))
    assert (message.name, message.version, message.last_inference) == ("m", "2", 17)
    assert (message.inference_count, message.execution_count) == (9, 4)
    assert (message.inference_stats.success.count, message.inference_stats.success.ns) == (3, 300)
    assert message.inference_stats.fail.count == 1
    assert message.batch_stats[0].batch_size == 2 and message.batch_stats[0].compute_infer.ns == 20


async def test_drain_lets_a_running_inference_finish(nursery, repo):
    scope = trio.CancelScope()
    server, port = await start(nursery, ServerOptions(model_repositories=[str(repo)]), scope)
    async with open_raw(port) as c:
        s = await c.open(INFER)
        await c.send(s, frame(request("slow", 0.5)), end_stream=True)
        with trio.fail_after(10):
            while server._inflight.count == 0:  # the request has reached the model
                await trio.sleep(0.01)
        scope.cancel()
        await s.closed.wait()
        assert c.goaway is not None
    assert s.status == GRPC_OK
    assert pb.ModelInferResponse.FromString(s.messages()[0]).raw_output_contents[0] == np.float32(0.5).tobytes()


async def test_stream_cancellation_reaches_the_model(nursery, repo):
    server, port = await start(nursery, ServerOptions(model_repositories=[str(repo)]))
    async with open_raw(port) as c:
        s = await c.open("/inference.GRPCInferenceService/ModelStreamInfer")
        await c.send(s, frame(request("slow", 30.0)) + frame(request("slow", 30.0)))
        with trio.fail_after(10):
            while server._inflight.count < 2:
                await trio.sleep(0.01)
        await c.reset(s)
        with trio.fail_after(20):
            while server.model_statistics("slow")[0].fail.count < 2:
                await trio.sleep(0.02)
    assert server.model_statistics("slow")[0].success.count == 0
