"""config.pbtxt parser and writer: every syntax form, errors with line/column, round trips."""

from __future__ import annotations

import importlib.util
import inspect
import math
from pathlib import Path

import betterproto2
import pytest
from hypothesis import HealthCheck, given, settings

from trident.errors import Code, TritonError
from trident.protocol.generated import inference as pb
from trident.protocol.pbtxt import PbtxtError, format_pbtxt, parse_message, parse_pbtxt


def _load_strategies():  # a helper module next to this file (tests are not a package)
    spec = importlib.util.spec_from_file_location(
        "message_strategies", Path(__file__).with_name("message_strategies.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


messages = _load_strategies().messages

# ---------------------------------------------------------------- realistic configs

BIG_CONFIG = r"""
# A realistic config: dynamic batching with priorities, instance groups, warmup, parameters.
name: "densenet_onnx"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
max_batch_size : 32
version_policy: { specific: { versions: [1, 3] } }
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape: { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 source_input: "data_0" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: false
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 max_queue_size: 16 }
  priority_queue_policy {
    key: 1
    value: { timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true }
  }
  priority_queue_policy [ { key: 2 value { max_queue_size: 4 } } ]
}
instance_group [
  {
    name: "gpu_group"
    count: 2
    kind: KIND_GPU
    gpus: [ 0, 1 ]
    rate_limiter {
      resources [ { name: "R1" global: true count: 4 }, { name: "R2", count: 1 } ]
      priority: 2
    }
    secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ]
  },
  { count: 1 kind: KIND_CPU }
]
optimization {
  graph { level: 1 }
  priority: PRIORITY_MAX
  execution_accelerators {
    gpu_execution_accelerator : [ {
      name : "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "max_workspace_size_bytes" value: "1073741824" }
    } ]
  }
  cuda { graphs: true graph_spec [ { batch_size: 4 input { key: "data_0" value { dim: [3, 224, 224] } } } ] }
  input_pinned_memory { enable: false }
}
model_warmup [
  {
    name: "zero_warmup"
    batch_size: 4
    inputs { key: "data_0" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } }
    count: 2
  },
  { name: "file_warmup" inputs [ { key: "data_0", value { data_type: TYPE_FP32 dims: 3 input_data_file: "raw" } } ] }
]
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
parameters: [ { key: "execution_mode" value: { string_value: "0" } } ]
metric_tags { key: "team" value: "vision" }
model_repository_agents { agents [ { name: "checksum" parameters { key: "MD5:model.onnx" value: "abc" } } ] }
response_cache { enable: true }
model_metrics { metric_control [ { metric_identifier { family: "nv_inference_request_duration" }
                                   histogram_options { buckets: [ 100, 500.5, 1e3 ] } } ] }
"""

SEQUENCE_CONFIG = """
name: "stateful"
backend: "python"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 preferred_batch_size: [2, 4] max_queue_delay_microseconds: 50 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ -1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "initial" }
      use_same_buffer_for_input_output: true
    }
  ]
}
"""

ENSEMBLE_CONFIG = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 1
input [ { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "CLASSIFICATION" data_type: TYPE_FP32 dims: [ 1000 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess"
      model_version: -1
      input_map { key: "INPUT" value: "IMAGE" }
      output_map { key: "OUTPUT" value: "preprocessed_image" }
    },
    {
      model_name: "densenet_onnx"
      model_version: 3
      input_map { key: "data_0" value: "preprocessed_image" }
      output_map { key: "fc6_1" value: "CLASSIFICATION" }
    }
  ]
}
"""


def test_big_config() -> None:
    c = parse_pbtxt(BIG_CONFIG, filename="densenet/config.pbtxt")
    assert (c.name, c.platform, c.backend, c.max_batch_size) == (
        "densenet_onnx",
        "onnxruntime_onnx",
        "onnxruntime",
        32,
    )
    assert c.version_policy == pb.ModelVersionPolicy(specific=pb.ModelVersionPolicySpecific(versions=[1, 3]))
    (inp,) = c.input
    assert inp.data_type == pb.DataType.TYPE_FP32 and inp.format == pb.ModelInputFormat.NCHW
    assert inp.dims == [3, 224, 224] and inp.reshape == pb.ModelTensorReshape(shape=[1, 3, 224, 224])
    assert c.output[0].label_filename == "densenet_labels.txt"
    assert c.batch_input[0].source_input == ["data_0"] and c.batch_input[0].target_name == ["N"]
    db = c.dynamic_batching
    assert db is not None and c.sequence_batching is None
    assert db.preferred_batch_size == [4, 8] and db.max_queue_delay_microseconds == 100
    assert db.default_queue_policy == pb.ModelQueuePolicy(
        default_timeout_microseconds=100000, max_queue_size=16
    )
    assert db.priority_queue_policy == {
        1: pb.ModelQueuePolicy(
            timeout_action=pb.ModelQueuePolicyTimeoutAction.DELAY,
            default_timeout_microseconds=5000,
            allow_timeout_override=True,
        ),
        2: pb.ModelQueuePolicy(max_queue_size=4),
    }
    gpu, cpu = c.instance_group
    assert gpu.kind == pb.ModelInstanceGroupKind.GPU and gpu.gpus == [0, 1] and gpu.count == 2
    assert gpu.rate_limiter is not None and gpu.rate_limiter.priority == 2
    assert [(r.name, r.global_, r.count) for r in gpu.rate_limiter.resources] == [
        ("R1", True, 4),
        ("R2", False, 1),
    ]
    assert gpu.secondary_devices == [pb.ModelInstanceGroupSecondaryDevice(device_id=0)]
    assert cpu == pb.ModelInstanceGroup(count=1, kind=pb.ModelInstanceGroupKind.CPU)
    opt = c.optimization
    assert opt is not None and opt.priority == pb.ModelOptimizationPolicyModelPriority.PRIORITY_MAX
    assert opt.graph == pb.ModelOptimizationPolicyGraph(level=1)
    assert opt.execution_accelerators is not None
    (trt,) = opt.execution_accelerators.gpu_execution_accelerator
    assert trt.parameters == {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824"}
    assert opt.cuda is not None and opt.cuda.graph_spec[0].input["data_0"].dim == [3, 224, 224]
    assert opt.input_pinned_memory == pb.ModelOptimizationPolicyPinnedMemoryBuffer(enable=False)
    assert opt.output_pinned_memory is None
    zero, from_file = c.model_warmup
    assert zero.batch_size == 4 and zero.count == 2
    assert zero.inputs["data_0"] == pb.ModelWarmupInput(
        data_type=pb.DataType.TYPE_FP32, dims=[3, 224, 224], zero_data=True
    )
    assert (
        from_file.inputs["data_0"].input_data_file == "raw" and from_file.inputs["data_0"].zero_data is None
    )
    assert c.parameters == {
        "intra_op_thread_count": pb.ModelParameter(string_value="2"),
        "execution_mode": pb.ModelParameter(string_value="0"),
    }
    assert c.metric_tags == {"team": "vision"}
    assert c.model_repository_agents is not None
    assert c.model_repository_agents.agents[0].parameters == {"MD5:model.onnx": "abc"}
    assert c.response_cache == pb.ModelResponseCache(enable=True)
    assert c.model_metrics is not None
    (control,) = c.model_metrics.metric_control
    assert control.histogram_options is not None and control.histogram_options.buckets == [
        100.0,
        500.5,
        1000.0,
    ]
    assert parse_pbtxt(format_pbtxt(c)) == c


def test_sequence_config() -> None:
    c = parse_pbtxt(SEQUENCE_CONFIG)
    sb = c.sequence_batching
    assert sb is not None and c.dynamic_batching is None
    assert sb.direct is None and sb.oldest == pb.ModelSequenceBatchingStrategyOldest(
        max_candidate_sequences=4, preferred_batch_size=[2, 4], max_queue_delay_microseconds=50
    )
    start, ready, end, corrid = sb.control_input
    assert start.control[0].fp32_false_true == [0.0, 1.0]
    assert ready.control[0].int32_false_true == [0, 1]
    assert end.control[0].bool_false_true == [False, True]
    assert corrid.control[0].kind == pb.ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_CORRID
    assert corrid.control[0].data_type == pb.DataType.TYPE_UINT64
    (state,) = sb.state
    assert state.dims == [-1] and state.use_same_buffer_for_input_output
    assert state.initial_state == [
        pb.ModelSequenceBatchingInitialState(
            data_type=pb.DataType.TYPE_INT32, dims=[1], zero_data=True, name="initial"
        )
    ]
    assert parse_pbtxt(format_pbtxt(c)) == c


def test_ensemble_config() -> None:
    c = parse_pbtxt(ENSEMBLE_CONFIG)
    assert c.ensemble_scheduling is not None
    first, second = c.ensemble_scheduling.step
    assert first.model_version == -1 and first.input_map == {"INPUT": "IMAGE"}
    assert first.output_map == {"OUTPUT": "preprocessed_image"}
    assert second.model_version == 3 and second.output_map == {"fc6_1": "CLASSIFICATION"}
    assert c.input[0].data_type == pb.DataType.TYPE_STRING
    assert parse_pbtxt(format_pbtxt(c)) == c


# ---------------------------------------------------------------- syntax forms


def test_empty_and_comment_only() -> None:
    assert parse_pbtxt("") == pb.ModelConfig()
    assert parse_pbtxt("# nothing\n   \n# here") == pb.ModelConfig()


def test_comments_everywhere() -> None:
    c = parse_pbtxt('name: # the name\n "m" # trailing\ninput { # open\n name: "x" # inner\n} # close')
    assert c.name == "m" and c.input[0].name == "x"


@pytest.mark.parametrize(
    "text",
    [
        'input { name: "a" } input { name: "b" }',
        'input: { name: "a" } input: { name: "b" }',
        'input < name: "a" > input < name: "b" >',
        'input [ { name: "a" }, < name: "b" > ]',
        'input: [ { name: "a" }, { name: "b" } ]',
        'input [ { name: "a" } ] input { name: "b" }',
    ],
)
def test_repeated_messages_all_forms(text: str) -> None:
    assert [i.name for i in parse_pbtxt(text).input] == ["a", "b"]


@pytest.mark.parametrize(
    "text",
    [
        "dims: [1, 2, 3]",
        "dims: 1 dims: 2 dims: 3",
        "dims: [1] dims: [2, 3]",
        "dims: [1, 2] dims: 3",
        "dims:[1,2,3]",
    ],
)
def test_repeated_scalars_all_forms(text: str) -> None:
    assert parse_pbtxt(f"input {{ {text} }}").input[0].dims == [1, 2, 3]


def test_empty_lists() -> None:
    c = parse_pbtxt("input [] output: [] input { dims: [] reshape { shape: [] } }")
    assert c.output == [] and c.input[0].dims == [] and c.input[0].reshape == pb.ModelTensorReshape()


@pytest.mark.parametrize("sep", [",", ";", " ", "\n"])
def test_field_separators(sep: str) -> None:
    c = parse_pbtxt(f'name: "m"{sep} max_batch_size: 4{sep} input {{ name: "x"{sep} dims: 1{sep} }}{sep}')
    assert (c.name, c.max_batch_size, c.input[0].dims) == ("m", 4, [1])


def test_enums_by_name_and_number() -> None:
    c = parse_pbtxt(
        "input { data_type: TYPE_FP16 format: 2 } instance_group { kind: KIND_MODEL } instance_group { kind: 1 }"
    )
    assert c.input[0].data_type == pb.DataType.TYPE_FP16
    assert c.input[0].format == pb.ModelInputFormat.NCHW
    assert [g.kind for g in c.instance_group] == [
        pb.ModelInstanceGroupKind.MODEL,
        pb.ModelInstanceGroupKind.GPU,
    ]
    unknown = parse_pbtxt("input { data_type: 99 }").input[0].data_type
    assert int(unknown) == 99
    assert "data_type: 99" in format_pbtxt(parse_pbtxt("input { data_type: 99 }"))


def test_enum_python_alias_is_not_a_proto_name() -> None:
    # betterproto2 shortens KIND_GPU to GPU in Python; the text format uses the proto name only
    with pytest.raises(PbtxtError, match='unknown enumeration value "GPU"'):
        parse_pbtxt("instance_group { kind: GPU }")


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        (r'"plain"', "plain"),
        (r"'single'", "single"),
        (r'"tab\tnl\ncr\rbs\\dq\"sq\'q\?"', "tab\tnl\ncr\rbs\\dq\"sq'q?"),
        (r"'a\"b'", 'a"b'),
        (r'"\a\b\f\v"', "\a\b\f\v"),
        (r'"\x41\x4a\x7"', "AJ\x07"),
        (r'"\101\102\0\12"', "AB\x00\n"),
        (r'"\u00e9\U0001F600"', "\u00e9\U0001f600"),
        (r'"\303\251"', "\u00e9"),  # octal-escaped UTF-8 bytes, as protobuf writes them
        ('"caf\u00e9 \u6f22\u5b57"', "caf\u00e9 \u6f22\u5b57"),
        (r'"con" "cat" ' + "'en' \n \"ation\"", "concatenation"),
        (r'"a" "\x42" "c"', "aBc"),
        (r'""', ""),
        (r'"# not a comment"', "# not a comment"),
    ],
)
def test_strings(literal: str, expected: str) -> None:
    assert parse_pbtxt(f"name: {literal}").name == expected


@pytest.mark.parametrize(
    ("field", "literal", "expected"),
    [
        ("max_batch_size", "-5", -5),
        ("max_batch_size", "- 5", -5),
        ("max_batch_size", "0x1F", 31),
        ("max_batch_size", "0X10", 16),
        ("max_batch_size", "017", 15),
        ("max_batch_size", "0", 0),
        ("max_batch_size", "2147483647", 2**31 - 1),
        ("max_batch_size", "-2147483648", -(2**31)),
    ],
)
def test_integers(field: str, literal: str, expected: int) -> None:
    assert getattr(parse_pbtxt(f"{field}: {literal}"), field) == expected


def test_int64_and_uint64_ranges() -> None:
    c = parse_pbtxt("input { dims: [-9223372036854775808, 9223372036854775807] }")
    assert c.input[0].dims == [-(2**63), 2**63 - 1]
    db = parse_pbtxt(
        "dynamic_batching { max_queue_delay_microseconds: 18446744073709551615 }"
    ).dynamic_batching
    assert db is not None and db.max_queue_delay_microseconds == 2**64 - 1
    with pytest.raises(PbtxtError, match="out of range"):
        parse_pbtxt("dynamic_batching { max_queue_delay_microseconds: 18446744073709551616 }")
    with pytest.raises(PbtxtError, match="out of range"):
        parse_pbtxt("dynamic_batching { max_queue_delay_microseconds: -1 }")
    with pytest.raises(PbtxtError, match="out of range"):
        parse_pbtxt("max_batch_size: 2147483648")
    with pytest.raises(PbtxtError, match="out of range"):
        parse_pbtxt("max_batch_size: " + "9" * 5000)


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        ("1", 1.0),
        ("-2", -2.0),
        ("1.5", 1.5),
        ("1e-3", 0.001),
        ("1E+2", 100.0),
        ("-2.5e2", -250.0),
        (".5", 0.5),
        ("5.", 5.0),
        ("2.0f", 2.0),
        ("3F", 3.0),
        ("0x10", 16.0),
        ("inf", math.inf),
        ("-inf", -math.inf),
        ("Infinity", math.inf),
        ("-INF", -math.inf),
    ],
)
def test_floats(literal: str, expected: float) -> None:
    c = parse_pbtxt(f"model_metrics {{ metric_control {{ histogram_options {{ buckets: [{literal}] }} }} }}")
    assert c.model_metrics is not None
    options = c.model_metrics.metric_control[0].histogram_options
    assert options is not None and options.buckets == [expected]


def test_nan() -> None:
    c = parse_pbtxt("sequence_batching { direct { minimum_slot_utilization: nan } }")
    assert c.sequence_batching is not None and c.sequence_batching.direct is not None
    assert math.isnan(c.sequence_batching.direct.minimum_slot_utilization)
    assert "minimum_slot_utilization: nan" in format_pbtxt(c)


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        ("true", True),
        ("false", False),
        ("True", True),
        ("False", False),
        ("t", True),
        ("f", False),
        ("1", True),
        ("0", False),
    ],
)
def test_booleans(literal: str, expected: bool) -> None:
    c = parse_pbtxt(f"input {{ optional: {literal} }}")
    assert c.input[0].optional is expected


@pytest.mark.parametrize("literal", ["2", "yes", '"true"', "-1", "TRUE"])
def test_bad_booleans(literal: str) -> None:
    with pytest.raises(PbtxtError, match="expected a boolean"):
        parse_pbtxt(f"input {{ optional: {literal} }}")


def test_maps_repeated_key_and_list_form_and_defaults() -> None:
    c = parse_pbtxt(
        'parameters { key: "a" value { string_value: "1" } }'
        ' parameters [ { key: "b" value { string_value: "2" } }, { value { string_value: "3" } } ]'
        ' parameters { key: "c" }'
        ' parameters { value: { string_value: "x" } key: "d" }'
        ' parameters { key: "a" value { string_value: "last wins" } }'
    )
    assert c.parameters == {
        "a": pb.ModelParameter(string_value="last wins"),
        "b": pb.ModelParameter(string_value="2"),
        "": pb.ModelParameter(string_value="3"),
        "c": pb.ModelParameter(),
        "d": pb.ModelParameter(string_value="x"),
    }


def test_oneof_members() -> None:
    c = parse_pbtxt("version_policy { all {} }")
    assert c.version_policy == pb.ModelVersionPolicy(all=pb.ModelVersionPolicyAll())
    assert format_pbtxt(c) == "version_policy {\n  all {}\n}\n"
    c = parse_pbtxt("model_warmup { inputs { key: 'x' value { zero_data: false } } }")
    assert c.model_warmup[0].inputs["x"].zero_data is False  # set to false, distinct from unset
    assert parse_pbtxt(format_pbtxt(c)) == c
    with pytest.raises(PbtxtError, match='another member of oneof "policy_choice"'):
        parse_pbtxt("version_policy { all {} latest { num_versions: 2 } }")
    with pytest.raises(PbtxtError, match='another member of oneof "scheduling_choice"'):
        parse_pbtxt("dynamic_batching {} ensemble_scheduling {}")
    # the same member twice merges, as protobuf does
    c = parse_pbtxt("version_policy { latest { num_versions: 2 } latest { } }")
    assert c.version_policy == pb.ModelVersionPolicy(latest=pb.ModelVersionPolicyLatest(num_versions=2))


def test_singular_fields_last_wins_and_messages_merge() -> None:
    c = parse_pbtxt('name: "a" name: "b" dynamic_batching { max_queue_delay_microseconds: 5 } '
                    "dynamic_batching { preserve_ordering: true }")  # fmt: skip
    assert c.name == "b"
    assert c.dynamic_batching == pb.ModelDynamicBatching(
        max_queue_delay_microseconds=5, preserve_ordering=True
    )


def test_bytes_input_and_other_messages() -> None:
    assert parse_pbtxt('name: "caf\xc3\xa9"'.encode("latin-1")).name == "caf\u00e9"
    step = parse_message('model_name: "m" input_map { key: "a" value: "b" }', pb.ModelEnsemblingStep)
    assert step == pb.ModelEnsemblingStep(model_name="m", input_map={"a": "b"})


# ---------------------------------------------------------------- errors


def _error(text: str | bytes) -> PbtxtError:
    with pytest.raises(PbtxtError) as info:
        parse_pbtxt(text, filename="models/m/config.pbtxt")
    err = info.value
    assert isinstance(err, TritonError) and err.code is Code.INVALID_ARG
    assert err.message == f"models/m/config.pbtxt:{err.line}:{err.column}: {err.reason}"
    return err


@pytest.mark.parametrize(
    ("text", "line", "column", "reason"),
    [
        ('name: "m"\nbogus: 1', 2, 1, 'message type "inference.ModelConfig" has no field named "bogus"'),
        (
            'input {\n  name: "x"\n  dimz: [1]\n}',
            3,
            3,
            'message type "inference.ModelInput" has no field named "dimz"',
        ),
        ("input {\n  data_type: TYPE_FP99\n}", 2, 14, 'unknown enumeration value "TYPE_FP99"'),
        ("max_batch_size 8", 1, 16, 'expected ":", found "8"'),
        ('max_batch_size: "8"', 1, 17, 'expected an integer for field "max_batch_size", found ""8""'),
        ("max_batch_size: 1.5", 1, 17, "expected an integer"),
        ("max_batch_size: 08", 1, 17, "expected an integer"),
        ("name: 5", 1, 7, 'expected a string for field "name"'),
        (
            'input { name: "x"',
            1,
            18,
            'expected "}" to close message inference.ModelInput, found end of input',
        ),
        ('input < name: "x" }', 1, 19, "expected a field name"),
        ("input [ { } { } ]", 1, 13, 'expected ",", found "{"'),
        ("input [ { }, ]", 1, 14, 'expected "{" or "<" to start field "input", found "]"'),
        ("version_policy: 3", 1, 17, 'expected "{" or "<"'),
        ('name: ["a"]', 1, 7, 'field "name" is not repeated'),
        ("dynamic_batching [ {} ]", 1, 18, 'field "dynamic_batching" is not repeated'),
        ('name: "abc', 1, 7, "unterminated string literal"),
        ('name: "ab\ncd"', 1, 7, "unterminated string literal"),
        ('name: "a\\qb"', 1, 9, 'invalid escape sequence "\\q"'),
        ('name: "\\777"', 1, 8, "out of range"),
        ('name: "\\uD800"', 1, 8, "invalid unicode escape"),
        ('name: "\\xff"', 1, 7, 'string for field "name" is not valid UTF-8'),
        ("name: @", 1, 7, 'unexpected character "@"'),
        ("}", 1, 1, 'expected a field name, found "}"'),
        ("[ext.field]: 1", 1, 1, "extension and Any fields"),
        ("input { dims: [1, 2 }", 1, 21, 'expected ",", found "}"'),
        ("input { dims: [1 2] }", 1, 18, 'expected ",", found "2"'),
        ("max_batch_size: 12abc", 1, 17, "expected an integer"),
        ("max_batch_size:", 1, 16, "found end of input"),
        ("\n\n   max_batch_size: -x", 3, 21, 'found "x"'),
        ('instance_group { kind: "KIND_GPU" }', 1, 24, "expected an enum value"),
    ],
)
def test_error_positions(text: str, line: int, column: int, reason: str) -> None:
    err = _error(text)
    assert reason in err.reason
    assert (err.line, err.column) == (line, column), err.message


def test_invalid_utf8_position() -> None:
    err = _error(b'name: "ok"\n  # \xff\n')
    assert (err.line, err.column) == (2, 5) and "not valid UTF-8" in err.reason


def test_default_filename() -> None:
    with pytest.raises(PbtxtError, match=r"^<string>:1:1: "):
        parse_pbtxt("nope: 1")


# ---------------------------------------------------------------- writer and round trips


def test_format_example() -> None:
    c = pb.ModelConfig(
        name="m",
        max_batch_size=8,
        input=[pb.ModelInput(name="IN", data_type=pb.DataType.TYPE_STRING, dims=[-1, 2])],
        instance_group=[pb.ModelInstanceGroup(kind=pb.ModelInstanceGroupKind.CPU, count=2)],
        parameters={"k": pb.ModelParameter(string_value='q"\\\n\x01')},
    )
    assert format_pbtxt(c) == (
        'name: "m"\n'
        "max_batch_size: 8\n"
        "input {\n"
        '  name: "IN"\n'
        "  data_type: TYPE_STRING\n"
        "  dims: [-1, 2]\n"
        "}\n"
        "instance_group {\n"
        "  kind: KIND_CPU\n"
        "  count: 2\n"
        "}\n"
        "parameters {\n"
        '  key: "k"\n'
        "  value {\n"
        '    string_value: "q\\"\\\\\\n\\001"\n'
        "  }\n"
        "}\n"
    )
    assert parse_pbtxt(format_pbtxt(c)) == c
    assert format_pbtxt(pb.ModelConfig()) == ""


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages(pb.ModelConfig))
def test_round_trip_model_config(config: pb.ModelConfig) -> None:
    text = format_pbtxt(config)
    assert parse_pbtxt(text) == config
    assert format_pbtxt(parse_pbtxt(text)) == text


ALL_MESSAGES = sorted(
    (
        c
        for _, c in inspect.getmembers(pb, inspect.isclass)
        if issubclass(c, betterproto2.Message) and c is not betterproto2.Message
    ),
    key=lambda c: c.__name__,
)


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=lambda c: c.__name__)
def test_round_trip_every_message(cls: type) -> None:
    """Metadata-driven: every generated message (gRPC ones too: bytes, uint64 maps, scalar oneofs)."""

    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
    @given(messages(cls))
    def check(message: object) -> None:
        assert parse_message(format_pbtxt(message), cls) == message  # type: ignore[arg-type]

    check()
