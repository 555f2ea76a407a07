"""trident.config: reading, Triton's JSON form, defaults, shapes and the version policy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trident import config as cfg
from trident.errors import Code, TritonError
from trident.protocol.generated import inference as pb
from trident.protocol.pbtxt import PbtxtError, parse_pbtxt

ADD_SUB = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
instance_group [ { kind: KIND_CPU } ]
"""

RICH = """
name: "rich"
backend: "onnxruntime"
max_batch_size: 16
version_policy { specific { versions: [ 2, 9007199254740993 ] } }
input [ { name: "X" data_type: TYPE_INT64 dims: [ -1, 3 ] reshape { shape: [ -1, 1, 3 ] } } ]
output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 16 ]
  max_queue_delay_microseconds: 18446744073709551615
  priority_levels: 2
  default_priority_level: 1
  priority_queue_policy { key: 2 value { timeout_action: DELAY default_timeout_microseconds: 300 } }
}
instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" global: true count: 1 } ] } } ]
model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { data_type: TYPE_INT64 dims: [ 3 ] random_data: true } } } ]
parameters { key: "k" value { string_value: "v" } }
optimization { cuda { graph_spec [ { batch_size: 2 input { key: "X" value { dim: [ 2, 3 ] } } } ] } }
model_metrics { metric_control [ { metric_identifier { family: "f" } histogram_options { buckets: [ 1, 2.5 ] } } ] }
"""


# ---------------------------------------------------------------- reading


