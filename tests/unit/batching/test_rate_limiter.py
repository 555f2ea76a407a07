"""The rate limiter: resource pools, priorities, cancellation (mock clock)."""

import pytest
import trio

from trident.batching.rate_limiter import GLOBAL, Needs, RateLimiter, fits, parse_resource, service_order
from trident.errors import TritonError
from trident.options import ServerOptions
from trident.protocol.pbtxt import parse_pbtxt


def test_needs_of_group():
    config = parse_pbtxt(
        'name: "m" instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ '
        '{ name: "R1" count: 4 }, { name: "G" global: true count: 2 }, { name: "Z" count: 0 } ] priority: 3 } }, '
        "{ kind: KIND_CPU } ]"
    )
    assert Needs.of_group(config.instance_group[0], 1) == Needs({("R1", 1): 4, ("G", GLOBAL): 2}, 3)
    assert Needs.of_group(config.instance_group[1], 0) == Needs()


def test_parse_resource():
    assert parse_resource("R1:10") == ("R1", 10, None)
    assert parse_resource("R2:5:1") == ("R2", 5, 1)
    for bad in ("R1", ":3", "R1:x", "R1:1:2:3", "R1:-1"):
        with pytest.raises(ValueError):
            parse_resource(bad)


def test_from_options():
    assert RateLimiter.from_options(ServerOptions()) is None
    limiter = RateLimiter.from_options(ServerOptions(rate_limit="execution_count", rate_limit_resources=["R:3"]))
    assert limiter is not None
    with pytest.raises(ValueError):
        RateLimiter.from_options(ServerOptions(rate_limit="bogus"))


def test_pure_helpers():
    assert fits({("R", 0): 2}, {("R", 0): 3}, {("R", 0): 1})
    assert not fits({("R", 0): 2}, {("R", 0): 3}, {("R", 0): 2})
    assert not fits({("S", 0): 1}, {}, {})
    # (priority, executions, arrival): priority 2 counts double
    assert service_order([(2, 0, 0), (1, 0, 1), (1, 1, 2)]) == [1, 0, 2]
    assert service_order([(1, 3, 0), (2, 0, 1)]) == [1, 0]


def test_capacity_defaults_to_largest_need_and_flags_override():
    limiter = RateLimiter()
    a, b, c = object(), object(), object()
    limiter.register(a, Needs({("R1", 0): 4, ("R2", 0): 4}))
    limiter.register(b, Needs({("R2", 0): 5, ("R3", 0): 10}))
    limiter.register(c, Needs({("R1", 0): 1, ("R3", 0): 7, ("R1", 1): 2}))
    assert limiter.capacity() == {("R1", 0): 4, ("R2", 0): 5, ("R3", 0): 10, ("R1", 1): 2}
    limiter.unregister(b)
    assert limiter.capacity() == {("R1", 0): 4, ("R2", 0): 4, ("R3", 0): 7, ("R1", 1): 2}
    explicit = RateLimiter([("R1", 10, None), ("R2", 5, 0), ("G", 2, None)])
    explicit.register(a, Needs({("R1", 0): 4, ("R2", 0): 4, ("R1", 1): 3, ("G", GLOBAL): 1}))
    assert explicit.capacity() == {("R1", 0): 10, ("R2", 0): 5, ("R1", 1): 10, ("G", GLOBAL): 2}


def test_register_refuses_impossible_needs_and_mixed_scopes():
    limiter = RateLimiter([("R", 2, None)])
    with pytest.raises(TritonError, match="resource 'R' has 2 copies on device 0, an instance needs 3"):
        limiter.register(object(), Needs({("R", 0): 3}))
    assert limiter.capacity() == {}
    limiter.register(object(), Needs({("G", GLOBAL): 1}))
    with pytest.raises(TritonError, match="both global and per-device"):
        limiter.register(object(), Needs({("G", 0): 1}))


async def test_executions_wait_for_resources(autojump_clock):
    limiter = RateLimiter()
    a, b, free = object(), object(), object()
    limiter.register(a, Needs({("R", 0): 2}))
    limiter.register(b, Needs({("R", 0): 2}))
    limiter.register(free, Needs())
    log = []

    async def run(name, inst, cost):
        async with limiter.acquire(inst):
            log.append((name, "start", trio.current_time()))
            await trio.sleep(cost)
        log.append((name, "end", trio.current_time()))

    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        nursery.start_soon(run, "a", a, 1.0)
        await trio.sleep(0.1)
        nursery.start_soon(run, "b", b, 1.0)
        nursery.start_soon(run, "free", free, 0.5)
    starts = {n: round(t - t0, 3) for n, ev, t in log if ev == "start"}
    assert starts == {"a": 0.0, "free": 0.1, "b": 1.0}
    assert limiter.in_use() == {}


async def test_priority_weights_turns(autojump_clock):
    limiter = RateLimiter()
    fast, slow, blocker = object(), object(), object()
    limiter.register(fast, Needs({("R", 0): 1}, priority=1))
    limiter.register(slow, Needs({("R", 0): 1}, priority=2))
    limiter.register(blocker, Needs({("R", 0): 1}, priority=1))
    order: list[str] = []

    async def once(name, inst):
        async with limiter.acquire(inst):
            order.append(name)
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        async with limiter.acquire(blocker):  # everything queues up behind the blocker
            for _ in range(4):
                nursery.start_soon(once, "slow", slow)
            await trio.sleep(0.001)
            for _ in range(6):
                nursery.start_soon(once, "fast", fast)
            await trio.sleep(0.001)
    # scaled priority = priority x (1 + executions), ties by arrival: fast gets two turns per slow turn
    assert order[:8] == ["fast", "slow", "fast", "fast", "slow", "fast", "fast", "slow"]


async def test_cancelled_wait_takes_nothing(autojump_clock):
    limiter = RateLimiter()
    a, b = object(), object()
    limiter.register(a, Needs({("R", 0): 1}))
    limiter.register(b, Needs({("R", 0): 1}))
    async with limiter.acquire(a):
        with trio.move_on_after(0.1):
            async with limiter.acquire(b):
                pytest.fail("b ran while a held the resource")
        assert limiter.in_use() == {("R", 0): 1}
    assert limiter.in_use() == {}
    async with limiter.acquire(b):
        assert limiter.in_use() == {("R", 0): 1}
