"""The request queue between a model version's front door and its instance workers.

Batch forming is a pure function (:func:`take_batch`) over the queue's deque; the trio part is
only the parking lot that wakes idle workers. Cancelled requests are dropped before batch
assembly and handed to ``on_drop`` so their waiters are answered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import trio


class Queued(Protocol):
    @property
    def batch_size(self) -> int: ...

    @property
    def cancelled(self) -> bool: ...


Q = TypeVar("Q", bound=Queued)


def take_batch(items: deque[Q], max_batch_size: int, drop: Callable[[Q], None]) -> list[Q]:
    """Pop the next batch from the front of ``items``.

    Greedy: whole requests in arrival order while their summed batch size stays within
    ``max_batch_size`` (0 = no batching: one request per batch). A request is never split.
    Cancelled requests met on the way are removed and passed to ``drop``.
    """
    batch: list[Q] = []
    total = 0
    while items:
        head = items[0]
        if head.cancelled:
            items.popleft()
            drop(head)
            continue
        if not batch:
            batch.append(items.popleft())
            total = head.batch_size
            if max_batch_size <= 0:
                break
            continue
        if total + head.batch_size > max_batch_size:
            break
        batch.append(items.popleft())
        total += head.batch_size
    return batch


class RequestQueue(Generic[Q]):
    """FIFO of queued requests shared by the instance workers of one model version."""

    def __init__(self, max_batch_size: int, on_drop: Callable[[Q], None]) -> None:
        self._items: deque[Q] = deque()
        self._lot = trio.lowlevel.ParkingLot()
        self._max_batch_size = max_batch_size
        self._on_drop = on_drop

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Q) -> None:
        """Enqueue without waiting and wake one idle worker."""
        self._items.append(item)
        self._lot.unpark()

    async def get_batch(self) -> list[Q]:
        """Wait for and return the next non-empty batch.

        Cancellation: cancelling the caller leaves the queue unchanged.
        """
        while True:
            batch = take_batch(self._items, self._max_batch_size, self._on_drop)
            if batch:
                if self._items:
                    self._lot.unpark()  # more work: let another idle worker look
                return batch
            await self._lot.park()

    def drain_cancelled(self) -> None:
        """Drop every cancelled request still queued (e.g. at unload)."""
        keep: deque[Q] = deque()
        for item in self._items:
            if item.cancelled:
                self._on_drop(item)
            else:
                keep.append(item)
        self._items = keep
