"""Priority levels and queue policies of the dynamic batcher (pure: no trio, no clock).

Triton's rules (core ``scheduler_utils.cc``, ``infer_request.cc``):

* the request parameter ``priority`` picks a level; 1 is the highest. 0, a value above
  ``priority_levels`` or no parameter means ``default_priority_level``; without
  ``priority_levels`` there is a single level;
* each level has a queue policy: its entry in ``priority_queue_policy``, else
  ``default_queue_policy``;
* ``max_queue_size`` (0 = unbounded) caps the requests waiting at one level (delayed ones
  included); one more is refused with UNAVAILABLE "Exceeds maximum queue size";
* ``default_timeout_microseconds`` (0 = none) is a request's time in the queue; with
  ``allow_timeout_override`` the request parameter ``timeout`` (µs) replaces it when it is
  non-zero and *smaller* (so a default of 0 cannot be overridden, as in Triton);
* an expired request is rejected (REJECT: UNAVAILABLE "Request timeout expired") or moved
  behind every unexpired request of its level (DELAY);
* service order: levels from highest priority, within a level the unexpired requests in
  arrival order, then the delayed ones.

:class:`PriorityQueue` keeps the entries; the batcher task (:mod:`trident.batching.batcher`)
drives it with the trio clock, so every rule here is tested with plain numbers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from trident.errors import unavailable
from trident.protocol.generated.inference import (
    ModelDynamicBatching,
    ModelQueuePolicy,
    ModelQueuePolicyTimeoutAction,
)

REJECT = "REJECT"
DELAY = "DELAY"
QUEUE_FULL = "Exceeds maximum queue size"
TIMEOUT_EXPIRED = "Request timeout expired"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One level's ModelQueuePolicy."""

    timeout_action: str = REJECT
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_config(cls, policy: ModelQueuePolicy | None) -> QueuePolicy:
        if policy is None:
            return cls()
        action = DELAY if policy.timeout_action == ModelQueuePolicyTimeoutAction.DELAY else REJECT
        return cls(action, int(policy.default_timeout_microseconds), bool(policy.allow_timeout_override),
                   int(policy.max_queue_size))

    def timeout_us(self, requested_us: int) -> int:
        """The queue timeout of a request that asked for ``requested_us`` (0 = no timeout)."""
        timeout = self.default_timeout_us
        if self.allow_timeout_override and 0 < requested_us < timeout:
            timeout = requested_us
        return timeout


@dataclass(frozen=True, slots=True)
class Priorities:
    """The levels of a model and the policy of each."""

    levels: int = 0  # 0: one level (0)
    default_level: int = 0
    default_policy: QueuePolicy = QueuePolicy()
    policies: Mapping[int, QueuePolicy] = field(default_factory=dict)

    @classmethod
    def from_config(cls, batching: ModelDynamicBatching | None) -> Priorities:
        if batching is None:
            return cls()
        levels = int(batching.priority_levels)
        return cls(
            levels=levels,
            default_level=int(batching.default_priority_level) if levels else 0,
            default_policy=QueuePolicy.from_config(batching.default_queue_policy),
            policies={int(k): QueuePolicy.from_config(v) for k, v in batching.priority_queue_policy.items()},
        )

    def level_of(self, requested: int) -> int:
        """The level a request asking for priority ``requested`` waits at."""
        if requested <= 0 or requested > self.levels:
            return self.default_level
        return requested

    def policy_of(self, level: int) -> QueuePolicy:
        return self.policies.get(level, self.default_policy)


def _uint_parameter(parameters: Mapping[str, Any], key: str) -> int:
    value = parameters.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def request_priority(parameters: Mapping[str, Any]) -> int:
    """The request's ``priority`` parameter (0 when absent or not a non-negative integer)."""
    return _uint_parameter(parameters, "priority")


def request_timeout_us(parameters: Mapping[str, Any]) -> int:
    """The request's ``timeout`` parameter in µs (0 when absent or not a non-negative integer)."""
    return _uint_parameter(parameters, "timeout")


class Entry:
    """A queued request with what the batcher needs to know about it.

    ``item`` is the scheduler's item (it has ``cancelled`` and ``batch_size``), ``enqueued``
    and ``deadline`` are clock readings in seconds (``deadline`` None: no timeout), ``key``
    groups the requests that may share a batch (see :func:`trident.batching.dynamic.shape_key`).
    """

    __slots__ = ("item", "level", "enqueued", "deadline", "key", "batch_size")

    def __init__(self, item: Any, level: int, enqueued: float, deadline: float | None = None,
                 key: Hashable = None, batch_size: int = 1) -> None:
        self.item = item
        self.level = level
        self.enqueued = enqueued
        self.deadline = deadline
        self.key = key
        self.batch_size = max(1, batch_size)

    @property
    def cancelled(self) -> bool:
        return bool(self.item.cancelled)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Entry({self.item!r}, level={self.level}, enqueued={self.enqueued}, deadline={self.deadline})"


