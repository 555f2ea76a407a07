"""Check ``trident perf``'s figures against wrk (HTTP/1.1) and h2load (gRPC over HTTP/2) on the
same server, model and request bytes: throughput and p50 at several concurrencies.

    python -m trident.perf.agreement --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 \\
        --model identity_fp32 --shape INPUT0:16 --concurrency 1,8,64 --seconds 4

Prints a markdown table: req/s and p50 of each tool (medians of ``--repeat`` interleaved runs),
and the differences, each the median of the run-by-run differences of perf and the reference run
next to it, with their quartiles (how much the machine moved meanwhile). wrk's percentiles are
corrected for coordinated omission (it adds samples for requests it did not send while waiting),
so raw latencies are compared with h2load's per-request log (``--h1`` for HTTP/1.1). Needs ``wrk`` and
``h2load`` on PATH. Each run lasts ``--seconds`` (plus a 1 s warm-up for wrk and h2load); the
``trident perf`` run uses three windows of a third of that.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable

import numpy as np

from trident.perf.control import open_control
from trident.perf.engine import _Workers
from trident.perf.inputs import build_requests, parse_shapes
from trident.perf.measure import RECORD_FIELDS
from trident.perf.wire import grpc_infer_message, http_infer_request
from trident.perf.worker import WorkerSpec

_LUA = """
wrk.method = "POST"
local f = assert(io.open(os.getenv("PERF_BODY"), "rb")); wrk.body = f:read("*a"); f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = os.getenv("PERF_HDR")
function done(s, lat, req)
  io.write(string.format("WRK %d %d %d\\n", s.requests, s.duration, lat:percentile(50)))
end
"""


def _perf(proto: str, url: str, model: str, shapes: list[str], conc: int, seconds: float) -> tuple[float, float, float]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    window = int(seconds * 1000 / 3)
    cmd = [sys.executable, "-m", "trident", "perf", "-m", model, "-i", proto, "-u", url, "--concurrency-range",
           str(conc), "-p", str(window), "-r", "3", "-s", "1000", "--json-file", out, "--workers", "1"]
    for s in shapes:
        cmd += ["--shape", s]
    subprocess.run(cmd, capture_output=True, timeout=seconds + 120, check=True)
    with open(out) as fh:
        r = json.load(fh)[0]
    os.unlink(out)
    return r["throughput"], r["p50_us"] / 1e3, r["client_cpu_pct"]


def _wrk_argv(d: str, url: str, body: bytes, hdr: int, conc: int, seconds: float) -> tuple[list[str], dict[str, str]]:
    """wrk's command line and environment for a run of ``seconds`` (its files written in ``d``)."""
    path = os.path.join(d, "body")
    lua = os.path.join(d, "s.lua")
    with open(path, "wb") as f:
        f.write(body)
    with open(lua, "w") as f:
        f.write(_LUA)
    env = {**os.environ, "PERF_BODY": path, "PERF_HDR": str(hdr)}
    return ["wrk", "-t1", f"-c{conc}", "--timeout", "10s", "-s", lua, f"-d{seconds:g}s", url], env


def _wrk_result(stdout: str, stderr: str) -> tuple[float, float]:
    m = re.search(r"WRK (\d+) (\d+) (\d+)", stdout)
    if not m:
        raise RuntimeError(stdout + stderr)
    return int(m.group(1)) / (int(m.group(2)) / 1e6), int(m.group(3)) / 1e3


def _wrk(url: str, body: bytes, hdr: int, conc: int, seconds: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        warm, env = _wrk_argv(d, url, body, hdr, conc, 1)
        subprocess.run(warm, capture_output=True, timeout=60, env=env)
        argv, env = _wrk_argv(d, url, body, hdr, conc, seconds)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, env=env)
    return _wrk_result(p.stdout, p.stderr)


def _h2load_argv(d: str, target: str, frame: bytes, conc: int, seconds: float, h1_header: int = 0) -> list[str]:
    """h2load's command line for a run of ``seconds`` logging each request (files in ``d``):
    gRPC, or HTTP/1.1 (``--h1``) when ``h1_header`` (the binary body's
    Inference-Header-Content-Length) is given."""
    path = os.path.join(d, "frame")
    with open(path, "wb") as f:
        f.write(frame)
    if h1_header:
        base = ["h2load", "--h1", "-t1", "-c", str(conc), "-m", "1", "-d", path,
                "-H", "content-type: application/octet-stream", "-H", f"inference-header-content-length: {h1_header}"]
        url = target
    else:
        base = ["h2load", "-t1", "-c", str(conc), "-m", "1", "-d", path, "-H", "content-type: application/grpc",
                "-H", "te: trailers"]
        url = f"http://{target}/inference.GRPCInferenceService/ModelInfer"
    return [*base, "-D", f"{seconds:g}", f"--log-file={os.path.join(d, 'log')}", url]


