"""Python backend figures: in-process (threads) against process-isolated execution.

1. ``throughput``: the same add_sub ``model.py`` (the bundled example) served by ``trident serve``
   twice, once per execution mode, each measured with the shared harness
   (``/work/shared/bench/v2bench.py run --cases addsub``: wrk over HTTP JSON, h2load over gRPC,
   concurrency 1, 8, 64, server pinned to CPU 0 and load generators to CPU 1). Prints the
   harness's markdown table. Real Triton on the same cases, same harness::

       SERVERS="triton trident" TRIDENT="$PWD/.venv/bin/trident" CASES=addsub \\
           bash /work/shared/bench/run_all.sh /tmp/anchors/pyb   # after bash /work/shared/bench/setup.sh

2. ``lag``: the event loop's wake-up lag while a pure-Python CPU-bound model runs, in an in-process
   ``open_server``: a trio task sleeps 1 ms in a loop and records how late it wakes, while
   clients keep the model busy (``sum(range(n))`` in Python, holding the GIL). Prints worst, p99
   and p50 lag for: no load, in-process model, isolated model.

Usage::

    .venv/bin/python tests/bench/bench_python_backend.py [throughput|lag|all] [--duration 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import trio

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(os.environ.get("TRIDENT_SHARED_BENCH", "/work/shared/bench"))
PROCESS = '\nparameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }\n'
SPIN_CONFIG = '''
name: "spin"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT64 dims: [ 1 ] } ]
'''
SPIN_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            total = 0
            for i in range(n):
                total += i
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", np.array([total], np.int64))]))
        return out
'''


def add_sub_repo(root: Path, mode: str) -> Path:
    from trident.options import EXAMPLE_REPOSITORY

    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", root / "add_sub")
    if mode == "process":
        config = root / "add_sub" / "config.pbtxt"
        config.write_text(config.read_text() + PROCESS)
    return root


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("trident exited before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("trident did not become ready")


def throughput(args: argparse.Namespace) -> None:
    harness = BENCH / "v2bench.py"
    if not harness.exists():
        sys.exit(f"the shared harness {harness} is missing (set TRIDENT_SHARED_BENCH)")
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-python-backend-")) / "results.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    ports = {"http": 28500, "grpc": 28501, "metrics": 28502}
    for mode in ("thread", "process"):
        work = Path(tempfile.mkdtemp(prefix=f"pyb-{mode}-"))
        repo = add_sub_repo(work / "repo", mode)
        cmd = ["taskset", "-c", args.server_cpus, sys.executable, "-m", "trident", "serve",
               "--model-repository", str(repo), "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
               "--metrics-address", "127.0.0.1", "--http-port", str(ports["http"]),
               "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"])]
        log = open(work / "server.log", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
        try:
            _wait_ready(f"http://127.0.0.1:{ports['http']}/v2/health/ready", proc)
            print(f"== trident-{mode} (pid {proc.pid}): {' '.join(cmd)}", flush=True)
            subprocess.run(
                [sys.executable, str(harness), "run", "--name", f"trident-{mode}", "--cases", "addsub",
                 "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
                 "--metrics-port", str(ports["metrics"]), "--duration", str(int(args.duration)),
                 "--conc", args.conc, "--client-cpus", args.client_cpus, "--server-pid", str(proc.pid),
                 "--quiet-wait", "20", "--out", str(out)],
                check=True,
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nresults: {out}\n")
    subprocess.run([sys.executable, str(harness), "table", str(out)], check=True)


async def _lag_run(mode: str | None, seconds: float, work: int, clients: int,
                   busy_poll_us: int) -> dict[str, float]:
    from trident.batching import rounds
    from trident.options import ServerOptions
    from trident.server import open_server
    from trident.types import InferenceRequest, Tensor

    root = Path(tempfile.mkdtemp(prefix="pyb-lag-"))
    try:
        (root / "spin" / "1").mkdir(parents=True)
        (root / "spin" / "config.pbtxt").write_text(SPIN_CONFIG + (PROCESS if mode == "process" else ""))
        (root / "spin" / "1" / "model.py").write_text(SPIN_MODEL)
        lags: list[float] = []
        served = 0
        rounds.current().busy_poll(busy_poll_us / 1e6)  # as `trident serve --busy-poll-us` does
        async with open_server(ServerOptions(model_repositories=[str(root)])) as server:
            async def client() -> None:
                nonlocal served
                while True:
                    request = InferenceRequest("spin", [Tensor.from_numpy("N", np.array([work], np.int64))])
                    await server.infer(request)
                    served += 1

            async with trio.open_nursery() as nursery:
                if mode is not None:
                    for _ in range(clients):
                        nursery.start_soon(client)
                await trio.sleep(0.5)  # warm up
                served = 0
                end = time.perf_counter() + seconds
                while time.perf_counter() < end:
                    before = time.perf_counter()
                    await trio.sleep(0.001)
                    lags.append(time.perf_counter() - before - 0.001)
                nursery.cancel_scope.cancel()
        lags.sort()
        return {"worst_ms": lags[-1] * 1e3, "p99_ms": lags[int(len(lags) * 0.99)] * 1e3,
                "p50_ms": lags[len(lags) // 2] * 1e3, "wakeups": len(lags), "model_req_per_s": served / seconds}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def lag(args: argparse.Namespace) -> None:
    rows = []
    for label, mode in (("no model load", None), ("in-process (thread)", "thread"), ("isolated (process)", "process")):
        result = trio.run(_lag_run, mode, args.duration, args.spin, args.clients, args.busy_poll_us)
        rows.append((label, result))
        print(json.dumps({"case": label, **{k: round(v, 3) for k, v in result.items()}}), flush=True)
    print(f"\nEvent-loop wake-up lag of a 1 ms trio sleep while {args.clients} client(s) keep a pure-Python model "
          f"busy (sum(range({args.spin})) per request), {args.duration} s each, "
          f"busy polling {args.busy_poll_us} us:\n")
    print("| execution | worst ms | p99 ms | p50 ms | model req/s |")
    print("|---|---|---|---|---|")
    for label, r in rows:
        print(f"| {label} | {r['worst_ms']:.2f} | {r['p99_ms']:.2f} | {r['p50_ms']:.3f} | {r['model_req_per_s']:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=["throughput", "lag", "all"], default="all")
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--conc", default="1,8,64")
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--out", default="")
    ap.add_argument("--spin", type=int, default=300_000, help="loop iterations per spin request")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--busy-poll-us", type=int, default=100, help="the server's --busy-poll-us (lag)")
    args = ap.parse_args()
    os.chdir(ROOT)
    if args.what in ("lag", "all"):
        lag(args)
    if args.what in ("throughput", "all"):
        throughput(args)


if __name__ == "__main__":
    main()
