"""What the framework backends share: imports, parameters, auto-complete, I/O checks, batching.

* :func:`require` imports a framework inside ``load()`` and turns a missing package into one
  UNSUPPORTED error that names the extra to install.
* :func:`parameter`, :func:`bool_parameter`, :func:`int_parameter` read config.pbtxt
  ``parameters`` (Triton's ``string_value`` map).
* :class:`IOSpec` is what a model file says about one tensor; :func:`autocomplete` fills a
  config from them as Triton's onnxruntime/OpenVINO/TensorRT backends do, and
  :func:`check_io` checks a config against them with Triton's wording.
* :class:`BatchRunner` turns a batch of requests into framework calls: requests whose inputs
  have the same non-batch shapes are concatenated along the batch dimension
  (:mod:`trident.backends.merge`) and run once, outputs are split back per request.
"""

from __future__ import annotations

import copy
import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from trident import DISTRIBUTION
from trident import config as cfg
from trident.backends.merge import batch_sizes, merge_inputs, split_outputs
from trident.backends.settings import setting
from trident.errors import TritonError, internal, invalid_arg, unavailable, unsupported
from trident.protocol import datatypes
from trident.protocol.generated.inference import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelTensorReshape,
)
from trident.types import InferenceRequest, InferenceResponse, Tensor

log = logging.getLogger("trident.backends")

DEFAULT_MAX_BATCH_SIZE = 4
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


# ---------------------------------------------------------------- imports and parameters


