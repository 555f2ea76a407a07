"""The PyTorch backend (``backend: "pytorch"``, ``platform: "pytorch_libtorch"``).

Models: TorchScript ``model.pt`` (``torch.jit.load``) and torch.export programs ``model.pt2``
(``torch.export.save``; used when ``default_model_filename`` ends in ``.pt2`` or when only
``model.pt2`` exists). Exported programs auto-complete their inputs and outputs (names, data
types, shapes; dynamic dims are -1); TorchScript models need a config, as in Triton.

Inputs follow Triton's naming conventions, decided once per model: the names of ``forward``'s
arguments, else ``<name>__<index>`` (``INPUT__0``...), else the config order; a ``forward``
taking one ``Dict[str, Tensor]`` gets a dict keyed by input name. Outputs: a tensor is the
single output; a tuple/list maps by ``<name>__<index>`` or config order; a dict maps by key.
BYTES tensors travel as ``List[str]`` (1-D), FP16 as float16, BF16 as bfloat16.

Each instance runs on its own device: ``cpu`` for KIND_CPU, ``cuda:<device_id>`` for KIND_GPU
(with its own CUDA stream; an input read from a client's CUDA shared memory on that device is a
tensor over that memory, not a copy), under ``torch.inference_mode()`` (``INFERENCE_MODE: false`` uses
``no_grad``). Parameters: ``DISABLE_OPTIMIZED_EXECUTION``, ``INFERENCE_MODE``,
``ENABLE_CACHE_CLEANING``, ``ENABLE_WEIGHT_SHARING``, ``ENABLE_JIT_PROFILING``,
``ENABLE_JIT_EXECUTOR``, ``INTRA_OP_THREAD_COUNT`` / ``INTER_OP_THREAD_COUNT`` (process-wide
in PyTorch, as in Triton).
"""

from __future__ import annotations

import gc
import inspect
import logging
import re
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from trident.backends._common import (
    BatchRunner,
    IOSpec,
    autocomplete,
    bool_parameter,
    closed_run,
    default_max_batch_size,
    int_parameter,
    model_path,
    require,
    str_array,
)
from trident.backends.base import Backend, LoadContext, ModelInstance
from trident.backends.sequence_io import with_sequence_io
from trident.errors import TritonError, internal, invalid_arg, unavailable, unsupported
from trident.protocol.generated.inference import DataType, ModelConfig
from trident.types import InferenceRequest, InferenceResponse, device_source_of

log = logging.getLogger("trident.backends.pytorch")

EXTRA = "pytorch"
_INDEXED = re.compile(r"^.*__(\d+)$")
_DTYPES = {  # torch dtype name -> config data type
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
}
_shared_lock = threading.Lock()
_shared: dict[tuple[str, str], list[Any]] = {}  # (file, device) -> [module, users]


def device_for(torch: Any, kind: str, device_id: int, model: str) -> str:
    """The torch device of an instance: ``cuda:<id>`` for KIND_GPU, else ``cpu``.

    Raises UNSUPPORTED for KIND_GPU when torch has no CUDA or the device does not exist.
    """
    if kind != "KIND_GPU":
        return "cpu"
    if not torch.cuda.is_available():
        raise unsupported(f"KIND_GPU instance of model '{model}' needs CUDA, but torch.cuda.is_available() is False "
                          f"(torch {torch.__version__}{', a CPU-only build' if not torch.version.cuda else ''})")
    count = torch.cuda.device_count()
    if device_id >= count:
        raise unsupported(f"KIND_GPU instance of model '{model}' asks for device {device_id}, torch sees {count}")
    return f"cuda:{device_id}"


def _spec_shape(shape: Any) -> list[int]:
    return [int(d) if isinstance(d, int) or str(d).isdigit() else -1 for d in shape]


