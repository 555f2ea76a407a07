"""Load shedding (issue [21] item 3; trident's own): a queue-delay target refuses early.

A Python model that takes ~50 ms a request on one instance, with a target of 100 ms
(``TRIDENT_QUEUE_DELAY_TARGET_US``, or the server's ``--queue-delay-target-ms``): a burst of 40
concurrent requests from tritonclient aio (HTTP, gRPC) and httpx gets some refused with
503 / UNAVAILABLE "Exceeds queue delay target" (HTTP: with Retry-After), the admitted ones are
answered right, ``trident_inference_shed_count`` counts the refusals exactly, and the next
request after the burst is admitted at once. Without a target the same burst is all admitted.
Bad targets (config parameter, flag) are refused with a clear error naming them. Real server,
real clients; nothing here asserts a time.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, start_server
from tests.e2e.models import write_model

BURST = 40
REFUSED = "Exceeds queue delay target"

SLEEPY_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Takes 50 ms a request; Y = 2 X."""

    def execute(self, requests):
        out = []
        for r in requests:
            time.sleep(0.05)
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return out
'''


def sleepy_config(name: str, target: str | None) -> str:
    param = (f'parameters {{ key: "TRIDENT_QUEUE_DELAY_TARGET_US" value {{ string_value: "{target}" }} }}\n'
             if target is not None else "")
    return f'''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{param}'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shedding-repo")
    for name, target in (("shed", "100000"), ("plain", None), ("optout", "0"), ("bad_negative", "-5"),
                         ("bad_text", "fast"), ("bad_absurd", "99999999999999")):
        write_model(root, name, sleepy_config(name, target), SLEEPY_PY)
    write_model(root, "bad_sequence", sleepy_config("bad_sequence", "100000") + "sequence_batching { }\n",
                SLEEPY_PY)
    return root


@pytest.fixture(scope="module")
def server(repo):
    s = start_server("--model-control-mode=explicit", "--load-model=shed", "--load-model=plain", repo=repo)
    yield s
    s.stop()


def metric(server: RunningServer, family: str, model: str, extra: str = "") -> int:
    text = httpx.get(server.metrics_url, timeout=10).text
    m = re.search(rf'{family}{{model="{model}",{extra}version="1"}} (\d+)', text)
    return int(m.group(1)) if m else 0


def refusals(server: RunningServer, model: str) -> int:
    return metric(server, "trident_inference_shed_count", model)


async def http_burst(server: RunningServer, model: str) -> tuple[int, int]:
    """BURST concurrent tritonclient aio HTTP requests: (answered right, refused)."""
    async with httpaio.InferenceServerClient(server.http_url) as client:
        async def one(i: int) -> bool:
            x = httpaio.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.array([i], np.float32))
            try:
                result = await client.infer(model, [x])
            except InferenceServerException as e:
                assert e.status() == "503", e
                assert REFUSED in e.message(), e
                return False
            assert result.as_numpy("Y").tolist() == [2.0 * i]
            return True

        outcomes = await asyncio.gather(*(one(i) for i in range(BURST)))
    return sum(outcomes), BURST - sum(outcomes)


async def grpc_burst(server: RunningServer, model: str) -> tuple[int, int]:
    """BURST concurrent tritonclient aio gRPC requests: (answered right, refused)."""
    client = grpcaio.InferenceServerClient(server.grpc_url)
    try:
        async def one(i: int) -> bool:
            x = grpcaio.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.array([i], np.float32))
            try:
                result = await client.infer(model, [x])
            except InferenceServerException as e:
                assert e.status() == "StatusCode.UNAVAILABLE", e
                assert REFUSED in e.message(), e
                return False
            assert result.as_numpy("Y").tolist() == [2.0 * i]
            return True

        outcomes = await asyncio.gather(*(one(i) for i in range(BURST)))
    finally:
        await client.close()
    return sum(outcomes), BURST - sum(outcomes)


