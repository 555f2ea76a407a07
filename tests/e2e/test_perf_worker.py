"""The load-generator worker process over its pipe protocol, against a real trident: the
one-connection HTTP loop (blocking reads, no epoll) keeps answering pause and stop, reports
records and CPU, and turns a failed answer or a closed connection into the worker's error.
The closing peer is a plain socket server that answers twice and hangs up its side."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from tests.e2e.conftest import RunningServer, start_server
from trident.perf.engine import _Workers
from trident.perf.measure import RECORD_FIELDS
from trident.perf.wire import Tensor, http_infer_request
from trident.perf.worker import WorkerSpec


@pytest.fixture(scope="module")
def server():
    s = start_server()
    yield s
    s.stop()


def _request(url: str, name: str = "INPUT0") -> bytes:
    x = np.arange(16, dtype=np.float32)
    return http_infer_request(url, "identity_fp32", "", [Tensor(name, "FP32", (16,), x.tobytes())], ["OUTPUT0"])


def _collect(workers: _Workers, seconds: float) -> tuple[np.ndarray, float, list[tuple]]:  # type: ignore[type-arg]
    chunks, cpu, messages = [], 0.0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _i, msg in workers.poll(0.05):
            messages.append(msg)
            if msg[1]:
                chunks.append(np.frombuffer(msg[1], np.int64).reshape(-1, RECORD_FIELDS))
            cpu += msg[2]
    records = np.concatenate(chunks) if chunks else np.zeros((0, RECORD_FIELDS), np.int64)
    return records, cpu, messages


def _spec(url: str, request: bytes) -> WorkerSpec:
    host, port = url.rsplit(":", 1)
    return WorkerSpec("http", host, int(port), (request,))


def _one_connection(url: str, request: bytes, seconds: float) -> tuple[np.ndarray, list[tuple]]:  # type: ignore[type-arg]
    """A worker at concurrency 1 for ``seconds``: its records and messages (then stopped)."""
    workers = _Workers(_spec(url, request))
    try:
        workers.grow(1)
        workers.send_all([("concurrency", 1)])
        records, _, messages = _collect(workers, seconds)
    finally:
        workers.close()
    return records, messages


def test_one_connection_loop_measures_pauses_resumes_and_stops(server: RunningServer):
    workers = _Workers(_spec(server.http_url, _request(server.http_url)))
    try:
        workers.grow(1)
        workers.send_all([("concurrency", 1)])
        records, cpu, messages = _collect(workers, 0.6)
        assert len(records) > 20 and (records[:, 4] == 1).all() and cpu > 0
        assert all(not m[5] for m in messages)
        start, sent, first, end = (records[:, i] for i in range(4))
        assert (start <= sent).all() and (sent <= first).all() and (first <= end).all()
        assert (start[1:] >= end[:-1]).all()  # one request at a time
        workers.send_all([("pause",)])
        _, _, messages = _collect(workers, 0.3)
        assert [m[0] for m in messages].count("paused") == 1
        assert not _collect(workers, 0.2)[0].size  # nothing runs while paused
        workers.send_all([("concurrency", 1)])  # and it starts again
        assert len(_collect(workers, 0.3)[0]) > 10
    finally:
        workers.close()
    assert all(not p.is_alive() for p in workers.procs)


def test_one_connection_loop_reports_a_failed_answer(server: RunningServer):
    records, messages = _one_connection(server.http_url, _request(server.http_url, name="NO_SUCH_INPUT"), 0.3)
    errors = [m[5] for m in messages if m[5]]
    assert errors and errors[0].startswith("HTTP 400") and "NO_SUCH_INPUT" in errors[0]
    assert (records[:, 4] == 0).any()


def test_one_connection_loop_reports_a_server_that_hangs_up():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for _ in range(2):
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(answer)
            # hang up the sending side only and keep reading, so the worker's next request is
            # written and its answer is what never comes (an EOF, not a failed write)
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(5)
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"127.0.0.1:{port}"
    try:
        records, messages = _one_connection(url, _request(url), 0.5)
    finally:
        listener.close()
    thread.join(5)
    assert int((records[:, 4] == 1).sum()) == 2
    assert any("the server closed the connection" in m[5] for m in messages)