def describe_exported(program: Any) -> tuple[list[IOSpec], list[IOSpec]]:
    """Inputs and outputs of a torch.export program, from its graph's fake tensors."""
    user_inputs = set(program.graph_signature.user_inputs)
    ins: list[IOSpec] = []
    outs: list[IOSpec] = []
    for node in program.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and node.name in user_inputs and val is not None:
            dtype = str(val.dtype).removeprefix("torch.")
            ins.append(IOSpec(node.name, _DTYPES.get(dtype, ""), _spec_shape(val.shape), framework_type=dtype))
        elif node.op == "output":
            values = [a.meta.get("val") for a in node.args[0]]
            spec = program.call_spec.out_spec
            keys = list(spec.context) if spec is not None and spec.type is dict else None
            for i, v in enumerate(values):
                dtype = str(getattr(v, "dtype", "")).removeprefix("torch.")
                name = keys[i] if keys and i < len(keys) else f"OUTPUT__{i}"
                outs.append(IOSpec(name, _DTYPES.get(dtype, ""), _spec_shape(getattr(v, "shape", [])),
                                   framework_type=dtype))
    return ins, outs


def input_positions(config: ModelConfig, arg_names: list[str]) -> dict[str, int]:
    """Config input name -> forward argument position, by Triton's three naming conventions."""
    names = [i.name for i in config.input]
    if names and all(n in arg_names for n in names):
        return {n: arg_names.index(n) for n in names}
    indexed = [_INDEXED.match(n) for n in names]
    if names and all(indexed):
        return {n: int(m.group(1)) for n, m in zip(names, indexed, strict=True) if m}
    return {n: i for i, n in enumerate(names)}


def output_positions(config: ModelConfig) -> dict[str, int]:
    """Config output name -> position in a tuple output (``<name>__<index>`` or config order)."""
    names = [o.name for o in config.output]
    indexed = [_INDEXED.match(n) for n in names]
    if names and all(indexed):
        return {n: int(m.group(1)) for n, m in zip(names, indexed, strict=True) if m}
    return {n: i for i, n in enumerate(names)}


def _translate(e: Exception) -> TritonError:
    if type(e).__name__ in ("OutOfMemoryError",):
        return unavailable(f"PyTorch: {e}")
    return internal(f"PyTorch execute failure: {type(e).__name__}: {e}")


