"""Python-backend GPU tensors through a running server, on a host without CUDA.

The models (tests/e2e/gpu_tensor_models.py) make their "device" tensors over host memory
labelled CUDA device 0: trident never reads device memory itself, so whether a tensor stays a
GPU tensor, and whether BLS passes it as the same memory (no copy), is what it would be on a GPU.
The copies that must happen (to the host for a CPU-only callee or for the client; to the device
for PreferredMemory GPU) go through a stand-in for the CUDA library (CUDA_SOURCE host), or find
no CUDA library at all (CUDA_SOURCE none) and must fail with a clear error, the server serving on.
The same models run with real CUDA memory in tests/bench/bench_gpu_backends.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e.conftest import RunningServer, start_server
from e2e.gpu_tensor_models import (
    CALLER_CONFIG,
    CALLER_PY,
    DEVICE_OUT_CONFIG,
    DEVICE_OUT_PY,
    ECHO_CONFIG,
    ECHO_PY,
    PROCESS_MODE,
    write_gpu_models,
)
from e2e.models import write_model
from tritonclient.utils import InferenceServerException

X = np.arange(6, dtype=np.float32) - 2.5


def _call(client: httpclient.InferenceServerClient, callee: str, memory: str = "default",
          caller: str = "gpu_caller") -> dict[str, np.ndarray]:
    inputs = [httpclient.InferInput("X", [len(X)], "FP32"), httpclient.InferInput("CALLEE", [1], "BYTES"),
              httpclient.InferInput("MEMORY", [1], "BYTES")]
    inputs[0].set_data_from_numpy(X)
    inputs[1].set_data_from_numpy(np.array([callee.encode()], dtype=object))
    inputs[2].set_data_from_numpy(np.array([memory.encode()], dtype=object))
    result = client.infer(caller, inputs)
    return {name: result.as_numpy(name) for name in ("Y", "CALLEE_SAW_CPU", "SAME_IN", "Y_CPU", "SAME_OUT")}


def _flags(out: dict[str, np.ndarray]) -> dict[str, bool]:
    return {k: bool(v[0]) for k, v in out.items() if k != "Y"}


@pytest.fixture(scope="module")
def host_server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    repo = tmp_path_factory.mktemp("gpu-host") / "repo"
    write_gpu_models(repo, "host")
    # the caller and a GPU-output model again, each in a model process of its own
    write_model(repo, "process_caller", CALLER_CONFIG.replace('"gpu_caller"', '"process_caller"') % {"source": "host"}
                + PROCESS_MODE, CALLER_PY)
    write_model(repo, "process_device_out", DEVICE_OUT_CONFIG.replace('"device_out"', '"process_device_out"')
                % {"source": "host"} + PROCESS_MODE, DEVICE_OUT_PY)
    server = start_server(repo=repo)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def no_cuda_server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    repo = tmp_path_factory.mktemp("gpu-none") / "repo"
    write_gpu_models(repo, "none")
    server = start_server(repo=repo)
    yield server
    server.stop()


def test_bls_passes_a_gpu_tensor_to_a_callee_that_takes_gpu_inputs_and_back_without_a_copy(
        host_server: RunningServer) -> None:
    with httpclient.InferenceServerClient(host_server.http_url) as c:
        out = _call(c, "gpu_callee")
    # the callee got the caller's device memory itself, and its output came back as that memory
    assert _flags(out) == {"CALLEE_SAW_CPU": False, "SAME_IN": True, "Y_CPU": False, "SAME_OUT": True}
    np.testing.assert_array_equal(out["Y"], X)  # copied to the host for the client only


def test_preferred_memory_cpu_brings_a_gpu_output_to_the_host(host_server: RunningServer) -> None:
    with httpclient.InferenceServerClient(host_server.http_url) as c:
        out = _call(c, "gpu_callee", "cpu")
    assert _flags(out) == {"CALLEE_SAW_CPU": False, "SAME_IN": True, "Y_CPU": True, "SAME_OUT": False}
    np.testing.assert_array_equal(out["Y"], X)


def test_a_cpu_only_callee_gets_a_host_copy_and_gpu_memory_preference_moves_its_output(
        host_server: RunningServer) -> None:
    with httpclient.InferenceServerClient(host_server.http_url) as c:
        plain = _call(c, "cpu_callee")
        to_gpu = _call(c, "cpu_callee", "gpu")
    # FORCE_CPU_ONLY_INPUT_TENSORS defaults to yes: a host copy; the output stays on the host
    assert _flags(plain) == {"CALLEE_SAW_CPU": True, "SAME_IN": False, "Y_CPU": True, "SAME_OUT": False}
    np.testing.assert_array_equal(plain["Y"], X)
    # PreferredMemory GPU: the host output is copied to the device for the caller
    assert _flags(to_gpu) == {"CALLEE_SAW_CPU": True, "SAME_IN": False, "Y_CPU": False, "SAME_OUT": False}
    np.testing.assert_array_equal(to_gpu["Y"], X)


def test_a_process_isolated_callee_gets_cpu_tensors_and_says_so_at_load(host_server: RunningServer) -> None:
    with httpclient.InferenceServerClient(host_server.http_url) as c:
        out = _call(c, "process_callee")
    assert _flags(out) == {"CALLEE_SAW_CPU": True, "SAME_IN": False, "Y_CPU": True, "SAME_OUT": False}
    np.testing.assert_array_equal(out["Y"], X)
    assert ("model 'process_callee': FORCE_CPU_ONLY_INPUT_TENSORS \"no\" has no effect in process mode"
            in host_server.log())
    assert "model 'gpu_callee': input tensors can be both in CPU and GPU" in host_server.log()


def test_a_model_process_makes_gpu_tensors_and_sends_them_out_through_the_host(host_server: RunningServer) -> None:
    with httpclient.InferenceServerClient(host_server.http_url) as c:
        # BLS from a model process: its GPU tensor reaches even a GPU-inputs callee as a host copy
        out = _call(c, "gpu_callee", caller="process_caller")
        assert _flags(out) == {"CALLEE_SAW_CPU": True, "SAME_IN": False, "Y_CPU": True, "SAME_OUT": False}
        np.testing.assert_array_equal(out["Y"], X)
        x = httpclient.InferInput("X", [len(X)], "FP32")
        x.set_data_from_numpy(X)
        np.testing.assert_array_equal(c.infer("process_device_out", [x]).as_numpy("Y"), X * 2)


def test_client_inputs_reach_a_gpu_inputs_model_as_cpu_tensors_and_a_gpu_output_reaches_the_client(
        host_server: RunningServer) -> None:
    with httpclient.InferenceServerClient(host_server.http_url) as c:
        x = httpclient.InferInput("X", [len(X)], "FP32")
        x.set_data_from_numpy(X)
        echoed = c.infer("gpu_callee", [x])
        assert bool(echoed.as_numpy("IS_CPU")[0]) is True  # HTTP inputs are in CPU memory
        np.testing.assert_array_equal(echoed.as_numpy("Y"), X)
        np.testing.assert_array_equal(c.infer("device_out", [x]).as_numpy("Y"), X * 2)


def test_without_a_cuda_library_the_copies_that_must_happen_fail_clearly(no_cuda_server: RunningServer) -> None:
    with httpclient.InferenceServerClient(no_cuda_server.http_url) as c:
        # BLS to a callee that takes GPU inputs needs no CUDA library, but the client's answer
        # needs Y on the host: that copy fails, and says why
        with pytest.raises(InferenceServerException) as e:
            _call(c, "gpu_callee")
        assert "needs CUDA in this process through torch, cupy or cuda-python" in e.value.message()
        assert "no CUDA library on this host (test)" in e.value.message()
        # a CPU-only callee needs a host copy of the caller's GPU tensor: the BLS call fails
        with pytest.raises(InferenceServerException) as e:
            _call(c, "cpu_callee")
        assert "BLS request to 'cpu_callee'" in e.value.message()
        assert "needs CUDA in this process" in e.value.message()
        # a model answering the client with a GPU tensor: INTERNAL, naming the tensor
        x = httpclient.InferInput("X", [len(X)], "FP32")
        x.set_data_from_numpy(X)
        with pytest.raises(InferenceServerException) as e:
            c.infer("device_out", [x])
        assert e.value.status() == "500" and "tensor 'Y' in CUDA device 0" in e.value.message()
        # and the server serves on
        np.testing.assert_array_equal(c.infer("gpu_callee", [x]).as_numpy("Y"), X)
        assert c.is_server_ready()


@pytest.mark.parametrize("value", ["No", "YES", "maybe", "", "false"])
def test_a_bad_force_cpu_only_value_fails_the_load_as_triton_does(tmp_path: Path, value: str) -> None:
    repo = tmp_path / "repo"
    extra = f'parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: {{ string_value: "{value}" }} }}'
    write_model(repo, "bad_flag", ECHO_CONFIG % {"name": "bad_flag", "source": "host", "extra": extra}, ECHO_PY)
    write_model(repo, "good_flag", ECHO_CONFIG % {"name": "good_flag", "source": "host", "extra": extra.replace(
        f'"{value}"', '"yes"')}, ECHO_PY)
    server = start_server("--exit-on-error=false", repo=repo)
    try:
        with httpclient.InferenceServerClient(server.http_url) as c:
            index = {m["name"]: m for m in c.get_model_repository_index()}
            assert index["good_flag"]["state"] == "READY"
            assert index["bad_flag"]["state"] == "UNAVAILABLE"
            assert f"Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: '{value}'" in index["bad_flag"]["reason"]
    finally:
        server.stop()