class _Level:
    __slots__ = ("policy", "queue", "delayed")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.queue: deque[Entry] = deque()
        self.delayed: deque[Entry] = deque()

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class PriorityQueue:
    """The queued requests of one model version, per level, in service order."""

    def __init__(self, priorities: Priorities) -> None:
        self.priorities = priorities
        self._levels: dict[int, _Level] = {}
        self._order: list[int] = []
        self._size = 0
        self._next_deadline = math.inf

    def __len__(self) -> int:
        return self._size

    def _level(self, level: int) -> _Level:
        found = self._levels.get(level)
        if found is None:
            found = self._levels[level] = _Level(self.priorities.policy_of(level))
            self._order = sorted(self._levels)
        return found

    def level_size(self, level: int) -> int:
        found = self._levels.get(level)
        return len(found) if found is not None else 0

    def push(self, entry: Entry) -> None:
        """Append ``entry`` at its level. Raises UNAVAILABLE "Exceeds maximum queue size"."""
        level = self._level(entry.level)
        limit = level.policy.max_queue_size
        if limit and len(level) >= limit:
            raise unavailable(QUEUE_FULL)
        level.queue.append(entry)
        self._size += 1
        if entry.deadline is not None and entry.deadline < self._next_deadline:
            self._next_deadline = entry.deadline

    def _deques(self) -> Iterator[deque[Entry]]:
        for level in self._order:
            found = self._levels[level]
            yield found.queue
            yield found.delayed

    def __iter__(self) -> Iterator[Entry]:
        """Every entry in service order."""
        for dq in self._deques():
            yield from dq

    def next_deadline(self) -> float:
        """The earliest timeout among waiting requests (``inf`` when none); may be early, never late."""
        return self._next_deadline

    def expire(self, now: float) -> list[Entry]:
        """Apply the timeout policies at time ``now``; return the entries to reject.

        Entries whose deadline has come (``deadline <= now``) leave the queue (REJECT) or move
        to their level's delayed tail (DELAY, where no timeout applies any more).
        """
        if now < self._next_deadline:
            return []
        rejected: list[Entry] = []
        earliest = math.inf
        for level in self._levels.values():
            keep: deque[Entry] = deque()
            for entry in level.queue:
                if entry.deadline is not None and entry.deadline <= now:
                    entry.deadline = None
                    if level.policy.timeout_action == DELAY:
                        level.delayed.append(entry)
                    else:
                        rejected.append(entry)
                        self._size -= 1
                    continue
                if entry.deadline is not None and entry.deadline < earliest:
                    earliest = entry.deadline
                keep.append(entry)
            level.queue = keep
        self._next_deadline = earliest
        return rejected

    def remove_cancelled(self, drop: Callable[[Entry], None]) -> int:
        """Remove every cancelled entry (passing each to ``drop``); return how many."""
        removed = 0
        for level in self._levels.values():
            for name in ("queue", "delayed"):
                dq: deque[Entry] = getattr(level, name)
                if any(e.cancelled for e in dq):
                    keep: deque[Entry] = deque()
                    for e in dq:
                        if e.cancelled:
                            drop(e)
                            removed += 1
                        else:
                            keep.append(e)
                    setattr(level, name, keep)
        self._size -= removed
        return removed

    def candidates(self, limit: int, drop: Callable[[Entry], None]) -> list[Entry]:
        """The entries a batch may be formed from, in service order.

        Walks from the front while the summed batch size stays within ``limit``, plus the first
        entry beyond it (the batcher needs to see that one to know the batch is full).
        Cancelled entries met on the way are removed and passed to ``drop``.
        """
        out: list[Entry] = []
        total = 0
        for dq in self._deques():
            i = 0
            while i < len(dq):
                entry = dq[i]
                if entry.cancelled:
                    del dq[i]
                    self._size -= 1
                    drop(entry)
                    continue
                out.append(entry)
                total += entry.batch_size
                if total > limit or len(out) > limit:
                    return out
                i += 1
        return out

    def pop(self, count: int) -> list[Entry]:
        """Remove and return the first ``count`` entries in service order."""
        out: list[Entry] = []
        for dq in self._deques():
            while dq and len(out) < count:
                out.append(dq.popleft())
            if len(out) == count:
                break
        self._size -= len(out)
        return out
