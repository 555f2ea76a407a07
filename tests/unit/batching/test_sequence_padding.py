"""Direct sequence batching: stable batch indexes and null requests padding idle slots."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from trident.backends.sequence_io import controls_of
from trident.batching.sequence import NullResponder, SequenceScheduler, _SequenceInstance
from trident.batching.sequence_rules import direct_layout
from trident.batching.state import SequenceState, StateSpec, null_inputs
from trident.errors import TritonError
from trident.protocol.pbtxt import parse_pbtxt
from trident.server.execution import Pending
from trident.types import InferenceRequest, InferenceResponse, Tensor

CONFIG = '''
name: "acc" max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  direct { max_queue_delay_microseconds: 100000 minimum_slot_utilization: 0.75 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
'''

Row = tuple[int, bool, int, int, int, bool]  # (CORRID, READY, START, END, X, is a null request)


# ---- pure decisions --------------------------------------------------------------------------


def test_direct_layout_puts_each_request_at_its_slot_and_pads_below_the_highest() -> None:
    assert direct_layout([]) == []
    assert direct_layout([0]) == [0]
    assert direct_layout([1]) == [None, 0]  # slot 0 idle: a null request; nothing above slot 1
    assert direct_layout([3, 0]) == [1, None, None, 0]
    assert direct_layout([0, 1, 2, 3]) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        direct_layout([1, 1])
    with pytest.raises(ValueError):
        direct_layout([-1])


def test_null_inputs_are_zero_filled_not_ready_and_carry_no_sequence() -> None:
    config = parse_pbtxt(CONFIG.replace("TYPE_UINT64", "TYPE_STRING"))
    spec = StateSpec("S_IN", "S_OUT", "INT32", (2,), np.array([7, 8], np.int32))
    client = [Tensor("X", "INT32", (1, 3), np.arange(3, dtype=np.int32).reshape(1, 3)),
              Tensor("B", "BYTES", (1, 2), np.array([[b"a", b"bc"]], dtype=object))]
    got = {t.name: t for t in null_inputs(client, controls_of(config), SequenceState([spec], True), True)}
    assert got["X"].shape == (1, 3) and got["X"].data.dtype == np.int32 and not got["X"].data.any()
    assert got["B"].data.tolist() == [[b"", b""]]
    assert [got[n].data.reshape(-1).tolist() for n in ("START", "END", "READY")] == [[0], [0], [False]]
    assert got["READY"].shape == (1, 1) and got["CORRID"].data.tolist() == [[b""]]
    assert got["S_IN"].data.tolist() == [[7, 8]]  # the initial state; nothing kept
    numeric = null_inputs(client, controls_of(parse_pbtxt(CONFIG)), SequenceState([], True), True)
    assert next(t for t in numeric if t.name == "CORRID").data.tolist() == [[0]]


def test_null_responder_discards_and_completes() -> None:
    sink = NullResponder()
    sink.send(InferenceResponse(), final=False)
    sink.send(None, final=True)
    assert sink.complete and sink.sent == 2 and not sink.is_cancelled()
    with pytest.raises(TritonError):
        sink.send(None, final=True)


class Recorder:
    """A fake instance: Y = X + S_IN, S_OUT = Y; records every row of every batch it gets."""

    def __init__(self) -> None:
        self.batches: list[list[Row]] = []

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        rows, out = [], []
        for r in requests:
            t = {x.name: x.data.reshape(-1)[0].item() for x in r.inputs}
            rows.append((t["CORRID"], t["READY"], t["START"], t["END"], t["X"], isinstance(r.responder, NullResponder)))
            y = r.input("X").data + r.input("S_IN").data  # type: ignore[union-attr]
            out.append(InferenceResponse(outputs=[Tensor("Y", "INT32", y.shape, y), Tensor("S_OUT", "INT32", y.shape, y)]))
        self.batches.append(rows)
        return out


def test_padded_keeps_slots_when_a_request_was_dropped_before_execution() -> None:
    """The executor drops cancelled requests before ``execute``: the others keep their indexes."""
    config = parse_pbtxt(CONFIG)
    scheduler = SequenceScheduler(config, lambda _: None)
    wrapped = _SequenceInstance(Recorder(), scheduler.state, scheduler._null_request)
    kept = InferenceRequest("acc", [Tensor("X", "INT32", (1, 1), np.full((1, 1), 5, np.int32))])
    wrapped.slots[id(kept)] = 2
    batch, real = wrapped.padded([kept])
    assert real == [False, False, True] and batch[2] is kept
    assert all(isinstance(r.responder, NullResponder) and r.parameters == {} for r in batch[:2])
    assert wrapped.slots == {}


# ---- the scheduler task ----------------------------------------------------------------------


def finish(request: InferenceRequest, response: InferenceResponse) -> InferenceResponse:
    return response


class Harness:
    def __init__(self) -> None:
        self.scheduler = SequenceScheduler(parse_pbtxt(CONFIG), lambda _: None)
        self.instance = Recorder()

    async def execute(self, instance: Any, batch: list[Pending]) -> None:
        await trio.sleep(0.01)
        responses = instance.execute([p.request for p in batch])
        for p, r in zip(batch, responses, strict=True):
            p.responder.send(r, final=True)

    async def infer(self, sid: int, x: int, start: bool = False, end: bool = False) -> int:
        params: dict[str, Any] = {"sequence_id": sid, "sequence_start": start, "sequence_end": end}
        request = InferenceRequest("acc", [Tensor("X", "INT32", (1, 1), np.full((1, 1), x, np.int32))],
                                   parameters=params)
        pending = Pending(request, 1, finish)
        self.scheduler.enqueue(pending)
        response = await pending.receive.receive()
        assert response.error is None, response.error
        assert [t.name for t in response.outputs] == ["Y"]
        return int(response.outputs[0].data.reshape(-1)[0])


NULL: Row = (0, False, 0, 0, 0, True)


async def test_sequences_keep_their_batch_index_and_idle_slots_below_are_null(
        autojump_clock: trio.testing.MockClock) -> None:
    h = Harness()
    sums: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, [h.instance], h.execute)
        sums.append(await h.infer(1, 1, start=True))  # slot 0
        sums.append(await h.infer(2, 10, start=True))  # slot 1
        sums.append(await h.infer(3, 100, start=True))  # slot 2
        sums.append(await h.infer(1, 2, end=True))  # slot 0 frees
        sums.append(await h.infer(3, 100))
        sums.append(await h.infer(2, 10))
        sums.append(await h.infer(4, 5, start=True))  # takes the free slot 0
        together: dict[int, int] = {}

        async def step(sid: int, x: int) -> None:
            together[sid] = await h.infer(sid, x, end=True)

        async with trio.open_nursery() as clients:  # 3 of 4 slots ready: one batch
            for sid, x in ((3, 100), (2, 10), (4, 5)):
                clients.start_soon(step, sid, x)
        nursery.cancel_scope.cancel()
    assert sums == [1, 10, 100, 3, 200, 20, 5]
    assert together == {3: 300, 2: 30, 4: 10}  # null rows never touched any sequence's state
    assert h.instance.batches == [
        [(1, True, 1, 0, 1, False)],
        [NULL, (2, True, 1, 0, 10, False)],
        [NULL, NULL, (3, True, 1, 0, 100, False)],
        [(1, True, 0, 1, 2, False)],
        [NULL, NULL, (3, True, 0, 0, 100, False)],  # slot 3 is idle and not sent
        [NULL, (2, True, 0, 0, 10, False)],
        [(4, True, 1, 0, 5, False)],
        [(4, True, 0, 1, 5, False), (2, True, 0, 1, 10, False), (3, True, 0, 1, 100, False)],
    ]
    assert h.scheduler.sequences == {} and h.scheduler.queued() == 0


async def test_oldest_batches_are_never_padded(autojump_clock: trio.testing.MockClock) -> None:
    h = Harness()
    config = CONFIG.replace("direct { max_queue_delay_microseconds: 100000 minimum_slot_utilization: 0.75 }",
                            "oldest { max_candidate_sequences: 4 }")
    h.scheduler = SequenceScheduler(parse_pbtxt(config), lambda _: None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.scheduler.serve, [h.instance], h.execute)
        assert await h.infer(1, 1, start=True) == 1
        assert await h.infer(2, 2, start=True) == 2  # the second candidate, alone in its batch
        assert await h.infer(2, 2, end=True) == 4
        nursery.cancel_scope.cancel()
    assert h.instance.batches == [[(1, True, 1, 0, 1, False)], [(2, True, 1, 0, 2, False)], [(2, True, 0, 1, 2, False)]]
