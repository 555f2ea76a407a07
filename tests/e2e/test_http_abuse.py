"""Abusive HTTP clients against the real server: large decodes, compression bombs, slow clients.

Every shape here is what one client can legally (or nearly) send; the checks are behaviour,
not timing: other clients are answered while a large body is decoded (the decode runs off the
event loop), slow heads and bodies get 408 after a short configured timeout, and a bad shape
is a 400 that names the fault. The shapes (for a benchmark to reproduce):

* JSON BYTES: ``{"inputs":[{"name":"IN","shape":[15000000],"datatype":"BYTES","data":["",...]}]}``
  (15M empty strings, ~43 MiB);
* JSON FP32: the same with ``"datatype":"FP32"`` and 12M ``1.5`` values (~46 MiB);
* gzip bomb: 256 MiB of zeros gzip-compressed (~250 KiB) under ``--http-max-input-size`` 128 MiB;
* slowloris head: ``GET /v2/health/live HTTP/1.1\\r\\nHost: x\\r\\nX-Slow: `` then one byte per 50 ms;
* stalled body: ``Content-Length: 1000`` and 10 bytes, then silence;
* a JSON shape of 10,000 dimensions.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator

import httpx
import pytest
from e2e.conftest import RunningServer, start_server
from e2e.models import write_model

COUNT_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([x.size], dtype=np.int64))]))
        return out
'''


def count_config(name: str, datatype: str) -> str:
    return f'''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: {datatype} dims: [ -1 ] }} ]
output [ {{ name: "N" data_type: TYPE_INT64 dims: [ 1 ] }} ]
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("abuse-repo")
    write_model(root, "count_bytes", count_config("count_bytes", "TYPE_STRING"), COUNT_PY)
    write_model(root, "count_fp32", count_config("count_fp32", "TYPE_FP32"), COUNT_PY)
    return root


@pytest.fixture(scope="module")
def server(repo) -> Iterator[RunningServer]:
    s = start_server("--http-server", "trident", "--allow-grpc=false", "--allow-metrics=false",
                     "--http-max-input-size", str(128 << 20), "--http-header-timeout-secs=0.5",
                     "--http-body-timeout-secs=0.5", repo=repo)
    yield s
    s.stop()


def json_body(datatype: str, element: bytes, n: int) -> bytes:
    head = b'{"inputs":[{"name":"IN","shape":[%d],"datatype":"%s","data":[' % (n, datatype.encode())
    return head + b",".join([element] * n) + b"]}]}"


def small_body() -> bytes:
    return json.dumps({"inputs": [{"name": "IN", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]}]}).encode()


def post_head(path: bytes, length: int, *extra: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % (path, length)
            + b"".join(e + b"\r\n" for e in extra) + b"\r\n")


def read_response(sock: socket.socket) -> bytes:
    """One whole response (content-length framed) from a blocking socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return head + b"\r\n\r\n" + body


def served_during(server: RunningServer, path: bytes, body: bytes, *extra: bytes,
                  settle: float = 0.2) -> tuple[bytes, int]:
    """Send one big request raw, then count small infer requests answered before its response.

    When the big decode ran on the event loop, nothing else was served until it ended.
    """
    big = socket.create_connection(("127.0.0.1", server.http_port), timeout=120)
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(read_response(big)))
    try:
        big.sendall(post_head(path, len(body), *extra) + body)
        reader.start()
        time.sleep(settle)  # the server has read the whole body by now and is decoding it
        served = 0
        small = small_body()
        with httpx.Client(base_url=f"http://{server.http_url}", timeout=120) as client:
            while reader.is_alive():
                r = client.post("/v2/models/count_fp32/infer", content=small)
                assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2]
                served += 1
        reader.join()
    finally:
        big.close()
    return result[0], served


@pytest.mark.parametrize(("model", "datatype", "element", "n"), [
    ("count_bytes", "BYTES", b'""', 15_000_000),
    ("count_fp32", "FP32", b"1.5", 12_000_000),
])
def test_a_large_json_body_does_not_stall_other_clients(server, model, datatype, element, n):
    response, served = served_during(server, b"/v2/models/%s/infer" % model.encode(), json_body(datatype, element, n))
    assert response.startswith(b"HTTP/1.1 200 ") and response.endswith(b'"data":[%d]}]}' % n)
    assert served >= 20, f"only {served} small requests were answered during the large decode"


def test_a_gzip_bomb_is_refused_at_the_input_limit_without_stalling_other_clients(server):
    c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(c.compress(zeros) for _ in range(256)) + c.flush()  # 256 MiB of zeros, ~250 KiB
    response, served = served_during(server, b"/v2/models/count_fp32/infer", bomb, b"Content-Encoding: gzip",
                                      settle=0)
    assert response.startswith(b"HTTP/1.1 400 ")
    assert b"exceeds the maximum input size of 134217728 bytes" in response
    assert served >= 5, f"only {served} small requests were answered during the decompression"


