"""Deadlines end to end (README "Deadlines"), against ``trident serve`` with tritonclient.

A gRPC deadline (``client_timeout``) and Triton's ``timeout`` parameter (µs, HTTP and gRPC)
become the request's deadline; ensemble steps and BLS children inherit it. Given 200 ms, a
3-step ensemble and a 3-model BLS chain whose steps take 150 ms each fail with the timed-out
status and their third step never starts (each step appends a marker line when it starts:
the tests assert on those, never on how close to the deadline the error came). A request whose
deadline passes while it waits in the queue never runs. Bad ``timeout`` values are INVALID_ARG,
and other clients are unaffected.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import start_server
from e2e.deadline_models import QUEUE_STEP_S, STEP_S, read_markers, write_deadline_repo
from tritonclient.utils import InferenceServerException

TIMEOUT_US = 200_000
SETTLE_S = 3 * STEP_S + 0.3  # long enough for a step that should not start to have started


@pytest.fixture(scope="module")
def marker(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("deadline-markers") / "started.txt"


@pytest.fixture(scope="module")
def server(tmp_path_factory, marker):
    root = write_deadline_repo(tmp_path_factory.mktemp("deadline-repo"), marker)
    s = start_server(repo=root)
    yield s
    s.stop()


def http_inputs(value: float = 1.0) -> list[httpclient.InferInput]:
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return [x]


def grpc_inputs(value: float = 1.0) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return [x]


def started(marker: Path, request_id: str) -> list[str]:
    time.sleep(SETTLE_S)  # whatever would start late has had its time to
    return [model for model, _ in read_markers(marker, request_id)]


def rejected(server, model: str) -> int:
    text = httpx.get(server.metrics_url, timeout=10).text
    m = re.search(rf'nv_inference_request_failure{{model="{model}",reason="REJECTED",version="1"}} (\d+)', text)
    return int(m.group(1)) if m else 0


def assert_timed_out(e: pytest.ExceptionInfo[InferenceServerException]) -> None:
    assert "Request timeout expired" in str(e.value), str(e.value)


@pytest.mark.parametrize(("model", "steps"), [("ens3", ["s1", "s2", "s3"]), ("b1", ["b1", "b2", "b3"])])
def test_http_timeout_stops_the_chain(server, marker, model, steps):
    client = httpclient.InferenceServerClient(server.http_url)
    rid = f"http-{model}"
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, http_inputs(), request_id=rid, timeout=TIMEOUT_US)
    assert_timed_out(e)
    assert str(e.value.status()) == "503", e.value.status()
    ran = started(marker, rid)
    assert ran[:2] == steps[:2], ran  # the first step ran, the second started before the deadline
    assert steps[2] not in ran, ran  # the third would start after it: it never does
    # the same chain with no deadline runs to the end
    out = client.infer(model, http_inputs(), request_id=f"{rid}-free").as_numpy("Y")
    assert out.tolist() == ([4.0] if model == "ens3" else [2.0])


@pytest.mark.parametrize(("model", "steps"), [("ens3", ["s1", "s2", "s3"]), ("b1", ["b1", "b2", "b3"])])
def test_grpc_timeout_parameter_stops_the_chain(server, marker, model, steps):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rid = f"grpc-param-{model}"
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, grpc_inputs(), request_id=rid, timeout=TIMEOUT_US)
    assert_timed_out(e)
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    ran = started(marker, rid)
    assert ran[:1] == steps[:1] and steps[2] not in ran, ran


@pytest.mark.parametrize(("model", "steps"), [("ens3", ["s1", "s2", "s3"]), ("b1", ["b1", "b2", "b3"])])
def test_grpc_deadline_stops_the_chain(server, marker, model, steps):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rid = f"grpc-deadline-{model}"
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, grpc_inputs(), request_id=rid, client_timeout=TIMEOUT_US / 1e6)
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"  # the gRPC client's own status
    ran = started(marker, rid)
    assert ran[:1] == steps[:1] and steps[2] not in ran, ran


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_queued_request_past_its_deadline_never_runs(server, marker, protocol):
    """A request that waits behind a long one past its deadline is answered at its deadline and
    never executed; the long one is unaffected."""
    first: dict[str, object] = {}

    def run_first() -> None:  # a client of its own: tritonclient.http's is not shared across threads
        client = httpclient.InferenceServerClient(server.http_url)
        first["y"] = client.infer("q", http_inputs(5.0), request_id=f"q-first-{protocol}").as_numpy("Y")

    t = threading.Thread(target=run_first)
    t.start()
    http = httpclient.InferenceServerClient(server.http_url)
    deadline = time.monotonic() + 30
    while not read_markers(marker, f"q-first-{protocol}"):  # running: the next one queues
        assert time.monotonic() < deadline
        time.sleep(0.01)
    rid = f"q-late-{protocol}"
    rejected_before = rejected(server, "q")
    sent = time.monotonic()
    with pytest.raises(InferenceServerException) as e:
        if protocol == "http":
            http.infer("q", http_inputs(), request_id=rid, timeout=100_000)
        else:
            grpcclient.InferenceServerClient(server.grpc_url).infer("q", grpc_inputs(), request_id=rid,
                                                                    timeout=100_000)
    waited = time.monotonic() - sent
    assert_timed_out(e)
    assert waited < QUEUE_STEP_S  # answered at its deadline, not when the instance got free
    t.join(30)
    assert first["y"].tolist() == [6.0]  # type: ignore[union-attr]
    assert started(marker, rid) == []  # never executed
    assert rejected(server, "q") == rejected_before + 1  # counted as Triton counts a queue timeout


def test_bad_timeout_values_are_invalid_arg(server, marker):
    url = f"http://{server.http_url}"
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    for value in (-1, "200", 1.5, True, 10**15):
        r = httpx.post(f"{url}/v2/models/fast/infer", json={**body, "parameters": {"timeout": value}}, timeout=10)
        assert r.status_code == 400, (value, r.text)
        assert "timeout" in r.json()["error"], r.text
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for value in (-5, 10**15):
        with pytest.raises(InferenceServerException) as e:
            grpc.infer("fast", grpc_inputs(), timeout=value)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT", str(e.value)
        assert "timeout" in str(e.value)
    # 0 is Triton's "no timeout"; a generous timeout changes nothing
    assert grpc.infer("fast", grpc_inputs(), timeout=0).as_numpy("Y").tolist() == [2.0]
    r = httpx.post(f"{url}/v2/models/fast/infer", json={**body, "parameters": {"timeout": 10_000_000}}, timeout=10)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0], r.text
    assert server.proc.poll() is None


def test_other_clients_unaffected(server, marker):
    """While a chain times out, a client without a deadline on another model is answered, and
    the chain's models answer the next requests."""
    errors: list[BaseException] = []

    def chain() -> None:
        try:
            httpclient.InferenceServerClient(server.http_url).infer("ens3", http_inputs(), timeout=TIMEOUT_US)
        except InferenceServerException as e:
            errors.append(e)

    t = threading.Thread(target=chain)
    t.start()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for i in range(20):
        assert grpc.infer("fast", grpc_inputs(float(i))).as_numpy("Y").tolist() == [i + 1.0]
    t.join(30)
    assert len(errors) == 1 and "Request timeout expired" in str(errors[0])
    assert grpc.infer("ens3", grpc_inputs(2.0)).as_numpy("Y").tolist() == [5.0]
    assert grpc.infer("b1", grpc_inputs(2.0)).as_numpy("Y").tolist() == [3.0]


def test_stream_request_timeout_stops_the_ensemble(server, marker):
    """A ModelStreamInfer request's own ``timeout`` is its deadline: the stream gets the error
    response, the third step never starts, and the stream goes on serving."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: list = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        client.async_stream_infer("ens3", grpc_inputs(), request_id="stream-late", timeout=TIMEOUT_US)
        client.async_stream_infer("fast", grpc_inputs(7.0), request_id="stream-after")
        deadline = time.monotonic() + 30
        while len(results) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        client.stop_stream()
    errors = [error for _, error in results if error is not None]
    answers = [result.as_numpy("Y").tolist() for result, error in results if error is None]
    assert len(errors) == 1 and "Request timeout expired" in str(errors[0]), errors
    assert answers == [[8.0]]
    ran = started(marker, "stream-late")
    assert ran[:1] == ["s1"] and "s3" not in ran, ran
