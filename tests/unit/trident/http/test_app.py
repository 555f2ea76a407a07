"""The ASGI application, driven with raw ASGI messages against the real Server."""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request

from trident.http.app import make_app
from trident.options import EXAMPLE_REPOSITORY, ServerOptions
from trident.server import Server, open_server

MAX_INPUT = 1 << 20

SLOW_MODEL = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.5)
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
"""

SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    received: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


class ASGIDriver:
    """Calls the app as an ASGI server would, one request at a time."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        chunks: list[bytes] | None = None,
        disconnect: trio.Event | None = None,
        body_done: trio.Event | None = None,
    ) -> Reply:
        pending = [
            {"type": "http.request", "body": c, "more_body": True}
            for c in (chunks if chunks is not None else [body])
        ]
        pending.append({"type": "http.request", "body": b"", "more_body": False})
        sent: list[dict[str, Any]] = []
        calls = 0
        gone = disconnect if disconnect is not None else trio.Event()

        async def receive() -> dict[str, Any]:
            # like hypercorn: the body, then http.disconnect once the client goes away or the
            # response is complete (ASGI delivers it to a pending receive after the response)
            nonlocal calls
            calls += 1
            if pending:
                return pending.pop(0)
            if body_done is not None:
                body_done.set()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                gone.set()

        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        }
        await self.app(scope, receive, send)
        if not sent:
            return Reply(0, {}, b"", calls, sent)
        start = sent[0]
        assert start["type"] == "http.response.start"
        head = {k.decode(): v.decode() for k, v in start["headers"]}
        data = b"".join(bytes(m.get("body", b"")) for m in sent[1:])
        assert int(head["content-length"]) == len(data)
        assert not sent[-1].get("more_body", False)
        return Reply(start["status"], head, data, calls, sent)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    shutil.copytree(EXAMPLE_REPOSITORY, repo)
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    return repo


@pytest.fixture
async def server(repository: Path) -> AsyncIterator[Server]:
    options = ServerOptions(
        model_repositories=[str(repository)],
        model_control_mode="explicit",
        load_models=["add_sub", "identity_fp32", "bytes_echo", "slow"],
        http_max_input_size=MAX_INPUT,
        exit_timeout_secs=5,
    )
    async with open_server(options) as server:
        yield server


@pytest.fixture
def client(server: Server) -> ASGIDriver:
    return ASGIDriver(make_app(server))


def add_sub_body(binary: bool, **kwargs: Any) -> tuple[bytes, int | None, np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.0, dtype=np.float32)
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        item = httpclient.InferInput(name, [1, 16], "FP32")
        item.set_data_from_numpy(value, binary_data=binary)
        inputs.append(item)
    outputs = kwargs.pop("outputs", None)
    body, length = _get_inference_request(
        inputs, kwargs.pop("request_id", ""), outputs, 0, False, False, 0, None, None
    )
    return body, length, a, b


def parse(reply: Reply) -> httpclient.InferResult:
    length = reply.headers.get("inference-header-content-length")
    encoding = reply.headers.get("content-encoding")
    return httpclient.InferResult.from_response_body(
        reply.body, header_length=int(length) if length else None, content_encoding=encoding
    )


# ---- health and metadata ------------------------------------------------------------------------


async def test_health(client: ASGIDriver) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        reply = await client.request("GET", path)
        assert (reply.status, reply.body) == (200, b"")
        reply = await client.request("POST", path)
        assert reply.status == 405 and reply.json() == {"error": "Method Not Allowed"}


async def test_server_and_model_metadata(client: ASGIDriver) -> None:
    meta = (await client.request("GET", "/v2")).json()
    assert meta["name"] == "triton" and "binary_tensor_data" in meta["extensions"]
    model = (await client.request("GET", "/v2/models/add_sub")).json()
    assert model["name"] == "add_sub" and model["inputs"][0] == {
        "name": "INPUT0",
        "datatype": "FP32",
        "shape": [-1, 16],
    }
    versioned = await client.request("GET", "/v2/models/add_sub/versions/1")
    assert versioned.status == 200 and versioned.json()["versions"] == ["1"]
    missing = await client.request("GET", "/v2/models/nope")
    assert missing.status in (400, 404) and "nope" in missing.json()["error"]
    assert (await client.request("POST", "/v2/models/add_sub")).status == 405


