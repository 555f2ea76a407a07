"""What naming the request in log lines costs per request (run by hand; not collected by pytest).

The front ends set one context variable per request (trident.observability.logs.serving) and
reset it after; nothing is formatted unless a line is written. Measured here, in one process:

1. ``contextvar``: one ``ContextVar.set`` and ``reset`` pair, alone.
2. ``http``: ``InferEndpoint.handle`` for a small JSON request to ``identity_fp32`` (the bundled
   example, run inline), on an in-process server, in interleaved rounds: with the context
   variable as shipped, with it replaced by a no-op (what the request paid before), and with
   a fresh ``traceparent`` header on every request (its scan and parse).
3. ``grpc``: ``InferenceService._trace_context`` for a call without a ``traceparent`` (the
   header tuple seen before: one dict lookup), and for a fresh one per call.

    .venv/bin/python tests/bench/bench_log_context.py [--requests 500] [--rounds 101]

The rounds interleave the variants (A B C A B C ...) so that a busy machine affects each alike;
the best round of each is the figure least disturbed by other processes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
from typing import Any

import trio

from trident.http import infer
from trident.http.infer import InferEndpoint
from trident.options import ServerOptions
from trident.server import open_server

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": [1.0] * 16}]}).encode()
HEADERS = ((b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
           (b"content-length", str(len(BODY)).encode()))


class NoContext:
    """The context variable's place, doing nothing: the request as it was before."""

    def set(self, value: Any) -> None:
        return None

    def reset(self, token: Any) -> None:
        return None


def contextvar_ns(n: int = 1_000_000) -> float:
    """ns of one set and reset (the loop's own cost, measured with an empty statement, taken off)."""
    setup = "import contextvars; var = contextvars.ContextVar('bench', default=None); value = object()"
    pair = min(timeit.repeat("var.reset(var.set(value))", setup, number=n, repeat=7))
    empty = min(timeit.repeat("pass", setup, number=n, repeat=7))
    return (pair - empty) / n * 1e9


async def http_rounds(requests: int, rounds: int) -> dict[str, list[float]]:
    options = ServerOptions(allow_metrics=False)
    results: dict[str, list[float]] = {"as shipped": [], "no context": [], "traceparent": []}
    async with open_server(options) as server:
        endpoint = InferEndpoint(server)

        def run(request: Any, heavy: bool) -> Any:
            return server.infer_now(request)

        async def measure(variant: str) -> float:
            infer.serving = NoContext() if variant == "no context" else real  # type: ignore[assignment]
            traced = variant == "traceparent"
            start = time.perf_counter_ns()
            for i in range(requests):
                headers = HEADERS
                if traced:  # what a traced client sends: a new traceparent each time
                    headers = (*HEADERS, (b"traceparent", b"00-0af7651916cd43dd8448eb211c8%05x-b7ad6b7169203331-01" % i))
                status, _, _ = await endpoint.handle(headers, BODY, run, "identity_fp32", "")  # type: ignore[misc]
                assert status == 200
            return (time.perf_counter_ns() - start) / requests / 1000

        real = infer.serving
        try:
            for variant in results:  # warm up
                await measure(variant)
            order = list(results)
            for r in range(rounds):
                for variant in order[r % 3:] + order[:r % 3]:  # each variant first as often as the others
                    results[variant].append(await measure(variant))
        finally:
            infer.serving = real
    return results


def grpc_ns(n: int = 200_000) -> tuple[float, float]:
    from trident.grpc.service import InferenceService

    class Server:
        options = ServerOptions()

    class Call:
        headers: tuple[tuple[bytes, bytes], ...] = ((b":path", b"/inference.GRPCInferenceService/ModelInfer"),
                                                    (b"content-type", b"application/grpc"), (b"te", b"trailers"))

    service = InferenceService(Server())  # type: ignore[arg-type]
    plain = Call()
    hit = min(timeit.repeat(lambda: service._trace_context(plain), number=n, repeat=5)) / n * 1e9  # type: ignore[arg-type]
    calls = []
    for i in range(n):
        c = Call()
        c.headers = (*Call.headers, (b"traceparent", b"00-0af7651916cd43dd8448eb211c8%05x-b7ad6b7169203331-01" % i))
        calls.append(c)
    it = iter(calls)
    fresh = min(timeit.repeat(lambda: service._trace_context(next(it)), number=n // 5, repeat=5)) / (n // 5) * 1e9
    return hit, fresh


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=500, help="requests per round and variant")
    parser.add_argument("--rounds", type=int, default=101)
    args = parser.parse_args()
    print(f"contextvar set + reset: {contextvar_ns():.0f} ns")
    results = trio.run(http_rounds, args.requests, args.rounds)
    base = results["no context"]
    for variant, times in results.items():
        # rounds are interleaved: the difference with the no-context round next to it cancels
        # the machine's drift; its median is the figure
        paired = statistics.median(t - b for t, b in zip(times, base, strict=True))
        print(f"http handle, {variant:>11}: median {statistics.median(times):.2f} µs/request, best round "
              f"{min(times):.2f}; {paired:+.3f} µs against no context (median of paired rounds)")
    hit, fresh = grpc_ns()
    print(f"grpc trace context: {hit:.0f} ns without a traceparent (header tuple seen before), "
          f"{fresh:.0f} ns with a fresh one")


if __name__ == "__main__":
    main()