def test_read_model_config(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text(ADD_SUB)
    config = cfg.read_model_config(tmp_path)
    assert config == parse_pbtxt(ADD_SUB)


def test_missing_config_is_empty(tmp_path: Path) -> None:
    assert cfg.read_model_config(tmp_path) == pb.ModelConfig()
    assert cfg.read_model_config(tmp_path / "does-not-exist") == pb.ModelConfig()


def test_named_config_and_fallback(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('name: "default"')
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "h100.pbtxt").write_text('name: "named"')
    assert cfg.read_model_config(tmp_path, config_name="h100").name == "named"
    assert cfg.read_model_config(tmp_path, config_name="other").name == "default"
    assert cfg.read_model_config(tmp_path).name == "default"
    for bad in ("../x", "a/b", ".."):
        with pytest.raises(TritonError, match="invalid model config name"):
            cfg.read_model_config(tmp_path, config_name=bad)


def test_read_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: "eight"\n')
    with pytest.raises(PbtxtError) as info:
        cfg.read_model_config(tmp_path)
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message.startswith(f"{path}:2:17: expected an integer")
    path.unlink()
    path.mkdir()
    with pytest.raises(TritonError, match="failed to read model configuration") as info2:
        cfg.read_model_config(tmp_path)
    assert info2.value.code is Code.INVALID_ARG


# ---------------------------------------------------------------- JSON


def test_config_to_json_matches_triton_for_add_sub(tmp_path: Path) -> None:
    config = cfg.complete_defaults(parse_pbtxt(ADD_SUB), "add_sub")
    assert cfg.config_to_json(config) == {
        "name": "add_sub",
        "platform": "",
        "backend": "python",
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 8,
        "input": [
            {
                "name": f"INPUT{i}",
                "data_type": "TYPE_FP32",
                "format": "FORMAT_NONE",
                "dims": [16],
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": False,
                "is_non_linear_format_io": False,
            }
            for i in (0, 1)
        ],
        "output": [
            {
                "name": f"OUTPUT{i}",
                "data_type": "TYPE_FP32",
                "dims": [16],
                "label_filename": "",
                "is_shape_tensor": False,
                "is_non_linear_format_io": False,
            }
            for i in (0, 1)
        ],
        "batch_input": [],
        "batch_output": [],
        "optimization": {
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": {"enable": True},
            "output_pinned_memory": {"enable": True},
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": False,
        },
        "instance_group": [
            {
                "name": "add_sub_0",
                "kind": "KIND_CPU",
                "count": 1,
                "gpus": [],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
        ],
        "default_model_filename": "model.py",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": [],
        "model_transaction_policy": {"decoupled": False},
    }


def test_config_to_json_values() -> None:
    j = cfg.config_to_json(parse_pbtxt(RICH))
    json.dumps(j, allow_nan=False)  # plain JSON
    assert j["version_policy"] == {"specific": {"versions": [2, 9007199254740993]}}  # int64 as numbers
    assert j["input"][0]["dims"] == [-1, 3] and j["input"][0]["reshape"] == {"shape": [-1, 1, 3]}
    assert j["input"][0]["data_type"] == "TYPE_INT64" and j["output"][0]["data_type"] == "TYPE_STRING"
    db = j["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 2**64 - 1
    assert db["priority_queue_policy"] == {
        "2": {
            "timeout_action": "DELAY",
            "default_timeout_microseconds": 300,
            "allow_timeout_override": False,
            "max_queue_size": 0,
        }
    }
    assert "default_queue_policy" not in db  # unset messages are omitted
    assert "sequence_batching" not in j and "ensemble_scheduling" not in j  # unset oneof members too
    assert j["instance_group"][0]["rate_limiter"] == {
        "resources": [{"name": "R", "global": True, "count": 1}],
        "priority": 0,
    }
    assert j["model_warmup"][0]["inputs"]["X"] == {
        "data_type": "TYPE_INT64",
        "dims": [3],
        "random_data": True,
    }
    assert j["parameters"] == {"k": {"string_value": "v"}}
    assert j["optimization"]["cuda"]["graph_spec"][0]["input"] == {"X": {"dim": [2, 3]}}
    assert j["model_metrics"]["metric_control"][0]["histogram_options"] == {"buckets": [1.0, 2.5]}


def test_config_to_json_special_floats_and_unknown_enums() -> None:
    config = parse_pbtxt(
        "sequence_batching { direct { minimum_slot_utilization: inf } } input { data_type: 77 }"
    )
    j = cfg.config_to_json(config)
    assert j["sequence_batching"]["direct"]["minimum_slot_utilization"] == "Infinity"
    assert j["input"][0]["data_type"] == 77
    assert cfg.config_from_json(json.dumps(j)) == config
    nan = cfg.config_from_json('{"sequence_batching": {"direct": {"minimum_slot_utilization": "NaN"}}}')
    assert nan.sequence_batching is not None and nan.sequence_batching.direct is not None
    assert math.isnan(nan.sequence_batching.direct.minimum_slot_utilization)
    assert cfg.config_to_json(nan)["sequence_batching"]["direct"]["minimum_slot_utilization"] == "NaN"


@pytest.mark.parametrize("text", [ADD_SUB, RICH])
def test_json_round_trip(text: str) -> None:
    config = parse_pbtxt(text)
    assert cfg.config_from_json(json.dumps(cfg.config_to_json(config))) == config
    completed = cfg.complete_defaults(config, config.name)
    assert cfg.config_from_json(json.dumps(cfg.config_to_json(completed))) == completed


def test_config_from_json_forms() -> None:
    config = cfg.config_from_json(
        json.dumps(
            {
                "name": "m",
                "maxBatchSize": 4,
                "input": [{"name": "A", "dataType": "type_fp32", "dims": ["-1", 3, 2.0]}],
                "output": [{"name": "B", "data_type": 11, "dims": [1], "labelFilename": None}],
                "instanceGroup": [{"kind": "KIND_GPU", "gpus": [0], "count": "2"}],
                "dynamicBatching": {
                    "maxQueueDelayMicroseconds": "18446744073709551615",
                    "priorityQueuePolicy": {"1": {"timeoutAction": "delay"}},
                },
                "parameters": {"p": {"stringValue": "x"}},
                "version_policy": {"all": {}},
                "optimization": None,
            }
        )  # fmt: skip
    )
    assert config.name == "m" and config.max_batch_size == 4
    assert config.input[0].data_type == pb.DataType.TYPE_FP32 and config.input[0].dims == [-1, 3, 2]
    assert config.output[0].data_type == pb.DataType.TYPE_FP32 and config.output[0].label_filename == ""
    assert (
        config.instance_group[0].kind == pb.ModelInstanceGroupKind.GPU and config.instance_group[0].count == 2
    )
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.max_queue_delay_microseconds == 2**64 - 1
    assert config.dynamic_batching.priority_queue_policy == {
        1: pb.ModelQueuePolicy(timeout_action=pb.ModelQueuePolicyTimeoutAction.DELAY)
    }
    assert config.parameters == {"p": pb.ModelParameter(string_value="x")}
    assert config.version_policy == pb.ModelVersionPolicy(all=pb.ModelVersionPolicyAll())
    assert config.optimization is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "failed to parse model configuration JSON"),
        ("[1, 2]", "<root>: expected an object"),
        ('{"nme": "x"}', 'has no field named "nme"'),
        ('{"input": [{"dims": ["x"]}]}', r"input\[0\]\.dims\[0\]: expected an integer"),
        ('{"input": [{"dims": [1.5]}]}', "expected an integer"),
        ('{"max_batch_size": true}', "max_batch_size: expected an integer"),
        ('{"max_batch_size": 2147483648}', "out of range"),
        ('{"dynamic_batching": {"max_queue_delay_microseconds": -1}}', "out of range"),
        ('{"name": 5}', "name: expected a string"),
        ('{"input": {"name": "x"}}', "input: expected a list"),
        ('{"input": [{"data_type": "TYPE_NOPE"}]}', "unknown value"),
        ('{"input": [{"optional": "yes"}]}', "expected a boolean"),
        ('{"parameters": [1]}', "parameters: expected an object"),
        ('{"dynamic_batching": {"priority_queue_policy": {"x": {}}}}', "expected an integer"),
        ('{"dynamic_batching": {}, "sequence_batching": {}}', "both set in oneof"),
        ('{"version_policy": 3}', "version_policy: expected an object"),
        (
            '{"model_metrics": {"metric_control": [{"histogram_options": {"buckets": ["a"]}}]}}',
            "expected a number",
        ),
    ],
)
def test_config_from_json_errors(text: str, match: str) -> None:
    with pytest.raises(TritonError, match=match) as info:
        cfg.config_from_json(text)
    assert info.value.code is Code.INVALID_ARG


