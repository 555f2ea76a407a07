"""Sequence batching decisions: pure functions of the slots, the queues and the clock.

Triton's sequence batcher (core ``src/sequence_batch_scheduler/``), as trident does it:

* every sequence is bound to one instance and one slot of it from its START request until
  its END request has run or it has been idle for ``max_sequence_idle_microseconds``
  (:func:`free_slot`: the instance with the most free slots, then its first free slot);
  a sequence that finds no free slot waits (backlog) until one frees;
* **direct**: an instance has ``max_batch_size`` slots (one per batch position); a batch
  takes the front request of every slot whose sequence has one (:func:`ready_mask`), in slot
  order; with ``minimum_slot_utilization`` and ``max_queue_delay_microseconds`` it waits for
  enough ready slots until the oldest front request has waited the delay; a sequence keeps
  its batch index (= its slot) for its whole life: :func:`direct_layout` pads the slots below
  the highest one with a request with null requests (READY false), and leaves out the idle
  slots above it;
* **oldest**: an instance holds up to ``max_candidate_sequences`` sequences; a batch takes
  the front requests of the sequences whose fronts are oldest, one request per sequence, up to
  ``max_batch_size``, sent at once when a preferred size (the largest reachable) or the
  maximum is reached, or the delay has passed;
* :func:`idle_expired` names the sequences to reap: bound, not running, nothing queued, and
  idle for at least the idle timeout.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from trident.protocol.generated.inference import ModelConfig

DIRECT = "direct"
OLDEST = "oldest"
DEFAULT_IDLE_SECONDS = 1.0
_SLACK = 1e-9  # seconds


@dataclass(frozen=True, slots=True)
class SequenceRules:
    """How one model version batches sequences (times in seconds)."""

    strategy: str = DIRECT
    slots: int = 1  # per instance: direct = max_batch_size, oldest = max_candidate_sequences
    max_batch_size: int = 1
    delay: float = 0.0
    min_utilization: float = 0.0
    preferred: tuple[int, ...] = ()
    preserve_ordering: bool = False
    idle: float = DEFAULT_IDLE_SECONDS

    @classmethod
    def from_config(cls, config: ModelConfig) -> SequenceRules:
        sb = config.sequence_batching
        max_batch = max(1, int(config.max_batch_size))
        idle = (int(sb.max_sequence_idle_microseconds) / 1_000_000 if sb and sb.max_sequence_idle_microseconds
                else DEFAULT_IDLE_SECONDS)
        if sb is not None and sb.oldest is not None:
            o = sb.oldest
            preferred = tuple(sorted({int(p) for p in o.preferred_batch_size if 0 < p <= max_batch}))
            return cls(OLDEST, max(1, int(o.max_candidate_sequences)), max_batch,
                       int(o.max_queue_delay_microseconds) / 1_000_000, 0.0, preferred, bool(o.preserve_ordering),
                       idle)
        d = sb.direct if sb is not None else None
        delay = int(d.max_queue_delay_microseconds) / 1_000_000 if d else 0.0
        utilization = float(d.minimum_slot_utilization) if d else 0.0
        return cls(DIRECT, max_batch, max_batch, delay, utilization, (), False, idle)


@dataclass(eq=False)
class Sequence:
    """A live sequence: its queued requests (``(enqueue time, pending)``) and where it is bound."""

    id: Any
    queue: deque[tuple[float, Any]] = field(default_factory=deque)
    instance: int | None = None
    slot: int | None = None
    last: float = 0.0  # last activity: a request queued or finished
    running: bool = False
    ended: bool = False  # its END request has been queued

    @property
    def front_time(self) -> float | None:
        return self.queue[0][0] if self.queue else None


Row = list[Sequence | None]


def free_slot(rows: list[Row]) -> tuple[int, int] | None:
    """(instance, slot) for a new sequence: the instance with the most free slots (lowest
    index on ties), its first free slot; None when every slot is taken."""
    best: tuple[int, int] | None = None
    best_free = 0
    for i, row in enumerate(rows):
        free = sum(s is None for s in row)
        if free > best_free:
            best_free = free
            best = (i, row.index(None))
    return best


def ready_mask(row: Row) -> list[bool]:
    """Which slots of an instance carry a request for the next batch (READY)."""
    return [s is not None and bool(s.queue) and not s.running for s in row]


def direct_layout(slots: list[int]) -> list[int | None]:
    """The batch of a direct instance whose requests sit in ``slots`` (one slot per request,
    in request order): entry ``b`` is the index in ``slots`` of the request at batch index
    ``b`` (which is slot ``b``), or None where slot ``b`` has no request — a null request,
    READY false. Slots above the highest one with a request are not sent; ``[]`` for no slots.

    Raises ValueError when a slot is negative or appears twice.
    """
    if not slots:
        return []
    if min(slots) < 0 or len(set(slots)) != len(slots):
        raise ValueError(f"direct batch slots must be distinct and non-negative, got {slots}")
    layout: list[int | None] = [None] * (max(slots) + 1)
    for index, slot in enumerate(slots):
        layout[slot] = index
    return layout


def choose_batch(row: Row, rules: SequenceRules, now: float) -> tuple[list[int], float | None]:
    """The slots whose front requests form the next batch of an idle instance, or ``([],
    wait)``: look again after ``wait`` seconds (None: only when something changes)."""
    ready = [i for i, r in enumerate(ready_mask(row)) if r]
    if not ready:
        return [], None
    fronts = {i: row[i].front_time for i in ready}  # type: ignore[union-attr]
    oldest = min(t for t in fronts.values() if t is not None)
    elapsed = now - oldest
    delay = rules.delay
    # 1 ns of slack: ``now - oldest`` can fall short of ``delay`` by a rounding error after a
    # wait of exactly ``delay - elapsed``, and waiting for that error would never end
    due = delay <= 0 or elapsed >= delay - _SLACK
    if rules.strategy == DIRECT:
        if due or len(ready) >= rules.min_utilization * rules.slots:
            return ready, None
        return [], delay - elapsed
    ordered = sorted(ready, key=lambda i: fronts[i])  # type: ignore[arg-type, return-value]
    n = min(len(ordered), rules.max_batch_size)
    if due or n >= rules.max_batch_size:
        return ordered[:n], None
    reachable = [p for p in rules.preferred if p <= n]
    if reachable:
        return ordered[:reachable[-1]], None
    return [], delay - elapsed


def idle_expired(sequences: list[Sequence], now: float, idle: float) -> list[Sequence]:
    """The bound sequences that have been idle (nothing queued, not running) for ``idle``."""
    return [s for s in sequences
            if s.slot is not None and not s.running and not s.queue and now - s.last >= idle]


def next_idle_deadline(sequences: list[Sequence], idle: float) -> float | None:
    """When the next bound, idle sequence times out (None: none can)."""
    times = [s.last + idle for s in sequences if s.slot is not None and not s.running and not s.queue]
    return min(times) if times else None
