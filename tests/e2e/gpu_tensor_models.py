"""Python models that pass GPU tensors (``pb_utils.Tensor.from_dlpack`` of CUDA memory) through
BLS, shared by tests/e2e/test_python_gpu_tensors.py (on any host) and the GPU check script
tests/bench/bench_gpu_backends.py (with real CUDA memory).

Every model reads its parameter ``CUDA_SOURCE``:

* ``torch``: device tensors are real ``torch`` CUDA tensors, and trident copies with whatever
  CUDA library it finds (the GPU check script).
* ``host``: a host without CUDA. The model's "device" tensors are host memory labelled
  ``kDLCUDA`` device 0 (trident never reads device memory itself, so everything but the copies
  runs as on a GPU), and :class:`HostAsDevice` stands in for the CUDA library that copies.
* ``none``: as ``host``, but the CUDA library trident looks for is missing (its lookup fails with
  this module's reason), to check the errors a host without CUDA gives.

``gpu_caller`` makes X a device tensor, sends it by BLS to the model named by CALLEE with the
preferred memory MEMORY ("default", "cpu" or "gpu") and answers with the callee's Y and what each
side saw: whether the callee's X was on the CPU, whether it was the caller's device memory (no
copy), whether Y came back on the GPU and as that same memory. ``echo`` (the callees) returns X
as Y with the address it saw. ``device_out`` answers the client with a device tensor.
"""

from __future__ import annotations

from pathlib import Path

CUDA_SUPPORT = '''
import ctypes

import numpy as np
import triton_python_backend_utils as pb_utils
from trident.backends.python import _cuda, _dlpack

_KEEP = []  # host memory behind this model's stand-in "device" tensors


class HostAsDevice:
    """Stands in for a CUDA library where "device" memory is host memory (CUDA_SOURCE host)."""

    name = "host-as-device (test stand-in)"

    def synchronize(self, device_id):
        pass

    def to_host(self, buffer):
        if not buffer.nbytes:
            return np.empty(0, np.uint8)
        return np.frombuffer((ctypes.c_uint8 * buffer.nbytes).from_address(buffer.pointer), np.uint8).copy()

    def to_device(self, flat, device_id):
        copy = flat.copy()
        return int(copy.ctypes.data), copy


class NoCuda:
    name = "cuda (test)"

    def __init__(self):
        raise RuntimeError("no CUDA library on this host (test)")


def setup(args):
    params = __import__("json").loads(args["model_config"]).get("parameters", {})
    source = params.get("CUDA_SOURCE", {}).get("string_value", "torch")
    if source in ("host", "none"):
        _cuda.CANDIDATES[:] = [HostAsDevice] if source == "host" else [NoCuda]
        _cuda.forget()
    return source


def device_tensor(source, name, array):
    """``array`` as a pb_utils GPU tensor (device 0)."""
    if source == "torch":
        import torch
        return pb_utils.Tensor.from_dlpack(name, torch.from_numpy(np.ascontiguousarray(array)).cuda())
    a = np.ascontiguousarray(array)
    _KEEP.append(a)
    del _KEEP[:-64]
    buffer = _dlpack.DeviceBuffer(_dlpack.KDL_CUDA, 0, int(a.ctypes.data), a.shape, "FP32", a.nbytes, a)
    return pb_utils.Tensor.from_dlpack(name, _dlpack.export(buffer))


def values(tensor):
    """A tensor's values as numpy, wherever it is (a GPU tensor's through trident's copy)."""
    return tensor.as_numpy() if tensor.is_cpu() else _cuda.to_host(tensor._buffer, "reading a test output")


def address(tensor):
    """Where a tensor's memory is (a device tensor's as its capsule says)."""
    if tensor.is_cpu():
        return int(tensor.as_numpy().ctypes.data)
    described, _ = _dlpack.describe(tensor.to_dlpack())
    return described.pointer
'''

