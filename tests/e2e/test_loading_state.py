"""A model the repository holds but that is still loading is not unknown (issue [25] item 4).

trident listens while its start-up models load (live, not ready). A request for such a model
(and one loading through the load API) is answered 503 / UNAVAILABLE naming it as loading, which
clients retry; only a model the repository does not hold is 404 / NOT_FOUND. A reload has no
window: the serving version answers until the new one replaces it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import start_server
from tests.e2e.models import write_model

LOOP = "127.0.0.1"
_STARTED = re.compile(r"Started (GRPCInferenceService|HTTPService) at [\d.]+:(\d+)")

SLOW_INIT_PY = '''
import json
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(float(json.loads(args["model_config"])["parameters"]["init_seconds"]["string_value"]))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''


def _slow_model(repo: Path, name: str, seconds: float) -> None:
    write_model(repo, name, f'''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
parameters {{ key: "init_seconds" value: {{ string_value: "{seconds}" }} }}
''', SLOW_INIT_PY)


def _http_infer(url: str, model: str) -> None:
    client = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    result = client.infer(model, [x])
    assert result.as_numpy("OUTPUT0").tolist() == [1.0, 2.0]


def _grpc_infer(url: str, model: str) -> None:
    client = grpcclient.InferenceServerClient(url)
    x = grpcclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    result = client.infer(model, [x])
    assert result.as_numpy("OUTPUT0").tolist() == [1.0, 2.0]


def _assert_loading(http_url: str, grpc_url: str, model: str) -> None:
    """Inference, metadata and config of ``model`` answer UNAVAILABLE (retryable), naming it loading."""
    with pytest.raises(InferenceServerException) as e:
        _http_infer(http_url, model)
    assert e.value.status() == "503", e.value.message()
    assert f"'{model}'" in e.value.message() and "loading" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        _grpc_infer(grpc_url, model)
    assert e.value.status() == "StatusCode.UNAVAILABLE", e.value
    assert f"'{model}'" in e.value.message() and "loading" in e.value.message()
    meta = httpx.get(f"http://{http_url}/v2/models/{model}", timeout=10)
    assert meta.status_code == 503 and "loading" in meta.json()["error"]
    with pytest.raises(InferenceServerException) as e:
        grpcclient.InferenceServerClient(grpc_url).get_model_config(model)
    assert e.value.status() == "StatusCode.UNAVAILABLE" and "loading" in e.value.message()


def _assert_unknown(http_url: str, grpc_url: str, model: str) -> None:
    with pytest.raises(InferenceServerException) as e:
        _http_infer(http_url, model)
    assert e.value.status() == "404" and "unknown model" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        _grpc_infer(grpc_url, model)
    assert e.value.status() == "StatusCode.NOT_FOUND" and "unknown model" in e.value.message()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_model_loading_at_start_up_is_unavailable_not_unknown(tmp_path: Path, workers: str) -> None:
    """Alone and with --workers 2 (each worker answers for itself while the supervisor drives
    the load; every call here opens connections of its own, so both workers answer)."""
    repo = tmp_path / "repo"
    _slow_model(repo, "slow_init", 8 if workers == "2" else 6)
    proc = subprocess.Popen([sys.executable, "-m", "trident", "serve", "--model-repository", str(repo),
                             "--workers", workers,
                             "--http-address", LOOP, "--grpc-address", LOOP, "--metrics-address", LOOP,
                             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        ports: dict[str, int] = {}
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while len(ports) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            for m in _STARTED.finditer(line):
                ports[m.group(1)] = int(m.group(2))
        assert len(ports) == 2, "".join(lines)
        http_url, grpc_url = f"{LOOP}:{ports['HTTPService']}", f"{LOOP}:{ports['GRPCInferenceService']}"
        for _ in range(2 if workers == "2" else 1):
            _assert_loading(http_url, grpc_url, "slow_init")
        assert not any("model loading complete" in line for line in lines)  # it was still loading
        index = httpx.post(f"http://{http_url}/v2/repository/index", json={}, timeout=10).json()
        assert {"name": "slow_init", "state": "LOADING"}.items() <= index[0].items()
        _assert_unknown(http_url, grpc_url, "no_such_model")
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "model loading complete" in line:
                break
        for _ in range(2 if workers == "2" else 1):
            _http_infer(http_url, "slow_init")
            _grpc_infer(grpc_url, "slow_init")
        _assert_unknown(http_url, grpc_url, "no_such_model")
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_model_loading_through_the_load_api_is_unavailable_and_a_reload_has_no_window(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _slow_model(repo, "slow_init", 3)
    server = start_server("--model-control-mode", "explicit", repo=repo)
    try:
        http_url, grpc_url = server.http_url, server.grpc_url
        _assert_unknown(http_url, grpc_url, "slow_init")  # in the repository, never asked for: Triton's 404
        errors: list[BaseException] = []

        def load() -> None:
            try:
                httpclient.InferenceServerClient(http_url, network_timeout=60).load_model("slow_init")
            except BaseException as e:  # re-raised by the test thread below
                errors.append(e)

        loader = threading.Thread(target=load)
        loader.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the load has started once the index says LOADING
            rows = httpx.post(f"http://{http_url}/v2/repository/index", json={}, timeout=10).json()
            if any(r["name"] == "slow_init" and r.get("state") == "LOADING" for r in rows):
                break
            time.sleep(0.05)
        _assert_loading(http_url, grpc_url, "slow_init")
        loader.join(60)
        assert not errors, errors
        _http_infer(http_url, "slow_init")
        _grpc_infer(grpc_url, "slow_init")

        # a reload (changed files: a full load, not an instance-count update): the serving version answers
        with (repo / "slow_init" / "1" / "model.py").open("a") as f:
            f.write("# changed\n")
        reloader = threading.Thread(target=load)
        reloader.start()
        answered = 0
        while reloader.is_alive():
            _http_infer(http_url, "slow_init")
            _grpc_infer(grpc_url, "slow_init")
            answered += 1
        assert not errors, errors
        assert answered > 0
        _assert_unknown(http_url, grpc_url, "no_such_model")
    finally:
        server.stop()
