"""``trident perf``: drives the worker processes through the load levels, cuts the records into
measurement windows, checks stability, reads the server's statistics (and metrics) around each
window, and writes perf_analyzer's report.

The engine is plain blocking code in the main process; the load itself runs in
:mod:`trident.perf.worker` processes it owns (started in :func:`run_perf`, stopped and joined
before it returns, also on error or Ctrl-C). With ``--workers`` unset it starts with one and adds
one (up to the CPU count) whenever each is busy at least :data:`SATURATED` of a core, measuring
that load level again.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from typing import TextIO

import numpy as np

from trident.perf.control import Control, fetch_metrics, open_control
from trident.perf.inputs import ModelInfo, build_requests, parse_shapes
from trident.perf.measure import RECORD_FIELDS, STABILITY_WINDOWS, Summary, is_stable, merge, summarize
from trident.perf.options import MAX_CONNECTIONS, PerfOptions
from trident.perf.report import (
    Result,
    closing_text,
    csv_text,
    json_text,
    level_text,
    pass_line,
    settings_text,
)
from trident.perf.wire import PerfError, Tensor, grpc_infer_message, http_infer_request
from trident.perf.worker import WorkerSpec, serve_worker

__all__ = ["run_perf", "load_levels", "SATURATED"]

#: a worker busy this share of one core (or more) counts as saturated
SATURATED = 0.9


def load_levels(o: PerfOptions) -> Iterator[float]:
    """The concurrencies or request rates to measure, in order (an end of 0 means: until the
    latency threshold, at most 1024 levels)."""
    start, end, step = o.request_rate or o.concurrency or (1.0, 1.0, 1.0)
    value, n = start, 0
    while (end == 0 or value <= end + 1e-9) and n < 1024:
        yield value
        value += step
        n += 1


class _Workers:
    """The worker processes and their pipes; records arrive through :meth:`poll`."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.pipes: list[Connection] = []
        self.seen_ns: list[int] = []

    def grow(self, n: int, timeout_s: float = 60.0) -> None:
        """Start workers until there are ``n``, each ready (imported, listening) when this returns."""
        while len(self.procs) < n:
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(target=serve_worker, args=(child, self.spec), daemon=True,
                                    name=f"trident-perf-worker-{len(self.procs)}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.pipes.append(parent)
            self.seen_ns.append(0)
            if not parent.poll(timeout_s):
                raise PerfError(f"a load-generator process did not start within {timeout_s:g} s")
            parent.recv()

    def send_all(self, messages: list[tuple]) -> None:  # type: ignore[type-arg]
        for pipe, msg in zip(self.pipes, messages, strict=True):
            pipe.send(msg)

    def poll(self, timeout_s: float) -> list[tuple[int, tuple]]:  # type: ignore[type-arg]
        out: list[tuple[int, tuple]] = []  # type: ignore[type-arg]
        for ready in wait(self.pipes, timeout_s):
            assert isinstance(ready, Connection)
            pipe = ready
            i = self.pipes.index(pipe)
            try:
                msg = pipe.recv()
            except EOFError:
                raise PerfError(f"load-generator worker {i} exited unexpectedly") from None
            self.seen_ns[i] = max(self.seen_ns[i], msg[4])
            out.append((i, msg))
        return out

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("stop",))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for pipe in self.pipes:
            pipe.close()


