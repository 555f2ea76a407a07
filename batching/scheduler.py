"""The scheduler seam between a model version's front door and its instances.

A scheduler receives queued requests (:meth:`Scheduler.enqueue`, never blocking) and runs
inside the model version's nursery (:meth:`Scheduler.serve`), handing batches to
``execute(instance, batch)`` — one worker task per instance, at most one batch per instance
at a time. The schedulers behind it: :class:`~trident.batching.batcher.DynamicScheduler`
(Triton's default and dynamic batchers) and :class:`~trident.batching.sequence.SequenceScheduler`.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from trident.errors import unsupported


class Schedulable(Protocol):
    """What a scheduler needs of a queued request (trident.server.execution.Pending)."""

    @property
    def batch_size(self) -> int: ...

    @property
    def cancelled(self) -> bool: ...

    @property
    def request(self) -> Any: ...


ExecuteBatch = Callable[[Any, list[Any]], Awaitable[None]]


class Scheduler(abc.ABC):
    """Turns queued requests into batches for a model version's instances."""

    def __init__(self, on_drop: Callable[[Any], None]) -> None:
        self.on_drop = on_drop

    @abc.abstractmethod
    def enqueue(self, item: Schedulable) -> None:
        """Queue a request without waiting. Raises TritonError (UNAVAILABLE) when full."""

    @abc.abstractmethod
    def queued(self) -> int:
        """Requests waiting, not yet executing."""

    @abc.abstractmethod
    async def serve(self, instances: Sequence[Any], execute: ExecuteBatch) -> None:
        """Feed batches to ``execute`` until cancelled (by the model version's nursery)."""

    #: whether :meth:`add_instance` / :meth:`remove_instance` work while running
    supports_instance_update = False

    def add_instance(self, instance: Any) -> None:
        """Start serving batches on another instance. Raises UNSUPPORTED unless supported."""
        raise unsupported(f"{type(self).__name__} cannot add instances while running")

    async def remove_instance(self, instance: Any) -> None:
        """Retire an instance once its current batch is done. Raises UNSUPPORTED unless supported."""
        raise unsupported(f"{type(self).__name__} cannot remove instances while running")

    def delivers_at_once(self) -> bool:
        """Whether a queued request's response may go to its caller the moment it is sent (no
        response order to wait for), so that it needs no task waiting for it. The default: no."""
        return False

    def next_turn(self) -> Any:
        """A place in the response order for a request answered without queueing (None: no ordering)."""
        return None

    def claim(self) -> Any:
        """An idle instance's slot for a request to execute at once in its caller's task, or
        None (the request must be enqueued). A claimed slot (``slot.instance``) gets no other
        work until :meth:`release`. The default: never."""
        return None

    def release(self, slot: Any) -> None:
        """Give back a slot from :meth:`claim` after its execution."""
        raise unsupported(f"{type(self).__name__} hands out no slots")
