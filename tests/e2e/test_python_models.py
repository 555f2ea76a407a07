"""Typical Triton Python models under the real server, over HTTP and gRPC with tritonclient,
in both execution modes (in-process threads and process-isolated)."""

from __future__ import annotations

import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.python_models import build_repo
from tritonclient.utils import InferenceServerException

NAMES = ["add_sub", "bls", "repeater", "strings", "autocomplete", "raises", "async_model", "metrics_model"]


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request, tmp_path_factory):
    from e2e.conftest import start_server

    repo = build_repo(tmp_path_factory.mktemp(f"py-{request.param}"), NAMES, mode=request.param)
    s = start_server(repo=repo, timeout=120)
    s.mode = request.param
    yield s
    s.stop()


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    if request.param == "http":
        c = httpclient.InferenceServerClient(server.http_url)
    else:
        c = grpcclient.InferenceServerClient(server.grpc_url)
    c.protocol = request.param
    yield c
    c.close()


def _input(client, name, array, datatype):
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    t = module.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def _parameters(client, result) -> dict:
    if client.protocol == "http":
        return result.get_response().get("parameters", {})
    out = {}
    for key, p in result.get_response().parameters.items():
        out[key] = getattr(p, p.WhichOneof("parameter_choice"))
    return out


def test_all_models_are_ready(client):
    for name in NAMES:
        assert client.is_model_ready(name), name


def test_add_sub(client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), np.float32)
    result = client.infer("add_sub", [_input(client, "INPUT0", a, "FP32"), _input(client, "INPUT1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_caller_reaches_other_models(client):
    a = np.linspace(0, 1, 16, dtype=np.float32)
    b = np.full(16, 0.5, np.float32)
    result = client.infer("bls", [_input(client, "A", a, "FP32"), _input(client, "B", b, "FP32")])
    np.testing.assert_allclose(result.as_numpy("SUM"), a + b)
    np.testing.assert_allclose(result.as_numpy("DIFF"), a - b)
    assert result.as_numpy("COUNT").tolist() == [3]  # the decoupled repeater's three responses
    assert "no_such_model" in _parameters(client, result)["missing_error"]


def test_string_processing(client):
    words = np.array(["héllo".encode(), b"", b"trident"], dtype=object)
    result = client.infer("strings", [_input(client, "TEXT", words, "BYTES")])
    assert result.as_numpy("UPPER").tolist() == ["HÉLLO".encode(), b"", b"TRIDENT"]
    assert result.as_numpy("LENGTH").tolist() == [5, 0, 7]


def test_auto_completed_model(client):
    if client.protocol == "grpc":
        config = client.get_model_config("autocomplete", as_json=True)["config"]
    else:
        config = client.get_model_config("autocomplete")
    assert int(config["max_batch_size"]) == 4
    assert config["input"][0]["name"] == "X" and config["input"][0]["data_type"] == "TYPE_INT64"
    assert "dynamic_batching" in config
    x = np.array([[1, 2], [3, 4]], np.int64)
    result = client.infer("autocomplete", [_input(client, "X", x, "INT64")])
    assert result.as_numpy("Y").tolist() == [[10, 20], [30, 40]]


def test_model_that_raises(client):
    with pytest.raises(InferenceServerException, match="negative input is not allowed"):
        client.infer("raises", [_input(client, "X", np.array([-1], np.float32), "FP32")])
    with pytest.raises(InferenceServerException, match="zero is refused"):
        client.infer("raises", [_input(client, "X", np.array([0], np.float32), "FP32")])
    ok = client.infer("raises", [_input(client, "X", np.array([2], np.float32), "FP32")])
    assert ok.as_numpy("Y").tolist() == [2.0]


def test_async_execute_with_async_bls(client):
    a = np.arange(16, dtype=np.float32)
    result = client.infer("async_model", [_input(client, "A", a, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("TWICE"), a + a)


def test_custom_metrics_on_the_metrics_port(server):
    c = httpclient.InferenceServerClient(server.http_url)
    for value in (0.5, 5.0, 50.0):
        inp = httpclient.InferInput("X", [1], "FP32")
        inp.set_data_from_numpy(np.array([value], np.float32))
        result = c.infer("metrics_model", [inp])
    c.close()
    assert result.get_response()["parameters"]["count"] >= 3
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    assert "# TYPE custom_requests counter" in text
    assert 'custom_last_value{model="metrics_model"} 50' in text
    assert 'custom_input_value_bucket{model="metrics_model",le="1"}' in text
    assert 'custom_input_value_bucket{model="metrics_model",le="+Inf"}' in text
    assert 'custom_input_value_count{model="metrics_model"}' in text


def test_decoupled_model_is_refused_on_unary_infer(client):
    inputs = [_input(client, "IN", np.array([2], np.int32), "INT32"),
              _input(client, "DELAY", np.array([0], np.float32), "FP32")]
    with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
        client.infer("repeater", inputs)


def test_decoupled_repeater_over_grpc_stream(server):
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for rid, count in (("a", 4), ("b", 2)):
            inputs = [_input(c, "IN", np.array([count], np.int32), "INT32"),
                      _input(c, "DELAY", np.array([0.02], np.float32), "FP32")]
            c.async_stream_infer("repeater", inputs, request_id=rid, enable_empty_final_response=True)
        seen: dict[str, list[int]] = {"a": [], "b": []}
        finals = 0
        while finals < 2:
            result, error = results.get(timeout=30)
            assert error is None
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
                assert not response.outputs  # the flag-only final response
                continue
            seen[response.id].append(int(result.as_numpy("OUT")[0]))
        assert seen == {"a": [0, 1, 2, 3], "b": [0, 1]}  # in order, per request
    finally:
        c.stop_stream()
        c.close()