def require(module: str, backend: str, extra: str) -> ModuleType:
    """Import ``module`` for ``backend``; raises UNSUPPORTED naming the extra when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise unsupported(
            f"the {backend} backend needs the '{module.split('.')[0]}' package, which cannot be imported "
            f"({e}); install it with: pip install \"{DISTRIBUTION}[{extra}]\""
        ) from e


def parameter(config: ModelConfig, key: str) -> str | None:
    """The ``string_value`` of config parameter ``key`` (None when absent)."""
    p = config.parameters.get(key)
    return None if p is None else p.string_value


def bool_parameter(config: ModelConfig, key: str, default: bool) -> bool:
    """A yes/no parameter ("true"/"1"/"yes"/"on" and their opposites). Raises INVALID_ARG."""
    value = parameter(config, key)
    if value is None:
        return default
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise invalid_arg(f"parameter '{key}' of model '{config.name}' must be true or false, got '{value}'")


def int_parameter(config: ModelConfig, key: str, default: int) -> int:
    """An integer parameter. Raises INVALID_ARG for a value that is not an integer."""
    value = parameter(config, key)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value.strip())
    except ValueError:
        raise invalid_arg(f"parameter '{key}' of model '{config.name}' must be an integer, got '{value}'") from None


def default_max_batch_size(backend_config: dict[str, str] | None) -> int:
    """``--backend-config=[<backend>,]default-max-batch-size=N`` (Triton's default: 4)."""
    value = setting(backend_config, "default-max-batch-size")
    if value is None:
        return DEFAULT_MAX_BATCH_SIZE
    try:
        return max(int(value), 0)
    except ValueError:
        raise invalid_arg(f"--backend-config default-max-batch-size must be an integer, got '{value}'") from None


def model_path(config: ModelConfig, version_dir: Path, default: str, inner: str | None = None) -> Path:
    """``<version>/<default_model_filename or default>``; a folder holds ``inner`` (Triton's rule)."""
    path = version_dir / (config.default_model_filename or default)
    if inner and path.is_dir():
        path = path / inner
    return path


# ---------------------------------------------------------------- auto-complete and checks


@dataclass
class IOSpec:
    """One model tensor as the framework describes it."""

    name: str
    data_type: str  # config spelling, e.g. "TYPE_FP32"; "" when the framework type has no equivalent
    shape: list[int] | None  # full model shape, -1 for dynamic dims; None when the rank is unknown
    optional: bool = False  # an input the model can do without (e.g. an overridable initializer)
    framework_type: str = ""  # the framework's own spelling, for error messages


def _batchable(ios: Sequence[IOSpec]) -> bool:
    return all(io.shape is not None and len(io.shape) > 0 and io.shape[0] == -1 for io in ios)


def autofill_max_batch_size(config: ModelConfig, ios: Sequence[IOSpec], default: int, *, strict: bool = True) -> None:
    """Triton's ``AutoCompleteMaxBatch``; mutates ``config``.

    When every tensor has a dynamic first dimension the model can batch: an unset
    ``max_batch_size`` becomes ``default`` and, when it is above 1 and no scheduler is set,
    dynamic batching is turned on. With ``strict``, raises INVALID_ARG when the model cannot
    batch but the config sets ``max_batch_size`` (backends that can reshape pass False).
    """
    if _batchable(ios):
        if config.max_batch_size == 0:
            config.max_batch_size = max(default, 0)
            log.warning(
                "autofilled max_batch_size to %d for model '%s' since batching is supported but no "
                "max_batch_size is specified in model configuration", config.max_batch_size, config.name)
        cfg.enable_default_dynamic_batching(config)
    elif config.max_batch_size != 0 and strict:
        raise invalid_arg(
            f"autofill failed for model '{config.name}': model does not support batching while non-zero "
            "max_batch_size is specified"
        )


def _config_io(io: IOSpec, max_batch_size: int, cls: type[ModelInput] | type[ModelOutput]) -> ModelInput | ModelOutput:
    if not io.data_type:
        raise invalid_arg(f"unable to auto-complete tensor '{io.name}': its type {io.framework_type or '?'} "
                          "has no Triton data type")
    shape = list(io.shape or [])
    dims = shape[1:] if max_batch_size > 0 else shape
    tensor = cls(name=io.name, data_type=DataType[io.data_type])
    if not dims:
        dims = [1]
        if max_batch_size > 0:
            tensor.reshape = ModelTensorReshape(shape=[])
    tensor.dims = dims
    return tensor


def autocomplete(
    config: ModelConfig,
    inputs: Sequence[IOSpec],
    outputs: Sequence[IOSpec],
    default_batch: int,
    *,
    per_tensor: bool = False,
) -> ModelConfig:
    """A copy of ``config`` completed from the model's tensors, as Triton's backends do.

    Without ``per_tensor`` (onnxruntime, TensorRT): a config that lists inputs and outputs is
    left alone; otherwise max_batch_size is autofilled and missing input/output lists are filled
    from the model. With ``per_tensor`` (OpenVINO, which can reshape a static batch dimension)
    each tensor missing from the config is added and a set max_batch_size is never refused.
    Raises INVALID_ARG (see :func:`autofill_max_batch_size`).
    """
    if not per_tensor and config.input and config.output:
        return config
    config = copy.deepcopy(config)
    inputs = [io for io in inputs if not io.optional]  # overridable initializers stay out of the config
    autofill_max_batch_size(config, [*inputs, *outputs], default_batch, strict=not per_tensor)
    mbs = int(config.max_batch_size)
    for kind, ios, cls in (("input", inputs, ModelInput), ("output", outputs, ModelOutput)):
        existing: list = getattr(config, kind)
        if existing and not per_tensor:
            continue
        known = {t.name for t in existing}
        existing.extend(_config_io(io, mbs, cls) for io in ios if io.name not in known)
    return config


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


def _compare_dims(model: str, tensor: str, model_shape: list[int], dims: list[int], mbs: int, exact: bool) -> None:
    if mbs > 0:
        if not model_shape or model_shape[0] != -1:
            raise invalid_arg(
                f"model '{model}', tensor '{tensor}': for the model to support batching the shape should have at "
                "least 1 dimension and the first dimension must be -1; but shape expected by the model is "
                f"{_shape_str(model_shape)}")
        full = [-1, *dims]
    else:
        full = list(dims)
    ok = len(model_shape) == len(full) and all(
        m == c for m, c in zip(model_shape, full, strict=True) if exact or m != -1)
    if not ok:
        extra = (" (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
                 f"making complete shape {_shape_str(full)})") if mbs > 0 else ""
        raise invalid_arg(
            f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} dimensions (shape "
            f"{_shape_str(model_shape)}) but the model configuration specifies {len(full)} dimensions{extra}")


def check_io(config: ModelConfig, inputs: Sequence[IOSpec], outputs: Sequence[IOSpec]) -> None:
    """Check the config's inputs and outputs against the model's, with Triton's messages.

    Every config tensor must exist in the model with the same data type and a compatible
    shape (a dynamic model dimension accepts any config value for inputs; outputs compare
    exactly); every required model input must be in the config. Raises INVALID_ARG.
    """
    name, mbs = config.name, int(config.max_batch_size)
    for kind, declared, ios, exact in (("input", config.input, inputs, False), ("output", config.output, outputs, True)):
        by_name = {io.name: io for io in ios}
        for tensor in declared:
            io = by_name.get(tensor.name)
            if io is None:
                raise invalid_arg(
                    f"unable to load model '{name}', unexpected inference {kind} '{tensor.name}', allowed {kind}s "
                    f"are: {', '.join(sorted(by_name))}")
            want = DataType(tensor.data_type).name
            if io.data_type != want:
                got = io.data_type or io.framework_type or "an unsupported type"
                raise invalid_arg(f"unable to load model '{name}', configuration expects datatype {want} for "
                                  f"{kind} '{tensor.name}', model provides {got}")
            if io.shape is None:
                continue
            dims = [int(d) for d in (tensor.reshape.shape if tensor.reshape is not None else tensor.dims)]
            if io.shape:
                _compare_dims(name, tensor.name, list(io.shape), dims, mbs, exact)
            elif any(d != 1 for d in dims):
                raise invalid_arg(
                    f"unable to load model '{name}', scalar tensor '{tensor.name}', should only provide 1 in the "
                    f"model configuration when the model doesn't support batching. Model configuration provided: "
                    f"{_shape_str(dims)}.")
    declared_inputs = {t.name for t in config.input}
    missing = [io.name for io in inputs if not io.optional and io.name not in declared_inputs]
    if missing:
        raise invalid_arg(
            f"unable to load model '{name}', configuration expects {len(config.input)} inputs, model provides "
            f"{sum(not io.optional for io in inputs)}: missing {missing}")


# ---------------------------------------------------------------- running batches

Run = Callable[[dict[str, np.ndarray], list[str]], dict[str, np.ndarray]]


def bytes_array(array: np.ndarray) -> np.ndarray:
    """``array`` as an object array of ``bytes`` (str is UTF-8 encoded), same shape."""
    if array.dtype == object and all(type(x) is bytes for x in array.reshape(-1)):
        return array
    return datatypes.to_bytes_array(array.reshape(-1).tolist()).reshape(array.shape)


def str_array(array: np.ndarray, name: str = "") -> np.ndarray:
    """A BYTES (object array of bytes) tensor as an object array of ``str``.

    Raises INVALID_ARG when an element is not UTF-8 (frameworks that hold text as ``str``,
    such as onnxruntime's string tensors, cannot take arbitrary bytes).
    """
    try:
        flat = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in array.reshape(-1).tolist()]
    except UnicodeDecodeError as e:
        raise invalid_arg(f"input '{name}' holds bytes that are not UTF-8 text ({e.reason} at byte {e.start}); "
                          "this model's string tensors take UTF-8 only") from None
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


