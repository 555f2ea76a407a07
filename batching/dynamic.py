"""Dynamic batching decisions: pure functions of the queue's front and the clock.

:func:`form_batch` is Triton's ``DynamicBatchScheduler::GetDynamicBatch`` (core
``dynamic_batch_scheduler.cc``) for an idle instance:

* requests are taken whole, in service order, never split;
* a batch holds requests whose :func:`shape_key` matches the first one's (equal shapes for
  variable-size inputs that are not ``allow_ragged_batch``; the same set of inputs when the
  model has optional inputs); a different one closes the batch;
* when a preferred batch size is reachable, the largest reachable one is sent at once;
* otherwise the batch waits until the oldest request has waited ``max_queue_delay``, then
  goes with what it has; it also goes at once when it cannot grow (the next request would
  pass the largest preferred size or ``max_batch_size``) or when there is no delay
  (``dynamic_batching {}`` is greedy);
* while waiting, a request's queue timeout also wakes the batcher.

The batcher task calls it every time the queue or the set of idle instances changes and when
the returned wait elapses.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trident.protocol.generated.inference import ModelConfig


class Candidate(Protocol):
    @property
    def batch_size(self) -> int: ...

    @property
    def enqueued(self) -> float: ...

    @property
    def deadline(self) -> float | None: ...

    @property
    def key(self) -> Hashable: ...


@dataclass(frozen=True, slots=True)
class BatchRules:
    """How one model version forms batches (times in seconds)."""

    enabled: bool = False  # False: one request per execution (Triton's default scheduler)
    max_batch_size: int = 1
    preferred: tuple[int, ...] = ()
    max_queue_delay: float = 0.0

    @classmethod
    def from_config(cls, config: ModelConfig) -> BatchRules:
        batching = config.dynamic_batching
        if batching is None:
            return cls()
        max_batch = max(1, int(config.max_batch_size))
        preferred = tuple(sorted({int(s) for s in batching.preferred_batch_size if 0 < s <= max_batch}))
        return cls(True, max_batch, preferred, int(batching.max_queue_delay_microseconds) / 1_000_000)

    @property
    def max_preferred(self) -> int:
        return self.preferred[-1] if self.preferred else self.max_batch_size

    @property
    def limit(self) -> int:
        """The most batch elements one execution may hold."""
        return self.max_batch_size if self.enabled else 1


@dataclass(frozen=True, slots=True)
class Decision:
    """``take`` requests from the front now; or, when 0, look again after ``wait`` seconds
    (None: only when the queue or the idle instances change)."""

    take: int
    wait: float | None = None


def form_batch(candidates: Sequence[Candidate], rules: BatchRules, now: float) -> Decision:
    """The next batch for an idle instance from the front of the queue (see module docstring)."""
    if not candidates:
        return Decision(0)
    if not rules.enabled:
        return Decision(1)
    max_preferred = rules.max_preferred
    preferred = rules.preferred
    pending = 0  # batch elements in the pending batch
    count = 0  # requests in the pending batch
    best = 0  # requests in the best batch found (a preferred size, or the largest within max_preferred)
    send_now = False
    key = candidates[0].key
    for c in candidates:
        size = max(1, c.batch_size)
        if count:
            if pending + size > max_preferred and best == 0:
                best = count
            if pending + size > rules.max_batch_size:
                send_now = True
                break
            if c.key != key:
                send_now = True
                break
        pending += size
        count += 1
        if pending in preferred:
            best = count
    oldest = min(c.enqueued for c in candidates[:count])
    delay = rules.max_queue_delay
    delay_exceeded = delay > 0 and now - oldest >= delay
    if best and not delay_exceeded:
        return Decision(best)
    if send_now or pending >= max_preferred or delay_exceeded or delay <= 0:
        return Decision(count)
    wait = delay - (now - oldest)
    deadlines = [c.deadline for c in candidates[:count] if c.deadline is not None]
    if deadlines:
        wait = min(wait, max(0.0, min(deadlines) - now))
    return Decision(0, wait)


def shape_key(config: ModelConfig) -> Callable[[Any], Hashable]:
    """A function of a request whose value must be equal for requests to share a batch.

    Compares the shapes (without the batch dimension) of variable-size inputs that are not
    ``allow_ragged_batch``, and, when the model has optional inputs, which inputs are present
    (Triton's ``RequiredEqualInputs``). Returns a constant function when nothing needs checking.
    """
    batching = config.max_batch_size > 0
    checked = frozenset(
        i.name for i in config.input
        if not i.allow_ragged_batch and not i.is_shape_tensor and any(d < 0 for d in i.dims)
    )
    optional = any(i.optional for i in config.input)
    if not checked and not optional:
        return _same

    def key(request: Any) -> Hashable:
        parts: list[tuple[str, tuple[int, ...] | None]] = []
        for tensor in request.inputs:
            if tensor.name in checked:
                shape = tuple(tensor.shape[1:] if batching else tensor.shape)
                parts.append((tensor.name, shape))
            elif optional:
                parts.append((tensor.name, None))
        return tuple(sorted(parts))

    return key


def _same(request: Any) -> Hashable:
    return None
