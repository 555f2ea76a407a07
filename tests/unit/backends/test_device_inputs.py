"""GPU backends read an input copied from CUDA shared memory where the client put it.

An input from a CUDA region reaches a backend as a host copy that names its device memory
(trident.types.DeviceCopy). Here the host copy is made to differ from the device memory on
purpose, so the output shows which one the model read: a GPU instance on the same device reads
the device memory, a CPU instance the host copy. Needs a CUDA device (and onnxruntime-gpu for
the ONNX Runtime case); elsewhere these tests are skipped ("no GPU: ...").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from unit.backends.test_onnxruntime import _save
from unit.backends.test_onnxruntime import context as ort_context
from unit.backends.test_onnxruntime import prepare as ort_prepare

from trident.backends import get_backend
from trident.types import DeviceCopy, InferenceRequest, Tensor


def _no_gpu() -> str | None:
    """Why the CUDA tests cannot run here (no cuda-python, driver or device), or None."""
    try:
        import cuda.bindings.runtime as rt
    except ImportError:
        return "no GPU: cuda-python is not installed"
    err, count = rt.cudaGetDeviceCount()
    if int(err) != 0 or not count:
        return f"no GPU: the CUDA runtime reports {err.name if int(err) else 'no device'}"
    return None


NO_GPU = _no_gpu()
pytestmark = pytest.mark.skipif(NO_GPU is not None, reason=NO_GPU or "")
DEVICE_VALUES = np.arange(8, dtype=np.float32).reshape(2, 4)  # what the client's GPU memory holds
HOST_VALUES = np.full((2, 4), -1.0, np.float32)  # a host copy that (on purpose) does not match it


@pytest.fixture
def device_input():
    """An FP32 [2, 4] input as the server makes it from a CUDA region: a host copy naming the
    device memory it came from (allocated here, in this process)."""
    from trident.server.cuda_ipc import open_runtime

    runtime = open_runtime()
    pointer, _ = runtime.allocate(DEVICE_VALUES.nbytes, 0)
    runtime.copy(pointer, int(DEVICE_VALUES.ctypes.data), DEVICE_VALUES.nbytes, 0)
    owner = object()
    copy = DeviceCopy.allocate(HOST_VALUES.nbytes, 0, pointer, owner)
    copy[:] = np.frombuffer(HOST_VALUES.tobytes(), np.uint8)
    yield np.frombuffer(copy.data.toreadonly(), np.float32).reshape(2, 4)
    runtime.free(pointer, 0)


def _double(instance, name: str, output: str, x: np.ndarray) -> np.ndarray:
    (response,) = instance.execute([InferenceRequest("m", [Tensor.from_numpy(name, x)])])
    assert response.error is None, response.error
    return response.output(output).data


def test_pytorch_on_the_gpu_reads_the_device_memory(tmp_path: Path, device_input: np.ndarray) -> None:
    import torch
    from unit.backends.test_pytorch import load, write_torchscript

    class Double(torch.nn.Module):
        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:  # noqa: N803 (Triton's input name)
            return INPUT__0 * 2.0

    config = '''backend: "pytorch" max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''
    folder = write_torchscript(tmp_path, "double", Double(), config)
    gpu, cpu = load(folder, "KIND_GPU", 0), load(folder, "KIND_CPU")
    try:
        np.testing.assert_array_equal(_double(gpu, "INPUT__0", "OUTPUT__0", device_input), DEVICE_VALUES * 2)
        np.testing.assert_array_equal(_double(cpu, "INPUT__0", "OUTPUT__0", device_input), HOST_VALUES * 2)
        plain = np.ones((2, 4), np.float32)  # an ordinary input: copied to the device as before
        np.testing.assert_array_equal(_double(gpu, "INPUT__0", "OUTPUT__0", plain), plain * 2)
    finally:
        gpu.finalize()
        cpu.finalize()


def test_onnxruntime_cuda_reads_the_device_memory(tmp_path: Path, device_input: np.ndarray) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no GPU: onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    folder = tmp_path / "double"
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["X", "two"], ["Y"])], "double",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])], [two])
    _save(graph, folder / "1" / "model.onnx")
    config = ort_prepare(folder)
    gpu = get_backend("onnxruntime").load_instance(ort_context(folder, config, "KIND_GPU", 0))
    cpu = get_backend("onnxruntime").load_instance(ort_context(folder, config, "KIND_CPU"))
    try:
        assert gpu.cuda_device == 0 and cpu.cuda_device is None
        np.testing.assert_array_equal(_double(gpu, "X", "Y", device_input), DEVICE_VALUES * 2)
        np.testing.assert_array_equal(_double(cpu, "X", "Y", device_input), HOST_VALUES * 2)
        plain = np.ones((2, 4), np.float32)
        np.testing.assert_array_equal(_double(gpu, "X", "Y", plain), plain * 2)
    finally:
        gpu.finalize()
        cpu.finalize()
