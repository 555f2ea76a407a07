"""Prometheus metrics on the metrics port, with Triton's ``nv_*`` family names and labels.

The per-model counters are read from each serving version's statistics snapshot at scrape
time (one source of truth with the statistics extension). GET only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from trident.backends.metrics import custom_metrics_for
from trident.http.app import answer_lifespan
from trident.observability.host_metrics import CpuMetrics, GpuMetrics
from trident.observability.model_metrics import (
    SUMMARY_KINDS,
    model_gpu_uuid,
    model_labels,
    parse_metrics_config,
)
from trident.observability.stats import FAILURE_REASONS
from trident.sockets_io import BACKLOG

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.metrics")


_DURATIONS = (
    ("request", "Cumulative inference request duration in microseconds (includes cached requests)"),
    ("queue", "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    ("compute_input", "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("compute_infer", "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("compute_output", "Cumulative inference compute output duration in microseconds (does not include cached "
                       "requests)"),
)
_CACHE = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insertion) duration per model, in microseconds"),
)


def _family(name: str, doc: str, kind: str) -> Metric:
    return Metric(name, doc, kind)


class OnDemandCollector(Collector):
    """trident's own families for models loaded on demand (``--model-load-on-demand``;
    :mod:`trident.server.on_demand`): loads, failed loads, evictions, and what is loaded now."""

    FAMILIES = (
        ("loads", "trident_model_on_demand_load_count", "Models loaded on a request for them", "counter"),
        ("load_failures", "trident_model_on_demand_load_failure_count",
         "Loads on demand that failed (their requests got UNAVAILABLE with the reason)", "counter"),
        ("evictions", "trident_model_eviction_count",
         "Models loaded on demand unloaded, least recently used first, to stay within the budget", "counter"),
        ("loaded", "trident_model_on_demand_loaded", "Models loaded on demand and serving now", "gauge"),
        ("bytes", "trident_model_on_demand_resident_bytes",
         "Resident memory the loads of the models loaded on demand now added (approximate: RSS before and "
         "after each load)", "gauge"),
    )

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        counts = self.server.repository.on_demand_counts()
        if not counts:
            return
        for key, name, doc, kind in self.FAMILIES:
            family = _family(name, doc, kind)
            family.add_sample(name, {}, counts[key])
            yield family


class ModelStatsCollector(Collector):
    """Per-model families built from statistics snapshots (labels from :func:`model_labels`)."""

    def __init__(self, server: Server, uuid_by_index: dict[int, str] | None = None) -> None:
        self.server = server
        self.uuid_by_index = uuid_by_index or {}
        self.config = parse_metrics_config(list(server.options.metrics_config))

    def labels_of(self, mv: Any) -> dict[str, str]:
        """model, version, gpu_uuid (KIND_GPU instances on a known GPU) and ``_<metric_tag>``."""
        specs = [(s.kind, s.device) for s in getattr(mv, "_specs", {}).values()]
        return model_labels(mv.name, str(mv.version), dict(mv.config.metric_tags or {}),
                            model_gpu_uuid(specs, self.uuid_by_index))

    def collect(self) -> Iterator[Any]:
        success = _family("nv_inference_request_success",
                          "Number of successful inference requests, all batch sizes", "counter")
        failure = _family("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
                          "counter")
        count = _family("nv_inference_count", "Number of inferences performed (does not include cached requests)",
                        "counter")
        execs = _family("nv_inference_exec_count",
                        "Number of model executions performed (does not include cached requests)", "counter")
        pending = _family("nv_inference_pending_request_count",
                          "Instantaneous number of pending requests awaiting execution per-model.", "gauge")
        load = _family("nv_model_load_duration_secs", "Model load time in seconds", "gauge")
        durations = [_family(f"nv_inference_{k}_duration_us", doc, "counter") for k, doc in _DURATIONS]
        summaries = [_family(f"nv_inference_{k}_summary_us", doc, "summary") for k, doc in SUMMARY_KINDS]
        first = _family("nv_inference_first_response_histogram_ms",
                        "Duration from request to first response in milliseconds", "histogram")
        cache = [_family(name, doc, "counter") for name, doc in _CACHE]
        shed = _family("trident_inference_shed_count",
                       "Requests refused at admission because their estimated queue delay was above the "
                       "model's queue-delay target (load shedding)", "counter")
        for mv in self.server.repository.serving():
            s = mv.stats.snapshot()
            lv = self.labels_of(mv)
            success.add_sample(success.name, lv, s.success.count)
            for reason in FAILURE_REASONS:
                failure.add_sample(failure.name, {**lv, "reason": reason}, s.failure_count(reason))
            count.add_sample(count.name, lv, s.inference_count)
            execs.add_sample(execs.name, lv, s.execution_count)
            pending.add_sample(pending.name, lv, mv.queued())
            shedder = getattr(mv, "shedder", None)
            if shedder is not None:
                shed.add_sample(shed.name, lv, shedder.refused)
            load.add_sample(load.name, lv, float(getattr(mv, "load_duration_s", 0.0)))
            if self.config.counter_latencies:
                values = ((s.success.ns + s.fail.ns), s.queue.ns, s.compute_input.ns, s.compute_infer.ns,
                          s.compute_output.ns)
                for fam, ns in zip(durations, values, strict=True):
                    fam.add_sample(fam.name, lv, ns // 1000)
            observer = getattr(mv, "latency", None)
            if observer is not None and self.config.summary_latencies:
                for i, fam in enumerate(summaries):
                    for q, v in observer.quantiles(i):
                        fam.add_sample(fam.name, {**lv, "quantile": floatToGoString(q)}, v)
                    fam.add_sample(fam.name + "_count", lv, observer.counts[i])
                    fam.add_sample(fam.name + "_sum", lv, observer.sums[i])
            if observer is not None and self.config.histogram_latencies:
                for le, n in observer.histogram():
                    first.add_sample(first.name + "_bucket", {**lv, "le": le}, n)
                first.add_sample(first.name + "_count", lv, observer.first_count)
                first.add_sample(first.name + "_sum", lv, observer.first_sum_ms)
            if mv.config.response_cache is not None and mv.config.response_cache.enable:
                cached = (s.cache_hit.count, s.cache_miss.count, s.cache_hit.ns // 1000, s.cache_miss.ns // 1000)
                for fam, v in zip(cache, cached, strict=True):
                    fam.add_sample(fam.name, lv, v)
        families = [success, failure, count, execs, pending, load, shed]
        if self.config.counter_latencies:
            families += durations
        if self.config.summary_latencies:
            families += summaries
        if self.config.histogram_latencies:
            families.append(first)
        yield from (f for f in [*families, *cache] if f.samples or f in (success, failure, count, execs))


class SendBacklogCollector(Collector):
    """trident's own families for peers that do not read (:data:`trident.sockets_io.BACKLOG`):
    the response bytes waiting for a socket or a flow-control window, and the connections
    closed and gRPC streams reset by the send timeout (``--http-send-timeout-secs``,
    ``--grpc-send-timeout-secs``)."""

    def collect(self) -> Iterator[Any]:
        waiting = _family("trident_send_pending_bytes",
                          "Response bytes waiting for a client to read them (socket or flow-control window), "
                          "all connections", "gauge")
        waiting.add_sample(waiting.name, {}, BACKLOG.waiting)
        closed = _family("trident_send_timeout_count",
                         "Connections closed (and gRPC streams reset) because the client took no response bytes "
                         "within the send timeout", "counter")
        for protocol, what in (("http", "connection"), ("grpc", "connection"), ("grpc", "stream")):
            closed.add_sample(closed.name, {"protocol": protocol, "closed": what},
                              BACKLOG.timed_out.get((protocol, what), 0))
        yield waiting
        yield closed


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
    uuids: dict[int, str] = {}
    for collector in host_collectors:
        if isinstance(collector, GpuMetrics):
            uuids = {i: g.uuid for i, g in enumerate(collector.gpus)}
    registry.register(ModelStatsCollector(server, uuids))
    registry.register(OnDemandCollector(server))
    registry.register(SendBacklogCollector())
    for collector in host_collectors:
        registry.register(collector)
    return registry


def host_collectors(options: Any) -> list[Any]:
    """CPU and GPU gauge collectors allowed by the server options (GPU only where NVML finds one)."""
    collectors: list[Any] = []
    opts = options
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


def worker_exposition(server: Server) -> bytes:
    """The model and custom families of ``server`` alone, without host gauges: what a worker of
    ``--workers`` gives its supervisor to merge (trident.cluster.merge)."""
    return exposition(make_registry(server)) + custom_metrics_for(server).render()


def host_exposition(collectors: list[Any]) -> bytes:
    """The host gauges of ``collectors`` (a ``--workers`` supervisor's own)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return exposition(registry)


def make_exposition_app(render: Callable[[], Awaitable[bytes]]) -> Any:
    """The ASGI app of the metrics port: ``GET /metrics`` answers ``await render()``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            status, body = 404, b"Not Found"
        elif scope["method"] != "GET":
            status, body = 405, b"Method Not Allowed"
        else:
            status, body = 200, await render()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def make_metrics_app(server: Server, *collectors: Collector) -> Any:
    """The ASGI app of the metrics port of ``server``."""
    registry = make_registry(server, *collectors)

    async def render() -> bytes:
        # custom metric families of models and backends (trident.backends.metrics)
        return exposition(registry) + custom_metrics_for(server).render()

    return make_exposition_app(render)


async def serve_exposition(app: Any, collectors: list[Any], interval_ms: float, *, host: str, port: int,
                           task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the metrics ``app`` until cancelled, refreshing the host ``collectors`` every
    ``interval_ms``; reports the bound port through ``task_status``. Raises OSError when the
    address cannot be bound."""
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

    async with trio.open_nursery() as nursery:
        if collectors:
            nursery.start_soon(poll_host_metrics, collectors, max(interval_ms, 1) / 1000)
        await serve(app, config, task_status=_Status())  # type: ignore[arg-type]


async def serve_metrics(server: Server, *, host: str, port: int,
                        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve /metrics until cancelled; reports the bound port through ``task_status``."""
    collectors = host_collectors(server.options)
    await serve_exposition(make_metrics_app(server, *collectors), collectors, server.options.metrics_interval_ms,
                           host=host, port=port, task_status=task_status)
