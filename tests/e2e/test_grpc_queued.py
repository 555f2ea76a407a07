"""Unary gRPC calls that wait in a model's queue, against ``trident serve``: such a call has no
task of its own on the server (the task that delivers its response answers it), so these tests
drive every way it can end: answered in a batch with calls of the same connection, a response
too large for the flow-control windows, a client that stops reading, a model error, a client
that cancels, a connection that closes, and a server that stops with calls still queued.
Each runs once per HTTP/2 implementation (``--grpc-http2``)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from e2e.grpc_raw import frame, request_headers
from e2e.test_scheduling import executions, pending, started, wait_for, write_model
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation

IO = '''
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "ORDER" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "SIZE" data_type: TYPE_INT64 dims: [ 1 ] } ]
'''
# held: a queue delay, so no call runs at once in its caller's place, every one waits in the
# queue; single: one request at a time, queued behind a running one
MODELS = {
    "held": (8, "dynamic_batching { max_queue_delay_microseconds: 20000 }"),
    "single": (1, "dynamic_batching { }"),
}
PATH = "/inference.GRPCInferenceService/ModelInfer"


def write_models(repo: Path) -> None:
    for name, (max_batch_size, extra) in MODELS.items():
        write_model(repo, name, max_batch_size, extra, io=IO)


def block(client: grpcclient.InferenceServerClient, repo: Path, request_id: str, seconds: float) -> threading.Event:
    """Start a call that keeps the "single" model busy for ``seconds``; returns once it runs
    (the event is set when it is answered)."""
    answered = threading.Event()
    client.async_infer("single", grpc_input(np.array([seconds])), lambda result, error: answered.set(),
                       request_id=request_id)
    wait_for(lambda: started(repo, "single", request_id))
    return answered


@pytest.fixture(scope="module")
def repo(tmp_path_factory, grpc_http2) -> Path:
    root = tmp_path_factory.mktemp(f"queued-repo-{grpc_http2}")  # the models' logs: one per server
    write_models(root)
    return root


@pytest.fixture(scope="module")
def server(repo, grpc_http2):
    from e2e.conftest import start_server

    s = start_server("--model-control-mode=explicit", "--load-model=*", repo=repo)
    yield s
    s.stop()


def grpc_input(values: np.ndarray) -> list[grpcclient.InferInput]:
    x = values.reshape(1, -1).astype(np.float32)
    inp = grpcclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def request_body(model: str, values: np.ndarray, request_id: str = "") -> bytes:
    x = values.reshape(1, -1).astype(np.float32)
    m = pb.ModelInferRequest(model_name=model, id=request_id)
    m.inputs.add(name="X", datatype="FP32", shape=list(x.shape))
    m.raw_input_contents.append(x.tobytes())
    return m.SerializeToString()


def output_y(raw: bytes) -> np.ndarray:
    r = pb.ModelInferResponse.FromString(raw)
    return np.frombuffer(r.raw_output_contents[[o.name for o in r.outputs].index("Y")], np.float32)


def infer_all(client: grpcclient.InferenceServerClient, model: str, inputs: list[np.ndarray],
              **kwargs) -> list[tuple[object, InferenceServerException | None]]:
    """Every input as one async_infer on the one connection of ``client``, all in flight at once."""
    results: list = [None] * len(inputs)
    done = threading.Semaphore(0)

    def callback(i: int):
        def on_result(result, error):
            results[i] = (result, error)
            done.release()
        return on_result

    for i, values in enumerate(inputs):
        client.async_infer(model, grpc_input(values), callback(i), request_id=f"r{i}")
    for _ in inputs:
        assert done.acquire(timeout=60), "a call was never answered"
    return results


def settled(count, quiet: float = 0.5, timeout: float = 30.0) -> int:
    """``count()`` once it is above 0 and has not changed for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last, since = count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif now > 0 and time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"still changing after {timeout} s (last {last})")


def test_queued_calls_of_one_connection_are_answered_from_their_batches(server, repo):
    inputs = [np.array([0.0, i, -i], np.float32) for i in range(64)]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        results = infer_all(client, "held", inputs)
        stats = client.get_inference_statistics("held", as_json=True)["model_stats"][0]
    for values, (result, error) in zip(inputs, results, strict=True):
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("Y")[0], values)
    sizes = [int(result.as_numpy("SIZE")[0, 0]) for result, _ in results]
    assert max(sizes) > 1  # they shared executions
    assert int(stats["inference_stats"]["success"]["count"]) >= 64
    assert int(stats["execution_count"]) < int(stats["inference_count"])


def test_queued_responses_larger_than_the_windows_still_arrive(server):
    # 1 MiB responses: beyond the stream's flow-control window, sent by a task of the connection
    rng = np.random.default_rng(7)
    inputs = [np.concatenate([[0.0], rng.standard_normal(262_143)]).astype(np.float32) for _ in range(12)]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        results = infer_all(client, "held", inputs)
    for values, (result, error) in zip(inputs, results, strict=True):
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("Y")[0], values)


