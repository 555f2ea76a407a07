"""trident's HTTP/1.1 server answers ``POST .../infer`` without ASGI: the same answers as the ASGI app.

The fast path (``--http-server trident``, the default) and hypercorn (which serves the ASGI
app) get the same requests and must give the same status, content headers and body. The fast
path's own transport duties are driven with raw sockets: pipelining, malformed and oversize
requests, and disconnects that cancel queued and running inferences.
"""

from __future__ import annotations

import gzip
import json
import shutil
import signal
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e.conftest import RunningServer, pending, start_server
from e2e.models import RAISES_CONFIG, RAISES_PY, SLOW_ONE_INSTANCE_CONFIG, SLOW_PY, write_model
from tritonclient.http._utils import _get_inference_request

from trident.options import EXAMPLE_REPOSITORY

KEY = ("infer-key", "open-sesame")
LIMIT = 8192


# sleeps X[0] seconds (after touching its marker), then answers 1.2 MB of JSON: a large response
BIG_CONFIG = SLOW_ONE_INSTANCE_CONFIG.replace('"slow"', '"big"').replace(
    'name: "Y" data_type: TYPE_FP32 dims: [ 1 ]', 'name: "Y" data_type: TYPE_FP32 dims: [ -1 ]')
BIG_PY = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            marker = json.loads(r.parameters()).get("marker")
            if marker:
                open(marker, "w").close()
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            time.sleep(float(x.reshape(-1)[0]))
            y = np.full(300_000, x.reshape(-1)[0], dtype=np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fastpath") / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY, root, ignore=shutil.ignore_patterns("__pycache__"))
    write_model(root, "slow", SLOW_ONE_INSTANCE_CONFIG, SLOW_PY)
    write_model(root, "big", BIG_CONFIG, BIG_PY)
    write_model(root, "raises", RAISES_CONFIG, RAISES_PY)
    return root


def _start(layer: str, repo: Path) -> RunningServer:
    return start_server("--http-server", layer, "--allow-grpc=false",
                        "--http-max-input-size", str(LIMIT), "--http-restricted-api",
                        f"inference:{KEY[0]}={KEY[1]}", repo=repo)


@pytest.fixture(scope="module")
def fast(repo) -> Iterator[RunningServer]:
    s = _start("trident", repo)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def asgi(repo) -> Iterator[RunningServer]:
    s = _start("hypercorn", repo)
    yield s
    s.stop()


def add_sub_json(**extra) -> bytes:
    a = [float(i) for i in range(16)]
    doc = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a},
                      {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}], **extra}
    return json.dumps(doc).encode()


def add_sub_binary(binary_outputs: bool) -> tuple[bytes, int]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        item = httpclient.InferInput(name, [1, 16], "FP32")
        item.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16), binary_data=True)
        inputs.append(item)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_outputs),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    body, length = _get_inference_request(inputs, "req-7", outputs, 0, False, False, 0, None, None)
    return body, length


def x_json(value: float, **params) -> bytes:
    doc = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [value]}]}
    if params:
        doc["parameters"] = params
    return json.dumps(doc).encode()


AUTH = {KEY[0]: KEY[1]}
BINARY, BINARY_LENGTH = add_sub_binary(True)
JSON_OUT, JSON_OUT_LENGTH = add_sub_binary(False)
BODY = add_sub_json()

