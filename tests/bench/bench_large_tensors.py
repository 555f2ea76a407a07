"""Large tensors (16 MiB and 64 MiB FP32) through trident and Triton 2.51: MiB/s, peak RSS per in-flight
request, and what a small-request client on its own connection sees while they flow.

Not collected by pytest. Run it with trident's venv (it has tritonclient[all], trio, h11, hpack; the
senders are subprocesses of the same python)::

    /work/main/.venv/bin/python tests/bench/bench_large_tensors.py --quick      # ~1 min: does it run
    /work/main/.venv/bin/python tests/bench/bench_large_tensors.py --rounds 2 --seconds 4

By default every run gets a fresh server of its own, pinned to CPU 0 (``taskset -c 0``): trident
(``python -m trident serve --model-repository /tmp/anchors/triton-repo --http-port 9440 --grpc-port 9441
--metrics-port 0``) and Triton 2.51 (``/work/shared/bench/run_triton.sh`` with the venv and repository of
``/work/shared/bench/README.md``, on 9450/9451/9452, in a work directory of its own; the ports are
``--trident-ports`` / ``--triton-ports``), so that RSS
deltas are not hidden by memory a previous case left in the allocator. For the 64 MiB HTTP cases
trident starts with ``--http-max-input-size 83886080`` (80 MiB: the 64 MiB tensor plus its JSON
header is over the 64 MiB default); Triton 2.51 has no such flag. ``NAME=HTTP:GRPC:PID`` arguments
use already running servers instead (no restarts: RSS deltas then count only what a run adds).

One run = one server x protocol (HTTP binary tensors via ``tritonclient.http``, gRPC via
``tritonclient.grpc``, whose channel allows INT32_MAX messages by default) x size x k:

1. the victims (``probe_abuse.Victims``: an HTTP JSON and a raw HTTP/2 gRPC client of identity
   FP32[16], each on its own connection, back to back by default, every answer checked) run alone
   for ``--baseline`` s: the idle baseline;
2. k sender processes (pinned to ``--client-cpus``, ``nice`` 10 so that the victims, on the same
   core, come first) loop identity requests of the large tensor for ``--seconds`` s while the
   victims run again; each answer is checked (its length, a per-request tag in element 0, a strided
   slice and the last 4096 elements);
3. the server's process tree RSS (VmRSS of the server and its children: Triton's python stubs) is
   sampled every ``--sample-ms`` ms from before 1. until 1 s after the last sender finished.

MiB/s counts the request tensor bytes (one direction; the identity returns as many), each request
weighted by the part of it inside the window. RSS per in-flight request = (peak during the load -
median during the idle baseline) / k. Servers are interleaved per case (trident, Triton, trident,
Triton, ...; ``--rounds`` of them) and one table of medians is printed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interleave import _tree_cpu  # noqa: E402
from probe_abuse import Victims, latency_stats  # noqa: E402
from proc_stats import memory_kib, tree_pids  # noqa: E402

MIB = 1 << 20
MODEL, INPUT, OUTPUT = "identity_fp32", "INPUT0", "OUTPUT0"
SHARED_BENCH = "/work/shared/bench"


# ---- sender (a subprocess): k of them load the server with one large tensor each --------------------


def sender(proto: str, url: str, size: int) -> None:
    """Prints READY once connected and checked, reads ``start end`` (monotonic) from stdin, loops
    requests until ``end`` and prints one JSON line: per-request (t0, t1), errors, its CPU seconds."""
    os.nice(10)
    n = size // 4
    values = np.arange(n, dtype=np.float32)
    if proto == "http":
        import tritonclient.http as tc

        client: Any = tc.InferenceServerClient(url, connection_timeout=120, network_timeout=300)
        outputs = [tc.InferRequestedOutput(OUTPUT, binary_data=True)]
    else:
        import tritonclient.grpc as tc

        client = tc.InferenceServerClient(url)
        outputs = [tc.InferRequestedOutput(OUTPUT)]

    def infer(data: np.ndarray) -> np.ndarray:
        item = tc.InferInput(INPUT, [len(data)], "FP32")
        if proto == "http":
            item.set_data_from_numpy(data, binary_data=True)
        else:
            item.set_data_from_numpy(data)
        return client.infer(MODEL, [item], outputs=outputs).as_numpy(OUTPUT)

    small = np.arange(16, dtype=np.float32)
    if not np.array_equal(infer(small), small):
        raise SystemExit("the small check request came back wrong")
    print("READY", flush=True)
    start, end = (float(x) for x in sys.stdin.readline().split())
    time.sleep(max(0.0, start - time.monotonic()))
    cpu0 = time.process_time()
    spans: list[tuple[float, float]] = []
    errors: list[str] = []
    stride = slice(1, n, 65537)
    for i in range(1, 1_000_000):
        t0 = time.monotonic()
        if t0 >= end:
            break
        values[0] = i
        try:
            out = infer(values)
            ok = (out is not None and out.shape == (n,) and out[0] == i
                  and np.array_equal(out[stride], values[stride]) and np.array_equal(out[-4096:], values[-4096:]))
            if not ok:
                errors.append("wrong answer")
        except Exception as e:
            ok = False
            errors.append(f"{type(e).__name__}: {str(e)[:160]}")
            time.sleep(0.05)
        if ok:
            spans.append((t0, time.monotonic()))
    print(json.dumps({"spans": spans, "errors": errors, "cpu": time.process_time() - cpu0}), flush=True)


# ---- servers ----------------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    http: int
    grpc: int
    pid: int = 0
    kind: str = ""  # "trident" / "triton" when this script starts it, "" for a given one
    proc: subprocess.Popen | None = None
    log: str = ""
    pids: list[int] = field(default_factory=list)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{server.http}/v2/models/{MODEL}/ready"
    while time.monotonic() < deadline:
        if server.proc is not None and server.proc.poll() is not None:
            break
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.2)
    tail = open(server.log, errors="replace").read()[-2000:] if server.log else ""
    raise RuntimeError(f"{server.name} did not become ready in {timeout} s:\n{tail}")


def start(server: Server, args: argparse.Namespace, raise_http_limit: bool) -> None:
    """Start ``server`` (pinned to ``--server-cpus``), wait until its model is ready. Raises RuntimeError."""
    for port in (server.http, server.grpc):
        if not _port_free(port):
            raise RuntimeError(f"port {port} is in use: is another server running there?")
    pin = ["taskset", "-c", args.server_cpus] if args.server_cpus else []
    env = dict(os.environ)
    if server.kind == "trident":
        cmd = pin + [args.trident_python, "-m", "trident", "serve", "--model-repository", args.repo,
                     "--http-port", str(server.http), "--grpc-port", str(server.grpc), "--metrics-port", "0"]
        if raise_http_limit:
            cmd += ["--http-max-input-size", str(80 * MIB)]
    else:
        env.update(HTTP_PORT=str(server.http), GRPC_PORT=str(server.grpc), METRICS_PORT=str(server.grpc + 1),
                   TRITON_WORK=os.path.join(args.work, "triton-work"))
        cmd = pin + ["bash", os.path.join(SHARED_BENCH, "run_triton.sh"), args.triton_venv, args.repo]
    server.log = os.path.join(args.work, f"{server.name}.log")
    with open(server.log, "w") as log:
        server.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    server.pid = server.proc.pid  # taskset and bash exec: this is the server itself
    _ready(server, args.start_timeout)
    server.pids = tree_pids(server.pid)


def stop(server: Server) -> None:
    """SIGTERM the server's process group, SIGKILL after 15 s, then any child left over."""
    proc = server.proc
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    for pid in server.pids:  # a child that left the group's end behind, still in the group (not a reused pid)
        if pid != proc.pid and _pgrp(pid) == proc.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    server.proc = None


