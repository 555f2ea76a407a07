"""validate_config: Triton's checks and messages, on configs completed with complete_defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from trident.config import complete_defaults, validate_config
from trident.errors import Code, TritonError
from trident.protocol.pbtxt import parse_pbtxt

BASE = 'name: "m" backend: "python" '
IO = 'input { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } '


def _check(text: str, tmp_path: Path, *, gpu_count: int = 0, name: str = "m") -> None:
    config = complete_defaults(parse_pbtxt(text), name, gpu_count=gpu_count)
    validate_config(config, name, tmp_path, gpu_count=gpu_count)


def _fails(text: str, tmp_path: Path, match: str, *, gpu_count: int = 0, name: str = "m") -> str:
    with pytest.raises(TritonError) as info:
        _check(text, tmp_path, gpu_count=gpu_count, name=name)
    assert info.value.code is Code.INVALID_ARG
    assert match in info.value.message, info.value.message
    return info.value.message


VALID = [
    BASE + IO,
    BASE + "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2, 8 ] } " + IO,
    BASE
    + "max_batch_size: 8 "
    + 'input { name: "S" data_type: TYPE_INT32 dims: [ 1 ] reshape { shape: [ ] } }',
    BASE
    + 'input { name: "V" data_type: TYPE_STRING dims: [ 2, 4, -1, 6 ] reshape { shape: [ 8, -1, 1, 6 ] } }',
    BASE + 'input { name: "I" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] }',
    'name: "m" backend: "onnxruntime" ' + IO,
    'name: "m" platform: "onnxruntime_onnx" ' + IO,
    'name: "m" backend: "custom_thing" platform: "whatever" ' + IO,
    BASE + "version_policy { specific { versions: [ 1 ] } }",
    BASE + "max_batch_size: 4 dynamic_batching { priority_levels: 3 default_priority_level: 2 "
    "priority_queue_policy { key: 3 value { max_queue_size: 1 } } }",
    BASE + "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY } }",
    BASE + "max_batch_size: 4 sequence_batching { control_input ["
    ' { name: "START" control { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } },'
    ' { name: "CORRID" control { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } } ]'
    " oldest { preferred_batch_size: [ 4 ] } }",
    BASE + "sequence_batching { direct { minimum_slot_utilization: 1.0 } }",
    BASE
    + 'batch_input { kind: BATCH_ITEM_SHAPE target_name: "T" data_type: TYPE_INT32 source_input: "IN" } '
    + IO,
    BASE + 'batch_output { target_name: "OUT" source_input: "IN" } ' + IO,
    BASE
    + "model_metrics { metric_control { metric_identifier { family: 'f' } histogram_options { buckets: 1 } } }",
    BASE + "instance_group { kind: KIND_MODEL count: 2 }",
]


@pytest.mark.parametrize("text", VALID)
def test_valid(text: str, tmp_path: Path) -> None:
    _check(text, tmp_path)


def test_valid_gpu_groups(tmp_path: Path) -> None:
    _check(BASE + "instance_group { kind: KIND_GPU gpus: [ 1 ] }", tmp_path, gpu_count=2)
    _check(BASE + "instance_group { kind: KIND_GPU }", tmp_path, gpu_count=1)


def test_name_must_match_folder(tmp_path: Path) -> None:
    message = _fails('name: "other" backend: "python"', tmp_path, "directory name must equal model name")
    assert message == "unexpected directory name 'm' for model 'other', directory name must equal model name"


ERRORS = [
    ('name: "m"', "must specify 'platform' or 'backend' for 'm'"),
    (
        'name: "m" platform: "tensorflow_savedmodel_x"',
        "unexpected platform type 'tensorflow_savedmodel_x' for m",
    ),
    (
        'name: "m" backend: "python" platform: "ensemble"',
        "Ensemble model 'm' must have platform type 'ensemble'",
    ),
    (
        'name: "m" backend: "onnxruntime" platform: "tensorrt_plan"',
        "unexpected 'platform' and 'backend' pair",
    ),
    (BASE + "max_batch_size: -1", "'max_batch_size' must be non-negative value for m"),
    (BASE + "version_policy { specific { } }", "'specific' version policy must list at least one version"),
    # inputs and outputs
    (BASE + "input { data_type: TYPE_FP32 dims: 1 }", "model input must specify 'name' for m"),
    (BASE + 'input { name: "x" dims: 1 }', "model input 'x' must specify 'data_type' for m"),
    (BASE + 'output { name: "y" data_type: TYPE_FP32 }', "model output 'y' must specify 'dims' for m"),
    (BASE + 'input { name: "x" data_type: TYPE_FP32 dims: [ 0 ] }', "dimension must be integer >= 1, or -1"),
    (BASE + 'input { name: "x" data_type: TYPE_FP32 dims: [ -2 ] }', "dimension must be integer >= 1, or -1"),
    (BASE + 'input { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape { } }', "cannot have empty reshape"),
    (
        BASE + 'input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 0 ] } }',
        "reshape dimensions must be integer >= 1",
    ),  # fmt: skip
    (
        BASE + 'input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 3 ] } }',
        "model input 'x' has different size for dims and reshape for m",
    ),  # fmt: skip
    (
        BASE + 'input { name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ -1, 2, -1 ] } }',
        "different number of variable-size dimensions",
    ),  # fmt: skip
    (
        BASE + 'input { name: "x" data_type: TYPE_FP32 dims: [ 2, -1, 3 ] reshape { shape: [ 2, -1, 2 ] } }',
        "has different size for dims and reshape",
    ),  # fmt: skip
    (
        BASE
        + "max_batch_size: 2 "
        + 'output { name: "y" data_type: TYPE_FP32 dims: [ 2 ] reshape { shape: [] } }',
        "model output 'y' has different size for dims and reshape",
    ),  # fmt: skip
    (
        BASE + 'input { name: "x" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 3, 4 ] }',
        "model input NHWC/NCHW require 3 dims",
    ),  # fmt: skip
    (
        BASE + 'input { name: "x" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true }',
        "shape tensors are only supported for TensorRT platform",
    ),  # fmt: skip
    (
        BASE + 'output { name: "y" data_type: TYPE_FP32 dims: [ 1, 2, 3 ] is_non_linear_format_io: true }',
        "Non-linear IO format is only supported for the TensorRT platform",
    ),  # fmt: skip
    (
        BASE + IO + 'input { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }',
        "model input 'IN' is specified more than once for m",
    ),  # fmt: skip
    # batch inputs / outputs
    (BASE + IO + 'batch_input { target_name: "T" data_type: TYPE_INT32 }', "expects 1 source input, got 0"),
    (
        BASE + IO + 'batch_input { target_name: "T" data_type: TYPE_FP16 source_input: "IN" }',
        "batch input data type must be TYPE_INT32 or TYPE_FP32",
    ),  # fmt: skip
    (
        BASE + IO + 'batch_input { data_type: TYPE_INT32 source_input: "NOPE" }',
        "unknown source input name 'NOPE'",
    ),
    (
        BASE + IO + 'batch_output { target_name: "NOPE" source_input: "IN" }',
        "unknown target output name 'NOPE'",
    ),
    (
        BASE + IO + 'batch_output { target_name: ["OUT", "OUT"] source_input: "IN" }',
        "can only be specified once",
    ),
    # dynamic batching
    (
        BASE + "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 0 ] }",
        "dynamic batching preferred size must be positive for m",
    ),  # fmt: skip
    (
        BASE + "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }",
        "dynamic batching preferred size must be <= max batch size for m",
    ),  # fmt: skip
    (
        BASE + "dynamic_batching { priority_levels: 2 }",
        "default priority level must be in range [1, 2] for m",
    ),
    (
        BASE
        + "dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 } }",
        "priority queue policy must have priority level in range [1, 2]",
    ),  # fmt: skip
    (
        BASE + "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
        "Only one priority level is allowed when 'preserve_ordering' is true",
    ),  # fmt: skip
    (
        BASE + "dynamic_batching { preserve_ordering: true default_queue_policy"
        " { timeout_action: DELAY default_timeout_microseconds: 10 } }",
        "Queue policy can not have DELAY as timeout action",
    ),  # fmt: skip
    # sequence batching
    (
        BASE + "sequence_batching { } response_cache { enable: true }",
        "Response Cache does not currently support",
    ),
    (
        BASE + "sequence_batching { control_input { control { kind: CONTROL_SEQUENCE_START } } }",
        "sequence batching control tensor must have a name for m",
    ),  # fmt: skip
    (
        BASE + 'sequence_batching { control_input { name: "A" } control_input { name: "A" } }',
        "sequence batching control tensor 'A' is specified for multiple control kinds",
    ),  # fmt: skip
    (
        BASE + 'sequence_batching { control_input { name: "A" control { kind: CONTROL_SEQUENCE_END } } }',
        "must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_END",
    ),  # fmt: skip
    (
        BASE + 'sequence_batching { control_input { name: "A" control'
        " { kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] fp32_false_true: [0, 1] } } }",
        "specifies more than one from",
    ),  # fmt: skip
    (
        BASE + 'sequence_batching { control_input { name: "A" control { int32_false_true: [ 1 ] } } }',
        "'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START",
    ),  # fmt: skip
    (
        BASE + 'sequence_batching { control_input { name: "A" control { int32_false_true: [ 0, 1 ] } }'
        ' control_input { name: "B" control { bool_false_true: [ false, true ] } } }',
        "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
    ),  # fmt: skip
    (
        BASE + 'sequence_batching { control_input { name: "C" control { kind: CONTROL_SEQUENCE_CORRID } } }',
        "unexpected data type for control CONTROL_SEQUENCE_CORRID",
    ),  # fmt: skip
    (
        BASE + 'sequence_batching { control_input { name: "C" control'
        " { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 int32_false_true: [0, 1] } } }",
        "must not specify either",
    ),  # fmt: skip
    (
        BASE + "max_batch_size: 2 sequence_batching { oldest { preferred_batch_size: [ 4 ] } }",
        "sequence batching preferred batch size must be <= max batch size",
    ),  # fmt: skip
    (
        BASE + "sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
        "minimum slot utilization must be in range (0.0, 1.0]",
    ),  # fmt: skip
    # misc
    (
        BASE + "model_transaction_policy { decoupled: true } response_cache { enable: true }",
        "with 'decoupled' transaction policy",
    ),  # fmt: skip
    (BASE + "model_metrics { metric_control { } }", "metric control must specify 'metric_identifier'"),
    (BASE + "model_metrics { metric_control { metric_identifier { } } }", "must specify non-empty 'family'"),
    (
        BASE + "model_metrics { metric_control { metric_identifier { family: 'f' } } }",
        "must specify 'histogram_options'",
    ),
    (
        BASE + "model_metrics { metric_control { metric_identifier { family: 'f' } histogram_options { } } }",
        "non-empty 'buckets'",
    ),  # fmt: skip
    # instance groups (no GPUs by default)
    (
        BASE + "instance_group { kind: KIND_GPU }",
        "instance group m_0 of model m has kind KIND_GPU but no GPUs are available",
    ),
    (
        BASE + "instance_group { kind: KIND_CPU gpus: [ 0 ] }",
        "has kind KIND_CPU but specifies one or more GPUs",
    ),
    (
        BASE + "instance_group { kind: KIND_MODEL gpus: [ 0 ] }",
        "has kind KIND_MODEL but specifies one or more GPUs",
    ),
    (
        BASE + "instance_group { kind: KIND_CPU profile: '0' }",
        "specifies profile field which is only supported",
    ),
]


@pytest.mark.parametrize(("text", "match"), ERRORS)
def test_errors(text: str, match: str, tmp_path: Path) -> None:
    _fails(text, tmp_path, match)


def test_gpu_ids_must_exist(tmp_path: Path) -> None:
    _fails(
        BASE + "instance_group { kind: KIND_GPU gpus: [ 2 ] }",
        tmp_path,
        "invalid or unsupported gpu id 2",
        gpu_count=2,
    )
    _fails(BASE + "instance_group { kind: KIND_GPU gpus: [ -1 ] }", tmp_path, "gpu id -1", gpu_count=1)


def test_uncompleted_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(TritonError, match="model configuration must specify 'name'"):
        validate_config(parse_pbtxt('backend: "python"'), "m", tmp_path)
    config = parse_pbtxt('name: "m" backend: "python"')
    with pytest.raises(TritonError, match="must specify 'version policy' for m"):
        validate_config(config, "m", tmp_path)
    config = complete_defaults(config, "m")
    config.instance_group.clear()
    with pytest.raises(TritonError, match="must specify one or more 'instance group's for m"):
        validate_config(config, "m", tmp_path)
    config = complete_defaults(parse_pbtxt('name: "m" backend: "python"'), "m")
    config.instance_group[0].count = 0
    with pytest.raises(TritonError, match="must have a 'count' of at least 1"):
        validate_config(config, "m", tmp_path)


def test_label_files(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "labels.txt").write_text("cat\ndog\n")
    (tmp_path / "secret.txt").write_text("outside")

    def out(label: str) -> str:
        return BASE + f'output {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] label_filename: "{label}" }}'

    _check(out("labels.txt"), model_dir)
    _fails(out("missing.txt"), model_dir, "label file 'missing.txt' of output 'OUT' not found for m")
    _fails(out("../secret.txt"), model_dir, "must be inside the folder of model m")
    _fails(out("/etc/passwd"), model_dir, "must be inside the folder of model m")


ENSEMBLE_IO = (
    'name: "e" platform: "ensemble" max_batch_size: 4 '
    'input { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } '
)


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f'input_map {{ key: "{k}" value: "{v}" }} ' for k, v in inputs.items())
    maps += "".join(f'output_map {{ key: "{k}" value: "{v}" }} ' for k, v in outputs.items())
    return f'step {{ model_name: "{model}" {maps}}} '


def _ensemble(*steps: str, extra: str = "") -> str:
    return f"{extra} ensemble_scheduling {{ {''.join(steps)} }}"


def test_valid_ensemble(tmp_path: Path) -> None:
    steps = (_step("pre", {"x": "IN"}, {"y": "mid"}), _step("main", {"a": "mid", "b": "IN"}, {"c": "OUT"}))
    _check(ENSEMBLE_IO + _ensemble(*steps), tmp_path, name="e")


ONE_STEP = _step("a", {"x": "IN"}, {"y": "OUT"})


@pytest.mark.parametrize(
    ("tail", "match"),
    [
        (_ensemble(), "must specify 'step' for ensemble 'e'"),
        (_ensemble("step { }"), "must specify 'model_name' in step 0 of ensemble 'e'"),
        (_ensemble("step { model_name: 'x' }"), "must specify 'input_map' in step 0"),
        (
            _ensemble("step { model_name: 'x' input_map { key: 'a' value: 'IN' } }"),
            "must specify 'output_map' in step 0",
        ),
        (
            _ensemble(ONE_STEP, _step("b", {"x": "IN"}, {"y": "OUT"})),
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1",
        ),  # fmt: skip
        (
            _ensemble(_step("a", {"x": "OTHER"}, {"y": "OUT"})),
            "ensemble input 'IN' for ensemble e' is not used",
        ),
        (_ensemble(_step("a", {"x": "IN"}, {"y": "Z"})), "ensemble output 'OUT' for ensemble e' is not used"),
        (
            _ensemble(
                _step("a", {"x": "IN"}, {"y": "Z"}), _step("b", {"x": "IN", "w": "MISSING"}, {"y": "OUT"})
            ),
            "output 'OUT' for ensemble 'e' is not written",
        ),  # fmt: skip
        (
            _ensemble(_step("a", {"x": "IN"}, {"y": "DEAD"}), _step("b", {"x": "IN"}, {"y": "OUT"})),
            "ensemble tensor 'DEAD' is unused in ensemble 'e'",
        ),  # fmt: skip
        (
            _ensemble(ONE_STEP, extra="instance_group { kind: KIND_CPU }"),
            "instance group should not be specified for ensemble 'e'",
        ),  # fmt: skip
        (
            _ensemble(ONE_STEP, extra="optimization { }"),
            "optimization should not be specified for ensemble 'e'",
        ),
        (_ensemble(ONE_STEP, extra="model_warmup { }"), "model_warmup can not be specified for ensemble 'e'"),
        ("", "ensemble scheduling must be set for ensemble e whose platform is ensemble"),
    ],
)
def test_ensemble_errors(tail: str, match: str, tmp_path: Path) -> None:
    _fails(ENSEMBLE_IO + tail, tmp_path, match, name="e")


def test_ensemble_scheduling_needs_ensemble_platform(tmp_path: Path) -> None:
    _fails(
        BASE + _ensemble(ONE_STEP),
        tmp_path,
        "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
    )


# ---- model files stay inside the model's folder (confine_model_files) ----------------------------


@pytest.mark.parametrize("filename", ["../x.py", "../../etc/x.py", "/etc/passwd", "sub/../../x.py", "a\x00b"])
def test_default_model_filename_outside_the_version_folder_is_refused(tmp_path, filename):
    (tmp_path / "1").mkdir()
    _fails(BASE + f'default_model_filename: "{filename}" ' + IO, tmp_path, "default_model_filename")


def test_default_model_filename_symlinked_out_is_refused(tmp_path):
    (tmp_path / "1").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text("x = 1")
    (tmp_path / "1" / "model.py").symlink_to(outside)
    _fails(BASE + IO, tmp_path, "must name a file inside its version folder")


def test_default_model_filename_inside_the_folder_is_fine(tmp_path):
    (tmp_path / "1" / "sub").mkdir(parents=True)
    (tmp_path / "1" / "sub" / "m.py").write_text("x = 1")
    (tmp_path / "1" / "link.py").symlink_to(tmp_path / "1" / "sub" / "m.py")  # a link within the folder is fine
    _check(BASE + 'default_model_filename: "sub/m.py" ' + IO, tmp_path)
    _check(BASE + 'default_model_filename: "link.py" ' + IO, tmp_path)


@pytest.mark.parametrize("value", ["/usr/lib/libevil.so", "../libevil.so"])
def test_file_parameters_outside_the_model_folder_are_refused(tmp_path, value):
    text = f'name: "m" backend: "openvino" parameters {{ key: "CPU_EXTENSION_PATH" value {{ string_value: "{value}" }} }} '
    _fails(text + IO, tmp_path, "CPU_EXTENSION_PATH")


def test_repository_agents_pass_validation(tmp_path):
    """model_repository_agents is no longer refused here: the repository checks and runs the
    agents (tests/unit/agents, tests/e2e/test_repository_agents.py)."""
    from trident.config import complete_defaults, config_from_json
    from trident.config_validation import validate_config

    config = config_from_json('{"name": "m", "backend": "python", "max_batch_size": 0, '
                              '"model_repository_agents": {"agents": [{"name": "checksum"}]}}')
    config = complete_defaults(config, "m")
    validate_config(config, "m", tmp_path)
    assert config.model_repository_agents is not None and config.model_repository_agents.agents[0].name == "checksum"
