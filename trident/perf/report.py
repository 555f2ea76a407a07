"""perf_analyzer's text report and CSV layout, from measured :class:`~trident.perf.measure.Summary`
values. Pure: strings in, strings out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from trident.perf.inputs import ModelInfo
from trident.perf.measure import Summary
from trident.perf.options import PerfOptions

__all__ = ["Result", "settings_text", "level_text", "closing_text", "csv_text", "json_text", "CSV_COLUMNS",
           "METRIC_COLUMNS", "pass_line"]

CSV_COLUMNS = ("Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
               "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
               "p50 latency", "p90 latency", "p95 latency", "p99 latency", "Avg latency", "request/response",
               "response wait")
METRIC_COLUMNS = ("Avg GPU Utilization", "Avg GPU Power Usage", "Max GPU Memory Usage", "Total GPU Memory")


@dataclass
class Result:
    """One load level: its value (concurrency or request rate), the merged summary, and whether
    the windows were stable."""

    level: float
    summary: Summary
    stable: bool
    workers: int = 1


def _level_name(o: PerfOptions) -> str:
    return "Request Rate" if o.request_rate else "Concurrency"


def _fmt_level(o: PerfOptions, level: float) -> str:
    return f"{level:g}" if o.request_rate else str(int(level))


def settings_text(o: PerfOptions, info: ModelInfo) -> str:
    lines = ["*** Measurement Settings ***", f"  Batch size: {o.batch_size}",
             "  Service Kind: " + ("trident in-process" if o.in_process else "Triton")]
    if o.measurement_mode == "count_windows":
        lines.append('  Using "count_windows" mode for stabilization')
        lines.append(f"  Minimum number of samples in each window: {o.measurement_request_count}")
    else:
        lines.append('  Using "time_windows" mode for stabilization')
        lines.append(f"  Measurement window: {o.measurement_interval_ms} msec")
    if o.request_rate:
        lines.append("  Using uniform distribution on request generation" if o.distribution == "constant"
                     else "  Using poisson distribution on request generation")
    if o.latency_threshold_ms:
        lines.append(f"  Latency limit: {o.latency_threshold_ms:g} msec")
    lines.append("  Using " + ("asynchronous" if o.async_mode or o.request_rate else "synchronous")
                 + " calls for inference" + (" (streaming)" if o.streaming else ""))
    if o.shared_memory != "none":
        lines.append(f"  Using {o.shared_memory} shared memory for inputs and outputs")
    lines.append("  Stabilizing using " + (f"p{o.percentile} latency" if o.percentile else "average latency"))
    return "\n".join(lines) + "\n"


def pass_line(n: int, s: Summary, o: PerfOptions) -> str:
    """perf_analyzer's verbose line for one window."""
    lat = (f"p{o.percentile} latency: {s.percentile_us(o.percentile):.0f} usec" if o.percentile
           else f"Avg latency: {s.avg_us:.0f} usec (std {s.std_us:.0f} usec)")
    return (f"  Pass [{n}] throughput: {s.throughput:.1f} infer/sec. {lat}. "
            f"Client CPU {s.client_cpu_pct:.0f}%")


def level_text(o: PerfOptions, r: Result) -> str:
    s = r.summary
    name = "Request Rate" if o.request_rate else "Request concurrency"
    lines = [f"{name}: {_fmt_level(o, r.level)}"]
    if not r.stable:
        lines.append(f"  WARNING: no stable measurement within {o.max_trials} windows; the last "
                     f"{min(3, o.max_trials)} are reported")
    lines += ["  Client: ", f"    Request count: {s.count}", f"    Throughput: {s.throughput:.1f} infer/sec"]
    if o.request_rate and s.delayed:
        lines.append(f"    Delayed Request Count: {s.delayed}")
    lines.append(f"    Avg latency: {s.avg_us:.0f} usec (standard deviation {s.std_us:.0f} usec)")
    for p in sorted({*((o.percentile,) if o.percentile else ()), 50, 90, 95, 99}):
        lines.append(f"    p{p} latency: {s.percentile_us(p):.0f} usec")
    proto = "gRPC" if o.protocol == "grpc" else "HTTP"
    if not o.in_process:
        send_recv = (s.send_ns + s.recv_ns) / 1e3
        lines.append(f"    Avg {proto} time: {s.avg_us:.0f} usec (send/recv {send_recv:.0f} usec + response wait "
                     f"{max(0.0, s.avg_us - send_recv):.0f} usec)")
    if o.in_process:
        lines.append(f"    Process CPU (server and load together): {s.client_cpu_pct:.0f}% of one core")
    else:
        lines.append(f"    Load generator: {r.workers} process{'es' if r.workers > 1 else ''}, "
                     f"CPU {s.client_cpu_pct:.0f}% of one core")
    if s.server is not None:
        d = s.server.per_request_us()
        lines += ["  Server: ", f"    Inference count: {s.server.inference_count}",
                  f"    Execution count: {s.server.execution_count}",
                  f"    Successful request count: {s.server.success_count}",
                  f"    Avg request latency: {d['request']:.0f} usec (overhead {d['overhead']:.0f} usec + queue "
                  f"{d['queue']:.0f} usec + compute input {d['compute_input']:.0f} usec + compute infer "
                  f"{d['compute_infer']:.0f} usec + compute output {d['compute_output']:.0f} usec)"]
    if o.collect_metrics:
        lines.append("  Server Prometheus Metrics: ")
        m = s.metrics
        for key, label, unit in (("gpu_utilization", "Avg GPU Utilization", "%"),
                                 ("gpu_power", "Avg GPU Power Usage", " watts"),
                                 ("max_gpu_memory", "Max GPU Memory Usage", " bytes"),
                                 ("total_gpu_memory", "Total GPU Memory", " bytes"),
                                 ("cpu_utilization", "Avg CPU Utilization", "%"),
                                 ("max_cpu_memory", "Max CPU Memory Usage", " bytes")):
            if key in m:
                value = m[key] * 100 if key.endswith("utilization") else m[key]
                lines.append(f"    {label}: {value:.1f}{unit}" if unit == "%" else f"    {label}: {value:.0f}{unit}")
            elif key.startswith(("gpu", "max_gpu", "total")):
                lines.append(f"    {label}: none (no GPU metrics on this server)")
    return "\n".join(lines) + "\n"


