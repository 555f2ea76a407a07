"""What each per-request feature costs on the hot path: server CPU per small HTTP request.

Not collected by pytest. Starts ``trident serve`` (pinned to CPU 0) once per variant on a
repository written here (identity FP32[16] Python model, with and without response_cache),
loads it with ``wrk`` (pinned to CPU 1, one fixed JSON infer body) and reads the server's CPU
time from /proc. Variants are run in rounds (interleaved) and the median per variant reported:

    python tests/bench/bench_feature_costs.py [--rounds 3] [--duration 5] [--conc 8] [--out costs.jsonl]

Variants: ``base`` (statistics and metrics on, as always; tracing off), ``no_metrics``
(--allow-metrics=false: the Prometheus counters' cost), ``trace_1`` (tracing every request,
TIMESTAMPS, to a file), ``trace_1000`` (Triton's default rate of 1 in 1000), ``request_id``
(every request carries an "id"), ``cache_miss`` (response cache on, every request different:
lookup + insert), ``cache_hit`` (response cache on, the same request: a lookup that hits),
``inline_never`` (the model's TRIDENT_INLINE_EXECUTION parameter "never": the instance-thread
hop that inline execution saves). Statistics cannot be switched off (Triton cannot either); their cost is the
remainder in ``base``. Cancellation is measured by ``disconnect`` in the abuse probe, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proc_stats import cpu_seconds  # tests/bench/proc_stats.py (the script runs from tests/bench)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WRK_LUA = ROOT.parent / "shared" / "bench" / "wrk_v2.lua"

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
{extra}
'''

VARIANTS: dict[str, dict] = {
    "base": {},
    "no_metrics": {"flags": ["--allow-metrics=false"]},
    "trace_1": {"flags": ["--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
                          "--trace-config=triton,file={tmp}/trace.json", "--trace-config=triton,log-frequency=0"]},
    "trace_1000": {"flags": ["--trace-config=level=TIMESTAMPS", "--trace-config=rate=1000",
                             "--trace-config=triton,file={tmp}/trace.json", "--trace-config=triton,log-frequency=0"]},
    "request_id": {"body": "id"},
    "cache_miss": {"flags": ["--cache-config=local,size=67108864"], "model": "cached", "body": "vary"},
    "cache_hit": {"flags": ["--cache-config=local,size=67108864"], "model": "cached"},
    "inline_never": {"model": "threaded"},
    "busy_poll_off": {"flags": ["--busy-poll-us=0"]},
    "inline_never_busy_poll_off": {"model": "threaded", "flags": ["--busy-poll-us=0"]},
}


def write_repo(root: Path) -> None:
    for name, extra in (("ident", ""), ("cached", "response_cache { enable: true }"),
                        ("threaded", 'parameters { key: "TRIDENT_INLINE_EXECUTION" value: { string_value: "never" } }')):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
        (root / name / "1" / "model.py").write_text(IDENTITY)




def body_file(tmp: Path, kind: str | None) -> Path:
    doc: dict = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "data": [0.5] * 16}]}
    if kind == "id":
        doc["id"] = "request-0001"
    path = tmp / f"body-{kind}.json"
    path.write_text(json.dumps(doc))
    return path


VARY_LUA = '''
local counter = 0
request = function()
  counter = counter + 1
  local body = '{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[16],"data":[' .. counter ..
    ',1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
function done(summary, latency, requests)
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99)))
end
'''


def run_variant(name: str, spec: dict, repo: Path, tmp: Path, args: argparse.Namespace) -> dict:
    flags = [f.format(tmp=tmp) for f in spec.get("flags", [])]
    env = {**os.environ, **spec.get("env", {})}
    log = open(tmp / f"{name}.log", "w")
    proc = subprocess.Popen(["taskset", "-c", args.server_cpu, sys.executable, "-m", "trident", "serve",
                             "--model-repository", str(repo), "--http-address", "127.0.0.1", "--grpc-address",
                             "127.0.0.1", "--metrics-address", "127.0.0.1", "--http-port", str(args.port),
                             "--grpc-port", "0", "--metrics-port", "0", *flags],
                            stdout=log, stderr=log, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while "model loading complete" not in (tmp / f"{name}.log").read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: server did not start:\n{(tmp / f'{name}.log').read_text()}")
            time.sleep(0.1)
        model = spec.get("model", "ident")
        url = f"http://127.0.0.1:{args.port}/v2/models/{model}/infer"
        if spec.get("body") == "vary":
            script = tmp / "vary.lua"
            script.write_text(VARY_LUA)
            wrk = ["wrk", "-t1", f"-c{args.conc}", f"-d{args.duration}s", "-s", str(script), url]
        else:
            wrk = ["wrk", "-t1", f"-c{args.conc}", f"-d{args.duration}s", "-s", str(WRK_LUA), url, "--",
                   str(body_file(tmp, spec.get("body")))]
        warm = [*wrk]
        warm[warm.index(f"-d{args.duration}s")] = "-d1s"
        subprocess.run(["taskset", "-c", args.client_cpu, *warm], capture_output=True, check=True)
        before = cpu_seconds(proc.pid)
        out = subprocess.run(["taskset", "-c", args.client_cpu, *wrk], capture_output=True, text=True, check=True)
        used = cpu_seconds(proc.pid) - before
        m = re.search(r"WRKJSON (\{.*\})", out.stdout)
        if m is None:
            raise RuntimeError(f"{name}: no wrk summary:\n{out.stdout}\n{out.stderr}")
        summary = json.loads(m.group(1))
        n = summary["requests"]
        return {"variant": name, "requests": n, "rps": n / (summary["duration_us"] / 1e6),
                "cpu_us_per_req": used / n * 1e6, "p50_us": summary["p50_us"], "p99_us": summary["p99_us"]}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--conc", type=int, default=8)
    parser.add_argument("--port", type=int, default=18900)
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if shutil.which("wrk") is None or not WRK_LUA.exists():
        sys.exit(f"needs wrk on PATH and the shared bench's {WRK_LUA}")
    names = args.variants.split(",")
    results: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="trident-costs-") as tmp_name:
        tmp = Path(tmp_name)
        repo = tmp / "repo"
        write_repo(repo)
        for r in range(args.rounds):
            for name in names:
                row = run_variant(name, VARIANTS[name], repo, tmp, args)
                row["round"] = r
                results[name].append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    base = statistics.median(r["cpu_us_per_req"] for r in results.get("base", [])) if "base" in results else None
    print("\n| variant | req/s (median) | server CPU us/req (median) | vs base | p99 us |")
    print("|---|---|---|---|---|")
    for name in names:
        rows = results[name]
        cpu = statistics.median(r["cpu_us_per_req"] for r in rows)
        delta = f"{cpu - base:+.1f}" if base is not None else ""
        print(f"| {name} | {statistics.median(r['rps'] for r in rows):,.0f} | {cpu:.1f} | {delta} | "
              f"{statistics.median(r['p99_us'] for r in rows):,.0f} |")


if __name__ == "__main__":
    main()
