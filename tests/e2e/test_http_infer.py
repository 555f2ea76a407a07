"""HTTP inference end to end with tritonclient.http (sync and aio) and raw httpx requests."""

from __future__ import annotations

import gzip
import json
import struct

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from e2e.models import (
    CLASSIFY_CONFIG,
    DATATYPES,
    IDENTITY_PY,
    RAISES_CONFIG,
    RAISES_PY,
    SLOW_CONFIG,
    SLOW_PY,
    write_identity,
    write_model,
)
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("http-repo")
    for dt in DATATYPES:
        write_identity(repo, dt)
    write_model(repo, "slow", SLOW_CONFIG, SLOW_PY)
    write_model(repo, "raises", RAISES_CONFIG, RAISES_PY)
    folder = write_model(repo, "scores", CLASSIFY_CONFIG, IDENTITY_PY.replace("INPUT0", "INPUT0"))
    (folder / "labels.txt").write_text("cat\ndog\nbird\nfish\nfrog\n")
    s = start_server("--http-max-input-size=1048576", repo=repo)
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def sample(dt: str, shape=(2, 3)) -> np.ndarray:
    rng = np.random.default_rng(7)
    n = int(np.prod(shape))
    if dt == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if dt == "BYTES":
        return np.array([f"s{i}-é".encode() for i in range(n)], dtype=object).reshape(shape)
    if dt == "BF16":
        return rng.integers(0, 2**16, shape).astype(np.uint16)
    np_dt = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dt) or np.dtype(dt.lower())
    if dt.startswith("FP"):
        return (rng.standard_normal(shape) * 100).astype(np_dt)
    info = np.iinfo(np_dt)
    return rng.integers(info.min, info.max, shape, dtype=np_dt, endpoint=True)


CASES = [(dt, binary) for dt in DATATYPES for binary in (False, True) if binary or dt not in ("FP16", "BF16")]


@pytest.mark.parametrize("dt,binary", CASES, ids=[f"{d}-{'bin' if b else 'json'}" for d, b in CASES])
def test_every_datatype(client, dt, binary):
    """FP16 and BF16 travel only as binary data; the JSON refusal is tested below."""
    x = sample(dt)
    inp = httpclient.InferInput("INPUT0", list(x.shape), dt)
    if dt == "BF16":  # tritonclient takes BF16 as ml_dtypes.bfloat16 arrays
        import ml_dtypes

        inp.set_data_from_numpy(x.view(ml_dtypes.bfloat16), binary_data=True)
    else:
        inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(f"identity_{dt.lower()}", [inp], outputs=[out], request_id=f"id-{dt}")
    assert result.get_response()["id"] == f"id-{dt}"
    assert result.get_output("OUTPUT0")["datatype"] == dt
    got = result.as_numpy("OUTPUT0")
    if dt == "BF16":  # tritonclient decodes BF16 as ml_dtypes.bfloat16
        assert got.view(np.uint16).tolist() == x.tolist()
    elif dt == "BYTES":  # tritonclient gives JSON strings back as str, binary ones as bytes
        assert [[v if isinstance(v, bytes) else v.encode() for v in row] for row in got.tolist()] == x.tolist()
    else:
        np.testing.assert_array_equal(got, x)


def test_fp16_as_json_is_refused(server):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP16", "data": [1.0]}]}
    r = httpx.post(f"http://{server.http_url}/v2/models/identity_fp16/infer", json=body)
    assert r.status_code == 400 and "FP16" in r.json()["error"]


def test_classification_and_all_outputs(client):
    inputs = [httpclient.InferInput("INPUT0", [1, 5], "FP32")]
    inputs[0].set_data_from_numpy(np.array([[0.1, 0.9, 0.3, 0.7, 0.2]], np.float32))
    res = client.infer("scores", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert res.as_numpy("OUTPUT0").tolist() == [[b"0.900000:1:dog", b"0.700000:3:fish"]]
    res = client.infer("scores", inputs)
    assert res.as_numpy("OUTPUT0").shape == (1, 5)


def test_output_selection(server):
    ex = httpclient.InferenceServerClient(server.http_url)
    try:
        x = np.ones((1, 2), np.float32)
        inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(x)
        res = ex.infer("identity_fp32", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
        assert [o["name"] for o in res.get_response()["outputs"]] == ["OUTPUT0"]
        with pytest.raises(InferenceServerException, match="unexpected inference output"):
            ex.infer("identity_fp32", [inp], outputs=[httpclient.InferRequestedOutput("NOPE")])
    finally:
        ex.close()


def test_parameters_travel_to_the_model(client):
    inp = httpclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.array([1.0], np.float32))
    res = client.infer("raises", [inp], parameters={"color": "red", "n": 3, "flag": True})
    echoed = json.loads(res.get_response()["parameters"]["echo"])
    assert echoed == {"color": "red", "n": 3, "flag": True}


def test_model_errors_fail_only_their_request(client):
    inp = httpclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.array([-1.0], np.float32))
    with pytest.raises(InferenceServerException, match="negative input is not allowed") as e:
        client.infer("raises", [inp])
    assert e.value.status() == "500" or "500" in str(e.value.status())
    inp.set_data_from_numpy(np.array([0.0], np.float32))
    with pytest.raises(InferenceServerException, match="zero is refused"):
        client.infer("raises", [inp])
    inp.set_data_from_numpy(np.array([2.0], np.float32))
    assert client.infer("raises", [inp]).as_numpy("Y").tolist() == [2.0]


