"""OpenVINO models (IR and ONNX) served end to end with tritonclient over HTTP and gRPC."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from e2e.test_backends_onnxruntime import BOTH, check_dynamic_batching, expect_error
from unit.backends.test_onnxruntime import add_sub_graph, mlp_graph, mlp_reference
from unit.backends.test_openvino import ONNX_CONFIG, write_ov_model

THROUGHPUT = '''backend: "openvino"
max_batch_size: 16
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { }
parameters [ { key: "PERFORMANCE_HINT" value { string_value: "THROUGHPUT" } },
             { key: "NUM_STREAMS" value { string_value: "2" } } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("ov-repo")
    write_ov_model(repo, "mlp_ir", mlp_graph, THROUGHPUT, ir=True)
    write_ov_model(repo, "add_sub", add_sub_graph, ONNX_CONFIG)
    s = start_server(repo=repo)
    yield s
    s.stop()


def test_auto_completed_ir_config(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        config = client.get_model_config("mlp_ir").config
        assert config.backend == "openvino" and config.default_model_filename == "model.xml"
        assert [(i.name, list(i.dims)) for i in config.input] == [("x", [64])]
        assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [10])]
        assert client.get_model_metadata("add_sub", as_json=True)["platform"] == "openvino"
    finally:
        client.close()


@BOTH
def test_onnx_via_openvino(server, infer):
    a, b = np.ones((2, 4), np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)
    out = infer(server, "add_sub", {"INPUT0": a, "INPUT1": b})
    assert out["OUTPUT0"].tolist() == (a + b).tolist() and out["OUTPUT1"].tolist() == (a - b).tolist()


def test_dynamic_batching_ir_throughput(server):
    def make(i: int) -> dict[str, np.ndarray]:
        return {"x": np.random.default_rng(i).random((1 + i % 2, 64), dtype=np.float32)}

    def check(inputs: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
        np.testing.assert_allclose(out["logits"], mlp_reference(inputs["x"]), rtol=1e-4, atol=1e-4)

    assert check_dynamic_batching(server, "mlp_ir", make, check) > 1


@BOTH
def test_bad_inputs(server, infer):
    expect_error(infer, server, "mlp_ir", {"x": np.ones((1, 63), np.float32)}, "unexpected shape for input 'x'")
    expect_error(infer, server, "mlp_ir", {"x": np.ones((17, 64), np.float32)}, "batch-size must be <= 16")