# ---------------------------------------------------------------- defaults


def test_complete_defaults_basics() -> None:
    original = pb.ModelConfig(backend="python", max_batch_size=4)
    config = cfg.complete_defaults(original, "folder")
    assert original == pb.ModelConfig(backend="python", max_batch_size=4)  # not modified
    assert config.name == "folder"
    assert config.version_policy == pb.ModelVersionPolicy(latest=pb.ModelVersionPolicyLatest(num_versions=1))
    assert config.instance_group == [
        pb.ModelInstanceGroup(name="folder", kind=pb.ModelInstanceGroupKind.CPU, count=1)
    ]
    assert config.optimization == pb.ModelOptimizationPolicy(
        input_pinned_memory=pb.ModelOptimizationPolicyPinnedMemoryBuffer(enable=True),
        output_pinned_memory=pb.ModelOptimizationPolicyPinnedMemoryBuffer(enable=True),
    )
    assert config.model_transaction_policy == pb.ModelTransactionPolicy(decoupled=False)
    assert config.dynamic_batching is None
    assert config.default_model_filename == "model.py"
    # idempotent
    assert cfg.complete_defaults(config, "folder") == config


def test_complete_defaults_keeps_given_values() -> None:
    config = parse_pbtxt(
        'name: "m" backend: "python" version_policy { all {} }'
        " optimization { input_pinned_memory { enable: false } }"
        " model_transaction_policy { decoupled: true }"
    )
    done = cfg.complete_defaults(config, "m")
    assert done.version_policy == pb.ModelVersionPolicy(all=pb.ModelVersionPolicyAll())
    assert done.optimization is not None
    assert done.optimization.input_pinned_memory == pb.ModelOptimizationPolicyPinnedMemoryBuffer(enable=False)
    assert done.optimization.output_pinned_memory == pb.ModelOptimizationPolicyPinnedMemoryBuffer(enable=True)
    assert done.model_transaction_policy == pb.ModelTransactionPolicy(decoupled=True)


