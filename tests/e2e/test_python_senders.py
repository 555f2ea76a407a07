"""Python models as Triton's python_backend examples and qa models write them, under the real
server over HTTP and gRPC, in-process and process-isolated: response senders used after
``execute`` returned (decoupled and not), tasks on the instance's asyncio loop, a second send
refused, BLS by a bytes model name, BF16 through DLPack, and per-request order of responses
sent from several threads of one batch."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.python_models import build_repo
from tritonclient.utils import InferenceServerException

NAMES = ["late_sender", "late_sender_async", "async_later", "batch_threads", "bls_by_name", "bf16_dlpack",
         "add_sub"]


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request, tmp_path_factory):
    from e2e.conftest import start_server

    repo = build_repo(tmp_path_factory.mktemp(f"senders-{request.param}"), NAMES, mode=request.param)
    s = start_server(repo=repo, timeout=120)
    yield s
    s.stop()


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    if request.param == "http":
        c = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    else:
        c = grpcclient.InferenceServerClient(server.grpc_url)
    c.protocol = request.param
    yield c
    c.close()


def _module(client):
    return httpclient if client.protocol == "http" else grpcclient


def _input(module, name, array, datatype):
    t = module.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def _parameters(client, result) -> dict:
    if client.protocol == "http":
        return result.get_response().get("parameters", {})
    return {k: getattr(p, p.WhichOneof("parameter_choice")) for k, p in result.get_response().parameters.items()}


def _late(client, model: str, mode: str, x: int, request_id: str = "r", **params):
    inputs = [_input(_module(client), "X", np.array([[x]], np.int32), "INT32")]
    result = client.infer(model, inputs, request_id=request_id, parameters={"mode": mode, **params})
    return result.as_numpy("Y").tolist(), _parameters(client, result)


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was not written")
        time.sleep(0.02)
    return path.read_text()


# ---- a non-decoupled model answering through its response sender ----


@pytest.mark.parametrize("model", ["late_sender", "late_sender_async"])
@pytest.mark.parametrize("mode", ["later", "flag_later"])
def test_non_decoupled_response_sent_after_execute_returned(client, model, mode):
    y, params = _late(client, model, mode, 41)
    assert y == [[42]] and params["tag"] == mode


def test_non_decoupled_response_sent_by_a_task_of_the_instance_loop(client):
    y, params = _late(client, "late_sender_async", "task", 1)
    assert y == [[2]] and params["tag"] == "task"


@pytest.mark.parametrize("model", ["late_sender", "late_sender_async"])
def test_second_response_raised_out_of_execute_leaves_the_first(client, server, model):
    y, params = _late(client, model, "two_in_execute", 7)
    assert y == [[8]] and params["tag"] == "first"  # not the error: the request was answered
    deadline = time.monotonic() + 10
    while "Non-decoupled model cannot send more than one response" not in server.log():
        assert time.monotonic() < deadline, "the refused send was not logged"
        time.sleep(0.05)


@pytest.mark.parametrize("mode,refused", [
    ("two_later", ["Non-decoupled model cannot send more than one response."]),
    ("after_final", ["Non-decoupled model cannot send more than one response.",
                     "Unable to send response. Response sender has been closed."]),
])
def test_sends_after_the_one_response_are_refused_in_the_model(client, server, tmp_path, mode, refused):
    rid = f"{mode}-{client.protocol}"
    y, params = _late(client, "late_sender", mode, 2, request_id=rid, marker=str(tmp_path))
    assert y == [[3]] and params["tag"] == "first"
    assert json.loads(_wait_for(tmp_path / f"{rid}.refused")) == refused
    assert "a non-decoupled model sent a second response" in server.log()


def test_a_request_never_answered_waits_until_the_client_gives_up(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inputs = [_input(grpcclient, "X", np.array([[1]], np.int32), "INT32")]
        with pytest.raises(InferenceServerException) as info:
            c.infer("late_sender", inputs, parameters={"mode": "never"}, client_timeout=1.0)
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        result = c.infer("late_sender", inputs, parameters={"mode": "later"})  # the model still serves
        assert result.as_numpy("Y").tolist() == [[2]]
    finally:
        c.close()


def test_batch_mixing_returned_and_sent_responses(server):
    """Three requests of one batch: one returned from execute (the others None), one sent by
    a thread with the final flag, one sent and completed by a flag-only final."""
    c = httpclient.InferenceServerClient(server.http_url, concurrency=3)
    try:
        modes = ["return", "later", "flag_later"]
        futures = [c.async_infer("late_sender", [_input(httpclient, "X", np.array([[i]], np.int32), "INT32")],
                                 request_id=f"m{i}", parameters={"mode": mode}) for i, mode in enumerate(modes)]
        results = [f.get_result() for f in futures]
    finally:
        c.close()
    assert [r.as_numpy("Y").tolist() for r in results] == [[[1]], [[2]], [[3]]]
    tags = [r.get_response()["parameters"]["tag"] for r in results]
    assert tags == ["returned", "later", "flag_later"]


# ---- a decoupled async def execute whose tasks answer later ----


def _stream(server, model: str, requests: list[tuple[str, dict, list]]) -> dict[str, list]:
    """Send ``requests`` (id, parameters, inputs) on one gRPC stream; each id's responses
    (OUT values, the final flag-only response as "final") until every one has its final."""
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    seen: dict[str, list] = {rid: [] for rid, _, _ in requests}
    try:
        for rid, params, inputs in requests:
            c.async_stream_infer(model, inputs, request_id=rid, parameters=params or None,
                                 enable_empty_final_response=True)
        finals = 0
        while finals < len(requests):
            result, error = results.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
                seen[response.id].append("final")
            else:
                batch = response.parameters["batch"].int64_param if "batch" in response.parameters else None
                seen[response.id].append((int(result.as_numpy("OUT").reshape(-1)[0]), batch))
    finally:
        c.stop_stream()
        c.close()
    return seen


def _count(n: int, module=grpcclient, shape=(1,)):
    return [_input(module, "IN", np.full(shape, n, np.int32), "INT32")]


@pytest.mark.parametrize("final_later", [False, True])
def test_decoupled_async_execute_tasks_send_after_it_returned(server, final_later):
    params = {"final_later": True} if final_later else {}
    seen = _stream(server, "async_later", [("a", params, _count(3)), ("b", params, _count(2))])
    assert seen == {"a": [(0, None), (1, None), (2, None), "final"], "b": [(0, None), (1, None), "final"]}


def test_decoupled_async_execute_over_http_generate_stream(server):
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=30) as http:
        r = http.post("/v2/models/async_later/generate_stream", json={"IN": 3, "final_later": True})
    assert r.status_code == 200
    events = [json.loads(line[len("data:"):]) for line in r.text.split("\n") if line.startswith("data:")]
    assert [e["OUT"] for e in events if "OUT" in e] == [0, 1, 2]


def test_two_requests_of_one_batch_keep_their_order_per_request(server):
    """batch_threads batches two requests (preferred size 2, 3 s queue delay) and answers each
    from a thread of its own, as fast as it can: each request's responses arrive in the order
    its thread sent them, round after round."""
    n = 40
    for _ in range(5):
        seen = _stream(server, "batch_threads", [("x", {}, _count(n, shape=(1, 1))),
                                                 ("y", {}, _count(n, shape=(1, 1)))])
        for rid in ("x", "y"):
            assert seen[rid] == [(i, 2) for i in range(n)] + ["final"], rid


# ---- BLS by a bytes model name, BF16 through DLPack ----


def test_bls_model_name_read_from_a_bytes_tensor(client):
    module = _module(client)
    a = np.arange(16, dtype=np.float32)
    inputs = [_input(module, "MODEL", np.array([b"add_sub"], dtype=object), "BYTES"),
              _input(module, "A", a, "FP32")]
    np.testing.assert_array_equal(client.infer("bls_by_name", inputs).as_numpy("SUM"), a + a)


def test_bf16_as_numpy_is_refused_and_dlpack_carries_it(client):
    module = _module(client)
    bits = np.array([0x3F80, 0x4000, 0xC040, 0x7F80], np.uint16)  # 1, 2, -3, inf
    x = module.InferInput("X", [4], "BF16")
    if client.protocol == "http":
        x.set_data_from_numpy(bits.view(ml_dtypes.bfloat16), binary_data=True)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("Y", "REFUSED")]
    else:
        x.set_data_from_numpy(bits.view(ml_dtypes.bfloat16))
        outputs = None
    result = client.infer("bf16_dlpack", [x], outputs=outputs)
    assert result.as_numpy("Y").view(np.uint16).tolist() == bits.tolist()
    assert result.as_numpy("REFUSED").tolist() == [b"tensor dtype is bf16 and cannot be converted to numpy"]


def test_concurrent_late_answers_do_not_mix_up(server):
    """Many requests answered by threads after execute returned, in batches of up to 4."""
    c = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    try:
        futures = [c.async_infer("late_sender", [_input(httpclient, "X", np.array([[i]], np.int32), "INT32")],
                                 parameters={"mode": "later"}) for i in range(24)]
        got = [f.get_result().as_numpy("Y").tolist() for f in futures]
    finally:
        c.close()
    assert got == [[[i + 1]] for i in range(24)]
