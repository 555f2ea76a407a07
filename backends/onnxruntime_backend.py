"""The onnxruntime backend (``backend: "onnxruntime"``, ``platform: "onnxruntime_onnx"``).

``model.onnx`` is a file, or a folder holding ``model.onnx`` and its external data. Each
instance owns one ``InferenceSession``:

* execution providers: the CPU EP on KIND_CPU; on KIND_GPU the CUDA EP on the instance's
  device (``onnxruntime-gpu``), preceded by the TensorRT EP when
  ``optimization.execution_accelerators.gpu_execution_accelerator`` names ``tensorrt``
  (its parameters map to ``trt_*`` options as in Triton); ``cpu_execution_accelerator``
  ``openvino`` adds the OpenVINO EP. A provider the installed onnxruntime lacks, or one that
  fails to initialise, is an UNSUPPORTED load error naming it;
* session options from Triton's parameters: ``intra_op_thread_count``,
  ``inter_op_thread_count``, ``execution_mode`` (0 sequential, 1 parallel),
  ``enable_mem_arena``, ``enable_mem_pattern``, ``session.*`` config entries, and
  ``optimization { graph { level } }`` (-1 basic, 1 extended, 2 none; default all);
* BYTES tensors for string graphs (``tensor(string)``), FP16, and BF16 through OrtValues;
* on the CUDA EP, an input read from a client's CUDA shared memory on the instance's device
  is bound to that memory (``io_binding``), not copied to the device again.

``session.run`` releases the GIL, so instances of one model run in parallel threads. A run
whose requests were all cancelled is stopped (``RunOptions.terminate``, checked by onnxruntime
between kernels, Loop iterations included) and fails CANCELLED: :meth:`OnnxInstance.interrupt`.
Auto-complete fills inputs, outputs and max_batch_size from the graph as Triton does.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

import numpy as np

from trident import DISTRIBUTION
from trident.backends._common import (
    BatchRunner,
    IOSpec,
    autocomplete,
    bool_parameter,
    check_io,
    closed_run,
    default_max_batch_size,
    int_parameter,
    model_path,
    parameter,
    require,
    str_array,
)
from trident.backends.base import Backend, CallGuard, LoadContext, ModelInstance
from trident.backends.sequence_io import with_sequence_io
from trident.backends.settings import setting
from trident.errors import TritonError, cancelled, internal, invalid_arg, unavailable, unsupported
from trident.protocol.generated.inference import ModelConfig
from trident.types import InferenceRequest, InferenceResponse, device_source_of

log = logging.getLogger("trident.backends.onnxruntime")

EXTRA = "onnxruntime"
GPU_EXTRA = "onnxruntime-gpu"

# ONNX tensor type strings -> config data types
_ORT_TYPES = {
    "tensor(bool)": "TYPE_BOOL", "tensor(uint8)": "TYPE_UINT8", "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32", "tensor(uint64)": "TYPE_UINT64", "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16", "tensor(int32)": "TYPE_INT32", "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16", "tensor(float)": "TYPE_FP32", "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING", "tensor(bfloat16)": "TYPE_BF16",
}
_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16
_FATAL = 4  # onnxruntime's log severity: only fatal messages

# Triton's TensorRT accelerator parameter -> ORT TensorRT EP option (README of onnxruntime_backend)
_TRT_OPTIONS = {"max_workspace_size_bytes": "trt_max_workspace_size"}


def _shape(dims: Any) -> list[int] | None:
    if dims is None:
        return None
    return [d if isinstance(d, int) and d >= 0 else -1 for d in dims]


def describe(session: Any) -> tuple[list[IOSpec], list[IOSpec]]:
    """The session's inputs and outputs (symbolic dimensions are -1); initializers that a request
    may override are optional inputs."""
    ins = [IOSpec(i.name, _ORT_TYPES.get(i.type, ""), _shape(i.shape), framework_type=i.type)
           for i in session.get_inputs()]
    ins += [IOSpec(i.name, _ORT_TYPES.get(i.type, ""), _shape(i.shape), optional=True, framework_type=i.type)
            for i in session.get_overridable_initializers()]
    outs = [IOSpec(o.name, _ORT_TYPES.get(o.type, ""), _shape(o.shape), framework_type=o.type)
            for o in session.get_outputs()]
    return ins, outs


def session_options(ort: Any, config: ModelConfig, backend_config: dict[str, str] | None = None) -> Any:
    """``SessionOptions`` from the config's parameters and graph level. Raises INVALID_ARG/UNSUPPORTED."""
    if (setting(backend_config, "enable-global-threadpool") or "0") not in ("0", "false", ""):
        raise unsupported("--backend-config=onnxruntime,enable-global-threadpool is not supported by trident; "
                          "set intra_op_thread_count / inter_op_thread_count per model")
    so = ort.SessionOptions()
    level = config.optimization.graph.level if config.optimization and config.optimization.graph else 0
    so.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    mode = int_parameter(config, "execution_mode", 0)
    if mode not in (0, 1):
        raise invalid_arg("Invalid configuration value provided. Expected values for  execution_mode are 0 or 1 "
                          f"but got {mode} .")
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    for key, attr in (("intra_op_thread_count", "intra_op_num_threads"),
                      ("inter_op_thread_count", "inter_op_num_threads")):
        n = int_parameter(config, key, 0)
        if n < 0:
            raise invalid_arg(f"parameter '{key}' of model '{config.name}' must be >= 0, got {n}")
        if n > 0:
            setattr(so, attr, n)
    if parameter(config, "enable_mem_arena") is not None:
        so.enable_cpu_mem_arena = bool_parameter(config, "enable_mem_arena", True)
    if parameter(config, "enable_mem_pattern") is not None:
        so.enable_mem_pattern = bool_parameter(config, "enable_mem_pattern", True)
    for key, value in config.parameters.items():
        if key.startswith("session."):
            so.add_session_config_entry(key, value.string_value)
    if bool_parameter(config, "share_session_between_instances", False):
        raise unsupported("parameter 'share_session_between_instances' is not supported by trident's "
                          "onnxruntime backend")
    return so


