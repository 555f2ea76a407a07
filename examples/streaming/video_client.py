"""One bidirectional gRPC ModelStreamInfer per camera: frames go up, per-frame text masks come
back, in frame order.

A camera offers frames at its own pace; the stream keeps at most ``window`` frames in flight.
What happens to a frame offered while the window is full is the client's ``drop`` option:

* ``drop="none"``: ``offer`` blocks until a response frees a place (back-pressure reaches the
  camera; every frame is answered);
* ``drop="latest"`` (latest frame wins): ``offer`` never blocks; the frame waits in a one-frame
  holding place, replacing (dropping) any older frame there, and is sent when a response frees
  a place. A camera that outruns the server therefore sees only its newest frames answered, with
  bounded latency, and ``dropped`` counts what was skipped.

Results are checked to arrive in the order frames were sent (the model's dynamic batcher uses
``preserve_ordering``; a response out of order raises in ``results``' consumer via ``errors``).

    python -m examples.streaming.video_client --url 127.0.0.1:8001 --cameras 4 --frames 50 --fps 15
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

DROP_POLICIES = ("none", "latest")


@dataclass
class FrameResult:
    index: int
    mask: np.ndarray
    latency_s: float  # from the frame being offered to its response arriving


@dataclass
class CameraStream:
    """One camera: a tritonclient gRPC client with one stream. See the module docstring."""

    url: str
    camera: int
    model: str = "text_detector"
    window: int = 2
    drop: str = "none"
    on_result_delay_s: float = 0.0  # a slow consumer: sleep this long in each response callback
    results: list[FrameResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dropped: int = 0
    sent: int = 0

    def __post_init__(self) -> None:
        if self.drop not in DROP_POLICIES:
            raise ValueError(f"drop must be one of {DROP_POLICIES}, not {self.drop!r}")
        if self.window < 1:
            raise ValueError("window must be at least 1")
        self._cond = threading.Condition()
        self._in_flight: dict[str, tuple[int, float]] = {}
        self._order: list[str] = []  # request ids in the order they were sent
        self._held: tuple[int, np.ndarray, float] | None = None
        self._client = grpcclient.InferenceServerClient(self.url)
        self._client.start_stream(callback=self._on_response)

    def _send(self, index: int, frame: np.ndarray, offered: float) -> None:  # caller holds _cond
        inp = grpcclient.InferInput("FRAME", [1, *frame.shape], "UINT8")
        inp.set_data_from_numpy(frame[None])
        self._send_inputs(index, [inp], offered, self.model)

    def _send_inputs(self, index: int, inputs: list[grpcclient.InferInput], offered: float, model: str) -> None:
        rid = f"{self.camera}:{self.sent}"
        self._in_flight[rid] = (index, offered)
        self._order.append(rid)
        self.sent += 1
        self._client.async_stream_infer(model, inputs, request_id=rid)

    def send_inputs(self, inputs: list[grpcclient.InferInput], model: str | None = None) -> None:
        """Send a request with these inputs (any, also wrong ones) outside the frame window,
        counted in order like a frame; its result, if any, has index -1."""
        with self._cond:
            self._send_inputs(-1, inputs, time.perf_counter(), model or self.model)

    def offer(self, index: int, frame: np.ndarray, timeout: float = 30.0) -> None:
        """Hand the camera's frame ``index`` to the stream, per the ``drop`` policy.

        Raises TimeoutError when ``drop="none"`` and no place frees within ``timeout``."""
        now = time.perf_counter()
        with self._cond:
            if len(self._in_flight) < self.window:
                self._send(index, frame, now)
            elif self.drop == "latest":
                if self._held is not None:
                    self.dropped += 1
                self._held = (index, frame, now)
            elif not self._cond.wait_for(lambda: len(self._in_flight) < self.window, timeout):
                raise TimeoutError(f"camera {self.camera}: no response within {timeout} s")
            else:
                self._send(index, frame, now)

    def _on_response(self, result: grpcclient.InferResult | None, error: InferenceServerException | None) -> None:
        now = time.perf_counter()
        if self.on_result_delay_s:
            time.sleep(self.on_result_delay_s)
        with self._cond:
            if error is not None:
                self.errors.append(str(error))
                if self._order:  # errors carry no id: they answer the oldest request in flight
                    self._in_flight.pop(self._order.pop(0), None)
            else:
                assert result is not None
                rid = result.get_response().id
                if rid not in self._in_flight:
                    self.errors.append(f"camera {self.camera}: response to unknown request {rid!r}")
                else:
                    if self._order[0] != rid:
                        self.errors.append(f"camera {self.camera}: response {rid} out of order "
                                           f"(expected {self._order[0]})")
                    self._order.remove(rid)
                    index, offered = self._in_flight.pop(rid)
                    self.results.append(FrameResult(index, result.as_numpy("MASK")[0], now - offered))
            if self._held is not None and len(self._in_flight) < self.window:
                index, frame, offered = self._held
                self._held = None
                self._send(index, frame, offered)
            self._cond.notify_all()

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until every sent (and held) frame is answered; raises TimeoutError."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._in_flight and self._held is None, timeout):
                raise TimeoutError(f"camera {self.camera}: {len(self._in_flight)} frames unanswered")

    def close(self, *, cancel: bool = False) -> None:
        self._client.stop_stream(cancel_requests=cancel)
        self._client.close()


def run_camera(url: str, camera: int, frames: list[np.ndarray], *, fps: float = 0.0, window: int = 2,
               drop: str = "none", model: str = "text_detector") -> CameraStream:
    """Offer ``frames`` (every 1/fps s, or as fast as the policy lets with ``fps`` 0), drain, close."""
    stream = CameraStream(url, camera, model, window=window, drop=drop)
    try:
        t0 = time.perf_counter()
        for i, f in enumerate(frames):
            if fps:
                time.sleep(max(0.0, t0 + i / fps - time.perf_counter()))
            stream.offer(i, f)
        stream.drain()
    finally:
        stream.close()
    return stream


def main() -> None:
    from .frames import frame, iou, mask_box
    from .video_model import CELL, write_detector_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="127.0.0.1:8001")
    ap.add_argument("--repo", help="write the text_detector model folder here and exit")
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--fps", type=float, default=15.0)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--drop", choices=DROP_POLICIES, default="latest")
    args = ap.parse_args()
    if args.repo:
        from pathlib import Path

        print(write_detector_model(Path(args.repo)))
        return
    videos = [[frame(c, i) for i in range(args.frames)] for c in range(args.cameras)]
    out: dict[int, CameraStream] = {}
    threads = [threading.Thread(target=lambda c=c: out.__setitem__(
        c, run_camera(args.url, c, [f for f, _ in videos[c]], fps=args.fps, window=args.window, drop=args.drop)))
        for c in range(args.cameras)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c, s in sorted(out.items()):
        lat = np.array([r.latency_s for r in s.results]) * 1e3
        hits = [iou(b, videos[c][r.index][1]) > 0.3 if (b := mask_box(r.mask, CELL)) else False for r in s.results]
        p50, p99 = np.percentile(lat, [50, 99])
        print(f"camera {c}: {len(s.results)} answered, {s.dropped} dropped, {len(s.errors)} errors, "
              f"text found in {sum(hits)}, latency p50 {p50:.1f} ms p99 {p99:.1f} ms")


if __name__ == "__main__":
    main()
