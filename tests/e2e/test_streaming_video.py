"""Streaming video (issue [17] part 2): generated camera frames through PP-OCRv4 text detection
(the ONNX file inside ``rapidocr-onnxruntime``), one tritonclient ModelStreamInfer per camera,
frames of all cameras batched by the dynamic batcher, per-frame results in order; the client's
latest-frame-wins option and a slow reader.

The model folder is written at test time (examples/streaming/video_model.py: UINT8 frames in, a
max-pooled UINT8 text mask out). Each frame draws its label at a different place, so a result is
checked against the frame it answers.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from examples.streaming.frames import frame, iou, mask_box
from examples.streaming.video_client import CameraStream, run_camera
from examples.streaming.video_model import CELL, HEIGHT, WIDTH, write_detector_model
from tests.e2e.conftest import start_server

pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, grpc_http2: str):
    repo: Path = tmp_path_factory.mktemp("video")
    write_detector_model(repo, "text_detector", batching=True, max_batch=8, delay_us=5000)
    s = start_server(repo=repo)
    yield s
    s.stop()


def _stats(url: str) -> tuple[int, int]:
    with grpcclient.InferenceServerClient(url) as c:
        st = c.get_inference_statistics("text_detector").model_stats[0]
    return st.inference_count, st.execution_count


def _check_results(stream: CameraStream, camera: int) -> None:
    """No errors, and each result shows the label where its own frame drew it."""
    assert stream.errors == []
    for r in stream.results:
        assert r.mask.shape == (HEIGHT // CELL, WIDTH // CELL) and r.mask.dtype == np.uint8
        found = mask_box(r.mask, CELL)
        assert found is not None, f"camera {camera} frame {r.index}: no text found"
        assert iou(found, frame(camera, r.index)[1]) > 0.3, (camera, r.index, found)


def test_cameras_batch_together_and_results_come_back_in_order(server) -> None:
    before = _stats(server.grpc_url)
    cameras, n = 4, 8
    videos = {c: [frame(c, i)[0] for i in range(n)] for c in range(cameras)}
    out: dict[int, CameraStream] = {}

    def run(c: int) -> None:
        out[c] = run_camera(server.grpc_url, c, videos[c], window=4, drop="none")

    threads = [threading.Thread(target=run, args=(c,)) for c in range(cameras)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(out) == list(range(cameras))
    for c, stream in out.items():
        assert [r.index for r in stream.results] == list(range(n))  # every frame, in order
        assert stream.dropped == 0
        _check_results(stream, c)
    inferences, executions = (a - b for a, b in zip(_stats(server.grpc_url), before, strict=True))
    assert inferences == cameras * n
    assert executions < inferences  # frames of different cameras shared executions


def test_latest_frame_wins_answers_the_newest_frames(server) -> None:
    """A camera offering 30 frames at once with one frame in flight: older held frames are
    dropped, the answered ones increase, the last frame is always answered, and every answer is
    for its own frame."""
    video = [frame(5, i)[0] for i in range(30)]
    stream = run_camera(server.grpc_url, 5, video, window=1, drop="latest")
    indices = [r.index for r in stream.results]
    assert stream.dropped > 0 and stream.sent + stream.dropped == 30 and len(indices) == stream.sent
    assert indices == sorted(set(indices)) and indices[0] == 0 and indices[-1] == 29
    _check_results(stream, 5)


def test_slow_reader_gets_everything_in_order_without_stalling_others(server) -> None:
    """Camera 6 reads its responses slowly (0.4 s each) with 8 frames in flight; camera 7, on
    its own connection, is served meanwhile (it finishes before camera 6 has read its answers);
    camera 6 still gets all 8 frames, in order."""
    slow = CameraStream(server.grpc_url, 6, window=8, drop="none", on_result_delay_s=0.4)
    try:
        for i in range(8):
            slow.offer(i, frame(6, i)[0])
        fast = run_camera(server.grpc_url, 7, [frame(7, i)[0] for i in range(6)], window=2)
        assert [r.index for r in fast.results] == list(range(6))
        _check_results(fast, 7)
        assert len(slow.results) < 8  # the fast camera finished while the slow one was still reading
        slow.drain()
        assert [r.index for r in slow.results] == list(range(8))
        _check_results(slow, 6)
    finally:
        slow.close()


def test_bad_frames_get_errors_on_the_stream_and_it_goes_on(server) -> None:
    stream = CameraStream(server.grpc_url, 8, window=8)
    try:
        small = grpcclient.InferInput("FRAME", [1, 64, 64, 3], "UINT8")
        small.set_data_from_numpy(np.zeros((1, 64, 64, 3), np.uint8))
        floats = grpcclient.InferInput("FRAME", [1, HEIGHT, WIDTH, 3], "FP32")
        floats.set_data_from_numpy(np.zeros((1, HEIGHT, WIDTH, 3), np.float32))
        too_many = grpcclient.InferInput("FRAME", [9, HEIGHT, WIDTH, 3], "UINT8")
        too_many.set_data_from_numpy(np.zeros((9, HEIGHT, WIDTH, 3), np.uint8))
        for inp in (small, floats, too_many):
            stream.send_inputs([inp])
        stream.send_inputs([small], model="no_such_camera_model")
        stream.offer(0, frame(8, 0)[0])
        stream.drain()
        assert len(stream.errors) == 4, stream.errors
        joined = "\n".join(stream.errors)
        for needle in ("FRAME", "FP32", "batch", "no_such_camera_model"):
            assert needle in joined, (needle, stream.errors)
        assert [r.index for r in stream.results] == [0]
        stream.errors.clear()
        _check_results(stream, 8)
    finally:
        stream.close()
    with pytest.raises(ValueError, match="drop must be one of"):
        CameraStream(server.grpc_url, 9, drop="oldest")
