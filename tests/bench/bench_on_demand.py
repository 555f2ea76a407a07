"""Models loaded on demand under random traffic: requests, loads, evictions and RSS over time.

Not collected by pytest. Starts ``trident serve`` twice on 127.0.0.1 over a repository of
``--models`` Python models written to a temporary folder (each holds ``--model-mib`` MiB once
loaded, so that the budget shows in the resident set):

1. the reference: explicit mode with ``--budget`` models loaded (``--load-model``) and a request
   to each: the RSS of a server that holds a budget's worth of models;
2. on demand: ``--model-load-on-demand=true --model-budget-count=<budget>``, then ``--clients``
   threads send requests (tritonclient HTTP and gRPC, alternating) to models drawn at random for
   ``--seconds``; every ``--every`` seconds the server's RSS, the loaded count (repository index)
   and the on-demand metrics are sampled.

    python tests/bench/bench_on_demand.py [--models 100] [--budget 10] [--seconds 20] \\
        [--clients 4] [--model-mib 8] [--every 1]

Prints the table over time and a summary: requests (failed), loads, evictions, the largest
loaded count, the largest RSS against the reference (the issue's target: 0 failed, RSS <= the
reference + 10%).
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import start_server  # noqa: E402
from tests.e2e.models import write_model  # noqa: E402

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.block = np.ones({mib} << 20, dtype=np.uint8)  # resident while loaded

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
'''

X = np.arange(4, dtype=np.float32)


def rss_mib(pid: int) -> float:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) / 1024 if m else 0.0


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def loaded(http_url: str) -> int:
    rows = httpx.post(f"http://{http_url}/v2/repository/index", json={}, timeout=30).json()
    return sum(1 for r in rows if r.get("state") == "READY")


def infer(client, module, model: str) -> None:
    x = module.InferInput("INPUT0", [len(X)], "FP32")
    x.set_data_from_numpy(X)
    out = client.infer(model, [x]).as_numpy("OUTPUT0")
    if out is None or out.tolist() != X.tolist():
        raise RuntimeError(f"{model}: wrong answer {out}")


def reference(repo: Path, names: list[str], budget: int) -> float:
    """RSS (MiB) of a server holding ``budget`` of the models, each asked once."""
    import tritonclient.http as httpclient

    server = start_server("--model-control-mode=explicit", *(f"--load-model={n}" for n in names[:budget]),
                          repo=repo, timeout=300)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        for name in names[:budget]:
            infer(client, httpclient, name)
        time.sleep(1.0)
        return rss_mib(server.proc.pid)
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--budget", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--model-mib", type=int, default=8)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of the on-demand server (e.g. MALLOC_TRIM_THRESHOLD_=0)")
    args = ap.parse_args()

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    tmp = Path(tempfile.mkdtemp(prefix="bench-on-demand-"))
    try:
        repo = tmp / "repo"
        names = [f"m{i:03d}" for i in range(args.models)]
        for name in names:
            write_model(repo, name, CONFIG.format(name=name), MODEL_PY.format(mib=args.model_mib))
        ref = reference(repo, names, args.budget)
        server = start_server("--model-control-mode=explicit", "--model-load-on-demand=true",
                              f"--model-budget-count={args.budget}", repo=repo, timeout=300,
                              env=dict(e.split("=", 1) for e in args.env))
        counts = {"ok": 0, "failed": 0}
        errors: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()

        def client_loop(index: int) -> None:
            rng = random.Random(args.seed * 1000 + index)
            module = httpclient if index % 2 == 0 else grpcclient
            client = (httpclient.InferenceServerClient(server.http_url, network_timeout=120) if module is httpclient
                      else grpcclient.InferenceServerClient(server.grpc_url))
            while not stop.is_set():
                model = rng.choice(names)
                try:
                    infer(client, module, model)
                    outcome = "ok"
                except Exception as e:  # counted and shown: the benchmark's point
                    outcome = "failed"
                    with lock:
                        errors.append(f"{model}: {e}")
                with lock:
                    counts[outcome] += 1

        rows = []
        try:
            threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(args.clients)]
            started = time.monotonic()
            for t in threads:
                t.start()
            while time.monotonic() - started < args.seconds:
                time.sleep(args.every)
                text = httpx.get(server.metrics_url, timeout=30).text
                with lock:
                    ok, failed = counts["ok"], counts["failed"]
                rows.append((time.monotonic() - started, ok, failed,
                             metric(text, "trident_model_on_demand_load_count"),
                             metric(text, "trident_model_eviction_count"),
                             loaded(server.http_url), rss_mib(server.proc.pid)))
            stop.set()
            for t in threads:
                t.join()
        finally:
            stop.set()
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"command: python tests/bench/bench_on_demand.py --models {args.models} --budget {args.budget} "
          f"--seconds {args.seconds:g} --clients {args.clients} --model-mib {args.model_mib} --every {args.every:g}"
          + "".join(f" --env {e}" for e in args.env))
    print(f"reference: {args.budget} models loaded explicitly: RSS {ref:.1f} MiB")
    print()
    print("| t (s) | requests ok | failed | loads | evictions | loaded | RSS (MiB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for t, ok, failed, loads, evictions, count, rss in rows:
        print(f"| {t:.1f} | {ok} | {failed} | {loads:.0f} | {evictions:.0f} | {count} | {rss:.1f} |")
    peak = max(r[6] for r in rows)
    print()
    print(f"requests: {counts['ok']} ok, {counts['failed']} failed; loads {rows[-1][3]:.0f}, evictions "
          f"{rows[-1][4]:.0f}; largest loaded count {max(r[5] for r in rows)} (budget {args.budget}); "
          f"largest RSS {peak:.1f} MiB = {100 * peak / ref:.0f}% of the reference {ref:.1f} MiB")
    for line in errors[:5]:
        print("error:", line)
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
