"""Cost of metrics and tracing per request (run by hand; not collected by pytest).

Four ``trident serve`` processes on the bundled example repository run side by side and are
measured in interleaved rounds (A B C D A B C D ...), so that a noisy, shared machine affects
each configuration alike:

- ``base``: ``--allow-metrics=false``, tracing OFF
- ``metrics``: metrics on with ``summary_latencies`` and ``histogram_latencies``, /metrics
  scraped every second during the run
- ``trace1000``: ``--allow-metrics=false``, TIMESTAMPS tracing at Triton's default rate 1000
- ``trace1``: ``--allow-metrics=false``, TIMESTAMPS tracing of every request (log-frequency 1000)

Each round sends sequential HTTP (tritonclient) ``identity_fp32`` requests for ``--seconds``;
the report gives, per configuration, the median over the rounds of req/s and of the server
process's CPU time per request (user + system, from /proc: far less sensitive to a noisy
machine than req/s), each with its ratio to ``base``.

    .venv/bin/python tests/bench/bench_observability.py [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from e2e.conftest import start_server  # noqa: E402
from proc_stats import cpu_seconds  # noqa: E402 - tests/bench/proc_stats.py


def configs(trace_dir: Path) -> dict[str, tuple[str, ...]]:
    return {
        "base": ("--allow-metrics=false",),
        "metrics": ("--metrics-config", "summary_latencies=true", "--metrics-config", "histogram_latencies=true"),
        "trace1000": ("--allow-metrics=false", "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1000",
                      "--trace-config", f"triton,file={trace_dir / 't1000.json'}"),
        "trace1": ("--allow-metrics=false", "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                   "--trace-config", f"triton,file={trace_dir / 't1.json'}", "--trace-config",
                   "triton,log-frequency=1000"),
    }




def measure(url: str, seconds: float, pid: int) -> tuple[float, float]:
    """(req/s, server CPU µs per request) of sequential requests for ``seconds``."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("INPUT0", [16], "FP32")
    x.set_data_from_numpy(np.arange(16, dtype=np.float32))
    for _ in range(50):
        client.infer("identity_fp32", [x])
    n = 0
    cpu = cpu_seconds(pid)
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        client.infer("identity_fp32", [x])
        n += 1
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(pid) - cpu
    client.close()
    return n / elapsed, cpu / n * 1e6


def scraper(url: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        httpx.get(url)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        servers = {name: start_server(*flags) for name, flags in configs(Path(tmp)).items()}
        results: dict[str, list[float]] = {name: [] for name in servers}
        cpu_us: dict[str, list[float]] = {name: [] for name in servers}
        try:
            for _ in range(args.rounds):
                for name, server in servers.items():
                    stop = threading.Event()
                    scrape = None
                    if name == "metrics":
                        scrape = threading.Thread(target=scraper, args=(server.metrics_url, stop), daemon=True)
                        scrape.start()
                    rate, us = measure(server.http_url, args.seconds, server.proc.pid)
                    results[name].append(rate)
                    cpu_us[name].append(us)
                    stop.set()
                    if scrape is not None:
                        scrape.join()
        finally:
            for server in servers.values():
                server.stop()
        base = statistics.median(results["base"])
        base_cpu = statistics.median(cpu_us["base"])
        print(f"{'config':<10} {'req/s':>7} {'vs base':>8} {'CPU us/req':>11} {'vs base':>8}  req/s per round")
        for name, values in results.items():
            med = statistics.median(values)
            cpu = statistics.median(cpu_us[name])
            print(f"{name:<10} {med:>7.0f} {med / base:>8.3f} {cpu:>11.0f} {cpu / base_cpu:>8.3f}  "
                  f"{' '.join(f'{v:.0f}' for v in values)}")


if __name__ == "__main__":
    main()
