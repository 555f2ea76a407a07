"""Custom metrics that backends and models define (Triton's ``TRITONSERVER_MetricFamily`` API).

A :class:`CustomMetrics` registry belongs to one server (:func:`custom_metrics_for`); the
metrics port appends :meth:`CustomMetrics.render` to its Prometheus text, with the exact names
the model chose (no ``_total`` suffix), as Triton prints them.

Families and metrics are reference counted like Triton's: every ``MetricFamily`` /
``Metric`` object a model creates holds one reference, the same name (or the same label set)
shares one series, and the series disappears from ``/metrics`` when the last holder releases
it (a Python model's objects when they are garbage collected, an isolated model process's when
the process exits). Thread-safe: models update metrics from any thread.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

COUNTER = 0
GAUGE = 1
HISTOGRAM = 2
_KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}


class MetricError(ValueError):
    """A metric was created or updated against its kind's rules."""


def _check_name(name: str) -> None:
    ok = bool(name) and (name[0].isalpha() or name[0] in "_:")
    ok = ok and all(c.isalnum() or c in "_:" for c in name)
    if not ok:
        raise MetricError(f"invalid metric name '{name}': use letters, digits, '_' and ':' (not first digit)")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class Series:
    """One labelled metric of a family (a counter, gauge or histogram value)."""

    def __init__(self, family: Family, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.family = family
        self.labels = labels
        self.refs = 0
        self.value = 0.0
        self.buckets = buckets or []
        self.bucket_counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0

    def increment(self, value: float) -> None:
        """Counter: add ``value`` >= 0; gauge: add any ``value``. Raises MetricError otherwise."""
        kind = self.family.kind
        if kind == HISTOGRAM:
            raise MetricError("increment() is not supported for a histogram metric; use observe()")
        if kind == COUNTER and value < 0:
            raise MetricError("a counter metric cannot be incremented by a negative value")
        with self.family.registry.lock:
            self.value += value

    def set(self, value: float) -> None:
        """Gauge only; raises MetricError for counters and histograms."""
        if self.family.kind != GAUGE:
            raise MetricError(f"set() is only supported for a gauge metric, not a {_KIND_NAMES[self.family.kind]}")
        with self.family.registry.lock:
            self.value = float(value)

    def observe(self, value: float) -> None:
        """Histogram only; raises MetricError for counters and gauges."""
        if self.family.kind != HISTOGRAM:
            raise MetricError(
                f"observe() is only supported for a histogram metric, not a {_KIND_NAMES[self.family.kind]}"
            )
        with self.family.registry.lock:
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    self.bucket_counts[i] += 1
            self.count += 1
            self.sum += value

    def get(self) -> float:
        """Counter/gauge value; raises MetricError for histograms (as Triton does)."""
        if self.family.kind == HISTOGRAM:
            raise MetricError("value() is not supported for a histogram metric")
        with self.family.registry.lock:
            return self.value


class Family:
    """A named metric family (one HELP/TYPE block on /metrics)."""

    def __init__(self, registry: CustomMetrics, name: str, description: str, kind: int) -> None:
        self.registry = registry
        self.name = name
        self.description = description
        self.kind = kind
        self.refs = 0
        self.series: dict[tuple[tuple[str, str], ...], Series] = {}

    def acquire_series(self, labels: dict[str, str] | None, buckets: list[float] | None = None) -> Series:
        """The series for ``labels`` (created on first use); release it with :meth:`release_series`.

        Raises MetricError for non-str labels, buckets on a non-histogram, a histogram without
        buckets, or buckets that are not increasing.
        """
        labels = dict(labels or {})
        for k, v in labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise MetricError("metric labels must be a dict of str to str")
            _check_name(k)
        if self.kind == HISTOGRAM:
            if buckets is None:
                raise MetricError("a histogram metric needs buckets")
            bounds = [float(b) for b in buckets]
            if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:], strict=False)):
                raise MetricError("histogram buckets must be strictly increasing")
        elif buckets is not None:
            raise MetricError(f"buckets are only allowed for a histogram metric, not a {_KIND_NAMES[self.kind]}")
        else:
            bounds = []
        key = tuple(sorted(labels.items()))
        with self.registry.lock:
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = Series(self, labels, bounds)
            elif self.kind == HISTOGRAM and series.buckets != bounds:
                raise MetricError(f"metric of '{self.name}' with labels {labels} already exists with other buckets")
            series.refs += 1
            return series

    def release_series(self, series: Series) -> None:
        with self.registry.lock:
            series.refs -= 1
            if series.refs <= 0:
                self.series.pop(tuple(sorted(series.labels.items())), None)


class CustomMetrics:
    """The custom metric families of one server."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.families: dict[str, Family] = {}

    def acquire_family(self, name: str, description: str, kind: int) -> Family:
        """The family ``name`` (created on first use); release it with :meth:`release_family`.

        Raises MetricError for a bad name or kind, or a name already used with another kind.
        """
        if kind not in _KIND_NAMES:
            raise MetricError(f"unknown metric kind {kind}: use COUNTER, GAUGE or HISTOGRAM")
        _check_name(name)
        with self.lock:
            family = self.families.get(name)
            if family is None:
                family = self.families[name] = Family(self, name, description, kind)
            elif family.kind != kind:
                raise MetricError(
                    f"metric family '{name}' already exists as a {_KIND_NAMES[family.kind]}, "
                    f"not a {_KIND_NAMES[kind]}"
                )
            family.refs += 1
            return family

    def release_family(self, family: Family) -> None:
        with self.lock:
            family.refs -= 1
            if family.refs <= 0 and self.families.get(family.name) is family:
                del self.families[family.name]

    def render(self) -> bytes:
        """Prometheus text exposition of every family that has at least one series."""
        lines: list[str] = []
        with self.lock:
            for family in sorted(self.families.values(), key=lambda f: f.name):
                if not family.series:
                    continue
                name = family.name
                lines.append(f"# HELP {name} {family.description.replace(chr(10), ' ')}")
                lines.append(f"# TYPE {name} {_KIND_NAMES[family.kind]}")
                for series in family.series.values():
                    base = [f'{k}="{_escape(v)}"' for k, v in series.labels.items()]
                    labels = "{" + ",".join(base) + "}" if base else ""
                    if family.kind != HISTOGRAM:
                        lines.append(f"{name}{labels} {_number(series.value)}")
                        continue
                    for bound, count in zip(series.buckets, series.bucket_counts, strict=True):
                        le = ",".join([*base, f'le="{_number(bound)}"'])
                        lines.append(f"{name}_bucket{{{le}}} {count}")
                    le = ",".join([*base, 'le="+Inf"'])
                    lines.append(f"{name}_bucket{{{le}}} {series.count}")
                    lines.append(f"{name}_sum{labels} {_number(series.sum)}")
                    lines.append(f"{name}_count{labels} {series.count}")
        return ("\n".join(lines) + "\n").encode() if lines else b""


_by_server: weakref.WeakKeyDictionary[Any, CustomMetrics] = weakref.WeakKeyDictionary()
_default = CustomMetrics()
_lock = threading.Lock()


def custom_metrics_for(server: object | None) -> CustomMetrics:
    """The registry of ``server`` (created on first use); a process-wide one for ``None``."""
    if server is None:
        return _default
    with _lock:
        registry = _by_server.get(server)
        if registry is None:
            registry = _by_server[server] = CustomMetrics()
        return registry
