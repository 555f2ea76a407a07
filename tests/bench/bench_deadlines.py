"""The deadline table (README "Deadlines"): a 3-step ensemble and a 3-model BLS chain, each step
150 ms (tests/e2e/deadline_models.py), given 200 ms.

Not collected by pytest. Run: ``python tests/bench/bench_deadlines.py [--tries 5] [--deadline-ms 200]``

For each chain and each way of giving the deadline (HTTP ``timeout`` parameter, gRPC ``timeout``
parameter, gRPC ``client_timeout``), ``--tries`` requests, interleaved with the same chain run
with no deadline (the baseline: what the request took before). Times are wall clock from when
the client sent the request, relative to the deadline (send + 200 ms): when the client got its
error, and when the last step that started, started (each step model appends its start time to
a marker file). Prints median [min, max] in ms; a step started after the deadline would show a
positive "last step start".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/ for e2e

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from e2e.conftest import start_server  # noqa: E402
from e2e.deadline_models import STEP_S, read_markers, write_deadline_repo  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402


def inputs(module, value: float = 1.0) -> list:
    x = module.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return [x]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} [{min(values):6.1f}, {max(values):6.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--deadline-ms", type=float, default=200.0)
    args = parser.parse_args()
    budget = args.deadline_ms / 1000
    with tempfile.TemporaryDirectory() as tmp:
        marker = Path(tmp) / "started.txt"
        root = write_deadline_repo(Path(tmp) / "repo", marker)
        server = start_server(repo=root)
        try:
            http = httpclient.InferenceServerClient(server.http_url)
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            ways = {
                "HTTP timeout": lambda model, rid: http.infer(model, inputs(httpclient), request_id=rid,
                                                              timeout=int(budget * 1e6)),
                "gRPC timeout": lambda model, rid: grpc.infer(model, inputs(grpcclient), request_id=rid,
                                                              timeout=int(budget * 1e6)),
                "gRPC client_timeout": lambda model, rid: grpc.infer(model, inputs(grpcclient), request_id=rid,
                                                                     client_timeout=budget),
            }
            for model in ("ens3", "b1"):  # warm
                grpc.infer(model, inputs(grpcclient))
            print(f"steps of {STEP_S * 1000:.0f} ms, deadline {args.deadline_ms:.0f} ms after send, "
                  f"{args.tries} tries; ms relative to the deadline, median [min, max]")
            print(f"{'chain':12} {'given by':20} {'client error at':>24} {'last step start':>24} "
                  f"{'steps run':>9} {'no deadline: answer at':>24}")
            for model, label in (("ens3", "ensemble"), ("b1", "BLS chain")):
                for way, call in ways.items():
                    errors, lasts, counts, baseline = [], [], [], []
                    for i in range(args.tries):
                        rid = f"{model}-{way}-{i}".replace(" ", "_")
                        sent = time.time()
                        try:
                            call(model, rid)
                            raise SystemExit(f"{label} {way}: answered, not timed out")
                        except InferenceServerException:
                            got = time.time()
                        time.sleep(3 * STEP_S + 0.2)  # the running step ends; nothing later starts
                        starts = [t for _, t in read_markers(marker, rid)]
                        errors.append((got - sent - budget) * 1000)
                        lasts.append((max(starts) - sent - budget) * 1000)
                        counts.append(len(starts))
                        t = time.time()
                        grpc.infer(model, inputs(grpcclient), request_id=f"{rid}-free")  # interleaved baseline
                        baseline.append((time.time() - t - budget) * 1000)
                    print(f"{label:12} {way:20} {spread(errors):>24} {spread(lasts):>24} "
                          f"{max(counts):>9} {spread(baseline):>24}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