def _pgrp(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


# ---- RSS sampler ------------------------------------------------------------------------------------


class Sampler:
    """A thread reading the RSS (KiB) of a process tree every ``interval`` s; the tree is re-read every 0.5 s."""

    def __init__(self, root: int, interval: float) -> None:
        self.root, self.interval = root, interval
        # (monotonic, VmRSS, RssShmem, VmHWM, VmRSS with shared memory counted once): tree sums; Triton's
        # python backend shares its tensors' shm region between the server and the stub, VmRSS counts it twice
        self.samples: list[tuple[float, int, int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        pids, refreshed = tree_pids(self.root), time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - refreshed > 0.5:
                pids, refreshed = tree_pids(self.root), now
            rss = shm = hwm = top_shm = 0
            for pid in pids:
                m = memory_kib(pid)
                rss += m.get("VmRSS", 0)
                shm += m.get("RssShmem", 0)
                hwm += m.get("VmHWM", 0)
                top_shm = max(top_shm, m.get("RssShmem", 0))
            self.samples.append((now, rss, shm, hwm, rss - shm + top_shm))
            self._stop.wait(self.interval)

    def between(self, t0: float, t1: float) -> list[tuple[float, int, int, int, int]]:
        return [s for s in self.samples if t0 <= s[0] <= t1]


# ---- one run ----------------------------------------------------------------------------------------


async def _victims(args: argparse.Namespace, server: Server, deadline: float) -> list[Any]:
    ns = SimpleNamespace(http_addr=("127.0.0.1", server.http), grpc_addr=("127.0.0.1", server.grpc),
                         model=MODEL, input=INPUT, victim_timeout=30.0)
    victims = Victims(ns, np.arange(16, dtype=np.float32))
    stop_event = trio.Event()
    async with trio.open_nursery() as nursery:
        for proto in ("http", "grpc"):
            nursery.start_soon(victims.loop, stop_event, args.victim_interval, proto, None, deadline)
    return victims.samples


def _throughput(spans: list[tuple[float, float]], size: int, t0: float, t1: float) -> float:
    """MiB/s of request tensors inside [t0, t1], each request weighted by its part inside."""
    inside = 0.0
    for a, b in spans:
        overlap = min(b, t1) - max(a, t0)
        if overlap > 0:
            inside += overlap / max(b - a, 1e-9)
    return inside * size / MIB / (t1 - t0)


def one_run(args: argparse.Namespace, server: Server, proto: str, size: int, k: int) -> dict[str, Any]:
    fresh = server.kind != ""
    if fresh:
        start(server, args, raise_http_limit=(proto == "http" and size >= 64 * MIB))
    senders: list[subprocess.Popen] = []
    try:
        with Sampler(server.pid, args.sample_ms / 1000) as sampler:
            trio.run(_victims, args, server, time.monotonic() + 0.3)  # warm-up (first requests), not counted
            b0 = time.monotonic()
            baseline = trio.run(_victims, args, server, b0 + args.baseline)
            b1 = time.monotonic()
            port = server.http if proto == "http" else server.grpc
            pin = ["taskset", "-c", args.client_cpus] if args.client_cpus else []
            for _ in range(k):
                senders.append(subprocess.Popen(
                    pin + [sys.executable, os.path.abspath(__file__), "--sender", proto, f"127.0.0.1:{port}", str(size)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True))
            for p in senders:
                assert p.stdout is not None
                line = p.stdout.readline()
                if line.strip() != "READY":
                    raise RuntimeError(f"a sender did not start: {line!r}")
            t0 = time.monotonic() + 0.2
            t1 = t0 + args.seconds  # the large requests alone until t1, then the victims too until t2
            t2 = t1 + args.victim_seconds
            for p in senders:
                assert p.stdin is not None
                p.stdin.write(f"{t0} {t2}\n")
                p.stdin.flush()
            time.sleep(max(0.0, t0 - time.monotonic()))
            c0 = _tree_cpu(server.pid)
            time.sleep(max(0.0, t1 - time.monotonic()))
            c1, c1_at = _tree_cpu(server.pid), time.monotonic()
            loaded = trio.run(_victims, args, server, t2)
            results = []
            for p in senders:
                out, _ = p.communicate(timeout=args.seconds + args.victim_seconds + 300)
                results.append(json.loads(out.strip().splitlines()[-1]))
            t_done = time.monotonic()
            time.sleep(1.0)
            after = sampler.samples[-1][1] if sampler.samples else 0
    finally:
        for p in senders:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if fresh:
            stop(server)
    idle = statistics.median(s[1] for s in sampler.between(b0, b1))
    load = sampler.between(t0, t_done)
    peak = max(s[1] for s in load)
    peak_shm = max(s[2] for s in load)
    hwm = max(s[3] for s in load)  # each process's own high-water mark: no peak between samples is missed
    idle_once = statistics.median(s[4] for s in sampler.between(b0, b1))
    peak_once = max(s[4] for s in load)
    spans = [tuple(s) for r in results for s in r["spans"]]
    lat = sorted((b - a) * 1000 for a, b in spans)
    errors = [e for r in results for e in r["errors"]]
    row: dict[str, Any] = {
        "server": server.name, "proto": proto, "size_mib": size // MIB, "k": k, "requests": len(spans),
        "mib_s": _throughput(spans, size, t0, t1), "mib_s_victims": _throughput(spans, size, t1, t2),
        "p50_ms": lat[len(lat) // 2] if lat else float("nan"),
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
        "rss_idle_mib": idle / 1024, "rss_peak_mib": peak / 1024, "shm_peak_mib": peak_shm / 1024,
        "rss_per_req_mib": (peak - idle) / 1024 / k, "rss_after_mib": after / 1024,
        "hwm_per_req_mib": (hwm - idle) / 1024 / k, "shm_once_per_req_mib": (peak_once - idle_once) / 1024 / k,
        "server_cpu_pct": 100 * (c1 - c0) / max(c1_at - t0, 1e-9),
        "server_ms_per_mib": 1000 * (c1 - c0) / max(_throughput(spans, size, t0, c1_at) * (c1_at - t0), 1e-9),
        "client_cpu_pct": 100 * sum(r["cpu"] for r in results) / (t2 - t0),
        "errors": len(errors), "error_examples": sorted(set(errors))[:3], "samples": len(load)}
    for phase, samples in (("idle", baseline), ("load", loaded)):
        for vproto in ("http", "grpc"):
            st = latency_stats(samples, vproto)
            row[f"victim_{vproto}_{phase}"] = st
            row["errors"] += st["failed"]
    return row


# ---- table ------------------------------------------------------------------------------------------


def _victim(rows: list[dict[str, Any]], proto: str) -> str:
    def med(phase: str, key: str) -> float:
        """The median over the rounds (p99), the largest (max)."""
        vals = [r[f"victim_{proto}_{phase}"][key] for r in rows if r[f"victim_{proto}_{phase}"][key] is not None]
        if not vals:
            return float("nan")
        return max(vals) if key == "max_ms" else statistics.median(vals)

    return f"{med('load', 'p99_ms'):.1f} / {med('load', 'max_ms'):.0f} ({med('idle', 'p99_ms'):.1f} / {med('idle', 'max_ms'):.0f})"


def table(all_rows: list[dict[str, Any]]) -> str:
    lines = ["| server | proto | size | k | MiB/s (with victims) | p50 / p99 ms | RSS per in-flight req MiB (x size) [shm once] | RSS idle -> peak -> after MiB "
             "| server / client CPU % [server ms/MiB] | victim HTTP p99 / max ms (idle) | victim gRPC p99 / max ms (idle) | requests | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys: list[tuple[str, str, int, int]] = []
    for r in all_rows:
        key = (r["server"], r["proto"], r["size_mib"], r["k"])
        if key not in keys:
            keys.append(key)
    keys.sort(key=lambda x: (x[1], x[2], x[3]))
    for key in keys:
        rows = [r for r in all_rows if (r["server"], r["proto"], r["size_mib"], r["k"]) == key]

        def med(name: str, rows: list[dict[str, Any]] = rows) -> float:
            return statistics.median(r[name] for r in rows)

        per = med("rss_per_req_mib")
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} MiB | {key[3]} | {med('mib_s'):.0f} ({med('mib_s_victims'):.0f}) | {med('p50_ms'):.0f} / {med('p99_ms'):.0f} "
            f"| {per:.0f} ({per / key[2]:.1f}x) [{med('shm_once_per_req_mib'):.0f}] | {med('rss_idle_mib'):.0f} -> {med('rss_peak_mib'):.0f} -> "
            f"{med('rss_after_mib'):.0f} | {med('server_cpu_pct'):.0f} / {med('client_cpu_pct'):.0f} [{med('server_ms_per_mib'):.2f}] "
            f"| {_victim(rows, 'http')} | {_victim(rows, 'grpc')} | {sum(r['requests'] for r in rows)} "
            f"| {sum(r['errors'] for r in rows)} |")
    names = list(dict.fromkeys(k[0] for k in keys))
    if len(names) > 1:
        lines.append("")
        for proto, size, k in dict.fromkeys((x[1], x[2], x[3]) for x in keys):
            meds = {n: {m: statistics.median(r[m] for r in all_rows if (r["server"], r["proto"], r["size_mib"], r["k"])
                                           == (n, proto, size, k))
                        for m in ("mib_s", "server_ms_per_mib", "rss_per_req_mib")} for n in names}
            a = meds[names[0]]
            lines.append(f"{proto} {size} MiB k={k}: " + "; ".join(
                f"{names[0]}/{n} MiB/s {a['mib_s'] / meds[n]['mib_s']:.2f}x, server ms/MiB "
                f"{a['server_ms_per_mib'] / meds[n]['server_ms_per_mib']:.2f}x, RSS per request "
                f"{a['rss_per_req_mib'] / max(meds[n]['rss_per_req_mib'], 1e-9):.2f}x" for n in names[1:]))
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--sender":
        sender(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="16 MiB, k=1, 1 round, 1 s runs: does it run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds of large requests alone per run")
    ap.add_argument("--victim-seconds", type=float, default=4.0, help="then seconds of large requests and victims")
    ap.add_argument("--baseline", type=float, default=2.0, help="victim-only seconds before each run")
    ap.add_argument("--sizes", default=None, help="tensor sizes in MiB (default 16,64; --quick: 16)")
    ap.add_argument("--ks", default=None, help="concurrent senders (default 1,4; --quick: 1)")
    ap.add_argument("--trident-ports", default="9440:9441", help="HTTP:GRPC of the trident this starts")
    ap.add_argument("--triton-ports", default="9450:9451", help="HTTP:GRPC of the Triton this starts (metrics: GRPC+1)")
    ap.add_argument("--protos", default="http,grpc")
    ap.add_argument("--victim-interval", type=float, default=0.0, help="pause between a victim's requests (s)")
    ap.add_argument("--sample-ms", type=float, default=5.0)
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--repo", default="/tmp/anchors/triton-repo")
    ap.add_argument("--trident-python", default="/work/main/.venv/bin/python")
    ap.add_argument("--triton-venv", default="/tmp/anchors/venv-triton")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--out", default="", help="also append one JSON line per run here")
    ap.add_argument("servers", nargs="*",
                    help="NAME=HTTP:GRPC:PID of running servers (default: start trident and Triton, see the ports)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.victim_seconds, args.baseline = 1, 1.0, 1.0, 0.5
    args.sizes = args.sizes or ("16" if args.quick else "16,64")
    args.ks = args.ks or ("1" if args.quick else "1,4")
    if args.servers:
        servers = []
        for spec in args.servers:
            name, ports = spec.split("=", 1)
            http, grpc, pid = (int(x) for x in ports.split(":"))
            servers.append(Server(name, http, grpc, pid))
    else:
        servers = [Server(kind, *(int(x) for x in ports.split(":")), kind=kind)
                   for kind, ports in (("trident", args.trident_ports), ("triton", args.triton_ports))]
    args.work = tempfile.mkdtemp(prefix="bench-large-")
    rows: list[dict[str, Any]] = []
    out = open(args.out, "a") if args.out else None  # noqa: SIM115 - lines flushed as they come
    try:
        for proto in args.protos.split(","):
            for size in (int(x) * MIB for x in args.sizes.split(",")):
                for k in (int(x) for x in args.ks.split(",")):
                    for _round in range(args.rounds):
                        for server in servers:
                            row = one_run(args, server, proto, size, k)
                            rows.append(row)
                            if out:
                                out.write(json.dumps(row) + "\n")
                                out.flush()
                            print(f"# {server.name} {proto} {size // MIB} MiB k={k}: {row['mib_s']:.0f} MiB/s, "
                                  f"p99 {row['p99_ms']:.0f} ms, RSS/req {row['rss_per_req_mib']:.0f} MiB, "
                                  f"after {row['rss_after_mib'] - row['rss_idle_mib']:+.0f} MiB, "
                                  f"errors {row['errors']} {row['error_examples']}", file=sys.stderr, flush=True)
    finally:
        for server in servers:
            stop(server)
        if out:
            out.close()
        shutil.rmtree(args.work, ignore_errors=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
