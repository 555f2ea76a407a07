"""Ensemble test repositories: composing Python and ONNX models and the ensembles over them.

``write_pipeline_repo(root)`` writes every model the ensemble suites use:

* ``pipeline``: ``pre`` (Python, x*2) -> ``mlp`` (ONNX, +1, dynamic batching) -> ``post``
  (Python, *10); OUT = (RAW*2 + 1) * 10.
* ``cached_pipeline``: ``pipeline`` with ``response_cache { enable: true }``.
* ``diamond``: ``split`` -> (``branch_a`` | ``branch_b``, each sleeping 0.3 s and reporting its
  start and end wall-clock times) -> ``join``.
* ``stream_pipe`` (decoupled): ``repeat`` (decoupled, N responses 0..N-1) -> ``square``.
* ``stream_direct`` (decoupled): ``repeat``'s values are the ensemble's output.
* ``stream_mixed``: ``repeat``'s values and the original N both feed ``add_n``: refused at load,
  as Triton refuses it (inputs that fan out of different decoupled models).
* ``throttled``: ``repeat_fast`` (records when it sent each value) -> ``square_slow`` (records
  when it finished), ``max_inflight_requests: 1``.
* ``slow_chain``: ``sleeper`` (sleeps SECONDS, polling cancellation, passes X on) -> ``marker``.
* ``failing``: ``pre`` -> ``fail`` (always raises).
* ``zero_copy``: ``stash`` -> ``check_shared``, which reports whether its input is the very
  array ``stash`` returned (both models run in the server's process).
* ``nested``: ``pipeline`` as a step, then ``post``.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from e2e.models import write_model
from onnx import TensorProto, helper


def _ensemble(name: str, body: str, max_batch_size: int = 0) -> str:
    return f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n{body}'


def write_ensemble(root: Path, name: str, config: str) -> None:
    """An ensemble folder: ``config.pbtxt`` and the empty version folder ``1/``."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(config)


ELEMENTWISE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        config = json.loads(args["model_config"])
        self.input = config["input"][0]["name"]
        self.output = config["output"][0]["name"]

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, self.input).as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output, (x {op}).astype(x.dtype))]))
        return out
'''


def _elementwise(root: Path, name: str, op: str, inp: str, out: str, max_batch_size: int = 8) -> None:
    write_model(root, name, f'''
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "{inp}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "{out}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
''', ELEMENTWISE_PY.replace("{op}", op))


def _elementwise_int(root: Path, name: str, op: str, inp: str, out: str, max_batch_size: int = 4) -> None:
    write_model(root, name, f'''
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "{inp}" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "{out}" data_type: TYPE_INT32 dims: [ 1 ] }} ]
''', ELEMENTWISE_PY.replace("{op}", op))


def write_onnx_add_one(root: Path, name: str = "mlp") -> None:
    """ONNX: Y = X + 1 over [-1, 4] FP32, with dynamic batching."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph([helper.make_node("Add", ["X", "one"], ["Y"])], name,
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [-1, 4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [-1, 4])], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(root / name / "1" / "model.onnx"))
    (root / name / "config.pbtxt").write_text(f'''
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
''')


BRANCH_PY = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps 0.3 s; returns its input + 1 and [start, end] wall-clock times."""

    def execute(self, requests):
        out = []
        for r in requests:
            start = time.time()
            time.sleep(0.3)
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            times = np.array([start, time.time()], np.float64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1),
                                                   pb_utils.Tensor("TIMES", times)]))
        return out
'''

SPLIT_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("A", x * 2), pb_utils.Tensor("B", x * 3)]))
        return out
'''

JOIN_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + b)]))
        return out
'''

REPEAT_PY = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: for N in IN, sends N responses OUT = 0..N-1 (with SENT_AT, when each was sent)."""

    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().reshape(-1)[0])
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([i], np.int32)),
                    pb_utils.Tensor("SENT_AT", np.array([time.time()], np.float64))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

SQUARE_PY = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = IN * IN (INT32 [1]); sleeps DELAY seconds first; DONE_AT: when it finished."""

    def initialize(self, args):
        import json
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay = float(params.get("DELAY", {}).get("string_value", "0"))

    def execute(self, requests):
        out = []
        for r in requests:
            if self.delay:
                time.sleep(self.delay)
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", (x * x).astype(np.int32)),
                pb_utils.Tensor("DONE_AT", np.array([time.time()], np.float64))]))
        return out
