"""Sequence batching end to end: ``trident serve`` with tritonclient over HTTP and gRPC.

Accumulators: a Python model keyed by correlation_id() with the START flag and control
tensor, and an ONNX graph with implicit state (OUTPUT = INPUT + STATE_IN, STATE_OUT = OUTPUT).
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.models import write_model
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

ACC_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT = running sum of INPUT per sequence; checks the START control tensor matches flags()."""

    def initialize(self, args):
        self.sums = {}
        self.timed_out = []

    def execute(self, requests):
        out = []
        for r in requests:
            cid = r.correlation_id()
            start = bool(r.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            control = int(pb_utils.get_input_tensor_by_name(r, "START").as_numpy().reshape(-1)[0])
            assert control == int(start), (control, start)
            ready = int(pb_utils.get_input_tensor_by_name(r, "READY").as_numpy().reshape(-1)[0])
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            total = (0 if start else self.sums.get(cid, 0)) + int(x.reshape(-1)[0])
            if r.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                self.sums.pop(cid, None)
            else:
                self.sums[cid] = total
            y = np.array([[total]], dtype=np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", y),
                pb_utils.Tensor("TIMEOUTS", np.array([[len(self.timed_out) * ready]], dtype=np.int32))]))
        return out

    def sequence_idle_timeout(self, correlation_id):
        self.timed_out.append(correlation_id)
        self.sums.pop(correlation_id, None)
'''


def acc_config(name: str, corrid: str, idle_us: int = 5_000_000) -> str:
    return f'''
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "TIMEOUTS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}
  ]
}}
'''


ONNX_CONFIG = '''
name: "acc_onnx"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { max_queue_delay_microseconds: 300000 minimum_slot_utilization: 1.0 }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ]
            initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zeros" } } ]
}
'''


SLOW_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            time.sleep(float(x.reshape(-1)[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", x)]))
        return out
'''

SLOW_CONFIG = '''
name: "slow_seq"
backend: "python"
max_batch_size: 1
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching { max_sequence_idle_microseconds: 30000000 }
'''


STATE_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Implicit state kept by the server: OUTPUT = INPUT + STATE_IN, STATE_OUT = OUTPUT."""

    def execute(self, requests):
        out = []
        for r in requests:
            y = (pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
                 + pb_utils.get_input_tensor_by_name(r, "STATE_IN").as_numpy())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", y), pb_utils.Tensor("STATE_OUT", y)]))
        return out
'''

STATE_CONFIG = '''
name: "state_py"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
'''


DECOUPLED_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Decoupled accumulator: per request, the running sum then ten times it, then the final flag."""

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        for r in requests:
            cid = r.correlation_id()
            start = r.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            total = (0 if start else self.sums.get(cid, 0)) + int(
                pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().reshape(-1)[0])
            self.sums[cid] = total
            sender = r.get_response_sender()
            for value in (total, total * 10):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[value]], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

DECOUPLED_CONFIG = '''
name: "acc_decoupled"
backend: "python"
max_batch_size: 4
model_transaction_policy { decoupled: true }
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching { }
'''


def write_onnx_accumulator(repo: Path) -> None:
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "STATE_IN"], ["OUTPUT"]),
         helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
         helper.make_node("Identity", ["START"], ["START_ECHO"])],
        "acc",
        [helper.make_tensor_value_info(n, f32, [-1, 1]) for n in ("INPUT", "STATE_IN", "START")],
        [helper.make_tensor_value_info(n, f32, [-1, 1]) for n in ("OUTPUT", "STATE_OUT", "START_ECHO")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folder = repo / "acc_onnx"
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(ONNX_CONFIG)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("seq_repo")
    write_model(repo, "acc_py", acc_config("acc_py", "TYPE_UINT64"), ACC_PY)
    write_model(repo, "acc_str", acc_config("acc_str", "TYPE_STRING", idle_us=300_000), ACC_PY)
    write_onnx_accumulator(repo)
    write_model(repo, "slow_seq", SLOW_CONFIG, SLOW_PY)
    write_model(repo, "state_py", STATE_CONFIG, STATE_PY)
    write_model(repo, "acc_decoupled", DECOUPLED_CONFIG, DECOUPLED_PY)
    s = start_server(repo=repo)
    yield s
    s.stop()


def step(protocol: str, server, model: str, sid, value, *, start=False, end=False, dtype=np.int32,
         output: str = "OUTPUT") -> float:
    module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        inp = module.InferInput("INPUT", [1, 1], "INT32" if dtype == np.int32 else "FP32")
        inp.set_data_from_numpy(np.array([[value]], dtype=dtype))
        result = client.infer(model, [inp], outputs=[module.InferRequestedOutput(output)], sequence_id=sid,
                              sequence_start=start, sequence_end=end)
        return float(result.as_numpy(output).reshape(-1)[0])
    finally:
        client.close()


def run_sequences(protocol: str, server, model: str, ids: list, steps: int, dtype=np.int32,
                  output: str = "OUTPUT") -> dict:
    def one(sid):
        totals = []
        for k in range(steps):
            totals.append(step(protocol, server, model, sid, k + 1, start=k == 0, end=k == steps - 1, dtype=dtype,
                               output=output))
        return totals

    with ThreadPoolExecutor(len(ids)) as pool:
        return dict(zip(ids, pool.map(one, ids), strict=True))


def stats(server, model: str) -> tuple[int, int]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        s = client.get_inference_statistics(model)["model_stats"][0]
        return int(s["inference_count"]), int(s["execution_count"])
    finally:
        client.close()


PROTOCOLS = pytest.mark.parametrize("protocol", ["http", "grpc"])
EXPECTED = [1.0, 3.0, 6.0, 10.0, 15.0]


@PROTOCOLS
def test_python_accumulator_interleaved_sequences(server, protocol: str) -> None:
    base = 1000 if protocol == "http" else 2000
    ids = [base + k for k in range(6)]
    assert run_sequences(protocol, server, "acc_py", ids, 5) == {sid: EXPECTED for sid in ids}


@PROTOCOLS
def test_onnx_implicit_state_batches_several_sequences(server, protocol: str) -> None:
    before = stats(server, "acc_onnx")
    ids = [(3000 if protocol == "http" else 4000) + k for k in range(4)]
    assert run_sequences(protocol, server, "acc_onnx", ids, 5, dtype=np.float32) == {sid: EXPECTED for sid in ids}
    inferences, executions = (a - b for a, b in zip(stats(server, "acc_onnx"), before, strict=True))
    assert inferences == 20 and executions < inferences  # batches carried several sequences


@PROTOCOLS
def test_python_implicit_state(server, protocol: str) -> None:
    ids = [(5000 if protocol == "http" else 6000) + k for k in range(4)]
    assert run_sequences(protocol, server, "state_py", ids, 5) == {sid: EXPECTED for sid in ids}
    client = httpclient.InferenceServerClient(server.http_url)
    try:  # asking for every output: the state output stays in the server
        inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[3]], dtype=np.int32))
        r = client.infer("state_py", [inp], sequence_id=f"all-{protocol}", sequence_start=True, sequence_end=True)
        assert [o["name"] for o in r.get_response()["outputs"]] == ["OUTPUT"]
    finally:
        client.close()


