"""The dynamic batcher: the trio task that turns a model version's queue into batches.

One :class:`DynamicScheduler` per model version runs in the version's nursery: a batcher task
and one worker task per instance. The batcher applies the queue policies
(:mod:`trident.batching.policy`) and the batch-forming rules (:func:`form_batch`) whenever a
request arrives, an instance becomes idle or a delay/timeout elapses, and hands each batch to
an idle instance's worker. Where there is nothing to time (no queue delay, no queue timeout)
a request that finds an instance idle wakes that instance's worker instead, which forms the
batch itself at its turn, after the tasks of the request's loop round (and of the round its
turn falls in, when that one has other tasks) have queued theirs: they share the batch, and
neither a hop through the batcher task nor its round is spent. A worker also takes the next
batch itself when it finishes one. A worker holds its instance's rate-limiter resources (when
``--rate-limit`` is on) while it executes. Without ``dynamic_batching`` the same scheduler
runs each request alone (Triton's default scheduler).

``preserve_ordering``: each request gets a :class:`Turn` when it leaves the queue; its waiter
delivers responses only after every request that left the queue before it has finished, so
responses come back in order even with several instances.

Instances can be added and retired while running (an instance-count change without reload):
a retired instance finishes its current batch first.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import trio

from trident.batching import rounds
from trident.batching.dynamic import BatchRules, form_batch
from trident.batching.policy import (
    TIMEOUT_EXPIRED,
    Entry,
    Priorities,
    PriorityQueue,
    request_priority,
    request_timeout_us,
)
from trident.batching.scheduler import ExecuteBatch, Schedulable, Scheduler
from trident.errors import TritonError, unavailable
from trident.observability.logs import VERBOSE
from trident.types import InferenceResponse

log = logging.getLogger("trident.batcher")


class Turn:
    """A request's place in the response order (``preserve_ordering``)."""

    __slots__ = ("_before", "_done")

    def __init__(self, before: trio.Event | None) -> None:
        self._before = before
        self._done = trio.Event()

    async def wait(self) -> None:
        """Wait until every earlier request has finished. Cancellation: just stops waiting."""
        if self._before is not None:
            await self._before.wait()

    def finish(self) -> None:
        """This request is done (idempotent); the next one may deliver."""
        self._done.set()


class Sequencer:
    """Hands out :class:`Turn` objects in dequeue order."""

    def __init__(self) -> None:
        self._last: trio.Event | None = None

    def next(self) -> Turn:
        turn = Turn(self._last)
        self._last = turn._done
        return turn


def reject(item: Any, error: TritonError) -> None:
    """Answer a queued request with ``error`` through its responder (the default on_reject)."""
    item.request.responder.send(InferenceResponse(error=error), final=True)


#: what an idle worker is sent instead of a batch when it is to form the batch itself
_FORM: list[Any] = []


class _Worker:
    __slots__ = ("instance", "send", "receive", "retiring", "done")

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self.send, self.receive = trio.open_memory_channel[list[Any] | None](1)  # a batch, _FORM or None
        self.retiring = False
        self.done = trio.Event()


