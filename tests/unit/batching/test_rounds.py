"""Rounds of the trio loop: whether a task is alone in its round (batching/rounds.py)."""

from __future__ import annotations

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


def test_a_trio_without_a_run_queue_is_never_alone():
    r = rounds.Round(None)
    r.after_io_wait(0.0)
    assert not r.tracking and r.size == 0 and not r.alone()