def test_a_slowloris_head_gets_408(server):
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        data = b""
        deadline = time.monotonic() + 20
        sock.settimeout(0.05)
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"a")
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), data


def test_a_silent_connection_is_closed(server):
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
        assert sock.recv(100) == b""


def test_a_stalled_body_gets_408_and_the_connection_closes(server):
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
        sock.sendall(post_head(b"/v2/models/count_fp32/infer", 1000) + b'{"inputs":')
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"connection: close" in data
    r = httpx.post(f"http://{server.http_url}/v2/models/count_fp32/infer", content=small_body())
    assert r.status_code == 200  # and the server carries on


def test_an_infer_body_in_many_slow_pieces_is_served_while_it_keeps_the_pace(server):
    """A body that arrives over more than the 0.5 s body timeout, in pieces each sooner than it
    and faster than MIN_BODY_RATE in all, is read whole and answered."""
    body = json_body("FP32", b"1.5", 60000)  # ~240 KB: 8 pieces of ~30 KB, one every 0.2 s
    step = len(body) // 8 + 1
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
        sock.sendall(post_head(b"/v2/models/count_fp32/infer", len(body)))
        for i in range(0, len(body), step):
            time.sleep(0.2)
            sock.sendall(body[i : i + step])
        data = read_response(sock)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"] == [60000]


def drip_until_answered(server: RunningServer, first: bytes) -> tuple[bytes, float]:
    """Send ``first`` (a request head and maybe the body's start), then a byte every 0.1 s until
    the server answers (at most 10 s): the answer and the seconds it took."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
        sock.sendall(first)
        start = time.monotonic()
        answered = b""
        while not answered and time.monotonic() - start < 10:
            time.sleep(0.1)
            try:
                sock.sendall(b" ")
                answered = sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:  # closed after the answer: read what it sent
                break
        elapsed = time.monotonic() - start
        sock.settimeout(5)
        data = answered
        while chunk := sock.recv(65536):
            data += chunk
    return data, elapsed


def test_an_infer_body_dripping_slower_than_the_minimum_rate_gets_408(server):
    """A byte every 0.1 s never pauses for the 0.5 s body timeout, but falls behind MIN_BODY_RATE."""
    data, elapsed = drip_until_answered(server, post_head(b"/v2/models/count_fp32/infer", 1000) + b"{")
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert elapsed < 5  # 0.5 s, plus about one second for the bytes that came


def test_a_large_body_begun_with_its_head_then_dripping_gets_408(server):
    """A body of 2 MiB (read straight into its place as it comes) whose first bytes came with
    the head, then a byte every 0.1 s: it never pauses for the body timeout, but falls behind
    MIN_BODY_RATE from its first wait."""
    data, elapsed = drip_until_answered(
        server, post_head(b"/v2/models/count_fp32/infer", 2 << 20) + b"{" + b" " * 1000)
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert elapsed < 5


def test_a_10000_dimension_shape_is_400_without_a_traceback(server):
    body = json.dumps({"inputs": [{"name": "IN", "shape": [1] * 10_000, "datatype": "FP32", "data": [1.0]}]})
    r = httpx.post(f"http://{server.http_url}/v2/models/count_fp32/infer", content=body)
    assert r.status_code == 400
    assert "10000 dimensions, at most 64 are supported" in r.json()["error"]
    assert "Traceback" not in server.log()


def test_at_the_connection_limit_new_clients_wait_for_a_free_slot(repo):
    s = start_server("--http-server", "trident", "--allow-grpc=false", "--allow-metrics=false",
                     "--http-max-connections=2", repo=repo)
    try:
        held = [socket.create_connection(("127.0.0.1", s.http_port), timeout=20) for _ in range(2)]
        live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        for sock in held:
            sock.sendall(live)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        waiting = socket.create_connection(("127.0.0.1", s.http_port), timeout=0.5)
        waiting.sendall(live)
        with pytest.raises(TimeoutError):
            waiting.recv(100)  # not accepted while two connections are open
        held[0].close()
        waiting.settimeout(20)
        assert read_response(waiting).startswith(b"HTTP/1.1 200 ")
        for sock in (held[1], waiting):
            sock.close()
    finally:
        s.stop()


def test_hypercorn_closes_a_stalled_body_after_its_read_timeout(repo):
    """hypercorn has one read timeout (the larger of the head and body timeouts); no 408."""
    s = start_server("--http-server", "hypercorn", "--allow-grpc=false", "--allow-metrics=false",
                     "--http-header-timeout-secs=1", "--http-body-timeout-secs=1", repo=repo)
    try:
        with socket.create_connection(("127.0.0.1", s.http_port), timeout=20) as sock:
            sock.sendall(post_head(b"/v2/models/count_fp32/infer", 1000) + b'{"inputs":')
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert b" 200 " not in data  # closed (hypercorn may answer nothing)
    finally:
        s.stop()
