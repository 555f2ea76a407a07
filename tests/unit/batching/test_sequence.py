"""The sequence batcher: pure slot/READY/idle/batch decisions and the trio task under a mock clock."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from trident.batching.sequence import SequenceScheduler
from trident.batching.sequence_rules import (
    DIRECT,
    OLDEST,
    Sequence,
    SequenceRules,
    choose_batch,
    free_slot,
    idle_expired,
    next_idle_deadline,
    ready_mask,
)
from trident.errors import Code, TritonError
from trident.protocol.pbtxt import parse_pbtxt
from trident.server.execution import Pending
from trident.types import InferenceRequest, InferenceResponse, Tensor


def seq(sid: Any, *fronts: float, running: bool = False, last: float = 0.0, slot: int | None = 0) -> Sequence:
    s = Sequence(sid, last=last, running=running, slot=slot, instance=0 if slot is not None else None)
    for t in fronts:
        s.queue.append((t, object()))
    return s


# ---- pure decisions --------------------------------------------------------------------------


def test_free_slot_prefers_the_emptiest_instance_then_first_free_slot() -> None:
    a, b = seq(1), seq(2)
    assert free_slot([[a, None], [None, None]]) == (1, 0)
    assert free_slot([[a, None], [b, None]]) == (0, 1)
    assert free_slot([[a, b]]) is None
    assert free_slot([]) is None


def test_ready_mask_marks_slots_with_a_queued_request_not_running() -> None:
    row = [seq(1, 0.0), None, seq(2), seq(3, 0.0, running=True)]
    assert ready_mask(row) == [True, False, False, False]


def test_direct_waits_for_slot_utilization_until_the_delay() -> None:
    rules = SequenceRules(DIRECT, slots=4, max_batch_size=4, delay=0.5, min_utilization=0.75)
    row = [seq(1, 1.0), None, seq(2, 1.2), None]
    assert choose_batch(row, rules, 1.2) == ([], pytest.approx(0.3))
    assert choose_batch(row, rules, 1.5) == ([0, 2], None)
    row[3] = seq(3, 1.3)
    assert choose_batch(row, rules, 1.3) == ([0, 2, 3], None)  # 3/4 slots ready


def test_direct_without_delay_sends_every_ready_slot_in_slot_order() -> None:
    rules = SequenceRules(DIRECT, slots=3, max_batch_size=3)
    row = [seq(1, 5.0), seq(2, 1.0), seq(3)]
    assert choose_batch(row, rules, 5.0) == ([0, 1], None)
    assert choose_batch([None, seq(9)], rules, 0.0) == ([], None)


def test_oldest_takes_oldest_fronts_up_to_max_batch_and_preferred_sizes() -> None:
    rules = SequenceRules(OLDEST, slots=6, max_batch_size=3, delay=1.0, preferred=(2,))
    row: list[Sequence | None] = [seq(1, 3.0), seq(2, 1.0), seq(3, 2.0), seq(4, 0.5), None, None]
    assert choose_batch(row, rules, 3.0) == ([3, 1, 2], None)  # max batch reached
    row = [seq(1, 3.0), None, None, None, None, None]
    assert choose_batch(row, rules, 3.2) == ([], pytest.approx(0.8))
    assert choose_batch(row, rules, 4.0) == ([0], None)
    row[2] = seq(3, 3.1)
    assert choose_batch(row, rules, 3.2) == ([0, 2], None)  # preferred size 2 reached


def test_idle_expiry_and_next_deadline() -> None:
    idle, busy, queued, unbound = seq(1, last=1.0), seq(2, last=0.0, running=True), seq(3, 0.0), seq(4, slot=None)
    everything = [idle, busy, queued, unbound]
    assert idle_expired(everything, 1.9, 1.0) == []
    assert idle_expired(everything, 2.0, 1.0) == [idle]
    assert next_idle_deadline(everything, 1.0) == 2.0
    assert next_idle_deadline([busy, queued], 1.0) is None


def test_rules_from_config() -> None:
    config = parse_pbtxt('name: "m" max_batch_size: 8 sequence_batching { max_sequence_idle_microseconds: 5000 '
                         'oldest { max_candidate_sequences: 16 preferred_batch_size: [ 4, 32 ] '
                         'max_queue_delay_microseconds: 100 } }')
    rules = SequenceRules.from_config(config)
    assert (rules.strategy, rules.slots, rules.max_batch_size, rules.preferred) == (OLDEST, 16, 8, (4,))
    assert rules.idle == pytest.approx(0.005) and rules.delay == pytest.approx(0.0001)
    direct = SequenceRules.from_config(parse_pbtxt('name: "m" max_batch_size: 4 sequence_batching { direct { '
                                                   'minimum_slot_utilization: 0.5 } }'))
    assert (direct.strategy, direct.slots, direct.min_utilization, direct.idle) == (DIRECT, 4, 0.5, 1.0)


# ---- the scheduler task ----------------------------------------------------------------------

CONFIG = '''
name: "acc" max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 2000000
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
'''


class Accumulator:
    """A fake instance: Y = X + S_IN, S_OUT = Y; records every batch's control tensors."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[list[dict[str, Any]]] = []
        self.idle: list[Any] = []

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        seen, out = [], []
        for r in requests:
            t = {x.name: x for x in r.inputs}
            seen.append({n: t[n].data.reshape(-1)[0].item() for n in ("START", "END", "READY", "CORRID")}
                        | {"shape": t["START"].shape})
            y = t["X"].data + t["S_IN"].data
            out.append(InferenceResponse(outputs=[Tensor("Y", "INT32", y.shape, y), Tensor("S_OUT", "INT32", y.shape, y)]))
        self.batches.append(seen)
        return out

    def sequence_idle_timeout(self, correlation_id: Any) -> None:
        self.idle.append(correlation_id)


