"""Typical Triton Python-backend models, written as a Triton user would, for the e2e suites.

``build_repo(root, names, mode=...)`` writes a repository; ``mode="process"`` adds the
``TRIDENT_EXECUTION_MODE`` parameter so every model runs process-isolated.
"""

from __future__ import annotations

from pathlib import Path

from trident.options import EXAMPLE_REPOSITORY

MODELS: dict[str, tuple[str, str]] = {}  # name -> (config.pbtxt, model.py)

MODELS["add_sub"] = (
    (EXAMPLE_REPOSITORY / "add_sub" / "config.pbtxt").read_text(),
    (EXAMPLE_REPOSITORY / "add_sub" / "1" / "model.py").read_text(),
)

MODELS["bls"] = ('''
name: "bls"
backend: "python"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
''', '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls add_sub (exec) and the decoupled repeater (exec(decoupled=True)) per request."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.Tensor("INPUT0", a.reshape(1, 16)), pb_utils.Tensor("INPUT1", b.reshape(1, 16))])
            result = call.exec()
            if result.has_error():
                raise pb_utils.TritonModelException(result.error().message())
            total = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy().reshape(16)
            diff = pb_utils.get_output_tensor_by_name(result, "OUTPUT1").as_numpy().reshape(16)
            missing = pb_utils.InferenceRequest(model_name="no_such_model", inputs=[],
                                                requested_output_names=["X"]).exec()
            stream = pb_utils.InferenceRequest(
                model_name="repeater", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([3], np.int32)),
                        pb_utils.Tensor("DELAY", np.array([0.0], np.float32))]).exec(decoupled=True)
            count = sum(1 for r in stream if r.output_tensors())
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("SUM", total), pb_utils.Tensor("DIFF", diff),
                 pb_utils.Tensor("COUNT", np.array([count], np.int32))],
                parameters={"missing_error": missing.error().message() if missing.has_error() else ""}))
        return responses
''')

MODELS["repeater"] = ('''
name: "repeater"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
''', '''
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled: IN[0] responses OUT=[i], DELAY[0] s apart, from a thread of its own.

    With a "marker" request parameter (a folder), it writes <id>.sent (the last index sent) and
    <id>.stopped (the index at which it saw is_cancelled()).
    """

    def initialize(self, args):
        assert pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request,), daemon=True).start()
        return None

    def run(self, request):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
        delay = float(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0])
        marker = json.loads(request.parameters()).get("marker")
        name = request.request_id() or "request"
        for i in range(count):
            if sender.is_cancelled():
                if marker:
                    with open(os.path.join(marker, name + ".stopped"), "w") as f:
                        f.write(str(i))
                break
            time.sleep(delay)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            if marker:
                with open(os.path.join(marker, name + ".sent"), "w") as f:
                    f.write(str(i))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
''')

MODELS["strings"] = ('''
name: "strings"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] }, { name: "LENGTH" data_type: TYPE_INT32 dims: [ -1 ] } ]
''', '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            words = [w.decode("utf-8") for w in pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()]
            upper = np.array([w.upper() for w in words], dtype=object)
            length = np.array([len(w) for w in words], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper),
                                                         pb_utils.Tensor("LENGTH", length)]))
        return responses
''')

MODELS["autocomplete"] = ('''
name: "autocomplete"
backend: "python"
''', '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(4)
        config.add_input({"name": "X", "data_type": "TYPE_INT64", "dims": [2]})
        config.add_output({"name": "Y", "data_type": "TYPE_INT64", "dims": [2]})
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 10)]) for r in requests]
''')

MODELS["raises"] = ('''
name: "raises"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
''', '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] < 0:
                raise pb_utils.TritonModelException("negative input is not allowed")
            if x[0] == 0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("zero is refused", pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
''')

MODELS["async_model"] = ('''
name: "async_model"
backend: "python"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "TWICE" data_type: TYPE_FP32 dims: [ 16 ] } ]
''', '''
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """async def execute: awaits two BLS calls to add_sub at once (A + A, through async_exec)."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy().reshape(1, 16)
            calls = [pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)]).async_exec() for _ in range(2)]
            first, second = await asyncio.gather(*calls)
            await asyncio.sleep(0.001)
            out0 = pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy()
            assert (out0 == pb_utils.get_output_tensor_by_name(second, "OUTPUT0").as_numpy()).all()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TWICE", out0.reshape(16))]))
        return responses
