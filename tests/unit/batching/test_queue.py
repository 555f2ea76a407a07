from collections import deque
from dataclasses import dataclass

import trio
import trio.testing

from trident.batching.queue import RequestQueue, take_batch


@dataclass
class Item:
    batch_size: int = 1
    cancelled: bool = False
    tag: str = ""


def test_take_batch_greedy_up_to_max_without_splitting():
    items = deque([Item(3, tag="a"), Item(4, tag="b"), Item(2, tag="c"), Item(1, tag="d")])
    dropped: list[Item] = []
    batch = take_batch(items, 8, dropped.append)
    assert [i.tag for i in batch] == ["a", "b"]  # c (2) would make 9 > 8: not split, left queued
    assert [i.tag for i in items] == ["c", "d"]
    assert dropped == []


def test_take_batch_no_batching_takes_one():
    items = deque([Item(tag="a"), Item(tag="b")])
    assert [i.tag for i in take_batch(items, 0, lambda i: None)] == ["a"]
    assert len(items) == 1


def test_take_batch_drops_cancelled_before_assembly():
    items = deque([Item(tag="x", cancelled=True), Item(tag="a"), Item(tag="y", cancelled=True), Item(tag="b")])
    dropped: list[Item] = []
    batch = take_batch(items, 4, dropped.append)
    assert [i.tag for i in batch] == ["a", "b"]
    assert [i.tag for i in dropped] == ["x", "y"]
    assert not items


def test_take_batch_oversized_head_goes_alone():
    items = deque([Item(8, tag="a"), Item(1, tag="b")])
    assert [i.tag for i in take_batch(items, 8, lambda i: None)] == ["a"]


def test_take_batch_empty_or_all_cancelled():
    dropped: list[Item] = []
    assert take_batch(deque(), 8, dropped.append) == []
    assert take_batch(deque([Item(cancelled=True)]), 8, dropped.append) == []
    assert len(dropped) == 1


async def test_queue_wakes_waiting_worker_and_batches(autojump_clock: trio.testing.MockClock):
    dropped: list[Item] = []
    q: RequestQueue[Item] = RequestQueue(4, dropped.append)
    got: list[list[str]] = []

    async def worker():
        batch = await q.get_batch()
        got.append([i.tag for i in batch])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker)
        await trio.sleep(1)
        assert got == []  # parked: nothing queued
        q.put(Item(tag="a", cancelled=True))
        q.put(Item(tag="b"))
        q.put(Item(tag="c"))
    assert got == [["b", "c"]]
    assert [i.tag for i in dropped] == ["a"]
    assert len(q) == 0


async def test_queue_get_batch_cancellation_leaves_queue_unchanged(autojump_clock):
    q: RequestQueue[Item] = RequestQueue(4, lambda i: None)
    with trio.move_on_after(1):
        await q.get_batch()
    q.put(Item(tag="a"))
    assert [i.tag for i in await q.get_batch()] == ["a"]


async def test_drain_cancelled():
    dropped: list[Item] = []
    q: RequestQueue[Item] = RequestQueue(4, dropped.append)
    q.put(Item(tag="a"))
    q.put(Item(tag="b", cancelled=True))
    q.drain_cancelled()
    assert len(q) == 1 and [i.tag for i in dropped] == ["b"]
