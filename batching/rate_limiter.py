"""The rate limiter (``--rate-limit execution_count``): instances run only when their resources are free.

Triton's model (``docs/user_guide/rate_limiter.md``, core ``rate_limiter.cc``), server-wide
across all models:

* an instance group's ``rate_limiter { resources [...] priority: N }`` lists what each of its
  instances holds while it executes: a resource is per device (the instance's device) unless
  marked ``global``;
* the copies of a resource available are ``--rate-limit-resource=<name>:<count>[:<device>]``
  when given (without a device: on every device, or globally for a global resource), else the
  largest count any loaded instance asks for, so every instance can run;
* instances waiting for resources are served in order of ``priority x (1 + executions so
  far)`` (priority 0 counts as 1), so an instance with priority 2 gets half the turns of one
  with priority 1; the first in that order that does not fit blocks the others, so a large
  request is not starved. Instances that list no resources never wait.

The ordering (:func:`service_order`) and fitting (:func:`fits`) are pure; :class:`RateLimiter`
is the trio part that parks waiting executions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from trident.errors import invalid_arg
from trident.protocol.generated.inference import ModelInstanceGroup

GLOBAL = -1  # the "device" of a global resource
ResourceKey = tuple[str, int]  # (name, device or GLOBAL)


@dataclass(frozen=True, slots=True)
class Needs:
    """What one instance holds while it executes."""

    resources: Mapping[ResourceKey, int] = field(default_factory=dict)
    priority: int = 1

    @classmethod
    def of_group(cls, group: ModelInstanceGroup, device: int) -> Needs:
        limiter = group.rate_limiter
        if limiter is None:
            return cls()
        resources: dict[ResourceKey, int] = {}
        for r in limiter.resources:
            if r.count > 0:
                key = (r.name, GLOBAL if r.global_ else device)
                resources[key] = resources.get(key, 0) + int(r.count)
        return cls(resources, max(1, int(limiter.priority)))


def parse_resource(text: str) -> tuple[str, int, int | None]:
    """``<name>:<count>[:<device>]`` -> (name, count, device or None). Raises ValueError."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--rate-limit-resource expects <name>:<count>[:<device>], got '{text}'")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(f"--rate-limit-resource expects integer count and device, got '{text}'") from None
    if count < 0 or (device is not None and device < 0):
        raise ValueError(f"--rate-limit-resource expects non-negative count and device, got '{text}'")
    return parts[0], count, device


def fits(needs: Mapping[ResourceKey, int], capacity: Mapping[ResourceKey, int], in_use: Mapping[ResourceKey, int]) -> bool:
    """Whether ``needs`` can be allocated on top of ``in_use``."""
    return all(in_use.get(k, 0) + n <= capacity.get(k, 0) for k, n in needs.items())


def service_order(waiters: Sequence[tuple[int, int, int]]) -> list[int]:
    """Indices of ``waiters`` — (priority, executions, arrival) — in the order they are served."""
    return sorted(range(len(waiters)),
                  key=lambda i: (waiters[i][0] * (1 + waiters[i][1]), waiters[i][2]))


class _Waiter:
    __slots__ = ("key", "needs", "seq", "event", "granted")

    def __init__(self, key: int, needs: Needs, seq: int) -> None:
        self.key = key
        self.needs = needs
        self.seq = seq
        self.event = trio.Event()
        self.granted = False


