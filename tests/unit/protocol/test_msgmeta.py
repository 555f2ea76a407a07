"""Message metadata and the protobuf JSON mapping: metadata facts and hypothesis round trips."""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import betterproto2
import pytest
from hypothesis import HealthCheck, given, settings

from trident.errors import Code, TritonError
from trident.protocol.generated import inference as pb
from trident.protocol.msgmeta import enum_names, enum_values, message_from_json, message_info, message_to_json


def _load_strategies():  # a helper module next to this file (tests are not a package)
    spec = importlib.util.spec_from_file_location(
        "message_strategies", Path(__file__).with_name("message_strategies.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


messages = _load_strategies().messages


def test_model_config_metadata() -> None:
    info = message_info(pb.ModelConfig)
    assert info.full_name == "inference.ModelConfig"
    assert [f.name for f in info.fields][:6] == [
        "name",
        "platform",
        "backend",
        "runtime",
        "version_policy",
        "max_batch_size",
    ]
    assert info.by_json_name["maxBatchSize"] is info.by_name["max_batch_size"]
    assert {f.name for f in info.oneofs["scheduling_choice"]} == {
        "dynamic_batching",
        "sequence_batching",
        "ensemble_scheduling",
    }
    params = info.by_name["parameters"]
    assert params.map_key is not None and params.map_value is not None
    assert (
        params.map_key.proto_type == betterproto2.TYPE_STRING
        and params.map_value.py_type is pb.ModelParameter
    )
    dims = message_info(pb.ModelInput).by_name["dims"]
    assert dims.repeated and dims.proto_type == betterproto2.TYPE_INT64 and dims.py_type is int
    assert message_info(pb.ModelInput).by_name["reshape"].has_presence
    assert not message_info(pb.ModelInput).by_name["name"].has_presence
    pqp = message_info(pb.ModelDynamicBatching).by_name["priority_queue_policy"]
    assert pqp.map_key is not None and pqp.map_key.proto_type == betterproto2.TYPE_UINT64
    # python keyword attributes map back to the proto name
    resource = message_info(pb.ModelRateLimiterResource).by_name["global"]
    assert resource.attr == "global_"
    zero = message_info(pb.ModelWarmupInput).by_name["zero_data"]
    assert zero.group == "input_data_type" and zero.has_presence
    assert message_info(pb.ModelConfig) is info  # cached


def test_enum_names_use_proto_spelling() -> None:
    assert enum_values(pb.ModelInstanceGroupKind)["KIND_GPU"] is pb.ModelInstanceGroupKind.GPU
    assert "GPU" not in enum_values(pb.ModelInstanceGroupKind)
    assert enum_names(pb.ModelInputFormat) == {0: "FORMAT_NONE", 1: "FORMAT_NHWC", 2: "FORMAT_NCHW"}
    assert enum_names(pb.DataType)[13] == "TYPE_STRING"


def test_message_to_json_prints_defaults_and_omits_unset_messages() -> None:
    assert message_to_json(pb.ModelInput()) == {
        "name": "",
        "data_type": "TYPE_INVALID",
        "format": "FORMAT_NONE",
        "dims": [],
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": False,
        "is_non_linear_format_io": False,
    }
    assert message_to_json(pb.ModelWarmupInput(zero_data=False)) == {
        "data_type": "TYPE_INVALID",
        "dims": [],
        "zero_data": False,
    }


def test_message_from_json_errors_carry_paths() -> None:
    with pytest.raises(TritonError, match=r"step\[1\]\.input_map\[\"a\"\]: expected a string") as info:
        message_from_json(pb.ModelEnsembling, {"step": [{}, {"input_map": {"a": 1}}]})
    assert info.value.code is Code.INVALID_ARG


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages(pb.ModelConfig))
def test_json_round_trip_model_config(config: pb.ModelConfig) -> None:
    text = json.dumps(message_to_json(config), allow_nan=False)
    assert message_from_json(pb.ModelConfig, json.loads(text)) == config


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(messages(pb.ModelConfig))
def test_json_round_trip_camel_case(config: pb.ModelConfig) -> None:
    """The lowerCamelCase names that protobuf's JSON printer uses by default are accepted too."""

    def camel(value: object, cls: type) -> object:
        if not isinstance(value, dict):
            return value
        info = message_info(cls)
        out = {}
        for key, item in value.items():
            field = info.by_name[key]
            if field.map_value is not None:
                sub = field.map_value.py_type if field.map_value.is_message else None
                item = {k: camel(v, sub) if sub else v for k, v in item.items()}
            elif field.proto_type == betterproto2.TYPE_MESSAGE:
                item = (
                    [camel(v, field.py_type) for v in item] if field.repeated else camel(item, field.py_type)
                )
            out[field.json_name] = item
        return out

    assert message_from_json(pb.ModelConfig, camel(message_to_json(config), pb.ModelConfig)) == config


ALL_MESSAGES = sorted(
    (
        c
        for _, c in inspect.getmembers(pb, inspect.isclass)
        if issubclass(c, betterproto2.Message) and c is not betterproto2.Message
    ),
    key=lambda c: c.__name__,
)


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=lambda c: c.__name__)
def test_json_round_trip_every_message(cls: type) -> None:
    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
    @given(messages(cls))
    def check(message: object) -> None:
        text = json.dumps(message_to_json(message), allow_nan=False)  # type: ignore[arg-type]
        assert message_from_json(cls, json.loads(text)) == message

    check()
