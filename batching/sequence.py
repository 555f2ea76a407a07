"""The sequence batcher: stateful models, every request of a sequence on one instance.

:class:`SequenceScheduler` is the trio side of :mod:`.sequence_rules`. A request names its
sequence with the ``sequence_id`` parameter (non-zero integer or non-empty string) and flags
its first and last requests with ``sequence_start`` / ``sequence_end``. :meth:`enqueue`
checks them (INVALID_ARG with Triton's messages) and queues the request on its sequence; one
worker task per instance forms batches of its bound sequences; a reaper task frees the slots
of idle sequences.

Before a batch runs, each request gets the configured control tensors (START, END, READY,
CORRID) and the sequence's implicit state as extra inputs (:mod:`.state`); the instance is
wrapped so that state outputs are kept by the server and stripped from the responses.

Idle timeout: the slot is freed, the state forgotten, a line logged, and, when the model
instance defines it (the Python backend forwards it to ``TritonPythonModel``),
``sequence_idle_timeout(correlation_id)`` is called on the instance's thread — Triton tells
the model nothing (its issue 6846). The next request of that sequence needs START again.

Cancellation: a cancelled request reaching the front of its sequence is dropped, and the
sequence's other queued requests are answered CANCELLED and the sequence is released (as
Triton cancels a sequence's pending requests).

Null requests (direct strategy, batching models): every sequence keeps its batch index (its
slot) for its whole life. The instance sees the batch padded up to the highest slot with a
request; a slot below it without one carries a null request (:func:`.state.null_inputs`:
zero inputs shaped like a real request of the batch, READY/START/END false, CORRID 0, no
parameters, so the Python backend shows ``correlation_id() == 0`` and ``flags() == 0``). The
Python backend receives null requests as requests (as Triton's does); framework backends get
them as rows of the merged batch. Their responses (and anything sent through their response
sender) are discarded and they are not counted in the statistics (Triton does not collect
statistics for null requests). Oldest batches are never padded.

Not done here: the rate limiter (``--rate-limit``) does not gate sequence batches; decoupled
models get control tensors but no implicit state; instance counts cannot change in place (the
model reloads).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import trio

from trident.backends.sequence_io import CORRID, END, READY, START, controls_of
from trident.batching.scheduler import ExecuteBatch, Schedulable, Scheduler
from trident.batching.sequence_rules import (
    DIRECT,
    Sequence,
    SequenceRules,
    choose_batch,
    direct_layout,
    free_slot,
    idle_expired,
    next_idle_deadline,
)
from trident.batching.state import SequenceState, control_tensor, null_inputs, states_of
from trident.errors import Code, TritonError, internal, invalid_arg
from trident.protocol.generated.inference import ModelConfig
from trident.types import InferenceRequest, InferenceResponse, RequestedOutput

log = logging.getLogger("trident.sequence")


def sequence_key(request: InferenceRequest) -> int | str | None:
    """The request's correlation id (None when it has none: 0, "" or missing)."""
    sid = request.parameters.get("sequence_id", 0)
    if isinstance(sid, bool) or not isinstance(sid, (int, str)) or sid in (0, ""):
        return None
    return sid


class NullResponder:
    """The responder of a null request: whatever the model sends for it is discarded."""

    def __init__(self) -> None:
        self.complete = False
        self.sent = 0

    def is_cancelled(self) -> bool:
        return False

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        """Discard ``response``. Raises TritonError(INTERNAL) after the final one (as Responder)."""
        if self.complete:
            raise internal("the request has already been completed (a final response was sent)")
        self.sent += 1
        self.complete = final


