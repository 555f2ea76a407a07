"""Admission checks (batching/admission.py): the table of known input signatures gives the same
answers as the full check; the queue-delay target's parameter and the load shedder's estimate."""

from __future__ import annotations

import numpy as np
import pytest

from trident.batching import admission
from trident.batching.admission import (
    MAX_QUEUE_DELAY_TARGET_US,
    QUEUE_DELAY_PARAMETER,
    LoadShedder,
    check_input,
    queue_delay_target_us,
    validate_request,
)
from trident.errors import Code, TritonError
from trident.protocol.generated.inference import ModelConfig, ModelParameter
from trident.types import InferenceRequest, RequestedOutput, Tensor, TensorSpec

INPUTS = {"IN": TensorSpec("IN", "FP32", [4]), "OPT": TensorSpec("OPT", "INT32", [1], optional=True)}
OUTPUTS = {"OUT": TensorSpec("OUT", "FP32", [4])}  # dims without the batch dimension


def _request(*tensors: Tensor, outputs: list[RequestedOutput] | None = None) -> InferenceRequest:
    return InferenceRequest("m", list(tensors), outputs=outputs or [])


def _fp32(shape: tuple[int, ...], data_shape: tuple[int, ...] | None = None) -> Tensor:
    return Tensor("IN", "FP32", shape, np.zeros(data_shape or shape, np.float32))


def _check(request: InferenceRequest, known: dict | None, max_batch_size: int = 8) -> int:
    return validate_request("m", max_batch_size, INPUTS, OUTPUTS, request, known)


def test_a_valid_signature_is_remembered_with_its_batch_size():
    known: dict = {}
    assert _check(_request(_fp32((3, 4))), known) == 3
    assert known == {(("IN", "FP32", (3, 4)),): 3}
    assert _check(_request(_fp32((3, 4))), known) == 3
    assert len(known) == 1


def test_a_known_signature_still_checks_each_tensors_data():
    known: dict = {}
    _check(_request(_fp32((2, 4))), known)
    bad = _request(_fp32((2, 4), data_shape=(3, 4)))  # the data does not match the declared shape
    with pytest.raises(TritonError) as e:
        _check(bad, known)
    assert e.value.code == Code.INVALID_ARG
    assert "data does not match its shape [2,4]" in e.value.message
    # the same refusal as without the table
    with pytest.raises(TritonError) as e2:
        _check(bad, None)
    assert e2.value.message == e.value.message


@pytest.mark.parametrize("tensors, fragment", [
    ((Tensor("IN", "INT32", (2, 4), np.zeros((2, 4), np.int32)),), "data-type is 'INT32'"),
    ((_fp32((2, 5)),), "unexpected shape for input 'IN'"),
    ((_fp32((9, 4)),), "batch-size must be <= 8"),
    ((_fp32((2, 4)), _fp32((2, 4))), "specified more than once"),
    ((Tensor("X", "FP32", (1, 4), np.zeros((1, 4), np.float32)),), "unexpected inference input 'X'"),
    ((_fp32((2, 4)), Tensor("OPT", "INT32", (3, 1), np.zeros((3, 1), np.int32))), "batch size does not match"),
    ((), "missing required input(s) ['IN']"),
])
def test_refused_signatures_are_never_remembered(tensors, fragment):
    known: dict = {}
    for _ in range(2):
        with pytest.raises(TritonError) as e:
            _check(_request(*tensors), known)
        assert e.value.code == Code.INVALID_ARG
        assert fragment in e.value.message
    assert known == {}


def test_requests_with_requested_outputs_take_the_full_check():
    known: dict = {}
    good = _request(_fp32((1, 4)), outputs=[RequestedOutput("OUT")])
    assert _check(good, known) == 1
    assert known == {}
    bad = _request(_fp32((1, 4)), outputs=[RequestedOutput("NOPE")])
    with pytest.raises(TritonError, match="unexpected inference output 'NOPE'"):
        _check(bad, known)


def test_order_and_every_input_are_part_of_the_signature():
    known: dict = {}
    opt = Tensor("OPT", "INT32", (2, 1), np.zeros((2, 1), np.int32))
    assert _check(_request(_fp32((2, 4)), opt), known) == 2
    assert _check(_request(opt, _fp32((2, 4))), known) == 2
    assert len(known) == 2
    # a remembered signature with the optional input does not admit one without the required one
    with pytest.raises(TritonError, match="missing required input"):
        _check(_request(opt), known)


def test_unhashable_shapes_take_the_full_check():
    known: dict = {}
    listed = Tensor("IN", "FP32", [2, 4], np.zeros((2, 4), np.float32))  # type: ignore[arg-type]
    assert _check(_request(listed), known) == 2
    assert known == {}


