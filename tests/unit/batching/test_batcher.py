"""The dynamic batcher task under a mock clock: delays, priorities, timeouts, ordering, instances."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing

from trident.batching import rounds
from trident.batching.batcher import DynamicScheduler
from trident.batching.dynamic import BatchRules
from trident.batching.policy import DELAY, Priorities, QueuePolicy
from trident.batching.rate_limiter import Needs, RateLimiter
from trident.errors import TritonError


@dataclass
class FakeRequest:
    parameters: dict[str, Any] = field(default_factory=dict)
    inputs: list[Any] = field(default_factory=list)
    cancelled: bool = False


@dataclass(eq=False)
class Item:
    tag: str
    batch_size: int = 1
    request: FakeRequest = field(default_factory=FakeRequest)
    turn: Any = None

    @property
    def cancelled(self) -> bool:
        return self.request.cancelled


def item(tag, size=1, **parameters):
    return Item(tag, size, FakeRequest(parameters))


class Harness:
    """A scheduler with fake instances whose execution takes ``cost(instance, batch)`` seconds."""

    def __init__(self, rules, priorities=Priorities(), *, cost=0.1, **kw):
        self.dropped: list[str] = []
        self.rejected: list[tuple[str, str, float]] = []
        self.executed: list[tuple[str, list[str], float]] = []
        self.cost = cost
        self.running = 0
        self.max_running = 0
        self.scheduler = DynamicScheduler(rules, priorities, lambda i: self.dropped.append(i.tag),
                                          on_reject=self._reject, **kw)

    def _reject(self, it, error: TritonError) -> None:
        self.rejected.append((it.tag, error.message, trio.current_time()))

    async def execute(self, instance, batch):
        self.executed.append((instance, [b.tag for b in batch], trio.current_time()))
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        await trio.sleep(self.cost(instance, batch) if callable(self.cost) else self.cost)
        self.running -= 1

    def batches(self):
        return [tags for _, tags, _ in self.executed]

    def start(self, nursery, instances=("i0",)):
        nursery.start_soon(self.scheduler.serve, list(instances), self.execute)


GREEDY = BatchRules(True, 4, (4,), 0.0)


async def test_greedy_batches_form_while_the_instance_is_busy(autojump_clock):
    h = Harness(GREEDY)
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        h.scheduler.enqueue(item("a"))
        await trio.sleep(0.01)  # a runs alone; the rest queue behind it
        for t in "bcdefg":
            h.scheduler.enqueue(item(t))
        assert h.scheduler.queued() == 6
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert h.batches() == [["a"], ["b", "c", "d", "e"], ["f", "g"]]
    assert h.scheduler.queued() == 0


async def test_an_idle_instance_forms_the_batch_of_its_round_itself(autojump_clock):
    """With no queue delay and nothing to time, an idle instance's worker is woken by the first
    request and forms the batch at its turn: every request queued by the tasks of that round
    (and of the round its turn falls in) shares it, and the batcher task is not woken."""
    h = Harness(GREEDY, cost=0.5)
    go = trio.Event()

    async def client(tags: str, checkpoints: int = 0) -> None:
        await go.wait()
        for _ in range(checkpoints):
            await trio.lowlevel.checkpoint()
        for t in tags:
            h.scheduler.enqueue(item(t))

    async with trio.open_nursery() as nursery:
        h.start(nursery)
        for tags in ("a", "b", "c"):
            nursery.start_soon(client, tags)
        nursery.start_soon(client, "d", 1)  # one round later
        await trio.sleep(0.01)
        woken = h.scheduler._wakeup
        go.set()
        await trio.sleep(0.01)
        assert not woken.is_set()  # no hop through the batcher task
        assert sorted(h.batches()[0]) == ["a", "b", "c", "d"]
        for t in "efghij":  # while the instance is busy: queued, taken when it is done
            h.scheduler.enqueue(item(t))
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert h.batches()[1:] == [["e", "f", "g", "h"], ["i", "j"]]


async def test_a_request_with_a_queue_timeout_is_watched_by_the_batcher(autojump_clock):
    policy = QueuePolicy(default_timeout_us=50_000, allow_timeout_override=True)
    h = Harness(GREEDY, Priorities(default_policy=policy), cost=1.0)
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        await trio.sleep(0.01)
        h.scheduler.enqueue(item("a"))  # has a deadline: the batcher is woken, and runs it
        assert h.scheduler._wakeup.is_set()
        await trio.sleep(0.01)
        h.scheduler.enqueue(item("b", timeout=10_000))
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert h.batches() == [["a"]]
    assert [(t, m) for t, m, _ in h.rejected] == [("b", "Request timeout expired")]


async def test_a_worker_retired_while_woken_to_form_a_batch_leaves_it_to_another(autojump_clock):
    h = Harness(GREEDY, cost=0.5)
    async with trio.open_nursery() as nursery:
        h.start(nursery, instances=("i0", "i1"))
        await trio.sleep(0.01)
        h.scheduler.enqueue(item("a"))  # wakes i0 to form the batch
        h.scheduler.enqueue(item("b"))
        await h.scheduler.remove_instance("i0")  # before i0's turn
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert h.executed and [(inst, tags) for inst, tags, _ in h.executed] == [("i1", ["a", "b"])]
    assert h.scheduler.instances() == ["i1"]


async def test_batching_off_runs_each_request_alone(autojump_clock):
    h = Harness(BatchRules())
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        for t in "abc":
            h.scheduler.enqueue(item(t))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert h.batches() == [["a"], ["b"], ["c"]]


async def test_queue_delay_holds_a_small_batch_until_the_delay(autojump_clock):
    h = Harness(BatchRules(True, 8, (4,), 0.010))
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        t0 = trio.current_time()
        h.scheduler.enqueue(item("a"))
        await trio.sleep(0.004)
        h.scheduler.enqueue(item("b"))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    (_, tags, when), = h.executed
    assert tags == ["a", "b"] and when - t0 == pytest.approx(0.010)


async def test_preferred_size_reached_goes_before_the_delay(autojump_clock):
    h = Harness(BatchRules(True, 8, (2, 4), 0.5))
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        t0 = trio.current_time()
        for t in "abcde":
            h.scheduler.enqueue(item(t))
        await trio.sleep(0.001)
        assert h.batches() == [["a", "b", "c", "d"]] and h.executed[0][2] == t0
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    # e waits out its delay after the first batch finished
    assert h.batches() == [["a", "b", "c", "d"], ["e"]]
    assert h.executed[1][2] - t0 == pytest.approx(0.5)


async def test_requests_are_never_split(autojump_clock):
    h = Harness(GREEDY)
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        h.scheduler.enqueue(item("a", 3))
        h.scheduler.enqueue(item("b", 2))
        h.scheduler.enqueue(item("c", 2))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert h.batches() == [["a"], ["b", "c"]]


async def test_higher_priority_is_served_first(autojump_clock):
    h = Harness(BatchRules(True, 1, (1,), 0.0), Priorities(levels=3, default_level=3))
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        h.scheduler.enqueue(item("busy"))
        await trio.sleep(0.01)
        h.scheduler.enqueue(item("low1"))
        h.scheduler.enqueue(item("mid", priority=2))
        h.scheduler.enqueue(item("low2", priority=0))
        h.scheduler.enqueue(item("high", priority=1))
        h.scheduler.enqueue(item("bad", priority=9))  # out of range: the default level
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert h.batches() == [["busy"], ["high"], ["mid"], ["low1"], ["low2"], ["bad"]]


async def test_reject_at_the_queue_timeout_while_the_instance_is_busy(autojump_clock):
    policy = QueuePolicy(default_timeout_us=50_000, allow_timeout_override=True)
    h = Harness(GREEDY, Priorities(default_policy=policy), cost=1.0)
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        t0 = trio.current_time()
        h.scheduler.enqueue(item("busy"))
        await trio.sleep(0.001)
        h.scheduler.enqueue(item("late"))
        h.scheduler.enqueue(item("short", timeout=10_000))
        h.scheduler.enqueue(item("long", timeout=900_000))  # may not extend the default
        await trio.sleep(3)
        nursery.cancel_scope.cancel()
    assert [(t, m) for t, m, _ in h.rejected] == [("short", "Request timeout expired"),
                                                  ("late", "Request timeout expired"),
                                                  ("long", "Request timeout expired")]
    assert [round(w - t0, 3) for _, _, w in h.rejected] == [0.011, 0.051, 0.051]
    assert h.batches() == [["busy"]]


async def test_delay_action_deprioritizes_instead_of_rejecting(autojump_clock):
    policy = QueuePolicy(timeout_action=DELAY, default_timeout_us=50_000)
    h = Harness(BatchRules(True, 1, (1,), 0.0), Priorities(default_policy=policy), cost=0.12)
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        h.scheduler.enqueue(item("busy"))
        await trio.sleep(0.001)
        h.scheduler.enqueue(item("old"))  # expires at 0.051 while busy runs
        await trio.sleep(0.1)
        h.scheduler.enqueue(item("new"))  # still fresh when busy ends at 0.12
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert h.rejected == []
    assert h.batches() == [["busy"], ["new"], ["old"]]


async def test_full_queue_refuses_at_enqueue(autojump_clock):
    h = Harness(GREEDY, Priorities(default_policy=QueuePolicy(max_queue_size=2)), cost=1.0)
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        h.scheduler.enqueue(item("busy"))
        await trio.sleep(0.001)
        h.scheduler.enqueue(item("a"))
        b = item("b")
        h.scheduler.enqueue(b)
        with pytest.raises(TritonError, match="Exceeds maximum queue size"):
            h.scheduler.enqueue(item("c"))
        b.request.cancelled = True  # a cancelled request frees its place
        h.scheduler.enqueue(item("d"))
        await trio.sleep(3)
        nursery.cancel_scope.cancel()
    assert h.batches() == [["busy"], ["a", "d"]] and h.dropped == ["b"]


async def test_cancelled_queued_requests_are_dropped_before_assembly(autojump_clock):
    h = Harness(GREEDY, cost=0.5)
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        h.scheduler.enqueue(item("busy"))
        await trio.sleep(0.001)
        queued = [item(t) for t in "abc"]
        for it in queued:
            h.scheduler.enqueue(it)
        queued[1].request.cancelled = True
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert h.batches() == [["busy"], ["a", "c"]] and h.dropped == ["b"]


async def test_preserve_ordering_hands_out_chained_turns(autojump_clock):
    h = Harness(BatchRules(True, 1, (1,), 0.0), preserve_ordering=True,
                cost=lambda inst, batch: 0.5 if batch[0].tag == "slow" else 0.1)
    items = [item("slow"), item("fast")]
    async with trio.open_nursery() as nursery:
        h.start(nursery, instances=("i0", "i1"))
        for it in items:
            h.scheduler.enqueue(it)
        await trio.sleep(0.01)
        assert {inst for inst, _, _ in h.executed} == {"i0", "i1"}  # both run at once
        order = []

        async def deliver(it):
            await it.turn.wait()
            order.append((it.tag, trio.current_time()))
            it.turn.finish()

        t0 = trio.current_time()
        nursery.start_soon(deliver, items[1])
        await trio.sleep(0.2)
        assert order == []  # fast waits for slow
        nursery.start_soon(deliver, items[0])
        await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert [t for t, _ in order] == ["slow", "fast"]
    assert order[1][1] - t0 == pytest.approx(0.2)
    turn = h.scheduler.next_turn()  # a cache hit takes its turn after both
    assert turn is not None


async def test_instances_added_and_retired_while_running(autojump_clock):
    h = Harness(BatchRules(True, 1, (1,), 0.0), cost=1.0)
    async with trio.open_nursery() as nursery:
        h.start(nursery, instances=("i0",))
        for t in "ab":
            h.scheduler.enqueue(item(t))
        await trio.sleep(0.01)
        h.scheduler.add_instance("i1")
        await trio.sleep(0.01)
        assert sorted(inst for inst, _, _ in h.executed) == ["i0", "i1"]
        retired_at = trio.current_time()
        await h.scheduler.remove_instance("i0")  # waits for i0's current batch
        assert trio.current_time() - retired_at == pytest.approx(0.98)
        for t in "cd":
            h.scheduler.enqueue(item(t))
        await trio.sleep(3)
        nursery.cancel_scope.cancel()
    assert [inst for inst, tags, _ in h.executed if tags[0] in "cd"] == ["i1", "i1"]
    assert h.scheduler.instances() == ["i1"]


async def test_idle_instance_retires_at_once(autojump_clock):
    h = Harness(GREEDY)
    async with trio.open_nursery() as nursery:
        h.start(nursery, instances=("i0", "i1"))
        await trio.sleep(0.01)
        t0 = trio.current_time()
        await h.scheduler.remove_instance("i1")
        assert trio.current_time() == t0
        h.scheduler.enqueue(item("a"))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert h.executed[0][0] == "i0"


async def test_rate_limiter_keeps_instances_from_running_together(autojump_clock):
    limiter = RateLimiter()
    for inst in ("i0", "i1"):
        limiter.register(inst, Needs({("R", 0): 1}))
    h = Harness(BatchRules(True, 1, (1,), 0.0), rate_limiter=limiter, cost=0.1)
    async with trio.open_nursery() as nursery:
        h.start(nursery, instances=("i0", "i1"))
        for t in "abcd":
            h.scheduler.enqueue(item(t))
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert h.max_running == 1 and len(h.executed) == 4
    starts = sorted(w for _, _, w in h.executed)
    assert [round(b - a, 3) for a, b in zip(starts, starts[1:], strict=False)] == [0.1, 0.1, 0.1]


async def test_cancelled_request_past_its_timeout_is_dropped_not_rejected(autojump_clock):
    h = Harness(GREEDY, Priorities(default_policy=QueuePolicy(default_timeout_us=10_000)), cost=1.0)
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        h.scheduler.enqueue(item("busy"))
        await trio.sleep(0.001)
        gone = item("gone")
        h.scheduler.enqueue(gone)
        gone.request.cancelled = True
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert h.rejected == [] and h.dropped == ["gone"] and h.batches() == [["busy"]]


async def test_claim_gives_an_idle_instance_to_its_caller_when_nothing_is_queued(autojump_clock):
    h = Harness(BatchRules())
    async with trio.open_nursery() as nursery:
        h.start(nursery, instances=("i0", "i1"))
        await trio.sleep(0.01)
        first = h.scheduler.claim()
        second = h.scheduler.claim()
        assert {first.instance, second.instance} == {"i0", "i1"}
        assert h.scheduler.claim() is None  # both instances are taken
        h.scheduler.enqueue(item("a"))
        await trio.sleep(1)
        assert h.batches() == []  # a claimed instance gets no batch
        h.scheduler.release(first)
        await trio.sleep(1)
        assert h.executed == [(first.instance, ["a"], pytest.approx(1.01))]
        assert h.scheduler.claim() is first  # idle again, queue empty
        h.scheduler.release(first)
        h.scheduler.release(second)
        nursery.cancel_scope.cancel()


async def test_claim_refused_with_ordering_or_a_rate_limiter(autojump_clock):
    limiter = RateLimiter()
    limiter.register("i0", Needs({("R", 0): 1}))
    for kw in ({"rules": BatchRules(), "preserve_ordering": True}, {"rules": BatchRules(), "rate_limiter": limiter},
               {"rules": GREEDY, "preserve_ordering": True}, {"rules": GREEDY, "rate_limiter": limiter}):
        h = Harness(kw.pop("rules"), **kw)
        async with trio.open_nursery() as nursery:
            h.start(nursery)
            await trio.sleep(0.01)
            await trio.lowlevel.checkpoint()  # alone in its round
            assert rounds.current().alone() and h.scheduler.claim() is None
            nursery.cancel_scope.cancel()


async def test_claim_with_batching_only_for_a_request_alone_in_its_round_with_no_delay(autojump_clock):
    h = Harness(GREEDY)
    assert h.scheduler.claim() is None  # not serving yet
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        await trio.sleep(0.01)
        await trio.lowlevel.checkpoint()  # alone in its round: the batcher would run it alone at once
        slot = h.scheduler.claim()
        assert slot is not None and slot.instance == "i0"
        assert h.scheduler.claim() is None  # taken
        h.scheduler.release(slot)
        await trio.lowlevel.checkpoint()
        rounds.current().crowd()  # a front end holds more requests of this round: they batch
        assert h.scheduler.claim() is None
        await trio.lowlevel.checkpoint()
        h.scheduler.enqueue(item("a"))  # something queued: it goes first, by the batcher
        assert h.scheduler.claim() is None
        await trio.sleep(1)
        assert h.batches() == [["a"]]
        woken = trio.Event()

        async def other() -> None:
            await woken.wait()

        nursery.start_soon(other)
        await trio.sleep(0.01)
        await trio.lowlevel.checkpoint()
        woken.set()  # another task runs before the batcher's turn: it may add to the batch
        assert h.scheduler.claim() is None
        nursery.cancel_scope.cancel()
    h = Harness(BatchRules(True, 4, (), 0.001))  # a queue delay: the batcher waits for company
    async with trio.open_nursery() as nursery:
        h.start(nursery)
        await trio.sleep(0.01)
        await trio.lowlevel.checkpoint()
        assert rounds.current().alone() and h.scheduler.claim() is None
        nursery.cancel_scope.cancel()


async def test_retiring_a_claimed_instance_waits_for_its_release(autojump_clock):
    h = Harness(BatchRules())
    async with trio.open_nursery() as nursery:
        h.start(nursery, instances=("i0",))
        await trio.sleep(0.01)
        slot = h.scheduler.claim()
        retired = trio.Event()

        async def retire():
            await h.scheduler.remove_instance("i0")
            retired.set()

        nursery.start_soon(retire)
        await trio.sleep(1)
        assert not retired.is_set()
        h.scheduler.release(slot)
        await trio.sleep(0.01)
        assert retired.is_set() and h.scheduler.instances() == []
        nursery.cancel_scope.cancel()
