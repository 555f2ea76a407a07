"""``trident analyze``: sweep model configs through the model-control API, measure each with the
``trident perf`` engine, and write a report with the Pareto front (throughput against p99
latency), the best config under a latency budget as a ready ``config.pbtxt``, and plots.

The pure parts (:func:`candidates`, :func:`pareto_front`, :func:`choose`) decide; :func:`run_analyze`
drives a server: one it starts (``trident serve --model-control-mode explicit`` on free ports,
a subprocess it owns and stops) or a running trident/Triton given with ``-u`` (which must be in
explicit mode). Each candidate is loaded with ``POST /v2/repository/models/<m>/load`` and its
``config`` parameter; the model is reloaded from its repository files at the end, also after an
error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import copy
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trident.perf.control import http_json
from trident.perf.options import PerfOptions
from trident.perf.wire import PerfError

__all__ = ["Candidate", "Point", "candidates", "pareto_front", "choose", "add_analyze_arguments", "run_analyze",
           "MAX_CANDIDATES"]

#: most configs one run may sweep (the product of the sweep flags)
MAX_CANDIDATES = 256


@dataclass(frozen=True)
class Candidate:
    """One config to try: a short name and the full config JSON to load."""

    name: str
    config: dict[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True)
class Point:
    """One measured load level of one candidate."""

    candidate: str
    concurrency: int
    throughput: float
    p50_us: float
    p99_us: float
    avg_us: float


def _ints(text: str, what: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PerfError(f"{what} expects comma-separated integers, got '{text}'") from None
    if not values or any(v < minimum for v in values):
        raise PerfError(f"{what}: values must be at least {minimum}")
    return values


def candidates(base: dict[str, Any], instance_counts: Sequence[int], max_batch_sizes: Sequence[int],
               dynamic_batching: Sequence[bool], queue_delays_us: Sequence[int],
               preferred: Sequence[tuple[int, ...]], threads: Sequence[int]) -> list[Candidate]:
    """Every combination, as full configs derived from ``base`` (the model's config JSON).

    A model without a batch dimension (``max_batch_size`` 0) keeps 0 and no dynamic batching;
    thread counts apply to ONNX Runtime (``intra_op_thread_count``) and OpenVINO
    (``INFERENCE_NUM_THREADS``) models only (0: leave the backend's default). Raises
    :class:`PerfError` when the sweep is larger than :data:`MAX_CANDIDATES`."""
    batching_model = int(base.get("max_batch_size", 0) or 0) > 0
    backend = str(base.get("backend") or base.get("platform") or "")
    thread_key = {"onnxruntime": "intra_op_thread_count", "onnxruntime_onnx": "intra_op_thread_count",
                  "openvino": "INFERENCE_NUM_THREADS"}.get(backend)
    mbs_values = list(max_batch_sizes) if batching_model else [0]
    thread_values = list(threads) if thread_key else [0]
    out: list[Candidate] = []
    seen: set[str] = set()
    for count, mbs, dyn, delay, pref, th in itertools.product(instance_counts, mbs_values, dynamic_batching,
                                                             queue_delays_us, preferred, thread_values):
        if not batching_model or mbs == 0:
            dyn, delay, pref = False, 0, ()
        if not dyn:
            delay, pref = 0, ()
        pref = tuple(p for p in pref if p <= mbs)
        name = f"instances={count}"
        if batching_model:
            name += f",max_batch={mbs}" + (f",dynamic(delay={delay}us" + (f",preferred={list(pref)}" if pref else "")
                                           + ")" if dyn else ",no-dynamic")
        if th:
            name += f",threads={th}"
        if name in seen:
            continue
        seen.add(name)
        config = copy.deepcopy(base)
        groups = config.get("instance_group") or [{"kind": "KIND_CPU"}]
        for g in groups:
            g["count"] = count
        config["instance_group"] = groups
        if batching_model:
            config["max_batch_size"] = mbs
            if dyn:
                config["dynamic_batching"] = {"max_queue_delay_microseconds": delay,
                                              "preferred_batch_size": list(pref)}
            else:
                config.pop("dynamic_batching", None)
        if th and thread_key:
            config.setdefault("parameters", {})[thread_key] = {"string_value": str(th)}
        out.append(Candidate(name, config))
        if len(out) > MAX_CANDIDATES:
            raise PerfError(f"the sweep has more than {MAX_CANDIDATES} configs: narrow the sweep flags")
    return out


def pareto_front(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats on both throughput (higher) and p99 (lower), by throughput."""
    front = [p for p in points
             if not any(q.throughput >= p.throughput and q.p99_us <= p.p99_us
                        and (q.throughput > p.throughput or q.p99_us < p.p99_us) for q in points)]
    return sorted(front, key=lambda p: p.throughput)


def choose(points: Sequence[Point], budget_ms: float | None) -> Point | None:
    """The highest-throughput point whose p99 is within the budget (every point without one)."""
    fit = [p for p in points if budget_ms is None or p.p99_us <= budget_ms * 1000]
    return max(fit, key=lambda p: (p.throughput, -p.p99_us)) if fit else None


# ---------------------------------------------------------------------------- the run


def add_analyze_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Models and server")
    g.add_argument("-m", "--model", dest="models", action="append", required=True, help="model to tune (repeatable)")
    g.add_argument("--model-repository", dest="repository", default="",
                   help="repository to serve with a trident this command starts")
    g.add_argument("-u", dest="url", default="", help="a running trident/Triton (HTTP, --model-control-mode explicit)")
    s = p.add_argument_group("Sweep")
    s.add_argument("--instance-count", default="1,2", help="instance counts")
    s.add_argument("--max-batch-size", default="", help="max_batch_size values (default: the model's)")
    s.add_argument("--dynamic-batching", default="on,off", help="on, off or on,off")
    s.add_argument("--max-queue-delay-us", default="0", help="dynamic batching queue delays")
    s.add_argument("--preferred-batch-size", action="append", default=[], metavar="N[,N...]",
                   help="a preferred_batch_size list to try (repeatable; default none)")
    s.add_argument("--threads", default="0", help="ONNX/OpenVINO thread counts (0: the default)")
    s.add_argument("--concurrency", default="1,2,4,8", help="concurrencies to measure each config at")
    s.add_argument("--latency-budget-ms", type=float, default=None, help="p99 latency budget for the choice")
    m = p.add_argument_group("Measurement (as trident perf)")
    m.add_argument("-i", dest="protocol", choices=["http", "grpc"], default="http", help="protocol measured")
    m.add_argument("-p", "--measurement-interval", dest="interval_ms", type=int, default=2000, metavar="MS")
    m.add_argument("-r", "--max-trials", dest="max_trials", type=int, default=5)
    m.add_argument("-s", "--stability-percentage", dest="stability", type=float, default=20.0)
    m.add_argument("--shape", dest="shapes", action="append", default=[], metavar="NAME:DIMS")
    m.add_argument("--input-data", default="random")
    o = p.add_argument_group("Output")
    o.add_argument("--output-dir", default="analyze-report", help="where the report, plots and configs go")


class _Server:
    """The trident this command starts, or a given one; the HTTP control calls it needs."""

    def __init__(self, url: str, proc: subprocess.Popen | None = None, log: Any = None) -> None:  # type: ignore[type-arg]
        self.url = url
        self.proc = proc
        self.log = log
        self.grpc_url = ""

    def call(self, path: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> Any:
        return http_json(f"http://{self.url}", path, body, timeout)

    def load(self, model: str, config: dict[str, Any] | None) -> None:
        params = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        self.call(f"/v2/repository/models/{model}/load", params)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.log is not None:
            self.log.close()


_STARTED = re.compile(r"Started (GRPCInferenceService|HTTPService) at ([\d.]+):(\d+)")


def _start_trident(repository: str, models: Sequence[str], timeout_s: float = 120.0) -> _Server:
    if not os.path.isdir(repository):
        raise PerfError(f"--model-repository {repository} is not a folder")
    log = tempfile.NamedTemporaryFile("w+", prefix="trident-analyze-", suffix=".log")
    cmd = [sys.executable, "-m", "trident", "serve", "--model-repository", repository,
           "--model-control-mode", "explicit", *[f"--load-model={m}" for m in models],
           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
           "--allow-metrics=false", "--exit-on-error=false"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = _Server("", proc, log)
    deadline = time.monotonic() + timeout_s
    ports: dict[str, str] = {}
    while time.monotonic() < deadline:
        with open(log.name) as f:
            text = f.read()
        for m in _STARTED.finditer(text):
            ports[m.group(1)] = f"{m.group(2)}:{m.group(3)}"
        if "HTTPService" in ports and "GRPCInferenceService" in ports and "model loading complete:" in text:
            server.url, server.grpc_url = ports["HTTPService"], ports["GRPCInferenceService"]
            return server
        if proc.poll() is not None:
            server.stop()
            raise PerfError(f"trident serve exited with status {proc.returncode}: {text.strip().splitlines()[-1:]}")
        time.sleep(0.1)
    server.stop()
    raise PerfError(f"trident serve did not start within {timeout_s:g} s")


def _measure(server: _Server, a: argparse.Namespace, model: str, concurrency: int) -> dict[str, Any]:
    from trident.perf.engine import run_perf

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        o = PerfOptions(model=model, url=server.url if a.protocol == "http" else server.grpc_url or server.url,
                        protocol=a.protocol, concurrency=(concurrency, concurrency, 1),
                        measurement_interval_ms=a.interval_ms, max_trials=a.max_trials, stability_pct=a.stability,
                        shapes=list(a.shapes), input_data=a.input_data, json_file=f.name, workers=1)
        run_perf(o, out=io.StringIO(), err=io.StringIO())
        return json.loads(Path(f.name).read_text())[0]  # type: ignore[no-any-return]


def run_analyze(a: argparse.Namespace, out: Any = sys.stdout) -> int:
    """Sweep, measure, write the report; returns the exit status. Raises :class:`PerfError`;
    on Ctrl-C the models are restored before :class:`KeyboardInterrupt` propagates."""
    if bool(a.repository) == bool(a.url):
        raise PerfError("give either --model-repository (a trident is started) or -u (a running server)")
    counts = _ints(a.instance_count, "--instance-count", 1)
    mbs = _ints(a.max_batch_size, "--max-batch-size", 1) if a.max_batch_size else []
    dyn_words = [w.strip() for w in a.dynamic_batching.split(",") if w.strip()]
    if not dyn_words or any(w not in ("on", "off") for w in dyn_words):
        raise PerfError("--dynamic-batching expects on, off or on,off")
    delays = _ints(a.max_queue_delay_us, "--max-queue-delay-us", 0)
    preferred = [tuple(_ints(p, "--preferred-batch-size", 1)) for p in a.preferred_batch_size] or [()]
    threads = _ints(a.threads, "--threads", 0)
    levels = _ints(a.concurrency, "--concurrency", 1)
    if len(levels) > 64 or max(levels) > 4096:
        raise PerfError("--concurrency: at most 64 levels of at most 4096")
    if a.interval_ms <= 0 or a.max_trials <= 0:
        raise PerfError("-p and -r must be positive")
    outdir = Path(a.output_dir)
    server = _start_trident(a.repository, a.models) if a.repository else _Server(a.url.split("://", 1)[-1])
    if not server.grpc_url and a.protocol == "grpc":
        raise PerfError("-i grpc with -u: give the HTTP URL with -u; measuring over gRPC needs --model-repository")
    report: dict[str, Any] = {"models": {}}
    touched: dict[str, dict[str, Any]] = {}  # model -> its config before the sweep
    try:
        for model in a.models:
            base = server.call(f"/v2/models/{model}/config")
            cands = candidates(base, counts, mbs or [int(base.get("max_batch_size", 0) or 0) or 1],
                               [w == "on" for w in dyn_words], delays, preferred, threads)
            points: list[Point] = []
            configs: dict[str, dict[str, Any]] = {}
            for i, cand in enumerate(cands):
                out.write(f"[{model}] {i + 1}/{len(cands)} {cand.name}: loading\n")
                out.flush()
                touched.setdefault(model, base)
                server.load(model, cand.config)
                configs[cand.name] = cand.config
                for c in levels:
                    r = _measure(server, a, model, c)
                    pt = Point(cand.name, c, r["throughput"], r["p50_us"], r["p99_us"], r["avg_us"])
                    points.append(pt)
                    out.write(f"    concurrency {c}: {pt.throughput:.1f} infer/sec, p99 {pt.p99_us:.0f} usec\n")
                    out.flush()
            front = pareto_front(points)
            best = choose(points, a.latency_budget_ms)
            report["models"][model] = {"points": [p.__dict__ for p in points], "front": [p.__dict__ for p in front],
                                       "best": best.__dict__ if best else None, "configs": configs}
            _write_model_report(outdir, model, points, front, best, configs, a.latency_budget_ms)
    finally:
        for model, original in touched.items():
            try:
                server.load(model, None)  # back to the repository's own files
                if server.call(f"/v2/models/{model}/config") != original:
                    server.load(model, original)  # a server that keeps the last override: the config as it was
            except PerfError as e:
                sys.stderr.write(f"trident analyze: warning: could not restore {model}: {e}\n")
        server.stop()
    _write_index(outdir, report, a.latency_budget_ms)
    out.write(f"report: {outdir / 'index.html'} and {outdir / 'report.md'}\n")
    return 0


def _write_model_report(outdir: Path, model: str, points: list[Point], front: list[Point], best: Point | None,
                        configs: dict[str, dict[str, Any]], budget_ms: float | None) -> None:
    from trident.config import config_from_json
    from trident.perf.plots import plot_model
    from trident.protocol.pbtxt import format_pbtxt

    folder = outdir / model
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"points": [p.__dict__ for p in points],
                                                     "front": [p.__dict__ for p in front],
                                                     "best": best.__dict__ if best else None}, indent=1))
    if best is not None:
        cfg = config_from_json(json.dumps(configs[best.candidate]))
        (folder / "config.pbtxt").write_text(format_pbtxt(cfg))
    plot_model(folder, model, points, front, best, budget_ms)


def _write_index(outdir: Path, report: dict[str, Any], budget_ms: float | None) -> None:
    md = ["# trident analyze", ""]
    if budget_ms is not None:
        md += [f"Latency budget: p99 <= {budget_ms:g} ms", ""]
    html = ["<!doctype html><html><head><meta charset='utf-8'><title>trident analyze</title></head><body>",
            "<h1>trident analyze</h1>"]
    for model, r in report["models"].items():
        best = r["best"]
        md += [f"## {model}", "", "| config | concurrency | infer/sec | p50 us | p99 us | Pareto |", "|---|---|---|---|---|---|"]
        front = {(p["candidate"], p["concurrency"]) for p in r["front"]}
        for p in r["points"]:
            mark = "yes" if (p["candidate"], p["concurrency"]) in front else ""
            md.append(f"| {p['candidate']} | {p['concurrency']} | {p['throughput']:.1f} | {p['p50_us']:.0f} | "
                      f"{p['p99_us']:.0f} | {mark} |")
        if best:
            md += ["", f"Chosen: **{best['candidate']}** at concurrency {best['concurrency']}: "
                   f"{best['throughput']:.1f} infer/sec, p99 {best['p99_us']:.0f} us; config: `{model}/config.pbtxt`", ""]
        else:
            md += ["", "No config met the latency budget.", ""]
        md += [f"![throughput vs concurrency]({model}/throughput_vs_concurrency.png)",
               f"![latency vs throughput]({model}/latency_vs_throughput.png)", ""]
        html.append(f"<h2>{model}</h2>")
        if best:
            html.append(f"<p>Chosen: <b>{best['candidate']}</b> at concurrency {best['concurrency']}: "
                        f"{best['throughput']:.1f} infer/sec, p99 {best['p99_us']:.0f} us "
                        f"(<a href='{model}/config.pbtxt'>config.pbtxt</a>)</p>")
        else:
            html.append("<p>No config met the latency budget.</p>")
        html.append(f"<img src='{model}/throughput_vs_concurrency.png'><img src='{model}/latency_vs_throughput.png'>")
    html.append("</body></html>")
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "report.md").write_text("\n".join(md) + "\n")
    (outdir / "index.html").write_text("\n".join(html) + "\n")
    (outdir / "results.json").write_text(json.dumps(report, indent=1))
