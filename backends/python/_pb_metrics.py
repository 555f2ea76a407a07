"""``pb_utils.MetricFamily`` / ``pb_utils.Metric``: custom metrics on the server's /metrics."""

from __future__ import annotations

import weakref
from typing import Any

from trident.backends.python._pb_base import TritonModelException, _current_runtime


def _metrics_registry() -> Any:
    runtime = _current_runtime()
    if runtime is not None:
        return runtime.metrics()
    from trident.backends.metrics import custom_metrics_for

    return custom_metrics_for(None)


class MetricFamily:
    """A custom metric family on the server's /metrics: ``MetricFamily(name, description, kind)``.

    Families of the same name share one series set; the family leaves /metrics when its last
    ``MetricFamily`` object is garbage collected.
    """

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        """Raises TritonModelException for a bad name or kind, or a name taken by another kind."""
        registry = _metrics_registry()
        try:
            self._family = registry.acquire_family(str(name), str(description), int(kind))
        except ValueError as e:
            raise TritonModelException(str(e)) from None
        self._name = name
        self._kind = int(kind)
        self._finalizer = weakref.finalize(self, registry.release_family, self._family)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        """A metric of this family with ``labels`` (histograms need ``buckets``).

        Raises TritonModelException for bad labels or buckets.
        """
        return Metric(self, labels, buckets)


class Metric:
    """One labelled metric; ``increment`` (counter, gauge), ``set`` (gauge), ``observe``
    (histogram), ``value`` (counter, gauge). Each raises TritonModelException when its kind
    does not allow it."""

    def __init__(self, family: MetricFamily, labels: dict[str, str] | None = None,
                 buckets: list[float] | None = None) -> None:
        try:
            self._series = family._family.acquire_series(labels, buckets)
        except ValueError as e:
            raise TritonModelException(str(e)) from None
        self._family = family  # keeps the family registered while the metric lives
        self._finalizer = weakref.finalize(self, family._family.release_series, self._series)

    def _call(self, op: str, *args: float) -> Any:
        try:
            return getattr(self._series, op)(*args)
        except ValueError as e:
            raise TritonModelException(str(e)) from None

    def increment(self, value: float) -> None:
        self._call("increment", float(value))

    def set(self, value: float) -> None:
        self._call("set", float(value))

    def observe(self, value: float) -> None:
        self._call("observe", float(value))

    def value(self) -> float:
        return float(self._call("get"))