class DynamicScheduler(Scheduler):
    """Triton's dynamic batch scheduler (and, with batching off, its default scheduler)."""

    supports_instance_update = True

    def __init__(self, rules: BatchRules, priorities: Priorities, on_drop: Callable[[Any], None], *,
                 key: Callable[[Any], Hashable] | None = None, preserve_ordering: bool = False,
                 rate_limiter: Any = None, on_reject: Callable[[Any, TritonError], None] = reject) -> None:
        super().__init__(on_drop)
        self.rules = rules
        self.priorities = priorities
        self._queue = PriorityQueue(priorities)
        default_policy = priorities.policy_of(priorities.default_level)
        # where a request without parameters waits: (level, policy, queue timeout in µs)
        self._plain = (priorities.default_level, default_policy, default_policy.timeout_us(0))
        self._key = key
        self._sequencer = Sequencer() if preserve_ordering else None
        self._rate_limiter = rate_limiter
        self._on_reject = on_reject
        self._idle: deque[_Worker] = deque()
        self._workers: dict[int, _Worker] = {}
        self._wakeup = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._execute: ExecuteBatch | None = None
        self._pending_starts: list[_Worker] = []
        self._forming = False  # a worker is woken to form a batch (see enqueue)
        self._round: rounds.Round | None = None  # this run's rounds, once serving
        # the loop's clock, read directly once serving (trio.current_time() is three calls deep)
        self._now: Callable[[], float] = trio.current_time

    # ---- front door -----------------------------------------------------------------------

    def enqueue(self, item: Schedulable) -> None:
        """Queue ``item`` at its priority level with its timeout. Never waits.

        Raises TritonError UNAVAILABLE "Exceeds maximum queue size" when its level is full.
        """
        now = self._now()
        parameters = item.request.parameters
        if parameters:
            level = self.priorities.level_of(request_priority(parameters))
            policy = self.priorities.policy_of(level)
            timeout_us = policy.timeout_us(request_timeout_us(parameters))
        else:  # the usual request: the default level and its policy's timeout
            level, policy, timeout_us = self._plain
        deadline = now + timeout_us / 1_000_000 if timeout_us else None
        key = self._key(item.request) if self._key is not None else None
        entry = Entry(item, level, now, deadline, key, item.batch_size)
        if policy.max_queue_size and self._queue.level_size(level) >= policy.max_queue_size:
            self._queue.remove_cancelled(self._drop)
        self._queue.push(entry)
        if not self.rules.enabled:
            if self._idle:
                # no batching and an instance is free: hand it the request now rather than in
                # the batcher task's next round
                self.step(now)
                if not len(self._queue):
                    return
        elif deadline is None and not self.rules.max_queue_delay:
            # nothing to time: an idle instance's worker forms the batch itself at its turn,
            # after every request of this loop round has queued (they share the batch), with
            # no hop through the batcher task
            if self._forming:
                return  # a worker already woken for that takes this request too
            if self._idle:
                self._forming = True
                self._idle.popleft().send.send_nowait(_FORM)
                return
        self._wakeup.set()

    def queued(self) -> int:
        return len(self._queue)

    def claim(self) -> _Worker | None:
        """An idle instance for a request to run on now, in the caller's task, or None.

        Only when Triton's scheduler would hand the request to that instance at once, alone,
        anyway: nothing queued, no rate limiter (which gates executions), no response
        ordering, and either batching off or dynamic batching with no queue delay and the
        request alone in its loop round (:mod:`trident.batching.rounds`: no other request
        could join its batch before the batcher's turn; under concurrency requests keep
        sharing batches). Saves the queue entry and the hand-offs to the batcher and worker
        tasks. The caller must :meth:`release` the slot once the execution is over.
        """
        if self._rate_limiter is not None or self._sequencer is not None:
            return None
        if not self._idle or len(self._queue):
            return None
        if self.rules.enabled and (self.rules.max_queue_delay or self._round is None or not self._round.alone()):
            return None
        return self._idle.popleft()

    def release(self, slot: Any) -> None:
        """The claimed instance is free again: it takes what queued meanwhile, or idles."""
        worker: _Worker = slot
        if worker.retiring:
            worker.send.send_nowait(None)  # its worker task ends; remove_instance returns
            return
        self._idle.append(worker)
        if len(self._queue):
            self.step(self._now())
            if len(self._queue):
                self._wakeup.set()

    def delivers_at_once(self) -> bool:
        """No ``preserve_ordering``: a response goes out as soon as it is sent."""
        return self._sequencer is None

    def next_turn(self) -> Turn | None:
        """A turn in the response order for a request answered without queueing (cache hit)."""
        return self._sequencer.next() if self._sequencer is not None else None

    def _drop(self, entry: Entry) -> None:
        self.on_drop(entry.item)

    # ---- instances ------------------------------------------------------------------------

    async def serve(self, instances: Sequence[Any], execute: ExecuteBatch) -> None:
        """Batch and execute until cancelled (by the model version's nursery)."""
        self._execute = execute
        self._round = rounds.current()
        self._now = trio.lowlevel.current_clock().current_time
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for instance in instances:
                self.add_instance(instance)
            for worker in self._pending_starts:
                nursery.start_soon(self._work, worker)
            self._pending_starts.clear()
            await self._serve_batches()

    def add_instance(self, instance: Any) -> None:
        """Start serving batches on ``instance``."""
        worker = _Worker(instance)
        self._workers[id(instance)] = worker
        if self._nursery is None:
            self._pending_starts.append(worker)
        else:
            self._nursery.start_soon(self._work, worker)

    async def remove_instance(self, instance: Any) -> None:
        """Stop giving ``instance`` batches; return once its current batch (if any) is done."""
        worker = self._workers.pop(id(instance), None)
        if worker is None:
            return
        worker.retiring = True
        if worker in self._idle:
            self._idle.remove(worker)
            worker.send.send_nowait(None)
        if self._nursery is None:
            self._pending_starts.remove(worker)
            return
        await worker.done.wait()

    def instances(self) -> list[Any]:
        return [w.instance for w in self._workers.values()]

    async def _work(self, worker: _Worker) -> None:
        assert self._execute is not None
        try:
            self._idle.append(worker)
            self._wakeup.set()
            batch = await worker.receive.receive()
            while batch is not None:
                if batch is _FORM:
                    if self._round is not None and self._round.shared():
                        # other tasks run in this round: requests they decode join the batch
                        await trio.lowlevel.cancel_shielded_checkpoint()
                    self._forming = False
                    if worker.retiring:  # what queued meanwhile is the batcher's
                        self._wakeup.set()
                        break
                    # the round's requests have queued: the batch is formed here, given to
                    # this worker first (and to other idle ones if it overflows)
                    batch = await self._idle_again(worker, first=True)
                    continue
                if self._rate_limiter is not None:
                    async with self._rate_limiter.acquire(worker.instance):
                        await self._execute(worker.instance, batch)
                else:
                    await self._execute(worker.instance, batch)
                if worker.retiring:
                    break
                # look for the next batch right away, without a round trip through the batcher task
                # (which needs waking only to watch the delays and timeouts of what stays queued)
                batch = await self._idle_again(worker, first=False)
        finally:
            if worker in self._idle:
                self._idle.remove(worker)
            worker.done.set()

    async def _idle_again(self, worker: _Worker, *, first: bool) -> list[Any] | None:
        """``worker`` is idle again (``first`` in line: it was woken to form a batch) and takes
        what the queue has for it now, else waits: its next batch, _FORM, or None to stop. A
        batch handed over here costs no task switch."""
        if first:
            self._idle.appendleft(worker)
        else:
            self._idle.append(worker)
        self.step(self._now())
        if len(self._queue):
            self._wakeup.set()
        try:
            return worker.receive.receive_nowait()
        except trio.WouldBlock:
            return await worker.receive.receive()

    # ---- batching -------------------------------------------------------------------------

    async def _serve_batches(self) -> None:
        while True:
            self._wakeup = trio.Event()
            wake_at = self.step(self._now())
            with trio.move_on_at(wake_at):
                await self._wakeup.wait()

    def step(self, now: float) -> float:
        """Reject expired requests and hand batches to idle instances; return when to look again."""
        for entry in self._queue.expire(now):
            if entry.cancelled:
                self._drop(entry)  # nobody is waiting for an answer
            else:
                self._on_reject(entry.item, unavailable(TIMEOUT_EXPIRED))
        wake_at = math.inf
        limit = self.rules.limit
        while self._idle and len(self._queue):
            candidates = self._queue.candidates(limit, self._drop)
            decision = form_batch(candidates, self.rules, now)
            if decision.take == 0:
                if decision.wait is not None:
                    wake_at = now + decision.wait
                break
            items = [e.item for e in self._queue.pop(decision.take)]
            if log.isEnabledFor(VERBOSE):  # --log-verbose: the scheduler's decisions
                log.log(VERBOSE, "dynamic batcher: batch of %d request(s), batch size %d, %d still queued",
                        len(items), sum(item.batch_size for item in items), len(self._queue), extra={"verbose": 1})
            if self._sequencer is not None:
                for item in items:
                    item.turn = self._sequencer.next()
            self._idle.popleft().send.send_nowait(items)
        return min(wake_at, self._queue.next_deadline())