'''

SLEEPER_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps IN[0] seconds in small slices, stopping early when the request is cancelled."""

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            deadline = time.monotonic() + float(x.reshape(-1)[0])
            while time.monotonic() < deadline and not r.is_cancelled():
                time.sleep(0.01)
            passed = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x), pb_utils.Tensor("XO", passed)]))
        return out
'''

FAIL_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("fail always fails: bad pixel data")
'''


STASH_PY = '''
import sys
import types
import numpy as np
import triton_python_backend_utils as pb_utils

REGISTRY = sys.modules.setdefault("ensemble_zero_copy_registry", types.ModuleType("ensemble_zero_copy_registry"))
REGISTRY.__dict__.setdefault("arrays", {})


class TritonPythonModel:
    """Y = X + 1, remembering the output array under the request id (same process)."""

    def execute(self, requests):
        out = []
        for r in requests:
            y = pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1
            REGISTRY.arrays[r.request_id()] = y
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
'''

CHECK_SHARED_PY = '''
import sys
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """SHARED = whether the input X is the very array the stash step produced for this request."""

    def execute(self, requests):
        registry = sys.modules["ensemble_zero_copy_registry"]
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            produced = registry.arrays.pop(r.request_id())
            shared = np.array([np.shares_memory(x, produced)], dtype=bool)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SHARED", shared)]))
        return out
'''


def _python_model(root: Path, name: str, inputs: str, outputs: str, code: str, extra: str = "",
                  max_batch_size: int = 0) -> None:
    write_model(root, name, f'''
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {inputs} ]
output [ {outputs} ]
{extra}
''', code)


def _io(name: str, dtype: str, dims: str = "1") -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }}'


def write_pipeline_repo(root: Path) -> Path:
    """Every composing model and ensemble of the suites (see the module docstring)."""
    root.mkdir(parents=True, exist_ok=True)
    _elementwise(root, "pre", "* 2", "RAW", "NORM")
    write_onnx_add_one(root)
    _elementwise(root, "post", "* 10", "SCORES", "OUT")
    write_ensemble(root, "pipeline", _ensemble("pipeline", '''
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1 input_map { key: "RAW" value: "RAW" } output_map { key: "NORM" value: "norm" } },
  { model_name: "mlp" model_version: -1 input_map { key: "X" value: "norm" } output_map { key: "Y" value: "scores" } },
  { model_name: "post" model_version: -1 input_map { key: "SCORES" value: "scores" } output_map { key: "OUT" value: "OUT" } }
] }
''', max_batch_size=8))

    pipeline = (root / "pipeline" / "config.pbtxt").read_text()
    write_ensemble(root, "cached_pipeline", pipeline.replace('name: "pipeline"', 'name: "cached_pipeline"')
                    + "response_cache { enable: true }\n")

    f64 = "TYPE_FP64"
    _python_model(root, "split", _io("IN", "TYPE_FP32", "4"), f'{_io("A", "TYPE_FP32", "4")}, {_io("B", "TYPE_FP32", "4")}',
                  SPLIT_PY)
    for branch in ("branch_a", "branch_b"):
        _python_model(root, branch, _io("X", "TYPE_FP32", "4"), f'{_io("Y", "TYPE_FP32", "4")}, {_io("TIMES", f64, "2")}',
                      BRANCH_PY)
    _python_model(root, "join", f'{_io("A", "TYPE_FP32", "4")}, {_io("B", "TYPE_FP32", "4")}',
                  _io("SUM", "TYPE_FP32", "4"), JOIN_PY)
    write_ensemble(root, "diamond", _ensemble("diamond", '''
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "TIMES_A" data_type: TYPE_FP64 dims: [ 2 ] },
         { name: "TIMES_B" data_type: TYPE_FP64 dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "split" input_map { key: "IN" value: "IN" } output_map [ { key: "A" value: "a" }, { key: "B" value: "b" } ] },
  { model_name: "branch_a" input_map { key: "X" value: "a" } output_map [ { key: "Y" value: "a2" }, { key: "TIMES" value: "TIMES_A" } ] },
  { model_name: "branch_b" input_map { key: "X" value: "b" } output_map [ { key: "Y" value: "b2" }, { key: "TIMES" value: "TIMES_B" } ] },
  { model_name: "join" input_map [ { key: "A" value: "a2" }, { key: "B" value: "b2" } ] output_map { key: "SUM" value: "SUM" } }
] }
'''))

    i32 = "TYPE_INT32"
    decoupled = "model_transaction_policy { decoupled: true }"
    _python_model(root, "repeat", _io("IN", i32), f'{_io("OUT", i32)}, {_io("SENT_AT", f64)}', REPEAT_PY, decoupled)
    _python_model(root, "square", _io("IN", i32), f'{_io("OUT", i32)}, {_io("DONE_AT", f64)}', SQUARE_PY)
    _python_model(root, "square_slow", _io("IN", i32), f'{_io("OUT", i32)}, {_io("DONE_AT", f64)}', SQUARE_PY,
                  'parameters { key: "DELAY" value: { string_value: "0.05" } }')
    _python_model(root, "add_n", f'{_io("A", i32)}, {_io("B", i32)}', _io("SUM", i32), JOIN_PY)
    write_ensemble(root, "stream_pipe", _ensemble("stream_pipe", '''
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SQUARE" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" input_map { key: "IN" value: "N" } output_map { key: "OUT" value: "value" } },
  { model_name: "square" input_map { key: "IN" value: "value" } output_map { key: "OUT" value: "SQUARE" } }
] }
'''))
    write_ensemble(root, "stream_direct", _ensemble("stream_direct", '''
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" input_map { key: "IN" value: "N" } output_map { key: "OUT" value: "VALUE" } }
] }
'''))
    write_ensemble(root, "stream_mixed", _ensemble("stream_mixed", '''
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" input_map { key: "IN" value: "N" } output_map { key: "OUT" value: "value" } },
  { model_name: "add_n" input_map [ { key: "A" value: "value" }, { key: "B" value: "N" } ] output_map { key: "SUM" value: "SUM" } }
] }
'''))
    write_ensemble(root, "throttled", _ensemble("throttled", '''
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SQUARE" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SENT_AT" data_type: TYPE_FP64 dims: [ 1 ] },
         { name: "DONE_AT" data_type: TYPE_FP64 dims: [ 1 ] } ]
