"""Process-isolated Python models under the real server: a crash or a hang fails only the
requests the model process was working on (INTERNAL), the process is restarted and the server
keeps serving everything else."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.python_models import build_repo
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = build_repo(tmp_path_factory.mktemp("isolated"), ["crashy", "dcrash", "add_sub"])
    s = start_server(repo=repo, timeout=120)
    yield s
    s.stop()


def _x(value: float, module=httpclient):
    t = module.InferInput("X", [1], "FP32")
    t.set_data_from_numpy(np.array([value], np.float32))
    return [t]


def _pid(result) -> int:
    return int(result.get_response()["parameters"]["pid"])


def _add_sub_ok(client) -> bool:
    a = np.ones((1, 16), np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = httpclient.InferInput(name, [1, 16], "FP32")
        t.set_data_from_numpy(a)
        inputs.append(t)
    return bool((client.infer("add_sub", inputs).as_numpy("OUTPUT0") == 2).all())


def test_model_runs_in_a_process_of_its_own(server):
    c = httpclient.InferenceServerClient(server.http_url)
    pid = _pid(c.infer("crashy", _x(1)))
    assert pid != server.proc.pid
    assert _pid(c.infer("crashy", _x(2))) == pid
    c.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_crash_fails_only_its_request_and_the_process_restarts(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    c = module.InferenceServerClient(url)
    h = httpclient.InferenceServerClient(server.http_url)
    before = _pid(h.infer("crashy", _x(1)))
    with pytest.raises(InferenceServerException, match=r"killed by SIGSEGV") as info:
        c.infer("crashy", _x(-1, module))
    if protocol == "http":
        assert info.value.status() == "500"  # INTERNAL
    else:
        assert info.value.status() == "StatusCode.INTERNAL"
    assert h.is_server_live()
    assert _add_sub_ok(h)  # other models are unaffected
    after = _pid(h.infer("crashy", _x(3)))  # waits for the restarted process
    assert after != before
    c.close()
    h.close()


def test_requests_queued_behind_a_crash_are_served_by_the_new_process(server):
    c = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    futures = [c.async_infer("crashy", _x(-1))] + [c.async_infer("crashy", _x(i + 1)) for i in range(6)]
    outcomes = []
    for f in futures:
        try:
            outcomes.append(f.get_result().as_numpy("Y").tolist())
        except InferenceServerException as e:
            outcomes.append(str(e))
    assert "SIGSEGV" in outcomes[0]
    assert outcomes[1:] == [[float(i + 1)] for i in range(6)]
    c.close()


def test_a_hang_is_killed_after_the_timeout(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    before = _pid(c.infer("crashy", _x(1)))
    with pytest.raises(InferenceServerException, match="did not finish execute within 2.0 s"):
        c.infer("crashy", _x(0))
    assert _add_sub_ok(c)
    assert _pid(c.infer("crashy", _x(5))) != before
    c.close()


def test_a_decoupled_model_crash_fails_its_open_streams(server):
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        t = grpcclient.InferInput("IN", [1], "INT32")
        t.set_data_from_numpy(np.array([1], np.int32))
        c.async_stream_infer("dcrash", [t], request_id="doomed")
        got = [results.get(timeout=30) for _ in range(3)]
    finally:
        c.stop_stream()
        c.close()
    assert [error is None for _, error in got] == [True, True, False]
    assert "exited with code 3" in str(got[2][1]) and "the request was lost" in str(got[2][1])
    # and the restarted process serves the next stream
    results = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        t = grpcclient.InferInput("IN", [1], "INT32")
        t.set_data_from_numpy(np.array([0], np.int32))
        c.async_stream_infer("dcrash", [t], request_id="fine", enable_empty_final_response=True)
        got = [results.get(timeout=60) for _ in range(3)]
    finally:
        c.stop_stream()
        c.close()
    assert all(error is None for _, error in got)
    assert got[2][0].get_response().parameters["triton_final_response"].bool_param
