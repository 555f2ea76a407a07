"""Ensembles end to end over HTTP and gRPC with tritonclient (sync, aio, streaming) and httpx:
a Python -> ONNX -> Python pipeline, a diamond whose branches run concurrently, decoupled steps
streaming through, nested ensembles, pruning of unrequested branches, statistics, step errors,
bad input, and cancellation that stops the later steps."""

from __future__ import annotations

import asyncio
import json
import queue
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from e2e.ensemble_models import write_pipeline_repo
from tritonclient.utils import InferenceServerException

RAW = np.arange(8, dtype=np.float32).reshape(2, 4)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = write_pipeline_repo(tmp_path_factory.mktemp("ensembles"))
    s = start_server("--cache-config", "local,size=1048576", repo=repo, timeout=120)
    yield s
    s.stop()


def _http_input(name: str, array: np.ndarray, datatype: str) -> httpclient.InferInput:
    i = httpclient.InferInput(name, list(array.shape), datatype)
    i.set_data_from_numpy(array)
    return i


def _grpc_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    i = grpcclient.InferInput(name, list(array.shape), datatype)
    i.set_data_from_numpy(array)
    return i


def _stats(server, model: str) -> dict:
    with httpclient.InferenceServerClient(server.http_url) as c:
        return c.get_inference_statistics(model)["model_stats"][0]


# ---- a pre-process (Python) -> model (ONNX) -> post-process (Python) pipeline --------------


