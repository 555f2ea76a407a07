"""Pure measurement: per-request records into window summaries, stability, server-side deltas.

A record is one finished request: ``(start, sent, first_byte, end)`` in monotonic nanoseconds
(``time.monotonic_ns``, one clock for every worker process on the machine) and ``ok`` (1, or 0
for a failed request). A window keeps the records whose ``end`` falls inside it. Stability
follows perf_analyzer: the last ``STABILITY_WINDOWS`` windows are stable when both throughput
and the latency that stabilizes (average, or ``--percentile``) lie within ``--stability-percentage``
of one another (``(max - min) / min``); the reported figures merge those windows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RECORD_FIELDS", "Summary", "ServerStats", "summarize", "merge", "is_stable", "STABILITY_WINDOWS",
           "server_stats_from_json", "server_stats_from_fields", "PERCENTILES"]

RECORD_FIELDS = 5  # start, sent, first byte, end, ok
STABILITY_WINDOWS = 3
PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class ServerStats:
    """Cumulative statistics-extension counters for one model version (durations in ns)."""

    inference_count: int = 0
    execution_count: int = 0
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    cache_hit_count: int = 0

    def __sub__(self, other: ServerStats) -> ServerStats:
        return ServerStats(*(getattr(self, f) - getattr(other, f) for f in self.__dataclass_fields__))

    def per_request_us(self) -> dict[str, float]:
        """Average microseconds per successful request: request, queue, compute input/infer/output
        and overhead (request minus the four parts)."""
        n = max(self.success_count, 1)
        out = {"request": self.success_ns / n / 1e3, "queue": self.queue_ns / n / 1e3,
               "compute_input": self.compute_input_ns / n / 1e3, "compute_infer": self.compute_infer_ns / n / 1e3,
               "compute_output": self.compute_output_ns / n / 1e3}
        parts = out["queue"] + out["compute_input"] + out["compute_infer"] + out["compute_output"]
        out["overhead"] = max(0.0, out["request"] - parts)
        return out


def server_stats_from_json(doc: Mapping[str, Any], version: str) -> ServerStats:
    """Sum of the ``model_stats`` entries (of ``version`` when given) of a /stats JSON reply."""
    total = ServerStats()
    for entry in doc.get("model_stats", []) or []:
        if not isinstance(entry, dict) or (version and str(entry.get("version")) != version):
            continue
        inf = entry.get("inference_stats") or {}
        total = _add(total, ServerStats(
            int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0)),
            _jd(inf, "success", "count"), _jd(inf, "success", "ns"), _jd(inf, "fail", "count"), _jd(inf, "queue", "ns"),
            _jd(inf, "compute_input", "ns"), _jd(inf, "compute_infer", "ns"), _jd(inf, "compute_output", "ns"),
            _jd(inf, "cache_hit", "count")))
    return total


def _jd(stats: Mapping[str, Any], name: str, key: str) -> int:
    return int((stats.get(name) or {}).get(key, 0))


Decode = Callable[[bytes], dict[int, list[Any]]]


def server_stats_from_fields(entries: Sequence[dict[int, list[Any]]], decode: Decode, version: str) -> ServerStats:
    """The same from decoded ``ModelStatistics`` protobuf messages (``decode`` parses a nested one)."""
    total = ServerStats()
    for entry in entries:
        ver = entry.get(2, [b""])[0]
        if version and isinstance(ver, bytes) and ver.decode() != version:
            continue
        inf = decode(entry[6][0]) if 6 in entry else {}
        total = _add(total, ServerStats(
            int(entry.get(4, [0])[0]), int(entry.get(5, [0])[0]),
            _pd(decode, inf, 1, 1), _pd(decode, inf, 1, 2), _pd(decode, inf, 2, 1), _pd(decode, inf, 3, 2),
            _pd(decode, inf, 4, 2), _pd(decode, inf, 5, 2), _pd(decode, inf, 6, 2), _pd(decode, inf, 7, 1)))
    return total


def _pd(decode: Decode, stats: dict[int, list[Any]], number: int, which: int) -> int:
    if number not in stats:
        return 0
    return int(decode(stats[number][0]).get(which, [0])[0])


def _add(a: ServerStats, b: ServerStats) -> ServerStats:
    return ServerStats(*(getattr(a, f) + getattr(b, f) for f in a.__dataclass_fields__))


@dataclass
class Summary:
    """Figures of one window, or of merged windows."""

    count: int  # successful requests
    failed: int
    duration_s: float
    batch: int
    latencies_ns: np.ndarray = field(repr=False)
    send_ns: float = 0.0
    recv_ns: float = 0.0
    wait_ns: float = 0.0
    delayed: int = 0  # request-rate mode: requests sent later than scheduled (no free connection)
    client_cpu_s: float = 0.0
    server: ServerStats | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Inferences per second (requests x batch size)."""
        return self.count * self.batch / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def avg_us(self) -> float:
        return float(self.latencies_ns.mean()) / 1e3 if len(self.latencies_ns) else 0.0

    @property
    def std_us(self) -> float:
        return float(self.latencies_ns.std()) / 1e3 if len(self.latencies_ns) else 0.0

    def percentile_us(self, p: float) -> float:
        """perf_analyzer's percentile: the sorted latency at index ``n * p / 100``."""
        n = len(self.latencies_ns)
        if not n:
            return 0.0
        ordered = np.sort(self.latencies_ns)
        return float(ordered[min(n - 1, int(n * p / 100))]) / 1e3

    def latency_us(self, percentile: float | None) -> float:
        """The stabilizing latency: the average, or the given percentile."""
        return self.avg_us if percentile is None else self.percentile_us(percentile)

    @property
    def client_cpu_pct(self) -> float:
        """The load generator's CPU over the window, in % of one core."""
        return 100.0 * self.client_cpu_s / self.duration_s if self.duration_s > 0 else 0.0