def _raw(server, path, **kw):
    return httpx.post(f"http://{server.http_url}{path}", timeout=30, **kw)


@pytest.mark.parametrize(
    "body,status,fragment",
    [
        (b"{not json", 400, "JSON"),
        (json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]}), 400, "data-type"),
        (json.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}), 400, "shape"),
        (json.dumps({"inputs": []}), 400, "missing required input"),
        (json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]},
                                {"name": "Z", "shape": [1], "datatype": "FP32", "data": [1]}]}), 400, "unexpected inference input"),
        (json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1, 2]}]}), 400, ""),
        (json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "NOPE", "data": [1]}]}), 400, ""),
    ],
)
def test_bad_requests(server, body, status, fragment):
    r = _raw(server, "/v2/models/raises/infer", content=body)
    assert r.status_code == status
    assert fragment in r.json()["error"]


def test_unknown_model_and_version(server):
    body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]})
    r = _raw(server, "/v2/models/nope/infer", content=body)
    assert r.status_code == 404 and "unknown model" in r.json()["error"]
    r = _raw(server, "/v2/models/raises/versions/9/infer", content=body)
    assert r.status_code == 404 and "version 9" in r.json()["error"]


def test_binary_header_length_errors(server):
    blob = np.array([1.0], np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    ok = _raw(server, "/v2/models/raises/infer", content=header + blob,
              headers={"Inference-Header-Content-Length": str(len(header))})
    assert ok.status_code == 200
    for bad in (str(len(header) + 100), "-3", "abc", str(len(header) - 2)):
        r = _raw(server, "/v2/models/raises/infer", content=header + blob,
                 headers={"Inference-Header-Content-Length": bad})
        assert r.status_code == 400, bad
        assert r.json()["error"]


def test_binary_output_and_raw_body(server):
    blob = np.array([3.0], np.float32).tobytes()
    r = _raw(server, "/v2/models/raises/infer", content=blob, headers={"Inference-Header-Content-Length": "0"})
    assert r.status_code == 200
    n = int(r.headers["Inference-Header-Content-Length"])
    header = json.loads(r.content[:n])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 4
    assert np.frombuffer(r.content[n:], np.float32).tolist() == [3.0]


def test_gzip_request_and_response(server):
    body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [5]}]}).encode()
    r = _raw(server, "/v2/models/raises/infer", content=gzip.compress(body),
             headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers.get("content-encoding") == "gzip"
    assert r.json()["outputs"][0]["data"] == [5.0]  # httpx decompressed it
    r = _raw(server, "/v2/models/raises/infer", content=body, headers={"Content-Encoding": "br"})
    assert r.status_code == 501


def test_compression_with_tritonclient(client):
    x = sample("FP32")
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    for algo in ("gzip", "deflate"):
        res = client.infer("identity_fp32", [inp], request_compression_algorithm=algo,
                           response_compression_algorithm=algo)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x)


def test_oversize_body_refused_before_reading(server):
    big = b"x" * (1024 * 1024 + 10)
    r = _raw(server, "/v2/models/raises/infer", content=big)
    assert r.status_code == 400 and "size" in r.json()["error"].lower()

    def chunks():
        for _ in range(20):
            yield b"y" * 65536
    r = _raw(server, "/v2/models/raises/infer", content=chunks())
    assert r.status_code == 400


def test_wrong_method_and_unknown_path(server):
    assert httpx.get(f"http://{server.http_url}/v2/models/raises/infer").status_code == 405
    assert httpx.get(f"http://{server.http_url}/v2/nothing/here").status_code == 404


def test_disconnect_cancels_request(server, client):
    import socket
    import time

    before = client.get_inference_statistics("slow")["model_stats"][0]["inference_stats"]
    body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [30]}]}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.3)
    sock.close()
    # the slow model polls is_cancelled(): it must be free again long before its 30 s
    inp = httpclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.array([0.0], np.float32))
    t0 = time.monotonic()
    client.infer("slow", [inp])
    assert time.monotonic() - t0 < 20
    after = client.get_inference_statistics("slow")["model_stats"][0]["inference_stats"]
    assert int(after["fail"]["count"]) == int(before["fail"]["count"]) + 1
    assert int(after["success"]["count"]) == int(before["success"]["count"]) + 1


def test_aio_client(server):
    import asyncio  # tritonclient.http.aio runs on asyncio (aiohttp); the server is trio

    asyncio.run(_aio_calls(server))


async def _aio_calls(server):
    c = aiohttpclient.InferenceServerClient(server.http_url)
    try:
        assert await c.is_server_live()
        x = sample("INT32")
        inp = aiohttpclient.InferInput("INPUT0", list(x.shape), "INT32")
        inp.set_data_from_numpy(x)
        res = await c.infer("identity_int32", [inp], request_id="aio")
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x)
        meta = await c.get_model_metadata("identity_int32")
        assert meta["inputs"][0]["datatype"] == "INT32"
    finally:
        await c.close()


def test_binary_bytes_wire_format(server):
    payload = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"c"))
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(payload)}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    r = _raw(server, "/v2/models/identity_bytes/infer", content=header + payload,
             headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200
    n = int(r.headers["Inference-Header-Content-Length"])
    assert r.content[n:] == payload
    assert np_to_triton_dtype(np.dtype(object)) == "BYTES"
