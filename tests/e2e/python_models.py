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

LATE_SENDER_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 50000 }
'''

LATE_SENDER_CODE = '''
import asyncio
import json
import os
import threading
import time

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def answer(x, tag, batch):
    return pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)], parameters={"tag": tag, "batch": batch})


class TritonPythonModel:
    """Not decoupled, answering through the response sender as Triton's response_sender qa
    models do. Request parameter "mode":
      return          the response is returned from execute (None for the other requests)
      later           a thread sends the one response with the final flag after execute returned
      flag_later      a thread sends the response, then a flag-only final
      two_in_execute  execute sends two responses: the second raises out of execute
      two_later       a thread sends two responses, then a flag-only final
      after_final     a thread sends the response with the final flag, then another and a final
      task            (async variant) a task of the instance's asyncio loop sends it
      never           nothing is ever sent (the request waits until the client gives up)
    Y = X + 1 and "tag" names the send that got through; the refusals a thread met are written
    to <marker>/<request id>.refused.
    """

    def run(self, requests):
        out = []
        for request in requests:
            params = json.loads(request.parameters())
            mode = params["mode"]
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            out.append(answer(x, "returned", len(requests)) if mode == "return" else None)
            if mode == "two_in_execute":
                sender.send(answer(x, "first", len(requests)))
                sender.send(answer(x, "second", len(requests)))  # raises TritonModelException
            elif mode == "task":
                asyncio.get_running_loop().create_task(self.task(sender, x, len(requests)))
            elif mode not in ("return", "never"):
                marker = os.path.join(params.get("marker", ""), request.request_id() + ".refused")
                threading.Thread(target=self.later, args=(mode, sender, x, len(requests), marker)).start()
        return out if any(r is not None for r in out) else None

    async def task(self, sender, x, batch):
        await asyncio.sleep(0.05)
        sender.send(answer(x, "task", batch), flags=FINAL)

    def later(self, mode, sender, x, batch, marker):
        time.sleep(0.05)
        if mode == "later":
            sender.send(answer(x, "later", batch), flags=FINAL)
            return
        if mode == "flag_later":
            sender.send(answer(x, "flag_later", batch))
            time.sleep(0.05)
            sender.send(flags=FINAL)
            return
        sender.send(answer(x, "first", batch), flags=FINAL if mode == "after_final" else 0)
        refused = []
        for response, flags in ((answer(x, "second", batch), 0), (None, FINAL)):
            try:
                sender.send(response, flags=flags)
            except pb_utils.TritonModelException as e:
                refused.append(str(e))
        with open(marker, "w") as f:
            json.dump(refused, f)
'''

MODELS["late_sender"] = (LATE_SENDER_CONFIG.replace("{name}", "late_sender"), LATE_SENDER_CODE + '''
    def execute(self, requests):
        return self.run(requests)
''')

MODELS["late_sender_async"] = (LATE_SENDER_CONFIG.replace("{name}", "late_sender_async"), LATE_SENDER_CODE + '''
    async def execute(self, requests):
        await asyncio.sleep(0)
        return self.run(requests)
''')

MODELS["async_later"] = ('''
name: "async_later"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
''', '''
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled; async def execute schedules a task per request and returns. The task sends
    OUT=[i] for i < IN[0]; with the "final_later" parameter the final flag is sent by
    loop.call_later after the task has ended, else by the task."""

    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        for request in requests:
            task = asyncio.create_task(self.respond(request))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return None

    async def respond(self, request):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
        for i in range(count):
            await asyncio.sleep(0.01)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
        if json.loads(request.parameters()).get("final_later"):
            asyncio.get_running_loop().call_later(
                0.05, sender.send, None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
''')

MODELS["batch_threads"] = ('''
name: "batch_threads"
backend: "python"
max_batch_size: 2
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 3000000 }
''', '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled, batching: one thread per request of the batch sends OUT=[[i]] for i < IN[0]
    as fast as it can (parameter "batch": the batch size), then the final flag."""

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request, len(requests))).start()

    def run(self, request, batch):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
        for i in range(count):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[i]], np.int32))],
                                                   parameters={"batch": batch}))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
''')

MODELS["bls_by_name"] = ('''
name: "bls_by_name"
backend: "python"
max_batch_size: 0
input [ { name: "MODEL" data_type: TYPE_STRING dims: [ 1 ] }, { name: "A" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] } ]
''', '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BLS to the model named by the MODEL input, passed as read (bytes): SUM = A + A."""

    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL").as_numpy()[0]
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy().reshape(1, 16)
            result = pb_utils.InferenceRequest(
                model_name=name, requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", a)]).exec()
            if result.has_error():
                raise pb_utils.TritonModelException(result.error().message())
            total = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy().reshape(16)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
        return responses
''')

MODELS["bf16_dlpack"] = ('''
name: "bf16_dlpack"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_BF16 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_BF16 dims: [ 4 ] }, { name: "REFUSED" data_type: TYPE_STRING dims: [ 1 ] } ]
''', '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X through DLPack (a BF16 tensor has no numpy form); REFUSED: what as_numpy() raised."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            try:
                x.as_numpy()
                refused = "nothing"
            except pb_utils.TritonModelException as e:
                refused = str(e)
            y = pb_utils.Tensor.from_dlpack("Y", x.to_dlpack())
            responses.append(pb_utils.InferenceResponse(
                [y, pb_utils.Tensor("REFUSED", np.array([refused.encode()], dtype=object))]))
        return responses
''')

MODELS["stuck"] = ('''
name: "stuck"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
''', '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled and never sends its final flag: IN[0] == 0: execute sends one response and
    never returns; IN[0] == 1: the thread that sends one response dies."""

    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if mode == 1:
                threading.Thread(target=self.die, args=(request,)).start()
                continue
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))]))
            time.sleep(3600)

    def die(self, request):
        request.get_response_sender().send(
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        raise RuntimeError("the model's thread died")
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