def closing_text(o: PerfOptions, results: Sequence[Result]) -> str:
    lat_name = f"p{o.percentile} latency" if o.percentile else "latency"
    lines = [f"Inferences/Second vs. Client {'p' + str(o.percentile) if o.percentile else 'Average'} Batch Latency"]
    for r in results:
        lat = r.summary.latency_us(o.percentile)
        lines.append(f"{_level_name(o) if o.request_rate else 'Concurrency'}: {_fmt_level(o, r.level)}, "
                     f"throughput: {r.summary.throughput:.1f} infer/sec, {lat_name} {lat:.0f} usec")
    return "\n".join(lines) + "\n"


def _metric_cell(m: dict[str, float], key: str) -> str:
    return "" if key not in m else f"gpu:{m[key] * (100 if key == 'gpu_utilization' else 1):g};"


def csv_text(o: PerfOptions, results: Sequence[Result]) -> str:
    """perf_analyzer's ``-f`` CSV: a header and one row per load level (latencies in usec)."""
    header = [_level_name(o), *CSV_COLUMNS]
    if o.collect_metrics:
        header += METRIC_COLUMNS
    rows = [",".join(header)]
    for r in results:
        s = r.summary
        d = s.server.per_request_us() if s.server is not None else {k: 0.0 for k in (
            "queue", "compute_input", "compute_infer", "compute_output")}
        send, recv = s.send_ns / 1e3, s.recv_ns / 1e3
        parts = d["queue"] + d["compute_input"] + d["compute_infer"] + d["compute_output"]
        network = max(0.0, s.avg_us - parts - send - recv)
        cells = [_fmt_level(o, r.level), f"{s.throughput:.2f}", f"{send:.0f}", f"{network:.0f}", f"{d['queue']:.0f}",
                 f"{d['compute_input']:.0f}", f"{d['compute_infer']:.0f}", f"{d['compute_output']:.0f}",
                 f"{recv:.0f}", *(f"{s.percentile_us(p):.0f}" for p in (50, 90, 95, 99)), f"{s.avg_us:.0f}",
                 f"{send + recv:.0f}", f"{s.wait_ns / 1e3:.0f}"]
        if o.collect_metrics:
            cells += [_metric_cell(s.metrics, k) for k in ("gpu_utilization", "gpu_power", "max_gpu_memory",
                                                           "total_gpu_memory")]
        rows.append(",".join(cells))
    return "\n".join(rows) + "\n"


def json_text(o: PerfOptions, results: Sequence[Result]) -> str:
    """The same figures as JSON (trident's addition), one object per load level."""
    out = []
    for r in results:
        s = r.summary
        entry = {"level": r.level, "kind": "request_rate" if o.request_rate else "concurrency",
                 "stable": r.stable, "throughput": s.throughput, "count": s.count, "avg_us": s.avg_us,
                 **{f"p{p}_us": s.percentile_us(p) for p in (50, 90, 95, 99)},
                 "client_cpu_pct": s.client_cpu_pct, "workers": r.workers, "delayed": s.delayed,
                 "server": s.server.per_request_us() if s.server is not None else None, "metrics": s.metrics}
        out.append(entry)
    return json.dumps(out, indent=1) + "\n"
