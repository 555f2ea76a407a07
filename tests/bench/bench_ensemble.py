"""What a 3-step ensemble costs against the client calling the three models itself.

Not collected by pytest. Run from the repository root:

    .venv/bin/python tests/bench/bench_ensemble.py [--iterations 2000] [--concurrency 8] [--taskset 0]

A repository is written at run time into a temporary folder: three Python-backend models
``step1`` (x + 1), ``step2`` (x * 2) and ``step3`` (x - 3), each FP32 ``INPUT`` [16] -> FP32
``OUTPUT`` [16], ``max_batch_size: 0``, one CPU instance, and the ensemble ``chain3``
(``platform: "ensemble"``, steps step1 -> step2 -> step3, so OUTPUT = (INPUT + 1) * 2 - 3).
Python models only, so the same repository loads in the real Triton (its Python backend).
The chain's result is checked over both protocols before anything is measured.

For each protocol (tritonclient.http with binary tensors, tritonclient.grpc), closed loop at
concurrency 1, three kinds of logical request are timed (client-observed, encode and decode
included; every call builds its input from a numpy array, as a client would):

(a) ``ensemble``: one call of ``chain3``;
(b) ``3 sequential``: step1, then step2 on its output, then step3 on that;
(c) ``one step``: one call of ``step1`` (the baseline cost of one plain call).

After a warmup (--warmup of each kind) the --iterations requests of each kind are split into
--rounds rounds that alternate the kinds (the order rotates each round), so machine noise hits
all of them alike. The table gives p50 / mean / p99 in ms, the ratio a / b, the ensemble's
added latency over one plain call (a - c) and what the client saves by using it (b - a), from
the medians and from the means.

With --concurrency C (0 turns it off), tritonclient.grpc.aio drives C concurrent closed loops
(asyncio.gather), again alternating ensemble and 3-sequential rounds, and reports logical
requests/s and p50 / p99 for each.

Server: by default ``trident serve`` is started on the temporary repository (127.0.0.1, free
ports; --taskset CPUS pins all its threads, and those of any child process, to CPUS once it has
started). ``--url-http HOST:PORT --url-grpc HOST:PORT`` measure an already-running server
instead (the real Triton, say); ``--write-repo DIR`` only writes the repository and exits, so
Triton can be started on it:

    .venv/bin/python tests/bench/bench_ensemble.py --write-repo /tmp/bench-ens/repo
    HTTP_PORT=18000 GRPC_PORT=18001 METRICS_PORT=18002 TRITON_WORK=/tmp/bench-ens/work \\
        bash /work/shared/bench/run_triton.sh /tmp/anchors/venv-triton /tmp/bench-ens/repo &
    .venv/bin/python tests/bench/bench_ensemble.py --url-http 127.0.0.1:18000 --url-grpc 127.0.0.1:18001
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/ for e2e.conftest

WIDTH = 16
STEPS = (("step1", "x + 1"), ("step2", "x * 2"), ("step3", "x - 3"))
ENSEMBLE = "chain3"
KINDS = ("ensemble", "3 sequential", "one step")

STEP_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", ({op}).astype(np.float32))]))
        return out
'''

STEP_CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''

ENSEMBLE_CONFIG = '''name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {width} ] }} ]
ensemble_scheduling {{
  step [
    {{
      model_name: "step1"
      model_version: -1
      input_map {{ key: "INPUT" value: "INPUT" }}
      output_map {{ key: "OUTPUT" value: "after_step1" }}
    }},
    {{
      model_name: "step2"
      model_version: -1
      input_map {{ key: "INPUT" value: "after_step1" }}
      output_map {{ key: "OUTPUT" value: "after_step2" }}
    }},
    {{
      model_name: "step3"
      model_version: -1
      input_map {{ key: "INPUT" value: "after_step2" }}
      output_map {{ key: "OUTPUT" value: "OUTPUT" }}
    }}
  ]
}}
'''


def write_repo(root: Path) -> Path:
    """Write step1..step3 and chain3 under root (created if missing); returns root."""
    for name, op in STEPS:
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "1" / "model.py").write_text(STEP_PY.replace("{op}", op))
        (root / name / "config.pbtxt").write_text(STEP_CONFIG.format(name=name, width=WIDTH))
    (root / ENSEMBLE / "1").mkdir(parents=True, exist_ok=True)  # an ensemble's version folder is empty
    (root / ENSEMBLE / "config.pbtxt").write_text(ENSEMBLE_CONFIG.format(name=ENSEMBLE, width=WIDTH))
    return root


def expected(x: np.ndarray) -> np.ndarray:
    return (x + 1) * 2 - 3


# ---- one logical request of each kind, per protocol --------------------------------------------


def http_calls(url: str) -> tuple[dict[str, Callable[[np.ndarray], np.ndarray]], Callable[[], None]]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    outputs = [httpclient.InferRequestedOutput("OUTPUT", binary_data=True)]

    def call(model: str, x: np.ndarray) -> np.ndarray:
        inp = httpclient.InferInput("INPUT", [WIDTH], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        return client.infer(model, [inp], outputs=outputs).as_numpy("OUTPUT")

    return _kinds(call), client.close


def grpc_calls(url: str) -> tuple[dict[str, Callable[[np.ndarray], np.ndarray]], Callable[[], None]]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT")]

    def call(model: str, x: np.ndarray) -> np.ndarray:
        inp = grpcclient.InferInput("INPUT", [WIDTH], "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp], outputs=outputs).as_numpy("OUTPUT")

    return _kinds(call), client.close


def _kinds(call: Callable[[str, np.ndarray], np.ndarray]) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    def sequential(x: np.ndarray) -> np.ndarray:
        for name, _ in STEPS:
            x = call(name, x)
        return x

    return {"ensemble": lambda x: call(ENSEMBLE, x), "3 sequential": sequential,
            "one step": lambda x: call("step1", x)}


def check(kinds: dict[str, Callable[[np.ndarray], np.ndarray]], protocol: str) -> None:
    """Raises AssertionError when the chain (ensemble or sequential) or one step is wrong."""
    x = np.arange(WIDTH, dtype=np.float32)
    for kind in ("ensemble", "3 sequential"):
        got = kinds[kind](x)
        assert got.shape == (WIDTH,) and np.array_equal(got, expected(x)), f"{protocol} {kind}: {got}"
    assert np.array_equal(kinds["one step"](x), x + 1), f"{protocol} one step"


def measure(kinds: dict[str, Callable[[np.ndarray], np.ndarray]], iterations: int, warmup: int,
            rounds: int) -> dict[str, list[float]]:
    """Latencies in ms of each kind: warmup, then rounds that alternate the kinds (order rotates)."""
    x = np.random.default_rng(0).random(WIDTH, dtype=np.float32)
    for kind in KINDS:
        for _ in range(warmup):
            kinds[kind](x)
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    per_round = [iterations // rounds + (1 if r < iterations % rounds else 0) for r in range(rounds)]
    for r, n in enumerate(per_round):
        for kind in KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]:
            fn, out = kinds[kind], samples[kind]
            for _ in range(n):
                t0 = time.perf_counter()
                fn(x)
                out.append((time.perf_counter() - t0) * 1e3)
    return samples


def p99(v: list[float]) -> float:
    return float(np.percentile(v, 99))


def latency_table(results: dict[str, dict[str, list[float]]], iterations: int, rounds: int) -> None:
    print(f"\n## Latency per logical request, concurrency 1 (ms; {iterations} of each kind in {rounds} "
          "interleaved rounds)\n")
    print("| protocol | kind | p50 | mean | p99 |")
    print("|---|---|---:|---:|---:|")
    for protocol, samples in results.items():
        for kind in KINDS:
            v = samples[kind]
            print(f"| {protocol} | {kind} | {statistics.median(v):.3f} | {statistics.fmean(v):.3f} | {p99(v):.3f} |")
    print("\n## Ensemble against the client's own calls (a = ensemble, b = 3 sequential, c = one step)\n")
    print("| protocol | statistic | a / b | added by the ensemble a - c (ms) | saved by the client b - a (ms) |")
    print("|---|---|---:|---:|---:|")
    for protocol, samples in results.items():
        for label, stat in (("p50", statistics.median), ("mean", statistics.fmean)):
            a, b, c = (stat(samples[kind]) for kind in KINDS)
            print(f"| {protocol} | {label} | {a / b:.3f} | {a - c:.3f} | {b - a:.3f} |")


# ---- throughput at concurrency C (gRPC aio) ----------------------------------------------------


async def concurrent(url: str, concurrency: int, iterations: int, warmup: int,
                     rounds: int) -> dict[str, tuple[list[float], float]]:
    """Latencies (ms) and the wall-clock seconds the timed rounds took, for ensemble and
    3-sequential requests at `concurrency` closed loops."""
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(url)
    outputs = [aioclient.InferRequestedOutput("OUTPUT")]
    x = np.random.default_rng(1).random(WIDTH, dtype=np.float32)

    async def call(model: str, x: np.ndarray) -> np.ndarray:
        inp = aioclient.InferInput("INPUT", [WIDTH], "FP32")
        inp.set_data_from_numpy(x)
        return (await client.infer(model, [inp], outputs=outputs)).as_numpy("OUTPUT")

    async def ensemble(x: np.ndarray) -> np.ndarray:
        return await call(ENSEMBLE, x)

    async def sequential(x: np.ndarray) -> np.ndarray:
        for name, _ in STEPS:
            x = await call(name, x)
        return x

    kinds = {"ensemble": ensemble, "3 sequential": sequential}

    async def loop(fn, n: int, out: list[float] | None) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            y = await fn(x)
            if out is not None:
                out.append((time.perf_counter() - t0) * 1e3)
        assert np.array_equal(y, expected(x))

    latency: dict[str, list[float]] = {kind: [] for kind in kinds}
    seconds = dict.fromkeys(kinds, 0.0)
    try:
        for fn in kinds.values():
            await asyncio.gather(*(loop(fn, max(1, warmup // concurrency), None) for _ in range(concurrency)))
        per_loop = max(1, iterations // (rounds * concurrency))
        for r in range(rounds):
            for kind in (list(kinds) if r % 2 == 0 else list(kinds)[::-1]):
                t0 = time.perf_counter()
                await asyncio.gather(*(loop(kinds[kind], per_loop, latency[kind]) for _ in range(concurrency)))
                seconds[kind] += time.perf_counter() - t0
    finally:
        await client.close()
    return {kind: (latency[kind], seconds[kind]) for kind in kinds}


def throughput_table(results: dict[str, tuple[list[float], float]], concurrency: int) -> None:
    print(f"\n## Throughput, gRPC aio, {concurrency} concurrent closed loops (logical requests)\n")
    print("| kind | requests/s | p50 (ms) | p99 (ms) |")
    print("|---|---:|---:|---:|")
    for kind, (v, secs) in results.items():
        print(f"| {kind} | {len(v) / secs:.0f} | {statistics.median(v):.3f} | {p99(v):.3f} |")
    e, s = (len(v) / secs for v, secs in results.values())
    print(f"\nensemble / 3 sequential throughput: {e / s:.2f}")


# ---- server ------------------------------------------------------------------------------------


def pin_tree(pid: int, cpus: set[int]) -> int:
    """Pin every thread of pid and of its descendants to cpus; returns how many threads."""
    count = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
            count += 1
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        children = (task / "children").read_text().split() if (task / "children").exists() else []
        count += sum(pin_tree(int(child), cpus) for child in children)
    return count


def describe(url_http: str) -> str:
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(url_http) as c:
        meta = c.get_server_metadata()
        ready = {m: c.is_model_ready(m) for m in (*(n for n, _ in STEPS), ENSEMBLE)}
    if not all(ready.values()):
        raise RuntimeError(f"models not ready: {ready}")
    return f"{meta['name']} {meta['version']}"


def run(args: argparse.Namespace, url_http: str, url_grpc: str, origin: str) -> None:
    print(f"server: {describe(url_http)} ({origin}; HTTP {url_http}, gRPC {url_grpc})")
    results: dict[str, dict[str, list[float]]] = {}
    for protocol, factory, url in (("HTTP", http_calls, url_http), ("gRPC", grpc_calls, url_grpc)):
        kinds, close = factory(url)
        try:
            check(kinds, protocol)
            results[protocol] = measure(kinds, args.iterations, args.warmup, args.rounds)
        finally:
            close()
    print("chain result checked over HTTP and gRPC: OUTPUT == (INPUT + 1) * 2 - 3")
    latency_table(results, args.iterations, args.rounds)
    if args.concurrency > 0:
        throughput_table(asyncio.run(concurrent(url_grpc, args.concurrency, args.iterations, args.warmup,
                                                args.rounds)), args.concurrency)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=2000, help="timed requests of each kind")
    parser.add_argument("--warmup", type=int, default=200, help="untimed requests of each kind first")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds the iterations are split into")
    parser.add_argument("--concurrency", type=int, default=8, help="gRPC aio throughput point (0: off)")
    parser.add_argument("--url-http", help="HOST:PORT of a running server (with --url-grpc): start none")
    parser.add_argument("--url-grpc", help="HOST:PORT of a running server (with --url-http)")
    parser.add_argument("--write-repo", type=Path, metavar="DIR", help="only write the repository to DIR and exit")
    parser.add_argument("--taskset", metavar="CPUS",
                        help="pin the started trident (all threads) to these CPUs, e.g. 0 or 0,1")
    args = parser.parse_args()
    if (args.url_http is None) != (args.url_grpc is None):
        parser.error("--url-http and --url-grpc go together")
    if args.taskset and args.url_http:
        parser.error("--taskset pins a server this script starts; prefix the other server's command with taskset")
    if args.iterations < args.rounds:
        parser.error("--iterations must be at least --rounds")

    if args.write_repo:
        write_repo(args.write_repo)
        print(f"wrote {', '.join(n for n, _ in STEPS)} and {ENSEMBLE} to {args.write_repo}")
        return 0

    print("command: " + shlex.join([sys.executable, *sys.argv]))
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())} ({os.cpu_count()} CPUs)")
    if args.url_http:
        run(args, args.url_http, args.url_grpc, "already running")
    else:
        from e2e.conftest import start_server

        with tempfile.TemporaryDirectory(prefix="trident-bench-ens-") as tmp:
            server = start_server("--log-verbose=0", "--allow-metrics=false", repo=write_repo(Path(tmp)), timeout=120)
            try:
                if args.taskset:
                    cpus = {int(c) for c in args.taskset.split(",")}
                    print(f"pinned {pin_tree(server.proc.pid, cpus)} server threads to CPUs {sorted(cpus)}")
                run(args, server.http_url, server.grpc_url, "trident serve started by this script")
            finally:
                server.stop()
    print(f"\nload average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