class TorchInstance(ModelInstance):
    """One module on one device."""

    def __init__(self, torch: Any, module: Any, device: str, config: ModelConfig, *, key: tuple[str, str] | None,
                 scripted: bool, arg_names: list[str], dict_input: bool) -> None:
        self.torch = torch
        self.module = module
        self.device = torch.device(device)
        self.key = key
        self.scripted = scripted
        self.dict_input = dict_input
        self.inputs = input_positions(config, arg_names)
        self.outputs = output_positions(config)
        self.strings = {i.name for i in config.input if i.data_type == DataType.TYPE_STRING}
        self.bf16 = {i.name for i in config.input if i.data_type == DataType.TYPE_BF16}
        self.inference_mode = bool_parameter(config, "INFERENCE_MODE", True)
        self.optimized = not bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION", False)
        self.clean_cache = bool_parameter(config, "ENABLE_CACHE_CLEANING", False)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.dims = {o.name: [int(d) for d in o.dims] for o in config.output}
        self.batching = config.max_batch_size > 0
        self.runner = BatchRunner(config, self._run, _translate)

    # ---- conversions ----

    def _to_torch(self, name: str, array: np.ndarray) -> Any:
        torch = self.torch
        if name in self.strings:
            return str_array(array, name).reshape(-1).tolist()
        if self.device.type == "cuda":
            source = device_source_of(array)
            if source is not None and source[0] == self.device.index:
                return self._from_device(name, array, source[1], source[2])
        if name in self.bf16:
            t = torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.ascontiguousarray(array))
        return t.to(self.device, non_blocking=True) if self.device.type != "cpu" else t

    def _from_device(self, name: str, array: np.ndarray, pointer: int, owner: Any) -> Any:
        """The input read where the client put it: a tensor over the CUDA shared memory the
        host ``array`` was copied from (no copy to the device; it keeps ``owner`` open)."""
        bf16 = name in self.bf16
        view = _DeviceArray(pointer, array.shape, "<i2" if bf16 else array.dtype.str, owner)
        t = self.torch.as_tensor(view, device=self.device)
        return t.view(self.torch.bfloat16) if bf16 else t

    def _to_numpy(self, name: str, value: Any, total: int) -> np.ndarray:
        torch = self.torch
        if isinstance(value, (list, tuple)) and all(isinstance(x, (str, bytes)) for x in value):
            array = np.empty(len(value), dtype=object)
            array[:] = [x.encode("utf-8") if isinstance(x, str) else x for x in value]
            dims = self.dims.get(name, [])
            if self.batching and dims and -1 not in dims and len(value) == total * int(np.prod(dims)):
                array = array.reshape((total, *dims))
            return array
        if not isinstance(value, torch.Tensor):
            raise internal(f"output '{name}' is a {type(value).__name__}, expected a tensor or a list of strings")
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(np.uint16)
        return value.numpy()

    # ---- execution ----

    def _run(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        torch = self.torch
        total = next(iter(inputs.values())).shape[0] if inputs and self.batching else 1
        tensors = {n: self._to_torch(n, a) for n, a in inputs.items()}
        if self.dict_input:
            args: list[Any] = [tensors]
        else:
            args = [None] * (max(self.inputs.values(), default=-1) + 1)
            for n, t in tensors.items():
                args[self.inputs[n]] = t
        grad = torch.inference_mode() if self.inference_mode else torch.no_grad()
        with grad, self._optimized(), self._stream():
            result = self.module(*args)
            produced = self._map_outputs(result, names, total)
        if self.clean_cache and self.device.type == "cuda":
            torch.cuda.empty_cache()
        return produced

    def _optimized(self) -> Any:
        if self.scripted:
            return self.torch.jit.optimized_execution(self.optimized)
        return _Null()

    def _stream(self) -> Any:
        return self.torch.cuda.stream(self.stream) if self.stream is not None else _Null()

    def _map_outputs(self, result: Any, names: list[str], total: int) -> dict[str, np.ndarray]:
        if isinstance(result, dict):
            missing = [n for n in names if n not in result]
            if missing:
                raise internal(f"the model's output dict has keys {sorted(result)}, not {missing}")
            return {n: self._to_numpy(n, result[n], total) for n in names}
        if isinstance(result, (tuple, list)) and not (result and isinstance(result[0], (str, bytes))):
            out = {}
            for n in names:
                pos = self.outputs[n]
                if pos >= len(result):
                    raise internal(f"output '{n}' is at position {pos}, the model returned {len(result)} values")
                out[n] = self._to_numpy(n, result[pos], total)
            return out
        if len(self.outputs) != 1:
            raise internal(f"the model returned one value, the configuration declares {len(self.outputs)} outputs")
        return {n: self._to_numpy(n, result, total) for n in names}

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        return self.runner.execute(requests)

    def finalize(self) -> None:
        module, self.module = self.module, None
        self.runner.run = closed_run
        if self.key is not None:
            with _shared_lock:
                entry = _shared.get(self.key)
                if entry is not None:
                    entry[1] -= 1
                    if entry[1] <= 0:
                        del _shared[self.key]
        del module
        gc.collect()
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _DeviceArray:
    """Device memory as ``__cuda_array_interface__`` (torch keeps this object, and so ``owner``,
    alive while the tensor it makes lives). The bytes were complete before the request was
    decoded (the server copied them to the host synchronously), so no stream is named. Writable,
    as Triton's PyTorch backend wraps a CUDA shared-memory input: a model that changes its
    input in place changes the client's memory."""

    def __init__(self, pointer: int, shape: tuple[int, ...], typestr: str, owner: Any) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (pointer, False),
                                         "version": 3, "strides": None}


def _apply_global_settings(torch: Any, config: ModelConfig) -> None:
    """PyTorch's process-wide knobs, as Triton's backend applies them."""
    intra = int_parameter(config, "INTRA_OP_THREAD_COUNT", 0)
    if intra > 0:
        torch.set_num_threads(intra)
    inter = int_parameter(config, "INTER_OP_THREAD_COUNT", 0)
    if inter > 0 and torch.get_num_interop_threads() != inter:
        try:
            torch.set_num_interop_threads(inter)
        except RuntimeError as e:  # only settable before PyTorch's first parallel work
            log.warning("INTER_OP_THREAD_COUNT of '%s' not applied: %s", config.name, e)
    for key, setter in (("ENABLE_JIT_PROFILING", "_jit_set_profiling_executor"),
                        ("ENABLE_JIT_EXECUTOR", "_jit_set_profiling_mode")):
        if key in config.parameters:
            getattr(torch._C, setter)(bool_parameter(config, key, True))


