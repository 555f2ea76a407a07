"""serve_http: hypercorn's trio worker serving the app to real clients on a free port."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import trio
import tritonclient.http as httpclient

from trident.http.serve import hypercorn_config, serve_http
from trident.options import EXAMPLE_REPOSITORY, ServerOptions
from trident.protocol import kserve
from trident.server import Server, open_server


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    options = ServerOptions(model_repositories=[str(Path(EXAMPLE_REPOSITORY))], exit_timeout_secs=5)
    async with open_server(options) as server:
        yield server


def tritonclient_session(port: int) -> dict[str, object]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        item = httpclient.InferInput(name, [1, 16], "FP32")
        item.set_data_from_numpy(a)
        inputs.append(item)
    binary = client.infer("add_sub", inputs)
    as_json = client.infer(
        "add_sub",
        inputs,
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)],
        request_compression_algorithm="gzip",
        response_compression_algorithm="deflate",
    )
    return {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "model_ready": client.is_model_ready("add_sub"),
        "metadata": client.get_server_metadata(),
        "binary": binary.as_numpy("OUTPUT0"),
        "json": as_json.as_numpy("OUTPUT0"),
        "index": client.get_model_repository_index(),
        "expected": a + a,
    }


async def test_serves_tritonclient_on_a_free_port(server: Server) -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_http(server, host="127.0.0.1", port=0, task_status=task_status)
        )
        assert port > 0
        got = await trio.to_thread.run_sync(tritonclient_session, port)
        nursery.cancel_scope.cancel()
    assert got["live"] and got["ready"] and got["model_ready"]
    assert got["metadata"]["name"] == "triton"  # type: ignore[index]
    np.testing.assert_array_equal(got["binary"], got["expected"])
    np.testing.assert_array_equal(got["json"], got["expected"])
    assert {e["name"] for e in got["index"]} >= {"add_sub", "identity_fp32"}  # type: ignore[attr-defined]
    with pytest.raises(OSError):  # cancelled: the listener is closed
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


SLOW_MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.5)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""
SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
INFER_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
).encode()


def post(model: str, body: bytes = INFER_BODY) -> bytes:
    return (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
        % (
            model.encode(),
            len(body),
        )
        + body
    )


def read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def send_and_read(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(post("identity_fp32"))
        assert read_response(sock).startswith(b"HTTP/1.1 200")


async def test_oversize_body_rejected_before_upload(server: Server) -> None:
    server.options.http_max_input_size = 1000

    def oversize(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n"
            )
            return read_response(sock)  # answered without sending a single body byte

    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_http(server, host="127.0.0.1", port=0, task_status=task_status)
        )
        await trio.to_thread.run_sync(send_and_read, port)
        reply = await trio.to_thread.run_sync(oversize, port)
        nursery.cancel_scope.cancel()
    assert reply.startswith(b"HTTP/1.1 400")
    assert b"--http-max-input-size" in reply


def test_config_for_benchmarks() -> None:
    config = hypercorn_config("::", 8000)
    assert config.bind == ["[::]:8000"]
    assert config.keep_alive_max_requests > 10**9 and config.accesslog is None
    assert hypercorn_config("0.0.0.0", 0).bind == ["0.0.0.0:0"]


def test_hypercorn_config_maps_trident_http_limits() -> None:
    """hypercorn's one read timeout is the larger of the head and body timeouts (whole seconds)."""
    config = hypercorn_config("127.0.0.1", 0, header_timeout=30.0, body_timeout=60.0)
    assert config.read_timeout == 60
    assert config.h11_max_incomplete_size == 64 * 1024  # trident's largest request head
    assert hypercorn_config("127.0.0.1", 0, header_timeout=0.5, body_timeout=0.2).read_timeout == 1
    assert hypercorn_config("127.0.0.1", 0, header_timeout=2.5, body_timeout=1.0).read_timeout == 3


async def test_client_hang_up_cancels_its_queued_request(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    options = ServerOptions(model_repositories=[str(repo)], exit_timeout_secs=5)
    async with open_server(options) as server, trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_http(server, host="127.0.0.1", port=0, task_status=task_status)
        )
        first = socket.create_connection(("127.0.0.1", port))
        second = socket.create_connection(("127.0.0.1", port))
        first.sendall(post("slow"))
        await trio.sleep(0.1)
        second.sendall(post("slow"))  # queued behind the first (one instance)
        await trio.sleep(0.2)
        second.close()  # the client goes away: its request is cancelled, not run
        reply = await trio.to_thread.run_sync(read_response, first)
        first.close()
        assert reply.startswith(b"HTTP/1.1 200")
        with trio.fail_after(10):
            while True:
                stats = kserve.statistics_entry_json(server.model_statistics("slow")[0])["inference_stats"]
                if stats["fail"]["count"]:  # type: ignore[index]
                    break
                await trio.sleep(0.05)
        assert stats["success"]["count"] == 1  # type: ignore[index]
        assert stats["fail"]["count"] == 1  # type: ignore[index]
        nursery.cancel_scope.cancel()
