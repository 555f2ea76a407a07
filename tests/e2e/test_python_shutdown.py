"""Shutdown always ends: the real ``python -m trident serve`` gets SIGTERM while decoupled
requests of Python models will never complete (execute never returns, or the model's thread
died before the final flag); the requests are cancelled at --exit-timeout-secs with a warning,
the models are unloaded and the process exits, as Triton does (in-process and isolated)."""

from __future__ import annotations

import queue
import signal
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from e2e.python_models import build_repo

EXIT_TIMEOUT = 4
# one exit timeout for the whole exit: the drain, the front ends and the unload share it
BOUND = 2 * EXIT_TIMEOUT + 2  # generous, but below the three timeouts it took before


def _alive(pid: str) -> bool:
    """The process runs (a zombie waiting for a parent to reap it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _stream_first_response(server, mode: int) -> tuple[grpcclient.InferenceServerClient, queue.Queue]:
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    t = grpcclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([mode], np.int32))
    c.async_stream_infer("stuck", [t], request_id=f"mode{mode}")
    result, error = results.get(timeout=60)
    assert error is None and int(result.as_numpy("OUT")[0]) == mode
    return c, results


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_sigterm_ends_the_process_with_requests_that_never_complete(tmp_path, server_factory, mode):
    repo = build_repo(tmp_path / "repo", ["stuck"], mode=mode)
    server = server_factory("--exit-timeout-secs", str(EXIT_TIMEOUT), repo=repo, timeout=120)
    clients = [_stream_first_response(server, 1)]  # its thread died after one response
    clients.append(_stream_first_response(server, 0))  # its execute never returns
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as http:
        assert http.get("/v2/health/live").status_code == 200
    children = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True).stdout.split()
    if mode == "process":
        assert children  # the model process
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server was still up {BOUND} s after SIGTERM:\n{server.log()}")
    elapsed = time.monotonic() - started
    for c, _ in clients:
        c.stop_stream()
        c.close()
    log = server.log()
    assert code == 0, log
    assert elapsed < BOUND
    assert "expired with requests in flight" in log
    assert "model 'stuck' version 1 did not return from execute" in log  # the warning naming it
    assert "server stopped" in log
    deadline = time.monotonic() + 30  # the model process goes with the server
    while any(_alive(pid) for pid in children):
        assert time.monotonic() < deadline, f"model processes {children} outlived the server"
        time.sleep(0.1)


def test_sigterm_with_a_model_that_never_sends_final_over_generate_stream(tmp_path, server_factory):
    """The same over HTTP generate_stream: the open SSE response ends and the process exits."""
    repo = build_repo(tmp_path / "repo", ["stuck"])
    server = server_factory("--exit-timeout-secs", str(EXIT_TIMEOUT), repo=repo, timeout=120)
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=httpx.Timeout(60, read=BOUND)) as http:
        with http.stream("POST", "/v2/models/stuck/generate_stream", json={"IN": 0}) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            assert '"OUT":0' in first.replace(" ", "")
            started = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            try:
                for _ in lines:  # the stream ends (or the connection drops) when the server goes
                    pass
            except httpx.HTTPError:
                pass
    try:
        code = server.proc.wait(BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server was still up {BOUND} s after SIGTERM:\n{server.log()}")
    assert code == 0 and time.monotonic() - started < BOUND
    assert "did not return from execute" in server.log()
