"""System shared memory against tensors in the request body: 1 MiB and 16 MiB FP32, identity model.

Not collected by pytest. Runs against servers that are already up (trident with
``--allow-client-shm=true``; the real Triton allows client shared memory by default), each
serving ``identity_fp32`` (FP32 ``[-1]``), on 127.0.0.1:

    python tests/bench/bench_shared_memory.py --server trident=8000,8001,PID --server triton=28000,28001,PID2 \\
        [--sizes 1,16] [--secs 5] [--rounds 2] [--out shm.jsonl]

For each server, size (MiB), protocol (HTTP binary, gRPC) and mode (``body``: the tensor in the
request and the response; ``shm``: input and output in registered regions), one tritonclient
client sends requests back to back for ``--secs`` and the harness reports req/s, MB/s (tensor
bytes in + out per second) and the server's CPU per request (utime+stime of PID from
/proc). Rounds interleave servers so both see the same machine state; the table gives medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from proc_stats import cpu_seconds  # tests/bench/proc_stats.py (the script runs from tests/bench)


def run_case(name: str, http_port: int, grpc_port: int, pid: int, mib: int, proto: str, mode: str,
             secs: float) -> dict:
    n = mib * (1 << 20) // 4
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    nbytes = x.nbytes
    mod = httpclient if proto == "http" else grpcclient
    client = (httpclient.InferenceServerClient(f"127.0.0.1:{http_port}", network_timeout=120)
              if proto == "http" else grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}"))
    handles = []
    tag = uuid.uuid4().hex[:8]
    try:
        inp = mod.InferInput("INPUT0", [n], "FP32")
        outputs = None
        if mode == "shm":
            hin = shm.create_shared_memory_region(f"in{tag}", f"/bench_in_{tag}", nbytes)
            hout = shm.create_shared_memory_region(f"out{tag}", f"/bench_out_{tag}", nbytes)
            handles = [hin, hout]
            shm.set_shared_memory_region(hin, [x])
            client.register_system_shared_memory(f"in{tag}", f"/bench_in_{tag}", nbytes)
            client.register_system_shared_memory(f"out{tag}", f"/bench_out_{tag}", nbytes)
            inp.set_shared_memory(f"in{tag}", nbytes)
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"out{tag}", nbytes)
            outputs = [out]
        else:
            if proto == "http":
                inp.set_data_from_numpy(x, binary_data=True)
                outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
            else:
                inp.set_data_from_numpy(x)

        def once() -> None:
            result = client.infer("identity_fp32", [inp], outputs=outputs)
            if mode == "body":
                got = result.as_numpy("OUTPUT0")
                assert got is not None and got.size == n

        once()  # warm-up, and a check that it works
        if mode == "shm":
            got = shm.get_contents_as_numpy(handles[1], np.float32, [n])
            assert got[-1] == x[-1]
        count = 0
        before = cpu_seconds(pid)
        start = time.perf_counter()
        while time.perf_counter() - start < secs:
            once()
            count += 1
        elapsed = time.perf_counter() - start
        used = cpu_seconds(pid) - before
        return {"server": name, "mib": mib, "proto": proto, "mode": mode, "requests": count,
                "rps": count / elapsed, "mb_per_s": 2 * nbytes * count / elapsed / 1e6,
                "cpu_ms_per_req": used / count * 1e3}
    finally:
        if mode == "shm":
            try:
                client.unregister_system_shared_memory(f"in{tag}")
                client.unregister_system_shared_memory(f"out{tag}")
            finally:
                for h in handles:
                    shm.destroy_shared_memory_region(h)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", action="append", required=True, metavar="NAME=HTTP,GRPC,PID")
    parser.add_argument("--sizes", default="1,16")
    parser.add_argument("--secs", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    servers = []
    for spec in args.server:
        name, _, ports = spec.partition("=")
        http_port, grpc_port, pid = (int(v) for v in ports.split(","))
        servers.append((name, http_port, grpc_port, pid))
    rows: list[dict] = []
    for _ in range(args.rounds):
        for mib in (int(s) for s in args.sizes.split(",")):
            for proto in ("http", "grpc"):
                for mode in ("body", "shm"):
                    for name, http_port, grpc_port, pid in servers:
                        row = run_case(name, http_port, grpc_port, pid, mib, proto, mode, args.secs)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        if args.out:
                            with open(args.out, "a") as f:
                                f.write(json.dumps(row) + "\n")
    print("\n| MiB | protocol | mode | " + " | ".join(f"{s[0]} req/s, MB/s, CPU ms/req" for s in servers) + " |")
    print("|---|---|---|" + "---|" * len(servers))
    keys = sorted({(r["mib"], r["proto"], r["mode"]) for r in rows}, key=lambda k: (k[0], k[1], k[2]))
    for mib, proto, mode in keys:
        cells = []
        for name, *_ in servers:
            mine = [r for r in rows if (r["server"], r["mib"], r["proto"], r["mode"]) == (name, mib, proto, mode)]
            cells.append(f"{statistics.median(r['rps'] for r in mine):,.1f}, "
                         f"{statistics.median(r['mb_per_s'] for r in mine):,.0f}, "
                         f"{statistics.median(r['cpu_ms_per_req'] for r in mine):.2f}")
        print(f"| {mib} | {proto} | {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