def summarize(records: np.ndarray, duration_s: float, batch: int, client_cpu_s: float = 0.0,
              delayed: int = 0) -> Summary:
    """One window's summary from its records (an ``(n, RECORD_FIELDS)`` int64 array)."""
    ok = records[records[:, 4] == 1] if len(records) else records
    lat = (ok[:, 3] - ok[:, 0]) if len(ok) else np.zeros(0, np.int64)
    return Summary(
        count=len(ok), failed=len(records) - len(ok), duration_s=duration_s, batch=batch, latencies_ns=lat,
        send_ns=float((ok[:, 1] - ok[:, 0]).mean()) if len(ok) else 0.0,
        recv_ns=float((ok[:, 3] - ok[:, 2]).mean()) if len(ok) else 0.0,
        wait_ns=float((ok[:, 2] - ok[:, 1]).mean()) if len(ok) else 0.0,
        delayed=delayed, client_cpu_s=client_cpu_s)


def merge(windows: Sequence[Summary]) -> Summary:
    """Windows merged into one summary (as perf_analyzer reports the stable windows)."""
    total = sum(w.count for w in windows)

    def wavg(attr: str) -> float:
        return sum(getattr(w, attr) * w.count for w in windows) / total if total else 0.0

    server = None
    if all(w.server is not None for w in windows) and windows:
        server = ServerStats()
        for w in windows:
            server = _add(server, w.server)  # type: ignore[arg-type]
    metrics: dict[str, float] = {}
    for w in windows:
        for k, v in w.metrics.items():
            metrics[k] = max(metrics.get(k, v), v) if k.startswith("max") else metrics.get(k, 0.0) + v / len(windows)
    return Summary(
        count=total, failed=sum(w.failed for w in windows), duration_s=sum(w.duration_s for w in windows),
        batch=windows[0].batch if windows else 1,
        latencies_ns=np.concatenate([w.latencies_ns for w in windows]) if windows else np.zeros(0, np.int64),
        send_ns=wavg("send_ns"), recv_ns=wavg("recv_ns"), wait_ns=wavg("wait_ns"),
        delayed=sum(w.delayed for w in windows), client_cpu_s=sum(w.client_cpu_s for w in windows),
        server=server, metrics=metrics)


def is_stable(windows: Sequence[Summary], stability_pct: float, percentile: float | None) -> bool:
    """Whether the last :data:`STABILITY_WINDOWS` windows agree within ``stability_pct`` percent."""
    if len(windows) < STABILITY_WINDOWS:
        return False
    last = windows[-STABILITY_WINDOWS:]
    if any(w.count == 0 for w in last):
        return False
    limit = stability_pct / 100.0
    for values in ([w.throughput for w in last], [w.latency_us(percentile) for w in last]):
        low, high = min(values), max(values)
        if low <= 0 or (high - low) / low > limit:
            return False
    return True