def test_default_instance_group_on_gpus() -> None:
    config = cfg.complete_defaults(pb.ModelConfig(backend="onnxruntime"), "m", gpu_count=2)
    assert config.instance_group == [
        pb.ModelInstanceGroup(name="m", kind=pb.ModelInstanceGroupKind.GPU, count=1, gpus=[0, 1])
    ]
    cpu = cfg.complete_defaults(pb.ModelConfig(backend="onnxruntime"), "m")
    assert cpu.instance_group == [
        pb.ModelInstanceGroup(name="m", kind=pb.ModelInstanceGroupKind.CPU, count=2)
    ]


def test_instance_group_normalization() -> None:
    config = parse_pbtxt(
        'backend: "python" instance_group ['
        " { kind: KIND_AUTO },"
        ' { name: "named" kind: KIND_GPU count: 3 },'
        " { kind: KIND_AUTO gpus: [ 5 ] },"
        " { kind: KIND_AUTO gpus: [ 1 ] count: -2 },"
        " { kind: KIND_MODEL }"
        " ]"
    )
    groups = cfg.complete_defaults(config, "m", gpu_count=2).instance_group
    gpu, cpu = pb.ModelInstanceGroupKind.GPU, pb.ModelInstanceGroupKind.CPU
    assert [(g.name, g.kind, g.count, g.gpus) for g in groups] == [
        ("m_0", gpu, 1, [0, 1]),
        ("named", gpu, 3, [0, 1]),
        ("m_2", cpu, 1, [5]),  # a listed GPU that does not exist turns AUTO into CPU
        ("m_3", gpu, 1, [1]),
        ("m_4", pb.ModelInstanceGroupKind.MODEL, 1, []),
    ]
    no_gpu = cfg.complete_defaults(config, "m").instance_group
    assert [g.kind for g in no_gpu[:2]] == [cpu, gpu] and no_gpu[1].gpus == []


def test_batching_defaults() -> None:
    dyn = cfg.complete_defaults(parse_pbtxt('backend: "python" max_batch_size: 8 dynamic_batching {}'), "m")
    assert dyn.dynamic_batching == pb.ModelDynamicBatching(preferred_batch_size=[8])
    kept = cfg.complete_defaults(
        parse_pbtxt("max_batch_size: 8 dynamic_batching { preferred_batch_size: 2 }"), "m"
    )
    assert kept.dynamic_batching is not None and kept.dynamic_batching.preferred_batch_size == [2]
    nobatch = cfg.complete_defaults(parse_pbtxt("dynamic_batching {}"), "m")
    assert nobatch.dynamic_batching == pb.ModelDynamicBatching()
    seq = cfg.complete_defaults(parse_pbtxt("max_batch_size: 4 sequence_batching { oldest {} }"), "m")
    assert (
        seq.sequence_batching is not None
        and seq.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    )
    assert seq.sequence_batching.oldest is not None and seq.sequence_batching.oldest.preferred_batch_size == [
        4
    ]
    idle = cfg.complete_defaults(parse_pbtxt("sequence_batching { max_sequence_idle_microseconds: 5 }"), "m")
    assert idle.sequence_batching is not None and idle.sequence_batching.max_sequence_idle_microseconds == 5