class RateLimiter:
    """Server-wide resource accounting for model instances. Trio thread only."""

    def __init__(self, explicit: Iterable[tuple[str, int, int | None]] = ()) -> None:
        self._explicit: dict[tuple[str, int | None], int] = {(n, d): c for n, c, d in explicit}
        self._registered: dict[int, Needs] = {}
        self._executions: dict[int, int] = {}
        self._globals: set[str] = set()
        self._local: set[str] = set()
        self._in_use: Counter[ResourceKey] = Counter()
        self._capacity: dict[ResourceKey, int] = {}
        self._waiters: list[_Waiter] = []
        self._seq = 0

    @classmethod
    def from_options(cls, options: Any) -> RateLimiter | None:
        """The limiter for ``--rate-limit`` (None when off). Raises ValueError for bad settings."""
        mode = getattr(options, "rate_limit", "off")
        if mode == "off":
            return None
        if mode != "execution_count":
            raise ValueError(f"--rate-limit expects 'execution_count' or 'off', got '{mode}'")
        return cls(parse_resource(r) for r in getattr(options, "rate_limit_resources", ()))

    # ---- registration ---------------------------------------------------------------------

    def register(self, instance: object, needs: Needs) -> None:
        """Account for a loaded instance. Raises INVALID_ARG when it can never run."""
        for name, device in needs.resources:
            other = self._local if device == GLOBAL else self._globals
            if name in other:
                raise invalid_arg(f"resource '{name}' is declared both global and per-device by model instances")
        key = id(instance)
        self._registered[key] = needs
        self._executions.setdefault(key, 0)
        for name, device in needs.resources:
            (self._globals if device == GLOBAL else self._local).add(name)
        self._recompute()
        for rkey, count in needs.resources.items():
            available = self._capacity.get(rkey, 0)
            if count > available:
                self.unregister(instance)
                where = "globally" if rkey[1] == GLOBAL else f"on device {rkey[1]}"
                raise invalid_arg(
                    f"rate limiter resource '{rkey[0]}' has {available} copies {where}, an instance needs {count}"
                )

    def unregister(self, instance: object) -> None:
        self._registered.pop(id(instance), None)
        self._executions.pop(id(instance), None)
        self._recompute()
        self._dispatch()

    def _recompute(self) -> None:
        capacity: dict[ResourceKey, int] = {}
        for needs in self._registered.values():
            for (name, device), count in needs.resources.items():
                capacity[(name, device)] = max(capacity.get((name, device), 0), count)
        for (name, device) in list(capacity):
            given = self._explicit.get((name, None if device == GLOBAL else device))
            if given is None and device != GLOBAL:
                given = self._explicit.get((name, None))
            if given is not None:
                capacity[(name, device)] = given
        self._capacity = capacity

    def capacity(self) -> dict[ResourceKey, int]:
        """Copies of each resource now available in total."""
        return dict(self._capacity)

    def in_use(self) -> dict[ResourceKey, int]:
        return {k: v for k, v in self._in_use.items() if v}

    # ---- execution ------------------------------------------------------------------------

    @asynccontextmanager
    async def acquire(self, instance: object) -> AsyncIterator[None]:
        """Hold ``instance``'s resources for the body (waiting until they are free).

        Cancellation: a cancelled wait takes nothing; resources are released on exit.
        """
        key = id(instance)
        needs = self._registered.get(key)
        if needs is None or not needs.resources:
            self._executions[key] = self._executions.get(key, 0) + 1
            yield
            return
        waiter = _Waiter(key, needs, self._seq)
        self._seq += 1
        self._waiters.append(waiter)
        self._dispatch()
        try:
            if not waiter.granted:
                await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self._in_use.subtract(needs.resources)
            else:
                self._waiters.remove(waiter)
            self._dispatch()
            raise
        try:
            yield
        finally:
            self._in_use.subtract(needs.resources)
            self._dispatch()

    def _dispatch(self) -> None:
        if not self._waiters:
            return
        waiting = [(w.needs.priority, self._executions.get(w.key, 0), w.seq) for w in self._waiters]
        granted: list[_Waiter] = []
        for i in service_order(waiting):
            w = self._waiters[i]
            if not fits(w.needs.resources, self._capacity, self._in_use):
                break
            self._in_use.update(w.needs.resources)
            self._executions[w.key] = self._executions.get(w.key, 0) + 1
            w.granted = True
            w.event.set()
            granted.append(w)
        for w in granted:
            self._waiters.remove(w)
