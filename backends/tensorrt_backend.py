"""The TensorRT backend (``backend: "tensorrt"``, ``platform: "tensorrt_plan"``), GPU only.

A version's ``model.plan`` (a serialized TensorRT engine, TensorRT >= 10 name-based I/O API) is
deserialized on each KIND_GPU instance's device with its own execution context and CUDA stream.
Device memory and copies go through ``cuda-python`` (``cuda.bindings.runtime``); both packages
come with the ``tensorrt`` extra. The engine's I/O tensors are checked against the config
(names, data types, shapes; ``max_batch_size`` within the first optimization profile) and fill
it in when auto-complete is on.

Hosts without CUDA, without the packages, or instances of another kind get an UNSUPPORTED
error that says which. The pure parts (:func:`engine_io`, :func:`autocomplete_engine`,
:func:`check_engine`) work on any object with TensorRT's engine inspection methods.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trident.backends._common import (
    BatchRunner,
    IOSpec,
    autocomplete,
    check_io,
    closed_run,
    default_max_batch_size,
    model_path,
    require,
)
from trident.backends.base import Backend, LoadContext, ModelInstance
from trident.errors import TritonError, internal, invalid_arg, unavailable, unsupported
from trident.protocol import datatypes
from trident.protocol.generated.inference import ModelConfig
from trident.types import InferenceRequest, InferenceResponse

log = logging.getLogger("trident.backends.tensorrt")

EXTRA = "tensorrt"
# TensorRT DataType names -> config data types (FP8/INT4/FP4 have no Triton equivalent)
_TYPES = {"FLOAT": "TYPE_FP32", "HALF": "TYPE_FP16", "BF16": "TYPE_BF16", "INT8": "TYPE_INT8", "INT32": "TYPE_INT32",
          "INT64": "TYPE_INT64", "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8"}


@dataclass
class EngineTensor:
    """One I/O tensor of an engine: shape with -1 for dynamic dims, profile 0's max for inputs."""

    name: str
    is_input: bool
    data_type: str
    trt_type: str
    shape: list[int]
    max_shape: list[int] | None = None

    def spec(self) -> IOSpec:
        return IOSpec(self.name, self.data_type, list(self.shape), framework_type=self.trt_type)


def engine_io(engine: Any, input_mode: Any) -> list[EngineTensor]:
    """The I/O tensors of a TensorRT engine (``input_mode`` is ``trt.TensorIOMode.INPUT``)."""
    tensors = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == input_mode
        dtype = getattr(engine.get_tensor_dtype(name), "name", str(engine.get_tensor_dtype(name)))
        shape = [int(d) for d in engine.get_tensor_shape(name)]
        max_shape = None
        if is_input and -1 in shape and engine.num_optimization_profiles > 0:
            _, _, high = engine.get_tensor_profile_shape(name, 0)
            max_shape = [int(d) for d in high]
        tensors.append(EngineTensor(name, is_input, _TYPES.get(dtype, ""), dtype, shape, max_shape))
    return tensors


def profile_max_batch(tensors: list[EngineTensor]) -> int | None:
    """The largest batch every batched input accepts in profile 0 (None when unknown)."""
    highs = [t.max_shape[0] for t in tensors if t.is_input and t.max_shape and t.shape and t.shape[0] == -1]
    return min(highs) if highs else None


def autocomplete_engine(config: ModelConfig, tensors: list[EngineTensor], default_batch: int) -> ModelConfig:
    """Inputs, outputs and max_batch_size from the engine (the profile's max batch, else the default)."""
    best = profile_max_batch(tensors)
    return autocomplete(config, [t.spec() for t in tensors if t.is_input], [t.spec() for t in tensors if not t.is_input],
                        best if best is not None else default_batch)


def check_engine(config: ModelConfig, tensors: list[EngineTensor]) -> None:
    """Check the config against the engine. Raises INVALID_ARG with Triton-style messages."""
    check_io(config, [t.spec() for t in tensors if t.is_input], [t.spec() for t in tensors if not t.is_input])
    best = profile_max_batch(tensors)
    if config.max_batch_size > 0 and best is not None and config.max_batch_size > best:
        raise invalid_arg(f"unable to load model '{config.name}': configuration specified max-batch "
                          f"{config.max_batch_size} but TensorRT engine only supports max-batch {best}")


