"""Streaming audio (issue [17] part 1): Silero VAD from the ``silero-vad`` package, served by the
onnxruntime backend with the sequence batcher and implicit state, driven by tritonclient's
bidirectional ModelStreamInfer (one stream and one sequence per audio stream), on real speech
mixed with silence: two phrases espeak-ng spoke once, committed in data/speech/ (``make.sh``
there made them), so the run needs no speech synthesizer.

The model folder is written at test time (examples/streaming/vad_model.py wraps Silero's graph so
its LSTM state and 64-sample context are implicit states). The slot test's model has 2 slots
(``max_batch_size`` 2, one instance, idle timeout 1 s), so it sees exactly when a stream's slot
is freed.
"""

from __future__ import annotations

import gzip
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from examples.streaming.audio_client import VadStream, chunks, stream_clip
from examples.streaming.speech import Clip, mix_speech, wav_samples
from examples.streaming.vad_model import CHUNK, reference_probs, write_vad_model
from tests.e2e.conftest import start_server

pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation

IDLE_S = 1.0
MARGIN = 4800  # 300 ms around speech edges: Silero's onset/offset lag
# espeak-ng's WAVs of "Hello there, this is a test." and "Streaming speech detection works."
SPEECH = [Path(__file__).parent / "data" / "speech" / name
          for name in ("hello_there.wav.gz", "streaming_speech_detection.wav.gz")]


@pytest.fixture(scope="module")
def clip() -> Clip:
    return mix_speech([wav_samples(gzip.decompress(path.read_bytes())) for path in SPEECH], silence_s=0.8)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, grpc_http2: str):
    repo: Path = tmp_path_factory.mktemp("vad")
    write_vad_model(repo, "silero_vad", max_batch=4, idle_us=10_000_000, delay_us=2000, min_util=0.5)
    write_vad_model(repo, "silero_vad_2slots", max_batch=2, idle_us=int(IDLE_S * 1e6), delay_us=0)
    s = start_server(repo=repo)
    yield s
    s.stop()


def _stats(url: str, model: str) -> tuple[int, int]:
    with grpcclient.InferenceServerClient(url) as c:
        st = c.get_inference_statistics(model).model_stats[0]
    return st.inference_count, st.execution_count


def _check_vad(probs: np.ndarray, clip: Clip) -> None:
    labels = clip.chunk_labels(CHUNK, MARGIN)  # whole chunks only: the padded last one has no label
    probs = probs[:len(labels)]
    speech = [p for p, lab in zip(probs, labels, strict=True) if lab is True]
    silence = [p for p, lab in zip(probs, labels, strict=True) if lab is False]
    assert len(speech) > 40 and len(silence) > 40
    assert np.mean(np.array(speech) > 0.5) > 0.85, speech  # espeak's pauses between words dip below
    assert np.mean(np.array(silence) < 0.5) > 0.97, silence


def test_concurrent_streams_batch_and_tell_speech_from_silence(server, clip: Clip) -> None:
    """Four streams at once, each its own sequence with its own audio (the clip delayed by a
    different amount of silence): every chunk's probability equals Silero's own in-process run of
    that stream (state and context carried per stream while batched), speech is above 0.5 and
    silence below, and the streams were batched (fewer executions than inferences)."""
    before = _stats(server.grpc_url, "silero_vad")
    rng = np.random.default_rng(1)
    audios = [np.concatenate([rng.normal(0, 0.002, k * 2400).astype(np.float32), clip.audio]) for k in range(4)]
    results: dict[int, VadStream] = {}

    def run(k: int) -> None:
        results[k] = stream_clip(server.grpc_url, audios[k], sequence_id=1000 + k, timeout=30)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    for k, stream in results.items():
        assert stream.errors == []
        assert [r.index for r in stream.results] == list(range(len(list(chunks(audios[k])))))  # in order
        probs = np.array([r.prob for r in stream.results])
        ref = reference_probs(audios[k])
        np.testing.assert_allclose(probs[:len(ref)], ref, atol=1e-4)
        shifted = Clip(audios[k], tuple((s + k * 2400, e + k * 2400) for s, e in clip.speech))
        _check_vad(probs, shifted)
    inferences, executions = (a - b for a, b in zip(_stats(server.grpc_url, "silero_vad"), before, strict=True))
    assert inferences == sum(len(list(chunks(a))) for a in audios)
    assert executions < inferences * 0.8  # chunks of different streams shared executions


def _answered(stream: VadStream, n: int, timeout: float = 10.0) -> None:
    stream.wait(n, timeout)
    assert stream.errors == [], stream.errors


def _first(stream: VadStream, clip: Clip, *, end: bool = False) -> None:
    stream.send(next(chunks(clip.audio)), start=True, end=end)


