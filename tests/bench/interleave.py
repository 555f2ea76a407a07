"""Interleaved load against several running servers: the ratios of the first to each other one.

Not collected by pytest. The servers must be up already (each pinned to CPU 0, say); this runs
the load generators of ``../shared/bench`` (wrk with ``wrk_v2.lua``, h2load with ``v2bench.py``'s
flags, tritonclient aio through ``v2bench.py pyload``) pinned to ``--client-cpus``, with the same
bodies ``v2bench.py`` sends. For each case the servers run back to back, ``--rounds`` times, the
order reversed every other round, each run after a 1 s warm-up; server CPU per request is read
from /proc around the measured run (the process and its children). Prints one line per case:
median req/s, p50/p99 ms, server CPU ms per request and the load tool's ("tool") per server, then the ratio of the first server's
medians to each other's with the range of the paired (same-round) ratios::

    python tests/bench/interleave.py --rounds 3 --duration 3 \\
        --cases hs@1,gs@8,ga@64 now=9340:9341:PID triton=8000:8001:PID

Cases: ``hs``/``gs`` identity FP32[16] over HTTP (wrk) / gRPC (h2load); ``ha``/``ga`` add_sub;
``hb``/``hj``/``gb`` 1 MiB FP32 as HTTP binary, HTTP JSON and gRPC; ``ph``/``pg`` identity
FP32[16] through tritonclient aio over HTTP / gRPC (run by the client venv's python, ``--client-python``);
``qh``/``qg`` 1 MiB FP32 through tritonclient aio over HTTP (binary tensors) / gRPC.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.environ.get("BENCH", os.path.join(HERE, "..", "..", "..", "shared", "bench"))


@dataclass
class Server:
    name: str
    http: int
    grpc: int
    pid: int


def _tree_cpu(root: int) -> float:
    """User + system CPU seconds of ``root`` and its descendants (Triton's stub processes)."""
    ticks = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            procs[int(d)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in procs.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(procs[p][1] for p in tree if p in procs)


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q / 100))] if values else float("nan")


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        sys.path.insert(0, BENCH)
        import v2bench  # the shared bench's payloads, so the bytes are the ones run_all.sh sends

        self.vb = v2bench
        self.args = args
        self.work = tempfile.mkdtemp(prefix="interleave-")
        self.bodies: dict[str, tuple[str, int | None, str]] = {}

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.work, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def body(self, case: str) -> tuple[str, int | None, str]:
        """(file, binary header length or None, model) of a case."""
        if case not in self.bodies:
            vb = self.vb
            model = "add_sub" if case in ("ha", "ga") else "identity_fp32"
            n = vb.LARGE_N if case in ("hb", "hj", "gb") else vb.SMALL_N
            hl: int | None = None
            if case == "hb":
                data, hl = vb.http_binary_body(n)
            elif case in ("hs", "ha", "hj"):
                data = json.dumps(vb.json_body(model, n)).encode()
            else:
                data = vb.grpc_frame(vb.grpc_message(model, n))
            self.bodies[case] = (self._write(case, data), hl, model)
        return self.bodies[case]

    def _pin(self) -> list[str]:
        return ["taskset", "-c", self.args.client_cpus] if self.args.client_cpus else []

    def _wrk(self, server: Server, case: str, conc: int, seconds: int) -> list[str]:
        path, hl, model = self.body(case)
        return self._pin() + ["wrk", "-t1", f"-c{conc}", "--timeout", "10s", "-s",
                              os.path.join(BENCH, "wrk_v2.lua"), f"-d{seconds}s",
                              f"http://127.0.0.1:{server.http}/v2/models/{model}/infer", "--", path] + (
            [str(hl)] if hl is not None else [])

    def _h2load(self, server: Server, case: str, conc: int, seconds: int, log: str | None) -> list[str]:
        path = self.body(case)[0]
        return self._pin() + ["h2load", "-t1", "-c", str(conc), "-m", "1", "-d", path,
                              "-H", "content-type: application/grpc", "-H", "te: trailers",
                              "-D", str(seconds)] + ([f"--log-file={log}"] if log else []) + [
            f"http://127.0.0.1:{server.grpc}{self.vb.GRPC_PATH}"]

    def one(self, case: str, conc: int, server: Server) -> dict[str, float]:
        """One measured run: req/s, p50/p99 ms, errors, server CPU ms per request, and the load
        tool's own CPU ms per request (``ccpu``, its warm-up included: an upper bound)."""
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        result = self._one(case, conc, server)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        tool = (after.ru_utime + after.ru_stime) - (usage.ru_utime + usage.ru_stime)
        result["ccpu"] = 1e3 * tool / max(result["rps"] * self.args.duration, 1)
        return result

    def _one(self, case: str, conc: int, server: Server) -> dict[str, float]:
        seconds = self.args.duration
        if case in ("hs", "ha", "hb", "hj"):
            subprocess.run(self._wrk(server, case, conc, 1), capture_output=True, check=False)
            c0 = _tree_cpu(server.pid)
            out = subprocess.run(self._wrk(server, case, conc, seconds), capture_output=True, text=True,
                                 check=False).stdout
            c1 = _tree_cpu(server.pid)
            m = re.search(r"WRKJSON (\{.*\})", out)
            if m is None:
                raise RuntimeError(f"wrk printed no summary: {out[-300:]}")
            w = json.loads(m.group(1))
            n = w["requests"]
            rps = n / (w["duration_us"] / 1e6)
            p50, p99 = w["p50_us"] / 1e3, w["p99_us"] / 1e3
            errors = sum(w[k] for k in ("err_connect", "err_read", "err_write", "err_status", "err_timeout"))
        elif case in ("gs", "ga", "gb"):
            subprocess.run(self._h2load(server, case, conc, 1, None), capture_output=True, check=False)
            log = os.path.join(self.work, "h2load.log")
            c0 = _tree_cpu(server.pid)
            p = subprocess.run(self._h2load(server, case, conc, seconds, log), capture_output=True, text=True,
                               check=False)
            c1 = _tree_cpu(server.pid)
            m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, "
                          r"(\d+) errored, (\d+) timeout", p.stdout + p.stderr)
            if m is None:
                raise RuntimeError(f"h2load printed no summary: {(p.stdout + p.stderr)[-300:]}")
            with open(log) as f:
                lat = sorted(int(parts[2]) / 1e3 for parts in (line.split("\t") for line in f)
                             if len(parts) == 3 and parts[1] == "200")
            os.unlink(log)
            n = int(m.group(1))
            rps, p50, p99 = n / seconds, _pct(lat, 50), _pct(lat, 99)
            errors = int(m.group(2)) + int(m.group(3)) + int(m.group(4))
        else:
            proto, port = ("http", server.http) if case in ("ph", "qh") else ("grpc", server.grpc)
            cmd = self._pin() + [self.args.client_python, os.path.join(BENCH, "v2bench.py"), "pyload",
                                 "--proto", proto, "--url", f"127.0.0.1:{port}", "--conc", str(conc),
                                 "--duration", str(seconds)]
            if case in ("qh", "qg"):
                cmd += ["--n", str(self.vb.LARGE_N)] + (["--binary"] if case == "qh" else [])
            c0 = _tree_cpu(server.pid)
            out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
            c1 = _tree_cpu(server.pid)
            m = re.search(r"PYJSON (\{.*\})", out)
            if m is None:
                raise RuntimeError(f"pyload printed no summary: {out[-300:]}")
            j = json.loads(m.group(1))
            n, rps, p50, p99, errors = j["requests"], j["rps"], j["p50_ms"], j["p99_ms"], j["errors"]
            c1 = c0 + (c1 - c0) * seconds / (seconds + 1.2)  # pyload's own 1 s warm-up is inside
        return {"rps": rps, "p50": p50, "p99": p99, "errors": errors, "cpu": 1e3 * (c1 - c0) / max(n, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=3, help="seconds per measured run")
    ap.add_argument("--cases", required=True, help="case@concurrency,... e.g. hs@1,ga@64")
    ap.add_argument("--client-cpus", default="1", help="taskset CPU list of the load generators ('' = none)")
    ap.add_argument("--client-python", default="/tmp/anchors/venv-client/bin/python",
                    help="a python with tritonclient[all] (the ph/pg cases)")
    ap.add_argument("servers", nargs="+", help="name=HTTP_PORT:GRPC_PORT:PID (the first is compared to the rest)")
    args = ap.parse_args()
    servers = []
    for spec in args.servers:
        name, ports = spec.split("=", 1)
        http, grpc, pid = (int(x) for x in ports.split(":"))
        servers.append(Server(name, http, grpc, pid))
    runner = Runner(args)
    for item in args.cases.split(","):
        case, conc_text = item.split("@")
        conc = int(conc_text)
        results: dict[str, list[dict[str, float]]] = {s.name: [] for s in servers}
        for r in range(args.rounds):
            for server in servers if r % 2 == 0 else servers[::-1]:
                results[server.name].append(runner.one(case, conc, server))
        line = [f"{case}@{conc}"]
        for s in servers:
            rows = results[s.name]

            def med(key: str, rows: list[dict[str, float]] = rows) -> float:
                return statistics.median(x[key] for x in rows)

            line.append(f"{s.name} {med('rps'):,.0f} ({med('p50'):.2f}/{med('p99'):.2f}) cpu {med('cpu'):.3f} "
                        f"tool {med('ccpu'):.3f} err {sum(int(x['errors']) for x in rows)}")
        first = servers[0].name
        for s in servers[1:]:
            ratios = [a["rps"] / b["rps"] for a, b in zip(results[first], results[s.name], strict=True)]
            line.append(f"{first}/{s.name} {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
        print(" | ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