def test_a_client_that_stops_reading_gets_every_queued_response_in_order(server, repo):
    """Many queued calls answered while the client reads nothing: the server's writes stop
    part-way (a small receive buffer) and what is left goes out later, in order (any frame out
    of place breaks the client's HPACK state or its streams)."""
    host, port = server.grpc_url.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.settimeout(30)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    conn.increment_flow_control_window(2**31 - 1 - 65535)
    sock.sendall(conn.data_to_send())
    count = 96
    while conn.outbound_flow_control_window < count * 65536 or conn.remote_settings.initial_window_size < 65536:
        conn.receive_data(sock.recv(65536))  # the server's SETTINGS and WINDOW_UPDATE
        sock.sendall(conn.data_to_send())
    rng = np.random.default_rng(11)
    # 60 KB responses: each fits a stream's window and goes out whole from the answering task
    inputs = [np.concatenate([[0.0], rng.standard_normal(15_000)]).astype(np.float32) for _ in range(count)]
    stream_ids = []
    for i, values in enumerate(inputs):
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(stream_id, request_headers(PATH))
        body = frame(request_body("held", values, f"s{i}"))
        for pos in range(0, len(body), 16384):
            conn.send_data(stream_id, body[pos:pos + 16384], end_stream=pos + 16384 >= len(body))
        stream_ids.append(stream_id)
    sock.sendall(conn.data_to_send())
    # calls are executed and answered into a socket nobody reads, until the server stops
    # reading requests from a client that does not read its answers (back-pressure)
    settled(lambda: sum(1 for e in executions(repo, "held") for i in e[4].split(",") if i.startswith("s")))
    data: dict[int, bytearray] = {s: bytearray() for s in stream_ids}
    status: dict[int, bytes] = {}
    while len(status) < count:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        for event in conn.receive_data(chunk):
            if isinstance(event, h2.events.DataReceived):
                data[event.stream_id] += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.TrailersReceived):
                status[event.stream_id] = dict(event.headers)[b"grpc-status"]
            elif isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                raise AssertionError(f"unexpected {event}")
        sock.sendall(conn.data_to_send())
    sock.close()
    assert set(status.values()) == {b"0"}
    for stream_id, values in zip(stream_ids, inputs, strict=True):
        np.testing.assert_array_equal(output_y(bytes(data[stream_id][5:])), values)


def test_a_queued_call_whose_batch_fails_gets_the_models_error(server):
    inputs = [np.array([-1.0, i], np.float32) for i in range(4)]  # the model raises for the batch
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        results = infer_all(client, "held", inputs)
        after = client.infer("held", grpc_input(np.array([0.0, 5.0])))
    for _, error in results:
        assert error is not None and error.status() == "StatusCode.INTERNAL" and "negative input" in error.message()
    np.testing.assert_array_equal(after.as_numpy("Y")[0], [0.0, 5.0])


def test_a_queued_call_cancelled_by_its_client_never_executes(server, repo):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answered = block(client, repo, "blocker", 2.0)
        outcome: list = []
        context = client.async_infer("single", grpc_input(np.array([0.0])),
                                     lambda result, error: outcome.append(error), request_id="gone")
        wait_for(lambda: pending(server, "single") == 1)
        context.cancel()
        wait_for(lambda: bool(outcome))
        assert outcome[0] is not None and "CANCELLED" in str(outcome[0].status())
        assert answered.wait(10)
        wait_for(lambda: pending(server, "single") == 0)  # it left the queue without executing
        after = client.infer("single", grpc_input(np.array([0.0])), request_id="after")
        assert after.as_numpy("Y") is not None
    assert [e[4] for e in executions(repo, "single")][-2:] == ["blocker", "after"]
    assert "gone" not in [e[4] for e in executions(repo, "single")]


def test_queued_calls_of_a_closed_connection_are_cancelled_and_release_the_model(server, repo):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        answered = block(client, repo, "blocker2", 2.0)
        host, port = server.grpc_url.split(":")
        sock = socket.create_connection((host, int(port)))
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        conn.initiate_connection()
        for i in range(5):
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(stream_id, request_headers(PATH))
            conn.send_data(stream_id, frame(request_body("single", np.array([0.0]), f"closed{i}")), end_stream=True)
        sock.sendall(conn.data_to_send())
        wait_for(lambda: pending(server, "single") == 5)
        sock.close()
        wait_for(lambda: pending(server, "single") == 0)
        assert answered.wait(10)
    ids = [e[4] for e in executions(repo, "single")]
    assert not any(i.startswith("closed") for i in ids)
    # nothing of theirs is left in flight: the model unloads at once (an unload waits for it)
    base = f"http://{server.http_url}/v2/repository/models/single"
    assert httpx.post(f"{base}/unload", json={}, timeout=10).status_code == 200
    wait_for(lambda: _state(server, "single") == "UNAVAILABLE", timeout=10)
    assert httpx.post(f"{base}/load", json={}, timeout=30).status_code == 200


def _state(server, model: str) -> str:
    index = httpx.post(f"http://{server.http_url}/v2/repository/index", json={}, timeout=10).json()
    return next(m.get("state", "") for m in index if m["name"] == model)


def test_a_server_stopping_with_queued_calls_answers_them_and_exits(tmp_path, grpc_http2):
    from e2e.conftest import start_server

    write_models(tmp_path)
    server = start_server(repo=tmp_path)
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            outcomes: list = []
            client.async_infer("single", grpc_input(np.array([1.0])), lambda result, error: outcomes.append((result, error)),
                               request_id="blocker")
            wait_for(lambda: started(tmp_path, "single", "blocker"))
            for i in range(3):
                client.async_infer("single", grpc_input(np.array([0.0, i])), lambda result, error: outcomes.append((result, error)),
                                   request_id=f"q{i}")
            wait_for(lambda: pending(server, "single") == 3)
            code = server.stop()
            assert code == 0
            wait_for(lambda: len(outcomes) == 4)
        assert all(error is None for _, error in outcomes)  # the drain let the queued calls finish
        assert "request(s) in flight" not in server.log()
    finally:
        server.stop()
