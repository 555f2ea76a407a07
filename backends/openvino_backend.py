"""The OpenVINO backend (``backend: "openvino"``, ``platform: "openvino"``), on CPU.

Reads ``model.xml`` (+ ``model.bin``), or ONNX and the other formats OpenVINO reads when
``default_model_filename`` names them (``model.onnx``...). One ``CompiledModel`` per model
version is shared by its instances, each with its own ``InferRequest``, so
``instance_group { count: N }`` keeps N requests in flight across the CPU plugin's streams.

Parameters (Triton's openvino_backend): ``PERFORMANCE_HINT`` (LATENCY, THROUGHPUT,
CUMULATIVE_THROUGHPUT), ``NUM_STREAMS`` (a number, AUTO or NUMA), ``INFERENCE_NUM_THREADS``,
``COMPILATION_NUM_THREADS``, ``HINT_BF16`` (YES: bfloat16 inference precision),
``CPU_EXTENSION_PATH`` (a file inside the model's folder); any other upper-case key is passed to ``compile_model`` as an OpenVINO
property. Batching: a static batch dimension is made dynamic when ``max_batch_size > 0``
unless ``SKIP_OV_DYNAMIC_BATCHSIZE: YES`` (then the model keeps batch ``max_batch_size`` and
``ENABLE_BATCH_PADDING: YES`` pads smaller batches); ``RESHAPE_IO_LAYERS: YES`` reshapes the
inputs to the config's dims. Auto-complete adds the tensors the config does not list and
autofills max_batch_size as Triton does. OpenVINO's ``infer`` releases the GIL.

A running inference is not stopped when its clients leave (the instance is not
``interruptible``): with openvino 2026.4's CPU plugin, ``InferRequest.cancel()`` of an
inference started with ``start_async`` does end it, but the next inference of the same compiled
model then sometimes runs with the cancelled one's intermediate shapes (as slow as it, and with
wrong outputs): tests/bench/bench_cancel_running.py checks it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from trident.backends._common import (
    BatchRunner,
    IOSpec,
    autocomplete,
    bool_parameter,
    check_io,
    closed_run,
    default_max_batch_size,
    model_path,
    parameter,
    require,
)
from trident.backends.base import Backend, LoadContext, ModelInstance
from trident.errors import TritonError, internal, invalid_arg, unavailable, unsupported
from trident.protocol.generated.inference import DataType, ModelConfig, ModelInput, ModelOutput
from trident.types import InferenceRequest, InferenceResponse

log = logging.getLogger("trident.backends.openvino")

EXTRA = "openvino"
_TYPES = {
    "boolean": "TYPE_BOOL", "u8": "TYPE_UINT8", "u16": "TYPE_UINT16", "u32": "TYPE_UINT32", "u64": "TYPE_UINT64",
    "i8": "TYPE_INT8", "i16": "TYPE_INT16", "i32": "TYPE_INT32", "i64": "TYPE_INT64", "f16": "TYPE_FP16",
    "f32": "TYPE_FP32", "f64": "TYPE_FP64", "bf16": "TYPE_BF16", "string": "TYPE_STRING",
}
# parameters the backend interprets itself (the rest go to compile_model)
_OWN = {"SKIP_OV_DYNAMIC_BATCHSIZE", "ENABLE_BATCH_PADDING", "RESHAPE_IO_LAYERS", "HINT_BF16", "CPU_EXTENSION_PATH"}
_lock = threading.Lock()
_compiled: dict[tuple, list[Any]] = {}  # (file, properties, shapes) -> [compiled model, users]


def describe(model: Any) -> tuple[list[IOSpec], list[IOSpec]]:
    """An OpenVINO model's inputs and outputs (dynamic dims -1; a dynamic rank is None)."""
    def spec(port: Any) -> IOSpec:
        shape = port.get_partial_shape()
        dims = None if shape.rank.is_dynamic else [-1 if d.is_dynamic else d.get_length() for d in shape]
        kind = port.get_element_type().get_type_name()
        return IOSpec(port.get_any_name(), _TYPES.get(kind, ""), dims, framework_type=kind)

    return [spec(p) for p in model.inputs], [spec(p) for p in model.outputs]


