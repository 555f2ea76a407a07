"""Stream 16 kHz audio to Silero VAD over one bidirectional gRPC ModelStreamInfer per stream.

Each stream is a sequence (``sequence_id``; ``sequence_start`` on the first chunk,
``sequence_end`` on the last); every 32 ms chunk (512 samples) is one request and gets one
response holding the speech probability of that chunk. The server keeps Silero's recurrent state
between chunks (implicit state), so the client sends only audio.

    python -m examples.streaming.audio_client --url 127.0.0.1:8001 --text "Hello there"
    python -m examples.streaming.audio_client --url 127.0.0.1:8001 --wav speech.wav  # 16 kHz mono 16-bit

``--repo DIR`` writes the model folder (``silero_vad``) into DIR for ``trident serve`` instead.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from .vad_model import CHUNK, SAMPLE_RATE


@dataclass
class ChunkResult:
    index: int
    prob: float
    latency_s: float  # from the chunk being queued for sending (or ``since``) to its response arriving


@dataclass
class VadStream:
    """One audio stream: one tritonclient gRPC client, one ModelStreamInfer, one sequence.

    ``send`` queues a chunk (it does not wait); responses arrive on tritonclient's thread and are
    collected in ``results`` (in order: a sequence's requests run one after the other) or
    ``errors``. ``wait(n)`` blocks until ``n`` answers (results + errors) have arrived."""

    url: str
    sequence_id: int | str
    model: str = "silero_vad"
    results: list[ChunkResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._client = grpcclient.InferenceServerClient(self.url)
        self._sent: dict[str, tuple[int, float]] = {}
        self._answers: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._next = 0
        self._client.start_stream(callback=self._on_response)

    def _on_response(self, result: grpcclient.InferResult | None, error: InferenceServerException | None) -> None:
        now = time.perf_counter()
        with self._lock:
            if error is not None:
                self.errors.append(str(error))
            else:
                assert result is not None
                rid = result.get_response().id
                index, sent = self._sent.pop(rid)
                prob = result.as_numpy("SPEECH_PROB")
                self.results.append(ChunkResult(index, float(prob.reshape(-1)[0]), now - sent))
        self._answers.put(None)

    def send(self, chunk: np.ndarray, *, start: bool = False, end: bool = False, since: float | None = None) -> int:
        """Queue one chunk of ``CHUNK`` float32 samples; returns its index in the stream. Its
        latency counts from ``since`` (a ``time.perf_counter()`` value; default: now).

        Raises ValueError for a chunk of another size (the server would refuse it too)."""
        if chunk.shape != (CHUNK,):
            raise ValueError(f"a chunk is {CHUNK} samples, got shape {chunk.shape}")
        inp = grpcclient.InferInput("AUDIO", [1, CHUNK], "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(chunk, np.float32)[None])
        return self.send_inputs([inp], start=start, end=end, since=since)

    def send_inputs(self, inputs: list[grpcclient.InferInput], *, start: bool = False, end: bool = False,
                    sequence_id: int | str | None = None, since: float | None = None) -> int:
        """Queue one request with these inputs (any, also wrong ones: the server answers with an
        error on the stream) on this stream's sequence or ``sequence_id``; returns its index."""
        with self._lock:
            index = self._next
            self._next += 1
            rid = f"{self.sequence_id}:{index}"
            self._sent[rid] = (index, time.perf_counter() if since is None else since)
        sid = self.sequence_id if sequence_id is None else sequence_id
        self._client.async_stream_infer(self.model, inputs, request_id=rid, sequence_id=sid,
                                        sequence_start=start, sequence_end=end)
        return index

    def wait(self, answers: int, timeout: float = 30.0) -> None:
        """Block until ``answers`` responses or errors have arrived in all; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if len(self.results) + len(self.errors) >= answers:
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"stream {self.sequence_id}: {answers} answers not in {timeout} s")
            try:
                self._answers.get(timeout=left)
            except queue.Empty:
                pass

    def close(self, *, cancel: bool = False) -> None:
        """End the gRPC stream (``cancel=True`` cancels what is still in flight) and the client."""
        self._client.stop_stream(cancel_requests=cancel)
        self._client.close()


def chunks(audio: np.ndarray) -> Iterator[np.ndarray]:
    """The 512-sample chunks of ``audio`` (a last partial chunk is zero-padded)."""
    for start in range(0, len(audio), CHUNK):
        piece = audio[start:start + CHUNK]
        if len(piece) < CHUNK:
            piece = np.pad(piece, (0, CHUNK - len(piece)))
        yield piece


def stream_clip(url: str, audio: np.ndarray, sequence_id: int | str, *, realtime: bool = False,
                model: str = "silero_vad", timeout: float = 60.0) -> VadStream:
    """Send ``audio`` as one sequence, each chunk after the previous answer (or every 32 ms with
    ``realtime``), and return the finished stream (closed)."""
    stream = VadStream(url, sequence_id, model)
    try:
        pieces = list(chunks(audio))
        t0 = time.perf_counter()
        for i, piece in enumerate(pieces):
            if realtime:
                time.sleep(max(0.0, t0 + i * CHUNK / SAMPLE_RATE - time.perf_counter()))
            stream.send(piece, start=i == 0, end=i == len(pieces) - 1)
            if not realtime:
                stream.wait(i + 1, timeout)
        stream.wait(len(pieces), timeout)
    finally:
        stream.close()
    return stream


def segments(probs: list[float], threshold: float = 0.5) -> list[tuple[float, float]]:
    """Speech segments (start, end) in seconds where the probability is at or above ``threshold``."""
    out, begin = [], None
    for i, p in enumerate([*probs, 0.0]):
        if p >= threshold and begin is None:
            begin = i
        elif p < threshold and begin is not None:
            out.append((begin * CHUNK / SAMPLE_RATE, i * CHUNK / SAMPLE_RATE))
            begin = None
    return out


def read_wav(path: Path) -> np.ndarray:
    """A 16 kHz mono 16-bit WAV file as float32 samples; raises ValueError for other formats."""
    with wave.open(str(path)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (SAMPLE_RATE, 1, 2):
            raise ValueError(f"{path}: need 16 kHz mono 16-bit PCM")
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="127.0.0.1:8001")
    ap.add_argument("--repo", type=Path, help="write the silero_vad model folder here and exit")
    ap.add_argument("--wav", type=Path)
    ap.add_argument("--text", default="Hello there. This is trident listening for speech.")
    ap.add_argument("--realtime", action="store_true", help="send a chunk every 32 ms")
    args = ap.parse_args()
    if args.repo:
        from .vad_model import write_vad_model

        print(write_vad_model(args.repo))
        return
    if args.wav:
        audio = read_wav(args.wav)
    else:
        from .speech import speech_clip

        audio = speech_clip([args.text]).audio
    stream = stream_clip(args.url, audio, sequence_id=int(time.time_ns() % 2**63) or 1, realtime=args.realtime)
    if stream.errors:
        raise SystemExit(f"errors: {stream.errors[:3]}")
    probs = [r.prob for r in sorted(stream.results, key=lambda r: r.index)]
    lat = np.array([r.latency_s for r in stream.results]) * 1e3
    print(f"{len(probs)} chunks, latency p50 {np.percentile(lat, 50):.2f} ms p99 {np.percentile(lat, 99):.2f} ms")
    for begin, end in segments(probs):
        print(f"speech {begin:6.2f} s - {end:6.2f} s")


if __name__ == "__main__":
    main()