class _SequenceInstance:
    """An instance seen through the sequence batcher: pads direct batches with null requests,
    keeps state outputs, restores requests."""

    def __init__(self, inner: Any, state: SequenceState,
                 make_null: Callable[[InferenceRequest, int], InferenceRequest] | None = None) -> None:
        self.inner = inner
        self.state = state
        self.make_null = make_null
        #: id(request) -> (number of client inputs, client's requested outputs)
        self.originals: dict[int, tuple[int, list[RequestedOutput]]] = {}
        #: id(request) -> its slot (direct batches of batching models)
        self.slots: dict[int, int] = {}

    def padded(self, requests: list[InferenceRequest]) -> tuple[list[InferenceRequest], list[bool]]:
        """``requests`` at their slots' batch indexes with null requests between them, and
        which entries are real (READY)."""
        slots = [self.slots.pop(id(r), None) for r in requests]
        if self.make_null is None or not requests or None in slots:
            return list(requests), [True] * len(requests)
        layout = direct_layout([s for s in slots if s is not None])
        template = requests[0]
        n = self.originals.get(id(template), (len(template.inputs), []))[0]
        batch = [requests[i] if i is not None else self.make_null(template, n) for i in layout]
        return batch, [i is not None for i in layout]

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse] | None:
        batch, real = self.padded(requests)
        try:
            responses = self.inner.execute(batch)
        finally:
            for r in requests:
                n, outputs = self.originals.pop(id(r), (len(r.inputs), r.outputs))
                del r.inputs[n:]
                r.outputs = outputs
        if responses is None:
            return None
        if len(responses) == len(batch):
            responses = [response for response, ready in zip(responses, real, strict=True) if ready]
        if self.state.specs:
            for r, response in zip(requests, responses, strict=False):
                if response.error is None:
                    response.outputs = self.state.capture(sequence_key(r), response.outputs)
        return responses

    def forget(self, request: InferenceRequest) -> None:
        """Drop what was kept for ``request`` (it did not reach :meth:`execute`)."""
        self.slots.pop(id(request), None)
        kept = self.originals.pop(id(request), None)
        if kept is not None:
            del request.inputs[kept[0]:]
            request.outputs = kept[1]

    @property
    def wrapped_instance(self) -> Any:
        """The model instance: the executor runs the wrapper on that instance's thread."""
        return self.inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SequenceScheduler(Scheduler):
    """Direct and oldest sequence batching for one model version (see module docstring)."""

    def __init__(self, config: ModelConfig, on_drop: Callable[[Any], None], *, model_dir: Path | None = None) -> None:
        super().__init__(on_drop)
        self.model_name = config.name
        self.rules = SequenceRules.from_config(config)
        self.batching = config.max_batch_size > 0
        self.controls = controls_of(config)
        self._numeric_corrid = next((c.datatype for c in self.controls if c.kind == CORRID and c.datatype != "BYTES"),
                                    "")
        self.state = SequenceState(states_of(config, model_dir), self.batching)
        self.sequences: dict[int | str, Sequence] = {}
        self.backlog: deque[Sequence] = deque()
        self.rows: list[list[Sequence | None]] = []
        self._queued = 0
        self._changed = trio.Event()
        self._locks: list[trio.Lock] = []
        self._wrapped: list[_SequenceInstance] = []

    # ---- front door ------------------------------------------------------------------------

    def enqueue(self, item: Schedulable) -> None:
        """Queue ``item`` on its sequence.

        Raises TritonError(INVALID_ARG) for a batch of more than one (a batching model), without
        a correlation id, or when the first request of a sequence (or the first after its END or
        idle timeout) lacks the START flag.
        """
        request = item.request
        if self.batching and item.batch_size > 1:  # Triton's sequence batcher takes one at a time
            raise invalid_arg(f"inference request to model '{self.model_name}' must specify batch-size 1 due "
                              "to requirements of sequence batcher")
        sid = sequence_key(request)
        if sid is None:
            raise invalid_arg(f"inference request to model '{self.model_name}' must specify a non-zero or "
                              "non-empty correlation ID")
        if isinstance(sid, str) and self._numeric_corrid:
            raise invalid_arg(f"inference request to model '{self.model_name}' has string correlation ID "
                              f"'{sid}' but the model's CORRID control input is {self._numeric_corrid}")
        if isinstance(sid, int) and not 0 < sid < 2**64:
            raise invalid_arg(f"correlation ID {sid} of a request to model '{self.model_name}' is not a uint64")
        start = bool(request.parameters.get("sequence_start"))
        end = bool(request.parameters.get("sequence_end"))
        seq = self.sequences.get(sid)
        if not start and (seq is None or seq.ended):
            raise invalid_arg(f"inference request for sequence {sid} to model '{self.model_name}' must specify "
                              "the START flag on the first request of the sequence")
        now = trio.current_time()
        if seq is None:
            seq = self.sequences[sid] = Sequence(sid, last=now)
            self.backlog.append(seq)
        seq.ended = end
        seq.queue.append((now, item))
        seq.last = now
        self._queued += 1
        self._notify()

    def queued(self) -> int:
        return self._queued

    # ---- tasks -----------------------------------------------------------------------------

    async def serve(self, instances: Seq[Any], execute: ExecuteBatch) -> None:
        """Serve batches on ``instances`` and reap idle sequences until cancelled."""
        self.rows = [[None] * self.rules.slots for _ in instances]
        self._locks = [trio.Lock() for _ in instances]
        pad = self.rules.strategy == DIRECT and self.batching
        self._wrapped = [_SequenceInstance(instance, self.state, self._null_request if pad else None)
                         for instance in instances]
        async with trio.open_nursery() as nursery:
            for i in range(len(instances)):
                nursery.start_soon(self._worker, i, execute)
            nursery.start_soon(self._reaper)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _assign(self) -> None:
        while self.backlog:
            place = free_slot(self.rows)
            if place is None:
                return
            seq = self.backlog.popleft()
            seq.instance, seq.slot = place
            self.rows[place[0]][place[1]] = seq

    def _release(self, seq: Sequence) -> None:
        if seq.id in self.sequences and self.sequences[seq.id] is seq:
            del self.sequences[seq.id]
        if seq.instance is not None and seq.slot is not None:
            self.rows[seq.instance][seq.slot] = None
        elif seq in self.backlog:
            self.backlog.remove(seq)
        seq.instance = seq.slot = None
        self.state.drop(seq.id)
        self._notify()

    async def _worker(self, index: int, execute: ExecuteBatch) -> None:
        row = self.rows[index]
        while True:
            self._assign()
            changed = self._changed
            slots, wait = choose_batch(row, self.rules, trio.current_time())
            if not slots:
                with trio.move_on_after(math.inf if wait is None else max(wait, 0.0)):
                    await changed.wait()
                continue
            batch, members = self._form(row, slots, index)
            if not batch:
                continue
            try:
                async with self._locks[index]:
                    await execute(self._wrapped[index], batch)
            finally:
                now = trio.current_time()
                for seq, pending in members:
                    self._wrapped[index].forget(pending.request)  # e.g. dropped as cancelled
                    seq.running = False
                    seq.last = now
                    if pending.request.parameters.get("sequence_end") and not seq.queue:
                        self._release(seq)
                self._notify()

    def _form(self, row: list[Sequence | None], slots: list[int], index: int) -> tuple[list[Any], list[Any]]:
        batch: list[Any] = []
        members: list[tuple[Sequence, Any]] = []
        wrapped = self._wrapped[index]
        for slot in slots:
            seq = row[slot]
            assert seq is not None
            _, pending = seq.queue.popleft()
            self._queued -= 1
            if pending.cancelled:
                self._cancel_sequence(seq, pending)
                continue
            request: InferenceRequest = pending.request
            try:
                extra = self._extra_inputs(seq, request)
            except (TritonError, ValueError, OverflowError) as e:  # e.g. an id that does not fit CORRID's type
                error = e if isinstance(e, TritonError) else invalid_arg(f"sequence {seq.id}: {e}")
                pending.responder.send(InferenceResponse(error=error), final=True)
                continue
            wrapped.originals[id(request)] = (len(request.inputs), list(request.outputs))
            wrapped.slots[id(request)] = slot
            request.inputs.extend(extra)
            if self.state.specs and request.outputs:
                request.outputs = [*request.outputs, *(RequestedOutput(n) for n in self.state.output_names)]
            seq.running = True
            batch.append(pending)
            members.append((seq, pending))
        return batch, members

    def _extra_inputs(self, seq: Sequence, request: InferenceRequest) -> list[Any]:
        """The control tensors and implicit state of ``request``. Raises ValueError/OverflowError
        when the correlation id does not fit the CORRID data type."""
        start = bool(request.parameters.get("sequence_start"))
        flags = {START: start, END: bool(request.parameters.get("sequence_end")), READY: True}
        extra = [control_tensor(c, seq.id if c.kind == CORRID else flags[c.kind], self.batching)
                 for c in self.controls]
        if self.state.specs:
            extra.extend(self.state.tensors(seq.id, start))
        return extra

    def _null_request(self, template: InferenceRequest, client_inputs: int) -> InferenceRequest:
        """A null request shaped like ``template`` (whose first ``client_inputs`` inputs are the
        client's): see the module docstring."""
        inputs = null_inputs(template.inputs[:client_inputs], self.controls, self.state, self.batching)
        request = InferenceRequest(template.model_name, inputs, model_version=template.model_version,
                                   outputs=list(template.outputs))
        request.responder = NullResponder()
        return request

    def _cancel_sequence(self, seq: Sequence, first: Any) -> None:
        self.on_drop(first)
        error = TritonError(Code.CANCELLED, f"sequence {seq.id} of model '{self.model_name}': a request of the "
                                            "sequence was cancelled")
        while seq.queue:
            _, pending = seq.queue.popleft()
            self._queued -= 1
            pending.request.cancel()
            if not pending.responder.complete:
                pending.responder.send(InferenceResponse(error=error), final=True)
        log.info("model '%s': sequence %s cancelled; its queued requests were cancelled", self.model_name, seq.id)
        self._release(seq)

    async def _reaper(self) -> None:
        while True:
            now = trio.current_time()
            for seq in idle_expired(list(self.sequences.values()), now, self.rules.idle):
                instance = seq.instance
                log.warning("model '%s': sequence %s timed out after %.6g s idle; its slot is released",
                            self.model_name, seq.id, self.rules.idle)
                self._release(seq)
                if instance is not None:
                    await self._tell_idle(instance, seq.id)
            changed = self._changed
            deadline = next_idle_deadline(list(self.sequences.values()), self.rules.idle)
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await changed.wait()

    async def _tell_idle(self, index: int, correlation_id: int | str) -> None:
        hook = getattr(self._wrapped[index].inner, "sequence_idle_timeout", None)
        if hook is None:
            return
        async with self._locks[index]:
            try:
                await trio.to_thread.run_sync(hook, correlation_id)
            except Exception:
                log.exception("model '%s': sequence_idle_timeout(%r) failed", self.model_name, correlation_id)