async def test_model_ready(client: ASGIDriver) -> None:
    assert (await client.request("GET", "/v2/models/add_sub/ready")).status == 200
    assert (await client.request("GET", "/v2/models/add_sub/versions/1/ready")).status == 200
    reply = await client.request("GET", "/v2/models/add_sub/versions/7/ready")
    assert reply.status == 400 and reply.json() == {"error": "Model version not ready"}
    assert (await client.request("GET", "/v2/models/nope/ready")).status == 400


async def test_model_config(client: ASGIDriver) -> None:
    reply = await client.request("GET", "/v2/models/add_sub/config")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    config = reply.json()
    assert config["name"] == "add_sub" and config["max_batch_size"] == 8
    assert (await client.request("GET", "/v2/models/nope/config")).status in (400, 404)


# ---- inference ------------------------------------------------------------------------------------


async def test_infer_json(client: ASGIDriver) -> None:
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("OUTPUT0", "OUTPUT1")]
    body, length, a, b = add_sub_body(False, request_id="r1", outputs=outputs)
    assert length is None
    reply = await client.request("POST", "/v2/models/add_sub/infer", body)
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    doc = reply.json()
    assert doc["id"] == "r1" and doc["model_name"] == "add_sub" and doc["model_version"] == "1"
    result = parse(reply)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


async def test_infer_binary_and_output_selection(client: ASGIDriver) -> None:
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    body, length, a, b = add_sub_body(True, outputs=outputs)
    assert length is not None
    reply = await client.request(
        "POST", "/v2/models/add_sub/infer", body, {"Inference-Header-Content-Length": str(length)}
    )
    assert reply.status == 200 and reply.headers["content-type"] == "application/octet-stream"
    result = parse(reply)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


async def test_binary_data_output_default(client: ASGIDriver) -> None:
    body = json.dumps(
        {
            "parameters": {"binary_data_output": True},
            "inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}],
        }
    ).encode()
    reply = await client.request("POST", "/v2/models/identity_fp32/infer", body)
    assert reply.status == 200 and "inference-header-content-length" in reply.headers
    np.testing.assert_array_equal(parse(reply).as_numpy("OUTPUT0"), np.array([1, 2, 3], dtype=np.float32))


async def test_infer_bytes_model(client: ASGIDriver) -> None:
    data = np.array([[b"ab", b"\xff"]], dtype=object)
    item = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    item.set_data_from_numpy(data, binary_data=True)
    body, length = _get_inference_request([item], "", None, 0, False, False, 0, None, None)
    reply = await client.request(
        "POST", "/v2/models/bytes_echo/infer", body, {"Inference-Header-Content-Length": str(length)}
    )
    assert reply.status == 200
    assert parse(reply).as_numpy("OUTPUT1").tolist() == [[2, 1]]


async def test_infer_raw_body(client: ASGIDriver) -> None:
    x = np.arange(5, dtype=np.float32)
    reply = await client.request(
        "POST", "/v2/models/identity_fp32/infer", x.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    assert reply.status == 200 and reply.headers["content-type"] == "application/octet-stream"
    np.testing.assert_array_equal(parse(reply).as_numpy("OUTPUT0"), x)
    two_inputs = await client.request(
        "POST", "/v2/models/add_sub/infer", x.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    assert two_inputs.status == 400
    assert (
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs"
        in two_inputs.json()["error"]
    )


async def test_classification(client: ASGIDriver) -> None:
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False, class_count=2)]
    body, _, _, _ = add_sub_body(False, outputs=outputs)
    reply = await client.request("POST", "/v2/models/add_sub/infer", body)
    assert reply.status == 200
    out = reply.json()["outputs"][0]
    assert (out["datatype"], out["shape"]) == ("BYTES", [1, 2])
    assert out["data"] == ["17.000000:15", "16.000000:14"]


async def test_compressed_request_and_response(client: ASGIDriver) -> None:
    body, _, a, b = add_sub_body(False)
    for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        reply = await client.request(
            "POST",
            "/v2/models/add_sub/infer",
            packed,
            {"Content-Encoding": encoding, "Accept-Encoding": encoding},
        )
        assert reply.status == 200 and reply.headers["content-encoding"] == encoding
        np.testing.assert_array_equal(parse(reply).as_numpy("OUTPUT0"), a + b)
    reply = await client.request("POST", "/v2/models/add_sub/infer", body, {"Content-Encoding": "br"})
    assert reply.status == 501 and "Unsupported compression type" in reply.json()["error"]


