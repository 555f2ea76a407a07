"""Per-model-version statistics: a recorder the scheduler updates, frozen snapshots for readers.

:meth:`StatsRecorder.snapshot` returns a :class:`~trident.types.ModelStatistics` (a typed
snapshot) that feeds the statistics extension (encoded for JSON and protobuf by
``trident.protocol``) and metrics.

Triton's accounting (core ``infer_stats.cc``): ``success`` / ``queue`` count every successful
request, cache hits included; ``compute_*`` only executed ones (a request gets its batch's
compute times); ``inference_count`` / ``execution_count`` / ``batch_stats`` only executions;
``cache_hit`` is the lookup time of a hit, ``cache_miss`` the lookup plus insertion time of a
miss. Each failure has a reason (:data:`FAILURE_REASONS`, the ``reason`` label of
``nv_inference_request_failure``): REJECTED (queue timeout or full queue), CANCELED (the
client went away), BACKEND (the model failed), OTHER. ``cancelled`` is the CANCELED count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trident.types import BatchStats, Duration, ModelStatistics

__all__ = ["BACKEND", "CANCELED", "FAILURE_REASONS", "OTHER", "REJECTED", "BatchStats", "Duration",
           "ModelStatistics", "StatsRecorder"]

REJECTED = "REJECTED"
CANCELED = "CANCELED"
BACKEND = "BACKEND"
OTHER = "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)


@dataclass
class _Acc:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def freeze(self) -> Duration:
        return Duration(self.count, self.ns)


@dataclass
class _BatchAcc:
    compute_input: _Acc = field(default_factory=_Acc)
    compute_infer: _Acc = field(default_factory=_Acc)
    compute_output: _Acc = field(default_factory=_Acc)


_FOLD_EVERY = 256  # records kept unfolded at most (a snapshot folds them at once)


class StatsRecorder:
    """Mutable counters of one model version. Only touched from the trio thread.

    A successful request and an execution are recorded as one tuple appended to a list, folded
    into the counters every :data:`_FOLD_EVERY` records and before every :meth:`snapshot` (a
    record costs an append, not ten counter updates).
    """

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.cancelled = 0
        self.success = _Acc()
        self.fail = _Acc()
        self.queue = _Acc()
        self.compute_input = _Acc()
        self.compute_infer = _Acc()
        self.compute_output = _Acc()
        self.cache_hit = _Acc()
        self.cache_miss = _Acc()
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        self._batches: dict[int, _BatchAcc] = {}
        self._successes: list[tuple[int, int, int, int, int]] = []
        self._executions: list[tuple[int, int, int, int]] = []
        self._last_success_ns = 0  # time.time_ns() of the last success in _successes

    def record_success(self, request_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One request finished successfully (times are per request)."""
        successes = self._successes
        successes.append((request_ns, queue_ns, input_ns, infer_ns, output_ns))
        self._last_success_ns = time.time_ns()
        if len(successes) >= _FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Add the unfolded records to the counters."""
        successes, self._successes = self._successes, []
        if successes:
            n = len(successes)
            request, queue, compute_input, compute_infer, compute_output = (sum(c) for c in zip(*successes, strict=True))
            self.success.add(request, n)
            self.queue.add(queue, n)
            self.compute_input.add(compute_input, n)
            self.compute_infer.add(compute_infer, n)
            self.compute_output.add(compute_output, n)
            self.last_inference_ms = max(self.last_inference_ms, self._last_success_ns // 1_000_000)
        executions, self._executions = self._executions, []
        for batch_size, input_ns, infer_ns, output_ns in executions:
            self.execution_count += 1
            self.inference_count += batch_size
            acc = self._batches.get(batch_size)
            if acc is None:
                acc = self._batches[batch_size] = _BatchAcc()
            acc.compute_input.add(input_ns)
            acc.compute_infer.add(infer_ns)
            acc.compute_output.add(output_ns)

    def record_failure(self, request_ns: int, *, cancelled: bool = False, reason: str = "") -> None:
        """One request failed after ``request_ns``; ``reason`` defaults to CANCELED or OTHER."""
        reason = reason or (CANCELED if cancelled else OTHER)
        self.fail.add(request_ns)
        self.failures[reason] = self.failures.get(reason, 0) + 1
        if reason == CANCELED:
            self.cancelled += 1
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_cache_hit(self, request_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache (no execution)."""
        self.success.add(request_ns)
        self.queue.add(queue_ns)
        self.cache_hit.add(lookup_ns)
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_cache_miss(self, lookup_and_insert_ns: int) -> None:
        """A cache miss whose response was then inserted (its success is recorded separately)."""
        self.cache_miss.add(lookup_and_insert_ns)

    def record_execution(self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One batch executed with ``batch_size`` inferences in it."""
        executions = self._executions
        executions.append((batch_size, input_ns, infer_ns, output_ns))
        if len(executions) >= _FOLD_EVERY:
            self._fold()

    def snapshot(self) -> ModelStatistics:
        self._fold()
        return ModelStatistics(
            name=self.name,
            version=self.version,
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
            success=self.success.freeze(),
            fail=self.fail.freeze(),
            queue=self.queue.freeze(),
            compute_input=self.compute_input.freeze(),
            compute_infer=self.compute_infer.freeze(),
            compute_output=self.compute_output.freeze(),
            cache_hit=self.cache_hit.freeze(),
            cache_miss=self.cache_miss.freeze(),
            batch_stats=tuple(
                BatchStats(size, a.compute_input.freeze(), a.compute_infer.freeze(), a.compute_output.freeze())
                for size, a in sorted(self._batches.items())
            ),
            cancelled=self.cancelled,
            failures=tuple((reason, self.failures.get(reason, 0)) for reason in FAILURE_REASONS),
        )