def output_tensor(name: str, array: np.ndarray, datatype: str, *, cast: bool = False) -> Tensor:
    """A response tensor of ``datatype`` from a framework output.

    BYTES outputs become object arrays of bytes; BF16 outputs must already be uint16 bit
    patterns. Raises INTERNAL when the array's dtype differs from the config's, unless ``cast``.
    """
    array = np.asarray(array)
    if datatype == "BYTES":
        array = bytes_array(array)
    else:
        want = datatypes.numpy_dtype(datatype)
        if array.dtype != want:
            if not cast:
                raise internal(f"output '{name}' has data type {array.dtype}, the configuration expects {datatype}")
            array = array.astype(want)
        array = np.ascontiguousarray(array)
    return Tensor(name, datatype, tuple(int(d) for d in array.shape), array)


@dataclass
class _Spec:
    name: str
    datatype: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None


class BatchRunner:
    """Runs a batch of requests through one framework call per group of same-shaped requests.

    ``run(inputs, output_names)`` gets the merged (and config-reshaped) inputs and returns the
    named outputs with the batch dimension first when the model batches. ``translate`` turns a
    framework exception into a TritonError; a failing group fails only its own requests.
    """

    def __init__(self, config: ModelConfig, run: Run, translate: Callable[[Exception], TritonError],
                 *, cast_outputs: bool = False) -> None:
        self.batching = config.max_batch_size > 0
        self.run = run
        self.translate = translate
        self.cast_outputs = cast_outputs
        self.inputs = [_spec(i) for i in config.input]
        self.input_names = [s.name for s in self.inputs]
        self.outputs = {o.name: _spec(o) for o in config.output}

    def _signature(self, request: InferenceRequest) -> tuple:
        if not self.batching:
            return (id(request),)
        return tuple(sorted((t.name, t.datatype, tuple(t.shape[1:])) for t in request.inputs))

    def wanted(self, requests: Sequence[InferenceRequest]) -> list[str]:
        """The outputs any request of the batch needs, in config order (all when one asks for all)."""
        if any(not r.outputs for r in requests):
            return list(self.outputs)
        asked = {o.name for r in requests for o in r.outputs}
        return [n for n in self.outputs if n in asked]

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        """One response per request, in order (errors as responses with ``error`` set)."""
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(self._signature(r), []).append(i)
        responses: list[InferenceResponse] = [InferenceResponse() for _ in requests]
        for indices in groups.values():
            group = [requests[i] for i in indices]
            try:
                results = self._run_group(group)
            except TritonError as e:
                results = [InferenceResponse(error=e) for _ in group]
            except Exception as e:  # the framework's own exception types
                error = self.translate(e)
                results = [InferenceResponse(error=error) for _ in group]
            for i, response in zip(indices, results, strict=True):
                responses[i] = response
        return responses

    def _run_group(self, group: list[InferenceRequest]) -> list[InferenceResponse]:
        if self.batching:
            merged = merge_inputs(group, self.input_names)
            sizes = batch_sizes(group)
        else:
            merged = {t.name: t.data.reshape(t.shape) for t in group[0].inputs}
            sizes = [1]
        total = sum(sizes)
        for spec in self.inputs:
            if spec.reshape is not None and spec.name in merged:
                shape = (total, *spec.reshape) if self.batching else spec.reshape
                merged[spec.name] = merged[spec.name].reshape(shape)
        names = self.wanted(group)
        produced = self.run(merged, names)
        for name in names:
            if name not in produced:
                raise internal(f"the model did not produce output '{name}'")
            spec = self.outputs[name]
            if spec.reshape is not None:
                shape = (total, *spec.dims) if self.batching else spec.dims
                produced[name] = np.asarray(produced[name]).reshape(shape)
        parts = split_outputs({n: produced[n] for n in names}, sizes) if self.batching else [produced]
        responses = []
        for request, outs in zip(group, parts, strict=True):
            keep = [o.name for o in request.outputs] if request.outputs else names
            responses.append(InferenceResponse(outputs=[
                output_tensor(n, outs[n], self.outputs[n].datatype, cast=self.cast_outputs) for n in keep
            ]))
        return responses


def closed_run(inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """What a finalized instance's runner calls: the model is gone. Raises UNAVAILABLE."""
    raise unavailable("the model instance has been unloaded")


def _spec(io: ModelInput | ModelOutput) -> _Spec:
    reshape = tuple(int(d) for d in io.reshape.shape) if io.reshape is not None else None
    return _Spec(io.name, cfg.api_datatype(io.data_type), tuple(int(d) for d in io.dims), reshape)
