"""Silero VAD as a trident (and Triton) model with implicit state.

Silero VAD v5 (the ONNX file inside the ``silero-vad`` package) takes ``input`` ``[batch, 576]``
(64 samples of context from the previous chunk followed by the 512 new samples at 16 kHz),
``state`` ``[2, batch, 128]`` (the LSTM state, batch in dimension 1) and ``sr`` (a scalar), and
returns ``output`` ``[batch, 1]`` (speech probability) and ``stateN``. Triton's implicit state
batches along dimension 0 and cannot feed a scalar, so :func:`build_vad_onnx` wraps the graph:

* ``AUDIO`` ``[batch, 512]`` FP32, the chunk the client sends;
* ``STATE_IN`` / ``STATE_OUT`` ``[batch, 2, 128]``: the LSTM state, transposed to Silero's layout
  on the way in and back on the way out;
* ``CONTEXT_IN`` / ``CONTEXT_OUT`` ``[batch, 64]``: the last 64 samples of the previous chunk
  (what Silero's own Python wrapper keeps between calls);
* ``sr`` is a constant 16000; ``SPEECH_PROB`` ``[batch, 1]`` is the model's ``output``.

Both states are implicit (``sequence_batching { state [...] }``): the server keeps them per
sequence between chunks and starts each sequence from zeros, so the client only sends audio.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

SAMPLE_RATE = 16_000
CHUNK = 512  # samples per request: 32 ms at 16 kHz
CONTEXT = 64  # samples of the previous chunk Silero v5 looks at
SILERO_FILE = "silero_vad_op18_ifless.onnx"  # batchable, no If on the sample rate

CONFIG = """\
name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch}
input [ {{ name: "AUDIO" data_type: TYPE_FP32 dims: [ {chunk} ] }} ]
output [ {{ name: "SPEECH_PROB" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  state [
    {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 2, 128 ]
       initial_state {{ data_type: TYPE_FP32 dims: [ 2, 128 ] zero_data: true name: "zeros" }} }},
    {{ input_name: "CONTEXT_IN" output_name: "CONTEXT_OUT" data_type: TYPE_FP32 dims: [ {context} ]
       initial_state {{ data_type: TYPE_FP32 dims: [ {context} ] zero_data: true name: "zeros" }} }}
  ]
}}
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
parameters {{ key: "inter_op_thread_count" value: {{ string_value: "1" }} }}
"""


def silero_onnx_path() -> Path:
    """The Silero VAD ONNX file shipped in the installed ``silero-vad`` package.

    Raises FileNotFoundError when the package (or the file) is missing."""
    spec = importlib.util.find_spec("silero_vad")  # locates the package without importing torch
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the silero-vad package is not installed (pip install silero-vad)")
    path = Path(spec.origin).parent / "data" / SILERO_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found in the silero-vad package")
    return path


def build_vad_onnx(source: Path | None = None) -> onnx.ModelProto:
    """Silero's graph with implicit-state-friendly inputs and outputs (see the module docstring)."""
    model = onnx.load(str(source or silero_onnx_path()))
    g = model.graph
    names = {i.name for i in g.input}
    if names != {"input", "state", "sr"} or {o.name for o in g.output} != {"output", "stateN"}:
        raise ValueError(f"unexpected Silero signature: inputs {sorted(names)}")
    for i in list(g.input):
        g.input.remove(i)
    for o in list(g.output):
        g.output.remove(o)
    fp32 = TensorProto.FLOAT
    g.input.extend([
        helper.make_tensor_value_info("AUDIO", fp32, ["batch", CHUNK]),
        helper.make_tensor_value_info("STATE_IN", fp32, ["batch", 2, 128]),
        helper.make_tensor_value_info("CONTEXT_IN", fp32, ["batch", CONTEXT]),
    ])
    g.output.extend([
        helper.make_tensor_value_info("SPEECH_PROB", fp32, ["batch", 1]),
        helper.make_tensor_value_info("STATE_OUT", fp32, ["batch", 2, 128]),
        helper.make_tensor_value_info("CONTEXT_OUT", fp32, ["batch", CONTEXT]),
    ])
    pre = [
        helper.make_node("Concat", ["CONTEXT_IN", "AUDIO"], ["input"], axis=1, name="wrap_concat"),
        helper.make_node("Transpose", ["STATE_IN"], ["state"], perm=[1, 0, 2], name="wrap_state_in"),
        helper.make_node("Constant", [], ["sr"], name="wrap_sr",
                         value=helper.make_tensor("sr_value", TensorProto.INT64, [], [SAMPLE_RATE])),
        helper.make_node("Constant", [], ["wrap_ctx_start"], name="wrap_ctx_start",
                         value=helper.make_tensor("ctx_start", TensorProto.INT64, [1], [CHUNK])),
        helper.make_node("Constant", [], ["wrap_ctx_end"], name="wrap_ctx_end",
                         value=helper.make_tensor("ctx_end", TensorProto.INT64, [1], [CHUNK + CONTEXT])),
        helper.make_node("Constant", [], ["wrap_ctx_axis"], name="wrap_ctx_axis",
                         value=helper.make_tensor("ctx_axis", TensorProto.INT64, [1], [1])),
    ]
    post = [
        helper.make_node("Identity", ["output"], ["SPEECH_PROB"], name="wrap_prob"),
        helper.make_node("Transpose", ["stateN"], ["STATE_OUT"], perm=[1, 0, 2], name="wrap_state_out"),
        helper.make_node("Slice", ["input", "wrap_ctx_start", "wrap_ctx_end", "wrap_ctx_axis"],
                         ["CONTEXT_OUT"], name="wrap_ctx_out"),
    ]
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(pre + nodes + post)
    onnx.checker.check_model(model)
    return model