''')

MODELS["metrics_model"] = ('''
name: "metrics_model"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
''', '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily("custom_requests", "Requests seen", pb_utils.MetricFamily.COUNTER)
        self.last = pb_utils.MetricFamily("custom_last_value", "Last input", pb_utils.MetricFamily.GAUGE)
        self.sizes = pb_utils.MetricFamily("custom_input_value", "Inputs", pb_utils.MetricFamily.HISTOGRAM)
        labels = {"model": args["model_name"]}
        self.count = self.requests.Metric(labels=labels)
        self.gauge = self.last.Metric(labels=labels)
        self.hist = self.sizes.Metric(labels=labels, buckets=[1.0, 10.0])

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.count.increment(1)
            self.gauge.set(float(x[0]))
            self.hist.observe(float(x[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)],
                                                  parameters={"count": int(self.count.value())}))
        return out
''')

MODELS["textgen"] = ('''
name: "textgen"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
''', '''
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled "LLM": one response per word of text_input (max_tokens of them, cycling).

    Parameters: "delay" (s between tokens), "fail_at" (send an error response at that index),
    "marker" (folder: writes <id or request>.stopped when it sees is_cancelled()).
    """

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.generate, args=(request,), daemon=True).start()

    def generate(self, request):
        sender = request.get_response_sender()
        words = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0].decode().split()
        limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
        count = int(limit.as_numpy()[0]) if limit is not None else len(words)
        params = json.loads(request.parameters())
        for i in range(count):
            if sender.is_cancelled():
                if params.get("marker"):
                    with open(os.path.join(params["marker"], "stopped"), "w") as f:
                        f.write(str(i))
                break
            time.sleep(float(params.get("delay", 0)))
            if i == params.get("fail_at"):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("token failed")))
                continue
            word = words[i % len(words)] if words else ""
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("text_output", np.array([word.encode()], dtype=object))], parameters={"index": i}))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
''')

MODELS["echo_text"] = ('''
name: "echo_text"
backend: "python"
max_batch_size: 8
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
dynamic_batching { }
''', '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A regular (non-decoupled) text model: text_output = text_input reversed."""

    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            rev = np.array([[t.decode()[::-1].encode() for t in row] for row in text], dtype=object)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", rev)],
                                                  parameters={"seen": request.parameters()}))
        return out
''')

MODELS["crashy"] = ('''
name: "crashy"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }
parameters { key: "TRIDENT_EXECUTE_TIMEOUT_SECS" value: { string_value: "2" } }
''', '''
import os
import signal
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """X < 0: the process crashes (SIGSEGV); X == 0: it hangs; else Y = X and the pid."""

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] < 0:
                os.kill(os.getpid(), signal.SIGSEGV)
            if x[0] == 0:
                time.sleep(3600)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)], parameters={"pid": os.getpid()}))
        return out
''')

MODELS["spin"] = ('''
name: "spin"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT64 dims: [ 1 ] } ]
''', '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Pure-Python CPU work (holds the GIL): TOTAL = sum(range(N))."""

    def execute(self, requests):
        out = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            total = 0
            for i in range(n):
                total += i
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", np.array([total], np.int64))]))
        return out
''')

MODELS["dcrash"] = ('''
name: "dcrash"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }
''', '''
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled, isolated: sends two responses, then (IN[0] == 1) the process exits with 3."""

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request,), daemon=True).start()

    def run(self, request):
        sender = request.get_response_sender()
        crash = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]) == 1
        for i in range(2):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([os.getpid()], np.int32))]))
        if crash:
            time.sleep(0.2)
            os._exit(3)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
''')

PROCESS_MODE = '\nparameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }\n'


def write_model(root: Path, name: str, mode: str = "thread", config: str | None = None) -> Path:
    """Write model ``name`` of :data:`MODELS` under ``root`` (``mode="process"``: isolated)."""
    text, code = MODELS[name]
    config = config if config is not None else text
    if mode == "process" and "TRIDENT_EXECUTION_MODE" not in config:
        config = config.rstrip() + PROCESS_MODE
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.py").write_text(code)
    return folder


def build_repo(root: Path, names: list[str], mode: str = "thread") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        write_model(root, name, mode)
    return root