def test_pipeline_over_http(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        result = c.infer("pipeline", [_http_input("RAW", RAW, "FP32")], request_id="req-7")
        np.testing.assert_array_equal(result.as_numpy("OUT"), (RAW * 2 + 1) * 10)
        assert result.get_response()["id"] == "req-7"
        assert result.get_response()["model_name"] == "pipeline"
        meta = c.get_model_metadata("pipeline")
        assert meta["platform"] == "ensemble"
        assert meta["inputs"] == [{"name": "RAW", "datatype": "FP32", "shape": [-1, 4]}]
        config = c.get_model_config("pipeline")
        assert config["platform"] == "ensemble"
        assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["pre", "mlp", "post"]
        assert c.is_model_ready("pipeline")


def test_pipeline_over_grpc(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        result = c.infer("pipeline", [_grpc_input("RAW", RAW, "FP32")],
                         outputs=[grpcclient.InferRequestedOutput("OUT")])
        np.testing.assert_array_equal(result.as_numpy("OUT"), (RAW * 2 + 1) * 10)
        assert c.get_model_metadata("pipeline").platform == "ensemble"
        assert c.is_model_ready("pipeline")


def test_nested_ensemble(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        result = c.infer("nested", [_grpc_input("RAW", RAW, "FP32")])
        np.testing.assert_array_equal(result.as_numpy("FINAL"), (RAW * 2 + 1) * 100)


def test_composing_model_batches_ensemble_traffic_with_direct_traffic(server):
    """Every ensemble step goes through its model's scheduler: 24 concurrent ensemble requests
    and 8 direct requests to the ONNX model end up in fewer executions than requests."""
    before = _stats(server, "mlp")

    async def run() -> None:
        async with grpcaio.InferenceServerClient(server.grpc_url) as c:
            one = RAW[:1]
            calls = [c.infer("pipeline", [_grpc_input("RAW", one, "FP32")]) for _ in range(24)]
            calls += [c.infer("mlp", [_grpc_input("X", one, "FP32")]) for _ in range(8)]
            results = await asyncio.gather(*calls)
        for r in results[:24]:
            np.testing.assert_array_equal(r.as_numpy("OUT"), (one * 2 + 1) * 10)
        for r in results[24:]:
            np.testing.assert_array_equal(r.as_numpy("Y"), one + 1)

    asyncio.run(run())
    after = _stats(server, "mlp")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 32
    assert executions < inferences


def test_response_cache_answers_a_repeated_ensemble_request(server):
    x = np.full((1, 4), 3.5, np.float32)
    before_pre = _stats(server, "pre")["inference_count"]
    with httpclient.InferenceServerClient(server.http_url) as c:
        first = c.infer("cached_pipeline", [_http_input("RAW", x, "FP32")])
        second = c.infer("cached_pipeline", [_http_input("RAW", x, "FP32")], request_id="again")
    np.testing.assert_array_equal(first.as_numpy("OUT"), (x * 2 + 1) * 10)
    np.testing.assert_array_equal(second.as_numpy("OUT"), first.as_numpy("OUT"))
    assert second.get_response()["id"] == "again"
    stats = _stats(server, "cached_pipeline")["inference_stats"]
    assert stats["cache_hit"]["count"] == 1 and stats["cache_miss"]["count"] == 1
    assert _stats(server, "pre")["inference_count"] == before_pre + 1  # the hit ran no step


def test_intermediate_tensors_pass_without_copies(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        for i in range(3):
            result = c.infer("zero_copy", [_grpc_input("X", np.full(4, i, np.float32), "FP32")], request_id=f"z{i}")
            assert result.as_numpy("SHARED").tolist() == [True]


# ---- a diamond DAG ------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_diamond_branches_run_concurrently(server, protocol):
    x = np.ones(4, np.float32)
    if protocol == "http":
        with httpclient.InferenceServerClient(server.http_url) as c:
            result = c.infer("diamond", [_http_input("IN", x, "FP32")])
    else:
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            result = c.infer("diamond", [_grpc_input("IN", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("SUM"), (x * 2 + 1) + (x * 3 + 1))
    a_start, a_end = result.as_numpy("TIMES_A")
    b_start, b_end = result.as_numpy("TIMES_B")
    # each branch sleeps 0.3 s; both were running at the same moment
    assert a_start < b_end and b_start < a_end


def test_unrequested_branch_does_not_run(server):
    before_a = _stats(server, "branch_a")["execution_count"]
    before_b = _stats(server, "branch_b")["execution_count"]
    with httpclient.InferenceServerClient(server.http_url) as c:
        result = c.infer("diamond", [_http_input("IN", np.ones(4, np.float32), "FP32")],
                         outputs=[httpclient.InferRequestedOutput("TIMES_A")])
    assert result.as_numpy("SUM") is None and result.as_numpy("TIMES_A").shape == (2,)
    assert _stats(server, "branch_a")["execution_count"] == before_a + 1
    assert _stats(server, "branch_b")["execution_count"] == before_b


# ---- decoupled steps ----------------------------------------------------------------------


def _stream(server, model: str, inputs: list, count_final: bool = True) -> list:
    got: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        try:
            c.async_stream_infer(model, inputs, request_id="s1", enable_empty_final_response=count_final)
            responses = []
            while True:
                result, error = got.get(timeout=30)
                responses.append((result, error))
                if error is not None:
                    break
                final = result.get_response().parameters["triton_final_response"].bool_param
                if final:
                    break
        finally:
            c.stop_stream()
    return responses


def _ends_with_final(responses) -> list:
    """The data responses of a decoupled stream, checked to end with triton_final_response.

    As in Triton, the last data response is final when no step is left running when it is
    ready; when the origin's own final flag arrives only after that, an empty final response
    follows instead (the client asked for it). Which of the two happens is a race in Triton too.
    """
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in responses]
    assert finals[-1] and not any(finals[:-1])
    last = responses[-1][0].get_response()
    return responses if last.outputs else responses[:-1]


def test_decoupled_step_streams_through_grpc(server):
    """Each of the repeater's responses flows through the square step, in order."""
    responses = _stream(server, "stream_pipe", [_grpc_input("N", np.array([5], np.int32), "INT32")])
    assert all(error is None for _, error in responses)
    data = _ends_with_final(responses)
    assert [int(r.as_numpy("SQUARE")[0]) for r, _ in data] == [0, 1, 4, 9, 16]
    assert all(r.get_response().id == "s1" and r.get_response().model_name == "stream_pipe" for r, _ in responses)
    params = responses[0][0].get_response().parameters
    assert params["sequence_id"].int64_param == 0 and params["sequence_start"].bool_param is False


def test_many_decoupled_ensemble_requests_on_one_aio_stream(server):
    """20 requests interleave on one bidirectional stream; every one gets its own squares."""

    async def run() -> dict[str, list[int]]:
        async with grpcaio.InferenceServerClient(server.grpc_url) as c:
            async def requests():
                for i in range(20):
                    yield {"model_name": "stream_pipe", "request_id": str(i),
                           "inputs": [_grpc_input("N", np.array([i % 5 + 1], np.int32), "INT32")]}

            seen: dict[str, list[int]] = {}
            finished = 0
            async for result, error in c.stream_infer(requests()):
                assert error is None
                response = result.get_response()
                seen.setdefault(response.id, []).append(int(result.as_numpy("SQUARE")[0]))
                finished += response.parameters["triton_final_response"].bool_param
                if finished == 20:
                    break
        return seen

    seen = asyncio.run(run())
    assert seen == {str(i): [k * k for k in range(i % 5 + 1)] for i in range(20)}


def test_decoupled_output_streams_with_an_empty_final_response(server):
    responses = _stream(server, "stream_direct", [_grpc_input("N", np.array([3], np.int32), "INT32")])
    assert [int(r.as_numpy("VALUE")[0]) for r, _ in responses[:-1]] == [0, 1, 2]
    last = responses[-1][0].get_response()
    assert last.parameters["triton_final_response"].bool_param and not last.outputs
    empty = _stream(server, "stream_direct", [_grpc_input("N", np.array([0], np.int32), "INT32")])
    assert len(empty) == 1 and not empty[0][0].get_response().outputs


def test_decoupled_step_streams_through_generate_stream(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as http:
        with http.stream("POST", "/v2/models/stream_pipe/generate_stream", json={"N": 4}) as r:
            assert r.status_code == 200
            body = r.read().decode()
    events = [json.loads(line[len("data:"):]) for line in body.splitlines() if line.startswith("data:")]
    assert [e["SQUARE"] for e in events] == [0, 1, 4, 9]
    assert all(e["model_name"] == "stream_pipe" for e in events)


def test_decoupled_ensemble_config_and_unary_endpoints(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        assert c.get_model_config("stream_pipe")["model_transaction_policy"]["decoupled"] is True
        with pytest.raises(InferenceServerException) as e:
            c.infer("stream_pipe", [_http_input("N", np.array([2], np.int32), "INT32")])
        assert "decoupled" in e.value.message()
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("stream_pipe", [_grpc_input("N", np.array([2], np.int32), "INT32")])
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"


def test_inputs_from_different_decoupled_origins_are_refused_at_load(server):
    """add_n would pair repeat's values with the request's N: Triton refuses such an ensemble."""
    with httpclient.InferenceServerClient(server.http_url) as c:
        rows = {row["name"]: row for row in c.get_model_repository_index()}
        assert rows["stream_mixed"]["state"] == "UNAVAILABLE"
        assert ("in ensemble stream_mixed, step of model 'add_n' receives inputs originated from different decoupled "
                "models") in rows["stream_mixed"]["reason"]
        assert rows["stream_pipe"]["state"] == "READY"
        assert not c.is_model_ready("stream_mixed")


def test_max_inflight_requests_holds_back_the_decoupled_producer(server):
    """With max_inflight_requests 1 the repeater cannot run ahead of the slow square step: each
    value is sent only after the value three places before it was squared."""
    responses = _stream(server, "throttled", [_grpc_input("N", np.array([10], np.int32), "INT32")])
    data = [r for r, _ in responses if r.get_response().outputs]
    assert [int(r.as_numpy("SQUARE")[0]) for r in data] == [i * i for i in range(10)]
    assert _stats(server, "throttled")["inference_stats"]["success"]["count"] >= 1
    sent = [float(r.as_numpy("SENT_AT")[0]) for r in data]
    done = [float(r.as_numpy("DONE_AT")[0]) for r in data]
    for k in range(3, 10):
        assert sent[k] >= done[k - 3]


# ---- statistics ---------------------------------------------------------------------------


def test_statistics_per_ensemble_and_composing_model(server):
    names = ("pipeline", "pre", "mlp", "post")
    before = {n: _stats(server, n) for n in names}
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        for _ in range(3):
            c.infer("pipeline", [_grpc_input("RAW", RAW, "FP32")])
        grpc_stats = c.get_inference_statistics("pipeline", as_json=True)["model_stats"][0]
    after = {n: _stats(server, n) for n in names}

    def delta(name: str, *path: str) -> int:
        a, b = after[name], before[name]
        for key in path:
            a, b = a[key], b[key]
        return int(a) - int(b)

    # the ensemble: one execution per request, inference_count counts the batch of 2
    assert delta("pipeline", "inference_stats", "success", "count") == 3
    assert delta("pipeline", "execution_count") == 3
    assert delta("pipeline", "inference_count") == 6
    assert 2 in {b["batch_size"] for b in after["pipeline"]["batch_stats"]}
    for composing in ("pre", "mlp", "post"):
        assert delta(composing, "inference_stats", "success", "count") == 3
        assert delta(composing, "inference_count") == 6
    # the ensemble's compute times are the sums of its steps' (as Triton reports them)
    steps_infer = sum(delta(n, "inference_stats", "compute_infer", "ns") for n in ("pre", "mlp", "post"))
    assert delta("pipeline", "inference_stats", "compute_infer", "ns") == steps_infer
    assert int(grpc_stats["inference_stats"]["success"]["count"]) == after["pipeline"]["inference_stats"]["success"]["count"]
    with httpx.Client() as http:
        metrics = http.get(server.metrics_url).text
    assert 'nv_inference_request_success{model="pipeline",version="1"}' in metrics


# ---- errors and bad input -----------------------------------------------------------------


def test_a_failing_step_fails_the_request_with_its_message_and_model(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("failing", [_http_input("RAW", RAW, "FP32")])
        message = e.value.message()
        assert "in ensemble 'failing'" in message and "model 'fail'" in message and "bad pixel data" in message
        # the server goes on serving
        np.testing.assert_array_equal(c.infer("pipeline", [_http_input("RAW", RAW, "FP32")]).as_numpy("OUT"),
                                      (RAW * 2 + 1) * 10)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("failing", [_grpc_input("RAW", RAW, "FP32")])
        assert "bad pixel data" in e.value.message() and "model 'fail'" in e.value.message()
    failures = _stats(server, "failing")["inference_stats"]["fail"]["count"]
    assert failures >= 2


def test_bad_input_to_an_ensemble(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as http:
        body = {"inputs": [{"name": "RAW", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]}]}
        r = http.post("/v2/models/pipeline/infer", json=body)
        assert r.status_code == 400 and "data-type is 'INT32'" in r.json()["error"]
        body = {"inputs": [{"name": "RAW", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
        r = http.post("/v2/models/pipeline/infer", json=body)
        assert r.status_code == 400 and "unexpected shape for input 'RAW'" in r.json()["error"]
        body = {"inputs": [{"name": "NOPE", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        r = http.post("/v2/models/pipeline/infer", json=body)
        assert r.status_code == 400 and "unexpected inference input 'NOPE'" in r.json()["error"]
        body = {"inputs": [{"name": "RAW", "shape": [9, 4], "datatype": "FP32", "data": [0.0] * 36}]}
        r = http.post("/v2/models/pipeline/infer", json=body)
        assert r.status_code == 400 and "batch-size must be <= 8" in r.json()["error"]
        body = {"inputs": [{"name": "RAW", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
                "outputs": [{"name": "norm"}]}
        r = http.post("/v2/models/pipeline/infer", json=body)
        assert r.status_code == 400 and "unexpected inference output 'norm'" in r.json()["error"]
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("pipeline", [_grpc_input("RAW", np.ones((1, 5), np.float32), "FP32")])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException) as e:
            c.infer("pipeline", [_grpc_input("RAW", RAW, "FP32")], model_version="7")
        assert e.value.status() == "StatusCode.NOT_FOUND"


# ---- cancellation -------------------------------------------------------------------------


def _slow_chain_inputs(module, seconds: float) -> list:
    make = _grpc_input if module is grpcclient else _http_input
    return [make("SECONDS", np.array([seconds], np.float32), "FP32"), make("X", np.ones(4, np.float32), "FP32")]


def _wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def test_grpc_deadline_cancels_the_running_and_later_steps(server):
    before_marker = _stats(server, "marker")["inference_count"]
    before_cancel = _stats(server, "slow_chain")["inference_stats"]["fail"]["count"]
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("slow_chain", _slow_chain_inputs(grpcclient, 5.0), client_timeout=0.5)
        assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    _wait_until(lambda: _stats(server, "slow_chain")["inference_stats"]["fail"]["count"] == before_cancel + 1)
    # the sleeper saw the cancellation (it stops early) and the step after it never ran
    _wait_until(lambda: _stats(server, "sleeper")["inference_stats"]["fail"]["count"] >= 1)
    time.sleep(0.5)
    assert _stats(server, "marker")["inference_count"] == before_marker


def test_http_disconnect_cancels_the_pipeline(server):
    before_marker = _stats(server, "marker")["inference_count"]
    before_fail = _stats(server, "sleeper")["inference_stats"]["fail"]["count"]
    body = {"inputs": [{"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [5.0]},
                       {"name": "X", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=0.5) as http:
        with pytest.raises(httpx.TimeoutException):
            http.post("/v2/models/slow_chain/infer", json=body)
    _wait_until(lambda: _stats(server, "sleeper")["inference_stats"]["fail"]["count"] == before_fail + 1)
    time.sleep(0.5)
    assert _stats(server, "marker")["inference_count"] == before_marker
    # an uncancelled request still completes the whole chain
    with httpclient.InferenceServerClient(server.http_url) as c:
        result = c.infer("slow_chain", _slow_chain_inputs(httpclient, 0.05))
    np.testing.assert_array_equal(result.as_numpy("Y"), np.ones(4, np.float32))
    assert _stats(server, "marker")["inference_count"] == before_marker + 1


def test_closing_a_stream_cancels_a_decoupled_ensemble(server):
    """Cancelling the stream mid-way stops the repeater long before its 10 000 values."""
    got: queue.Queue = queue.Queue()
    before = _stats(server, "square_slow")["inference_count"]
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        c.async_stream_infer("throttled", [_grpc_input("N", np.array([10_000], np.int32), "INT32")])
        for _ in range(3):
            assert got.get(timeout=30)[1] is None
        c.stop_stream(cancel_requests=True)
    time.sleep(1.0)
    settled = _stats(server, "square_slow")["inference_count"]
    time.sleep(0.5)
    assert _stats(server, "square_slow")["inference_count"] == settled
    assert settled - before < 50


# ---- a stateful composing model -----------------------------------------------------------


def test_sequence_parameters_reach_a_stateful_step(tmp_path):
    """The request's sequence_id / start / end reach the sequence-batched accumulator inside the
    ensemble: two interleaved sequences keep their own running sums of the doubled inputs."""
    from e2e.conftest import start_server
    from e2e.ensemble_models import _elementwise_int, write_ensemble
    from e2e.models import write_model
    from e2e.test_sequence import ACC_PY, acc_config

    write_model(tmp_path, "acc", acc_config("acc", "TYPE_UINT64"), ACC_PY)
    _elementwise_int(tmp_path, "double_int", "* 2", "X", "Y")
    write_ensemble(tmp_path, "seq_ensemble", '''
name: "seq_ensemble"
platform: "ensemble"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "double_int" input_map { key: "X" value: "X" } output_map { key: "Y" value: "doubled" } },
  { model_name: "acc" input_map { key: "INPUT" value: "doubled" } output_map { key: "OUTPUT" value: "SUM" } }
] }
''')
    server = start_server(repo=tmp_path, timeout=120)
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            def send(seq: int, value: int, start: bool = False, end: bool = False) -> int:
                result = c.infer("seq_ensemble", [_grpc_input("X", np.array([[value]], np.int32), "INT32")],
                                 sequence_id=seq, sequence_start=start, sequence_end=end)
                params = result.get_response().parameters
                assert params["sequence_id"].int64_param == seq
                assert params["sequence_start"].bool_param is start
                return int(result.as_numpy("SUM")[0][0])

            assert send(11, 1, start=True) == 2
            assert send(12, 10, start=True) == 20
            assert send(11, 2) == 6
            assert send(12, 5) == 30
            assert send(11, 3, end=True) == 12
            with pytest.raises(InferenceServerException) as e:
                send(13, 1)  # no START on the first request of a sequence
            assert "START" in e.value.message() and "model 'acc'" in e.value.message()
    finally:
        server.stop()


def test_a_traced_ensemble_request_traces_its_steps_as_children(tmp_path):
    from e2e.conftest import start_server

    repo = write_pipeline_repo(tmp_path / "repo")
    trace_file = tmp_path / "trace.json"
    server = start_server("--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                          "--trace-config", f"triton,file={trace_file}", repo=repo, timeout=120)
    try:
        with httpclient.InferenceServerClient(server.http_url) as c:
            c.infer("pipeline", [_http_input("RAW", RAW, "FP32")], request_id="traced")
    finally:
        assert server.stop() == 0
    entries = json.loads(trace_file.read_text())
    heads = {e["model_name"]: e for e in entries if "model_name" in e}
    assert set(heads) == {"pipeline", "pre", "mlp", "post"}
    parent = heads["pipeline"]
    assert parent["parent_id"] == 0 and parent["request_id"] == "traced"
    assert all(heads[m]["parent_id"] == parent["id"] for m in ("pre", "mlp", "post"))
    stamps = {e["id"]: [t["name"] for t in e["timestamps"]] for e in entries if "timestamps" in e}
    assert stamps[parent["id"]] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert "COMPUTE_START" in stamps[heads["mlp"]["id"]]


# ---- grpclib ------------------------------------------------------------------------------


def test_grpclib_drives_ensembles(server):
    """grpclib: unary ModelInfer on the pipeline, a bad input (INVALID_ARGUMENT), a decoupled
    ensemble refused on ModelInfer (UNIMPLEMENTED) and streamed over ModelStreamInfer."""
    import tritonclient.grpc.service_pb2 as pb
    from e2e.test_grpc_grpclib import SERVICE, call, fp32_request, run
    from grpclib.const import Cardinality, Status
    from grpclib.exceptions import GRPCError

    def stream_request() -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name="stream_pipe", id="gl")
        message.parameters["triton_enable_empty_final_response"].bool_param = True
        message.inputs.add(name="N", datatype="INT32", shape=[1])
        message.raw_input_contents.append(np.array([3], np.int32).tobytes())
        return message

    async def body(channel):
        reply = await call(channel, "ModelInfer", fp32_request("pipeline", "RAW", RAW, "g7"), pb.ModelInferResponse)
        errors = []
        for request in (fp32_request("pipeline", "RAW", np.ones((1, 5), np.float32)), stream_request()):
            try:
                await call(channel, "ModelInfer", request, pb.ModelInferResponse)
            except GRPCError as e:
                errors.append(e.status)
        replies = []
        async with channel.request(SERVICE + "ModelStreamInfer", Cardinality.STREAM_STREAM,
                                   pb.ModelInferRequest, pb.ModelStreamInferResponse) as stream:
            await stream.send_message(stream_request(), end=True)
            async for message in stream:
                replies.append(message)
        return reply, errors, replies

    reply, errors, replies = run(server, body)
    assert reply.id == "g7" and reply.model_name == "pipeline"
    np.testing.assert_array_equal(np.frombuffer(reply.raw_output_contents[0], np.float32).reshape(2, 4),
                                  (RAW * 2 + 1) * 10)
    assert errors == [Status.INVALID_ARGUMENT, Status.UNIMPLEMENTED]
    assert all(not r.error_message for r in replies)
    finals = [r.infer_response.parameters["triton_final_response"].bool_param for r in replies]
    assert finals[-1] and not any(finals[:-1])  # on the last data response or an empty one after it
    data = [r for r in replies if r.infer_response.raw_output_contents]
    squares = [int(np.frombuffer(r.infer_response.raw_output_contents[0], np.int32)[0]) for r in data]
    assert squares == [0, 1, 4]
