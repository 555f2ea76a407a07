"""Check ``trident perf``'s figures against wrk (HTTP/1.1) and h2load (gRPC over HTTP/2) on the
same server, model and request bytes: throughput and p50 at several concurrencies.

    python -m trident.perf.agreement --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 \\
        --model identity_fp32 --shape INPUT0:16 --concurrency 1,8,64 --seconds 4

Prints a markdown table (req/s and p50 of each tool, and the differences). wrk's percentiles are
corrected for coordinated omission (it adds samples for requests it did not send while waiting),
so raw latencies are compared with h2load's per-request log (``--h1`` for HTTP/1.1). Needs ``wrk`` and
``h2load`` on PATH. Each run lasts ``--seconds`` (plus a 1 s warm-up for wrk and h2load); the
``trident perf`` run uses three windows of a third of that.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from trident.perf.control import open_control
from trident.perf.inputs import build_requests, parse_shapes
from trident.perf.wire import grpc_infer_message, http_infer_request

_LUA = """
wrk.method = "POST"
local f = assert(io.open(os.getenv("PERF_BODY"), "rb")); wrk.body = f:read("*a"); f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = os.getenv("PERF_HDR")
function done(s, lat, req)
  io.write(string.format("WRK %d %d %d\\n", s.requests, s.duration, lat:percentile(50)))
end
"""


def _perf(proto: str, url: str, model: str, shapes: list[str], conc: int, seconds: float) -> tuple[float, float, float]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    window = int(seconds * 1000 / 3)
    cmd = [sys.executable, "-m", "trident", "perf", "-m", model, "-i", proto, "-u", url, "--concurrency-range",
           str(conc), "-p", str(window), "-r", "3", "-s", "1000", "--json-file", out, "--workers", "1"]
    for s in shapes:
        cmd += ["--shape", s]
    subprocess.run(cmd, capture_output=True, timeout=seconds + 120, check=True)
    with open(out) as fh:
        r = json.load(fh)[0]
    os.unlink(out)
    return r["throughput"], r["p50_us"] / 1e3, r["client_cpu_pct"]


def _wrk(url: str, body: bytes, hdr: int, conc: int, seconds: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "body")
        lua = os.path.join(d, "s.lua")
        with open(path, "wb") as f:
            f.write(body)
        with open(lua, "w") as f:
            f.write(_LUA)
        env = {**os.environ, "PERF_BODY": path, "PERF_HDR": str(hdr)}
        base = ["wrk", "-t1", f"-c{conc}", "--timeout", "10s", "-s", lua]
        subprocess.run([*base, "-d1s", url], capture_output=True, timeout=60, env=env)
        p = subprocess.run([*base, f"-d{seconds:g}s", url], capture_output=True, text=True, timeout=seconds + 60,
                           env=env)
    m = re.search(r"WRK (\d+) (\d+) (\d+)", p.stdout)
    if not m:
        raise RuntimeError(p.stdout + p.stderr)
    return int(m.group(1)) / (int(m.group(2)) / 1e6), int(m.group(3)) / 1e3


def _h2load(target: str, frame: bytes, conc: int, seconds: float, h1_header: int = 0) -> tuple[float, float]:
    """h2load's req/s and raw p50 (its --log-file): gRPC, or HTTP/1.1 (``--h1``) when
    ``h1_header`` (the binary body's Inference-Header-Content-Length) is given."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "frame")
        log = os.path.join(d, "log")
        with open(path, "wb") as f:
            f.write(frame)
        if h1_header:
            base = ["h2load", "--h1", "-t1", "-c", str(conc), "-m", "1", "-d", path,
                    "-H", "content-type: application/octet-stream", "-H", f"inference-header-content-length: {h1_header}"]
            url = target
        else:
            base = ["h2load", "-t1", "-c", str(conc), "-m", "1", "-d", path, "-H", "content-type: application/grpc",
                    "-H", "te: trailers"]
            url = f"http://{target}/inference.GRPCInferenceService/ModelInfer"
        subprocess.run([*base, "-D", "1", url], capture_output=True, timeout=60)
        p = subprocess.run([*base, "-D", f"{seconds:g}", f"--log-file={log}", url], capture_output=True, text=True,
                           timeout=seconds + 60)
        m = re.search(r"(\d+) succeeded", p.stdout)
        if not m:
            raise RuntimeError(p.stdout + p.stderr)
        lat = sorted(int(line.split("\t")[2]) for line in open(log) if line.count("\t") == 2)
    return int(m.group(1)) / seconds, (lat[len(lat) // 2] / 1e3 if lat else 0.0)


def _references(a: argparse.Namespace, proto: str, conc: int, body: bytes, hdr: int, frame: bytes,
                runs: dict[str, list[tuple[float, float]]]) -> None:
    """One run of each reference tool for ``proto`` at ``conc``, added to ``runs``."""
    if proto == "http":
        infer_url = f"http://{a.http}/v2/models/{a.model}/infer"
        runs.setdefault("wrk", []).append(_wrk(infer_url, body, hdr, conc, a.seconds))
        runs.setdefault("h2load --h1", []).append(_h2load(infer_url, body, conc, a.seconds, h1_header=hdr))
    else:
        runs.setdefault("h2load", []).append(_h2load(a.grpc, frame, conc, a.seconds))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http", default="127.0.0.1:8000")
    ap.add_argument("--grpc", default="127.0.0.1:8001")
    ap.add_argument("--model", default="identity_fp32")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--protocols", default="http,grpc")
    ap.add_argument("--repeat", type=int, default=5,
                    help="interleaved runs per row (which tool goes first alternates); the medians are shown")
    a = ap.parse_args(argv)
    info = open_control("http", a.http).model_info(a.model, "")
    tensors = build_requests(info, 1, parse_shapes(a.shape), "random")[0]
    request = http_infer_request(a.http, a.model, "", tensors, info.outputs)
    head, _, body = request.partition(b"\r\n\r\n")
    hdr = int(re.search(rb"Inference-Header-Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
    message = grpc_infer_message(a.model, "", tensors, info.outputs)
    frame = b"\x00" + len(message).to_bytes(4, "big") + message
    print("| protocol | conc | reference | ref req/s | perf req/s | diff | ref p50 ms | perf p50 ms | diff | perf CPU % |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for proto in a.protocols.split(","):
        for conc in (int(c) for c in a.concurrency.split(",")):
            runs: dict[str, list[tuple[float, float]]] = {}
            mine: list[tuple[float, float, float]] = []
            target = a.http if proto == "http" else a.grpc
            for i in range(max(1, a.repeat)):
                # alternate which tool goes first, so that a machine getting faster or slower
                # during the row favours neither
                if i % 2:
                    mine.append(_perf(proto, target, a.model, a.shape, conc, a.seconds))
                _references(a, proto, conc, body, hdr, frame, runs)
                if not i % 2:
                    mine.append(_perf(proto, target, a.model, a.shape, conc, a.seconds))
            ours, p50, cpu = (statistics.median(v) for v in zip(*mine, strict=True))
            for name, values in runs.items():
                ref, ref_p50 = (statistics.median(v) for v in zip(*values, strict=True))
                print(f"| {proto} | {conc} | {name} | {ref:.0f} | {ours:.0f} | {100 * (ours - ref) / ref:+.1f}% | "
                      f"{ref_p50:.2f} | {p50:.2f} | {100 * (p50 - ref_p50) / ref_p50 if ref_p50 else 0:+.1f}% | "
                      f"{cpu:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
