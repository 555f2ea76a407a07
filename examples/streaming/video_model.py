"""PP-OCRv4 text detection (the ONNX file inside the ``rapidocr-onnxruntime`` package) as a
trident (and Triton) model for per-camera video streams.

The packaged graph takes ``x`` ``[batch, 3, H, W]`` (normalized RGB) and returns ``[batch, 1, H,
W]`` text probabilities. :func:`build_detector_onnx` wraps it so a client sends raw frames and
gets back a small mask:

* ``FRAME`` ``[batch, H, W, 3]`` UINT8, RGB as a camera or PIL gives it (normalized in-graph:
  ``x / 127.5 - 1``, then NCHW);
* ``MASK`` ``[batch, H/4, W/4]`` UINT8: 1 where some pixel of the 4x4 cell has text probability
  above 0.3 (max-pooled), so a 320x192 frame answers 80x48 bytes instead of 240 KiB of floats.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
from onnx import TensorProto, helper

HEIGHT, WIDTH = 192, 320  # multiples of 32, as the detector's strides need
CELL = 4
THRESHOLD = 0.3
DETECTOR_FILE = "ch_PP-OCRv4_det_infer.onnx"

_CONFIG = """\
name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch}
input [ {{ name: "FRAME" data_type: TYPE_UINT8 dims: [ {h}, {w}, 3 ] }} ]
output [ {{ name: "MASK" data_type: TYPE_UINT8 dims: [ {mh}, {mw} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{batching}
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{threads}" }} }}
parameters {{ key: "inter_op_thread_count" value: {{ string_value: "1" }} }}
"""


def detector_onnx_path() -> Path:
    """The text-detection ONNX file shipped in the installed ``rapidocr-onnxruntime`` package.

    Raises FileNotFoundError when the package (or the file) is missing."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # locates it without importing OpenCV
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the rapidocr-onnxruntime package is not installed")
    path = Path(spec.origin).parent / "models" / DETECTOR_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found in the rapidocr-onnxruntime package")
    return path


def build_detector_onnx(source: Path | None = None) -> onnx.ModelProto:
    """The detector with a UINT8 NHWC ``FRAME`` input and a pooled UINT8 ``MASK`` output."""
    model = onnx.load(str(source or detector_onnx_path()))
    g = model.graph
    if [i.name for i in g.input] != ["x"] or len(g.output) != 1:
        raise ValueError(f"unexpected detector signature: {[i.name for i in g.input]}")
    prob = g.output[0].name
    g.input.remove(g.input[0])
    g.output.remove(g.output[0])
    g.input.append(helper.make_tensor_value_info("FRAME", TensorProto.UINT8, ["batch", HEIGHT, WIDTH, 3]))
    g.output.append(helper.make_tensor_value_info("MASK", TensorProto.UINT8,
                                                  ["batch", HEIGHT // CELL, WIDTH // CELL]))

    def const(name: str, value: float | list[int], dtype: int = TensorProto.FLOAT) -> onnx.NodeProto:
        vals = value if isinstance(value, list) else [value]
        dims = [len(vals)] if isinstance(value, list) else []
        return helper.make_node("Constant", [], [name], name=name,
                                value=helper.make_tensor(name + "_v", dtype, dims, vals))

    pre = [
        helper.make_node("Cast", ["FRAME"], ["wrap_f"], to=TensorProto.FLOAT, name="wrap_cast"),
        const("wrap_scale", 1 / 127.5), const("wrap_one", 1.0),
        helper.make_node("Mul", ["wrap_f", "wrap_scale"], ["wrap_scaled"], name="wrap_mul"),
        helper.make_node("Sub", ["wrap_scaled", "wrap_one"], ["wrap_norm"], name="wrap_sub"),
        helper.make_node("Transpose", ["wrap_norm"], ["x"], perm=[0, 3, 1, 2], name="wrap_nchw"),
    ]
    post = [
        helper.make_node("MaxPool", [prob], ["wrap_pooled"], kernel_shape=[CELL, CELL], strides=[CELL, CELL],
                         name="wrap_pool"),
        const("wrap_thr", THRESHOLD),
        helper.make_node("Greater", ["wrap_pooled", "wrap_thr"], ["wrap_hit"], name="wrap_gt"),
        helper.make_node("Cast", ["wrap_hit"], ["wrap_u8"], to=TensorProto.UINT8, name="wrap_cast_out"),
        helper.make_node("Squeeze", ["wrap_u8"], ["MASK"], axes=[1], name="wrap_squeeze"),  # opset 11
    ]
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(pre + nodes + post)
    onnx.checker.check_model(model)
    return model


def write_detector_model(repo: Path, name: str = "text_detector", *, batching: bool = True, max_batch: int = 8,
                         delay_us: int = 2000, threads: int = 1) -> Path:
    """Write ``<repo>/<name>/`` and return the folder. ``batching`` turns on the dynamic batcher
    (``preserve_ordering``, ``max_queue_delay_microseconds`` = ``delay_us``); without it each
    frame runs alone, in arrival order."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(build_detector_onnx(), str(folder / "1" / "model.onnx"))
    dyn = (f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} preserve_ordering: true }}"
           if batching else "")
    (folder / "config.pbtxt").write_text(_CONFIG.format(
        name=name, max_batch=max_batch, h=HEIGHT, w=WIDTH, mh=HEIGHT // CELL, mw=WIDTH // CELL,
        batching=dyn, threads=threads))
    return folder