async def raw_burst(server: RunningServer, model: str) -> tuple[int, int, set[str]]:
    """BURST concurrent httpx requests: (answered right, refused, the refusals' Retry-After values)."""
    retry_after: set[str] = set()
    limits = httpx.Limits(max_connections=BURST)
    async with httpx.AsyncClient(base_url=f"http://{server.http_url}", timeout=30, limits=limits) as client:
        async def one(i: int) -> bool:
            body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [i]}]}
            r = await client.post(f"/v2/models/{model}/infer", json=body)
            if r.status_code == 503:
                assert REFUSED in r.json()["error"]
                retry_after.add(r.headers.get("retry-after", "missing"))
                return False
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == [2.0 * i]
            assert "retry-after" not in r.headers
            return True

        outcomes = await asyncio.gather(*(one(i) for i in range(BURST)))
    return sum(outcomes), BURST - sum(outcomes), retry_after


def infer_once(server: RunningServer, model: str, value: float = 3.0) -> None:
    """One request, answered (not refused) and right."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([value], np.float32))
        assert client.infer(model, [x]).as_numpy("Y").tolist() == [2 * value]
    finally:
        client.close()


def test_burst_is_shed_counted_and_recovers(server) -> None:
    infer_once(server, "shed")  # the estimate starts from a measured completion
    counted = refusals(server, "shed")
    rejected_before = metric(server, "nv_inference_request_failure", "shed", 'reason="REJECTED",')
    assert counted == 0
    total_refused = 0
    for burst in (http_burst, grpc_burst):
        answered, refused = asyncio.run(burst(server, "shed"))
        assert answered >= 1 and refused >= 1, (burst.__name__, answered, refused)
        total_refused += refused
        # the load is gone: the very next request is admitted (no hold-off)
        infer_once(server, "shed", 7.0)
    answered, refused, retry_after = asyncio.run(raw_burst(server, "shed"))
    assert answered >= 1 and refused >= 1, (answered, refused)
    assert retry_after and all(v.isdigit() and int(v) >= 1 for v in retry_after), retry_after
    total_refused += refused
    infer_once(server, "shed", 9.0)
    assert refusals(server, "shed") == total_refused
    # counted as rejected requests too, as Triton counts a full queue's refusals
    rejected = metric(server, "nv_inference_request_failure", "shed", 'reason="REJECTED",')
    assert rejected - rejected_before == total_refused


def test_no_target_no_refusals(server) -> None:
    infer_once(server, "plain")
    assert asyncio.run(http_burst(server, "plain")) == (BURST, 0)
    assert asyncio.run(grpc_burst(server, "plain")) == (BURST, 0)
    # no target, no shedding family for the model
    assert "trident_inference_shed_count{model=\"plain\"" not in httpx.get(server.metrics_url, timeout=10).text


@pytest.mark.parametrize("model, value", [("bad_negative", "-5"), ("bad_text", "fast"),
                                          ("bad_absurd", "99999999999999")])
def test_bad_target_fails_the_load(server, model: str, value: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.load_model(model)
        assert info.value.status() == "400"
        assert "TRIDENT_QUEUE_DELAY_TARGET_US" in info.value.message()
        assert f"'{value}'" in info.value.message()
        assert not client.is_model_ready(model)
        assert client.is_model_ready("shed")  # the server goes on serving
    finally:
        client.close()
    infer_once(server, "shed")


def test_target_on_a_sequence_model_is_refused(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.load_model("bad_sequence")
        assert "TRIDENT_QUEUE_DELAY_TARGET_US" in info.value.message()
        assert "sequence" in info.value.message()
    finally:
        client.close()


def test_server_default_and_opt_out(repo) -> None:
    s = start_server("--model-control-mode=explicit", "--load-model=plain", "--load-model=optout",
                     "--queue-delay-target-ms=100", repo=repo)
    try:
        infer_once(s, "plain")
        infer_once(s, "optout")
        answered, refused = asyncio.run(http_burst(s, "plain"))
        assert answered >= 1 and refused >= 1, (answered, refused)
        assert refusals(s, "plain") == refused
        assert asyncio.run(http_burst(s, "optout")) == (BURST, 0)  # its parameter 0 turns it off
        infer_once(s, "plain")
    finally:
        s.stop()


@pytest.mark.parametrize("value", ["-1", "fast", "1e12", "nan"])
def test_bad_flag_is_refused_at_start_up(value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "trident", "serve", "--model-repository", "/nonexistent",
                           f"--queue-delay-target-ms={value}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "--queue-delay-target-ms" in done.stderr, done.stderr
