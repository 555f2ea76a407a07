"""Batch-forming decisions (pure): preferred sizes, queue delay, max batch, shape keys."""

from dataclasses import dataclass

import numpy as np
import pytest

from trident.batching.dynamic import BatchRules, Decision, form_batch, shape_key
from trident.protocol.pbtxt import parse_pbtxt as parse_model_config
from trident.types import InferenceRequest, Tensor


@dataclass
class C:
    batch_size: int = 1
    enqueued: float = 0.0
    deadline: float | None = None
    key: object = None


def cands(*sizes, enqueued=0.0, key=None):
    return [C(s, enqueued, None, key) for s in sizes]


GREEDY = BatchRules(True, 8, (8,), 0.0)


def test_nothing_queued_and_batching_off():
    assert form_batch([], GREEDY, 0.0) == Decision(0)
    assert form_batch(cands(1, 1, 1), BatchRules(), 0.0) == Decision(1)


def test_greedy_takes_everything_up_to_max_without_splitting():
    assert form_batch(cands(1, 1, 1), GREEDY, 0.0) == Decision(3)
    assert form_batch(cands(3, 4, 2), GREEDY, 0.0) == Decision(2)  # 3+4=7, +2 would be 9 > 8
    assert form_batch(cands(8, 1), GREEDY, 0.0) == Decision(1)
    assert form_batch(cands(4, 4, 1), GREEDY, 0.0) == Decision(2)


def test_oversized_first_request_goes_alone():
    rules = BatchRules(True, 8, (4,), 0.0)
    assert form_batch(cands(6, 1), rules, 0.0) == Decision(1)


def test_largest_reachable_preferred_size_is_sent_first():
    rules = BatchRules(True, 16, (2, 4, 8), 0.0)
    assert form_batch(cands(*[1] * 6), rules, 0.0) == Decision(4)  # 4 reachable, 8 not
    assert form_batch(cands(*[1] * 9), rules, 0.0) == Decision(8)
    assert form_batch(cands(1, 2, 2, 1), rules, 0.0) == Decision(4)  # totals 1,3,5,6: none preferred, greedy


def test_preferred_prefix_counts_requests_not_elements():
    rules = BatchRules(True, 16, (2, 4, 8), 0.0)
    # sizes 1,1,2 -> running totals 1,2,4: the 4 is reached with three requests
    assert form_batch(cands(1, 1, 2, 3), rules, 0.0) == Decision(3)


def test_no_preferred_reachable_greedy_sends_what_is_there():
    rules = BatchRules(True, 16, (4, 8), 0.0)
    assert form_batch(cands(1, 1, 1), rules, 0.0) == Decision(3)


def test_batches_capped_by_largest_preferred_size_when_no_delay():
    rules = BatchRules(True, 16, (4,), 0.0)
    # totals 3, then 3+3=6 > max preferred: the batch that fits within 4 goes
    assert form_batch(cands(3, 3, 3), rules, 0.0) == Decision(1)


def test_delay_waits_for_a_preferred_size():
    rules = BatchRules(True, 8, (4,), 0.010)
    d = form_batch(cands(1, 1, enqueued=0.0), rules, 0.002)
    assert d.take == 0 and d.wait == pytest.approx(0.008)
    # once the oldest has waited the delay, what is there goes
    assert form_batch(cands(1, 1, enqueued=0.0), rules, 0.010) == Decision(2)
    # a preferred size reached before the delay goes at once
    assert form_batch(cands(1, 1, 1, 1, enqueued=0.0), rules, 0.001) == Decision(4)


def test_delay_measured_from_the_oldest_request_of_the_batch():
    rules = BatchRules(True, 8, (8,), 0.010)
    batch = [C(1, 0.005), C(1, 0.001), C(1, 0.007)]
    d = form_batch(batch, rules, 0.006)
    assert d.take == 0 and d.wait == pytest.approx(0.005)


def test_delay_exceeded_sends_beyond_the_largest_preferred_size_up_to_max():
    rules = BatchRules(True, 8, (2,), 0.010)
    assert form_batch(cands(1, 1, 1), rules, 0.0) == Decision(2)  # before the delay: the preferred 2
    assert form_batch(cands(1, 1, 1), rules, 0.020) == Decision(3)  # after it: everything up to max


def test_full_batch_goes_even_with_delay():
    rules = BatchRules(True, 4, (4,), 1.0)
    assert form_batch(cands(2, 2, 1), rules, 0.0) == Decision(2)
    rules = BatchRules(True, 4, (2,), 1.0)
    assert form_batch(cands(3, 2), rules, 0.0) == Decision(1)  # can never grow: 3+2 > max


def test_timeout_of_a_pending_request_shortens_the_wait():
    rules = BatchRules(True, 8, (8,), 1.0)
    batch = [C(1, 0.0, 0.3), C(1, 0.0, None)]
    d = form_batch(batch, rules, 0.1)
    assert d.take == 0 and d.wait == pytest.approx(0.2)


def test_different_shape_key_closes_the_batch():
    rules = BatchRules(True, 8, (8,), 1.0)
    batch = [C(1, 0.0, None, "a"), C(1, 0.0, None, "a"), C(1, 0.0, None, "b"), C(1, 0.0, None, "a")]
    assert form_batch(batch, rules, 0.0) == Decision(2)


def test_rules_from_config():
    config = parse_model_config(
        'name: "m" max_batch_size: 16 dynamic_batching { preferred_batch_size: [8, 4, 4, 32] '
        "max_queue_delay_microseconds: 2500 }"
    )
    rules = BatchRules.from_config(config)
    assert rules == BatchRules(True, 16, (4, 8), 0.0025)
    assert rules.max_preferred == 8 and rules.limit == 16
    off = BatchRules.from_config(parse_model_config('name: "m" max_batch_size: 16'))
    assert not off.enabled and off.limit == 1
    no_batch_dim = BatchRules.from_config(parse_model_config('name: "m" max_batch_size: 0 dynamic_batching {}'))
    assert no_batch_dim.enabled and no_batch_dim.max_batch_size == 1 and no_batch_dim.max_preferred == 1


def _req(**inputs):
    return InferenceRequest("m", [Tensor.from_numpy(k, np.zeros(v, np.float32)) for k, v in inputs.items()])


def test_shape_key_compares_variable_non_ragged_inputs():
    config = parse_model_config(
        'name: "m" max_batch_size: 8 input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }, '
        '{ name: "C" data_type: TYPE_FP32 dims: [ 3 ] } ]'
    )
    key = shape_key(config)
    assert key(_req(A=(1, 4), B=(1, 2), C=(1, 3))) == key(_req(A=(2, 4), B=(1, 9), C=(2, 3)))
    assert key(_req(A=(1, 4), B=(1, 2), C=(1, 3))) != key(_req(A=(1, 5), B=(1, 2), C=(1, 3)))


def test_shape_key_constant_for_fixed_shapes_and_tracks_optional_inputs():
    fixed = shape_key(parse_model_config('name: "m" max_batch_size: 8 input [ { name: "A" data_type: TYPE_FP32 '
                                         "dims: [ 4 ] } ]"))
    assert fixed(_req(A=(1, 4))) == fixed(_req(A=(3, 4))) is None
    optional = shape_key(parse_model_config(
        'name: "m" max_batch_size: 8 input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]'
    ))
    assert optional(_req(A=(1, 4))) != optional(_req(A=(1, 4), B=(1, 4)))
    assert optional(_req(A=(1, 4), B=(1, 4))) == optional(_req(A=(2, 4), B=(2, 4)))