def test_ensemble_defaults_skip_instances_and_optimization() -> None:
    config = cfg.complete_defaults(parse_pbtxt('platform: "ensemble" ensemble_scheduling { step {} }'), "e")
    assert config.instance_group == [] and config.optimization is None
    assert config.backend == "" and config.version_policy is not None


def test_enable_default_dynamic_batching() -> None:
    config = pb.ModelConfig(max_batch_size=4)
    assert cfg.enable_default_dynamic_batching(config) is True
    assert config.dynamic_batching == pb.ModelDynamicBatching()
    assert cfg.enable_default_dynamic_batching(config) is False
    for other in (
        pb.ModelConfig(max_batch_size=1),
        pb.ModelConfig(max_batch_size=0),
        pb.ModelConfig(max_batch_size=8, sequence_batching=pb.ModelSequenceBatching()),
        pb.ModelConfig(max_batch_size=8, ensemble_scheduling=pb.ModelEnsembling()),
    ):
        assert cfg.enable_default_dynamic_batching(other) is False
        assert other.dynamic_batching is None


def _model(tmp_path: Path, name: str, files: dict[str, str | None]) -> Path:
    """A model folder; a None value makes a directory."""
    model_dir = tmp_path / name
    for rel, content in files.items():
        path = model_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir()
        else:
            path.write_text(content)
    model_dir.mkdir(exist_ok=True)
    return model_dir


