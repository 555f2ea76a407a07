"""Figures for streaming audio: concurrent real-time Silero VAD streams on one server core.

Each stream is one sequence over its own ModelStreamInfer; its chunk k (512 samples) is due at
``t0 + offset + k * 32 ms`` (offsets spread the streams over one chunk period, as independent
microphones would be) and is sent then. Latency of a chunk is from its due time (the moment its
32 ms of audio is complete) to its speech probability arriving, so a client that falls behind
counts against the figure too. The server is pinned to core 0, this client to the others; all
streams share one asyncio loop (tritonclient.grpc.aio's stream_infer), each on its own
connection.

    python -m examples.streaming.bench_audio --streams 1,16,32,64 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio

from .audio_client import chunks
from .local_server import serve
from .speech import speech_clip
from .vad_model import CHUNK, SAMPLE_RATE, write_vad_model

PERIOD = CHUNK / SAMPLE_RATE
# gRPC shares one connection among channels with equal arguments (its global subchannel pool);
# a local pool gives each stream its own connection, as separate microphones would have
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 2**31 - 1),
                  ("grpc.max_receive_message_length", 2**31 - 1)]


async def _one_stream(client: grpcaio.InferenceServerClient, pieces: list[np.ndarray], first_due: float,
                      steps: int, sequence_id: int, lat: list[float], late: list[float]) -> int:
    """One real-time stream on ``client``'s channel; appends latencies and how late each chunk
    was handed to gRPC (the client's own lag), returns its error count."""
    due_at: dict[str, float] = {}

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for k in range(steps):
            due = first_due + k * PERIOD
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            inp = grpcaio.InferInput("AUDIO", [1, CHUNK], "FP32")
            inp.set_data_from_numpy(pieces[k % len(pieces)][None])
            due_at[str(k)] = due
            late.append(time.perf_counter() - due)
            yield {"model_name": "silero_vad", "inputs": [inp], "request_id": str(k), "sequence_id": sequence_id,
                   "sequence_start": k == 0, "sequence_end": k == steps - 1}

    errors = answered = 0
    async for result, error in client.stream_infer(requests()):
        now = time.perf_counter()
        if error is not None:
            errors += 1
        else:
            lat.append(now - due_at.pop(result.get_response().id))
        answered += 1
        if answered == steps:
            break
    return errors


async def _run(url: str, pieces: list[np.ndarray], n: int, steps: int) -> tuple[list[float], list[float], int]:
    lat: list[float] = []
    late: list[float] = []
    clients = [grpcaio.InferenceServerClient(url, channel_args=OWN_CONNECTION) for _ in range(n)]
    try:
        t0 = time.perf_counter() + 0.2 + 0.005 * n
        errors = await asyncio.gather(*(
            _one_stream(c, pieces, t0 + i * PERIOD / n, steps, 10_000 + i, lat, late)
            for i, c in enumerate(clients)))
    finally:
        for c in clients:
            await c.close()
    return lat, late, sum(errors)


def run_streams(url: str, audio: np.ndarray, n: int, seconds: float) -> tuple[np.ndarray, np.ndarray, int]:
    """``n`` real-time streams for ``seconds``; returns per-chunk latencies (s), the client's
    lateness in sending each chunk (s) and the error count.

    The streams share one asyncio loop (tritonclient.grpc.aio), a far lighter client than a
    thread pair per stream; each has its own gRPC channel (connection), as separate microphones
    would."""
    steps = max(1, int(seconds / PERIOD))
    lat, late, errors = asyncio.run(_run(url, list(chunks(audio)), n, steps))
    return np.array(lat), np.array(late), errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="1,16,32,48,64,96,128")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--server-cores", default="0")
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--delay-us", type=int, default=0, help="the strategy's max_queue_delay_microseconds")
    ap.add_argument("--strategy", choices=("oldest", "direct"), default="oldest")
    args = ap.parse_args()
    counts = [int(x) for x in args.streams.split(",")]
    client_cores = set(range(os.cpu_count() or 1)) - {int(c) for c in args.server_cores.split(",")}
    if client_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, client_cores)
    audio = speech_clip(["Hello there, this is a voice activity test.", "One two three four five."]).audio
    with tempfile.TemporaryDirectory() as tmp:
        slots = max(*counts, args.max_batch)
        write_vad_model(Path(tmp), max_batch=args.max_batch if args.strategy == "oldest" else slots,
                        delay_us=args.delay_us, oldest=slots if args.strategy == "oldest" else 0)
        with serve(Path(tmp), cores=args.server_cores) as server:
            run_streams(server.grpc_url, audio, 2, 1.0)  # warm up
            best = 0
            print(f"strategy {args.strategy}, max_batch_size {args.max_batch}, load average "
                  f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
            print(f"{'streams':>7} {'chunks':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'server CPU':>10} "
                  f"{'client CPU':>10} {'client late p99 ms':>18}")
            for n in counts:
                cpu0, t0, mine = server.cpu_seconds(), time.perf_counter(), time.process_time()
                lat, late, errors = run_streams(server.grpc_url, audio, n, args.seconds)
                wall = time.perf_counter() - t0
                cpu, client_cpu = (server.cpu_seconds() - cpu0) / wall, (time.process_time() - mine) / wall
                lat_ms = lat * 1e3
                p50, p99 = np.percentile(lat_ms, [50, 99])
                print(f"{n:>7} {len(lat):>7} {p50:>7.2f} {p99:>7.2f} {lat_ms.max():>7.2f} {cpu:>10.0%} "
                      f"{client_cpu:>10.0%} {np.percentile(late, 99) * 1e3:>18.2f}"
                      + (f"  errors {errors}" if errors else ""), flush=True)
                if not errors and p99 < PERIOD * 1e3:
                    best = max(best, n)
            print(f"most streams with per-chunk p99 under {PERIOD * 1e3:.0f} ms: {best or 'none'} (of {args.streams})")


if __name__ == "__main__":
    main()
