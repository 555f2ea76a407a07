"""An ONNX model whose run takes as long as a test asks, made at test time with onnx.helper (no
downloads): served by the onnxruntime and the OpenVINO backends alike.

Inputs ``INPUT0`` FP32 [4] and ``COUNT`` INT64 [1] (batched). The run pushes a [max(COUNT), 128]
FP32 tensor through ``LAYERS`` MatMul + Tanh nodes (a chain of graph nodes, so both frameworks
can stop between nodes; OpenVINO's CPU plugin does not stop inside a Loop), so its time grows
with COUNT: ``OUTPUT0`` = INPUT0 + COUNT (exact, per request), ``OUTPUT1`` [1] the sum of the
last layer per request (what keeps the chain from being optimised away).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DIM = 128
LAYERS = 100


def long_graph(path: Path, layers: int = LAYERS, dim: int = DIM) -> None:
    """Write the model to ``path`` (about 70 KB)."""
    rng = np.random.RandomState(0)
    inits = [
        numpy_helper.from_array((rng.randn(dim, dim) / np.sqrt(dim)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.rand(1, dim).astype(np.float32), "ROW"),
        numpy_helper.from_array(np.array([dim], np.int64), "DIMS"),
        numpy_helper.from_array(np.array([1], np.int64), "ONE"),
    ]
    nodes = [
        helper.make_node("ReduceMax", ["COUNT"], ["cmax2"], keepdims=1),  # [1, 1]
        helper.make_node("Reshape", ["cmax2", "ONE"], ["rows"]),  # [1]
        helper.make_node("Concat", ["rows", "DIMS"], ["hshape"], axis=0),
        helper.make_node("Expand", ["ROW", "hshape"], ["h0"]),  # [rows, dim]
    ]
    last = "h0"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [last, "W"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
        last = f"h{i + 1}"
    nodes += [
        helper.make_node("ReduceSum", [last], ["total"], keepdims=0),  # scalar
        helper.make_node("Cast", ["COUNT"], ["countf"], to=TensorProto.FLOAT),  # [b, 1]
        helper.make_node("Add", ["INPUT0", "countf"], ["OUTPUT0"]),
        helper.make_node("Mul", ["countf", "zero_f"], ["zeros"]),  # [b, 1] of 0
        helper.make_node("Add", ["zeros", "total"], ["OUTPUT1"]),
    ]
    inits.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"))
    graph = helper.make_graph(
        nodes, "long_run",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["b", 4]),
         helper.make_tensor_value_info("COUNT", TensorProto.INT64, ["b", 1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b", 4]),
         helper.make_tensor_value_info("OUTPUT1", TensorProto.FLOAT, ["b", 1])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def config(name: str, backend: str, batching: str = "") -> str:
    """One CPU instance on one thread (the shared test machine), inputs as above."""
    threads = ('parameters { key: "intra_op_thread_count" value: { string_value: "1" } }'
               if backend == "onnxruntime" else
               'parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }\n'
               'parameters { key: "NUM_STREAMS" value: { string_value: "1" } }')
    return f'''
name: "{name}"
backend: "{backend}"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
        {{ name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{threads}
{batching}
'''


def write_long_model(repo: Path, name: str, backend: str, batching: str = "") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    filename = "model.onnx"
    if backend == "openvino":
        (folder / "config.pbtxt").write_text(config(name, backend, batching)
                                             + 'default_model_filename: "model.onnx"\n')
    else:
        (folder / "config.pbtxt").write_text(config(name, backend, batching))
    long_graph(folder / "1" / filename)
    return folder