def write_vad_model(repo: Path, name: str = "silero_vad", *, max_batch: int = 16, instances: int = 1,
                    idle_us: int = 5_000_000, delay_us: int = 1000, min_util: float = 0.0,
                    oldest: int = 0) -> Path:
    """Write ``<repo>/<name>/`` (config.pbtxt and 1/model.onnx) and return the model's folder.

    The strategy is ``direct`` (one slot per sequence, ``max_batch`` slots per instance; idle
    slots below a busy one run as null requests) unless ``oldest`` > 0: then ``oldest`` candidate
    sequences per instance, and a batch holds only sequences that have a chunk waiting."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(build_vad_onnx(), str(folder / "1" / "model.onnx"))
    strategy = (f"oldest {{ max_candidate_sequences: {oldest} max_queue_delay_microseconds: {delay_us} }}"
                if oldest else
                f"direct {{ max_queue_delay_microseconds: {delay_us} minimum_slot_utilization: {min_util} }}")
    (folder / "config.pbtxt").write_text(CONFIG.format(
        name=name, max_batch=max_batch, instances=instances, idle_us=idle_us, strategy=strategy,
        chunk=CHUNK, context=CONTEXT))
    return folder


def reference_probs(audio: np.ndarray) -> np.ndarray:
    """Speech probability per 512-sample chunk from Silero's own graph run in-process (the
    original file, with the context and state kept here as Silero's Python wrapper does)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    original = silero_onnx_path().with_name("silero_vad.onnx")  # the package's default file
    sess = ort.InferenceSession(str(original), opts, providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros((1, CONTEXT), np.float32)
    out = []
    for start in range(0, len(audio) - CHUNK + 1, CHUNK):
        x = np.concatenate([context, audio[None, start:start + CHUNK]], axis=1).astype(np.float32)
        prob, state = sess.run(None, {"input": x, "state": state, "sr": np.array(SAMPLE_RATE, np.int64)})
        context = x[:, -CONTEXT:]
        out.append(float(prob[0, 0]))
    return np.array(out, np.float32)
