"""A third-party backend (tests/example_backend), installed with pip and found through the real
``trident.backends`` entry-point group, serving models over HTTP and gRPC."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

EXAMPLE = Path(__file__).parents[1] / "example_backend"


@pytest.fixture(scope="session")
def example_backend_site(tmp_path_factory) -> Path:
    """``pip install`` the example backend into a folder of its own (not into the venv)."""
    work = tmp_path_factory.mktemp("example-backend")
    source = work / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(site), str(source)],
        check=True, timeout=300,
    )
    assert (next(site.glob("trident_example_backend-*.dist-info")) / "entry_points.txt").read_text().count(
        "example_scale = trident_example_backend:ScaleBackend") == 1
    return site


@pytest.fixture(scope="module")
def server(example_backend_site, tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("custom-backend")
    for name, extra in (
        ("scaled", 'parameters { key: "scale" value: { string_value: "3" } }'),
        ("scaled_stream", 'model_transaction_policy { decoupled: true }\n'
                          'parameters { key: "repeat" value: { string_value: "3" } }'),
        ("unknown", ""),
    ):
        (repo / name / "1").mkdir(parents=True)
        backend = "example_scale" if name != "unknown" else "no_such_backend"
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "{backend}"\n{extra}\n')
    path = os.pathsep.join(p for p in (str(example_backend_site), os.environ.get("PYTHONPATH", "")) if p)
    s = start_server("--strict-readiness=false", repo=repo, env={"PYTHONPATH": path})
    yield s
    s.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_third_party_backend_serves_requests(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    c = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    x = np.array([1.0, 2.5, -4.0], np.float32)
    t = module.InferInput("INPUT", [3], "FP32")
    t.set_data_from_numpy(x)
    assert c.is_model_ready("scaled")
    np.testing.assert_array_equal(c.infer("scaled", [t]).as_numpy("OUTPUT"), x * 3)
    c.close()


def test_auto_completed_config_and_metrics(server):
    c = httpclient.InferenceServerClient(server.http_url)
    config = c.get_model_config("scaled")
    assert config["backend"] == "example_scale"
    assert config["input"][0]["name"] == "INPUT" and config["output"][0]["dims"] == [-1]
    c.close()
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    assert "# TYPE example_scale_requests counter" in text
    assert 'example_scale_requests{model="scaled",instance="scaled_0"}' in text


def test_third_party_decoupled_model_streams(server):
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        t = grpcclient.InferInput("INPUT", [2], "FP32")
        t.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
        c.async_stream_infer("scaled_stream", [t], enable_empty_final_response=True)
        got = [results.get(timeout=30) for _ in range(4)]
    finally:
        c.stop_stream()
        c.close()
    assert all(error is None for _, error in got)
    assert [r.as_numpy("OUTPUT").tolist() for r, _ in got[:3]] == [[2.0, 4.0]] * 3
    assert got[3][0].get_response().parameters["triton_final_response"].bool_param


def test_unknown_backend_fails_only_its_model(server):
    c = httpclient.InferenceServerClient(server.http_url)
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["unknown"]["state"] == "UNAVAILABLE"
    assert "no_such_backend" in index["unknown"]["reason"]
    assert index["scaled"]["state"] == "READY"
    c.close()