def test_end_idle_and_cancel_free_the_slot(server, clip: Clip) -> None:
    """Two slots. A and B hold them; C waits (backlog). A's END frees a slot for C. D waits; B
    goes idle past max_sequence_idle_microseconds and loses its slot (and state: its next chunk
    without START is refused) so D runs. E waits and is cancelled; when a slot frees (C ends), E's
    cancelled request releases its sequence instead of keeping the slot, so F gets it."""
    model = "silero_vad_2slots"
    url = server.grpc_url
    pieces = list(chunks(clip.audio))
    a, b, c, d, e, f = (VadStream(url, 2000 + i, model) for i in range(6))
    try:
        _first(a, clip)
        _first(b, clip)
        _answered(a, 1)
        _answered(b, 1)
        _first(c, clip)
        time.sleep(0.3)
        assert c.results == [] and c.errors == []  # no slot yet
        a.send(pieces[1], end=True)
        _answered(a, 2)
        _answered(c, 1)  # A's slot went to C

        _first(d, clip)
        c.send(pieces[1])
        _answered(c, 2)  # C keeps its slot busy while B idles
        deadline = time.monotonic() + IDLE_S + 5
        while not d.results and time.monotonic() < deadline:
            c.send(pieces[2])
            c.wait(len(c.results) + 1)
            time.sleep(0.1)
        _answered(d, 1)  # B's slot went to D after B's idle timeout
        assert "timed out" in server.log()
        b.send(pieces[1])  # B's state is gone: no START, refused
        b.wait(2)
        assert "must specify the START flag" in b.errors[0]

        _first(e, clip)
        time.sleep(0.2)
        assert e.results == []
        e.close(cancel=True)
        _first(f, clip)
        c.send(pieces[3], end=True)
        _answered(c, len(c.results) + 1)
        _answered(f, 1)  # E's cancelled request released its sequence instead of holding the slot
        g = VadStream(url, 2004, model)  # E's sequence id: released, so a new START is served
        try:
            _first(g, clip, end=True)
            d.send(pieces[1], end=True)  # free D's slot for G
            _answered(g, 1)
        finally:
            g.close()
    finally:
        for s in (a, b, c, d, f):
            s.close()


def test_restarted_sequence_starts_from_fresh_state(server, clip: Clip) -> None:
    """A sequence id used again after its END starts from the initial state: the same audio gives
    the same probabilities as the first time (and as Silero in-process)."""
    first = stream_clip(server.grpc_url, clip.audio[:16000], sequence_id="restart-me")
    again = stream_clip(server.grpc_url, clip.audio[:16000], sequence_id="restart-me")
    p1 = [r.prob for r in first.results]
    p2 = [r.prob for r in again.results]
    assert p1 == p2
    np.testing.assert_allclose(p1[:len(reference_probs(clip.audio[:16000]))], reference_probs(clip.audio[:16000]),
                               atol=1e-4)


def test_bad_input_errors_on_the_stream_and_the_stream_goes_on(server, clip: Clip) -> None:
    """Wrong chunk length, a wrong datatype, a state input sent by the client, no sequence id and
    no START: each gets its own error on the stream, and the stream then serves a good chunk."""
    stream = VadStream(server.grpc_url, 3000)
    try:
        short = grpcclient.InferInput("AUDIO", [1, 256], "FP32")
        short.set_data_from_numpy(np.zeros((1, 256), np.float32))
        wrong_type = grpcclient.InferInput("AUDIO", [1, CHUNK], "INT16")
        wrong_type.set_data_from_numpy(np.zeros((1, CHUNK), np.int16))
        audio = grpcclient.InferInput("AUDIO", [1, CHUNK], "FP32")
        audio.set_data_from_numpy(np.zeros((1, CHUNK), np.float32))
        state = grpcclient.InferInput("STATE_IN", [1, 2, 128], "FP32")
        state.set_data_from_numpy(np.zeros((1, 2, 128), np.float32))
        stream.send_inputs([short], start=True, sequence_id=3001)
        stream.send_inputs([wrong_type], start=True, sequence_id=3002)
        stream.send_inputs([audio, state], start=True, sequence_id=3003)
        stream.send_inputs([audio], start=True, sequence_id=0)
        stream.send_inputs([audio], sequence_id=3004)
        stream.wait(5)
        assert len(stream.errors) == 5 and stream.results == []
        joined = "\n".join(stream.errors)
        for needle in ("AUDIO", "INT16", "STATE_IN", "correlation ID", "START flag"):
            assert needle in joined, (needle, stream.errors)
        stream.send(next(chunks(clip.audio)), start=True, end=True)
        stream.wait(6)
        assert len(stream.results) == 1 and 0.0 <= stream.results[0].prob <= 1.0
    finally:
        stream.close()


def test_a_sequence_model_that_served_unloads_and_the_server_exits(tmp_path: Path) -> None:
    """Regression: the sequence batcher runs batches through a wrapper of each instance, and the
    executor gave the wrapper an instance thread of its own that unloading never ended: the unload
    call of a sequence model that had served a request never returned, and the server's exit
    waited its whole exit timeout (30 s) for that thread."""
    write_vad_model(tmp_path, "silero_vad", max_batch=2)
    s = start_server("--model-control-mode=explicit", "--load-model=silero_vad", "--exit-timeout-secs=120",
                     repo=tmp_path)
    try:
        with grpcclient.InferenceServerClient(s.grpc_url) as c:
            audio = grpcclient.InferInput("AUDIO", [1, CHUNK], "FP32")
            audio.set_data_from_numpy(np.zeros((1, CHUNK), np.float32))
            c.infer("silero_vad", [audio], sequence_id=7, sequence_start=True, sequence_end=True)
            c.unload_model("silero_vad", client_timeout=30)  # returns once the model has unloaded
            assert [(m.name, m.state) for m in c.get_model_repository_index().models] == [("silero_vad", "UNAVAILABLE")]
            c.load_model("silero_vad", client_timeout=60)  # and loads again
            c.infer("silero_vad", [audio], sequence_id=7, sequence_start=True, sequence_end=True)
    finally:
        rc = s.stop(timeout=60)
    assert rc == 0
    assert "exit timeout" not in s.log()
