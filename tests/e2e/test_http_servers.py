"""Smoke tests of both HTTP serving layers (``--http-server hypercorn|trident``) with real clients.

The full HTTP suites run against the default layer (or the one named by
``TRIDENT_E2E_HTTP_SERVER``); this module checks the transport-level behaviour of each layer:
tritonclient, curl with ``Expect: 100-continue``, a chunked request body, pipelining, and a
client disconnect cancelling a running request.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e.conftest import start_server
from e2e.models import SLOW_CONFIG, SLOW_PY, write_identity, write_model


@pytest.fixture(scope="module", params=["hypercorn", "trident"])
def server(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp(f"servers-{request.param}")
    write_identity(repo, "FP32")
    write_model(repo, "slow", SLOW_CONFIG, SLOW_PY)
    s = start_server("--http-server", request.param, "--allow-grpc=false", "--allow-metrics=false", repo=repo)
    s.layer = request.param  # type: ignore[attr-defined]
    yield s
    s.stop()


def identity_body(values: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, len(values)], "datatype": "FP32",
                                   "data": values}]}).encode()


def test_tritonclient_json_and_binary(server):
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for binary in (False, True):
        inp = httpclient.InferInput("INPUT0", [3, 4], "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
        np.testing.assert_array_equal(client.infer("identity_fp32", [inp], outputs=[out]).as_numpy("OUTPUT0"), x)
    client.close()


def test_curl_expect_100_continue(server, tmp_path):
    values = [float(i) for i in range(400)]  # a body of a few KiB
    body = tmp_path / "body.json"
    body.write_bytes(identity_body(values))
    out = subprocess.run(
        ["curl", "-sv", "--max-time", "30", "-H", "Expect: 100-continue", "-H", "Content-Type: application/json",
         "--data-binary", f"@{body}", f"http://{server.http_url}/v2/models/identity_fp32/infer"],
        capture_output=True, text=True, check=True)
    if server.layer == "trident":  # hypercorn 0.18 never answers it: curl waits 1 s, then sends
        assert "HTTP/1.1 100 Continue" in out.stderr
    assert "HTTP/1.1 200" in out.stderr
    assert json.loads(out.stdout)["outputs"][0]["data"] == values


def test_chunked_request_body(server):
    body = identity_body([1.0, 2.0, 3.0])

    def pieces():
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    r = httpx.post(f"http://{server.http_url}/v2/models/identity_fp32/infer", content=pieces())
    assert r.status_code == 200
    assert r.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_pipelined_requests(server):
    body = identity_body([5.0])
    request = (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
               % len(body) + body)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" + request + request)
        data = b""
        while data.count(b"HTTP/1.1 200") < 3 or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert data.count(b'"data":[5.0]') == 2


def test_disconnect_cancels_a_running_request(server, tmp_path):
    client = httpclient.InferenceServerClient(server.http_url)
    before = client.get_inference_statistics("slow")["model_stats"][0]["inference_stats"]["fail"]["count"]
    marker = tmp_path / "started"
    body = json.dumps({"parameters": {"marker": str(marker)},
                       "inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [60]}]}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    for _ in range(600):
        if marker.exists():
            break
        time.sleep(0.05)
    assert marker.exists()
    sock.close()
    fail = before
    for _ in range(600):  # the model polls is_cancelled(): it stops long before its 60 s
        fail = client.get_inference_statistics("slow")["model_stats"][0]["inference_stats"]["fail"]["count"]
        if int(fail) > int(before):
            break
        time.sleep(0.05)
    assert int(fail) == int(before) + 1
    client.close()
