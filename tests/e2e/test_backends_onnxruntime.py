"""onnxruntime models served end to end: ``trident serve`` with tritonclient over HTTP and gRPC.

Also holds the client helpers the other tests/e2e/test_backends_*.py modules share.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException, np_to_triton_dtype
from unit.backends.test_onnxruntime import (
    add_sub_graph,
    identity_graph,
    mlp_graph,
    mlp_reference,
    write_onnx_model,
)

from trident.server.devices import gpu_count

# ---------------------------------------------------------------- shared client helpers


def _inputs(module, inputs: dict[str, np.ndarray], datatypes: dict[str, str] | None = None) -> list:
    made = []
    for name, array in inputs.items():
        dt = (datatypes or {}).get(name) or np_to_triton_dtype(array.dtype)
        inp = module.InferInput(name, list(array.shape), dt)
        inp.set_data_from_numpy(array)
        made.append(inp)
    return made


def infer_http(server, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
               datatypes: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        wanted = [httpclient.InferRequestedOutput(o) for o in outputs] if outputs else None
        result = client.infer(model, _inputs(httpclient, inputs, datatypes), outputs=wanted)
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}
    finally:
        client.close()


def infer_grpc(server, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
               datatypes: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        wanted = [grpcclient.InferRequestedOutput(o) for o in outputs] if outputs else None
        result = client.infer(model, _inputs(grpcclient, inputs, datatypes), outputs=wanted)
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
    finally:
        client.close()


BOTH = pytest.mark.parametrize("infer", [infer_http, infer_grpc], ids=["http", "grpc"])


def largest_batch(server, model: str) -> int:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    return max((int(b["batch_size"]) for b in stats["batch_stats"]), default=0)


def check_dynamic_batching(server, model: str, make: Callable[[int], dict[str, np.ndarray]],
                           check: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None],
                           *, concurrency: int = 16, rounds: int = 20) -> int:
    """Send bursts of concurrent requests (half HTTP, half gRPC) until the server has executed a
    batch of more than one request (bounded by ``rounds``); every result is checked."""
    def one(i: int) -> None:
        inputs = make(i)
        infer = infer_http if i % 2 else infer_grpc
        check(inputs, infer(server, model, inputs))

    with ThreadPoolExecutor(concurrency) as pool:
        for r in range(rounds):
            list(pool.map(one, range(r * concurrency, (r + 1) * concurrency)))
            if largest_batch(server, model) > 1:
                break
    return largest_batch(server, model)


def expect_error(infer, server, model: str, inputs: dict[str, np.ndarray], fragment: str,
                 datatypes: dict[str, str] | None = None) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        infer(server, model, inputs, datatypes=datatypes)
    assert fragment in e.value.message(), e.value.message()
    status = str(e.value.status())
    assert status in ("400", "StatusCode.INVALID_ARGUMENT"), status
    return e.value


# ---------------------------------------------------------------- the server

MLP_CONFIG = '''
max_batch_size: 32
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { }
parameters [ { key: "intra_op_thread_count" value { string_value: "1" } } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("onnx-repo")
    write_onnx_model(repo, "add_sub", add_sub_graph)  # no config.pbtxt: fully auto-completed
    write_onnx_model(repo, "mlp", mlp_graph, MLP_CONFIG)
    write_onnx_model(repo, "strings", identity_graph, elem=TensorProto.STRING)
    s = start_server(repo=repo)
    yield s
    s.stop()


# ---------------------------------------------------------------- tests


def test_auto_completed_metadata_and_config(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        meta = client.get_model_metadata("add_sub", as_json=True)
        assert meta["platform"] == "onnxruntime_onnx"
        assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]},
                                  {"name": "INPUT1", "datatype": "FP32", "shape": ["-1", "4"]}]
        config = client.get_model_config("add_sub").config
        assert config.backend == "onnxruntime" and config.max_batch_size == 4
        assert config.HasField("dynamic_batching") and list(config.dynamic_batching.preferred_batch_size) == [4]
        group = config.instance_group
        if gpu_count() == 0:  # Triton's default: 2 CPU instances for onnxruntime
            assert [g.kind for g in group] == [2] and group[0].count == 2
        else:  # one instance on every GPU (the lent GPU host)
            assert [g.kind for g in group] == [1] and group[0].count == 1
            assert list(group[0].gpus) == list(range(gpu_count()))
    finally:
        client.close()


@BOTH
def test_add_sub(server, infer):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    out = infer(server, "add_sub", {"INPUT0": a, "INPUT1": b})
    assert out["OUTPUT0"].tolist() == (a + b).tolist() and out["OUTPUT1"].tolist() == (a - b).tolist()
    only = infer(server, "add_sub", {"INPUT0": a, "INPUT1": b}, outputs=["OUTPUT1"])
    assert list(only) == ["OUTPUT1"]


@BOTH
def test_strings(server, infer):
    words = np.array([["héllo".encode(), b"x"], [b"", "日本".encode()]], dtype=object)
    out = infer(server, "strings", {"X": words}, datatypes={"X": "BYTES"})
    assert out["Y"].tolist() == words.tolist()
    binary = np.array([[b"\xff\x00"]], dtype=object)  # onnxruntime holds strings as UTF-8 text
    expect_error(infer, server, "strings", {"X": binary}, "not UTF-8 text", datatypes={"X": "BYTES"})


def test_dynamic_batching_mlp(server):
    def make(i: int) -> dict[str, np.ndarray]:
        return {"x": np.random.default_rng(i).random((1 + i % 3, 64), dtype=np.float32)}

    def check(inputs: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
        np.testing.assert_allclose(out["logits"], mlp_reference(inputs["x"]), rtol=1e-4, atol=1e-5)

    assert check_dynamic_batching(server, "mlp", make, check) > 1


@BOTH
def test_bad_inputs(server, infer):
    a = np.ones((1, 4), np.float32)
    expect_error(infer, server, "add_sub", {"INPUT0": a, "INPUT1": np.ones((1, 5), np.float32)},
                 "unexpected shape for input 'INPUT1'")
    expect_error(infer, server, "add_sub", {"INPUT0": a, "INPUT1": a.astype(np.int32)},
                 "data-type is 'INT32', but model 'add_sub' expects 'FP32'")
    expect_error(infer, server, "add_sub", {"INPUT0": np.ones((5, 4), np.float32), "INPUT1": np.ones((5, 4), np.float32)},
                 "batch-size must be <= 4")
    expect_error(infer, server, "add_sub", {"INPUT0": a}, "missing required input(s) ['INPUT1']")
