"""Per-model latency metrics beyond the counters: ``--metrics-config`` and its observers.

``--metrics-config`` takes Triton's ``<key>=<value>`` settings: ``counter_latencies``
(default true: the ``*_duration_us`` counters), ``summary_latencies`` (default false: the
``nv_inference_*_summary_us`` summaries), ``summary_quantiles`` (``q:error,...``, default
``0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001``) and ``histogram_latencies``
(default false: ``nv_inference_first_response_histogram_ms``).

A :class:`LatencyObserver` belongs to one model version; the request path calls
:meth:`LatencyObserver.request` and :meth:`LatencyObserver.first_response` from the trio
thread. Summaries report exact quantiles over a sliding window of the most recent
observations (Triton's prometheus-cpp summaries use a 60 s CKMS window; the error column of
``summary_quantiles`` is accepted and not needed). Labels for per-model families are built by
:func:`model_labels`: ``model``, ``version``, ``gpu_uuid`` for models whose instances run on a
known GPU, and ``_<key>`` for each ``metric_tags`` entry of the config.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from trident.options import ServerOptions

DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
DEFAULT_FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
SUMMARY_WINDOW = 4096
#: (summary family suffix, help text) in the order LatencyObserver.request takes them
SUMMARY_KINDS = (
    ("request", "Summary of inference request duration in microseconds (includes cached requests)"),
    ("queue", "Summary of inference queuing duration in microseconds (includes cached requests)"),
    ("compute_input", "Summary of compute input duration in microseconds (does not include cached requests)"),
    ("compute_infer", "Summary of compute inference duration in microseconds (does not include cached requests)"),
    ("compute_output", "Summary of inference compute output duration in microseconds (does not include cached "
                       "requests)"),
)


def _bool(key: str, value: str) -> bool:
    if value.lower() in ("true", "1", "on", "yes"):
        return True
    if value.lower() in ("false", "0", "off", "no"):
        return False
    raise ValueError(f"--metrics-config {key} expects true or false, got '{value}'")


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    out = []
    for part in value.split(","):
        q, sep, err = part.partition(":")
        try:
            qf, ef = float(q), float(err) if sep else 0.0
        except ValueError:
            raise ValueError(f"--metrics-config summary_quantiles expects q:error[,q:error...], got '{value}'") from None
        if not 0.0 <= qf <= 1.0:
            raise ValueError(f"summary quantile {q} is outside [0, 1]")
        out.append((qf, ef))
    return tuple(out)


@dataclass(frozen=True)
class MetricsConfig:
    counter_latencies: bool = True
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    histogram_latencies: bool = False

    @property
    def observes(self) -> bool:
        return self.summary_latencies or self.histogram_latencies


def parse_metrics_config(entries: list[str]) -> MetricsConfig:
    """``--metrics-config`` values as a MetricsConfig; raises ValueError for a bad entry."""
    values: dict[str, Any] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise ValueError(f"--metrics-config expects <key>=<value>, got '{entry}'")
        if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
            values[key] = _bool(key, value)
        elif key == "summary_quantiles":
            values[key] = _quantiles(value)
        else:
            raise ValueError(f"unknown --metrics-config setting '{key}'")
    return MetricsConfig(**values)


def first_response_buckets(config: Any) -> tuple[float, ...]:
    """Histogram buckets of ``nv_inference_first_response_histogram_ms``: the model config's
    ``model_metrics`` override for that family, else Triton's defaults."""
    mm = getattr(config, "model_metrics", None)
    for control in getattr(mm, "metric_control", None) or []:
        ident = control.metric_identifier
        if ident is not None and ident.family == "nv_inference_first_response_histogram_ms":
            options = control.histogram_options
            if options is not None and options.buckets:
                return tuple(sorted(float(b) for b in options.buckets))
    return DEFAULT_FIRST_RESPONSE_BUCKETS_MS


@dataclass
class LatencyObserver:
    """Sliding windows for the summaries and bucket counts for the first-response histogram."""

    config: MetricsConfig
    buckets: tuple[float, ...] = DEFAULT_FIRST_RESPONSE_BUCKETS_MS
    windows: list[deque[float]] = field(default_factory=list)
    sums: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    bucket_counts: list[int] = field(default_factory=list)
    first_sum_ms: float = 0.0
    first_count: int = 0

    def __post_init__(self) -> None:
        n = len(SUMMARY_KINDS)
        self.windows = [deque(maxlen=SUMMARY_WINDOW) for _ in range(n)]
        self.sums = [0.0] * n
        self.counts = [0] * n
        self.bucket_counts = [0] * len(self.buckets)

    def request(self, *durations_ns: int) -> None:
        """One successful request: request, queue, compute input/infer/output durations (ns)."""
        if not self.config.summary_latencies:
            return
        for i, ns in enumerate(durations_ns):
            us = ns / 1000
            self.windows[i].append(us)
            self.sums[i] += us
            self.counts[i] += 1

    def first_response(self, ns: int) -> None:
        """The time from arrival to the first response of a request."""
        if not self.config.histogram_latencies:
            return
        ms = ns / 1e6
        self.first_sum_ms += ms
        self.first_count += 1
        for i, bound in enumerate(self.buckets):
            if ms <= bound:
                self.bucket_counts[i] += 1
                break

    def quantiles(self, kind: int) -> list[tuple[float, float]]:
        """(quantile, value in µs) over the window of summary ``kind`` (NaN when empty)."""
        window = self.windows[kind]
        qs = [q for q, _ in self.config.summary_quantiles]
        if not window:
            return [(q, float("nan")) for q in qs]
        values = np.quantile(np.fromiter(window, dtype=np.float64, count=len(window)), qs)
        return list(zip(qs, (float(v) for v in values), strict=True))

    def histogram(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) buckets, ``+Inf`` last."""
        out, acc = [], 0
        for bound, n in zip(self.buckets, self.bucket_counts, strict=True):
            acc += n
            out.append((_le(bound), float(acc)))
        out.append(("+Inf", float(self.first_count)))
        return out


def _le(bound: float) -> str:
    return floatToGoString(bound)


def observer_for(options: ServerOptions | None, config: Any) -> LatencyObserver | None:
    """The observer a new model version needs under the server's ``--metrics-config``
    (``options``; None: no server), or None."""
    entries = options.metrics_config if options is not None else None
    if not entries:
        return None
    mc = parse_metrics_config(list(entries))
    if not mc.observes:
        return None
    return LatencyObserver(mc, first_response_buckets(config))


def model_gpu_uuid(kinds_and_devices: list[tuple[str, int]], uuid_by_index: dict[int, str]) -> str:
    """The ``gpu_uuid`` label of a model's per-model metrics ("" for none).

    Instances of KIND_GPU on known devices name their GPU; instances on several GPUs give the
    sorted, comma-joined uuids (trident's statistics are per model version, not per device).
    """
    uuids = sorted({uuid_by_index[d] for kind, d in kinds_and_devices if kind == "KIND_GPU" and d in uuid_by_index})
    return ",".join(uuids)


def model_labels(name: str, version: str, metric_tags: dict[str, str] | None = None,
                 gpu_uuid: str = "") -> dict[str, str]:
    """Labels of a model version's series: model, version, gpu_uuid (when set), ``_<tag>``."""
    labels = {"model": name, "version": version}
    if gpu_uuid:
        labels["gpu_uuid"] = gpu_uuid
    for key, value in sorted((metric_tags or {}).items()):
        labels[f"_{key}"] = str(value)
    return labels
