"""PyTorch models (TorchScript and torch.export) served end to end with tritonclient, HTTP and gRPC."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e.test_backends_onnxruntime import BOTH, check_dynamic_batching, expect_error
from unit.backends.test_pytorch import (
    ADD_SUB_CONFIG,
    AddSub,
    DictOut,
    Upper,
    write_exported,
    write_torchscript,
)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

DICT_CONFIG = '''backend: "pytorch" max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "sum" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "prod" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { }
'''
STRINGS_CONFIG = '''backend: "pytorch" max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("torch-repo")
    write_torchscript(repo, "add_sub", AddSub(), ADD_SUB_CONFIG.format(t="TYPE_FP32"))
    write_torchscript(repo, "dict_out", DictOut(), DICT_CONFIG)
    write_torchscript(repo, "upper", Upper(), STRINGS_CONFIG)
    write_exported(repo, "exported")
    s = start_server(repo=repo)
    yield s
    s.stop()


@BOTH
def test_torchscript_indexed_io(server, infer):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 0.5, np.float32)
    out = infer(server, "add_sub", {"INPUT__0": a, "INPUT__1": b})
    assert out["OUTPUT__0"].tolist() == (a + b).tolist() and out["OUTPUT__1"].tolist() == (a - b).tolist()


@BOTH
def test_exported_program_auto_completed(server, infer):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        meta = client.get_model_metadata("exported")
    finally:
        client.close()
    assert meta["platform"] == "pytorch_libtorch"
    assert [(i["name"], i["shape"]) for i in meta["inputs"]] == [("x", [-1, 4]), ("y", [-1, 4])]
    a, b = np.ones((2, 4), np.float32), np.full((2, 4), 3, np.float32)
    out = infer(server, "exported", {"x": a, "y": b})
    assert out["OUTPUT__0"].tolist() == (a + b).tolist()


@BOTH
def test_string_lists(server, infer):
    out = infer(server, "upper", {"INPUT__0": np.array([b"abc", b"de"], dtype=object)}, datatypes={"INPUT__0": "BYTES"})
    assert out["OUTPUT__0"].tolist() == [b"ABC", b"DE"]


def test_dynamic_batching_dict_outputs(server):
    def make(i: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(i)
        n = 1 + i % 4
        return {"x": rng.random((n, 2), dtype=np.float32), "y": rng.random((n, 2), dtype=np.float32)}

    def check(inputs: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
        np.testing.assert_allclose(out["sum"], inputs["x"] + inputs["y"], rtol=1e-6)
        np.testing.assert_allclose(out["prod"], inputs["x"] * inputs["y"], rtol=1e-6)

    assert check_dynamic_batching(server, "dict_out", make, check) > 1


@BOTH
def test_bad_inputs(server, infer):
    a = np.ones((1, 4), np.float32)
    expect_error(infer, server, "add_sub", {"INPUT__0": a, "INPUT__1": np.ones((1, 3), np.float32)},
                 "unexpected shape for input 'INPUT__1'")
    expect_error(infer, server, "add_sub", {"INPUT__0": a, "INPUT__1": a.astype(np.float64)},
                 "data-type is 'FP64', but model 'add_sub' expects 'FP32'")
