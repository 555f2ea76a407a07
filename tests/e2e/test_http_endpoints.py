"""Every non-inference HTTP endpoint, with tritonclient.http and raw httpx."""

from __future__ import annotations

import base64
import json
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e.conftest import start_server
from e2e.models import IDENTITY_PY, write_identity, write_model
from tritonclient.utils import InferenceServerException


def test_health_metadata_config_on_example(example_server):
    c = httpclient.InferenceServerClient(example_server.http_url)
    try:
        assert c.is_server_live() and c.is_server_ready()
        meta = c.get_server_metadata()
        assert meta["name"] == "triton" and "binary_tensor_data" in meta["extensions"]
        assert "model_repository" in meta["extensions"] and "classification" in meta["extensions"]
        assert c.is_model_ready("add_sub") and c.is_model_ready("add_sub", "1")
        assert not c.is_model_ready("add_sub", "2") and not c.is_model_ready("nope")
        m = c.get_model_metadata("add_sub")
        assert m == {"name": "add_sub", "versions": ["1"], "platform": "python",
                     "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
                                {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]}],
                     "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]},
                                 {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 16]}]}
        cfg = c.get_model_config("add_sub")
        assert cfg["name"] == "add_sub" and cfg["max_batch_size"] == 8 and cfg["backend"] == "python"
        assert cfg["input"][0]["dims"] == [16] and cfg["input"][0]["data_type"] == "TYPE_FP32"
        assert cfg["instance_group"][0]["kind"] == "KIND_CPU" and cfg["instance_group"][0]["count"] == 1
        assert "dynamic_batching" in cfg and cfg["version_policy"] == {"latest": {"num_versions": 1}}
        with pytest.raises(InferenceServerException):
            c.get_model_metadata("nope")
        with pytest.raises(InferenceServerException):
            c.get_model_config("add_sub", "3")
    finally:
        c.close()


def test_health_raw_statuses(example_server):
    base = f"http://{example_server.http_url}"
    r = httpx.get(f"{base}/v2/health/live")
    assert r.status_code == 200 and r.content == b""
    assert httpx.get(f"{base}/v2/models/add_sub/versions/1/ready").status_code == 200
    r = httpx.get(f"{base}/v2/models/add_sub/versions/5/ready")
    assert r.status_code == 400
    r = httpx.get(f"{base}/v2/models/nope")
    assert r.status_code == 404 and "nope" in r.json()["error"]
    assert httpx.post(f"{base}/v2/health/live").status_code == 405


def test_statistics_shapes(example_server):
    c = httpclient.InferenceServerClient(example_server.http_url)
    try:
        a = np.ones((2, 16), np.float32)
        inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32"), httpclient.InferInput("INPUT1", [2, 16], "FP32")]
        for i in inputs:
            i.set_data_from_numpy(a)
        c.infer("add_sub", inputs)
        s = c.get_inference_statistics("add_sub")["model_stats"]
        assert len(s) == 1 and s[0]["name"] == "add_sub" and s[0]["version"] == "1"
        st = s[0]["inference_stats"]
        assert st["success"]["count"] >= 1 and st["queue"]["ns"] > 0 and st["compute_infer"]["ns"] > 0
        assert s[0]["inference_count"] >= 2 and s[0]["last_inference"] > 0
        assert any(b["batch_size"] == 2 for b in s[0]["batch_stats"])
        every = c.get_inference_statistics()["model_stats"]
        assert {e["name"] for e in every} == {"add_sub", "bytes_echo", "identity_fp32"}
        assert len(c.get_inference_statistics("add_sub", "1")["model_stats"]) == 1
        with pytest.raises(InferenceServerException):
            c.get_inference_statistics("nope")
    finally:
        c.close()


