"""Models loaded on demand, least recently used out first (issue [21] item 4; trident's own).

``--model-control-mode=explicit --model-load-on-demand=true --model-budget-count=N``: a request
for a model the repository holds but has not loaded loads it (concurrent requests share the
load) and then runs; past the budget the least recently used idle model loaded on demand is
unloaded first. Real server, real tritonclient (HTTP, gRPC, aio), real Python models.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
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
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import start_server
from tests.e2e.models import IDENTITY_PY, write_identity, write_model

ON_DEMAND = ("--model-control-mode=explicit", "--model-load-on-demand=true")
X = np.array([[1.0, 2.0]], dtype=np.float32)

BROKEN_PY = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model cannot start")

    def execute(self, requests):
        return []
'''

BIG_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.block = np.ones(24 << 20, dtype=np.uint8)  # 24 MiB, resident

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''

SLOW_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''

IDENTITY_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
'''


def _http_infer(client: httpclient.InferenceServerClient, model: str) -> None:
    x = httpclient.InferInput("INPUT0", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    assert client.infer(model, [x]).as_numpy("OUTPUT0").tolist() == X.tolist()


def _grpc_infer(client: grpcclient.InferenceServerClient, model: str) -> None:
    x = grpcclient.InferInput("INPUT0", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    assert client.infer(model, [x]).as_numpy("OUTPUT0").tolist() == X.tolist()


def _ready(http_url: str) -> list[str]:
    rows = httpx.post(f"http://{http_url}/v2/repository/index", json={}, timeout=30).json()
    return [r["name"] for r in rows if r.get("state") == "READY"]


def _metric(server, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", httpx.get(server.metrics_url, timeout=30).text, re.M)
    assert m is not None, name
    return float(m.group(1))


def test_thirty_models_a_budget_of_five_random_traffic_from_every_client(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    names = [write_identity(repo, "FP32", f"m{i:02d}") for i in range(30)]
    write_identity(repo, "FP32", "pinned")
    server = start_server(*ON_DEMAND, "--model-budget-count=5", "--load-model=pinned", repo=repo)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # the loaded count, read from the repository index all along
        while not stop.is_set():
            seen.append(len([n for n in _ready(server.http_url) if n != "pinned"]))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    failures: list[str] = []
    rng = random.Random(7)
    try:
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        for _ in range(40):
            for infer, client in ((_http_infer, http), (_grpc_infer, grpc)):
                model = rng.choice(names)
                try:
                    infer(client, model)
                except InferenceServerException as e:
                    failures.append(f"{model}: {e}")

        async def concurrent() -> None:
            async def one_http(client: httpaio.InferenceServerClient, model: str) -> None:
                x = httpaio.InferInput("INPUT0", list(X.shape), "FP32")
                x.set_data_from_numpy(X)
                result = await client.infer(model, [x])
                assert result.as_numpy("OUTPUT0").tolist() == X.tolist()

            async def one_grpc(client: grpcaio.InferenceServerClient, model: str) -> None:
                x = grpcaio.InferInput("INPUT0", list(X.shape), "FP32")
                x.set_data_from_numpy(X)
                result = await client.infer(model, [x])
                assert result.as_numpy("OUTPUT0").tolist() == X.tolist()

            hclient = httpaio.InferenceServerClient(server.http_url, conn_timeout=120)
            gclient = grpcaio.InferenceServerClient(server.grpc_url)
            try:
                for _ in range(6):  # rounds of 16 concurrent requests over 8 models (shared loads)
                    batch = rng.sample(names, 8)
                    calls = [one_http(hclient, m) for m in batch] + [one_grpc(gclient, m) for m in batch]
                    for m, outcome in zip(batch * 2, await asyncio.gather(*calls, return_exceptions=True), strict=True):
                        if outcome is not None:
                            failures.append(f"{m}: {outcome!r}")
            finally:
                await hclient.close()
                await gclient.close()

        asyncio.run(concurrent())
    finally:
        stop.set()
        watcher.join()
    try:
        assert failures == []
        assert seen and max(seen) <= 5, max(seen)
        loads = _metric(server, "trident_model_on_demand_load_count")
        evictions = _metric(server, "trident_model_eviction_count")
        loaded = _metric(server, "trident_model_on_demand_loaded")
        now = [n for n in _ready(server.http_url) if n != "pinned"]
        assert loaded == len(now) == 5
        assert loads - evictions == loaded
        assert evictions >= 10 and _metric(server, "trident_model_on_demand_load_failure_count") == 0
        assert "pinned" in _ready(server.http_url)  # loaded by the user: never evicted
        with pytest.raises(InferenceServerException) as e:
            _http_infer(http, "no_such_model")
        assert e.value.status() == "404" and "unknown model" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            _grpc_infer(grpc, "no_such_model")
        assert e.value.status() == "StatusCode.NOT_FOUND"
    finally:
        server.stop()


def test_a_model_that_fails_to_load_on_demand_is_unavailable_and_the_server_keeps_serving(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_identity(repo, "FP32", "good")
    write_model(repo, "broken", IDENTITY_CONFIG.format(name="broken"), BROKEN_PY)
    checked = write_model(repo, "checked", IDENTITY_CONFIG.format(name="checked"), IDENTITY_PY)
    tampered = write_model(repo, "tampered", IDENTITY_CONFIG.format(name="tampered"), IDENTITY_PY)
    for folder, digest in ((checked, hashlib.md5(IDENTITY_PY.encode()).hexdigest()), (tampered, "0" * 32)):
        with (folder / "config.pbtxt").open("a") as f:  # the checksum repository agent runs at the load
            f.write(f'model_repository_agents {{ agents [ {{ name: "checksum" parameters [ '
                    f'{{ key: "MD5:1/model.py" value: "{digest}" }} ] }} ] }}\n')
    write_model(repo, "slow", IDENTITY_CONFIG.format(name="slow"), SLOW_PY)
    server = start_server(*ON_DEMAND, "--model-budget-count=2", "--model-load-on-demand-timeout-secs=1",
                          repo=repo)
    try:
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as e:
            _http_infer(http, "broken")
        assert e.value.status() == "503", e.value.message()
        assert "'broken' failed to load on demand" in e.value.message()
        assert "this model cannot start" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            _grpc_infer(grpc, "broken")
        assert e.value.status() == "StatusCode.UNAVAILABLE" and "this model cannot start" in e.value.message()
        _http_infer(http, "good")  # the server keeps serving
        _grpc_infer(grpc, "checked")  # loaded through its repository agent
        with pytest.raises(InferenceServerException) as e:
            _http_infer(http, "tampered")
        assert e.value.status() == "503" and "mismatched MD5 hash" in e.value.message()
        assert _metric(server, "trident_model_on_demand_load_failure_count") == 2
        # a load longer than the wait: UNAVAILABLE (retryable), and the load goes on
        with pytest.raises(InferenceServerException) as e:
            _grpc_infer(grpc, "slow")
        assert e.value.status() == "StatusCode.UNAVAILABLE" and "still loading on demand" in e.value.message()
        deadline = time.monotonic() + 30
        while "slow" not in _ready(server.http_url) and time.monotonic() < deadline:
            time.sleep(0.1)
        _http_infer(http, "slow")
        _grpc_infer(grpc, "good")
        with pytest.raises(InferenceServerException) as e:
            _http_infer(http, "no_such_model")
        assert e.value.status() == "404"
        assert len(_ready(server.http_url)) <= 2
        # loaded through the load API: pinned, outside the budget of 2, never evicted
        write_identity(repo, "FP32", "other")
        http.load_model("checked")
        for model in ("good", "slow", "other", "good"):
            _http_infer(http, model)
        ready = _ready(server.http_url)
        assert "checked" in ready and len(ready) == 3
        assert _metric(server, "trident_model_on_demand_loaded") == 2
    finally:
        server.stop()


def test_a_memory_budget_unloads_the_least_recently_used_models(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    names = [f"big{i}" for i in range(5)]
    for name in names:
        write_model(repo, name, IDENTITY_CONFIG.format(name=name), BIG_PY)
    budget = 64 << 20  # two models of 24 MiB fit, a third does not
    server = start_server(*ON_DEMAND, f"--model-budget-memory={budget}", repo=repo)
    try:
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        for name in names:
            _http_infer(http, name)
            assert len(_ready(server.http_url)) <= 2
        assert _ready(server.http_url) == names[-2:]  # the most recently used stay
        assert _metric(server, "trident_model_eviction_count") == 3
        held = _metric(server, "trident_model_on_demand_resident_bytes")
        assert 40 << 20 <= held <= budget  # two of them, as measured (RSS before and after each load)
    finally:
        server.stop()


@pytest.mark.parametrize(("flags", "message"), [
    ((*ON_DEMAND, "--model-budget-count=0"), "--model-budget-count must be from 1 to"),
    (("--model-control-mode=poll", "--model-load-on-demand=true"), "needs --model-control-mode=explicit"),
])
def test_a_bad_budget_or_mode_stops_the_start_with_one_line(tmp_path: Path, flags: tuple[str, ...],
                                                           message: str) -> None:
    """The real command (every other refusal: tests/unit/trident/server/test_on_demand.py)."""
    proc = subprocess.run([sys.executable, "-m", "trident", "serve", "--model-repository", str(tmp_path), *flags],
                          capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