@PROTOCOLS
def test_string_correlation_ids(server, protocol: str) -> None:
    ids = [f"{protocol}-session-{k}" for k in range(3)]
    assert run_sequences(protocol, server, "acc_str", ids, 5) == {sid: EXPECTED for sid in ids}


@PROTOCOLS
def test_missing_start_is_invalid(server, protocol: str) -> None:
    with pytest.raises(InferenceServerException) as e:
        step(protocol, server, "acc_py", 99_000 + len(protocol), 1)
    assert "must specify the START flag on the first request of the sequence" in str(e.value)
    with pytest.raises(InferenceServerException, match="correlation ID"):
        step(protocol, server, "acc_py", 0, 1, start=True)


def test_control_inputs_are_not_client_inputs(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        ins = []
        for name in ("INPUT", "START"):
            inp = httpclient.InferInput(name, [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
            ins.append(inp)
        with pytest.raises(InferenceServerException, match="unexpected inference input 'START'"):
            client.infer("acc_py", ins, sequence_id=5, sequence_start=True)
        meta = client.get_server_metadata()
        assert "sequence" in meta["extensions"] and "sequence(string_id)" in meta["extensions"]
    finally:
        client.close()


@PROTOCOLS
def test_idle_timeout_then_reuse_with_start(server, protocol: str) -> None:
    sid = f"idle-{protocol}"
    assert step(protocol, server, "acc_str", sid, 5, start=True) == 5
    deadline = time.monotonic() + 30
    while True:  # the 0.3 s idle timeout frees the slot; the next request needs START again
        time.sleep(0.4)
        try:
            step(protocol, server, "acc_str", sid, 1)
        except InferenceServerException as e:
            assert "START flag" in str(e)
            break
        assert time.monotonic() < deadline, "the sequence never timed out"
    assert step(protocol, server, "acc_str", sid, 7, start=True) == 7
    assert f"sequence {sid} timed out" in server.log()


def test_cancelling_a_queued_request_cancels_the_sequences_queued_requests(server) -> None:
    """A gRPC deadline cancels a queued request of a sequence; the request queued after it fails
    CANCELLED too (as Triton), and the sequence needs START again."""
    results: dict[str, object] = {}

    def call(tag: str, seconds: float, timeout: float | None = None, start: bool = False) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            inp.set_data_from_numpy(np.array([[seconds]], dtype=np.float32))
            r = client.infer("slow_seq", [inp], sequence_id=4242, sequence_start=start, client_timeout=timeout)
            results[tag] = float(r.as_numpy("OUTPUT")[0, 0])
        except InferenceServerException as e:
            results[tag] = e
        finally:
            client.close()

    call("start", 0.0, start=True)
    with ThreadPoolExecutor(3) as pool:
        pool.submit(call, "running", 2.0)
        time.sleep(0.3)
        pool.submit(call, "cancelled", 0.0, 0.8)
        time.sleep(0.3)
        pool.submit(call, "follower", 0.0)
    assert results["running"] == 2.0
    assert isinstance(results["cancelled"], InferenceServerException)
    follower = results["follower"]
    assert isinstance(follower, InferenceServerException) and "cancelled" in str(follower).lower()
    call("after", 0.0)
    after = results["after"]
    assert isinstance(after, InferenceServerException) and "START flag" in str(after)


def test_decoupled_sequence_over_stream_infer(server) -> None:
    """A decoupled stateful model over ModelStreamInfer streams its responses per request."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        values = []
        for k in range(3):
            inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[k + 1]], dtype=np.int32))
            client.async_stream_infer("acc_decoupled", [inp], request_id=f"r{k}", sequence_id="stream-1",
                                      sequence_start=k == 0, sequence_end=k == 2)
            for _ in range(2):  # each request's two responses arrive before the next request is sent
                result, error = got.get(timeout=30)
                assert error is None, error
                values.append((result.get_response().id, int(result.as_numpy("OUTPUT")[0, 0])))
        assert values == [("r0", 1), ("r0", 10), ("r1", 3), ("r1", 30), ("r2", 6), ("r2", 60)]
    finally:
        client.stop_stream()
        client.close()
