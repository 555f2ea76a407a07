"""How long clients that never read hold a trident connection: with the send timeouts off (0,
the behaviour before them) and at their defaults (60 s), side by side.

    python tests/bench/probe_slow_reader.py [--cap-secs 90] [--flags "--http-send-timeout-secs=5 ..."]

Two servers run at once (one per setting), each with three clients that never read: an HTTP
connection with 8 pipelined requests for 8 MiB answers, a gRPC connection with its windows
open wide asking for 8 MiB, and a gRPC stream whose window the client holds at zero. The
probe watches (without reading) until the server closes each, up to ``--cap-secs``, and prints
the hold times and the ``trident_send_*`` metrics. The clients are the ones of
tests/e2e/test_send_timeout.py.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import h2.settings  # noqa: E402
import httpx  # noqa: E402
import trio  # noqa: E402
from e2e.conftest import start_server  # noqa: E402
from e2e.grpc_raw import frame, open_raw  # noqa: E402
from e2e.test_send_timeout import (  # noqa: E402
    INFER,
    _grpc_never_reading,
    _http_never_reading,
    _infer_request,
    _repo,
    _state,
)


def _zero_window(port: int, cap: float, out: dict[str, float | None]) -> None:
    async def main() -> None:
        settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
        async with open_raw(port, settings=settings) as client:
            start = time.monotonic()
            stalled = await client.open(INFER)
            await client.send(stalled, frame(_infer_request(1000).SerializeToString()), end_stream=True)
            with trio.move_on_after(cap):
                await stalled.closed.wait()
                out["grpc zero-window stream"] = time.monotonic() - start
                return
            out["grpc zero-window stream"] = None

    trio.run(main)


def probe(label: str, flags: list[str], cap: float, results: dict[str, dict[str, object]]) -> None:
    server = start_server(*flags, repo=_repo(Path(tempfile.mkdtemp())))
    held: dict[str, float | None] = {}
    try:
        start = time.monotonic()
        socks = {"http never reads": _http_never_reading(server.http_port),
                 "grpc connection never reads": _grpc_never_reading(server.grpc_port)}
        window = threading.Thread(target=_zero_window, args=(server.grpc_port, cap, held))
        window.start()
        waiting_peak = 0.0
        open_now = dict(socks)
        while open_now and time.monotonic() - start < cap:
            text = httpx.get(server.metrics_url).text
            for line in text.splitlines():
                if line.startswith("trident_send_pending_bytes "):
                    waiting_peak = max(waiting_peak, float(line.split()[1]))
            for name, sock in list(open_now.items()):
                if _state(sock) != "open":
                    held[name] = time.monotonic() - start
                    del open_now[name]
            time.sleep(0.5)
        for name in open_now:
            held[name] = None
        window.join()
        counters = [line for line in httpx.get(server.metrics_url).text.splitlines()
                    if line.startswith("trident_send_timeout_count{")]
        results[label] = {"held": held, "waiting_peak": waiting_peak, "counters": counters}
        for sock in socks.values():
            sock.close()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-secs", type=float, default=90.0, help="watch each client this long at most")
    parser.add_argument("--flags", default="", help="the 'after' server's flags (default: the defaults, 60 s)")
    args = parser.parse_args()
    runs = {"before (send timeouts 0)": ["--http-send-timeout-secs=0", "--grpc-send-timeout-secs=0"],
            "after (" + (args.flags or "defaults") + ")": shlex.split(args.flags)}
    results: dict[str, dict[str, object]] = {}
    threads = [threading.Thread(target=probe, args=(label, flags, args.cap_secs, results)) for label, flags in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"| client | {' | '.join(runs)} |\n|---|{'---|' * len(runs)}")
    for case in ("http never reads", "grpc connection never reads", "grpc zero-window stream"):
        cells = []
        for label in runs:
            secs = results.get(label, {}).get("held", {}).get(case)  # type: ignore[union-attr]
            cells.append(f"> {args.cap_secs:g} s (still open)" if secs is None else f"{secs:.1f} s")
        print(f"| {case} | {' | '.join(cells)} |")
    for label in runs:
        r = results.get(label, {})
        print(f"{label}: peak trident_send_pending_bytes {r.get('waiting_peak', 0):,.0f}; {r.get('counters')}")


if __name__ == "__main__":
    main()
