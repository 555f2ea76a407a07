"""Dockerfile.gpu's install, checked without a GPU or a registry: the file built on the CPU image's
Debian base in place of the CUDA runtime (``TRIDENT_GPU_CHECK_IMAGE``, built by
``containers/ci.sh``). What it checks is everything but CUDA: the apt step, install.sh with the
GPU extras (pynvml), the non-root user, the health check and the NVIDIA runtime's variables,
and that the server serves. Run by ``containers/smoke.sh`` when that variable is set."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.containers.conftest import podman, run_container

GPU_IMAGE = os.environ.get("TRIDENT_GPU_CHECK_IMAGE", "")


@pytest.fixture(scope="module")
def gpu_image() -> dict:
    if not GPU_IMAGE:
        pytest.fail("TRIDENT_GPU_CHECK_IMAGE is not set (containers/smoke.sh runs this file only when it is)")
    p = podman("image", "inspect", GPU_IMAGE, check=False)
    if p.returncode != 0:
        pytest.fail(f"image {GPU_IMAGE} not found (containers/ci.sh builds it)\n{p.stderr}")
    return json.loads(p.stdout)[0]


def test_gpu_image_configuration(gpu_image: dict) -> None:
    config = gpu_image["Config"]
    assert config["User"] == "10001:10001"
    assert gpu_image["Healthcheck"]["Test"] == ["CMD", "trident-healthcheck"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert config["Cmd"] == ["trident", "serve", "--model-repository", "/models"]


def test_gpu_extras_installed_and_the_server_serves(gpu_image: dict) -> None:
    c = run_container(image=GPU_IMAGE)
    try:
        assert c.exec("id", "-u").stdout.strip() == "10001"
        # the GPU extra (pynvml) is installed; without a driver NVML cannot initialise
        probe = c.exec("python", "-c", "import pynvml; print(pynvml.__name__)")
        assert probe.returncode == 0 and probe.stdout.strip() == "pynvml", probe.stderr
        assert "pynvml is not installed" not in c.logs()
        # the protocol modules are compiled here too (the same install script)
        status = c.exec("python", "-m", "trident.native", "status")
        assert "9 of 9 modules compiled" in status.stdout, status.stdout + status.stderr
        with httpclient.InferenceServerClient(c.url(8000)) as client:
            x = httpclient.InferInput("INPUT0", [2], "FP32")
            x.set_data_from_numpy(np.array([4, 5], np.float32))
            assert client.infer("identity_fp32", [x]).as_numpy("OUTPUT0").tolist() == [4, 5]
        assert c.exec("trident-healthcheck").returncode == 0
    finally:
        c.remove()