class PyTorchBackend(Backend):
    name = "pytorch"
    platforms = ("pytorch_libtorch",)
    default_model_filename = "model.pt"

    def _path(self, config: ModelConfig, version_dir: Path) -> Path:
        path = model_path(config, version_dir, self.default_model_filename)
        if not path.exists() and not config.default_model_filename.endswith(".pt2") and (version_dir / "model.pt2").is_file():
            path = version_dir / "model.pt2"
        if not path.is_file():
            raise unavailable(f"unable to find '{path}' for model '{config.name}'")
        return path

    def auto_complete_config(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                             backend_config: dict[str, str] | None = None) -> ModelConfig:
        """Exported programs (``.pt2``) fill inputs, outputs and max_batch_size; TorchScript needs a config."""
        if (config.input and config.output) or version_dir is None:
            return config
        path = self._path(config, version_dir)
        if path.suffix != ".pt2":
            return config
        torch = require("torch", self.name, EXTRA)
        program = torch.export.load(str(path))
        ins, outs = describe_exported(program)
        return autocomplete(config, ins, outs, default_max_batch_size(backend_config))

    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        """Load on ``cpu`` or ``cuda:<device_id>``. Raises UNSUPPORTED (no torch / no CUDA),
        UNAVAILABLE (missing file) or INVALID_ARG (a file torch cannot load)."""
        torch = require("torch", self.name, EXTRA)
        # read-only request buffers are never written by a model; TorchScript is what Triton serves
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        warnings.filterwarnings("ignore", message="`torch.jit.load` is deprecated", category=DeprecationWarning)
        config = with_sequence_io(ctx.config)  # sequence control and implicit state tensors are model inputs
        device = device_for(torch, ctx.instance_kind, ctx.device_id, config.name)
        path = self._path(config, ctx.version_dir)
        _apply_global_settings(torch, config)
        share = bool_parameter(config, "ENABLE_WEIGHT_SHARING", False)
        key = (str(path), device) if share else None
        module = None
        if key is not None:
            with _shared_lock:
                entry = _shared.get(key)
                if entry is not None:
                    entry[1] += 1
                    module = entry[0]
        scripted = path.suffix != ".pt2"
        if module is None:
            module = self._load_module(torch, path, device, config.name)
            if key is not None:
                with _shared_lock:
                    _shared.setdefault(key, [module, 0])[1] += 1
        arg_names, dict_input = _signature(module, scripted)
        instance = TorchInstance(torch, module, device, config, key=key, scripted=scripted,
                                 arg_names=arg_names, dict_input=dict_input)
        instance.inline_safe = device == "cpu"  # no CUDA stream waits on the event loop
        log.info("loaded '%s' %s on %s (%s)", config.name, ctx.instance_name, device,
                 "TorchScript" if scripted else "torch.export")
        return instance

    @staticmethod
    def _load_module(torch: Any, path: Path, device: str, model: str) -> Any:
        try:
            if path.suffix == ".pt2":
                module = torch.export.load(str(path)).module().to(device)
            else:
                module = torch.jit.load(str(path), map_location=device)
                module.eval()
        except Exception as e:
            raise invalid_arg(f"failed to load model '{model}' from {path.name}: {type(e).__name__}: {e}") from e
        return module


def _signature(module: Any, scripted: bool) -> tuple[list[str], bool]:
    """forward's argument names (without self) and whether it takes one Dict[str, Tensor]."""
    if scripted:
        args = list(module.forward.schema.arguments)
        if args and args[0].name == "self":
            args = args[1:]
        names = [a.name for a in args]
        kind = str(args[0].type).replace("(", "[").replace(")", "]") if len(args) == 1 else ""
        dict_input = kind.startswith("Dict[str, Tensor]")
        return names, dict_input
    params = list(inspect.signature(module.forward).parameters)
    return params, False