@pytest.mark.parametrize(
    ("files", "backend", "platform", "filename"),
    [
        ({"1/model.py": ""}, "python", "", "model.py"),
        ({"1/model.onnx": ""}, "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ({"1/model.onnx": None}, "onnxruntime", "onnxruntime_onnx", "model.onnx"),
        ({"1/model.plan": ""}, "tensorrt", "tensorrt_plan", "model.plan"),
        # as in Triton: found by its file, the platform is set and the file name left to the backend
        ({"1/model.pt": ""}, "pytorch", "pytorch_libtorch", ""),
        ({"1/model.xml": "", "1/model.bin": ""}, "openvino", "", "model.xml"),
        ({"1/model.savedmodel": None}, "tensorflow", "tensorflow_savedmodel", "model.savedmodel"),
        ({"1/model.graphdef": ""}, "tensorflow", "tensorflow_graphdef", "model.graphdef"),
        ({"2/model.py": "", "10/model.onnx": ""}, "python", "", "model.py"),  # the lowest version decides
        ({"01/model.onnx": "", "3/model.py": ""}, "python", "", "model.py"),  # leading zeros are not versions
    ],
)
def test_backend_from_files(
    tmp_path: Path, files: dict[str, str | None], backend: str, platform: str, filename: str
) -> None:
    model_dir = _model(tmp_path, "m", files)
    config = cfg.complete_defaults(pb.ModelConfig(), "m", model_dir=model_dir)
    assert (config.backend, config.platform, config.default_model_filename) == (backend, platform, filename)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (pb.ModelConfig(backend="onnxruntime"), ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
        (pb.ModelConfig(platform="onnxruntime_onnx"), ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
        (pb.ModelConfig(platform="tensorrt_plan"), ("tensorrt", "tensorrt_plan", "model.plan")),
        (pb.ModelConfig(backend="pytorch"), ("pytorch", "pytorch_libtorch", "model.pt")),
        (pb.ModelConfig(default_model_filename="model.py"), ("python", "", "model.py")),
        (pb.ModelConfig(backend="python", default_model_filename="m2.py"), ("python", "", "m2.py")),
        (pb.ModelConfig(backend="custom"), ("custom", "", "")),
        (pb.ModelConfig(platform="ensemble"), ("", "ensemble", "")),
    ],
)
def test_backend_fields_from_each_other(given: pb.ModelConfig, expected: tuple[str, str, str]) -> None:
    config = cfg.complete_defaults(given, "m")
    assert (config.backend, config.platform, config.default_model_filename) == expected


def test_custom_backend_from_folder_name(tmp_path: Path) -> None:
    model_dir = _model(tmp_path, "m.identity", {"1/weights.bin": ""})
    config = cfg.complete_defaults(pb.ModelConfig(), "m.identity", model_dir=model_dir)
    assert (config.backend, config.default_model_filename) == ("identity", "model.identity")
    plain = _model(tmp_path, "plain", {"1/weights.bin": ""})
    with pytest.raises(TritonError, match="Could not determine backend for model 'plain'") as info:
        cfg.complete_defaults(pb.ModelConfig(), "plain", model_dir=plain)
    assert info.value.code is Code.INVALID_ARG


# ---------------------------------------------------------------- shapes, datatypes


def test_full_shape() -> None:
    io = pb.ModelInput(name="x", dims=[3, -1], reshape=pb.ModelTensorReshape(shape=[-1, 3]))
    assert cfg.full_shape(io, 8) == [-1, 3, -1]
    assert cfg.full_shape(io, 0) == [3, -1]
    assert cfg.full_shape(pb.ModelOutput(name="y", dims=[1]), 1) == [-1, 1]


@pytest.mark.parametrize(
    ("data_type", "api"),
    [
        (pb.DataType.TYPE_FP32, "FP32"),
        (pb.DataType.TYPE_STRING, "BYTES"),
        (pb.DataType.TYPE_BF16, "BF16"),
        (pb.DataType.TYPE_BOOL, "BOOL"),
        (pb.DataType.TYPE_UINT64, "UINT64"),
        (9, "INT64"),
    ],
)
def test_api_datatype(data_type: pb.DataType | int, api: str) -> None:
    assert cfg.api_datatype(data_type) == api


@pytest.mark.parametrize("bad", [pb.DataType.TYPE_INVALID, 99])
def test_api_datatype_invalid(bad: pb.DataType | int) -> None:
    with pytest.raises(TritonError, match="invalid data type") as info:
        cfg.api_datatype(bad)
    assert info.value.code is Code.INVALID_ARG


# ---------------------------------------------------------------- versions


def test_list_version_dirs(tmp_path: Path) -> None:
    for name in ("1", "2", "10", "0", "007", "01", "abc", "1a", "-1", "\u0663", "warmup", "configs"):
        (tmp_path / name).mkdir()
    (tmp_path / "3").write_text("a file, not a version")
    (tmp_path / "config.pbtxt").write_text("")
    assert cfg.list_version_dirs(tmp_path) == [0, 1, 2, 10]
    assert cfg.list_version_dirs(tmp_path / "missing") == []


@pytest.mark.parametrize(
    ("policy", "available", "expected"),
    [
        (None, [3, 1, 2], [3]),
        (pb.ModelVersionPolicy(latest=pb.ModelVersionPolicyLatest(num_versions=2)), [1, 5, 3], [3, 5]),
        (pb.ModelVersionPolicy(latest=pb.ModelVersionPolicyLatest(num_versions=9)), [1, 2], [1, 2]),
        (pb.ModelVersionPolicy(latest=pb.ModelVersionPolicyLatest(num_versions=0)), [1, 2], []),
        (pb.ModelVersionPolicy(all=pb.ModelVersionPolicyAll()), [2, 1, 2], [1, 2]),
        (pb.ModelVersionPolicy(), [4, 1], [1, 4]),  # no choice set: all, as Triton
        (
            pb.ModelVersionPolicy(specific=pb.ModelVersionPolicySpecific(versions=[3, 1, 7])),
            [1, 2, 3],
            [1, 3],
        ),
        (pb.ModelVersionPolicy(specific=pb.ModelVersionPolicySpecific(versions=[7])), [1], []),
        (None, [], []),
    ],
)
def test_select_versions(
    policy: pb.ModelVersionPolicy | None, available: list[int], expected: list[int]
) -> None:
    assert cfg.select_versions(policy, available) == expected
