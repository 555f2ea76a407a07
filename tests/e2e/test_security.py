"""Security regressions: no client can make the server write a file it names, import code from
outside a model's folder, learn server paths from errors, or use a restricted API without its
header. Real server, tritonclient HTTP and gRPC, httpx for what tritonclient cannot send."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.python_models import build_repo
from tritonclient.utils import InferenceServerException

EVIL = """
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("the server imported me")
"""

TRACE_MESSAGE = "trace file location can not be updated through network protocol"


def _add_sub_config(**changes) -> str:
    config = {"name": "add_sub", "backend": "python", "max_batch_size": 8,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
                         {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}]}
    config.update(changes)
    return json.dumps(config)


@pytest.fixture(scope="module")
def explicit(tmp_path_factory):
    from e2e.conftest import start_server

    root = tmp_path_factory.mktemp("security")
    repo = build_repo(root / "repo", ["add_sub"])
    outside = root / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text(EVIL)
    # a model whose version folder links its model file out of the model's folder
    linked = repo / "linked"
    (linked / "1").mkdir(parents=True)
    (linked / "config.pbtxt").write_text((repo / "add_sub" / "config.pbtxt").read_text().replace(
        'name: "add_sub"', 'name: "linked"'))
    (linked / "1" / "model.py").symlink_to(outside / "evil.py")
    server = start_server("--model-control-mode", "explicit", "--load-model", "add_sub", repo=repo)
    yield server, repo, outside
    server.stop()


# ---- 1. the trace file is the command line's --------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/trace/setting", "/v2/models/add_sub/trace/setting"])
def test_http_refuses_trace_file(explicit, tmp_path, path):
    server, _, _ = explicit
    target = tmp_path / "owned.json"
    r = httpx.post(f"http://{server.http_url}{path}", json={"trace_file": str(target), "trace_rate": "3"})
    assert r.status_code == 501
    assert r.json() == {"error": TRACE_MESSAGE}
    settings = httpx.get(f"http://{server.http_url}{path}").json()
    assert settings["trace_file"] == "" and settings["trace_rate"] == "1000"  # nothing of it applied
    r = httpx.post(f"http://{server.http_url}{path}", json={"trace_file": None})
    assert r.status_code == 501
    assert not target.exists()


@pytest.mark.parametrize("model", ["", "add_sub"])
def test_grpc_refuses_trace_file(explicit, tmp_path, model):
    server, _, _ = explicit
    target = tmp_path / "owned.json"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.update_trace_settings(model, {"trace_file": str(target), "trace_level": ["TIMESTAMPS"]})
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert TRACE_MESSAGE in e.value.message()
        assert client.get_trace_settings(model, as_json=True)["settings"]["trace_level"] == {"value": ["OFF"]}
    finally:
        client.close()
    assert not target.exists()


# ---- 2. model files stay inside the model's folder --------------------------------------------


@pytest.mark.parametrize("filename", ["../../outside/evil.py", "ABSOLUTE", "1/../../../outside/evil.py"])
def test_load_refuses_model_file_outside_the_folder(explicit, filename):
    server, repo, outside = explicit
    if filename == "ABSOLUTE":
        filename = str(outside / "evil.py")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("add_sub", config=_add_sub_config(default_model_filename=filename))
        assert e.value.status() == "400"
        assert "default_model_filename" in e.value.message() and "inside" in e.value.message()
        assert not (outside / "IMPORTED").exists()
        assert client.is_model_ready("add_sub")  # the serving version is untouched
    finally:
        client.close()


def test_grpc_load_refuses_model_file_outside_the_folder(explicit):
    server, _, outside = explicit
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("add_sub", config=_add_sub_config(default_model_filename="../../outside/evil.py"))
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "default_model_filename" in e.value.message()
    finally:
        client.close()
    assert not (outside / "IMPORTED").exists()


def test_symlinked_model_file_out_of_the_folder_is_refused(explicit):
    server, _, outside = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("linked")
        assert e.value.status() == "400"
        assert "must name a file inside its version folder" in e.value.message()
    finally:
        client.close()
    assert not (outside / "IMPORTED").exists()


def test_openvino_extension_path_outside_the_folder_is_refused(explicit):
    server, _, outside = explicit
    config = json.dumps({"name": "add_sub", "backend": "openvino",
                         "parameters": {"CPU_EXTENSION_PATH": {"string_value": str(outside / "libevil.so")}}})
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/add_sub/load",
                   json={"parameters": {"config": config}})
    assert r.status_code == 400
    assert "CPU_EXTENSION_PATH" in r.json()["error"]


# ---- 4. client mistakes in file overrides are 400s that name the fault, never a server path ----


@pytest.mark.parametrize("name", ["1/" + "a" * 300 + ".py", "1/mo\x00del.py", "1/" + "d/" * 600 + "x"])
def test_bad_file_override_names_are_invalid_argument(explicit, name):
    server, _, _ = explicit
    files = {f"file:{name}": base64.b64encode(b"print('x')").decode()}
    body = {"parameters": {"config": _add_sub_config(), **files}}
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/add_sub/load", json=body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]
    assert "trident-override" not in message and "/tmp" not in message
    assert "file override" in message
    assert "Traceback" not in server.log()


def test_over_long_model_name_is_invalid_argument(explicit):
    server, _, _ = explicit
    body = {"parameters": {"config": _add_sub_config(name="m" * 300),
                           "file:1/model.py": base64.b64encode(b"x = 1").decode()}}
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/{'m' * 300}/load", json=body)
    assert r.status_code == 400
    assert "invalid model name" in r.json()["error"] and "/tmp" not in r.json()["error"]


def test_grpc_bad_file_override_name_is_invalid_argument(explicit):
    server, _, _ = explicit
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("add_sub", config=_add_sub_config(), files={"file:1/" + "b" * 300: b"x = 1"})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "trident-override" not in e.value.message()
    finally:
        client.close()


# ---- 3. restricted APIs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def restricted(tmp_path_factory):
    from e2e.conftest import start_server

    repo = build_repo(tmp_path_factory.mktemp("restricted") / "repo", ["add_sub"])
    server = start_server("--model-control-mode", "explicit", "--load-model", "add_sub",
                          "--http-restricted-api", "model-repository,model-config:admin-key=s3cret",
                          "--http-restricted-api", "trace:trace-key=t",
                          "--grpc-restricted-protocol", "model-repository,statistics:admin-key=s3cret", repo=repo)
    yield server
    server.stop()


def _infer_inputs(mod):
    a = mod.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    b = mod.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    return [a, b]


def test_http_restricted_api_needs_its_header(restricted):
    base = f"http://{restricted.http_url}"
    expected = {"error": "This API is restricted, expecting header 'admin-key'"}
    for method, path in [("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/add_sub/unload"),
                         ("POST", "/v2/repository/models/add_sub/load"), ("GET", "/v2/models/add_sub/config"),
                         ("GET", "/v2/repository/index")]:
        for headers in ({}, {"admin-key": "wrong"}, {"admin-key": ""}, {"other": "s3cret"}):
            r = httpx.request(method, base + path, headers=headers)
            assert r.status_code == 403, (method, path, headers)
            assert r.json() == expected
    r = httpx.post(base + "/v2/repository/index", headers={"Admin-Key": "s3cret"})  # names are case-insensitive
    assert r.status_code == 200 and {"name": "add_sub", "version": "1", "state": "READY"} in r.json()
    r = httpx.post(base + "/v2/trace/setting", json={"trace_rate": "5"}, headers={"admin-key": "s3cret"})
    assert r.status_code == 403 and r.json() == {"error": "This API is restricted, expecting header 'trace-key'"}
    # unrestricted groups stay open; the unload above was refused, so the model still serves
    assert httpx.get(base + "/v2/health/ready").status_code == 200
    assert httpx.get(base + "/v2/models/add_sub/stats").status_code == 200
    client = httpclient.InferenceServerClient(restricted.http_url)
    try:
        result = client.infer("add_sub", _infer_inputs(httpclient))
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 16]
        with pytest.raises(InferenceServerException) as e:
            client.get_model_config("add_sub")
        assert e.value.status() == "403"
        assert client.get_model_config("add_sub", headers={"admin-key": "s3cret"})["name"] == "add_sub"
        client.unload_model("add_sub", headers={"admin-key": "s3cret"})
        client.load_model("add_sub", headers={"admin-key": "s3cret"})
        assert client.is_model_ready("add_sub")
    finally:
        client.close()


def test_grpc_restricted_protocol_needs_its_metadata(restricted):
    client = grpcclient.InferenceServerClient(restricted.grpc_url)
    expected = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    try:
        for headers in (None, {"admin-key": "s3cret"}, {"triton-grpc-protocol-admin-key": "nope"}):
            for call in (lambda h: client.get_model_repository_index(headers=h),
                         lambda h: client.get_inference_statistics("add_sub", headers=h),
                         lambda h: client.unload_model("add_sub", headers=h)):
                with pytest.raises(InferenceServerException) as e:
                    call(headers)
                assert e.value.status() == "StatusCode.UNAVAILABLE"
                assert e.value.message() == expected
        ok = {"triton-grpc-protocol-admin-key": "s3cret"}
        names = [m.name for m in client.get_model_repository_index(headers=ok).models]
        assert "add_sub" in names
        assert client.get_inference_statistics("add_sub", headers=ok).model_stats[0].name == "add_sub"
        # the HTTP restriction of model-config does not apply to gRPC, and inference is open
        assert client.get_model_config("add_sub").config.name == "add_sub"
        result = client.infer("add_sub", _infer_inputs(grpcclient))
        assert result.as_numpy("OUTPUT1").tolist() == [[0.0] * 16]
        assert client.is_model_ready("add_sub")
    finally:
        client.close()


def test_grpclib_restricted_protocol(restricted):
    import asyncio

    import tritonclient.grpc.service_pb2 as pb
    from grpclib.client import Channel
    from grpclib.const import Cardinality, Status
    from grpclib.exceptions import GRPCError

    async def index(metadata):
        channel = Channel("127.0.0.1", restricted.grpc_port)
        try:
            async with channel.request("/inference.GRPCInferenceService/RepositoryIndex", Cardinality.UNARY_UNARY,
                                       pb.RepositoryIndexRequest, pb.RepositoryIndexResponse,
                                       metadata=metadata) as stream:
                await stream.send_message(pb.RepositoryIndexRequest(), end=True)
                reply = await stream.recv_message()
                await stream.recv_trailing_metadata()
                return reply
        finally:
            channel.close()

    with pytest.raises(GRPCError) as e:
        asyncio.run(index(None))
    assert e.value.status == Status.UNAVAILABLE
    assert e.value.message == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    reply = asyncio.run(index({"triton-grpc-protocol-admin-key": "s3cret"}))
    assert "add_sub" in [m.name for m in reply.models]


def test_bad_restricted_flags_exit_with_tritons_message(tmp_path):
    import subprocess
    import sys

    for flag, message in [("--http-restricted-api=bogus:k=v", "unknown restricted api 'bogus'"),
                          ("--grpc-restricted-protocol=health:k=", "--grpc-restricted-protocol option format is "
                                                                    "'<config name>:<setting>=<value>'. Got health:k=")]:
        proc = subprocess.run([sys.executable, "-m", "trident", "serve", flag], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2
        assert message in proc.stderr
