"""The Python backend inside a real in-process server: BLS, the response sender, model
management and readiness probes (models written as Triton users write them)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import trio

from trident.errors import Code, TritonError
from trident.options import ServerOptions
from trident.server import model as model_module
from trident.server import open_server
from trident.types import InferenceRequest, InferenceResponse, Tensor

ADD = ('''
name: "add"
backend: "python"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "C" data_type: TYPE_INT32 dims: [ 1 ] } ]
''', '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("C",
                    pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
                    + pb_utils.get_input_tensor_by_name(r, "B").as_numpy())]) for r in requests]
''')

COUNTER = ('''
name: "counter"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
''', '''
import json, os, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    """Decoupled: N responses I=0..N-1, 20 ms apart; writes <marker>/stopped if cancelled."""

    def execute(self, requests):
        for r in requests:
            threading.Thread(target=self.run, args=(r,)).start()

    def run(self, r):
        sender = r.get_response_sender()
        n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
        marker = json.loads(r.parameters()).get("marker")
        for i in range(n):
            if sender.is_cancelled():
                if marker:
                    open(os.path.join(marker, "stopped"), "w").write(str(i))
                break
            time.sleep(0.02)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
        sender.send(None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
''')

CALLER = ('''
name: "caller"
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]
''', '''
import json, threading
import numpy as np
import triton_python_backend_utils as pb_utils

def i32(name, v):
    return pb_utils.Tensor(name, np.array([v], np.int32))

def call(model, inputs, outputs, **kw):
    return pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs, **kw)

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            mode = pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy()[0].decode()
            params = json.loads(r.parameters())
            report = getattr(self, mode)(params)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([json.dumps(report)], dtype=object))]))
        return out

    def errors(self, params):
        ok = call("add", [i32("A", 2), i32("B", 3)], ["C"]).exec()
        missing = call("nope", [i32("A", 1)], ["C"]).exec()
        invalid = call("add", [i32("A", 1)], ["C"]).exec()
        decoupled = call("counter", [i32("N", 1)], ["I"]).exec()
        return {"ok": pb_utils.get_output_tensor_by_name(ok, "C").as_numpy().tolist(),
                "missing": [missing.error().code().name, missing.error().message()],
                "invalid": [invalid.error().code().name, invalid.error().message()],
                "decoupled": decoupled.error().message()}

    def stream(self, params):
        got = []
        for resp in call("counter", [i32("N", 3)], ["I"]).exec(decoupled=True):
            got.append(pb_utils.get_output_tensor_by_name(resp, "I").as_numpy().tolist() if resp.output_tensors() else "final")
        return got

    def cancel_iterator(self, params):
        it = call("counter", [i32("N", 1000)], ["I"], parameters={"marker": params["marker"]}).exec(decoupled=True)
        first = next(it)
        it.cancel()
        rest = list(it)
        return {"first": first.output_tensors()[0].as_numpy().tolist(),
                "last_error": rest[-1].error().code().name if rest and rest[-1].has_error() else None}

    def long_stream(self, params):
        it = call("counter", [i32("N", 1000)], ["I"], parameters={"marker": params["marker"]}).exec(decoupled=True)
        last = None
        for resp in it:
            last = resp
        with open(params["marker"] + "/caller", "w") as f:
            f.write(last.error().code().name if last.has_error() else "no error")
        return {}

    def from_thread(self, params):
        box = {}
        def work():
            box["c"] = call("add", [i32("A", 20), i32("B", 22)], ["C"]).exec().output_tensors()[0].as_numpy().tolist()
        t = threading.Thread(target=work)
        t.start()
        t.join()
        return box

    def manage(self, params):
        report = {"before": pb_utils.is_model_ready("add")}
        try:
            pb_utils.unload_model("add")
            report["after_unload"] = pb_utils.is_model_ready("add")
            pb_utils.load_model("add")
            report["after_load"] = pb_utils.is_model_ready("add", "1")
        except pb_utils.TritonModelException as e:
            report["error"] = str(e)
        return report
''')

SENDER = ('''
name: "sender"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "ERRORS" data_type: TYPE_STRING dims: [ -1 ] } ]
''', '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    """Not decoupled, answers through the response sender (Triton >= 24.06). ERRORS: what the
    sender refused in this request, then what it refused late in the previous one."""

    def initialize(self, args):
        self.late = []

    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            assert sender is r.get_response_sender()
            errors = []
            def attempt(*args, **kw):
                try:
                    sender.send(*args, **kw)
                except pb_utils.TritonModelException as e:
                    errors.append(str(e))
            attempt(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # final before any response
            attempt(None)  # no response, no final flag
            attempt("junk")
            attempt(pb_utils.InferenceResponse(), flags=4)
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            held = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1),
                                               pb_utils.Tensor("ERRORS", np.array(errors + self.late, dtype=object))])
            sender.send(held)
            errors.clear()
            attempt(pb_utils.InferenceResponse())  # a second response
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            attempt(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # after the final one
            self.late = errors
        return None
''')

READY = ('''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
''', '''
import time

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    async def is_ready(self):
        if self.name == "slow_ready":
            time.sleep(3)
        return self.name != "not_ready"

    def execute(self, requests):
        return []
''')


def _write(root: Path, name: str, model: tuple[str, str]) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(model[0].replace("{name}", name))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(model[1]))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name, model in (("add", ADD), ("counter", COUNTER), ("caller", CALLER), ("sender", SENDER)):
        _write(root, name, model)
    for name in ("ready", "not_ready", "slow_ready"):
        _write(root, name, READY)
    return root


def _caller(mode: str, **params: str) -> InferenceRequest:
    return InferenceRequest("caller", [Tensor.from_numpy("MODE", np.array([mode.encode()], dtype=object))],
                            parameters=dict(params))


async def _read_when_written(path: Path) -> str:
    with trio.fail_after(30):
        while not path.exists() or not path.read_text():
            await trio.sleep(0.02)
    return path.read_text()


async def _report(server, mode: str, **params: str):
    response = await server.infer(_caller(mode, **params))
    return json.loads(response.output("REPORT").data[0])


async def test_bls_results_and_errors(repo: Path) -> None:
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        report = await _report(server, "errors")
        assert report["ok"] == [5]
        assert report["missing"][0] == "NOT_FOUND" and "'nope'" in report["missing"][1]
        assert report["invalid"][0] == "INVALID_ARG" and "missing required input" in report["invalid"][1]
        assert "doesn't support models with decoupled transaction policy" in report["decoupled"]
        assert await _report(server, "stream") == [[0], [1], [2], "final"]
        assert await _report(server, "from_thread") == {"c": [42]}
        # BLS goes through the callee's scheduler: its statistics count the calls
        assert server.model_statistics("add")[0].success.count == 2


async def test_response_iterator_cancel_stops_the_callee(repo: Path, tmp_path: Path) -> None:
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        report = await _report(server, "cancel_iterator", marker=str(tmp_path))
        assert report == {"first": [0], "last_error": "CANCELLED"}
        assert int(await _read_when_written(tmp_path / "stopped")) < 1000


async def test_bls_of_a_cancelled_request_is_cancelled(repo: Path, tmp_path: Path) -> None:
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        with trio.move_on_after(0.3):  # the client gives up while the caller iterates its BLS stream
            await server.infer(_caller("long_stream", marker=str(tmp_path)))
        # the caller's BLS stream ends, then the callee notices
        assert await _read_when_written(tmp_path / "caller") == "CANCELLED"
        assert int(await _read_when_written(tmp_path / "stopped")) < 1000


async def test_non_decoupled_model_answers_through_the_sender(repo: Path) -> None:
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        early = [
            "Non-decoupled model cannot send complete final before sending a response.",
            "Inference Response object must be provided when the response flags is set to zero.",
            "send() takes a pb_utils.InferenceResponse, got str",
            "Unable to send response. Unsupported flag provided.",
        ]
        late = [
            "Non-decoupled model cannot send more than one response.",
            "Unable to send response. Response sender has been closed.",
        ]
        for x, previous in ((4, []), (7, late)):
            request = InferenceRequest("sender", [Tensor.from_numpy("X", np.array([x], np.int32))])
            response = await server.infer(request)
            assert response.output("Y").data.tolist() == [x + 1]
            assert [e.decode() for e in response.output("ERRORS").data] == early + previous


async def test_decoupled_responses_flow_in_order(repo: Path) -> None:
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        got: list[InferenceResponse] = []

        async def keep(response: InferenceResponse) -> None:
            got.append(response)

        request = InferenceRequest("counter", [Tensor.from_numpy("N", np.array([4], np.int32))], id="r")
        await server.infer_stream(request, keep)
        assert [r.output("I").data.tolist() for r in got[:-1]] == [[0], [1], [2], [3]]
        assert [r.final for r in got] == [False, False, False, False, True]
        assert all(r.id == "r" and r.model_name == "counter" for r in got)
        with pytest.raises(TritonError, match="decoupled transaction policy") as info:
            await server.infer(request)
        assert info.value.code == Code.UNSUPPORTED


async def test_model_management_from_a_model(repo: Path) -> None:
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        report = await _report(server, "manage")
        assert report["before"] is True and "not allowed" in report["error"]
    options = ServerOptions(model_repositories=[str(repo)], model_control_mode="explicit",
                            load_models=["caller", "add"])
    async with open_server(options) as server:
        assert await _report(server, "manage") == {"before": True, "after_unload": False, "after_load": True}


async def test_readiness_probes_run_is_ready(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_module, "READY_PROBE_TIMEOUT_SECS", 0.5)
    async with open_server(ServerOptions(model_repositories=[str(repo)], strict_readiness=False)) as server:
        assert await server.probe_model_ready("ready")
        assert not await server.probe_model_ready("not_ready")
        assert not await server.probe_model_ready("slow_ready")  # is_ready took longer than the limit
        assert server.model_ready("not_ready")  # the state alone says READY
        assert not await server.probe_model_ready("no_such_model")


# ---- the trace a BLS request continues -------------------------------------------------------


def test_bls_trace_follows_the_named_request_or_the_one_traced_request_of_the_batch() -> None:
    from trident.backends.python import pb_utils
    from trident.backends.python._runtime import bls_trace
    from trident.observability.trace import parse_traceparent

    a, b, plain = (InferenceRequest("m", [], id=i) for i in ("a", "b", "plain"))
    a.trace = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k=v")
    b.trace = parse_traceparent("00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
    assert bls_trace([a, plain]) is a.trace  # the one traced request of the batch
    assert bls_trace([plain]) is None
    assert bls_trace([a, b]) is None  # two different traces and none named: no guess
    assert bls_trace([a, b], b) is b.trace  # trace=request.trace() names one
    assert bls_trace([a, a]) is a.trace
    # pb_utils: request.trace() of a request the model received, and its context for the model
    wrapped = pb_utils.InferenceRequest._wrap(a, [], 0, 0, 0, "{}")
    assert wrapped.trace()._source is a and wrapped.trace() is wrapped.trace()
    assert json.loads(wrapped.trace().get_context()) == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"}
    assert pb_utils.InferenceRequest._wrap(plain, [], 0, 0, 0, "{}").trace().get_context() is None
    assert pb_utils.InferenceRequest(model_name="x").trace().get_context() is None
