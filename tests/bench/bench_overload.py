"""Load shedding under overload: a queue-delay target on vs off at several times the sustainable rate.

Not collected by pytest. Starts ``trident serve`` on 127.0.0.1 over two copies of a Python model
that sleeps ``--service-ms`` per request on one instance: ``on`` with
``TRIDENT_QUEUE_DELAY_TARGET_US`` = ``--target-ms``, ``off`` without. Then, in one run:

1. unloaded: one client, one request at a time, ``--unloaded`` requests to ``off``: p50/p99 and
   the sustainable rate (1 / mean latency); measured again after each overload phase (the
   machine's load changes: the ratio uses the median of the run's unloaded p99s);
2. for ``on`` then ``off``: an open-loop tritonclient aio HTTP client fires ``--factor`` x the
   sustainable rate for ``--seconds`` (each request at its scheduled time, latency from that time,
   so a slow server is not hidden by a slow client); admitted p50/p99, refused count, the
   server's CPU (/proc, the model's own sleep takes none) and RSS before/after; then one more
   request alone (recovery).

Server CPU per refused request, two ways: (phase CPU - admitted x the unloaded CPU per request) /
refused (an estimate: the unloaded CPU per request includes the loop's busy polling between
requests, so it may run low), and phase CPU / every request of the phase (an upper bound as long
as a refusal costs no more than an answered request).

    python tests/bench/bench_overload.py [--service-ms 20] [--target-ms 20] [--factor 5] \\
        [--seconds 10] [--unloaded 100]

The issue's target: admitted p99 <= 2x unloaded p99, refused < 1 ms of server CPU, RSS flat,
the request after the burst admitted.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.proc_stats import cpu_seconds  # noqa: E402
from tests.e2e.conftest import start_server  # noqa: E402
from tests.e2e.models import write_model  # noqa: E402

MODEL_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            time.sleep({service_s})
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return out
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{param}'''


def rss_mib(pid: int) -> float:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) / 1024 if m else 0.0


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def unloaded(url: str, count: int) -> list[float]:
    client = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], np.float32))
    latencies = []
    try:
        for _ in range(3):
            client.infer("off", [x])
        for _ in range(count):
            t0 = time.perf_counter()
            client.infer("off", [x])
            latencies.append((time.perf_counter() - t0) * 1000)
    finally:
        client.close()
    return latencies


async def open_loop(url: str, model: str, rate: float, seconds: float) -> tuple[list[float], int, int]:
    """Fire ``rate`` requests a second for ``seconds``: (admitted latencies in ms, refused, failed)."""
    admitted: list[float] = []
    refused = failed = 0
    async with httpaio.InferenceServerClient(url, conn_limit=2000) as client:
        async def one(i: int, at: float) -> None:
            nonlocal refused, failed
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            x = httpaio.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.array([i], np.float32))
            try:
                result = await client.infer(model, [x])
            except InferenceServerException as e:
                if e.status() == "503":
                    refused += 1
                else:
                    failed += 1
                return
            if result.as_numpy("Y").tolist() != [2.0 * i]:
                failed += 1
                return
            admitted.append((time.perf_counter() - at) * 1000)

        start = time.perf_counter() + 0.2
        total = int(rate * seconds)
        await asyncio.gather(*(one(i, start + i / rate) for i in range(total)))
    return admitted, refused, failed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--service-ms", type=float, default=20.0)
    p.add_argument("--target-ms", type=float, default=20.0)
    p.add_argument("--factor", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--unloaded", type=int, default=100)
    args = p.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    target_us = int(args.target_ms * 1000)
    for name, param in (("on", f'parameters {{ key: "TRIDENT_QUEUE_DELAY_TARGET_US" value {{ string_value: '
                                f'"{target_us}" }} }}'), ("off", "")):
        write_model(repo, name, CONFIG.format(name=name, param=param),
                    MODEL_PY.format(service_s=args.service_ms / 1000))
    server = start_server(repo=repo)
    pid = server.proc.pid
    try:
        cpu0 = cpu_seconds(pid)
        base = unloaded(server.http_url, args.unloaded)
        cpu_per_request = (cpu_seconds(pid) - cpu0) / (len(base) + 3)
        rate = 1000.0 / float(np.mean(base)) * args.factor
        print(f"unloaded ({args.unloaded} requests, one at a time): p50 {pct(base, 50):.1f} ms, "
              f"p99 {pct(base, 99):.1f} ms, sustainable ~{1000.0 / float(np.mean(base)):.0f} req/s, "
              f"server CPU {cpu_per_request * 1e6:.0f} us/request")
        baselines = [pct(base, 99)]
        print(f"offered load: {rate:.0f} req/s ({args.factor:g}x) for {args.seconds:g} s, "
              f"target {args.target_ms:g} ms on 'on'\n")
        header = (f"{'target':>7} {'offered':>7} {'admitted':>8} {'refused':>7} {'failed':>6} {'p50 ms':>8} "
                  f"{'p99 ms':>8} {'p99/unl':>7} {'CPU s':>6} {'us/refused':>10} {'us/req all':>10} {'RSS MiB':>15} "
                  f"{'after ms':>8}")
        rows = []
        for model in ("on", "off"):
            rss0, c0 = rss_mib(pid), cpu_seconds(pid)
            t0 = time.perf_counter()
            admitted, refused, failed = asyncio.run(open_loop(server.http_url, model, rate, args.seconds))
            took = time.perf_counter() - t0
            cpu = cpu_seconds(pid) - c0
            rss1 = rss_mib(pid)
            t1 = time.perf_counter()
            after = unloaded_one(server.http_url, model)
            after_ms = (time.perf_counter() - t1) * 1000 if after else float("nan")
            per_refused = (cpu - len(admitted) * cpu_per_request) / refused * 1e6 if refused else float("nan")
            rows.append((model, f"{int(rate * args.seconds):>7} {len(admitted):>8} {refused:>7} {failed:>6} "
                         f"{pct(admitted, 50):>8.1f} {pct(admitted, 99):>8.1f} ", pct(admitted, 99),
                         f" {cpu:>6.2f} {per_refused:>10.0f} {cpu / (len(admitted) + refused) * 1e6:>10.0f} {rss0:>7.1f}->{rss1:<7.1f} {after_ms:>8.1f}   "
                         f"(run took {took:.1f} s)"))
            again = unloaded(server.http_url, args.unloaded)
            baselines.append(pct(again, 99))
            print(f"unloaded again after '{model}': p50 {pct(again, 50):.1f} ms, p99 {pct(again, 99):.1f} ms")
        worst = float(np.median(baselines))
        print(f"\nunloaded p99 over the run: {', '.join(f'{b:.1f}' for b in baselines)} ms "
              f"(ratio against the median, {worst:.1f})")
        print(header)
        for model, left, p99, right in rows:
            print(f"{model:>7} {left}{p99 / worst:>7.1f}{right}")
        print("\ncommand: python " + " ".join(shlex.quote(a) for a in sys.argv))
    finally:
        server.stop()


def unloaded_one(url: str, model: str) -> bool:
    """One request alone after the burst: answered (True) or refused."""
    client = httpclient.InferenceServerClient(url)
    try:
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.array([5.0], np.float32))
        return client.infer(model, [x]).as_numpy("Y").tolist() == [10.0]
    except InferenceServerException:
        return False
    finally:
        client.close()


if __name__ == "__main__":
    main()