def test_logging_settings(example_server):
    c = httpclient.InferenceServerClient(example_server.http_url)
    try:
        s = c.get_log_settings()
        assert set(s) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
        s = c.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
        assert s["log_verbose_level"] == 1 and s["log_format"] == "ISO8601"
        c.update_log_settings({"log_verbose_level": 0, "log_format": "default"})
        r = httpx.post(f"http://{example_server.http_url}/v2/logging", json={"log_file": "/tmp/x"})
        assert r.status_code == 501
        r = httpx.post(f"http://{example_server.http_url}/v2/logging", json={"log_info": "yes"})
        assert r.status_code == 400
    finally:
        c.close()


def test_trace_settings(example_server):
    c = httpclient.InferenceServerClient(example_server.http_url)
    try:
        g = c.get_trace_settings()
        assert g["trace_level"] == ["OFF"] and g["trace_rate"] == "1000"
        m = c.update_trace_settings("add_sub", {"trace_rate": "7", "trace_level": ["TIMESTAMPS"]})
        assert m["trace_rate"] == "7" and m["trace_level"] == ["TIMESTAMPS"]
        assert c.get_trace_settings()["trace_rate"] == "1000"
        m = c.update_trace_settings("add_sub", {"trace_rate": None})
        assert m["trace_rate"] == "1000"
        r = httpx.post(f"http://{example_server.http_url}/v2/trace/setting", json={"trace_level": ["LOUD"]})
        assert r.status_code == 400
        r = httpx.get(f"http://{example_server.http_url}/v2/models/add_sub/versions/1/trace/setting")
        assert r.status_code in (400, 404)
    finally:
        c.close()


def test_load_unload_refused_in_none_mode(example_server):
    c = httpclient.InferenceServerClient(example_server.http_url)
    try:
        with pytest.raises(InferenceServerException):
            c.load_model("add_sub")
        with pytest.raises(InferenceServerException):
            c.unload_model("add_sub")
        assert c.is_model_ready("add_sub")
    finally:
        c.close()