def compile_properties(config: ModelConfig) -> dict[str, str]:
    """The ``compile_model`` properties from the config's parameters."""
    props = {k: v.string_value for k, v in config.parameters.items() if k.isupper() and k not in _OWN}
    if bool_parameter(config, "HINT_BF16", False):
        props["INFERENCE_PRECISION_HINT"] = "bf16"
    else:  # on CPUs with AMX (or avx512_bf16) OpenVINO would pick bf16 by itself: FP32 models answer in FP32
        props.setdefault("INFERENCE_PRECISION_HINT", "f32")
    if "NUM_STREAMS" in props:
        props["NUM_STREAMS"] = props["NUM_STREAMS"].upper() if not props["NUM_STREAMS"].isdigit() else props["NUM_STREAMS"]
    return props


def _translate(e: Exception) -> TritonError:
    return invalid_arg(f"OpenVINO: {e}") if isinstance(e, (RuntimeError, ValueError)) else internal(f"OpenVINO: {e}")


class OpenVINOInstance(ModelInstance):
    """One ``InferRequest`` on the version's shared ``CompiledModel``."""

    def __init__(self, ov: Any, compiled: Any, key: tuple, config: ModelConfig, pad_to: int) -> None:
        self.ov = ov
        self.compiled = compiled
        self.key = key
        self.request = compiled.create_infer_request()
        self.ports = {}
        for port in compiled.outputs:
            for n in port.get_names():
                self.ports[n] = port
        self.bf16 = {i.name for i in config.input if i.data_type == DataType.TYPE_BF16}
        self.pad_to = pad_to
        self.runner = BatchRunner(config, self._run, _translate)

    def _run(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        total = next(iter(inputs.values())).shape[0] if inputs else 0
        if self.pad_to and total != self.pad_to:
            if total > self.pad_to:
                raise invalid_arg(f"batch size {total} exceeds the model's static batch {self.pad_to}")
            inputs = {n: np.concatenate([a, np.zeros((self.pad_to - total, *a.shape[1:]), a.dtype)])
                      for n, a in inputs.items()}
        feed: dict[str, Any] = {}
        for n, a in inputs.items():
            if n in self.bf16:
                t = self.ov.Tensor(self.ov.Type.bf16, self.ov.Shape(list(a.shape)))
                t.data[:] = np.ascontiguousarray(a, dtype=np.uint16).view(np.float16)
                feed[n] = t
            else:
                feed[n] = np.ascontiguousarray(a)
        result = self.request.infer(feed, share_inputs=True, share_outputs=False)
        out = {}
        for n in names:
            port = self.ports.get(n)
            if port is None:
                raise internal(f"the OpenVINO model has no output '{n}'")
            array = np.asarray(result[port])
            if port.get_element_type().get_type_name() == "bf16":
                array = array.view(np.uint16)
            out[n] = array[:total] if self.pad_to else array
        return out

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        return self.runner.execute(requests)

    def finalize(self) -> None:
        self.request = None
        self.compiled = None
        self.ports = {}  # output ports keep the compiled model alive
        self.runner.run = closed_run
        with _lock:
            entry = _compiled.get(self.key)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _compiled[self.key]


class OpenVINOBackend(Backend):
    name = "openvino"
    platforms = ("openvino",)
    default_model_filename = "model.xml"

    def _path(self, config: ModelConfig, version_dir: Path) -> Path:
        path = model_path(config, version_dir, self.default_model_filename)
        if not path.exists():
            raise unavailable(f"unable to find '{path}' for model '{config.name}'")
        return path

    def _read(self, ov: Any, core: Any, config: ModelConfig, version_dir: Path) -> Any:
        path = self._path(config, version_dir)
        try:
            return core.read_model(str(path))
        except Exception as e:
            raise invalid_arg(f"OpenVINO cannot read model '{config.name}' from {path.name}: {e}") from e

    def auto_complete_config(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                             backend_config: dict[str, str] | None = None) -> ModelConfig:
        """Adds the model's tensors missing from the config; autofills max_batch_size."""
        if version_dir is None:
            return config
        ov = require("openvino", self.name, EXTRA)
        model = self._read(ov, ov.Core(), config, version_dir)
        ins, outs = describe(model)
        return autocomplete(config, ins, outs, default_max_batch_size(backend_config), per_tensor=True)

    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        """An InferRequest on the shared compiled model. Raises UNSUPPORTED (no openvino, KIND_GPU,
        BYTES tensors), UNAVAILABLE (missing file) or INVALID_ARG (unreadable model, bad config)."""
        config = ctx.config
        if ctx.instance_kind == "KIND_GPU":
            raise unsupported(f"model '{config.name}': the openvino backend runs on CPU only; use KIND_CPU")
        tensors: list[ModelInput | ModelOutput] = [*config.input, *config.output]
        strings = [t.name for t in tensors if t.data_type == DataType.TYPE_STRING]
        if strings:
            raise unsupported(f"model '{config.name}': the openvino backend does not support BYTES tensors {strings}")
        ov = require("openvino", self.name, EXTRA)
        mbs = int(config.max_batch_size)
        skip_dynamic = bool_parameter(config, "SKIP_OV_DYNAMIC_BATCHSIZE", False)
        pad_to = mbs if skip_dynamic and mbs > 0 and bool_parameter(config, "ENABLE_BATCH_PADDING", False) else 0
        props = compile_properties(config)
        path = self._path(config, ctx.version_dir)
        key = (str(path), tuple(sorted(props.items())), mbs, skip_dynamic,
               bool_parameter(config, "RESHAPE_IO_LAYERS", False),
               tuple((i.name, tuple(i.dims)) for i in config.input))
        with _lock:
            entry = _compiled.get(key)
            if entry is None:
                entry = _compiled[key] = [self._compile(ov, config, ctx.version_dir, props, skip_dynamic), 0]
            entry[1] += 1
        instance = OpenVINOInstance(ov, entry[0], key, config, pad_to)
        instance.inline_safe = True  # the CPU plugin: short runs may stay on the loop
        return instance

    def _compile(self, ov: Any, config: ModelConfig, version_dir: Path, props: dict[str, str], skip_dynamic: bool) -> Any:
        core = ov.Core()
        extension = parameter(config, "CPU_EXTENSION_PATH")
        if extension:  # relative to the model's folder (trident.config_validation.confine_model_files)
            core.add_extension(str((version_dir.parent / extension).resolve()))
        model = self._read(ov, core, config, version_dir)
        mbs = int(config.max_batch_size)
        shapes: dict[str, list[int]] = {}
        if bool_parameter(config, "RESHAPE_IO_LAYERS", False):
            shapes = {i.name: ([-1] if mbs > 0 else []) + [int(d) for d in i.dims] for i in config.input}
        elif mbs > 0:
            for port in model.inputs:
                dims = port.get_partial_shape()
                if not dims.rank.is_dynamic and len(dims) > 0:
                    batch = mbs if skip_dynamic else -1
                    shapes[port.get_any_name()] = [batch] + [-1 if d.is_dynamic else d.get_length() for d in list(dims)[1:]]
        try:
            if shapes:
                model.reshape({n: ov.PartialShape(s) for n, s in shapes.items()})
        except Exception as e:
            raise invalid_arg(f"OpenVINO cannot reshape model '{config.name}' to {shapes}: {e}") from e
        ins, outs = describe(model)
        if skip_dynamic and mbs > 0:  # a static batch of max_batch_size stands in for the batch dimension
            ins = [IOSpec(i.name, i.data_type, [-1, *i.shape[1:]] if i.shape else i.shape) for i in ins]
            outs = [IOSpec(o.name, o.data_type, [-1, *o.shape[1:]] if o.shape else o.shape) for o in outs]
        check_io(config, ins, outs)
        try:
            compiled = core.compile_model(model, "CPU", props)
        except Exception as e:
            raise invalid_arg(f"OpenVINO cannot compile model '{config.name}' with {props}: {e}") from e
        log.info("compiled '%s' for CPU with %s (streams: %s)", config.name, props or "defaults",
                 compiled.get_property("NUM_STREAMS"))
        return compiled