def test_the_table_is_bounded():
    known: dict = {}
    for n in range(admission.SIGNATURES + 3):  # distinct signatures: 1, 2, 3, ... rows
        assert _check(_request(_fp32((n + 1, 4))), known, max_batch_size=1000) == n + 1
        assert 1 <= len(known) <= admission.SIGNATURES
    assert len(known) == 3  # emptied when full, then the last three
    assert (("IN", "FP32", (admission.SIGNATURES + 3, 4)),) in known


# ---- load shedding ------------------------------------------------------------------------------

def _config_with_target(value: str | None) -> ModelConfig:
    config = ModelConfig(name="m")
    if value is not None:
        config.parameters[QUEUE_DELAY_PARAMETER] = ModelParameter(string_value=value)
    return config


@pytest.mark.parametrize(("name", "datatype", "shape"), [
    ("NOPE", "FP32", (1, 4)), ("IN", "BYTES", (1, 4)), ("IN", "FP32", ()), ("IN", "FP32", (1, 5)),
    ("IN", "FP32", (9, 4)),
])
def test_the_early_input_check_refuses_what_the_whole_check_refuses_with_its_words(name, datatype, shape):
    """What a decoder checks before it reads a tensor's data (check_input) is refused by the
    request's whole check too, with the same message."""
    with pytest.raises(TritonError) as early:
        check_input("m", 8, INPUTS, name, datatype, shape)
    data = np.zeros(shape, np.float32) if datatype == "FP32" else np.zeros(shape, object)
    with pytest.raises(TritonError) as whole:
        _check(_request(Tensor(name, datatype, shape, data)), None)
    assert early.value.code == whole.value.code == Code.INVALID_ARG
    assert early.value.message == whole.value.message


def test_the_early_input_check_passes_what_the_model_takes() -> None:
    check_input("m", 8, INPUTS, "IN", "FP32", (8, 4))
    check_input("m", 0, INPUTS, "IN", "FP32", (4,))
    check_input("m", 8, INPUTS, "OPT", "INT32", (2, 1))


def test_queue_delay_target_parameter_overrides_the_default() -> None:
    assert queue_delay_target_us(_config_with_target(None), 5000) == 5000
    assert queue_delay_target_us(_config_with_target(" 250000 "), 5000) == 250000
    assert queue_delay_target_us(_config_with_target("0"), 5000) == 0  # the model opts out


@pytest.mark.parametrize("value", ["-1", "fast", "1.5", "", str(MAX_QUEUE_DELAY_TARGET_US + 1)])
def test_bad_queue_delay_target_is_invalid_arg_naming_it(value: str) -> None:
    with pytest.raises(TritonError) as info:
        queue_delay_target_us(_config_with_target(value), 0)
    assert info.value.code == Code.INVALID_ARG
    assert QUEUE_DELAY_PARAMETER in info.value.message and f"'{value}'" in info.value.message


def test_shedder_refuses_above_the_target_and_admits_once_the_queue_is_short() -> None:
    shed = LoadShedder("m", 100_000)  # 100 ms
    for queued in (0, 5, 1000):
        shed.admit(queued)  # no completion seen yet: no estimate, everything is admitted
    shed.served(0, 50_000_000)  # one request took 50 ms
    assert shed.interval_ns == 50_000_000
    shed.admit(2)  # 100 ms: at the target
    with pytest.raises(TritonError) as info:
        shed.admit(3)  # 150 ms
    assert info.value.code == Code.UNAVAILABLE and "Exceeds queue delay target" in info.value.message
    assert info.value.retry_after_s == 1
    assert shed.refused == 1
    shed.admit(0)  # the queue drained: admitted at once
    assert shed.refused == 1


def test_shedder_interval_ignores_idle_time_and_follows_batches_and_instances() -> None:
    shed = LoadShedder("m", 1_000_000)
    shed.served(0, 10_000_000)
    shed.served(5_000_000_000, 5_010_000_000)  # after 5 s idle: the 10 ms execution counts, not the gap
    assert shed.interval_ns == 10_000_000
    # a batch of 4 requests run in 40 ms: completions 40 ms apart, 4 at a time -> ~10 ms a request
    shed = LoadShedder("m", 1_000_000)
    end = 0
    for _ in range(200):
        start, end = end, end + 40_000_000
        for _ in range(4):
            shed.served(start, end)
    assert 5_000_000 < shed.interval_ns < 15_000_000
    # two instances of 20 ms each, staggered: a completion every 10 ms
    shed = LoadShedder("m", 1_000_000)
    for i in range(200):
        end = 20_000_000 + i * 10_000_000
        shed.served(end - 20_000_000, end)
    assert shed.interval_ns == 10_000_000
    # an out-of-order completion (earlier end) counts as no interval
    shed.served(0, end - 5_000_000)
    assert shed.interval_ns < 10_000_000
