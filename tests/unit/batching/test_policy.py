"""Priority levels and queue policies (pure): levels, timeouts, DELAY/REJECT, max_queue_size."""

from dataclasses import dataclass

import pytest

from trident.batching.policy import (
    DELAY,
    REJECT,
    Entry,
    Priorities,
    PriorityQueue,
    QueuePolicy,
    request_priority,
    request_timeout_us,
)
from trident.errors import Code, TritonError
from trident.protocol.pbtxt import parse_pbtxt


@dataclass(eq=False)
class Item:
    tag: str
    cancelled: bool = False
    batch_size: int = 1


def entry(tag, level=0, enqueued=0.0, deadline=None, size=1):
    return Entry(Item(tag, batch_size=size), level, enqueued, deadline, None, size)


def tags(entries):
    return [e.item.tag for e in entries]


def test_timeout_override_only_shortens_a_nonzero_default():
    assert QueuePolicy(default_timeout_us=0, allow_timeout_override=True).timeout_us(500) == 0
    assert QueuePolicy(default_timeout_us=1000, allow_timeout_override=True).timeout_us(500) == 500
    assert QueuePolicy(default_timeout_us=1000, allow_timeout_override=True).timeout_us(5000) == 1000
    assert QueuePolicy(default_timeout_us=1000, allow_timeout_override=False).timeout_us(500) == 1000
    assert QueuePolicy(default_timeout_us=1000, allow_timeout_override=True).timeout_us(0) == 1000


def test_priorities_from_config():
    config = parse_pbtxt(
        'name: "m" max_batch_size: 4 dynamic_batching { priority_levels: 3 default_priority_level: 2 '
        "default_queue_policy { max_queue_size: 7 } "
        "priority_queue_policy { key: 1 value { timeout_action: DELAY default_timeout_microseconds: 100 "
        "allow_timeout_override: true } } }"
    )
    p = Priorities.from_config(config.dynamic_batching)
    assert p.levels == 3 and p.default_level == 2
    assert [p.level_of(x) for x in (0, 1, 2, 3, 4, 99)] == [2, 1, 2, 3, 2, 2]
    assert p.policy_of(1) == QueuePolicy(DELAY, 100, True, 0)
    assert p.policy_of(2) == p.policy_of(3) == QueuePolicy(REJECT, 0, False, 7)
    single = Priorities.from_config(parse_pbtxt('name: "m" dynamic_batching {}').dynamic_batching)
    assert single.levels == 0 and single.level_of(1) == 0 and single.level_of(0) == 0
    assert Priorities.from_config(None) == Priorities()


def test_request_parameters():
    assert request_priority({"priority": 3}) == 3
    assert request_priority({}) == request_priority({"priority": -1}) == request_priority({"priority": True}) == 0
    assert request_priority({"priority": "1"}) == 0
    assert request_timeout_us({"timeout": 250}) == 250 and request_timeout_us({}) == 0


def test_service_order_levels_first_then_arrival():
    q = PriorityQueue(Priorities(levels=3, default_level=2))
    for e in (entry("a", 2), entry("b", 3), entry("c", 1), entry("d", 2), entry("e", 1)):
        q.push(e)
    assert len(q) == 5
    assert tags(q) == ["c", "e", "a", "d", "b"]
    assert tags(q.pop(3)) == ["c", "e", "a"]
    assert tags(q) == ["d", "b"] and len(q) == 2


def test_max_queue_size_is_per_level():
    p = Priorities(levels=2, default_level=1, policies={1: QueuePolicy(max_queue_size=2)})
    q = PriorityQueue(p)
    q.push(entry("a", 1))
    q.push(entry("b", 1))
    with pytest.raises(TritonError) as e:
        q.push(entry("c", 1))
    assert e.value.code == Code.UNAVAILABLE and e.value.message == "Exceeds maximum queue size"
    q.push(entry("d", 2))  # the other level has no limit
    assert len(q) == 3 and q.level_size(1) == 2


def test_reject_expired_requests():
    q = PriorityQueue(Priorities(default_policy=QueuePolicy(REJECT, 1000)))
    q.push(entry("a", deadline=1.0))
    q.push(entry("b", deadline=3.0))
    q.push(entry("c"))
    assert q.next_deadline() == 1.0
    assert q.expire(0.5) == []
    assert tags(q.expire(1.0)) == ["a"]
    assert tags(q) == ["b", "c"] and len(q) == 2 and q.next_deadline() == 3.0
    assert tags(q.expire(10.0)) == ["b"]
    assert q.next_deadline() == float("inf")


def test_delay_moves_expired_behind_unexpired_of_the_same_level_only():
    p = Priorities(levels=2, default_level=1, policies={1: QueuePolicy(DELAY, 1000), 2: QueuePolicy()})
    q = PriorityQueue(p)
    q.push(entry("a", 1, deadline=1.0))
    q.push(entry("b", 1))
    q.push(entry("c", 2))
    assert q.expire(2.0) == []
    assert tags(q) == ["b", "a", "c"] and len(q) == 3
    q.push(entry("d", 1))
    assert tags(q) == ["b", "d", "a", "c"]
    assert q.expire(100.0) == []  # a delayed request has no timeout any more


def test_candidates_stop_after_the_first_beyond_the_limit_and_drop_cancelled():
    q = PriorityQueue(Priorities())
    items = [entry(t, size=s) for t, s in (("a", 2), ("x", 1), ("b", 3), ("c", 4), ("d", 1))]
    items[1].item.cancelled = True
    for e in items:
        q.push(e)
    dropped: list[Entry] = []
    got = q.candidates(6, dropped.append)
    assert tags(got) == ["a", "b", "c"]  # 2+3=5, +4 passes 6: c is the first beyond
    assert tags(dropped) == ["x"] and len(q) == 4
    assert tags(q.pop(2)) == ["a", "b"]


def test_candidates_of_one_when_not_batching():
    q = PriorityQueue(Priorities())
    for t in "abc":
        q.push(entry(t))
    assert tags(q.candidates(1, lambda e: None)) == ["a", "b"]


def test_remove_cancelled_frees_room():
    q = PriorityQueue(Priorities(default_policy=QueuePolicy(max_queue_size=2)))
    a, b = entry("a"), entry("b")
    q.push(a)
    q.push(b)
    a.item.cancelled = True
    dropped: list[Entry] = []
    assert q.remove_cancelled(dropped.append) == 1 and tags(dropped) == ["a"]
    q.push(entry("c"))
    assert tags(q) == ["b", "c"]