def providers(config: ModelConfig, kind: str, device_id: int, available: list[str]) -> list[Any]:
    """The execution providers of one instance, best first.

    KIND_GPU: the CUDA EP on ``device_id`` (options from the ``cuda`` accelerator and Triton's
    deprecated top-level parameters), preceded by the TensorRT EP when configured. CPU
    accelerators (``openvino``) come before the CPU EP. Raises UNSUPPORTED when a provider is
    not in ``available`` and INVALID_ARG for an unknown accelerator name.
    """
    accel = config.optimization.execution_accelerators if config.optimization else None
    chosen: list[Any] = []

    def need(provider: str, why: str, extra: str) -> None:
        if provider not in available:
            raise unsupported(
                f"{why} of model '{config.name}' needs onnxruntime's {provider}, which the installed onnxruntime "
                f"does not provide (it has {', '.join(available)}); on a host with CUDA install "
                f"pip install \"{DISTRIBUTION}[{extra}]\"")

    if kind == "KIND_GPU":
        cuda: dict[str, str] = {"device_id": str(device_id)}
        for key in ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream"):
            if parameter(config, key) is not None:
                cuda[key] = str(parameter(config, key))
        trt: dict[str, str] | None = None
        for acc in accel.gpu_execution_accelerator if accel else []:
            if acc.name == "tensorrt":
                trt = {"device_id": str(device_id)}
                for key, value in acc.parameters.items():
                    if key == "precision_mode":
                        if value.upper() in ("FP16", "INT8"):
                            trt[f"trt_{value.lower()}_enable"] = "True"
                        elif value.upper() != "FP32":
                            raise invalid_arg(f"unsupported precision mode '{value}' is requested")
                    else:
                        trt[_TRT_OPTIONS.get(key, key if key.startswith("trt_") else f"trt_{key}")] = value
            elif acc.name == "cuda":
                cuda.update(acc.parameters)
            else:
                raise invalid_arg(f"unknown Execution Accelerator '{acc.name}' is requested")
        if trt is not None:
            need("TensorrtExecutionProvider", "the tensorrt execution accelerator", GPU_EXTRA)
            chosen.append(("TensorrtExecutionProvider", trt))
        need("CUDAExecutionProvider", f"KIND_GPU instance (device {device_id})", GPU_EXTRA)
        chosen.append(("CUDAExecutionProvider", cuda))
    for acc in accel.cpu_execution_accelerator if accel else []:
        if acc.name != "openvino":
            raise invalid_arg(f"unknown Execution Accelerator '{acc.name}' is requested")
        need("OpenVINOExecutionProvider", "the openvino execution accelerator", "onnxruntime")
        chosen.append(("OpenVINOExecutionProvider", {"device_type": "CPU", **acc.parameters}))
    chosen.append("CPUExecutionProvider")
    return chosen


