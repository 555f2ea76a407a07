"""What one call costs through the in-process API (run by hand; not collected by pytest).

One request in flight at a time to a small Python model of the bundled example repository
(``identity_fp32``: 4 FP32 values; ``add_sub``: two 1x16 FP32 inputs), per call: the wall time
and this process's CPU time (every thread: the server's and the caller's), in interleaved
rounds, each mode in turn:

1. ``open_server``: ``await server.infer(request)`` in a trio task of ``trident.open_server``'s
   own loop, in this thread: no thread hop, the floor the API stands on;
2. ``sync``: ``list(model.infer(inputs=...))`` of ``trident.tritonserver`` from the main thread
   (the server runs on its own thread: two hops a call);
3. ``asyncio``: ``[r async for r in model.async_infer(inputs=...)]`` inside ``asyncio.run``;
4. ``http``: tritonclient.http's synchronous client in another process, against
   ``trident.tritonfrontend.KServeHttp`` started over the same in-process server (the client's
   wall time per call; the CPU column is this process's, the server's side).

    .venv/bin/python tests/bench/bench_tritonserver_api.py [--requests 2000] [--rounds 5]

The figure of each mode is its median round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import trio

import trident
import trident.tritonserver as tritonserver
from trident.options import EXAMPLE_REPOSITORY
from trident.tritonfrontend import KServeHttp

INPUTS = {
    "identity_fp32": {"INPUT0": np.ones(4, np.float32)},
    "add_sub": {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)},
}

CLIENT = '''
import sys, time
import numpy as np
import tritonclient.http as httpclient
port, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
arrays = {"identity_fp32": {"INPUT0": np.ones(4, np.float32)},
          "add_sub": {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}}[model]
client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
inputs = []
for name, a in arrays.items():
    i = httpclient.InferInput(name, list(a.shape), "FP32")
    i.set_data_from_numpy(a, binary_data=True)
    inputs.append(i)
for _ in range(200):
    client.infer(model, inputs)
start = time.perf_counter()
for _ in range(n):
    client.infer(model, inputs)
print((time.perf_counter() - start) / n * 1e6)
'''


def timed(n: int, run: Callable[[], None]) -> tuple[float, float]:
    """(wall µs, CPU µs) per call of ``run`` doing ``n`` calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6


def open_server_round(model: str, n: int) -> tuple[float, float]:
    result: list[tuple[float, float]] = []

    async def main() -> None:
        options = trident.ServerOptions(model_repositories=[str(EXAMPLE_REPOSITORY)], busy_poll_us=0)
        async with trident.open_server(options) as server:
            def request() -> trident.InferenceRequest:
                return trident.InferenceRequest(model, [trident.Tensor.from_numpy(k, v) for k, v in INPUTS[model].items()])

            for _ in range(200):
                await server.infer(request())
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                await server.infer(request())
            result.append(((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6))

    trio.run(main)
    return result[0]


def sync_round(server: tritonserver.Server, model: str, n: int) -> tuple[float, float]:
    m = server.model(model)
    for _ in range(200):
        list(m.infer(inputs=INPUTS[model]))

    def run() -> None:
        for _ in range(n):
            list(m.infer(inputs=INPUTS[model]))

    return timed(n, run)


def asyncio_round(server: tritonserver.Server, model: str, n: int) -> tuple[float, float]:
    m = server.model(model)

    async def calls(count: int) -> None:
        for _ in range(count):
            [r async for r in m.async_infer(inputs=INPUTS[model])]

    asyncio.run(calls(200))
    return timed(n, lambda: asyncio.run(calls(n)))


def http_round(port: int, model: str, n: int) -> tuple[float, float]:
    cpu = time.process_time()
    done = subprocess.run([sys.executable, "-c", CLIENT, str(port), model, str(n)], capture_output=True, text=True,
                          check=True)
    client_cpu = time.process_time() - cpu
    return float(done.stdout.strip()), client_cpu / (n + 200) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    n = args.requests
    server = tritonserver.Server(model_repository=str(EXAMPLE_REPOSITORY)).start(wait_until_ready=True)
    http = KServeHttp(server, KServeHttp.Options(address="127.0.0.1", port=0))
    http.start()
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for model in INPUTS:
                results.setdefault(("open_server", model), []).append(open_server_round(model, n))
                results.setdefault(("sync", model), []).append(sync_round(server, model, n))
                results.setdefault(("asyncio", model), []).append(asyncio_round(server, model, n))
                results.setdefault(("http", model), []).append(http_round(http.port, model, n))
    finally:
        http.stop()
        server.stop()
    print(f"{'mode':<12} {'model':<14} {'wall µs/call':>13} {'CPU µs/call':>12}   (median of {args.rounds} rounds "
          f"of {n} sequential calls)")
    for (mode, model), rounds in results.items():
        wall = statistics.median(r[0] for r in rounds)
        cpu = statistics.median(r[1] for r in rounds)
        print(f"{mode:<12} {model:<14} {wall:>13.1f} {cpu:>12.1f}")


if __name__ == "__main__":
    main()
