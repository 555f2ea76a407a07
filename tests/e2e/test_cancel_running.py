"""Cancellation reaches running kernels, against ``trident serve`` with the real clients.

A model whose run takes seconds (tests/e2e/long_models.py on onnxruntime; a Python model polling
``is_cancelled()``) on one instance: the client leaves (gRPC cancel, gRPC deadline, HTTP
disconnect) while it runs, and the next request on that instance is answered, right, long before
the run would have ended. OpenVINO's runs are not stopped (see backends/openvino_backend.py): its
client leaving changes nothing for the next request. Times are compared with the model's own run time measured in the same test,
never with a fixed figure. A batch with one live request runs on and answers it; cancelling a
request already answered, or twice, changes nothing; the server's threads and statistics stay
coherent.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import start_server
from e2e.long_models import write_long_model
from e2e.models import SLOW_ONE_INSTANCE_CONFIG, SLOW_PY, write_model
from tritonclient.utils import InferenceServerException

PROJECTED_S = 4.0  # the cancelled runs are sized to take about this long, from a measured run



@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cancel-running-repo")
    write_long_model(root, "long_onnxruntime", "onnxruntime")
    write_long_model(root, "long_openvino", "openvino")
    write_long_model(root, "long_queued", "onnxruntime", "dynamic_batching { }")
    # two requests form one batch (the second arrives well within the queue delay)
    write_long_model(root, "long_batch", "onnxruntime",
                     "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 30000000 }")
    write_model(root, "slow", SLOW_ONE_INSTANCE_CONFIG, SLOW_PY)
    return root


@pytest.fixture(scope="module")
def server(repo):
    s = start_server(repo=repo)
    yield s
    s.stop()


def grpc_inputs(count: int, rows: int = 1, base: float = 0.0) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT0", [rows, 4], "FP32")
    x.set_data_from_numpy(np.full((rows, 4), base, np.float32) + np.arange(4, dtype=np.float32))
    c = grpcclient.InferInput("COUNT", [rows, 1], "INT64")
    c.set_data_from_numpy(np.full((rows, 1), count, np.int64))
    return [x, c]


def expected(count: int, base: float = 0.0) -> np.ndarray:
    return (np.full((1, 4), base, np.float32) + np.arange(4, dtype=np.float32) + count).astype(np.float32)


def size_long_run(client: grpcclient.InferenceServerClient, model: str, seconds: float = PROJECTED_S,
                  rows: int = 1) -> tuple[int, float]:
    """The COUNT whose run takes about ``seconds`` on this machine now, and that projected time,
    from a run measured here (about a tenth of it; the time grows linearly with COUNT).
    ``rows``: the batch size of the measured requests."""
    client.infer(model, grpc_inputs(200, rows))  # warm
    count = 2000
    while True:
        t0 = time.monotonic()
        client.infer(model, grpc_inputs(count, rows))
        took = time.monotonic() - t0
        if took >= seconds / 10 or count >= 1_000_000:
            break
        count *= 2
    per = took / count
    long_count = int(seconds / per)
    return long_count, long_count * per


def stats(client: grpcclient.InferenceServerClient, model: str) -> dict:
    s = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    inf = s["inference_stats"]
    return {"success": int(inf["success"].get("count", 0)), "fail": int(inf["fail"].get("count", 0)),
            "inferences": int(s.get("inference_count", 0)), "executions": int(s.get("execution_count", 0))}


def canceled_failures(server, model: str) -> int:
    text = httpx.get(server.metrics_url, timeout=10).text
    m = re.search(rf'nv_inference_request_failure{{model="{model}",reason="CANCELED",version="1"}} (\d+)', text)
    return int(m.group(1)) if m else 0


def thread_names(server) -> list[str]:
    """The server's threads by their kernel names: trio names a worker thread after its job while
    it runs one and "Trio thread N" while it waits in trio's cache; a native library's threads
    carry the name of the job that started them."""
    names = []
    for task in Path(f"/proc/{server.proc.pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except FileNotFoundError:  # ended meanwhile
            pass
    return sorted(names)


def busy_threads(server) -> list[str]:
    """The server's threads less the idle ones of trio's thread cache. Those come and go with the
    server's own periodic jobs (a metrics poll takes one every interval and may keep it cached for
    ever), so their count at one moment says nothing about a thread left behind by a request."""
    return [name for name in thread_names(server) if not name.startswith("Trio thread ")]


def http_disconnect(server, model: str, count: int, after: float) -> None:
    """Send an HTTP infer request and close the connection ``after`` seconds later."""
    body = ('{"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0, 1, 2, 3]},'
            f'{{"name": "COUNT", "shape": [1, 1], "datatype": "INT64", "data": [{count}]}}]}}').encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    time.sleep(after)
    sock.close()


def leave(how: str, server, client: grpcclient.InferenceServerClient, model: str, count: int) -> list:
    """Start a request of ``count`` and make its client leave ``how``, 0.3 s into the run; returns
    the outcome list its callback fills (gRPC)."""
    outcome: list = []
    if how == "grpc-cancel":
        context = client.async_infer(model, grpc_inputs(count), lambda result, error: outcome.append(error))
        time.sleep(0.3)
        context.cancel()
    elif how == "grpc-deadline":
        client.async_infer(model, grpc_inputs(count), lambda result, error: outcome.append(error), client_timeout=0.3)
        time.sleep(0.3)
    else:
        http_disconnect(server, model, count, 0.3)
    return outcome


@pytest.mark.parametrize(("model", "how"), [
    ("long_onnxruntime", "grpc-cancel"), ("long_onnxruntime", "grpc-deadline"), ("long_onnxruntime", "http-disconnect"),
    # through the dynamic batcher's queue: the batch runs in the instance's worker task
    ("long_queued", "grpc-cancel"), ("long_queued", "http-disconnect"),
])
def test_a_run_whose_client_left_is_stopped_and_frees_the_instance(server, model, how):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        count, projected = size_long_run(client, model)
        reference = client.infer(model, grpc_inputs(7, base=1.0)).as_numpy("OUTPUT1")
        before = stats(client, model)
        cancels_before = canceled_failures(server, model)
        started = time.monotonic()
        outcome = leave(how, server, client, model, count)
        # the same instance answers the next request long before the first run would have ended
        result = client.infer(model, grpc_inputs(7, base=1.0))
        answered = time.monotonic() - started
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected(7, base=1.0))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), reference)  # nothing left of the stopped run
        assert answered < projected / 2, f"answered after {answered:.2f} s; the stopped run takes {projected:.2f} s"
        if how != "http-disconnect":
            deadline = time.monotonic() + 10
            while not outcome and time.monotonic() < deadline:
                time.sleep(0.01)
            assert outcome and outcome[0] is not None
            assert outcome[0].status() in ("StatusCode.CANCELLED", "StatusCode.DEADLINE_EXCEEDED")
        after = stats(client, model)
    # one failure, counted as cancelled; one success; the stopped run is no inference
    assert after["fail"] == before["fail"] + 1
    assert after["success"] == before["success"] + 1
    assert after["inferences"] == before["inferences"] + 1
    assert after["executions"] == before["executions"] + 1
    assert canceled_failures(server, model) == cancels_before + 1
    assert "terminate flag" not in server.log()  # onnxruntime does not log the stop as an error


def test_an_openvino_run_whose_client_left_runs_on_and_the_next_answer_is_right(server):
    model = "long_openvino"
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        count, _ = size_long_run(client, model, 1.0)
        reference = client.infer(model, grpc_inputs(7, base=1.0)).as_numpy("OUTPUT1")
        before = stats(client, model)
        outcome = leave("grpc-cancel", server, client, model, count)
        result = client.infer(model, grpc_inputs(7, base=1.0))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected(7, base=1.0))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), reference)
        assert outcome and outcome[0] is not None and outcome[0].status() == "StatusCode.CANCELLED"
        after = stats(client, model)
    assert after["fail"] == before["fail"] + 1 and after["success"] == before["success"] + 1


def test_a_batch_with_one_live_request_runs_on_for_it(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        # requests of 2 rows run at once (the preferred batch size); the test's pair forms one batch
        count, projected = size_long_run(client, "long_batch", PROJECTED_S / 4, rows=2)
        before = stats(client, "long_batch")
        results: dict[str, tuple] = {}

        def done(name: str):
            return lambda result, error: results.__setitem__(name, (result, error))

        gone = client.async_infer("long_batch", grpc_inputs(count), done("gone"))
        client.async_infer("long_batch", grpc_inputs(count, base=2.0), done("live"))
        time.sleep(0.3)  # the batch of two is running
        gone.cancel()
        deadline = time.monotonic() + 10 * projected + 30
        while len(results) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        live_result, live_error = results["live"]
        assert live_error is None, live_error
        np.testing.assert_array_equal(live_result.as_numpy("OUTPUT0"), expected(count, base=2.0))
        assert results["gone"][1] is not None and results["gone"][1].status() == "StatusCode.CANCELLED"
        after = stats(client, "long_batch")
    assert after["executions"] == before["executions"] + 1  # one batch of both
    assert after["success"] == before["success"] + 1 and after["fail"] == before["fail"] + 1


def test_cancelling_a_finished_request_or_twice_changes_nothing(server):
    model = "long_onnxruntime"
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        count, projected = size_long_run(client, model, 1.0)
        threads_before = busy_threads(server)
        before = stats(client, model)
        # answered, then cancelled twice: nothing happens
        answered = threading.Event()
        context = client.async_infer(model, grpc_inputs(3), lambda result, error: answered.set())
        assert answered.wait(30)
        context.cancel()
        context.cancel()
        # cancelled twice while running: stopped once, the instance answers the next one
        outcome: list = []
        started = time.monotonic()
        context = client.async_infer(model, grpc_inputs(count * 4), lambda result, error: outcome.append(error))
        time.sleep(0.2)
        context.cancel()
        context.cancel()
        result = client.infer(model, grpc_inputs(5))
        assert time.monotonic() - started < projected * 2  # the stopped run would take 4x projected
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected(5))
        # another client, over HTTP, is unaffected
        http = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
        c = httpclient.InferInput("COUNT", [1, 1], "INT64")
        c.set_data_from_numpy(np.array([[9]], np.int64))
        np.testing.assert_array_equal(http.infer(model, [x, c]).as_numpy("OUTPUT0"), expected(9))
        http.close()
        after = stats(client, model)
    assert after["success"] == before["success"] + 3 and after["fail"] == before["fail"] + 1
    # no thread left behind: none still runs a job of these requests (a stopped run's thread
    # returns once onnxruntime sees the flag: wait for it)
    deadline = time.monotonic() + 30
    while len(busy_threads(server)) > len(threads_before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(busy_threads(server)) <= len(threads_before), (threads_before, busy_threads(server))
    assert server.proc.poll() is None


def test_a_python_model_sees_is_cancelled_while_it_runs(server):
    """A Python model cannot be stopped from outside: it polls ``request.is_cancelled()``, which
    turns true while its execute runs (here a gRPC deadline), and returns early."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([30.0], np.float32))
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            client.infer("slow", [x], client_timeout=0.5)
        assert "DEADLINE_EXCEEDED" in str(e.value.status())
        y = grpcclient.InferInput("X", [1], "FP32")
        y.set_data_from_numpy(np.array([0.0], np.float32))
        client.infer("slow", [y])
        assert time.monotonic() - started < 15  # not the 30 s the cancelled call asked for