def _h2load_result(d: str, stdout: str, stderr: str, seconds: float) -> tuple[float, float]:
    """h2load's req/s and raw p50 (from its per-request log in ``d``)."""
    m = re.search(r"(\d+) succeeded", stdout)
    if not m:
        raise RuntimeError(stdout + stderr)
    with open(os.path.join(d, "log")) as f:
        lat = sorted(int(line.split("\t")[2]) for line in f if line.count("\t") == 2)
    return int(m.group(1)) / seconds, (lat[len(lat) // 2] / 1e3 if lat else 0.0)


def _h2load(target: str, frame: bytes, conc: int, seconds: float, h1_header: int = 0) -> tuple[float, float]:
    """One h2load run after a 1 s warm-up: its req/s and raw p50."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(_h2load_argv(d, target, frame, conc, 1, h1_header), capture_output=True, timeout=60)
        p = subprocess.run(_h2load_argv(d, target, frame, conc, seconds, h1_header), capture_output=True,
                           text=True, timeout=seconds + 60)
        return _h2load_result(d, p.stdout, p.stderr, seconds)


def _references(a: argparse.Namespace, proto: str, conc: int, body: bytes, hdr: int, frame: bytes,
                runs: dict[str, list[tuple[float, float]]]) -> None:
    """One run of each reference tool for ``proto`` at ``conc``, added to ``runs``."""
    if proto == "http":
        infer_url = f"http://{a.http}/v2/models/{a.model}/infer"
        runs.setdefault("wrk", []).append(_wrk(infer_url, body, hdr, conc, a.seconds))
        runs.setdefault("h2load --h1", []).append(_h2load(infer_url, body, conc, a.seconds, h1_header=hdr))
    else:
        runs.setdefault("h2load", []).append(_h2load(a.grpc, frame, conc, a.seconds))


def _side_by_side(spec: WorkerSpec, conc: int, argv: list[str], env: dict[str, str] | None,
                  seconds: float) -> tuple[float, float, float, str, str]:
    """perf's load generator and a reference tool against the same server at the same time,
    ``conc`` connections each: perf's req/s, p50 (ms) and CPU % over the reference's run, and the
    reference's stdout and stderr. Both see the same machine at the same moment, so its drift
    cancels out (the server serves ``2 * conc`` connections meanwhile). Raises RuntimeError for
    a failed request or tool."""
    workers = _Workers(spec)
    try:
        workers.grow(1)
        workers.send_all([("concurrency", conc)])
        settle = time.monotonic() + 0.5  # perf's connections are up and busy before the reference starts
        while time.monotonic() < settle:
            workers.poll(0.05)
        start = time.monotonic_ns()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        chunks, cpu = [], 0.0
        try:
            while proc.poll() is None:
                for _i, msg in workers.poll(0.05):
                    if msg[5]:
                        raise RuntimeError(f"trident perf: {msg[5]}")
                    if msg[0] == "records" and msg[1]:
                        chunks.append(np.frombuffer(msg[1], np.int64).reshape(-1, RECORD_FIELDS))
                        cpu += msg[2]
        finally:
            if proc.poll() is None:
                proc.kill()
            stdout, stderr = proc.communicate()
        end = min(time.monotonic_ns(), start + int(seconds * 1e9))
    finally:
        workers.close()
    records = np.concatenate(chunks) if chunks else np.zeros((0, RECORD_FIELDS), np.int64)
    begin = start + 50_000_000  # the reference's own start-up and connections
    inside = records[(records[:, 3] >= begin) & (records[:, 3] < end)]
    span = max(1e-9, (end - begin) / 1e9)
    p50 = float(np.median(inside[:, 3] - inside[:, 0])) / 1e6 if len(inside) else 0.0
    return len(inside) / span, p50, 100 * cpu / ((time.monotonic_ns() - start) / 1e9), stdout, stderr


def _side_by_side_row(a: argparse.Namespace, proto: str, conc: int, request: bytes, message: bytes, body: bytes,
                      hdr: int, frame: bytes) -> None:
    """``--side-by-side``: each reference tool and perf at the same time, ``--repeat`` times; a
    table row per reference (medians, and the median of the run-by-run differences)."""
    target = a.http if proto == "http" else a.grpc
    host, _, port = target.rpartition(":")
    spec = WorkerSpec(proto, host, int(port), (request if proto == "http" else message,))
    infer_url = f"http://{target}/v2/models/{a.model}/infer"
    names = ["wrk", "h2load --h1"] if proto == "http" else ["h2load"]
    for name in names:
        mine: list[tuple[float, float, float]] = []
        refs: list[tuple[float, float]] = []
        for _ in range(max(1, a.repeat)):
            with tempfile.TemporaryDirectory() as d:
                env = None
                if name == "wrk":
                    argv, env = _wrk_argv(d, infer_url, body, hdr, conc, a.seconds)
                elif proto == "http":
                    argv = _h2load_argv(d, infer_url, body, conc, a.seconds, h1_header=hdr)
                else:
                    argv = _h2load_argv(d, target, frame, conc, a.seconds)
                rate, p50, cpu, out, err = _side_by_side(spec, conc, argv, env, a.seconds)
                refs.append(_wrk_result(out, err) if name == "wrk" else _h2load_result(d, out, err, a.seconds))
                mine.append((rate, p50, cpu))
        _row(proto, conc, name, mine, refs)


def _row(proto: str, conc: int, name: str, mine: list[tuple[float, float, float]],
         refs: list[tuple[float, float]]) -> None:
    ours, p50, cpu = (statistics.median(v) for v in zip(*mine, strict=True))
    ref, ref_p50 = (statistics.median(v) for v in zip(*refs, strict=True))
    # each perf run against the reference run next to it in time (or at the same time): on a
    # machine whose speed drifts, the median of these paired differences is steadier than the
    # difference of the two medians
    rate = _paired(m[0] for m in mine)(v[0] for v in refs)
    lat = _paired(m[1] for m in mine)(v[1] for v in refs)
    print(f"| {proto} | {conc} | {name} | {ref:.0f} | {ours:.0f} | {rate} | "
          f"{ref_p50:.2f} | {p50:.2f} | {lat} | {cpu:.0f} |", flush=True)


def _paired(ours: Iterable[float]) -> Callable[[Iterable[float]], str]:
    """``refs -> "median (quartiles)"`` of the relative differences of ``ours`` and ``refs``, run by run."""
    mine = list(ours)

    def against(refs: Iterable[float]) -> str:
        diffs = sorted(100 * (a - b) / b for a, b in zip(mine, refs, strict=True) if b)
        if not diffs:
            return "n/a"
        if len(diffs) < 4:
            return f"{statistics.median(diffs):+.1f}%"
        q1, _, q3 = statistics.quantiles(diffs, n=4)
        return f"{statistics.median(diffs):+.1f}% ({q1:+.0f}..{q3:+.0f})"

    return against


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http", default="127.0.0.1:8000")
    ap.add_argument("--grpc", default="127.0.0.1:8001")
    ap.add_argument("--model", default="identity_fp32")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--protocols", default="http,grpc")
    ap.add_argument("--repeat", type=int, default=5,
                    help="interleaved runs per row (which tool goes first alternates); the medians are shown")
    ap.add_argument("--side-by-side", action="store_true",
                    help="run perf and each reference at the same time, N connections each, instead of in turn")
    a = ap.parse_args(argv)
    info = open_control("http", a.http).model_info(a.model, "")
    tensors = build_requests(info, 1, parse_shapes(a.shape), "random")[0]
    request = http_infer_request(a.http, a.model, "", tensors, info.outputs)
    head, _, body = request.partition(b"\r\n\r\n")
    hdr = int(re.search(rb"Inference-Header-Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
    message = grpc_infer_message(a.model, "", tensors, info.outputs)
    frame = b"\x00" + len(message).to_bytes(4, "big") + message
    print("| protocol | conc | reference | ref req/s | perf req/s | diff (quartiles) | ref p50 ms | perf p50 ms | "
          "diff (quartiles) | perf CPU % |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for proto in a.protocols.split(","):
        for conc in (int(c) for c in a.concurrency.split(",")):
            if a.side_by_side:
                _side_by_side_row(a, proto, conc, request, message, body, hdr, frame)
                continue
            runs: dict[str, list[tuple[float, float]]] = {}
            mine: list[tuple[float, float, float]] = []
            target = a.http if proto == "http" else a.grpc
            for i in range(max(1, a.repeat)):
                # alternate which tool goes first, so that a machine getting faster or slower
                # during the row favours neither
                if i % 2:
                    mine.append(_perf(proto, target, a.model, a.shape, conc, a.seconds))
                _references(a, proto, conc, body, hdr, frame, runs)
                if not i % 2:
                    mine.append(_perf(proto, target, a.model, a.shape, conc, a.seconds))
            for name, values in runs.items():
                _row(proto, conc, name, mine, values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
