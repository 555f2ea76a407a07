"""Rounds of the trio loop: whether a task is alone in its round (batching/rounds.py)."""

from __future__ import annotations

import socket
import time

import trio
import trio.testing

from trident.batching import rounds


async def test_the_run_queue_is_tracked_with_this_trio():
    # a trio without the private run queue would leave every batching request to the batcher:
    # this test is the alarm for that (the batching figures in the README assume tracking)
    r = rounds.current()
    assert r.tracking and rounds.current() is r


async def test_a_task_alone_in_its_round_until_crowded():
    r = rounds.current()
    await trio.lowlevel.checkpoint()  # a round of its own
    assert r.size == 1 and r.alone()
    r.crowd()
    assert not r.alone()
    await trio.lowlevel.checkpoint()
    assert r.alone()  # a new round is not crowded


async def test_tasks_woken_in_the_same_round_are_not_alone():
    r = rounds.current()
    event = trio.Event()
    seen: list[tuple[int, bool]] = []

    async def waiter() -> None:
        await event.wait()
        seen.append((r.size, r.alone()))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        event.set()
    assert seen == [(3, False)] * 3


async def test_a_task_that_woke_another_is_not_alone():
    r = rounds.current()
    event = trio.Event()

    async def waiter() -> None:
        await event.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()
        assert r.alone()
        event.set()  # the waiter runs in the next round, where it could add to a batch
        assert not r.alone()


def test_each_run_has_its_own_round():
    async def one() -> rounds.Round:
        await trio.lowlevel.checkpoint()
        r = rounds.current()
        await trio.lowlevel.checkpoint()
        assert r.alone()
        return r

    assert trio.run(one) is not trio.run(one)


async def test_end_of_round_work_runs_in_order_before_each_poll_until_removed():
    r = rounds.current()
    calls: list[str] = []
    remove_a = r.at_end(lambda: calls.append("a"))
    remove_b = r.at_end(lambda: calls.append("b"))
    await trio.sleep(0.001)  # the loop polls (and sleeps) at least once
    assert calls[:2] == ["a", "b"] and len(calls) % 2 == 0
    remove_a()
    calls.clear()
    await trio.sleep(0.001)
    assert calls and set(calls) == {"b"}
    remove_b()
    calls.clear()
    await trio.sleep(0.001)
    assert calls == []


async def test_busy_polling_catches_what_arrives_within_the_window_and_stops_after_a_miss():
    # windows far from the waits they are checked against, so that a loaded machine cannot
    # turn a catch into a miss or a short wait into a long one: 1 s, and 20 ms against 100 ms
    r = rounds.current()
    assert r.busy_poll(1.0)
    try:
        raw_a, b = socket.socketpair()
        a = trio.socket.from_stdlib_socket(raw_a)
        with a, b:
            # the peer answers from a thread after a few ms: the loop is polling then, not asleep
            def answer() -> None:
                time.sleep(0.003)
                b.send(b"x")

            async def answer_later() -> None:
                await trio.to_thread.run_sync(answer)

            async with trio.open_nursery() as nursery:
                spins, caught = r.spins, r.caught
                nursery.start_soon(answer_later)
                assert await a.recv(1) == b"x"
            assert r.caught > caught and r.spins > spins
            # a wait longer than the window: the next wait does not poll
            r.window = 0.02
            await trio.sleep(0.1)
            spins = r.spins
            await trio.sleep(0.1)  # a wait after a miss sleeps at once
            assert r.spins == spins
            # a short wait (a 1 ms sleep, not polled) turns polling on again
            r.window = 1.0
            await trio.sleep(0.001)
            await trio.sleep(0.001)
            assert r.spins > spins
        # a call away on a thread of the server's: no polling while it runs
        await trio.sleep(0.001)
        r.away += 1
        spins = r.spins
        await trio.sleep(0.001)
        await trio.sleep(0.001)
        assert r.spins == spins
        r.away -= 1
        await trio.sleep(0.001)
        assert r.spins > spins
    finally:
        assert r.busy_poll(0)
    spins = r.spins
    await trio.sleep(0.001)
    assert r.spins == spins and r.window == 0


def test_a_trio_without_a_run_queue_is_never_alone_and_never_polls():
    async def main() -> None:
        r = rounds.Round(None)
        r.after_io_wait(0.0)
        assert not r.tracking and r.size == 0 and not r.alone()
        r.before_io_wait(1.0)  # off: returns at once
        assert r.spins == 0

    trio.run(main)
