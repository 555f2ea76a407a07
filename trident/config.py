"""Triton's model-configuration semantics on top of the config.pbtxt parser.

Reading (:func:`read_model_config`), the JSON form used by the model-config endpoint and the
load API's ``config`` override (:func:`config_to_json`, :func:`config_from_json`), Triton's
defaults (:func:`complete_defaults`, :func:`enable_default_dynamic_batching`), validation
(:func:`validate_config`), shape helpers and the version policy.

The usual order when loading a model, as in Triton: read, backend auto-complete (inputs,
outputs, max_batch_size; :func:`enable_default_dynamic_batching` where the backend does that),
:func:`complete_defaults`, :func:`validate_config`, :func:`select_versions`.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trident.config_validation import (
    ENSEMBLE_PLATFORM,
    INLINE_MODES,
    INLINE_PARAMETER,
    list_version_dirs,
    validate_config,
)
from trident.errors import invalid_arg
from trident.protocol import datatypes
from trident.protocol.generated.inference import (
    DataType,
    ModelConfig,
    ModelDynamicBatching,
    ModelInput,
    ModelInstanceGroup,
    ModelInstanceGroupKind,
    ModelOptimizationPolicy,
    ModelOptimizationPolicyPinnedMemoryBuffer,
    ModelOutput,
    ModelTransactionPolicy,
    ModelVersionPolicy,
    ModelVersionPolicyLatest,
)
from trident.protocol.msgmeta import enum_names, message_from_json, message_to_json
from trident.protocol.pbtxt import parse_pbtxt

__all__ = [
    "CONFIG_FILENAME",
    "ENSEMBLE_PLATFORM",
    "INLINE_MODES",
    "INLINE_PARAMETER",
    "api_datatype",
    "complete_defaults",
    "config_from_json",
    "config_to_json",
    "enable_default_dynamic_batching",
    "full_shape",
    "list_version_dirs",
    "read_model_config",
    "select_versions",
    "validate_config",
]

CONFIG_FILENAME = "config.pbtxt"
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000

# ---------------------------------------------------------------- reading


def read_model_config(model_dir: Path, *, config_name: str = "") -> ModelConfig:
    """Parse ``<model_dir>/config.pbtxt``, or ``configs/<config_name>.pbtxt`` when given and present.

    As in Triton, a named config that does not exist falls back to ``config.pbtxt``; a missing
    ``config.pbtxt`` gives an empty :class:`ModelConfig` (auto-complete may fill it).
    Raises :class:`~trident.protocol.pbtxt.PbtxtError` (INVALID_ARG, with file, line and column)
    for a malformed file and INVALID_ARG when the file cannot be read.
    """
    path = model_dir / CONFIG_FILENAME
    if config_name:
        if "/" in config_name or "\\" in config_name or config_name in (".", ".."):
            raise invalid_arg(f"invalid model config name '{config_name}'")
        named = model_dir / "configs" / f"{config_name}.pbtxt"
        if named.is_file():
            path = named
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ModelConfig()
    except OSError as exc:
        raise invalid_arg(f"failed to read model configuration {path}: {exc.strerror or exc}") from None
    return parse_pbtxt(data, filename=str(path))


# ---------------------------------------------------------------- JSON


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """Triton's JSON form of a config (GET /v2/models/<m>/config), ready for ``json.dumps``.

    Proto field names; every field without presence printed with its default; unset messages
    and oneof members omitted; enums by name; 64-bit integers as JSON numbers (Triton's
    ``ModelConfigToJson`` fix-up; map keys stay strings); NaN/Infinity as strings.
    """
    return message_to_json(config)


def config_from_json(text: str | bytes) -> ModelConfig:
    """A :class:`ModelConfig` from its JSON form (the load API's ``config`` parameter).

    Accepts proto (snake_case) and lowerCamelCase field names, enums by name (case-insensitive)
    or number, 64-bit integers as numbers or strings. Raises INVALID_ARG for malformed JSON,
    unknown fields and values of the wrong type or range.
    """
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_arg(f"failed to parse model configuration JSON: {exc}") from None
    return message_from_json(ModelConfig, raw)


# ---------------------------------------------------------------- defaults

_TF_SAVEDMODEL = ("tensorflow_savedmodel", "model.savedmodel")
_TF_GRAPHDEF = ("tensorflow_graphdef", "model.graphdef")


def _complete_backend_fields(config: ModelConfig, model_name: str, model_dir: Path | None) -> None:
    """Triton's ``AutoCompleteBackendFields``: backend, platform and default file name from each
    other and, with ``model_dir``, from the files of the lowest version folder."""
    versions = list_version_dirs(model_dir) if model_dir is not None else []
    version_path = model_dir / str(versions[0]) if model_dir is not None and versions else None
    try:
        content = set(os.listdir(version_path)) if version_path is not None else set()
    except OSError:
        content = set()

    def found(name: str, *, directory: bool | None = None) -> bool:
        if name not in content or version_path is None:
            return False
        return directory is None or (version_path / name).is_dir() == directory

    bare = not config.platform and not config.default_model_filename and bool(versions)
    if not config.platform and config.backend in ("", "tensorflow"):
        for platform, filename in (_TF_SAVEDMODEL, _TF_GRAPHDEF):
            if config.default_model_filename == filename:
                config.platform = platform
        if not config.default_model_filename and versions:
            if found(_TF_SAVEDMODEL[1], directory=True):
                config.platform = _TF_SAVEDMODEL[0]
            if found(_TF_GRAPHDEF[1], directory=False):
                config.platform = _TF_GRAPHDEF[0]
    for platform, filename in (_TF_SAVEDMODEL, _TF_GRAPHDEF):
        if config.platform == platform:
            config.backend = config.backend or "tensorflow"
            config.default_model_filename = config.default_model_filename or filename
            return
    # (backend, platform, default file, file must be a regular file)
    for backend, platform, filename, is_file in (
        ("tensorrt", "tensorrt_plan", "model.plan", True),
        ("onnxruntime", "onnxruntime_onnx", "model.onnx", None),
        ("openvino", "", "model.xml", None),
    ):
        if not config.backend:
            if (platform and config.platform == platform) or config.default_model_filename == filename:
                config.backend = backend
            elif bare and found(filename, directory=None if is_file is None else not is_file):
                config.backend = backend
        if config.backend == backend:
            config.platform = config.platform or platform
            config.default_model_filename = config.default_model_filename or filename
            return
    if not config.backend:
        if config.platform == "pytorch_libtorch" or config.default_model_filename == "model.pt":
            config.backend = "pytorch"
        elif bare and found("model.pt", directory=False):
            config.backend, config.platform = "pytorch", "pytorch_libtorch"
    if config.backend == "pytorch":
        if not config.platform:
            config.platform = "pytorch_libtorch"
            config.default_model_filename = config.default_model_filename or "model.pt"
        return
    if not config.backend:
        if config.default_model_filename == "model.py" or (bare and found("model.py")):
            config.backend = "python"
    if config.backend == "python":
        config.default_model_filename = config.default_model_filename or "model.py"
        return
    if (
        not config.backend
        and not config.platform
        and not config.default_model_filename
        and model_dir is not None
    ):
        _, dot, backend = model_name.partition(".")
        if not dot or not backend:
            raise invalid_arg(
                f"Invalid model name: Could not determine backend for model '{model_name}' with no "
                "backend in model configuration. Expected model name of the form 'model.<backend_name>'."
            )
        config.backend = backend
        config.default_model_filename = f"model.{backend}"


def _default_instance_count(group: ModelInstanceGroup, backend: str) -> int:
    if group.kind == ModelInstanceGroupKind.CPU and backend in ("tensorflow", "onnxruntime"):
        return 2
    return 1


def _complete_instance_groups(config: ModelConfig, gpu_count: int) -> None:
    """Triton's ``NormalizeInstanceGroup`` with GPUs ``0..gpu_count-1`` available."""
    gpus = list(range(gpu_count))
    if not config.instance_group:
        config.instance_group.append(ModelInstanceGroup(name=config.name))
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == ModelInstanceGroupKind.AUTO:
            if not gpus or any(g not in gpus for g in group.gpus):
                group.kind = ModelInstanceGroupKind.CPU
            else:
                group.kind = ModelInstanceGroupKind.GPU
        if group.count < 1:
            group.count = _default_instance_count(group, config.backend)
        if group.kind == ModelInstanceGroupKind.GPU and not group.gpus:
            group.gpus = list(gpus)


def complete_defaults(
    config: ModelConfig, model_name: str, *, gpu_count: int = 0, model_dir: Path | None = None
) -> ModelConfig:
    """A copy of ``config`` with Triton's defaults filled in; ``config`` is left unchanged.

    * ``name`` defaults to ``model_name`` (the folder name);
    * backend, platform and ``default_model_filename`` completed from each other (backend
      ``onnxruntime`` -> platform ``onnxruntime_onnx`` and file ``model.onnx``, ...) and, with
      ``model_dir``, from the files of the lowest version folder (``model.onnx`` ->
      onnxruntime, ``model.py`` -> python, ...; a folder named ``x.<backend>`` with nothing
      else to go on names a custom backend), as Triton's server-side auto-complete does;
    * ``version_policy`` defaults to ``latest { num_versions: 1 }``;
    * dynamic batching without ``preferred_batch_size`` prefers ``max_batch_size``; sequence
      batching idles out after 1 s unless set; the oldest strategy prefers ``max_batch_size``;
    * except for ensembles: pinned input/output memory enabled in ``optimization``, and the
      instance groups: one group named after the model when none is given; each group named
      ``<model>_<index>`` when unnamed, ``KIND_AUTO`` resolved to GPU when ``gpu_count > 0``
      (and its listed GPUs exist) else CPU, ``count`` 1 when unset (2 for CPU groups of the
      onnxruntime and tensorflow backends), ``KIND_GPU`` without ``gpus`` on every GPU;
    * ``model_transaction_policy`` defaults to ``{decoupled: false}``.

    Raises INVALID_ARG only when ``model_dir`` is given and no backend can be determined.
    """
    config = copy.deepcopy(config)
    if not config.name:
        config.name = model_name
    _complete_backend_fields(config, model_name, model_dir)
    if config.version_policy is None:
        config.version_policy = ModelVersionPolicy(latest=ModelVersionPolicyLatest(num_versions=1))
    if config.dynamic_batching is not None and not config.dynamic_batching.preferred_batch_size:
        if config.max_batch_size > 0:
            config.dynamic_batching.preferred_batch_size = [config.max_batch_size]
    sequence = config.sequence_batching
    if sequence is not None:
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
        if sequence.oldest is not None and not sequence.oldest.preferred_batch_size:
            if config.max_batch_size > 0:
                sequence.oldest.preferred_batch_size = [config.max_batch_size]
    if config.ensemble_scheduling is None:
        if config.optimization is None:
            config.optimization = ModelOptimizationPolicy()
        if config.optimization.input_pinned_memory is None:
            config.optimization.input_pinned_memory = ModelOptimizationPolicyPinnedMemoryBuffer(enable=True)
        if config.optimization.output_pinned_memory is None:
            config.optimization.output_pinned_memory = ModelOptimizationPolicyPinnedMemoryBuffer(enable=True)
        _complete_instance_groups(config, gpu_count)
    if config.model_transaction_policy is None:
        config.model_transaction_policy = ModelTransactionPolicy()
    return config


def enable_default_dynamic_batching(config: ModelConfig) -> bool:
    """Turn on ``dynamic_batching {}`` when ``max_batch_size > 1`` and no scheduler is chosen.

    What Triton's onnxruntime/TensorRT auto-complete does; backends that behave so call it
    before :func:`complete_defaults`. Mutates ``config``; returns whether it changed it.
    """
    if config.max_batch_size > 1 and (
        config.dynamic_batching is None
        and config.sequence_batching is None
        and config.ensemble_scheduling is None
    ):
        config.dynamic_batching = ModelDynamicBatching()
        return True
    return False


# ---------------------------------------------------------------- shapes and datatypes


def full_shape(io: ModelInput | ModelOutput, max_batch_size: int) -> list[int]:
    """The shape clients see: ``dims`` with a ``-1`` batch dimension first when batching."""
    dims = [int(d) for d in io.dims]
    return [-1, *dims] if max_batch_size > 0 else dims


def api_datatype(data_type: DataType | int) -> str:
    """API datatype string of a config data type (``TYPE_FP32`` -> ``FP32``, ``TYPE_STRING`` -> ``BYTES``).

    Raises INVALID_ARG for ``TYPE_INVALID`` and unknown numbers.
    """
    name = enum_names(DataType).get(int(data_type))
    if name is None or name == "TYPE_INVALID":
        raise invalid_arg(f"invalid data type {name or int(data_type)}")
    return datatypes.config_to_api(name)


# ---------------------------------------------------------------- versions


def select_versions(policy: ModelVersionPolicy | None, available: Iterable[int]) -> list[int]:
    """The versions a policy serves out of ``available``, ascending (pure).

    ``latest {num_versions: N}``: the N highest; ``all`` (or a policy with no choice): all;
    ``specific``: the listed versions that exist. ``None`` means the default ``latest 1``.
    """
    existing = sorted(set(available))
    if policy is None:
        policy = ModelVersionPolicy(latest=ModelVersionPolicyLatest(num_versions=1))
    if policy.specific is not None:
        present = set(existing)
        return sorted({int(v) for v in policy.specific.versions if v in present})
    if policy.latest is not None:
        count = policy.latest.num_versions
        return existing[-count:] if count > 0 else []
    return existing