ensemble_scheduling {
  max_inflight_requests: 1
  step [
  { model_name: "repeat" input_map { key: "IN" value: "N" } output_map [ { key: "OUT" value: "value" }, { key: "SENT_AT" value: "SENT_AT" } ] },
  { model_name: "square_slow" input_map { key: "IN" value: "value" } output_map [ { key: "OUT" value: "SQUARE" }, { key: "DONE_AT" value: "DONE_AT" } ] }
] }
'''))

    f32 = "TYPE_FP32"
    _python_model(root, "sleeper", f'{_io("IN", f32)}, {_io("X", f32, "4")}',
                  f'{_io("OUT", f32)}, {_io("XO", f32, "4")}', SLEEPER_PY)
    _python_model(root, "marker", _io("X", "TYPE_FP32", "4"), _io("Y", "TYPE_FP32", "4"),
                  ELEMENTWISE_PY.replace("{op}", "+ 0"))
    write_ensemble(root, "slow_chain", _ensemble("slow_chain", '''
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "SLEPT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "sleeper" input_map [ { key: "IN" value: "SECONDS" }, { key: "X" value: "X" } ]
    output_map [ { key: "OUT" value: "SLEPT" }, { key: "XO" value: "x_after" } ] },
  { model_name: "marker" input_map { key: "X" value: "x_after" } output_map { key: "Y" value: "Y" } }
] }
'''))
    _python_model(root, "stash", _io("X", "TYPE_FP32", "4"), _io("Y", "TYPE_FP32", "4"), STASH_PY)
    _python_model(root, "check_shared", _io("X", "TYPE_FP32", "4"), _io("SHARED", "TYPE_BOOL"), CHECK_SHARED_PY)
    write_ensemble(root, "zero_copy", _ensemble("zero_copy", '''
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SHARED" data_type: TYPE_BOOL dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "stash" input_map { key: "X" value: "X" } output_map { key: "Y" value: "y" } },
  { model_name: "check_shared" input_map { key: "X" value: "y" } output_map { key: "SHARED" value: "SHARED" } }
] }
'''))
    _python_model(root, "fail", _io("X", "TYPE_FP32", "4"), _io("Y", "TYPE_FP32", "4"), FAIL_PY, max_batch_size=8)
    write_ensemble(root, "failing", _ensemble("failing", '''
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" input_map { key: "RAW" value: "RAW" } output_map { key: "NORM" value: "norm" } },
  { model_name: "fail" input_map { key: "X" value: "norm" } output_map { key: "Y" value: "Y" } }
] }
''', max_batch_size=8))
    write_ensemble(root, "nested", _ensemble("nested", '''
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "FINAL" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "pipeline" input_map { key: "RAW" value: "RAW" } output_map { key: "OUT" value: "mid" } },
  { model_name: "post" input_map { key: "SCORES" value: "mid" } output_map { key: "OUT" value: "FINAL" } }
] }
''', max_batch_size=8))
    return root