def test_explicit_mode(tmp_path):
    repo = tmp_path / "repo"
    write_identity(repo, "FP32", "ident")
    write_identity(repo, "INT32", "other")
    s = start_server("--model-control-mode=explicit", "--load-model=ident", repo=repo)
    c = httpclient.InferenceServerClient(s.http_url)
    try:
        index = {e["name"]: e for e in c.get_model_repository_index()}
        assert index["ident"]["state"] == "READY" and index["ident"]["version"] == "1"
        assert "state" not in index["other"] or index["other"]["state"] in ("", "UNAVAILABLE")
        assert [e["name"] for e in c.get_model_repository_index() if e.get("state") == "READY"] == ["ident"]
        ready_only = httpx.post(f"http://{s.http_url}/v2/repository/index", json={"ready": True}).json()
        assert [e["name"] for e in ready_only] == ["ident"]
        c.load_model("other")
        assert c.is_model_ready("other")
        c.unload_model("other")
        assert not c.is_model_ready("other")
        index = {e["name"]: e for e in c.get_model_repository_index()}
        assert index["other"]["state"] == "UNAVAILABLE" and index["other"]["reason"] == "unloaded"
        # config override: a second version policy and max_batch_size through JSON
        cfg = json.dumps({"name": "ident", "backend": "python", "max_batch_size": 4,
                          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
                          "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]})
        c.load_model("ident", config=cfg)
        assert c.get_model_config("ident")["max_batch_size"] == 4
        # file uploads build a new model
        files = {"file:1/model.py": IDENTITY_PY.encode()}
        new_cfg = cfg.replace('"ident"', '"uploaded"')
        c.load_model("uploaded", config=new_cfg, files=files)
        x = np.ones((1, 2), np.float32)
        inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(x)
        assert c.infer("uploaded", [inp]).as_numpy("OUTPUT0").tolist() == [[1.0, 1.0]]
        # bad input: traversal, files without config, unknown model, bad config JSON
        for path in ("file:../evil.py", "file:/etc/evil.py", "file:1/../../evil.py"):
            body = {"parameters": {"config": new_cfg.replace("uploaded", "evil"),
                                   path: base64.b64encode(b"x").decode()}}
            r = httpx.post(f"http://{s.http_url}/v2/repository/models/evil/load", json=body)
            assert r.status_code == 400, path
        assert not (tmp_path / "evil.py").exists() and not (repo / "evil.py").exists()
        r = httpx.post(f"http://{s.http_url}/v2/repository/models/evil/load",
                       json={"parameters": {"file:1/model.py": base64.b64encode(b"x").decode()}})
        assert r.status_code == 400
        r = httpx.post(f"http://{s.http_url}/v2/repository/models/..%2F..%2Fetc/load")
        assert r.status_code in (400, 404)
        with pytest.raises(InferenceServerException):
            c.load_model("does_not_exist")
        with pytest.raises(InferenceServerException):
            c.load_model("ident", config="{broken")
        assert c.is_model_ready("ident")  # failed reload keeps serving
    finally:
        c.close()
        s.stop()


def test_broken_config_server_still_starts(tmp_path):
    repo = tmp_path / "repo"
    write_identity(repo, "FP32", "good")
    write_model(repo, "broken", 'name: "broken"\nbackend: "python"\nmax_batch_size: 8\ninput [ { name: "X" \n',
                IDENTITY_PY)
    s = start_server(repo=repo)
    c = httpclient.InferenceServerClient(s.http_url)
    try:
        assert c.is_server_live()
        assert not c.is_server_ready()  # strict readiness: one model failed
        index = {e["name"]: e for e in c.get_model_repository_index()}
        assert index["broken"]["state"] == "UNAVAILABLE" and "config.pbtxt:" in index["broken"]["reason"]
        assert c.is_model_ready("good")
        r = httpx.post(f"http://{s.http_url}/v2/models/broken/infer", json={"inputs": []})
        assert r.status_code == 503 and "config.pbtxt" in r.json()["error"]
    finally:
        c.close()
        s.stop()
    s = start_server("--strict-readiness=false", repo=repo)
    try:
        assert httpx.get(f"http://{s.http_url}/v2/health/ready").status_code == 200
    finally:
        s.stop()


def test_poll_mode_reload(tmp_path):
    repo = tmp_path / "repo"
    write_identity(repo, "FP32", "ident")
    s = start_server("--model-control-mode=poll", "--repository-poll-secs=0.2", repo=repo)
    c = httpclient.InferenceServerClient(s.http_url)
    try:
        x = np.ones((1, 2), np.float32)
        inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(x)
        assert c.infer("ident", [inp]).as_numpy("OUTPUT0").tolist() == [[1.0, 1.0]]
        model_py = repo / "ident" / "1" / "model.py"
        model_py.write_text(IDENTITY_PY.replace("x.as_numpy()", "x.as_numpy() * 3"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if c.infer("ident", [inp]).as_numpy("OUTPUT0").tolist() == [[3.0, 3.0]]:
                break
            time.sleep(0.1)
        assert c.infer("ident", [inp]).as_numpy("OUTPUT0").tolist() == [[3.0, 3.0]]
        write_identity(repo, "INT8", "added")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not c.is_model_ready("added"):
            time.sleep(0.1)
        assert c.is_model_ready("added")
        with pytest.raises(InferenceServerException):
            c.load_model("ident")  # poll mode refuses the API
    finally:
        c.close()
        s.stop()


def test_sigterm_drains_in_flight_request(tmp_path):
    from e2e.models import SLOW_CONFIG, SLOW_PY

    repo = tmp_path / "repo"
    write_model(repo, "slow", SLOW_CONFIG, SLOW_PY)
    s = start_server(repo=repo)
    import threading

    result = {}
    marker = tmp_path / "started"

    def call():
        c = httpclient.InferenceServerClient(s.http_url, network_timeout=60)
        inp = httpclient.InferInput("X", [1], "FP32")
        inp.set_data_from_numpy(np.array([1.0], np.float32))
        result["y"] = c.infer("slow", [inp], parameters={"marker": str(marker)}).as_numpy("Y").tolist()
        c.close()

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    code = s.stop()
    t.join(30)
    assert result.get("y") == [1.0]
    assert code == 0
