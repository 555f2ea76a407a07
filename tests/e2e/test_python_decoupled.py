"""Decoupled Python models over gRPC ModelStreamInfer: ordering, many requests on one stream,
and cancellation that reaches the model (in-process and process-isolated)."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from e2e.python_models import build_repo

DELAY = 0.1  # seconds between two responses of the repeater


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request, tmp_path_factory):
    from e2e.conftest import start_server

    repo = build_repo(tmp_path_factory.mktemp(f"dec-{request.param}"), ["repeater"], mode=request.param)
    s = start_server(repo=repo, timeout=120)
    yield s
    s.stop()


def _inputs(count: int, delay: float) -> list[grpcclient.InferInput]:
    a = grpcclient.InferInput("IN", [1], "INT32")
    a.set_data_from_numpy(np.array([count], np.int32))
    b = grpcclient.InferInput("DELAY", [1], "FP32")
    b.set_data_from_numpy(np.array([delay], np.float32))
    return [a, b]


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was not written")
        time.sleep(0.02)
    return path.read_text()


def test_cancelling_the_stream_stops_the_model(server, tmp_path):
    """After k responses the client cancels; the model sees is_cancelled() before its next
    response or the one after (one response interval), far before the 1000 it was asked for."""
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        c.async_stream_infer("repeater", _inputs(1000, DELAY), request_id="long",
                             parameters={"marker": str(tmp_path)})
        received = []
        while len(received) < 3:
            result, error = results.get(timeout=30)
            assert error is None
            received.append(int(result.as_numpy("OUT")[0]))
    finally:
        c.stop_stream(cancel_requests=True)
        c.close()
    assert received == [0, 1, 2]
    stopped = int(_wait_for(tmp_path / "long.stopped"))
    last_sent = int((tmp_path / "long.sent").read_text())
    assert 3 <= stopped <= len(received) + 2
    assert last_sent == stopped - 1


def test_closing_the_stream_with_pending_requests_cancels_them(server, tmp_path):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for rid in ("x", "y"):
            c.async_stream_infer("repeater", _inputs(1000, DELAY), request_id=rid,
                                 parameters={"marker": str(tmp_path)})
        for _ in range(2):
            assert got.get(timeout=30)[1] is None
    finally:
        c.stop_stream(cancel_requests=True)
        c.close()
    for rid in ("x", "y"):
        assert int(_wait_for(tmp_path / f"{rid}.stopped")) < 10


def test_many_requests_on_one_stream_keep_their_order(server):
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(8):
            c.async_stream_infer("repeater", _inputs(5, 0.001), request_id=f"r{i}")
        seen: dict[str, list[int]] = {}
        while sum(len(v) for v in seen.values()) < 40:
            result, error = results.get(timeout=30)
            assert error is None
            seen.setdefault(result.get_response().id, []).append(int(result.as_numpy("OUT")[0]))
    finally:
        c.stop_stream()
        c.close()
    assert seen == {f"r{i}": [0, 1, 2, 3, 4] for i in range(8)}
