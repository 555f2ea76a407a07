"""The measuring loop of ``trident perf``, shared by the socket engine
(:mod:`trident.perf.engine`) and ``--in-process`` (:mod:`trident.perf.inprocess`): load levels,
windows cut from the workers' records, stability, server-side deltas around each window,
metrics sampling, the growth of the worker pool, and the report written per level.

Blocking code: it talks to the load through an object with the worker-pool surface
(``procs``, ``pipes``, ``seen_ns``, ``grow``, ``send_all``, ``poll``) and to the server through a
:class:`~trident.perf.control.Control`. Raises :class:`~trident.perf.wire.PerfError`.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TextIO

import numpy as np

from trident.perf.control import Control, fetch_metrics
from trident.perf.inputs import ModelInfo
from trident.perf.measure import RECORD_FIELDS, STABILITY_WINDOWS, Summary, is_stable, merge, summarize
from trident.perf.options import MAX_CONNECTIONS, PerfOptions
from trident.perf.report import Result, closing_text, csv_text, json_text, level_text, pass_line
from trident.perf.wire import PerfError

__all__ = ["sweep", "load_levels", "SATURATED", "Progress", "Load", "write_outputs"]

#: a worker busy this share of one core (or more) counts as saturated
SATURATED = 0.9


class Load(Protocol):
    """What the sweep drives: worker processes, or the in-process load."""

    @property
    def procs(self) -> Sequence[Any]: ...

    @property
    def pipes(self) -> Sequence[Any]: ...

    @property
    def seen_ns(self) -> list[int]: ...

    def grow(self, n: int, timeout_s: float = ...) -> None: ...

    def send_all(self, messages: list[tuple]) -> None: ...  # type: ignore[type-arg]

    def poll(self, timeout_s: float) -> list[tuple[int, tuple]]: ...  # type: ignore[type-arg]


def load_levels(o: PerfOptions) -> Iterator[float]:
    """The concurrencies or request rates to measure, in order (an end of 0 means: until the
    latency threshold, at most 1024 levels)."""
    start, end, step = o.request_rate or o.concurrency or (1.0, 1.0, 1.0)
    value, n = start, 0
    while (end == 0 or value <= end + 1e-9) and n < 1024:
        yield value
        value += step
        n += 1


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


class Progress:
    """Progress on stderr: on a terminal one line rewritten as the measurement goes (the level,
    the window, its elapsed time, requests so far and their rate, refreshed 4 times a second);
    otherwise plain lines, one per event (no live status)."""

    STATUS_EVERY_S = 0.25

    def __init__(self, stream: TextIO, verbose: bool) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.verbose = verbose
        self._status_at = 0.0

    def status(self, text: str) -> None:
        """A live status line (a terminal only; at most every STATUS_EVERY_S seconds)."""
        now = time.monotonic()
        if self.tty and now - self._status_at >= self.STATUS_EVERY_S:
            self._status_at = now
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()

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
    def __init__(self, o: PerfOptions, control: Control, workers: Load, info: ModelInfo, progress: Progress,
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
        self.label = ""  # what the live status names (the level and the window)

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
            if self.progress.tty:
                elapsed = max(1e-9, (time.monotonic_ns() - start_ns) / 1e9)
                done = (f"{len(in_window):,}/{o.measurement_request_count:,} requests" if count_mode
                        else f"{elapsed:.1f}/{o.measurement_interval_ms / 1000:g} s, {len(in_window):,} requests")
                self.progress.status(f"{self.label}: {done} ({len(in_window) / elapsed:,.0f}/s), "
                                     f"load generator {100 * self.cpu / elapsed:.0f}% CPU")
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


def sweep(o: PerfOptions, control: Control, workers: Load, info: ModelInfo, progress: Progress,
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
                measurer.label = f"{what}, window {trial + 1}"
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


def _warmup(o: PerfOptions, measurer: _Measurer, workers: Load) -> None:
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


def write_outputs(o: PerfOptions, results: Sequence[Result], out: TextIO) -> None:
    """The closing summary on ``out``, and the ``-f`` CSV and ``--json-file`` files."""
    out.write(closing_text(o, results))
    out.flush()
    if o.csv_file:
        with open(o.csv_file, "w") as f:
            f.write(csv_text(o, results))
    if o.json_file:
        with open(o.json_file, "w") as f:
            f.write(json_text(o, results))