CALLER_CONFIG = '''
name: "gpu_caller"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "CALLEE" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "MEMORY" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "CALLEE_SAW_CPU" data_type: TYPE_BOOL dims: [ 1 ] },
         { name: "SAME_IN" data_type: TYPE_BOOL dims: [ 1 ] },
         { name: "Y_CPU" data_type: TYPE_BOOL dims: [ 1 ] },
         { name: "SAME_OUT" data_type: TYPE_BOOL dims: [ 1 ] } ]
parameters { key: "CUDA_SOURCE" value: { string_value: "%(source)s" } }
'''

CALLER_PY = CUDA_SUPPORT + '''

class TritonPythonModel:
    def initialize(self, args):
        self.source = setup(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            callee = pb_utils.get_input_tensor_by_name(request, "CALLEE").as_numpy()[0].decode()
            memory = pb_utils.get_input_tensor_by_name(request, "MEMORY").as_numpy()[0].decode()
            src = device_tensor(self.source, "X", x)
            assert not src.is_cpu()
            preferred = {"default": None, "cpu": pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU),
                         "gpu": pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)}[memory]
            bls = pb_utils.InferenceRequest(model_name=callee, inputs=[src], preferred_memory=preferred,
                                            requested_output_names=["Y", "PTR", "IS_CPU"])
            answer = bls.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            y = pb_utils.get_output_tensor_by_name(answer, "Y")
            seen = int(values(pb_utils.get_output_tensor_by_name(answer, "PTR"))[0])
            saw_cpu = bool(values(pb_utils.get_output_tensor_by_name(answer, "IS_CPU"))[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y.as_numpy()) if y.is_cpu() else pb_utils.Tensor.from_dlpack("Y", y.to_dlpack()),
                pb_utils.Tensor("CALLEE_SAW_CPU", np.array([saw_cpu])),
                pb_utils.Tensor("SAME_IN", np.array([seen == address(src)])),
                pb_utils.Tensor("Y_CPU", np.array([y.is_cpu()])),
                pb_utils.Tensor("SAME_OUT", np.array([address(y) == address(src)])),
            ]))
        return responses
'''

ECHO_CONFIG = '''
name: "%(name)s"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "PTR" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "IS_CPU" data_type: TYPE_BOOL dims: [ 1 ] } ]
parameters { key: "CUDA_SOURCE" value: { string_value: "%(source)s" } }
%(extra)s
'''

ECHO_PY = CUDA_SUPPORT + '''

class TritonPythonModel:
    def initialize(self, args):
        self.source = setup(args)

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor.from_dlpack("Y", x.to_dlpack()) if not x.is_cpu() else pb_utils.Tensor("Y", x.as_numpy()),
                pb_utils.Tensor("PTR", np.array([address(x)], np.int64)),
                pb_utils.Tensor("IS_CPU", np.array([x.is_cpu()])),
            ]))
        return out
'''

DEVICE_OUT_CONFIG = '''
name: "device_out"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "CUDA_SOURCE" value: { string_value: "%(source)s" } }
'''

DEVICE_OUT_PY = CUDA_SUPPORT + '''

class TritonPythonModel:
    def initialize(self, args):
        self.source = setup(args)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([device_tensor(
            self.source, "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)]) for r in requests]
'''

GPU_INPUTS = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }'
PROCESS_MODE = 'parameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }'


def _write(repo: Path, name: str, config: str, model_py: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(model_py)


def write_gpu_models(repo: Path, source: str) -> list[str]:
    """gpu_caller; the callees gpu_callee (takes GPU inputs), cpu_callee (CPU only, the default)
    and process_callee (GPU inputs asked for, in a model process); device_out. Returns the names."""
    _write(repo, "gpu_caller", CALLER_CONFIG % {"source": source}, CALLER_PY)
    for name, extra in (("gpu_callee", GPU_INPUTS), ("cpu_callee", ""),
                        ("process_callee", GPU_INPUTS + "\n" + PROCESS_MODE)):
        _write(repo, name, ECHO_CONFIG % {"name": name, "source": source, "extra": extra}, ECHO_PY)
    _write(repo, "device_out", DEVICE_OUT_CONFIG % {"source": source}, DEVICE_OUT_PY)
    return ["gpu_caller", "gpu_callee", "cpu_callee", "process_callee", "device_out"]
