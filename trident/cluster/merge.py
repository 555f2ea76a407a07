"""One server's view from N workers' (pure): statistics summed, one Prometheus exposition.

Statistics (the statistics extension): every count and duration of a model version is summed
over the workers, ``last_inference`` is the latest, batch statistics are summed per batch size.

Metrics (the metrics port), per family type, samples matched by name and labels:

* counters and histograms (every bucket, ``_sum``, ``_count``): summed;
* summaries: ``_sum`` and ``_count`` summed; a quantile is the largest of the workers' (an
  upper bound: quantiles of separate streams do not combine, and a p99 is never understated);
* trident's gauges: ``nv_inference_pending_request_count`` and ``trident_send_pending_bytes``
  summed (requests, response bytes waiting anywhere),
  ``nv_model_load_duration_secs`` the largest (the model was ready everywhere after that);
* any other gauge (a model's own, through ``pb_utils.MetricFamily``): one series per worker,
  labelled ``worker="<index>"``, since a gauge's meaning (a level, a last value) decides how it
  combines and only its author knows it (``sum by (...)`` or ``max by (...)`` in PromQL).

Host gauges (``nv_cpu_*``, ``nv_gpu_*``) are the supervisor's own, not merged.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from trident.types import BatchStats, Duration, ModelStatistics

# ---- statistics ------------------------------------------------------------------------------

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
              "cache_miss")


def stats_to_wire(s: ModelStatistics) -> dict[str, Any]:
    """A snapshot as JSON-able values (the control channel's form)."""
    return {
        "name": s.name, "version": s.version, "last_inference": s.last_inference,
        "inference_count": s.inference_count, "execution_count": s.execution_count, "cancelled": s.cancelled,
        **{k: [getattr(s, k).count, getattr(s, k).ns] for k in _DURATIONS},
        "batch_stats": [[b.batch_size, [b.compute_input.count, b.compute_input.ns],
                         [b.compute_infer.count, b.compute_infer.ns], [b.compute_output.count, b.compute_output.ns]]
                        for b in s.batch_stats],
        "failures": [list(f) for f in s.failures],
    }


def stats_from_wire(d: dict[str, Any]) -> ModelStatistics:
    """The inverse of :func:`stats_to_wire`. Raises KeyError/TypeError/ValueError for a bad value."""
    return ModelStatistics(
        name=str(d["name"]), version=str(d["version"]), last_inference=int(d["last_inference"]),
        inference_count=int(d["inference_count"]), execution_count=int(d["execution_count"]),
        cancelled=int(d["cancelled"]),
        **{k: Duration(int(d[k][0]), int(d[k][1])) for k in _DURATIONS},
        batch_stats=tuple(BatchStats(int(b[0]), Duration(*map(int, b[1])), Duration(*map(int, b[2])),
                                     Duration(*map(int, b[3]))) for b in d["batch_stats"]),
        failures=tuple((str(r), int(n)) for r, n in d["failures"]),
    )


def _add(a: Duration, b: Duration) -> Duration:
    return Duration(a.count + b.count, a.ns + b.ns)


def _merge_two(a: ModelStatistics, b: ModelStatistics) -> ModelStatistics:
    batches: dict[int, BatchStats] = {x.batch_size: x for x in a.batch_stats}
    for x in b.batch_stats:
        y = batches.get(x.batch_size)
        batches[x.batch_size] = x if y is None else BatchStats(
            x.batch_size, _add(x.compute_input, y.compute_input), _add(x.compute_infer, y.compute_infer),
            _add(x.compute_output, y.compute_output))
    failures = dict(a.failures)
    for reason, n in b.failures:
        failures[reason] = failures.get(reason, 0) + n
    return ModelStatistics(
        name=a.name, version=a.version, last_inference=max(a.last_inference, b.last_inference),
        inference_count=a.inference_count + b.inference_count, execution_count=a.execution_count + b.execution_count,
        cancelled=a.cancelled + b.cancelled,
        **{k: _add(getattr(a, k), getattr(b, k)) for k in _DURATIONS},
        batch_stats=tuple(batches[size] for size in sorted(batches)),
        failures=tuple(failures.items()),
    )


def merge_statistics(per_worker: list[list[ModelStatistics]]) -> list[ModelStatistics]:
    """The workers' snapshots summed per (model, version), in the order the first worker that
    has each listed them (every worker lists the same versions in the same order)."""
    merged: dict[tuple[str, str], ModelStatistics] = {}
    for snapshots in per_worker:
        for s in snapshots:
            key = (s.name, s.version)
            merged[key] = s if key not in merged else _merge_two(merged[key], s)
    return list(merged.values())


# ---- metrics ---------------------------------------------------------------------------------

SUMMED_GAUGES = frozenset({"nv_inference_pending_request_count", "trident_send_pending_bytes"})
LARGEST_GAUGES = frozenset({"nv_model_load_duration_secs"})
WORKER_LABEL = "worker"


def _label_text(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join('{}="{}"'.format(k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"'))
                     for k, v in labels.items())
    return "{" + inner + "}"


class _Family:
    __slots__ = ("name", "doc", "kind", "samples")

    def __init__(self, name: str, doc: str, kind: str) -> None:
        self.name = name
        self.doc = doc
        self.kind = kind
        #: (sample name, sorted label items) -> [labels, value]
        self.samples: dict[tuple[str, tuple[tuple[str, str], ...]], list[Any]] = {}


def merge_expositions(texts: list[str]) -> str:
    """One Prometheus text exposition from each worker's (index = position in ``texts``),
    merged by the rules of the module docstring; families and samples keep the order in which
    they first appear. Raises ValueError for text that is not an exposition."""
    families: dict[str, _Family] = {}
    for index, text in enumerate(texts):
        # the parser names a counter ``x`` as ``x_total`` (OpenMetrics); Triton's are bare names
        declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
        for parsed in text_string_to_metric_families(text):
            name = parsed.name if parsed.name in declared or parsed.type != "counter" else parsed.name + "_total"
            family = families.get(name)
            if family is None:
                family = families[name] = _Family(name, parsed.documentation, parsed.type)
            per_worker = family.kind == "gauge" and name not in SUMMED_GAUGES | LARGEST_GAUGES
            for sample in parsed.samples:
                if sample.name.endswith("_created"):
                    continue
                sample_name = name if parsed.type == "counter" else sample.name
                labels = dict(sample.labels)
                if per_worker:
                    labels[WORKER_LABEL] = str(index)
                key = (sample_name, tuple(sorted(labels.items())))
                slot = family.samples.get(key)
                if slot is None:
                    family.samples[key] = [labels, float(sample.value)]
                elif (family.kind == "summary" and "quantile" in labels) or name in LARGEST_GAUGES:
                    slot[1] = max(slot[1], float(sample.value))
                else:
                    slot[1] += float(sample.value)
    out: list[str] = []
    for family in families.values():
        kind = family.kind if family.kind in ("counter", "gauge", "histogram", "summary") else "untyped"
        doc = family.doc.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {family.name} {doc}\n# TYPE {family.name} {kind}\n")
        for (sample_name, _), (labels, value) in family.samples.items():
            out.append(f"{sample_name}{_label_text(labels)} {floatToGoString(value)}\n")
    return "".join(out)