def finish(request: InferenceRequest, response: InferenceResponse) -> InferenceResponse:
    return response


class Harness:
    def __init__(self, config: str = CONFIG, instances: int = 1, cost: float = 0.1) -> None:
        self.dropped: list[Any] = []
        self.scheduler = SequenceScheduler(parse_pbtxt(config), self.dropped.append)
        self.instances = [Accumulator(f"i{k}") for k in range(instances)]
        self.cost = cost

    async def execute(self, instance: Any, batch: list[Pending]) -> None:
        await trio.sleep(self.cost)
        responses = instance.execute([p.request for p in batch])
        for p, r in zip(batch, responses, strict=True):
            p.responder.send(r, final=True)

    async def infer(self, sid: Any, x: int, start: bool = False, end: bool = False) -> InferenceResponse:
        params: dict[str, Any] = {"sequence_id": sid}
        if start:
            params["sequence_start"] = True
        if end:
            params["sequence_end"] = True
        data = np.array([[x]], dtype=np.int32)
        pending = Pending(InferenceRequest("acc", [Tensor("X", "INT32", (1, 1), data)], parameters=params), 1, finish)
        self.scheduler.enqueue(pending)
        response = await pending.receive.receive()
        if response.error is not None:
            raise response.error
        return response


async def test_interleaved_sequences_keep_their_state_and_share_batches(autojump_clock: trio.testing.MockClock) -> None:
    h = Harness()
    results: dict[Any, list[int]] = {1: [], 2: []}

    async def run_sequence(sid: Any, values: list[int]) -> None:
        for k, v in enumerate(values):
            r = await h.infer(sid, v, start=k == 0, end=k == len(values) - 1)
            assert [t.name for t in r.outputs] == ["Y"]  # the state output stays in the server
            results[sid].append(int(r.outputs[0].data.reshape(-1)[0]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, h.instances, h.execute)
        async with trio.open_nursery() as clients:
            clients.start_soon(run_sequence, 1, [1, 2, 3])
            clients.start_soon(run_sequence, 2, [10, 20, 30])
        nursery.cancel_scope.cancel()
    assert results == {1: [1, 3, 6], 2: [10, 30, 60]}
    batches = h.instances[0].batches
    assert max(len(b) for b in batches) == 2  # both sequences in one batch
    first = batches[0]
    assert [(c["START"], c["END"], c["READY"]) for c in first] == [(1, 0.0, True), (1, 0.0, True)]
    assert first[0]["shape"] == (1, 1)
    last = [c for c in batches[-1] if c["READY"]]  # a null request pads an idle slot below a busy one
    assert last and all(c["END"] == 1.0 and c["START"] == 0 for c in last)
    assert h.scheduler.sequences == {} and h.scheduler.queued() == 0  # END released the slots


async def test_missing_start_and_missing_id_are_invalid(autojump_clock: trio.testing.MockClock) -> None:
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, h.instances, h.execute)
        with pytest.raises(TritonError) as e:
            await h.infer(7, 1)
        assert e.value.code == Code.INVALID_ARG
        assert "must specify the START flag on the first request of the sequence" in e.value.message
        with pytest.raises(TritonError, match="correlation ID"):
            await h.infer(0, 1, start=True)
        with pytest.raises(TritonError, match="string correlation ID 'x'"):
            await h.infer("x", 1, start=True)  # CORRID is UINT64
        await h.infer(7, 1, start=True, end=True)
        with pytest.raises(TritonError, match="START flag"):
            await h.infer(7, 1)  # the sequence ended
        nursery.cancel_scope.cancel()


