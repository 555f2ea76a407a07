"""Prometheus metrics on the metrics port, with Triton's ``nv_*`` family names and labels.

The per-model counters are read from each serving version's statistics snapshot at scrape
time (one source of truth with the statistics extension). GET only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from trident.backends.metrics import custom_metrics_for
from trident.host_metrics import CpuMetrics, GpuMetrics

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.metrics")


class ModelStatsCollector(Collector):
    """Per-model families built from statistics snapshots."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        labels = ["model", "version"]
        success = CounterMetricFamily("nv_inference_request_success",
                                      "Number of successful inference requests, all batch sizes", labels=labels)
        failure = CounterMetricFamily("nv_inference_request_failure",
                                      "Number of failed inference requests, all batch sizes",
                                      labels=[*labels, "reason"])
        count = CounterMetricFamily("nv_inference_count",
                                    "Number of inferences performed (does not include cached requests)", labels=labels)
        execs = CounterMetricFamily("nv_inference_exec_count",
                                    "Number of model executions performed (does not include cached requests)",
                                    labels=labels)
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.",
                                    labels=labels)
        durations = {
            "request": CounterMetricFamily("nv_inference_request_duration_us",
                                           "Cumulative inference request duration in microseconds (includes cached requests)",
                                           labels=labels),
            "queue": CounterMetricFamily("nv_inference_queue_duration_us",
                                         "Cumulative inference queuing duration in microseconds (includes cached requests)",
                                         labels=labels),
            "compute_input": CounterMetricFamily("nv_inference_compute_input_duration_us",
                                                 "Cumulative compute input duration in microseconds (does not include cached requests)",
                                                 labels=labels),
            "compute_infer": CounterMetricFamily("nv_inference_compute_infer_duration_us",
                                                 "Cumulative compute inference duration in microseconds (does not include cached requests)",
                                                 labels=labels),
            "compute_output": CounterMetricFamily("nv_inference_compute_output_duration_us",
                                                  "Cumulative inference compute output duration in microseconds (does not include cached requests)",
                                                  labels=labels),
        }
        for mv in self.server.repository.serving():
            s = mv.stats.snapshot()
            lv = [s.name, s.version]
            success.add_metric(lv, s.success.count)
            backend_failures = s.fail.count - s.cancelled
            failure.add_metric([*lv, "REJECTED"], 0)
            failure.add_metric([*lv, "CANCELED"], s.cancelled)
            failure.add_metric([*lv, "BACKEND"], backend_failures)
            failure.add_metric([*lv, "OTHER"], 0)
            count.add_metric(lv, s.inference_count)
            execs.add_metric(lv, s.execution_count)
            pending.add_metric(lv, mv.queued())
            durations["request"].add_metric(lv, (s.success.ns + s.fail.ns) // 1000)
            durations["queue"].add_metric(lv, s.queue.ns // 1000)
            durations["compute_input"].add_metric(lv, s.compute_input.ns // 1000)
            durations["compute_infer"].add_metric(lv, s.compute_infer.ns // 1000)
            durations["compute_output"].add_metric(lv, s.compute_output.ns // 1000)
        yield from (success, failure, count, execs, pending, *durations.values())


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        '{}="{}"'.format(k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"'))
        for k, v in sorted(labels.items())
    )
    return "{" + inner + "}"


def exposition(registry: CollectorRegistry) -> bytes:
    """Prometheus text format with Triton's spelling: counters keep their bare names.

    (prometheus-client's ``generate_latest`` renames counters to ``<name>_total``; Triton's
    dashboards scrape ``nv_inference_request_success``, not ``..._total``.)
    """
    out: list[str] = []
    for metric in registry.collect():
        if metric.type != "counter":
            out.append(generate_latest(_One(metric)).decode())
            continue
        out.append(f"# HELP {metric.name} {metric.documentation}\n# TYPE {metric.name} counter\n")
        for sample in metric.samples:
            if sample.name.endswith("_created"):
                continue
            out.append(f"{metric.name}{_labels(sample.labels)} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()


class _One(Collector):
    def __init__(self, metric: Any) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Any]:
        yield self.metric


def make_registry(server: Server, *host_collectors: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelStatsCollector(server))
    for collector in host_collectors:
        registry.register(collector)
    return registry


def host_collectors(server: Server) -> list[Any]:
    """CPU and GPU gauge collectors allowed by the options (GPU only where NVML finds one)."""
    collectors: list[Any] = []
    opts = server.options
    if opts.allow_cpu_metrics:
        collectors.append(CpuMetrics())
    if opts.allow_gpu_metrics:
        gpu = GpuMetrics()
        if gpu.available:
            collectors.append(gpu)
            log.info("GPU metrics enabled for %d GPU(s)", len(gpu.gpus))
        else:
            log.info("GPU metrics disabled: %s", gpu.reason)
    return collectors


async def poll_host_metrics(collectors: list[Any], interval_s: float) -> None:
    """Refresh the host gauges every ``interval_s`` (reads /proc and NVML in a thread)."""
    while True:
        for c in collectors:
            await trio.to_thread.run_sync(c.poll)
        await trio.sleep(interval_s)


def make_metrics_app(server: Server, *collectors: Collector) -> Any:
    """The ASGI app of the metrics port."""
    registry = make_registry(server, *collectors)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            status, body = 404, b"Not Found"
        elif scope["method"] != "GET":
            status, body = 405, b"Method Not Allowed"
        else:
            # custom metric families of models and backends (trident.backends.metrics)
            status, body = 200, exposition(registry) + custom_metrics_for(server).render()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


async def serve_metrics(server: Server, *, host: str, port: int,
                        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve /metrics until cancelled; reports the bound port through ``task_status``."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None

    class _Status:
        def started(self, value: Any = None) -> None:
            bound = value[0].rsplit(":", 1)[-1] if value else str(port)
            task_status.started(int(bound))

    collectors = host_collectors(server)
    async with trio.open_nursery() as nursery:
        if collectors:
            nursery.start_soon(poll_host_metrics, collectors, max(server.options.metrics_interval_ms, 1) / 1000)
        await serve(make_metrics_app(server, *collectors), config, task_status=_Status())  # type: ignore[arg-type]
