"""Clients that never read (README "Security and limits"): the send timeout.

``--http-send-timeout-secs`` / ``--grpc-send-timeout-secs`` (nginx's ``send_timeout``): a
connection whose client takes none of the response bytes for that long is closed (with a
reset), and a gRPC stream whose response waits that long at a zero flow-control window is reset
(RST_STREAM CANCEL). Raw sockets play the client that never reads; tritonclient plays the
well-behaved client on another connection, whose every answer is checked. The metrics port
shows the bytes waiting and the connections closed. 0 keeps the old behaviour (no timeout).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.settings
import httpx
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.http as httpclient
from e2e.conftest import start_server
from e2e.grpc_raw import frame, open_raw

INFER = "/inference.GRPCInferenceService/ModelInfer"
BIG = 8 * 1024 * 1024  # bytes of the answer a never-reading client asks for: more than the kernel buffers
CONFIG = """
name: "sized"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"OUT: N bytes, byte i = i % 251.\"\"\"

    def execute(self, requests):
        out = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            data = (np.arange(n, dtype=np.int64) % 251).astype(np.uint8)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data)]))
        return out
"""


def _repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo" / "sized"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL)
    return tmp_path / "repo"


def _expected(n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) % 251).astype(np.uint8)


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """A server with 1 s send timeouts on both protocols."""
    server = start_server("--http-send-timeout-secs=1", "--grpc-send-timeout-secs=1",
                          repo=_repo(tmp_path_factory.mktemp("timed")))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def untimed(tmp_path_factory):
    """A server with the send timeouts off (0): the behaviour before them."""
    server = start_server("--http-send-timeout-secs=0", "--grpc-send-timeout-secs=0",
                          repo=_repo(tmp_path_factory.mktemp("untimed")))
    yield server
    server.stop()


def _metric(server, name: str, **labels: str) -> float:
    text = httpx.get(server.metrics_url).text
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(label_text) + r"\}" if labels else "") + r" (\S+)"
    match = re.search("^" + pattern + "$", text, re.MULTILINE)
    assert match is not None, f"{name} {labels} not in:\n{text}"
    return float(match.group(1))


# ---- raw clients that never read -------------------------------------------------------------


def _small_receive_buffer() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the client takes little into its buffer
    return sock


def _http_never_reading(port: int, requests: int = 8) -> socket.socket:
    """A connection with ``requests`` pipelined infer requests for BIG bytes each, never read."""
    body = json.dumps({"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [BIG]}],
                       "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}]}).encode()
    head = (f"POST /v2/models/sized/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock = _small_receive_buffer()
    sock.connect(("127.0.0.1", port))
    sock.sendall((head + body) * requests)
    return sock


def _grpc_never_reading(port: int, n: int = BIG) -> socket.socket:
    """A gRPC connection that opens its windows wide, asks for ``n`` bytes and never reads."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    conn.increment_flow_control_window(2**31 - 1 - 65535)
    stream_id = conn.get_next_available_stream_id()
    conn.send_headers(stream_id, [(b":method", b"POST"), (b":scheme", b"http"), (b":path", INFER.encode()),
                                  (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    conn.send_data(stream_id, frame(_infer_request(n).SerializeToString()), end_stream=True)
    sock = _small_receive_buffer()
    sock.connect(("127.0.0.1", port))
    sock.sendall(conn.data_to_send())
    return sock


def _infer_request(n: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="sized")
    tensor = request.inputs.add(name="N", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(n)
    return request


_TCP_STATES = {1: "open", 7: "reset", 8: "eof"}  # ESTABLISHED, CLOSE (our side never closed: a reset), CLOSE_WAIT


def _state(sock: socket.socket) -> str:
    """"open", "eof" or "reset", from the kernel's TCP state of the client's socket: nothing is
    read (reading would make the client one that reads)."""
    state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
    return _TCP_STATES.get(state, f"tcp state {state}")


def _wait_closed(sock: socket.socket, within: float) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        state = _state(sock)
        if state != "open":
            return state
        time.sleep(0.1)
    return "open"


# ---- well-behaved clients on other connections -------------------------------------------------


def _http_victim(server, n: int = 100_000) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        n_in = httpclient.InferInput("N", [1], "INT32")
        n_in.set_data_from_numpy(np.array([n], np.int32))
        result = client.infer("sized", [n_in], outputs=[httpclient.InferRequestedOutput("OUT", binary_data=True)])
        np.testing.assert_array_equal(result.as_numpy("OUT"), _expected(n))
    finally:
        client.close()


def _grpc_victim(server, n: int = 100_000) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        n_in = grpcclient.InferInput("N", [1], "INT32")
        n_in.set_data_from_numpy(np.array([n], np.int32))
        result = client.infer("sized", [n_in], client_timeout=30)
        np.testing.assert_array_equal(result.as_numpy("OUT"), _expected(n))
    finally:
        client.close()


# ---- tests ------------------------------------------------------------------------------------


def test_http_client_that_never_reads_is_closed_while_others_are_served(timed):
    before = _metric(timed, "trident_send_timeout_count", protocol="http", closed="connection")
    sock = _http_never_reading(timed.http_port)
    try:
        _http_victim(timed)  # served while the stalled connection waits
        assert _wait_closed(sock, within=15) == "reset"  # closed by the server, with a reset
        _http_victim(timed)
    finally:
        sock.close()
    assert _metric(timed, "trident_send_timeout_count", protocol="http", closed="connection") == before + 1
    _settled(timed)


def test_grpc_connection_that_never_reads_is_closed(timed):
    before = _metric(timed, "trident_send_timeout_count", protocol="grpc", closed="connection")
    sock = _grpc_never_reading(timed.grpc_port)
    try:
        _grpc_victim(timed)
        assert _wait_closed(sock, within=15) == "reset"
        _grpc_victim(timed)
    finally:
        sock.close()
    assert _metric(timed, "trident_send_timeout_count", protocol="grpc", closed="connection") == before + 1
    _settled(timed)


def test_grpc_stream_held_at_a_zero_window_is_reset(timed):
    before = _metric(timed, "trident_send_timeout_count", protocol="grpc", closed="stream")

    async def main() -> tuple[int | None, bytes, int | None]:
        settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
        async with open_raw(timed.grpc_port, settings=settings) as client:
            stalled = await client.open(INFER)
            await client.send(stalled, frame(_infer_request(1000).SerializeToString()), end_stream=True)
            with trio.fail_after(15):
                await stalled.closed.wait()
            # the connection stays usable: a stream that may read gets its answer
            client.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
            await client.flush()
            with trio.fail_after(15):
                answered = await client.unary(INFER, _infer_request(10).SerializeToString())
            return stalled.reset_code, bytes(stalled.data), answered.status

    code, data, status = trio.run(main)
    assert code == 8  # RST_STREAM CANCEL
    assert data == b""  # not a byte of the answer went past the zero window
    assert status == 0
    _grpc_victim(timed)
    assert _metric(timed, "trident_send_timeout_count", protocol="grpc", closed="stream") == before + 1
    _settled(timed)


def _settled(server) -> None:
    """Once the stalled clients are gone, nothing is left waiting to be sent."""
    deadline = time.monotonic() + 10
    while _metric(server, "trident_send_pending_bytes") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(server, "trident_send_pending_bytes") == 0


def test_timeout_0_keeps_clients_that_never_read(untimed):
    """The old behaviour: after twice the timeout the tests use, every stalled client is still
    connected, and the bytes waiting for them show in the gauge."""
    http = _http_never_reading(untimed.http_port)
    grpc = _grpc_never_reading(untimed.grpc_port)

    async def zero_window() -> int | None:
        settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
        async with open_raw(untimed.grpc_port, settings=settings) as client:
            stalled = await client.open(INFER)
            await client.send(stalled, frame(_infer_request(1000).SerializeToString()), end_stream=True)
            await trio.sleep(2)
            return stalled.reset_code if stalled.closed.is_set() else -1

    try:
        assert trio.run(zero_window) == -1  # still open, not reset
        assert _state(http) == "open" and _state(grpc) == "open"
        assert _metric(untimed, "trident_send_pending_bytes") > 0
        _http_victim(untimed)
        _grpc_victim(untimed)
        for protocol, closed in (("http", "connection"), ("grpc", "connection"), ("grpc", "stream")):
            assert _metric(untimed, "trident_send_timeout_count", protocol=protocol, closed=closed) == 0
    finally:
        http.close()
        grpc.close()


@pytest.mark.parametrize(("flag", "value"), [("--http-send-timeout-secs", "-1"), ("--http-send-timeout-secs", "nan"),
                                           ("--grpc-send-timeout-secs", "inf"), ("--grpc-send-timeout-secs", "soon")])
def test_bad_send_timeouts_are_refused(flag, value):
    proc = subprocess.run([sys.executable, "-m", "trident", "serve", f"{flag}={value}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"argument {flag}:" in proc.stderr and value in proc.stderr
