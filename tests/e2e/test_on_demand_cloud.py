"""Models loaded on demand from an S3 repository (moto's S3 server on 127.0.0.1): a load on
demand downloads the model as the load API does, an eviction removes its local copy."""

from __future__ import annotations

import re
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")

from e2e.models import IDENTITY_PY  # noqa: E402
from e2e.test_cloud_repository import AWS_ENV, IDENTITY, _moto, _s3, _stop  # noqa: E402


def _metric(server, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", httpx.get(server.metrics_url, timeout=30).text, re.M)
    assert m is not None, name
    return float(m.group(1))


def test_an_s3_model_loads_on_demand_and_its_copy_goes_with_its_eviction(server_factory, tmp_path) -> None:
    proc, port = _moto()
    try:
        client = _s3(port)
        client.create_bucket(Bucket="models")
        for name in ("py_a", "py_b"):
            client.put_object(Bucket="models", Key=f"repo/{name}/config.pbtxt", Body=IDENTITY.format(name=name).encode())
            client.put_object(Bucket="models", Key=f"repo/{name}/1/model.py", Body=IDENTITY_PY.encode())
        cache = tmp_path / "cache"
        server = server_factory("--model-control-mode=explicit", "--model-load-on-demand=true",
                                "--model-budget-count=1", repo=f"s3://127.0.0.1:{port}/models/repo",
                                env={**AWS_ENV, "TRITON_AWS_MOUNT_DIRECTORY": str(cache)})
        x = np.arange(3, dtype=np.float32)
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)

        def infer(model: str, module, c) -> None:
            i = module.InferInput("INPUT0", [3], "FP32")
            i.set_data_from_numpy(x)
            assert c.infer(model, [i]).as_numpy("OUTPUT0").tolist() == x.tolist()

        infer("py_a", httpclient, http)
        assert len(list(cache.rglob("py_a-*"))) == 1  # downloaded by the load on demand
        infer("py_b", grpcclient, grpc)  # the budget of 1: py_a leaves, with its local copy
        deadline = time.monotonic() + 30
        while list(cache.rglob("py_a-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not list(cache.rglob("py_a-*")) and len(list(cache.rglob("py_b-*"))) == 1
        infer("py_a", grpcclient, grpc)  # downloaded again
        assert _metric(server, "trident_model_on_demand_load_count") == 3
        assert _metric(server, "trident_model_eviction_count") == 2
        with pytest.raises(Exception) as e:
            infer("not_there", httpclient, http)
        assert "unknown model" in str(e.value)
    finally:
        _stop(proc)