@pytest.mark.parametrize(
    ("body", "headers", "fragment"),
    [
        (b"{oops", {}, "failed to parse the request JSON buffer"),
        (
            b'{"inputs": []}',
            {"Inference-Header-Content-Length": "x"},
            "Unable to parse Inference-Header-Content-Length",
        ),
        (
            b'{"inputs": []}',
            {"Inference-Header-Content-Length": "99"},
            "inference header size should be in range",
        ),
        (
            b'{"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1]}]}',
            {},
            "Shape does not match",
        ),
    ],
)
async def test_bad_requests(client: ASGIDriver, body: bytes, headers: dict[str, str], fragment: str) -> None:
    reply = await client.request("POST", "/v2/models/identity_fp32/infer", body, headers)
    assert reply.status == 400 and fragment in reply.json()["error"]


async def test_model_errors_keep_their_status(client: ASGIDriver) -> None:
    body = b'{"inputs": [{"name": "WRONG", "shape": [1], "datatype": "FP32", "data": [1]}]}'
    reply = await client.request("POST", "/v2/models/identity_fp32/infer", body)
    assert reply.status == 400 and "error" in reply.json()
    missing = await client.request("POST", "/v2/models/nope/infer", body)
    assert missing.status in (400, 404) and "nope" in missing.json()["error"]