# (name, path, headers, body): every infer case the ASGI tests cover, sent to both layers
CASES = [
    ("json", "/v2/models/add_sub/infer", {}, BODY),
    ("versioned", "/v2/models/add_sub/versions/1/infer", {}, BODY),
    ("query and escapes", "/v2/models/add%5Fsub/infer?x=1", {}, BODY),
    ("request id and parameters", "/v2/models/add_sub/infer", {}, add_sub_json(id="abc", parameters={"p": 1})),
    ("binary in and out", "/v2/models/add_sub/infer",
     {"Inference-Header-Content-Length": str(BINARY_LENGTH)}, BINARY),
    ("binary in, json out", "/v2/models/add_sub/infer",
     {"Inference-Header-Content-Length": str(JSON_OUT_LENGTH)}, JSON_OUT),
    ("binary_data_output", "/v2/models/add_sub/infer", {}, add_sub_json(parameters={"binary_data_output": True})),
    ("classification", "/v2/models/add_sub/infer", {}, add_sub_json(
        outputs=[{"name": "OUTPUT0", "parameters": {"classification": 3}}])),
    ("raw body", "/v2/models/identity_fp32/infer", {"Inference-Header-Content-Length": "0"},
     np.arange(4, dtype=np.float32).tobytes()),
    ("raw body, two inputs", "/v2/models/add_sub/infer", {"Inference-Header-Content-Length": "0"}, b"\0" * 64),
    ("bytes", "/v2/models/bytes_echo/infer", {}, json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES", "data": ["ab", "c"]}]}).encode()),
    ("gzip in and out", "/v2/models/add_sub/infer", {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"},
     gzip.compress(BODY, mtime=0)),
    ("deflate in and out", "/v2/models/add_sub/infer", {"Content-Encoding": "deflate", "Accept-Encoding": "deflate"},
     zlib.compress(BODY)),
    ("unknown coding", "/v2/models/add_sub/infer", {"Content-Encoding": "br"}, BODY),
    ("identity accepted", "/v2/models/add_sub/infer", {"Accept-Encoding": "identity"}, BODY),
    ("gzip refused by q=0", "/v2/models/add_sub/infer", {"Accept-Encoding": "gzip;q=0, identity"}, BODY),
    ("only unknown codings accepted", "/v2/models/add_sub/infer", {"Accept-Encoding": "br, zstd"}, BODY),
    ("corrupt gzip", "/v2/models/add_sub/infer", {"Content-Encoding": "gzip"}, b"\x1f\x8bnot gzip"),
    ("gzip over the limit", "/v2/models/add_sub/infer", {"Content-Encoding": "gzip"},
     gzip.compress(b" " * (LIMIT * 4), mtime=0)),
    ("bad json", "/v2/models/add_sub/infer", {}, b"{oops"),
    ("empty body", "/v2/models/add_sub/infer", {}, b""),
    ("json array", "/v2/models/add_sub/infer", {}, b"[1, 2]"),
    ("bad header length", "/v2/models/add_sub/infer", {"Inference-Header-Content-Length": "x"}, BODY),
    ("header length too long", "/v2/models/add_sub/infer", {"Inference-Header-Content-Length": "99999"}, BODY),
    ("unknown model", "/v2/models/nope/infer", {}, BODY),
    ("unknown version", "/v2/models/add_sub/versions/7/infer", {}, BODY),
    ("wrong input", "/v2/models/identity_fp32/infer", {}, json.dumps({"inputs": [
        {"name": "WRONG", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode()),
    ("shape mismatch", "/v2/models/identity_fp32/infer", {}, json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1]}]}).encode()),
    ("model raises", "/v2/models/raises/infer", {}, x_json(-1.0)),
    ("model error response", "/v2/models/raises/infer", {}, x_json(0.0)),
    ("model parameters", "/v2/models/raises/infer", {}, x_json(3.0, echo="yes")),
    ("over the size limit", "/v2/models/add_sub/infer", {}, b" " * (LIMIT + 1)),
]
CONTENT_HEADERS = ("content-type", "content-length", "inference-header-content-length", "content-encoding")


def answer(server: RunningServer, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        r = client.request(method, path, headers=headers, content=body)
    return r.status_code, {k: r.headers.get(k) for k in CONTENT_HEADERS}, r.content


@pytest.mark.parametrize(("name", "path", "headers", "body"), CASES, ids=[c[0] for c in CASES])
def test_the_fast_path_answers_as_the_asgi_app(fast, asgi, name, path, headers, body):
    got = answer(fast, "POST", path, {**AUTH, **headers}, body)
    expected = answer(asgi, "POST", path, {**AUTH, **headers}, body)
    assert got == expected
    assert b"internal server error" not in got[2], got  # no unexpected exception on either path


def test_a_binary_answer_to_an_identity_only_client_is_plain(fast, asgi):
    """aiohttp (tritonclient.http.aio) clients often send ``Accept-Encoding: identity``: a binary
    answer is sent as it is (no Content-Encoding), the same on both layers."""
    data = np.arange(LIMIT // 8, dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [data.size], "datatype": "FP32",
                                     "parameters": {"binary_data_size": data.nbytes}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    headers = {**AUTH, "Inference-Header-Content-Length": str(len(header)), "Accept-Encoding": "identity"}
    for server in (fast, asgi):
        status, got, body = answer(server, "POST", "/v2/models/identity_fp32/infer", headers, header + data.tobytes())
        assert status == 200 and got["content-encoding"] is None
        json_length = int(got["inference-header-content-length"])
        assert np.array_equal(np.frombuffer(body[json_length:], dtype=np.float32), data)


def test_restricted_and_method_errors_match(fast, asgi):
    for method, headers in (("POST", {}), ("POST", {KEY[0]: "wrong"}), ("GET", AUTH), ("PUT", {})):
        got = answer(fast, method, "/v2/models/add_sub/infer", headers, BODY)
        assert got == answer(asgi, method, "/v2/models/add_sub/infer", headers, BODY)
        assert got[0] in (403, 405)


def test_a_chunked_body_over_the_limit_is_refused_on_both(fast, asgi):
    def pieces() -> Iterator[bytes]:
        for _ in range(4):
            yield b" " * (LIMIT // 2)

    for server in (fast, asgi):
        with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
            r = client.post("/v2/models/add_sub/infer", headers=AUTH, content=pieces())
        assert r.status_code == 400 and "exceeds the maximum HTTP input size" in r.json()["error"]


# ---- the fast path's transport: raw sockets ----------------------------------------------------


def post(path: bytes, body: bytes, *extra: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\n%s: %s\r\nContent-Length: %d\r\n" % (
        path, KEY[0].encode(), KEY[1].encode(), len(body)) + b"".join(e + b"\r\n" for e in extra) + b"\r\n" + body)


class Reader:
    """Reads content-length framed responses off a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""

    def response(self) -> tuple[int, dict[bytes, bytes], bytes]:
        while b"\r\n\r\n" not in self.data:
            chunk = self.sock.recv(65536)
            assert chunk, self.data
            self.data += chunk
        head, _, rest = self.data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        length = int(headers[b"content-length"])
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            assert chunk
            rest += chunk
        self.data = rest[length:]
        return int(lines[0].split()[1]), headers, rest[:length]

    def eof(self) -> bool:
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return True
            self.data += chunk


def test_pipelined_requests_are_answered_in_order(fast):
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as sock:
        sock.sendall(post(b"/v2/models/add_sub/infer", add_sub_json(id="one"))
                     + post(b"/v2/models/add_sub/infer", b"{oops")
                     + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                     + post(b"/v2/models/add_sub/infer", b"\0" * 64, b"Inference-Header-Content-Length: 0")
                     + post(b"/v2/models/add_sub/infer", add_sub_json(id="three")))
        reader = Reader(sock)
        answers = [reader.response() for _ in range(5)]
        assert [a[0] for a in answers] == [200, 400, 200, 400, 200]
        assert json.loads(answers[0][2])["id"] == "one" and json.loads(answers[4][2])["id"] == "three"
        assert "failed to parse the request JSON buffer" in json.loads(answers[1][2])["error"]
        assert all(b"connection" not in a[1] for a in answers)  # kept alive throughout
        sock.sendall(post(b"/v2/models/add_sub/infer", BODY))  # and still usable
        assert reader.response()[0] == 200


def test_an_oversize_body_is_refused_from_its_content_length(fast):
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as sock:
        sock.sendall(post(b"/v2/models/add_sub/infer", b"").replace(
            b"Content-Length: 0", b"Content-Length: %d" % (100 * LIMIT)))  # the body never comes: no wait for it
        status, headers, body = Reader(sock).response()
    assert status == 400 and headers[b"connection"] == b"close"
    assert "--http-max-input-size" in json.loads(body)["error"]


def test_a_small_oversize_body_is_skipped_and_the_connection_kept(fast):
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as sock:
        reader = Reader(sock)
        sock.sendall(post(b"/v2/models/add_sub/infer", b" " * (LIMIT + 10)))
        status, headers, _ = reader.response()
        assert status == 400 and b"connection" not in headers
        sock.sendall(post(b"/v2/models/add_sub/infer", BODY))
        assert reader.response()[0] == 200


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
    (b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
])
def test_malformed_framing_gets_an_error_and_close(fast, request_bytes, status):
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as sock:
        sock.sendall(request_bytes.replace(b"Host: x\r\n", b"Host: x\r\ninfer-key: open-sesame\r\n"))
        reader = Reader(sock)
        got, headers, _ = reader.response()
        assert got == status and headers[b"connection"] == b"close"
        assert reader.eof()


def test_a_truncated_body_then_close_leaves_the_server_serving(fast):
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as sock:
            sock.sendall(post(b"/v2/models/add_sub/infer", BODY)[:-10])
    with httpx.Client(base_url=f"http://{fast.http_url}", timeout=30) as client:
        assert client.post("/v2/models/add_sub/infer", headers=AUTH, content=BODY).status_code == 200


def test_http10_infer_closes_unless_kept_alive(fast):
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as sock:
        sock.sendall(post(b"/v2/models/add_sub/infer", BODY).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        reader = Reader(sock)
        status, headers, _ = reader.response()
        assert status == 200 and headers[b"connection"] == b"close" and reader.eof()
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as sock:
        request = post(b"/v2/models/add_sub/infer", BODY, b"Connection: keep-alive").replace(b"HTTP/1.1", b"HTTP/1.0", 1)
        sock.sendall(request + request)
        reader = Reader(sock)
        for _ in range(2):
            status, headers, _ = reader.response()
            assert status == 200 and headers[b"connection"] == b"keep-alive"


def slow_stats(server: RunningServer) -> dict:
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as client:
        return client.get("/v2/models/slow/stats").json()["model_stats"][0]["inference_stats"]


def wait_until(condition: Callable[[], bool], what: str = "the condition", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} never held"
        time.sleep(0.02)


def wait_for(path: Path) -> None:
    wait_until(path.exists, f"{path} exists")


def test_a_disconnect_cancels_a_running_and_a_queued_request(fast, tmp_path):
    before = slow_stats(fast)
    running, queued = tmp_path / "running", tmp_path / "queued"
    first = socket.create_connection(("127.0.0.1", fast.http_port), timeout=60)
    first.sendall(post(b"/v2/models/slow/infer", x_json(60.0, marker=str(running))))
    wait_for(running)  # it occupies the only instance
    second = socket.create_connection(("127.0.0.1", fast.http_port), timeout=60)
    second.sendall(post(b"/v2/models/slow/infer", x_json(60.0, marker=str(queued))))
    time.sleep(0.3)  # queued behind the first; the watcher is reading its socket by now
    second.close()
    first.close()  # the model polls is_cancelled(): it stops long before its 60 s
    deadline = time.monotonic() + 30
    while int(slow_stats(fast)["fail"]["count"]) < int(before["fail"]["count"]) + 2:
        assert time.monotonic() < deadline, slow_stats(fast)
        time.sleep(0.05)
    after = slow_stats(fast)
    assert int(after["success"]["count"]) == int(before["success"]["count"])
    assert not queued.exists()  # dropped from the queue, never executed
    with httpx.Client(base_url=f"http://{fast.http_url}", timeout=30) as client:  # the instance is free again
        r = client.post("/v2/models/slow/infer", headers=AUTH, content=x_json(0.0))
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [0.0]


def test_a_pipelined_request_behind_a_long_one_is_answered(fast, tmp_path):
    """The watcher reads ahead while the first request runs; the bytes it reads are not lost."""
    marker = tmp_path / "started"
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=60) as sock:
        sock.sendall(post(b"/v2/models/slow/infer", x_json(0.5, marker=str(marker))))
        wait_for(marker)
        time.sleep(0.1)  # the watcher is reading the socket now
        sock.sendall(post(b"/v2/models/add_sub/infer", add_sub_json(id="after")))
        reader = Reader(sock)
        status, _, body = reader.response()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [0.5]
        status, _, body = reader.response()
        assert status == 200 and json.loads(body)["id"] == "after"


def test_a_request_pipelined_behind_a_queued_one_is_answered_after_it(fast, tmp_path):
    """A request waits in the model's queue behind another connection's; one its client
    pipelines meanwhile is answered after it, on the same kept-alive connection."""
    running = tmp_path / "running"
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=60) as first, \
            socket.create_connection(("127.0.0.1", fast.http_port), timeout=60) as second:
        first.sendall(post(b"/v2/models/slow/infer", x_json(0.4, marker=str(running))))
        wait_for(running)  # it occupies the only instance
        second.sendall(post(b"/v2/models/slow/infer", x_json(0.25)))
        wait_until(lambda: pending(fast, "slow") == 1)  # queued behind the first
        second.sendall(post(b"/v2/models/add_sub/infer", add_sub_json(id="after")))
        reader = Reader(second)
        status, headers, body = reader.response()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [0.25]
        assert b"connection" not in headers
        status, _, body = reader.response()
        assert status == 200 and json.loads(body)["id"] == "after"
        status, _, body = Reader(first).response()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [0.4]


def test_a_queued_request_answered_later_keeps_its_binary_output_and_http_version(fast, tmp_path):
    """A queued request is answered by the task that runs its batch, not its connection's:
    the answer still has the binary output it asked for, and an HTTP/1.0 keep-alive request's
    answer says keep-alive; its connection serves the next request after it."""
    running = tmp_path / "running"
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=60) as first, \
            socket.create_connection(("127.0.0.1", fast.http_port), timeout=60) as second:
        first.sendall(post(b"/v2/models/slow/infer", x_json(0.4, marker=str(running))))
        wait_for(running)
        queued = post(b"/v2/models/slow/infer", x_json(0.25, binary_data_output=True), b"Connection: keep-alive")
        second.sendall(queued.replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        wait_until(lambda: pending(fast, "slow") == 1)
        reader = Reader(second)
        status, headers, body = reader.response()
        assert status == 200 and headers[b"connection"] == b"keep-alive"
        length = int(headers[b"inference-header-content-length"])
        output = json.loads(body[:length])["outputs"][0]
        assert output["parameters"]["binary_data_size"] == 4
        assert np.frombuffer(body[length:], dtype=np.float32).tolist() == [0.25]
        second.sendall(post(b"/v2/models/add_sub/infer", add_sub_json(id="next")).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        status, _, body = reader.response()
        assert status == 200 and json.loads(body)["id"] == "next"
        status, _, body = Reader(first).response()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [0.4]


def test_a_large_answer_to_a_queued_request_goes_out_whole_before_the_next(fast, tmp_path):
    running = tmp_path / "big-running"
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=60) as first, \
            socket.create_connection(("127.0.0.1", fast.http_port), timeout=60) as second:
        first.sendall(post(b"/v2/models/big/infer", x_json(0.3, marker=str(running))))
        wait_for(running)
        second.sendall(post(b"/v2/models/big/infer", x_json(0.0)))  # its JSON answer is encoded off the loop
        wait_until(lambda: pending(fast, "big") == 1)
        second.sendall(post(b"/v2/models/add_sub/infer", add_sub_json(id="after")) + post(b"/v2/models/big/infer", b"{"))
        reader = Reader(second)
        status, _, body = reader.response()
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [0.0] * 300_000
        status, _, body = reader.response()
        assert status == 200 and json.loads(body)["id"] == "after"
        status, _, body = reader.response()
        assert status == 400 and "failed to parse the request JSON buffer" in json.loads(body)["error"]
        status, _, body = Reader(first).response()
        assert status == 200 and len(json.loads(body)["outputs"][0]["data"]) == 300_000


def test_shutdown_answers_a_queued_request_then_closes_its_connection(repo, tmp_path):
    """The drain lets the queued request run; its answer goes out, then the connection closes."""
    server = _start("trident", repo)
    running = tmp_path / "running"
    try:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as first, \
                socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as second:
            first.sendall(post(b"/v2/models/slow/infer", x_json(0.5, marker=str(running))))
            wait_for(running)
            second.sendall(post(b"/v2/models/slow/infer", x_json(0.1)))
            wait_until(lambda: pending(server, "slow") == 1)  # queued before the shutdown starts
            server.proc.send_signal(signal.SIGTERM)
            for sock, value in ((first, 0.5), (second, 0.1)):
                reader = Reader(sock)
                status, _, body = reader.response()
                assert status == 200 and json.loads(body)["outputs"][0]["data"] == [value]
                assert reader.eof()  # then closed, as an idle connection at shutdown
        assert server.proc.wait(timeout=30) == 0
    finally:
        server.stop()


def test_many_connections_at_once_each_get_their_own_answers_in_order(fast):
    """Requests of many connections arriving together: their responses are kept for the end of
    the server's loop round and written together; each connection still gets its own answers,
    in order, with an ASGI route and an error between them."""
    socks = [socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) for _ in range(24)]
    try:
        for i, sock in enumerate(socks):
            sock.sendall(post(b"/v2/models/add_sub/infer", add_sub_json(id=f"{i}-a"))
                         + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                         + post(b"/v2/models/add_sub/infer", b"{oops")
                         + post(b"/v2/models/add_sub/infer", add_sub_json(id=f"{i}-b")))
        for i, sock in enumerate(socks):
            reader = Reader(sock)
            answers = [reader.response() for _ in range(4)]
            assert [a[0] for a in answers] == [200, 200, 400, 200]
            assert json.loads(answers[0][2])["id"] == f"{i}-a" and json.loads(answers[3][2])["id"] == f"{i}-b"
            assert json.loads(answers[0][2])["outputs"][0]["data"] == [float(v) + 2.0 for v in range(16)]
    finally:
        for sock in socks:
            sock.close()


def test_concurrent_aio_clients_get_their_own_results(fast):
    import asyncio  # tritonclient.http.aio runs on asyncio (aiohttp); the server is trio

    import tritonclient.http.aio as aioclient

    async def calls() -> None:
        client = aioclient.InferenceServerClient(f"127.0.0.1:{fast.http_port}", conn_limit=32)
        try:
            async def one(i: int) -> None:
                x = np.full(16, i, np.float32)
                inp = aioclient.InferInput("INPUT0", [16], "FP32")
                inp.set_data_from_numpy(x, binary_data=i % 2 == 0)
                result = await client.infer("identity_fp32", [inp], request_id=str(i),
                                            headers={KEY[0]: KEY[1]})
                assert result.get_response()["id"] == str(i)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)

            await asyncio.gather(*(one(i) for i in range(256)))
        finally:
            await client.close()

    asyncio.run(calls())