async def test_idle_timeout_frees_the_slot_and_tells_the_instance(autojump_clock: trio.testing.MockClock) -> None:
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, h.instances, h.execute)
        assert int((await h.infer(5, 4, start=True)).outputs[0].data[0, 0]) == 4
        await trio.sleep(1.0)
        assert int((await h.infer(5, 1)).outputs[0].data[0, 0]) == 5  # still alive after 1 s (timeout 2 s)
        await trio.sleep(2.5)
        while not h.instances[0].idle:  # the hook runs in the instance's thread
            await trio.sleep(0.01)
        assert h.instances[0].idle == [5] and h.scheduler.sequences == {}
        with pytest.raises(TritonError, match="START flag"):
            await h.infer(5, 1)
        assert int((await h.infer(5, 2, start=True)).outputs[0].data[0, 0]) == 2  # state starts over
        nursery.cancel_scope.cancel()


async def test_sequences_beyond_the_slots_wait_for_a_free_slot(autojump_clock: trio.testing.MockClock) -> None:
    h = Harness(CONFIG.replace("max_batch_size: 4", "max_batch_size: 1"), instances=2)
    order: list[Any] = []

    async def one(sid: int) -> None:
        await h.infer(sid, 1, start=True)
        await h.infer(sid, 1, end=True)
        order.append(sid)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, h.instances, h.execute)
        async with trio.open_nursery() as clients:
            for sid in (1, 2, 3):
                clients.start_soon(one, sid)
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert order[:2] == [1, 2] and order[2] == 3  # the third waited for a slot
    assert all(len(b) == 1 for i in h.instances for b in i.batches)
    assert {c["CORRID"] for c in h.instances[0].batches[0]} == {1}


async def test_cancelling_a_request_cancels_the_sequences_queued_requests(
        autojump_clock: trio.testing.MockClock) -> None:
    h = Harness(cost=1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, h.instances, h.execute)
        await h.infer(3, 1, start=True)
        blocker = Pending(InferenceRequest("acc", [Tensor("X", "INT32", (1, 1), np.ones((1, 1), np.int32))],
                                           parameters={"sequence_id": 3}), 1, finish)
        h.scheduler.enqueue(blocker)  # runs for 1 s
        await trio.sleep(0.1)
        cancelled = Pending(InferenceRequest("acc", [Tensor("X", "INT32", (1, 1), np.ones((1, 1), np.int32))],
                                             parameters={"sequence_id": 3}), 1, finish)
        follower = Pending(InferenceRequest("acc", [Tensor("X", "INT32", (1, 1), np.ones((1, 1), np.int32))],
                                            parameters={"sequence_id": 3}), 1, finish)
        h.scheduler.enqueue(cancelled)
        h.scheduler.enqueue(follower)
        cancelled.request.cancel()
        assert (await blocker.receive.receive()).error is None
        response = await follower.receive.receive()
        assert response.error is not None and response.error.code == Code.CANCELLED
        assert h.dropped == [cancelled] and h.scheduler.sequences == {}
        nursery.cancel_scope.cancel()


async def test_oldest_strategy_batches_one_request_per_sequence(autojump_clock: trio.testing.MockClock) -> None:
    config = CONFIG.replace("direct { }", "oldest { max_candidate_sequences: 4 }")
    h = Harness(config)
    sums: dict[int, int] = {}

    async def run_sequence(sid: int) -> None:
        for k in range(3):
            r = await h.infer(sid, sid, start=k == 0, end=k == 2)
        sums[sid] = int(r.outputs[0].data[0, 0])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, h.instances, h.execute)
        async with trio.open_nursery() as clients:
            for sid in (1, 2, 3):
                clients.start_soon(run_sequence, sid)
        nursery.cancel_scope.cancel()
    assert sums == {1: 3, 2: 6, 3: 9}
    for batch in h.instances[0].batches:
        ids = [c["CORRID"] for c in batch]
        assert len(ids) == len(set(ids))
    assert max(len(b) for b in h.instances[0].batches) == 3


async def test_an_id_that_does_not_fit_corrid_fails_only_its_request(autojump_clock: trio.testing.MockClock) -> None:
    h = Harness(CONFIG.replace("data_type: TYPE_UINT64", "data_type: TYPE_INT64"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, h.instances, h.execute)
        with pytest.raises(TritonError) as e:
            await h.infer(2**63, 1, start=True)
        assert e.value.code == Code.INVALID_ARG and str(2**63) in e.value.message
        assert int((await h.infer(2**62, 1, start=True, end=True)).outputs[0].data[0, 0]) == 1
        nursery.cancel_scope.cancel()