class _Cuda:
    """The few CUDA runtime calls the backend needs, through cuda-python; errors raise INTERNAL."""

    def __init__(self, rt: Any, device: int) -> None:
        self.rt = rt
        self.device = device
        self.check(rt.cudaSetDevice(device))
        self.stream = self.check(rt.cudaStreamCreate())
        self.buffers: dict[str, tuple[int, int]] = {}  # name -> (pointer, bytes)

    def check(self, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise internal(f"CUDA error {err} on device {self.device}")
        return rest[0] if rest else None

    def buffer(self, name: str, nbytes: int) -> int:
        ptr, size = self.buffers.get(name, (0, 0))
        if size < nbytes:
            if ptr:
                self.check(self.rt.cudaFree(ptr))
            ptr = self.check(self.rt.cudaMalloc(max(nbytes, 1)))
            self.buffers[name] = (ptr, nbytes)
        return int(ptr)

    def to_device(self, ptr: int, array: np.ndarray) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.check(self.rt.cudaMemcpyAsync(ptr, array.ctypes.data, array.nbytes, kind, self.stream))

    def to_host(self, array: np.ndarray, ptr: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.check(self.rt.cudaMemcpyAsync(array.ctypes.data, ptr, array.nbytes, kind, self.stream))

    def sync(self) -> None:
        self.check(self.rt.cudaStreamSynchronize(self.stream))

    def close(self) -> None:
        for ptr, _ in self.buffers.values():
            self.rt.cudaFree(ptr)
        self.buffers.clear()
        self.rt.cudaStreamDestroy(self.stream)


def _cuda_runtime(model: str) -> Any:
    rt = require("cuda.bindings.runtime", "tensorrt", EXTRA)
    err, count = rt.cudaGetDeviceCount()
    if int(err) != 0 or count == 0:
        raise unsupported(f"model '{model}': TensorRT needs a CUDA device and this host has none ({err})")
    return rt


def _translate(e: Exception) -> TritonError:
    return internal(f"TensorRT: {type(e).__name__}: {e}")


class TensorRTInstance(ModelInstance):
    """An execution context and CUDA stream on one device."""

    def __init__(self, engine: Any, context: Any, cuda: _Cuda, tensors: list[EngineTensor], config: ModelConfig) -> None:
        self.engine = engine
        self.context = context
        self.cuda = cuda
        self.tensors = {t.name: t for t in tensors}
        self.runner = BatchRunner(config, self._run, _translate)

    def _run(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        cuda, context = self.cuda, self.context
        for name, array in inputs.items():
            t = self.tensors[name]
            array = np.ascontiguousarray(array, dtype=datatypes.numpy_dtype(_api(t.data_type)))
            if not context.set_input_shape(name, tuple(array.shape)):
                raise invalid_arg(f"input '{name}' shape {list(array.shape)} is outside the engine's profile")
            ptr = cuda.buffer(name, array.nbytes)
            cuda.to_device(ptr, array)
            context.set_tensor_address(name, ptr)
        outputs = {}
        for name, t in self.tensors.items():
            if t.is_input:
                continue
            shape = tuple(int(d) for d in context.get_tensor_shape(name))
            out = np.empty(shape, dtype=datatypes.numpy_dtype(_api(t.data_type)))
            context.set_tensor_address(name, cuda.buffer(name, out.nbytes))
            outputs[name] = out
        if not context.execute_async_v3(cuda.stream):
            raise internal("TensorRT execute_async_v3 failed")
        for name in names:
            cuda.to_host(outputs[name], self.cuda.buffers[name][0])
        cuda.sync()
        return {n: outputs[n] for n in names}

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        return self.runner.execute(requests)

    def finalize(self) -> None:
        self.context = None
        self.engine = None
        self.runner.run = closed_run
        self.cuda.close()


def _api(data_type: str) -> str:
    return datatypes.config_to_api(data_type)


class TensorRTBackend(Backend):
    name = "tensorrt"
    platforms = ("tensorrt_plan",)
    default_model_filename = "model.plan"

    def _deserialize(self, config: ModelConfig, version_dir: Path, device: int) -> tuple[Any, Any, list[EngineTensor]]:
        trt = require("tensorrt", self.name, EXTRA)
        rt = _cuda_runtime(config.name)
        path = model_path(config, version_dir, self.default_model_filename)
        if not path.is_file():
            raise unavailable(f"unable to find '{path}' for model '{config.name}'")
        err = rt.cudaSetDevice(device)
        if int(err[0] if isinstance(err, tuple) else err) != 0:
            raise unsupported(f"model '{config.name}': CUDA device {device} is not available ({err})")
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise invalid_arg(f"unable to load model '{config.name}': {path.name} is not a TensorRT engine this "
                              f"TensorRT ({trt.__version__}) and GPU can deserialize")
        return trt, engine, engine_io(engine, trt.TensorIOMode.INPUT)

    def auto_complete_config(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                             backend_config: dict[str, str] | None = None) -> ModelConfig:
        """Inputs, outputs and max_batch_size from the engine. Raises UNSUPPORTED without CUDA/TensorRT."""
        if (config.input and config.output) or version_dir is None:
            return config
        _, engine, tensors = self._deserialize(config, version_dir, 0)
        del engine
        return autocomplete_engine(config, tensors, default_max_batch_size(backend_config))

    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        """Deserialize on the instance's GPU. Raises UNSUPPORTED (not KIND_GPU, no CUDA, no
        TensorRT), UNAVAILABLE (missing plan) or INVALID_ARG (engine and config disagree)."""
        config = ctx.config
        if ctx.instance_kind != "KIND_GPU":
            raise unsupported(f"model '{config.name}': TensorRT plans run on KIND_GPU instances only, not "
                              f"{ctx.instance_kind}")
        _, engine, tensors = self._deserialize(config, ctx.version_dir, ctx.device_id)
        check_engine(config, tensors)
        cuda = _Cuda(_cuda_runtime(config.name), ctx.device_id)
        context = engine.create_execution_context()
        if context is None:
            cuda.close()
            raise internal(f"model '{config.name}': TensorRT could not create an execution context")
        log.info("loaded TensorRT plan '%s' %s on GPU %d", config.name, ctx.instance_name, ctx.device_id)
        return TensorRTInstance(engine, context, cuda, tensors, config)