def _split_load(o: PerfOptions, level: float, workers: int, seed: int) -> list[tuple]:  # type: ignore[type-arg]
    if o.request_rate:
        max_conns = o.max_threads or MAX_CONNECTIONS
        return [("rate", level / workers, o.distribution, seed * 1000 + i, max_conns) for i in range(workers)]
    c = int(level)
    return [("concurrency", c // workers + (1 if i < c % workers else 0)) for i in range(workers)]


_METRIC = re.compile(r"^(nv_gpu_utilization|nv_gpu_power_usage|nv_gpu_memory_used_bytes|nv_gpu_memory_total_bytes|"
                     r"nv_cpu_utilization|nv_cpu_memory_used_bytes)(\{[^}]*\})?\s+([0-9.eE+-]+)", re.M)


def _metrics_sample(text: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for name, _labels, value in _METRIC.findall(text):
        sums[name] = sums.get(name, 0.0) + float(value)
    out = {}
    for src, dst in (("nv_gpu_utilization", "gpu_utilization"), ("nv_gpu_power_usage", "gpu_power"),
                     ("nv_gpu_memory_used_bytes", "max_gpu_memory"), ("nv_gpu_memory_total_bytes", "total_gpu_memory"),
                     ("nv_cpu_utilization", "cpu_utilization"), ("nv_cpu_memory_used_bytes", "max_cpu_memory")):
        if src in sums:
            out[dst] = sums[src]
    return out


def _average_samples(samples: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in {k for s in samples for k in s}:
        values = [s[key] for s in samples if key in s]
        out[key] = max(values) if key.startswith(("max", "total")) else sum(values) / len(values)
    return out


class _Progress:
    """Progress on stderr: one rewritten line on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO, verbose: bool) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.verbose = verbose

    def line(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()


class _Measurer:
    def __init__(self, o: PerfOptions, control: Control, workers: _Workers, info: ModelInfo, progress: _Progress,
                 batch: int) -> None:
        self.o = o
        self.control = control
        self.workers = workers
        self.info = info
        self.progress = progress
        self.batch = batch
        self.pending = np.zeros((0, RECORD_FIELDS), np.int64)
        self.cpu = 0.0
        self.delayed = 0

    def _take(self, messages: list[tuple[int, tuple]]) -> None:  # type: ignore[type-arg]
        chunks = [self.pending]
        for _i, msg in messages:
            kind, raw, cpu, delayed, _now, error = msg
            if kind == "failed":
                raise PerfError(error or "load generator failed")
            if error:
                raise PerfError(f"request failed: {error}")
            if raw:
                chunks.append(np.frombuffer(raw, np.int64).reshape(-1, RECORD_FIELDS))
            self.cpu += cpu
            self.delayed += delayed
        self.pending = np.concatenate(chunks) if len(chunks) > 1 else self.pending
        if len(self.pending) and (self.pending[:, 4] == 0).any():
            raise PerfError("request failed")

    def window(self, start_ns: int) -> Summary:
        """Measure one window that starts at ``start_ns``; raises :class:`PerfError` on a failed
        request or when no request finishes within ``--timeout``."""
        o = self.o
        before = self.control.stats(self.info.name, self.info.version)
        samples: list[dict[str, float]] = []
        next_sample = time.monotonic()
        count_mode = o.measurement_mode == "count_windows"
        end_ns = start_ns + o.measurement_interval_ms * 1_000_000
        last_progress = time.monotonic()
        while True:
            now = time.monotonic()
            if o.collect_metrics and now >= next_sample:
                samples.append(_metrics_sample(fetch_metrics(self._metrics_url())))
                next_sample = now + o.metrics_interval_ms / 1000
            self._take(self.workers.poll(0.05))
            in_window = self.pending[self.pending[:, 3] >= start_ns] if len(self.pending) else self.pending
            if count_mode:
                if len(in_window) >= o.measurement_request_count:
                    ends = np.sort(in_window[:, 3])
                    end_ns = int(ends[o.measurement_request_count - 1]) + 1
                    if time.monotonic_ns() >= end_ns and min(self.workers.seen_ns) >= end_ns:
                        break
            elif time.monotonic_ns() >= end_ns and min(self.workers.seen_ns) >= end_ns:
                break
            if len(in_window):
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > o.timeout_s:
                raise PerfError(f"no request finished within {o.timeout_s:g} s")
        after = self.control.stats(self.info.name, self.info.version)
        if o.collect_metrics:
            samples.append(_metrics_sample(fetch_metrics(self._metrics_url())))
        sel = (self.pending[:, 3] >= start_ns) & (self.pending[:, 3] < end_ns)
        records = self.pending[sel]
        self.pending = self.pending[self.pending[:, 3] >= end_ns]
        s = summarize(records, (end_ns - start_ns) / 1e9, self.batch, client_cpu_s=self.cpu, delayed=self.delayed)
        self.cpu, self.delayed = 0.0, 0
        s.server = after - before
        s.metrics = _average_samples(samples)
        return s

    def _metrics_url(self) -> str:
        if self.o.metrics_url:
            return self.o.metrics_url
        host = self.o.url.split("://", 1)[-1].rsplit(":", 1)[0]
        return f"http://{host}:8002/metrics"

    def pause(self) -> None:
        self.workers.send_all([("pause",)] * len(self.workers.pipes))
        waiting = set(range(len(self.workers.pipes)))
        deadline = time.monotonic() + self.o.timeout_s
        while waiting:
            if time.monotonic() > deadline:
                raise PerfError(f"requests still in flight {self.o.timeout_s:g} s after the load stopped")
            for i, msg in self.workers.poll(0.1):
                if msg[5]:
                    raise PerfError(f"request failed: {msg[5]}")
                if msg[0] == "paused":
                    waiting.discard(i)
        self.pending = np.zeros((0, RECORD_FIELDS), np.int64)
        self.cpu, self.delayed = 0.0, 0


def _shared_memory(o: PerfOptions, control: Control, info: ModelInfo, variants: list[list[Tensor]]
                   ) -> tuple[list[list[Tensor]], dict[str, tuple[str, int, int]], Callable[[], None]]:
    """System shared memory for inputs and outputs: regions created, filled, registered.
    Returns the variants with shm references, the output regions, and the clean-up call."""
    from multiprocessing import shared_memory

    tag = f"trident_perf_{os.getpid()}"
    total = sum(len(t.data) for v in variants for t in v) or 1
    made: list[tuple[str, shared_memory.SharedMemory]] = []

    def cleanup() -> None:
        for name, region in made:
            try:
                control.unregister_system_shm(name)
            except PerfError:
                pass
            region.close()
            region.unlink()

    try:
        inputs = shared_memory.SharedMemory(name=tag + "_in", create=True, size=total)
        made.append((tag + "_in", inputs))
        offset = 0
        out_variants = []
        for v in variants:
            refs = []
            for t in v:
                buf = inputs.buf
                assert buf is not None
                buf[offset:offset + len(t.data)] = t.data
                refs.append(Tensor(t.name, t.datatype, t.shape, b"", (tag + "_in", offset, len(t.data))))
                offset += len(t.data)
            out_variants.append(refs)
        size = o.output_shm_size * max(1, len(info.outputs))
        outputs = shared_memory.SharedMemory(name=tag + "_out", create=True, size=size)
        made.append((tag + "_out", outputs))
        out_refs = {name: (tag + "_out", i * o.output_shm_size, o.output_shm_size)
                    for i, name in enumerate(info.outputs)}
        for name, region in made:
            control.register_system_shm(name, "/" + name, region.size)
    except BaseException:
        cleanup()
        raise
    return out_variants, out_refs, cleanup


def run_perf(o: PerfOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Measure every load level and write the report; returns the exit status. Raises
    :class:`PerfError` (one line for the user) for a bad model, shape, input data, an unreachable
    server or a failed request; Ctrl-C stops the workers before it propagates."""
    if o.in_process:
        from trident.perf.inprocess import run_in_process

        return run_in_process(o, out, err)
    control = open_control(o.protocol, o.url, min(o.timeout_s, 30.0))
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    workers: _Workers | None = None
    try:
        info = control.model_info(o.model, o.version)
        if info.decoupled and not o.streaming:
            raise PerfError(f"model '{o.model}' is decoupled: measure it with -i grpc --streaming")
        variants = build_requests(info, o.batch_size, parse_shapes(o.shapes), o.input_data, o.string_length,
                                  o.string_data)
        output_shm: dict[str, tuple[str, int, int]] = {}
        if o.shared_memory == "system":
            variants, output_shm, cleanup = _shared_memory(o, control, info, variants)
        host = o.url.split("://", 1)[-1]
        hostname, _, port = host.rpartition(":")
        params: dict[str, object] = {"triton_enable_empty_final_response": True} if o.streaming else {}
        if o.protocol == "http":
            payloads = tuple(http_infer_request(host, o.model, o.version, v, info.outputs, output_shm) for v in variants)
        else:
            payloads = tuple(grpc_infer_message(o.model, o.version, v, info.outputs, output_shm, params)
                             for v in variants)
        spec = WorkerSpec("stream" if o.streaming else o.protocol, hostname.strip("[]") or "localhost",
                          int(port), payloads)
        out.write(settings_text(o, info) + "\n")
        out.flush()
        workers = _Workers(spec)
        n_workers = o.workers or 1
        workers.grow(n_workers)
        results = _sweep(o, control, workers, info, _Progress(err, o.verbose), out)
        out.write(closing_text(o, results))
        out.flush()
        if o.csv_file:
            with open(o.csv_file, "w") as f:
                f.write(csv_text(o, results))
        if o.json_file:
            with open(o.json_file, "w") as f:
                f.write(json_text(o, results))
        return 0
    finally:
        if workers is not None:
            workers.close()
        cleanup()
        control.close()


def _sweep(o: PerfOptions, control: Control, workers: _Workers, info: ModelInfo, progress: _Progress,
           out: TextIO) -> list[Result]:
    results: list[Result] = []
    measurer = _Measurer(o, control, workers, info, progress, o.batch_size)
    max_workers = max(1, os.cpu_count() or 1)
    if o.warmup_request_count:
        _warmup(o, measurer, workers)
    for n, level in enumerate(load_levels(o)):
        while True:  # measured again with more workers when the generator saturates
            w = len(workers.procs)
            what = f"request rate {level:g}/s" if o.request_rate else f"concurrency {int(level)}"
            progress.line(f"Measuring {what} with {w} load-generator process{'es' if w > 1 else ''}")
            workers.send_all(_split_load(o, level, w, n))
            windows: list[Summary] = []
            start = time.monotonic_ns()
            grown = False
            stable = False
            for trial in range(o.max_trials):
                s = measurer.window(start)
                start = time.monotonic_ns() if o.measurement_mode == "count_windows" else \
                    start + o.measurement_interval_ms * 1_000_000
                windows.append(s)
                progress.line(pass_line(trial + 1, s, o))
                per_worker = s.client_cpu_s / s.duration_s / w if s.duration_s else 0.0
                more_work = o.request_rate is not None or level > w
                if not o.workers and per_worker >= SATURATED and w < max_workers and more_work:
                    progress.line(f"  load generator saturated ({100 * per_worker:.0f}% of a core per process): "
                                  f"adding a process")
                    measurer.pause()
                    workers.grow(w + 1)
                    grown = True
                    break
                if is_stable(windows, o.stability_pct, o.percentile):
                    stable = True
                    break
            if grown:
                continue
            measurer.pause()
            break
        if not stable:
            progress.line(f"  Failed to obtain stable measurement within {o.max_trials} measurement windows for "
                          f"{what}. Please try to increase the --measurement-interval.")
        result = Result(level, merge(windows[-STABILITY_WINDOWS:]), stable, len(workers.procs))
        progress.done()
        out.write(level_text(o, result) + "\n")
        out.flush()
        results.append(result)
        if o.latency_threshold_ms and result.summary.latency_us(o.percentile) > o.latency_threshold_ms * 1000:
            out.write(f"Measured latency went over the set limit of {o.latency_threshold_ms:g} msec.\n")
            break
        if math.isinf(level):
            break
    return results


def _warmup(o: PerfOptions, measurer: _Measurer, workers: _Workers) -> None:
    """``--warmup-request-count`` requests at the first load level, not measured."""
    first = next(load_levels(o))
    workers.send_all(_split_load(o, first, len(workers.procs), 999))
    done = 0
    deadline = time.monotonic() + o.timeout_s
    while done < o.warmup_request_count:
        if time.monotonic() > deadline:
            raise PerfError(f"warm-up did not finish within {o.timeout_s:g} s")
        measurer._take(workers.poll(0.05))
        done += len(measurer.pending)
        measurer.pending = np.zeros((0, RECORD_FIELDS), np.int64)
    measurer.pause()