def _translate(e: Exception) -> TritonError:
    kind = type(e).__name__
    if kind in ("InvalidArgument", "InvalidGraph", "NotImplemented"):
        return invalid_arg(f"onnxruntime: {e}")
    return internal(f"onnxruntime: {kind}: {e}")


def _stopped() -> TritonError:
    return cancelled("onnxruntime: the run was stopped: every request of the batch was cancelled")


class OnnxInstance(ModelInstance):
    """One ``InferenceSession``; its ``execute`` runs whole batches, and :meth:`interrupt`
    stops the one running (every run of a call takes the instance's ``RunOptions``)."""

    interruptible = True

    def __init__(self, ort: Any, session: Any, config: ModelConfig, cuda_device: int | None = None) -> None:
        self.ort = ort
        self.session = session
        #: the device of the CUDA execution provider when it runs this instance, else None
        self.cuda_device = cuda_device
        ins, outs = describe(session)
        self._strings = {io.name for io in ins if io.data_type == "TYPE_STRING"}
        self._bf16 = any(io.data_type == "TYPE_BF16" for io in [*ins, *outs])
        self.runner = BatchRunner(config, self._run, self._translate)
        self._options = ort.RunOptions()  # terminate: set from the event loop's thread to stop a run
        self._guard = CallGuard()

    def _translate(self, e: Exception) -> TritonError:
        if self._guard.stopped:  # onnxruntime's "Exiting due to terminate flag being set to true"
            return _stopped()
        return _translate(e)

    def _stop(self) -> None:
        # onnxruntime would log the stop as a kernel error: the run's log goes quiet instead
        self._options.log_severity_level = _FATAL
        self._options.terminate = True

    def interrupt(self) -> None:
        """Stop the running ``session.run`` (RunOptions.terminate); a call already over is left alone."""
        self._guard.interrupt()

    def _run(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        if self._guard.stopped:  # a batch of several calls: the ones after an interrupt do not run
            raise _stopped()
        feed = {n: (str_array(a, n) if n in self._strings else a) for n, a in inputs.items()}
        if self.cuda_device is not None and not self._bf16:
            on_device = {}
            for n, a in feed.items():
                source = device_source_of(a)
                if source is not None and source[0] == self.cuda_device:
                    on_device[n] = source
            if on_device:
                return self._run_bound(feed, names, on_device)
        if not self._bf16:
            return dict(zip(names, self.session.run(names, feed, self._options), strict=True))
        return self._run_ort_values(feed, names)

    def _run_bound(self, feed: dict[str, np.ndarray], names: list[str],
                   on_device: dict[str, tuple[int, int, Any]]) -> dict[str, np.ndarray]:
        """Run with inputs read where a client put them: an input copied from CUDA shared memory
        on this instance's device is bound to that device memory (no copy to the device), the
        others are bound from the host; outputs come back to the host. ``on_device`` (its
        owners) keeps the client's memory open for the run."""
        binding = self.session.io_binding()
        for n, a in feed.items():
            source = on_device.get(n)
            if source is None:
                binding.bind_cpu_input(n, a)
            else:
                binding.bind_input(n, "cuda", self.cuda_device, a.dtype, list(a.shape), source[1])
        for n in names:
            binding.bind_output(n, "cpu")
        self.session.run_with_iobinding(binding, self._options)
        return dict(zip(names, binding.copy_outputs_to_cpu(), strict=True))

    def _run_ort_values(self, feed: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        """Run through OrtValues: numpy has no bfloat16, so BF16 travels as uint16 bit patterns."""
        types = {i.name: i.type for i in self.session.get_inputs()}
        values = {}
        for n, a in feed.items():
            if types.get(n) == "tensor(bfloat16)":
                values[n] = self.ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(a, dtype=np.uint16), _ONNX_BFLOAT16)
            else:
                values[n] = self.ort.OrtValue.ortvalue_from_numpy(a)
        out = {}
        for n, v in zip(names, self.session.run_with_ort_values(names, values, self._options), strict=True):
            if v.data_type() == "tensor(bfloat16)":
                shape = tuple(v.shape())
                count = int(np.prod(shape))
                buf = (ctypes.c_uint16 * count).from_address(v.data_ptr()) if count else None
                out[n] = np.array(buf, dtype=np.uint16).reshape(shape) if buf is not None else np.empty(shape, np.uint16)
            else:
                out[n] = v.numpy()
        return out

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        guard = self._guard
        if not guard.begin(requests, self._stop):
            return [InferenceResponse(error=_stopped()) for _ in requests]
        try:
            return self.runner.execute(requests)
        finally:
            guard.end()
            if guard.stopped:  # the next call runs, and logs, as usual
                self._options.terminate = False
                self._options.log_severity_level = -1

    def finalize(self) -> None:
        self.session = None
        self.runner.run = closed_run


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    platforms = ("onnxruntime_onnx",)
    default_model_filename = "model.onnx"

    def _path(self, config: ModelConfig, version_dir: Path) -> Path:
        path = model_path(config, version_dir, self.default_model_filename, inner="model.onnx")
        if not path.is_file():
            raise unavailable(f"unable to find '{path}' for model '{config.name}'")
        return path

    def auto_complete_config(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                             backend_config: dict[str, str] | None = None) -> ModelConfig:
        """Inputs, outputs and max_batch_size from the graph (skipped when both lists are given).

        Raises UNSUPPORTED without onnxruntime, UNAVAILABLE without the model file, INVALID_ARG
        for a graph that contradicts the config.
        """
        if (config.input and config.output) or version_dir is None:
            return config
        ort = require("onnxruntime", self.name, EXTRA)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        try:
            session = ort.InferenceSession(str(self._path(config, version_dir)), so, providers=["CPUExecutionProvider"])
        except TritonError:
            raise
        except Exception as e:
            raise invalid_arg(f"failed to read ONNX model of '{config.name}': {e}") from e
        ins, outs = describe(session)
        del session
        return autocomplete(config, ins, outs, default_max_batch_size(backend_config))

    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        """A session on the instance's device. Raises UNSUPPORTED (missing package or provider),
        UNAVAILABLE (missing file) or INVALID_ARG (bad graph or config)."""
        ort = require("onnxruntime", self.name, EXTRA)
        config = with_sequence_io(ctx.config)  # sequence control and implicit state tensors are model inputs
        path = self._path(config, ctx.version_dir)
        so = session_options(ort, config, ctx.backend_config)
        chosen = providers(config, ctx.instance_kind, ctx.device_id, ort.get_available_providers())
        try:
            session = ort.InferenceSession(str(path), so, providers=chosen)
        except Exception as e:
            raise invalid_arg(f"failed to load model '{config.name}' ({ctx.instance_name}): {e}") from e
        wanted = [p if isinstance(p, str) else p[0] for p in chosen]
        missing = [p for p in wanted if p not in session.get_providers()]
        if missing:  # onnxruntime falls back to CPU silently when a provider cannot start
            raise unsupported(f"model '{config.name}' ({ctx.instance_name}): {', '.join(missing)} failed to "
                              "initialise (is a CUDA device and its libraries present?)")
        ins, outs = describe(session)
        check_io(config, ins, outs)
        log.info("loaded '%s' %s on %s with %s", config.name, ctx.instance_name, ctx.instance_kind, wanted[0])
        instance = OnnxInstance(ort, session, config,
                                ctx.device_id if wanted[0] == "CUDAExecutionProvider" else None)
        instance.inline_safe = wanted[0] == "CPUExecutionProvider"  # short CPU runs may stay on the loop
        return instance
