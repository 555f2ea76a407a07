"""``--grpc-max-connection-age`` / ``--grpc-max-connection-age-grace`` against the real server.

As gRPC core's max connection age: once a connection is that old (+-10%) the server sends GOAWAY
NO_ERROR (debug data "max_age"), its client opens a new connection for the next calls (after a
scale-up, maybe to another pod), and the calls still running on the old one finish there; one
still running when the grace period is over ends with UNAVAILABLE and the connection closes.
Which connections a client holds is read from ``/proc/net/tcp`` (the local ports of the
established connections to the server's gRPC port). Each test runs once per HTTP/2 engine.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h2.errors
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
from e2e.grpc_raw import frame, open_raw
from e2e.models import SLOW_CONFIG, SLOW_PY, write_model
from grpclib.client import Channel
from grpclib.const import Cardinality
from tritonclient.utils import InferenceServerException

from trident.errors import GRPC_OK, GRPC_UNAVAILABLE

INFER = "/inference.GRPCInferenceService/ModelInfer"
AGE_MS, GRACE_MS = 1500, 30_000  # the long call (3 s) starts before the age and ends within the grace
SHORT_AGE_MS, SHORT_GRACE_MS = 500, 1000  # a 20 s call outlives the grace

pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("connection-age")
    write_model(repo, "slow", SLOW_CONFIG + "instance_group [ { kind: KIND_CPU count: 4 } ]\n", SLOW_PY)
    return repo


@pytest.fixture(scope="module")
def server(repo, grpc_http2):
    from e2e.conftest import start_server

    s = start_server(f"--grpc-max-connection-age={AGE_MS}", f"--grpc-max-connection-age-grace={GRACE_MS}",
                     repo=repo)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def short_grace_server(repo, grpc_http2):
    from e2e.conftest import start_server

    s = start_server(f"--grpc-max-connection-age={SHORT_AGE_MS}",
                     f"--grpc-max-connection-age-grace={SHORT_GRACE_MS}", repo=repo)
    yield s
    s.stop()


def client_ports(server_port: int) -> set[int]:
    """Local ports of the established TCP connections to ``server_port`` on this host (IPv4, and
    IPv4-mapped IPv6: gRPC core's sockets are dual-stack)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == server_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def eventually(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def slow_request(seconds: float) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="slow")
    message.inputs.add(name="X", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.array([seconds], np.float32).tobytes())
    return message


def infer(client: grpcclient.InferenceServerClient, seconds: float) -> float:
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([seconds], np.float32))
    return float(client.infer("slow", [x], client_timeout=60).as_numpy("Y")[0])


def test_tritonclient_moves_to_a_new_connection_and_its_calls_finish(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert infer(client, 0.0) == 0.0
        first = client_ports(server.grpc_port)
        assert len(first) == 1, first
        with ThreadPoolExecutor(1) as pool:
            long_call = pool.submit(infer, client, 3.0)  # in flight when the connection reaches its age
            eventually(lambda: infer(client, 0.0) == 0.0 and bool(client_ports(server.grpc_port) - first),
                       "the client is still on its first connection after the max age")
            assert first <= client_ports(server.grpc_port)  # the old connection stays for the long call...
            assert long_call.result(timeout=60) == 3.0  # ... which succeeds on it
        # ... and closes once that call is done; the client carries on on the new one
        eventually(lambda: not first & client_ports(server.grpc_port), "the old connection was not closed")
        assert infer(client, 0.0) == 0.0


def test_grpclib_reconnects_after_the_max_age(server):
    """grpclib (0.4.9) ends its connection, and any call still open on it, as soon as it reads a
    GOAWAY, whatever its code (grpclib.protocol.EventsProcessor.process_connection_terminated):
    its calls are made one after another here, away from the GOAWAY, and each succeeds."""
    async def call(channel: Channel, seconds: float) -> float:
        async with channel.request(INFER, Cardinality.UNARY_UNARY, pb.ModelInferRequest,
                                   pb.ModelInferResponse) as stream:
            await stream.send_message(slow_request(seconds), end=True)
            reply = await stream.recv_message()
            await stream.recv_trailing_metadata()
        assert reply is not None
        return float(np.frombuffer(reply.raw_output_contents[0], np.float32)[0])

    async def main() -> None:
        channel = Channel("127.0.0.1", server.grpc_port)
        try:
            assert await call(channel, 0.0) == 0.0
            first = client_ports(server.grpc_port)
            assert len(first) == 1, first
            deadline = time.monotonic() + 20
            # GOAWAY at the max age: the connection ends (the kernel's view, then grpclib's: a call
            # made between the two would go to the closing connection and be lost with it)
            while first & client_ports(server.grpc_port) or channel._connected:
                assert time.monotonic() < deadline, "the connection outlived its max age"
                await asyncio.sleep(0.05)
            assert await call(channel, 0.0) == 0.0  # on a new connection
            assert client_ports(server.grpc_port) - first
        finally:
            channel.close()

    asyncio.run(main())


async def test_goaway_is_no_error_max_age_and_names_the_last_stream(server):
    async with open_raw(server.grpc_port) as c:
        done = await c.unary(INFER, slow_request(0.0).SerializeToString())
        assert done.status == GRPC_OK
        running = await c.open(INFER)  # stream 3: a call in flight at the age
        with trio.fail_after(20):
            while c.goaway is None:
                await trio.sleep(0.05)
        assert c.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert c.goaway.additional_data == b"max_age" and c.goaway.last_stream_id == running.stream_id
        # the call the GOAWAY covers is still served on this connection
        await c.send(running, frame(slow_request(0.0).SerializeToString()), end_stream=True)
        with trio.fail_after(20):
            await running.closed.wait()
        assert running.status == GRPC_OK
        with trio.fail_after(20):
            await c.closed.wait()  # then the server closes it: nothing is left on it


def test_a_call_past_the_grace_period_ends_unavailable(short_grace_server):
    s = short_grace_server
    with grpcclient.InferenceServerClient(s.grpc_url) as client:
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as failed:
            infer(client, 20.0)
        assert time.monotonic() - started < 15  # ended by the grace period, not by the model
        assert failed.value.status() == "StatusCode.UNAVAILABLE"
        assert "max connection age (500 ms) and its grace period (1000 ms) are over" in failed.value.message()
        assert infer(client, 0.0) == 0.0  # the client reconnects and is served


async def test_past_the_grace_period_the_call_gets_unavailable_trailers_and_the_connection_closes(
        short_grace_server):
    async with open_raw(short_grace_server.grpc_port) as c:
        running = await c.open(INFER)
        await c.send(running, frame(slow_request(20.0).SerializeToString()), end_stream=True)
        with trio.fail_after(15):
            await running.closed.wait()
            await c.closed.wait()
        assert c.goaway is not None and c.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR  # the closing one
        assert running.status == GRPC_UNAVAILABLE and "grace period (1000 ms) are over" in running.message