async def test_max_input_size_checked_before_reading(client: ASGIDriver) -> None:
    reply = await client.request(
        "POST", "/v2/models/identity_fp32/infer", b"", {"Content-Length": str(MAX_INPUT + 1)}
    )
    assert reply.status == 400 and "--http-max-input-size" in reply.json()["error"]
    assert reply.received == 0  # answered from the header, the body was never read
    chunked = await client.request(
        "POST", "/v2/models/identity_fp32/infer", chunks=[b" " * (MAX_INPUT // 2)] * 3
    )
    assert chunked.status == 400 and "exceeds the maximum HTTP input size" in chunked.json()["error"]
    assert chunked.received == 3  # stopped at the chunk that crossed the limit


async def test_disconnect_cancels_the_request(client: ASGIDriver, server: Server) -> None:
    body = b'{"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}'
    disconnect = trio.Event()
    body_done = trio.Event()
    replies: list[Reply] = []
    async with trio.open_nursery() as nursery:

        async def run(done: trio.Event | None, gone: trio.Event | None) -> None:
            replies.append(
                await client.request("POST", "/v2/models/slow/infer", body, body_done=done, disconnect=gone)
            )

        nursery.start_soon(run, None, None)  # occupies the only instance
        await trio.sleep(0.1)
        nursery.start_soon(run, body_done, disconnect)  # queued behind it
        await body_done.wait()
        disconnect.set()
    answered = [r for r in replies if r.status]
    assert len(answered) == 1 and answered[0].status == 200
    assert any(r.status == 0 and not r.messages for r in replies)  # nothing was sent to the gone client
    stats = (await client.request("GET", "/v2/models/slow/stats")).json()["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == 1
    assert stats["fail"]["count"] == 1


# ---- statistics, repository, logging, trace ---------------------------------------------------------


async def test_statistics(client: ASGIDriver) -> None:
    body, _, _, _ = add_sub_body(False)
    assert (await client.request("POST", "/v2/models/add_sub/infer", body)).status == 200
    one = (await client.request("GET", "/v2/models/add_sub/stats")).json()
    assert [s["name"] for s in one["model_stats"]] == ["add_sub"]
    assert one["model_stats"][0]["inference_stats"]["success"]["count"] == 1
    every = (await client.request("GET", "/v2/models/stats")).json()
    assert {"add_sub", "identity_fp32"} <= {s["name"] for s in every["model_stats"]}
    assert (await client.request("POST", "/v2/models/stats")).status == 405


async def test_repository_index(client: ASGIDriver) -> None:
    index = (await client.request("POST", "/v2/repository/index")).json()
    by_name = {e["name"]: e for e in index}
    assert by_name["add_sub"]["state"] == "READY" and by_name["add_sub"]["version"] == "1"
    ready = (await client.request("POST", "/v2/repository/index", b'{"ready": true}')).json()
    assert all(e["state"] == "READY" for e in ready)
    assert (await client.request("POST", "/v2/repository/index", b'{"ready": 1}')).status == 400
    assert (await client.request("GET", "/v2/repository/index")).status == 405


async def test_load_and_unload(client: ASGIDriver) -> None:
    reply = await client.request("POST", "/v2/repository/models/identity_fp32/unload")
    assert reply.status == 200
    assert (await client.request("GET", "/v2/models/identity_fp32/ready")).status == 400
    reply = await client.request("POST", "/v2/repository/models/identity_fp32/load")
    assert reply.status == 200
    assert (await client.request("GET", "/v2/models/identity_fp32/ready")).status == 200
    config = json.dumps({"max_batch_size": 0, "backend": "python", "input": [], "output": []})
    params = {"parameters": {"config": config, "file:1/model.py": base64.b64encode(b"x = 1\n").decode()}}
    assert (
        await client.request("POST", "/v2/repository/models/other/load", json.dumps(params).encode())
    ).status in (
        200,
        400,
    )
    bad64 = {"parameters": {"config": config, "file:1/model.py": "***"}}
    reply = await client.request("POST", "/v2/repository/models/other/load", json.dumps(bad64).encode())
    assert reply.status == 400 and "base64" in reply.json()["error"]
    unknown = {"parameters": {"colour": "red"}}
    reply = await client.request("POST", "/v2/repository/models/other/load", json.dumps(unknown).encode())
    assert reply.status == 400 and "colour" in reply.json()["error"]
    reply = await client.request("POST", "/v2/repository/myrepo/models/add_sub/load")
    assert reply.status == 501 and "repository_name" in reply.json()["error"]
    reply = await client.request(
        "POST", "/v2/repository/models/add_sub/unload", b'{"parameters": {"unload_dependents": "yes"}}'
    )
    assert reply.status == 400 and "unload_dependents" in reply.json()["error"]
    assert (await client.request("GET", "/v2/repository/models/add_sub/unload")).status == 405


async def test_logging_settings(client: ASGIDriver) -> None:
    settings = (await client.request("GET", "/v2/logging")).json()
    assert set(settings) >= {
        "log_file",
        "log_info",
        "log_warning",
        "log_error",
        "log_verbose_level",
        "log_format",
    }
    updated = await client.request("POST", "/v2/logging", b'{"log_verbose_level": 1}')
    assert updated.status == 200 and updated.json()["log_verbose_level"] == 1
    assert (await client.request("POST", "/v2/logging", b'{"log_file": "/tmp/x"}')).status == 501
    assert (await client.request("POST", "/v2/logging", b"[]")).status == 400
    assert (await client.request("PUT", "/v2/logging")).status == 405


async def test_trace_settings(client: ASGIDriver) -> None:
    global_settings = await client.request("GET", "/v2/trace/setting")
    assert global_settings.status == 200 and "trace_level" in global_settings.json()
    model = await client.request("POST", "/v2/models/add_sub/trace/setting", b'{"trace_rate": "10"}')
    assert model.status == 200 and model.json()["trace_rate"] == "10"
    assert (await client.request("GET", "/v2/models/add_sub/versions/1/trace/setting")).status == 404
    assert (await client.request("DELETE", "/v2/trace/setting")).status == 405


async def test_unsupported_and_unknown_routes(client: ASGIDriver) -> None:
    for method, path in (  # client shared memory is off unless --allow-client-shm
        ("GET", "/v2/systemsharedmemory/status"),
        ("POST", "/v2/systemsharedmemory/region/r/register"),
        ("POST", "/v2/cudasharedmemory/unregister"),
    ):
        reply = await client.request(method, path, b'{"key": "/k", "byte_size": 4}')
        assert reply.status == 501, path
        assert "start it with --allow-client-shm=true" in reply.json()["error"]
    assert (await client.request("POST", "/v2/systemsharedmemory/status")).status == 405
    assert (await client.request("GET", "/v2/models/add_sub/generate")).status == 405
    for path in ("/", "/v1x/models", "/v2/models/a/b/c", "/v2/models/a/versions/x", "/v2/health"):
        reply = await client.request("GET", path)
        assert reply.status == 404 and reply.json() == {"error": "Not Found"}, path


async def test_unexpected_exception_is_a_500(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(server, "metadata", broken)  # fault injection on the real server
    reply = await ASGIDriver(make_app(server)).request("GET", "/v2")
    assert reply.status == 500 and "boom" in reply.json()["error"]


async def test_lifespan_protocol(client: ASGIDriver) -> None:
    events = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return events.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await client.app({"type": "lifespan"}, receive, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
