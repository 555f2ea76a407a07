"""Triton's model-configuration validation (``ValidateModelConfig``, ``ValidateModelIOConfig``,
``ValidateInstanceGroup`` of Triton core), with Triton's messages.

:func:`validate_config` runs on a config that has been through backend auto-complete and
:func:`trident.config.complete_defaults`; it is re-exported by :mod:`trident.config`.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from trident.errors import TritonError, invalid_arg
from trident.protocol.generated.inference import (
    BatchInputKind,
    DataType,
    ModelConfig,
    ModelInput,
    ModelInputFormat,
    ModelInstanceGroupKind,
    ModelOutput,
    ModelQueuePolicyTimeoutAction,
    ModelSequenceBatching,
    ModelSequenceBatchingControlKind,
)

__all__ = ["ENSEMBLE_PLATFORM", "FILE_PARAMETERS", "confine_model_files", "validate_config"]

INLINE_PARAMETER = "TRIDENT_INLINE_EXECUTION"  # where a model's batches run: auto (default) | always | never
INLINE_MODES = ("auto", "always", "never")
ENSEMBLE_PLATFORM = "ensemble"
TENSORRT_PLATFORM = "tensorrt_plan"
# known backends and the platforms they accept (Triton's GetBackendType / FromPlatform)
_BACKEND_PLATFORMS = {
    "tensorflow": ("tensorflow_graphdef", "tensorflow_savedmodel"),
    "tensorrt": (TENSORRT_PLATFORM,),
    "onnxruntime": ("onnxruntime_onnx",),
    "pytorch": ("pytorch_libtorch", "torch_aoti"),
}
_CORRID_TYPES = (DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32,
                 DataType.TYPE_STRING)  # fmt: skip


def validate_config(config: ModelConfig, model_name: str, model_dir: Path, *, gpu_count: int = 0) -> None:
    """Check a completed config the way Triton does before it loads a model.

    ``model_name`` is the model's folder name, ``model_dir`` the folder (label files are looked
    up there), GPUs ``0..gpu_count-1`` exist. Raises INVALID_ARG with Triton's message for the
    first problem found: a name that differs from the folder, a missing or mismatched
    platform/backend, negative ``max_batch_size``, a bad version policy, bad inputs/outputs
    (name, data type, dims, reshape, duplicates, formats), bad batch inputs/outputs, dynamic or
    sequence batching settings out of range, ensemble steps that do not connect, instance groups
    with missing counts or unavailable GPUs, label files that are missing or outside the folder.
    """
    name = config.name
    if not name:
        raise invalid_arg("model configuration must specify 'name'")
    if name != model_name:
        raise invalid_arg(
            f"unexpected directory name '{model_name}' for model '{name}', directory name must equal model name"
        )
    _validate_platform(config)
    # model_repository_agents: checked (agents known, within bounds) by the repository, which runs them
    if config.max_batch_size < 0:
        raise invalid_arg(f"'max_batch_size' must be non-negative value for {name}")
    policy = config.version_policy
    if policy is None:
        raise invalid_arg(f"must specify 'version policy' for {name}")
    if policy.specific is not None and not policy.specific.versions:
        raise invalid_arg(f"'specific' version policy must list at least one version for {name}")
    _validate_dynamic_batching(config)
    if config.sequence_batching is not None:
        _validate_sequence_batching(config, config.sequence_batching)
    if config.ensemble_scheduling is not None:
        _validate_ensemble(config)
    elif config.platform == ENSEMBLE_PLATFORM:
        raise invalid_arg(
            f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}"
        )
    decoupled = config.model_transaction_policy is not None and config.model_transaction_policy.decoupled
    if decoupled and config.response_cache is not None and config.response_cache.enable:
        raise invalid_arg(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. "
            "Please disable the response cache."
        )
    if config.model_metrics is not None:
        for control in config.model_metrics.metric_control:
            if control.metric_identifier is None:
                raise invalid_arg("metric control must specify 'metric_identifier'")
            if not control.metric_identifier.family:
                raise invalid_arg("metric identifier must specify non-empty 'family'")
            if control.histogram_options is None:
                raise invalid_arg("metric control must specify 'histogram_options'")
            if not control.histogram_options.buckets:
                raise invalid_arg("histogram options must specify non-empty 'buckets'")
    _validate_io(config)
    _validate_instance_groups(config, gpu_count)
    _validate_inline_parameter(config)
    confine_model_files(config, model_dir)
    _validate_label_files(config, model_dir)


def _validate_platform(config: ModelConfig) -> None:
    name, platform, backend = config.name, config.platform, config.backend
    if not backend:
        if not platform:
            raise invalid_arg(f"must specify 'platform' or 'backend' for '{name}'")
        if platform != ENSEMBLE_PLATFORM:
            raise invalid_arg(f"unexpected platform type '{platform}' for {name}")
    elif platform == ENSEMBLE_PLATFORM:
        raise invalid_arg(
            f"Ensemble model '{name}' must have platform type '{platform}' and empty backend type"
        )
    allowed = _BACKEND_PLATFORMS.get(backend)
    if allowed is not None and platform not in allowed:
        raise invalid_arg(f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}")


def _validate_dynamic_batching(config: ModelConfig) -> None:
    batching, name = config.dynamic_batching, config.name
    if batching is None:
        return
    for size in batching.preferred_batch_size:
        if size <= 0:
            raise invalid_arg(f"dynamic batching preferred size must be positive for {name}")
        if size > config.max_batch_size:
            raise invalid_arg(f"dynamic batching preferred size must be <= max batch size for {name}")
    levels = batching.priority_levels
    if levels != 0:
        if not 1 <= batching.default_priority_level <= levels:
            raise invalid_arg(f"default priority level must be in range [1, {levels}] for {name}")
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                raise invalid_arg(
                    f"priority queue policy must have priority level in range [1, {levels}] for {name}"
                )
    if batching.preserve_ordering:
        if levels > 1:
            raise invalid_arg(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
            )
        policies = list(batching.priority_queue_policy.values())
        if batching.default_queue_policy is not None:
            policies.append(batching.default_queue_policy)
        for policy in policies:
            if (
                policy.default_timeout_microseconds != 0
                and policy.timeout_action == ModelQueuePolicyTimeoutAction.DELAY
            ):
                raise invalid_arg(
                    f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}"
                )


def _validate_sequence_batching(config: ModelConfig, batcher: ModelSequenceBatching) -> None:
    name = config.name
    if config.response_cache is not None and config.response_cache.enable:
        raise invalid_arg(
            f"Response Cache does not currently support model {name} with sequence batching scheduler. "
            "Please disable the response cache."
        )
    seen_tensors: set[str] = set()
    for control_input in batcher.control_input:
        if not control_input.name:
            raise invalid_arg(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen_tensors:
            raise invalid_arg(
                f"sequence batching control tensor '{control_input.name}' is specified for multiple "
                f"control kinds for {name}"
            )
        seen_tensors.add(control_input.name)
    for kind in ModelSequenceBatchingControlKind:
        kind_name = kind.name
        controls = [c for ci in batcher.control_input for c in ci.control if c.kind == kind]
        if len(controls) > 1:
            raise invalid_arg(f"sequence batching specifies multiple {kind_name} tensors for {name}")
        for c in controls:
            given = [n for n, v in (("int32_false_true", c.int32_false_true), ("fp32_false_true", c.fp32_false_true),
                                    ("bool_false_true", c.bool_false_true)) if v]  # fmt: skip
            if kind == ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_CORRID:
                if given:
                    raise invalid_arg(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {kind_name} for {name}"
                    )
                if c.data_type not in _CORRID_TYPES:
                    raise invalid_arg(
                        f"unexpected data type for control {kind_name} for {name}. Allowed data types are "
                        "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
                    )
                continue
            if not given:
                raise invalid_arg(
                    "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {kind_name} for {name}"
                )
            if len(given) > 1:
                raise invalid_arg(
                    "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
                    f"and 'bool_false_true' for {kind_name} for {name}"
                )
            if len(getattr(c, given[0])) != 2:
                raise invalid_arg(
                    f"sequence batching control '{given[0]}' must have exactly 2 entries for {kind_name} for {name}"
                )
    if batcher.oldest is not None:
        for size in batcher.oldest.preferred_batch_size:
            if size <= 0:
                raise invalid_arg(f"sequence batching preferred batch size must be positive for {name}")
            if size > config.max_batch_size:
                raise invalid_arg(
                    f"sequence batching preferred batch size must be <= max batch size for {name}"
                )
    if batcher.direct is not None and not 0.0 <= batcher.direct.minimum_slot_utilization <= 1.0:
        raise invalid_arg(
            f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
        )


def _validate_ensemble(config: ModelConfig) -> None:
    name = config.name
    assert config.ensemble_scheduling is not None
    if config.platform != ENSEMBLE_PLATFORM:
        raise invalid_arg(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}"
        )
    if config.instance_group:
        raise invalid_arg(f"instance group should not be specified for ensemble '{name}'")
    if config.optimization is not None:
        raise invalid_arg(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise invalid_arg(f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if not steps:
        raise invalid_arg(f"must specify 'step' for ensemble '{name}'")
    produced: set[str] = set()
    consumed: set[str] = set()
    for index, step in enumerate(steps):
        for what, value in (("model_name", step.model_name), ("input_map", step.input_map),
                            ("output_map", step.output_map)):  # fmt: skip
            if not value:
                raise invalid_arg(f"must specify '{what}' in step {index} of ensemble '{name}'")
        for tensor in step.output_map.values():
            if tensor in produced:
                raise invalid_arg(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' "
                    f"step {index}"
                )
            produced.add(tensor)
        consumed.update(step.input_map.values())
    cycle = find_cycle([(dict(s.input_map), dict(s.output_map)) for s in steps])
    if cycle is not None:
        models = " -> ".join(f"step {i} (model '{steps[i].model_name}')" for i in cycle)
        raise invalid_arg(f"in ensemble '{name}', circular dependency between steps: {models}")
    tensors = produced | consumed
    ready = {i.name for i in config.input}
    for tensor in ready:
        if tensor not in tensors:
            raise invalid_arg(f"ensemble input '{tensor}' for ensemble {name}' is not used")
    pending = list(steps)
    progress = True
    while progress:  # a step runs once all its inputs are ready; its outputs become ready
        progress = False
        for step in list(pending):
            if all(t in ready for t in step.input_map.values()):
                ready.update(step.output_map.values())
                pending.remove(step)
                progress = True
    outputs = {o.name for o in config.output}
    for tensor in sorted(outputs):
        if tensor not in tensors:
            raise invalid_arg(f"ensemble output '{tensor}' for ensemble {name}' is not used")
        if tensor not in ready:
            raise invalid_arg(f"output '{tensor}' for ensemble '{name}' is not written")
    for tensor in sorted(tensors - outputs):
        if tensor not in ready or tensor not in consumed:
            raise invalid_arg(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def find_cycle(steps: list[tuple[dict[str, str], dict[str, str]]]) -> list[int] | None:
    """Indices of steps that form a cycle through their tensors (first step repeated last), or None.

    ``steps`` holds each step's (input_map, output_map).
    """
    producer = {tensor: i for i, (_, outputs) in enumerate(steps) for tensor in outputs.values()}
    edges = [sorted({producer[t] for t in inputs.values() if t in producer}) for inputs, _ in steps]
    state = [0] * len(steps)  # 0 new, 1 on the path, 2 done
    path: list[int] = []

    def visit(i: int) -> list[int] | None:
        state[i] = 1
        path.append(i)
        for j in edges[i]:
            if state[j] == 1:
                return [*path[path.index(j):], j]
            if state[j] == 0:
                found = visit(j)
                if found is not None:
                    return found
        path.pop()
        state[i] = 2
        return None

    for i in range(len(steps)):
        if state[i] == 0:
            found = visit(i)
            if found is not None:
                return list(reversed(found))  # producer before consumer
    return None



def _validate_io_shape(io: ModelInput | ModelOutput, max_batch_size: int, prefix: str) -> None:
    if not io.name:
        raise invalid_arg(f"{prefix}must specify 'name'")
    prefix = f"{prefix}'{io.name}' "
    if io.data_type == DataType.TYPE_INVALID:
        raise invalid_arg(f"{prefix}must specify 'data_type'")
    if not io.dims:
        raise invalid_arg(f"{prefix}must specify 'dims'")
    if io.reshape is not None and not io.reshape.shape and max_batch_size == 0:
        raise invalid_arg(
            f"{prefix}cannot have empty reshape for non-batching model as scalar tensors are not supported"
        )
    if any(d < 1 and d != -1 for d in io.dims):
        raise invalid_arg(
            f"{prefix}dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
        )
    if io.reshape is None:
        return
    shape = io.reshape.shape
    if any(d < 1 and d != -1 for d in shape):
        raise invalid_arg(
            f"{prefix}reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
        )
    # element counts between variable-size dimensions must agree ([2,4,-1,6] -> [8,-1,1,6]);
    # an empty reshape (scalar) needs dims with one element
    dims_chunks, shape_chunks = _chunks(io.dims), _chunks(shape)
    if not shape:
        if dims_chunks != [1]:
            raise invalid_arg(f"{prefix}has different size for dims and reshape")
    elif len(dims_chunks) != len(shape_chunks):
        raise invalid_arg(f"{prefix}has different number of variable-size dimensions for dims and reshape")
    elif dims_chunks != shape_chunks:
        raise invalid_arg(f"{prefix}has different size for dims and reshape")


def _chunks(dims: list[int]) -> list[int]:
    counts, current = [], 1
    for d in dims:
        if d == -1:
            counts.append(current)
            current = 1
        else:
            current *= d
    counts.append(current)
    return counts


def _validate_io(config: ModelConfig) -> None:
    name, mbs, platform = config.name, config.max_batch_size, config.platform
    for kind, ios in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for io in ios:
            try:
                _validate_io_shape(io, mbs, f"model {kind} ")
                if isinstance(io, ModelInput) and io.format in (ModelInputFormat.NHWC, ModelInputFormat.NCHW):
                    if len(io.dims) != 3:
                        raise invalid_arg("model input NHWC/NCHW require 3 dims")
                if io.is_shape_tensor and platform != TENSORRT_PLATFORM:
                    raise invalid_arg("shape tensors are only supported for TensorRT platform")
                if io.is_non_linear_format_io:
                    if platform != TENSORRT_PLATFORM:
                        raise invalid_arg("Non-linear IO format is only supported for the TensorRT platform")
                    if len(io.dims) != 3:
                        raise invalid_arg(f"Non-linear IO format {kind} requires 3 dims")
                if io.name in seen:
                    raise invalid_arg(f"model {kind} '{io.name}' is specified more than once")
            except TritonError as exc:
                raise invalid_arg(f"{exc.message} for {name}") from None
            seen.add(io.name)
    inputs = {i.name for i in config.input}
    outputs = {o.name for o in config.output}
    for batch_input in config.batch_input:
        kind_name = BatchInputKind(batch_input.kind).name or str(int(batch_input.kind))
        if len(batch_input.source_input) != 1:
            raise invalid_arg(
                f"batch input kind '{kind_name}' expects 1 source input, got {len(batch_input.source_input)} for {name}"
            )
        if batch_input.data_type not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
            raise invalid_arg(f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {name}")
        for source in batch_input.source_input:
            if source not in inputs:
                raise invalid_arg(f"unknown source input name '{source}' for {name}")
    for batch_output in config.batch_output:
        if len(batch_output.source_input) != 1:
            raise invalid_arg(
                "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, "
                f"got {len(batch_output.source_input)} for {name}"
            )
        for source in batch_output.source_input:
            if source not in inputs:
                raise invalid_arg(f"unknown source input name '{source}' for {name}")
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise invalid_arg(f"unknown target output name '{target}' for {name}")
            if target in targets:
                raise invalid_arg(f"target output name '{target}' can only be specified once for {name}")
            targets.add(target)


def _validate_instance_groups(config: ModelConfig, gpu_count: int) -> None:
    name = config.name
    if config.ensemble_scheduling is not None:
        return
    if not config.instance_group:
        raise invalid_arg(f"must specify one or more 'instance group's for {name}")
    for group in config.instance_group:
        where = f"instance group {group.name} of model {name}"
        if group.count < 1:
            raise invalid_arg(f"{where} must have a 'count' of at least 1, got {group.count}")
        if group.kind == ModelInstanceGroupKind.GPU:
            if not group.gpus:
                if gpu_count == 0:
                    raise invalid_arg(f"{where} has kind KIND_GPU but no GPUs are available")
                raise invalid_arg(f"{where} has kind KIND_GPU but specifies no GPUs")
            for gpu in group.gpus:
                if not 0 <= gpu < gpu_count:
                    available = ", ".join(str(g) for g in range(gpu_count)) or "none"
                    raise invalid_arg(
                        f"{where} specifies invalid or unsupported gpu id {gpu}. GPUs available: {available}"
                    )
        elif group.kind in (ModelInstanceGroupKind.CPU, ModelInstanceGroupKind.MODEL):
            if group.gpus:
                raise invalid_arg(f"{where} has kind {group.kind.proto_name} but specifies one or more GPUs")
        else:
            raise invalid_arg(f"{where} has unexpected kind {group.kind.proto_name or int(group.kind)}")
        if group.profile:
            if config.platform != TENSORRT_PLATFORM:
                raise invalid_arg(
                    f"{where} and platform {config.platform} specifies profile field which is only supported "
                    "for TensorRT models"
                )
            for profile in group.profile:
                if not (profile.isascii() and profile.isdigit()):
                    raise invalid_arg(
                        f"{where} and platform {config.platform} specifies invalid profile {profile}. The field "
                        "should contain the string representation of a non-negative integer."
                    )


# backend parameters that name a file the backend opens or loads as code (relative to the
# model's folder); like default_model_filename they must stay inside it
FILE_PARAMETERS = ("CPU_EXTENSION_PATH",)


def _inside(root: Path, path: Path) -> bool:
    return path != root and path.is_relative_to(root)


def _check_file_name(value: str, what: str, model: str, *, relative: bool = True) -> None:
    if "\0" in value or len(value) > 4096 or any(len(part.encode()) > 255 for part in value.split("/")):
        raise invalid_arg(f"{what} of model '{model}' is not a valid file name")
    if not relative:
        return
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts:
        raise invalid_arg(f"{what} '{value}' of model '{model}' must name a file inside the model's folder")


def confine_model_files(config: ModelConfig, model_dir: Path) -> None:
    """Refuse a config that names a model file outside ``model_dir``, after resolving symlinks.

    Checks ``default_model_filename`` (against every version folder), ``label_filename`` and
    the backend parameters in FILE_PARAMETERS (relative to the model folder). Runs before a
    backend opens, imports or auto-completes from a file: a config from the load API is
    client input, and e.g. ``default_model_filename: "../../x.py"`` would import any Python
    file on the host. Blocking (resolves paths). Raises INVALID_ARG naming the field.
    """
    name = config.name or model_dir.name
    root = model_dir.resolve()
    filename = config.default_model_filename
    if filename:
        _check_file_name(filename, "default_model_filename", name)
        versions = [root / str(v) for v in list_version_dirs(root)] or [root / "1"]
        for version_dir in versions:
            if not _inside(version_dir.resolve(), (version_dir / filename).resolve()):
                raise invalid_arg(
                    f"default_model_filename '{filename}' of model '{name}' must name a file inside its version folder"
                )
    for key in FILE_PARAMETERS:
        param = config.parameters.get(key)
        value = param.string_value if param is not None else ""
        if value:
            _check_file_name(value, f"parameter {key}", name)
            if not _inside(root, (root / value).resolve()):
                raise invalid_arg(f"parameter {key} '{value}' of model '{name}' must name a file inside the model's folder")
    for output in config.output:
        if output.label_filename:
            # where it points is checked with the file itself (_validate_label_files)
            _check_file_name(output.label_filename, f"label file of output '{output.name}'", name, relative=False)


def _validate_inline_parameter(config: ModelConfig) -> None:
    param = config.parameters.get(INLINE_PARAMETER)
    if param is not None and param.string_value.strip().lower() not in INLINE_MODES:
        raise invalid_arg(f"parameter {INLINE_PARAMETER} of model '{config.name}' must be one of "
                          f"{', '.join(INLINE_MODES)}, got '{param.string_value}'")


def _validate_label_files(config: ModelConfig, model_dir: Path) -> None:
    root = model_dir.resolve()
    for output in config.output:
        label = output.label_filename
        if not label:
            continue
        path = (root / label).resolve()
        if not path.is_relative_to(root) or path == root:
            raise invalid_arg(
                f"label file '{label}' of output '{output.name}' must be inside the folder of model {config.name}"
            )
        if not path.is_file():
            raise invalid_arg(f"label file '{label}' of output '{output.name}' not found for {config.name}")


def list_version_dirs(model_dir: Path) -> list[int]:
    """Version numbers of ``model_dir``'s numeric sub-folders, ascending.

    As Triton does, names that are not all digits and names with a leading ``0`` (other than
    ``0`` itself) are ignored. A missing or unreadable folder has no versions.
    """
    versions: list[int] = []
    try:
        entries = list(os.scandir(model_dir))
    except OSError:
        return versions
    for entry in entries:
        name = entry.name
        if not (name.isascii() and name.isdigit()) or (len(name) > 1 and name[0] == "0"):
            continue
        try:
            if entry.is_dir():
                versions.append(int(name))
        except OSError:
            continue
    versions.sort()
    return versions
