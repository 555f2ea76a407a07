"""Figures for streaming video: frames/s and per-frame latency of PP-OCRv4 text detection with
1, 4 and 16 cameras, the dynamic batcher on and off, the server pinned to one core.

Each camera is its own ModelStreamInfer (video_client.CameraStream, ``window`` frames in flight,
``drop="none"``: a camera sends its next frame as soon as a place frees, so this is the most the
server serves, not a fixed frame rate). Latency is from a frame being sent to its mask arriving.

    python -m examples.streaming.bench_video --cameras 1,4,16 --seconds 5
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from .frames import frame
from .local_server import serve
from .video_client import CameraStream
from .video_model import write_detector_model


def run_cameras(url: str, n: int, seconds: float, window: int) -> tuple[int, np.ndarray, int, float]:
    """``n`` cameras for ``seconds``; returns frames answered, latencies (s), errors, wall time."""
    videos = [[frame(c, i)[0] for i in range(20)] for c in range(n)]
    streams = [CameraStream(url, c, window=window) for c in range(n)]
    stop = time.perf_counter() + seconds

    def camera(c: int) -> None:
        i = 0
        while time.perf_counter() < stop:
            streams[c].offer(i, videos[c][i % 20])
            i += 1
        streams[c].drain()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=camera, args=(c,)) for c in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for s in streams:
        s.close()
    lat = np.array([r.latency_s for s in streams for r in s.results])
    return len(lat), lat, sum(len(s.errors) for s in streams), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cameras", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--window", type=int, default=2, help="frames in flight per camera")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--delay-us", type=int, default=5000)
    ap.add_argument("--server-cores", default="0")
    args = ap.parse_args()
    client_cores = set(range(os.cpu_count() or 1)) - {int(c) for c in args.server_cores.split(",")}
    if client_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, client_cores)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; window {args.window}")
    print(f"{'batching':>8} {'cameras':>7} {'frames':>6} {'frames/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'mean batch':>10} {'server CPU':>10}")
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        servers = {}
        for batching in (False, True):  # both up at once, measured in turns, so load drift hits both
            repo = Path(tmp) / ("on" if batching else "off")
            write_detector_model(repo, batching=batching, max_batch=args.max_batch, delay_us=args.delay_us)
            servers[batching] = stack.enter_context(serve(repo, cores=args.server_cores))
            run_cameras(servers[batching].grpc_url, 2, 1.0, args.window)  # warm up
        for n in (int(x) for x in args.cameras.split(",")):
            for batching, server in servers.items():
                cpu0, (inf0, exe0) = server.cpu_seconds(), _counts(server.grpc_url)
                done, lat, errors, wall = run_cameras(server.grpc_url, n, args.seconds, args.window)
                inf1, exe1 = _counts(server.grpc_url)
                cpu = (server.cpu_seconds() - cpu0) / wall
                p50, p99 = np.percentile(lat * 1e3, [50, 99])
                print(f"{'on' if batching else 'off':>8} {n:>7} {done:>6} {done / wall:>8.1f} {p50:>7.1f} {p99:>7.1f} "
                      f"{(inf1 - inf0) / max(1, exe1 - exe0):>10.2f} {cpu:>10.0%}"
                      + (f"  errors {errors}" if errors else ""), flush=True)


def _counts(url: str) -> tuple[int, int]:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as c:
        st = c.get_inference_statistics("text_detector").model_stats[0]
    return st.inference_count, st.execution_count


if __name__ == "__main__":
    main()
