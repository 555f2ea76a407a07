"""An ONNX model served by onnxruntime inside the image: a small graph made here with onnx,
mounted read-only, driven with tritonclient over HTTP and gRPC and checked against numpy, with a
wrong datatype refused. Run by ``containers/smoke.sh`` when the image was built with the
onnxruntime extra (``TRIDENT_IMAGE_EXTRAS`` names it: ``containers/arm64.sh`` does, since
onnxruntime publishes aarch64 wheels)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper, save
from tritonclient.utils import InferenceServerException

from tests.containers.conftest import IMAGE, Container, run_container

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
BIAS = np.array([1.0, -1.0, 0.5], np.float32)
CONFIG = """name: "affine"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { }
"""


def _write_affine(repo: Path) -> None:
    """repo/affine: Y = relu(X @ WEIGHTS + BIAS) as an ONNX graph (opset 17)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Z"]),
         helper.make_node("Relu", ["Z"], ["Y"])],
        "affine",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 3])],
        [numpy_helper.from_array(WEIGHTS, "W"), numpy_helper.from_array(BIAS, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    (repo / "affine" / "1").mkdir(parents=True)
    save(model, str(repo / "affine" / "1" / "model.onnx"))
    (repo / "affine" / "config.pbtxt").write_text(CONFIG)
    for p in [repo, *repo.rglob("*")]:  # readable by the image's user (uid 10001)
        p.chmod(0o755 if p.is_dir() else 0o644)


@pytest.fixture(scope="module")
def served(image: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    repo = tmp_path_factory.mktemp("onnx") / "repo"
    repo.mkdir()
    _write_affine(repo)
    c = run_container("trident", "serve", "--model-repository=/models", options=(f"--volume={repo}:/models:ro",))
    print(f"\n{IMAGE}: ONNX model ready {c.ready_after:.2f} s after podman run")
    yield c
    c.remove()


def _expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ WEIGHTS + BIAS, 0)


def test_onnxruntime_is_in_the_image_and_loads_the_model(served: Container) -> None:
    version = served.exec("python", "-c", "import onnxruntime; print(onnxruntime.__version__)")
    assert version.returncode == 0, version.stderr
    print(f"\n{IMAGE}: onnxruntime {version.stdout.strip()}")
    with httpclient.InferenceServerClient(served.url(8000)) as c:
        assert c.is_model_ready("affine")
        config = c.get_model_config("affine")
        assert config["backend"] == "onnxruntime" and config["max_batch_size"] == 8


def test_onnx_inference_over_http_and_grpc(served: Container) -> None:
    x = np.random.default_rng(7).standard_normal((5, 4)).astype(np.float32)
    with httpclient.InferenceServerClient(served.url(8000)) as c:
        inp = httpclient.InferInput("X", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_allclose(c.infer("affine", [inp]).as_numpy("Y"), _expected(x), rtol=1e-5, atol=1e-6)
    with grpcclient.InferenceServerClient(served.url(8001)) as c:
        inp = grpcclient.InferInput("X", [1, 4], "FP32")
        inp.set_data_from_numpy(x[:1])
        np.testing.assert_allclose(c.infer("affine", [inp]).as_numpy("Y"), _expected(x[:1]), rtol=1e-5, atol=1e-6)


def test_onnx_model_refuses_a_wrong_datatype_and_keeps_serving(served: Container) -> None:
    with grpcclient.InferenceServerClient(served.url(8001)) as c:
        wrong = grpcclient.InferInput("X", [1, 4], "INT32")
        wrong.set_data_from_numpy(np.zeros((1, 4), np.int32))
        with pytest.raises(InferenceServerException) as e:
            c.infer("affine", [wrong])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "X" in e.value.message()
        too_big = grpcclient.InferInput("X", [9, 4], "FP32")
        too_big.set_data_from_numpy(np.zeros((9, 4), np.float32))
        with pytest.raises(InferenceServerException) as e:
            c.infer("affine", [too_big])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert c.is_model_ready("affine")
