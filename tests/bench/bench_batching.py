"""Dynamic batching benchmark (run by hand; not collected by pytest).

A Python model whose execution costs ``A + B x batch`` seconds (``time.sleep``, which releases
the GIL like a numpy or ONNX kernel) is served twice by ``trident serve``: without a scheduler
(each request runs alone) and with ``dynamic_batching`` (max batch 16, ``max_queue_delay``
D). tritonclient's gRPC aio client drives closed-loop load at concurrency 1..128 and
reports throughput and latency percentiles. The model's offline throughput at max batch size
is measured in the same run by calling one loaded instance directly with batches of 16, and
batching-on throughput is reported as a fraction of it (goal: 0.9 or more at high
concurrency). At concurrency 1 the p99 latency is compared with D plus one execution of a
batch of 1.

    .venv/bin/python tests/bench/bench_batching.py [--seconds 3] [--a-ms 20] [--b-ms 2] [--delay-us 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

MODEL_PY = '''
import json
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.a = float(params["a_ms"]["string_value"]) / 1000
        self.b = float(params["b_ms"]["string_value"]) / 1000

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        time.sleep(self.a + self.b * sum(x.shape[0] for x in xs))  # releases the GIL
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]) for x in xs]
'''

MAX_BATCH = 16
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128)


def write_repo(root: Path, a_ms: float, b_ms: float, delay_us: int) -> None:
    for name, scheduling in (("cost_off", ""),
                             ("cost_on", f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}")):
        folder = root / name
        (folder / "1").mkdir(parents=True)
        (folder / "1" / "model.py").write_text(MODEL_PY)
        (folder / "config.pbtxt").write_text(f'''
backend: "python"
max_batch_size: {MAX_BATCH}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "a_ms" value {{ string_value: "{a_ms}" }} }}
parameters {{ key: "b_ms" value {{ string_value: "{b_ms}" }} }}
{scheduling}
''')


def offline(repo: Path, seconds: float) -> tuple[float, float]:
    """Inferences/s of one instance executing batches of MAX_BATCH back to back, and the median
    time of one execution of a batch of 1, in ms (the instance called directly: no server path)."""
    import trio

    from trident.options import ServerOptions
    from trident.server import open_server
    from trident.types import InferenceRequest, Tensor

    async def main() -> tuple[float, float]:
        opts = ServerOptions(model_repositories=[str(repo)], model_control_mode="explicit", load_models=["cost_on"])
        async with open_server(opts) as server:
            instance = server.repository.get("cost_on").instances[0]
            x = np.zeros((1, 4), np.float32)
            batch = [InferenceRequest("cost_on", [Tensor.from_numpy("X", x)]) for _ in range(MAX_BATCH)]
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                await trio.to_thread.run_sync(instance.execute, batch)
                done += MAX_BATCH
            throughput = done / (time.perf_counter() - start)
            single = []
            for _ in range(20):
                t0 = time.perf_counter()
                await trio.to_thread.run_sync(instance.execute, batch[:1])
                single.append(1000 * (time.perf_counter() - t0))
            return throughput, statistics.median(single)

    return trio.run(main)


async def closed_loop(url: str, model: str, concurrency: int, seconds: float, warmup: float,
                      protocol: str = "grpc") -> dict[str, float]:
    if protocol == "grpc":
        import tritonclient.grpc.aio as aioclient
    else:
        import tritonclient.http.aio as aioclient  # type: ignore[no-redef]

    client = aioclient.InferenceServerClient(url) if protocol == "grpc" else aioclient.InferenceServerClient(
        url, conn_limit=max(concurrency, 1))
    inp = aioclient.InferInput("X", [1, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 4), np.float32))
    loop = asyncio.get_running_loop()
    begin = loop.time() + warmup
    end = begin + seconds
    samples: list[float] = []

    async def worker() -> None:
        while loop.time() < end:
            t0 = loop.time()
            await client.infer(model, [inp])
            t1 = loop.time()
            if begin <= t1 <= end:  # completed in the window (its latency may start before it)
                samples.append(t1 - t0)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    lat = sorted(samples) or [float("nan")]
    return {
        "concurrency": concurrency,
        "throughput": len(samples) / seconds,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window per point")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--a-ms", type=float, default=20.0, help="fixed cost per execution")
    parser.add_argument("--b-ms", type=float, default=2.0, help="cost per batch element")
    parser.add_argument("--delay-us", type=int, default=5000, help="max_queue_delay_microseconds")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--switch-interval-ms", type=float, default=0.0,
                        help="run the server with sys.setswitchinterval(this) (0: Python's default 5 ms)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="load generator's protocol")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from e2e.conftest import start_server

    with tempfile.TemporaryDirectory(prefix="trident-bench-") as tmp:
        repo = Path(tmp)
        write_repo(repo, args.a_ms, args.b_ms, args.delay_us)
        offline_rate, exec1_ms = offline(repo, args.seconds)
        env = {}
        if args.switch_interval_ms:  # a sitecustomize on the server's path sets the GIL switch interval
            site = repo / "_site"
            site.mkdir()
            (site / "sitecustomize.py").write_text(f"import sys\nsys.setswitchinterval({args.switch_interval_ms / 1000})\n")
            env["PYTHONPATH"] = str(site)
        server = start_server("--allow-metrics=false", repo=repo, env=env)
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        try:
            results: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
            for mode in ("off", "on"):
                for c in levels:
                    r = asyncio.run(closed_loop(url, f"cost_{mode}", c, args.seconds, args.warmup, args.protocol))
                    results[mode].append(r)
                    print(f"batching {mode:3} concurrency {c:4}: {r['throughput']:8.1f} infer/s  "
                          f"p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms", flush=True)
        finally:
            server.stop()

    bound_ms = args.delay_us / 1000 + exec1_ms
    print()
    print(f"model cost: {args.a_ms} ms + {args.b_ms} ms x batch; max batch {MAX_BATCH}; "
          f"max_queue_delay {args.delay_us} us; one instance")
    print(f"offline throughput at batch {MAX_BATCH}: {offline_rate:.1f} infer/s "
          f"(ideal {1000 * MAX_BATCH / (args.a_ms + args.b_ms * MAX_BATCH):.1f}); one execution of batch 1: "
          f"{exec1_ms:.1f} ms")
    print("| concurrency | batching off (infer/s) | batching on (infer/s) | on / offline | p99 on (ms) |")
    print("|---:|---:|---:|---:|---:|")
    for off, on in zip(results["off"], results["on"], strict=True):
        print(f"| {on['concurrency']:.0f} | {off['throughput']:.1f} | {on['throughput']:.1f} | "
              f"{on['throughput'] / offline_rate:.2f} | {on['p99_ms']:.1f} |")
    light, plain = results["on"][0], results["off"][0]
    print(f"light load (concurrency {light['concurrency']:.0f}): p99 {light['p99_ms']:.1f} ms (p50 {light['p50_ms']:.1f}) "
          f"vs max_queue_delay + one execution = {bound_ms:.1f} ms; without batching p99 {plain['p99_ms']:.1f} ms "
          f"(p50 {plain['p50_ms']:.1f}) vs one execution {exec1_ms:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"offline": offline_rate, "exec1_ms": exec1_ms, "bound_ms": bound_ms,
                                               **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
