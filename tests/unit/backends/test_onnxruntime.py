"""The onnxruntime backend with real ONNX graphs built at test time (onnx.helper), no server.

The model builders here are shared with tests/e2e/test_backends_onnxruntime.py and the bench.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trident import config as cfg
from trident.backends import get_backend
from trident.backends._common import IOSpec, autocomplete, check_io
from trident.backends.base import LoadContext
from trident.backends.onnxruntime_backend import OnnxRuntimeBackend, providers
from trident.config_validation import validate_config
from trident.errors import Code, TritonError
from trident.protocol import datatypes
from trident.protocol.generated.inference import DataType, ModelConfig
from trident.protocol.pbtxt import parse_pbtxt
from trident.types import InferenceRequest, RequestedOutput, Tensor

# ---------------------------------------------------------------- model builders


def _save(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def add_sub_graph(path: Path, dims: list = ("N", 4), elem: int = TensorProto.FLOAT) -> Path:
    """INPUT0, INPUT1 -> OUTPUT0 = a + b, OUTPUT1 = a - b."""
    info = [helper.make_tensor_value_info(n, elem, list(dims)) for n in ("INPUT0", "INPUT1")]
    outs = [helper.make_tensor_value_info(n, elem, list(dims)) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    return _save(helper.make_graph(nodes, "add_sub", info, outs), path)


def identity_graph(path: Path, elem: int, dims: list = ("N", -1)) -> Path:
    dims = [d if d != -1 else f"d{i}" for i, d in enumerate(dims)]
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "identity",
                              [helper.make_tensor_value_info("X", elem, dims)],
                              [helper.make_tensor_value_info("Y", elem, dims)])
    return _save(graph, path)


def mlp_weights(features: int, hidden: int, classes: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((features, hidden)).astype(np.float32) * 0.1,
            rng.standard_normal(hidden).astype(np.float32) * 0.1,
            rng.standard_normal((hidden, classes)).astype(np.float32) * 0.1,
            rng.standard_normal(classes).astype(np.float32) * 0.1]


def mlp_graph(path: Path, features: int = 64, hidden: int = 256, classes: int = 10, seed: int = 0) -> Path:
    """x[N,features] -> relu(x W1 + b1) W2 + b2 -> logits[N,classes]."""
    w1, b1, w2, b2 = mlp_weights(features, hidden, classes, seed)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "W1"), (b1, "B1"), (w2, "W2"), (b2, "B2"))]
    nodes = [helper.make_node("Gemm", ["x", "W1", "B1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "B2"], ["logits"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    return _save(graph, path)


def mlp_reference(x: np.ndarray, features: int = 64, hidden: int = 256, classes: int = 10, seed: int = 0) -> np.ndarray:
    w1, b1, w2, b2 = mlp_weights(features, hidden, classes, seed)
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def write_onnx_model(repo: Path, name: str, build, config: str = "", version: int = 1, **kw) -> Path:
    folder = repo / name
    build(folder / str(version) / "model.onnx", **kw)
    if config:
        (folder / "config.pbtxt").write_text(config)
    return folder


# ---------------------------------------------------------------- helpers


def prepare(model_dir: Path, pbtxt: str = "", backend_config: dict[str, str] | None = None) -> ModelConfig:
    """What the repository does: defaults, backend auto-complete, defaults again, validation."""
    config = parse_pbtxt(pbtxt) if pbtxt else ModelConfig()
    config = cfg.complete_defaults(config, model_dir.name, model_dir=model_dir)
    config = OnnxRuntimeBackend().auto_complete_config(config, model_dir, model_dir / "1", backend_config)
    config = cfg.complete_defaults(config, model_dir.name)
    validate_config(config, model_dir.name, model_dir)
    return config


def context(model_dir: Path, config: ModelConfig, kind: str = "KIND_CPU", device: int = 0) -> LoadContext:
    return LoadContext(model_dir.name, 1, model_dir, model_dir / "1", config, cfg.config_to_json(config),
                       f"{model_dir.name}_0", kind, device)


def request(model: str, **inputs: np.ndarray) -> InferenceRequest:
    return InferenceRequest(model, [Tensor.from_numpy(k, v) for k, v in inputs.items()])


# ---------------------------------------------------------------- tests


def test_registered_lazily():
    backend = get_backend("onnxruntime")
    assert isinstance(backend, OnnxRuntimeBackend)
    assert cfg.complete_defaults(ModelConfig(platform="onnxruntime_onnx"), "m").default_model_filename == "model.onnx"


def test_auto_complete_fills_io_batch_and_dynamic_batching(tmp_path):
    folder = write_onnx_model(tmp_path, "add_sub", add_sub_graph)
    config = prepare(folder)
    assert config.backend == "onnxruntime" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 4  # Triton's default-max-batch-size
    assert config.dynamic_batching is not None and config.dynamic_batching.preferred_batch_size == [4]
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", DataType.TYPE_FP32, [4]), ("INPUT1", DataType.TYPE_FP32, [4])]
    assert [o.name for o in config.output] == ["OUTPUT0", "OUTPUT1"]
    # --backend-config=default-max-batch-size
    assert prepare(folder, backend_config={"default-max-batch-size": "16"}).max_batch_size == 16
    one = prepare(folder, backend_config={"default-max-batch-size": "1"})
    assert one.max_batch_size == 1 and one.dynamic_batching is None
    # a config that lists inputs and outputs is not touched
    given = prepare(folder, 'max_batch_size: 0 input [{name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 4]}, '
                            '{name: "INPUT1" data_type: TYPE_FP32 dims: [-1, 4]}] '
                            'output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1, 4]}]')
    assert given.max_batch_size == 0 and given.dynamic_batching is None and len(given.output) == 1


def test_auto_complete_fixed_shapes_and_scalar(tmp_path):
    folder = write_onnx_model(tmp_path, "fixed", add_sub_graph, dims=[2, 3])
    config = prepare(folder)
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [2, 3]
    with pytest.raises(TritonError, match="does not support batching while non-zero max_batch_size"):
        prepare(folder, "max_batch_size: 8")
    scalar = write_onnx_model(tmp_path, "scalar", identity_graph, elem=TensorProto.FLOAT, dims=[])
    config = prepare(scalar)
    assert list(config.input[0].dims) == [1] and config.input[0].reshape is None


def test_batching_merges_requests_and_splits_outputs(tmp_path):
    folder = write_onnx_model(tmp_path, "add_sub", add_sub_graph)
    config = prepare(folder)
    instance = get_backend("onnxruntime").load_instance(context(folder, config))
    rng = np.random.default_rng(1)
    reqs, expected = [], []
    for n in (1, 3, 2):
        a, b = rng.random((n, 4), dtype=np.float32), rng.random((n, 4), dtype=np.float32)
        reqs.append(request("add_sub", INPUT0=a, INPUT1=b))
        expected.append((a + b, a - b))
    reqs[1].outputs = [RequestedOutput("OUTPUT1")]
    responses = instance.execute(reqs)
    assert len(responses) == 3 and all(r.error is None for r in responses)
    np.testing.assert_allclose(responses[0].output("OUTPUT0").data, expected[0][0], rtol=1e-6)
    assert [t.name for t in responses[1].outputs] == ["OUTPUT1"]
    np.testing.assert_allclose(responses[1].output("OUTPUT1").data, expected[1][1], rtol=1e-6)
    assert responses[2].output("OUTPUT1").shape == (2, 4)
    instance.finalize()


def test_string_graph_bytes_tensors(tmp_path):
    folder = write_onnx_model(tmp_path, "strings", identity_graph, elem=TensorProto.STRING)
    config = prepare(folder)
    assert config.input[0].data_type == DataType.TYPE_STRING and list(config.input[0].dims) == [-1]
    instance = get_backend("onnxruntime").load_instance(context(folder, config))
    x = np.array([["héllo".encode(), b"\x00bin"], [b"", b"z"]], dtype=object)
    (resp,) = instance.execute([request("strings", X=x)])
    out = resp.output("Y")
    assert out.datatype == "BYTES" and out.data.tolist() == x.tolist()


@pytest.mark.parametrize("elem,datatype", [(TensorProto.FLOAT16, "FP16"), (TensorProto.BFLOAT16, "BF16"),
                                           (TensorProto.INT64, "INT64"), (TensorProto.BOOL, "BOOL")])
def test_datatypes_round_trip(tmp_path, elem, datatype):
    folder = write_onnx_model(tmp_path, "ident", identity_graph, elem=elem)
    config = prepare(folder)
    assert cfg.api_datatype(config.input[0].data_type) == datatype
    instance = get_backend("onnxruntime").load_instance(context(folder, config))
    if datatype == "BF16":
        x = datatypes.float32_to_bf16(np.array([[1.5, -2.0, 3.25]], np.float32))
        t = Tensor("X", "BF16", x.shape, x)
    else:
        x = (np.arange(6).reshape(2, 3) % 2).astype(datatypes.numpy_dtype(datatype))
        t = Tensor.from_numpy("X", x)
    (resp,) = instance.execute([InferenceRequest("ident", [t])])
    assert resp.error is None, resp.error
    assert resp.output("Y").datatype == datatype and resp.output("Y").data.tolist() == x.tolist()


def test_config_checked_against_graph(tmp_path):
    folder = write_onnx_model(tmp_path, "add_sub", add_sub_graph)
    backend = get_backend("onnxruntime")
    base = ('max_batch_size: 4 input [{name: "INPUT0" data_type: TYPE_FP32 dims: [4]}, '
            '{name: "INPUT1" data_type: TYPE_FP32 dims: [4]}] ')
    cases = [
        (base + 'output [{name: "NOPE" data_type: TYPE_FP32 dims: [4]}]', "unexpected inference output 'NOPE'"),
        (base + 'output [{name: "OUTPUT0" data_type: TYPE_INT32 dims: [4]}]',
         "configuration expects datatype TYPE_INT32 for output 'OUTPUT0', model provides TYPE_FP32"),
        (base + 'output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [4, 1]}]', "the model expects 2 dimensions"),
        ('max_batch_size: 4 input [{name: "INPUT0" data_type: TYPE_FP32 dims: [4]}] '
         'output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [4]}]', "missing ['INPUT1']"),
    ]
    for pbtxt, fragment in cases:
        config = prepare(folder, pbtxt)
        with pytest.raises(TritonError) as e:
            backend.load_instance(context(folder, config))
        assert e.value.code == Code.INVALID_ARG and fragment in e.value.message


def test_bad_input_shape_fails_only_that_group(tmp_path):
    folder = write_onnx_model(tmp_path, "m", add_sub_graph, dims=["N", "D"])
    config = prepare(folder)
    assert list(config.input[0].dims) == [-1]
    instance = get_backend("onnxruntime").load_instance(context(folder, config))
    good = request("m", INPUT0=np.ones((1, 3), np.float32), INPUT1=np.ones((1, 3), np.float32))
    bad = request("m", INPUT0=np.ones((1, 3), np.float32), INPUT1=np.ones((1, 5), np.float32))  # Add cannot broadcast
    r_good, r_bad = instance.execute([good, bad])
    assert r_good.error is None and r_good.output("OUTPUT0").data.tolist() == [[2, 2, 2]]
    assert r_bad.error is not None and "onnxruntime" in r_bad.error.message


def test_session_options_from_parameters(tmp_path):
    import onnxruntime as ort

    from trident.backends.onnxruntime_backend import session_options

    config = parse_pbtxt('name: "m" optimization { graph { level: 2 } } '
                         'parameters [{key: "intra_op_thread_count" value {string_value: "3"}}, '
                         '{key: "inter_op_thread_count" value {string_value: "2"}}, '
                         '{key: "execution_mode" value {string_value: "1"}}, '
                         '{key: "enable_mem_pattern" value {string_value: "false"}}]')
    so = session_options(ort, config)
    assert so.intra_op_num_threads == 3 and so.inter_op_num_threads == 2
    assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL and so.enable_mem_pattern is False
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    bad = parse_pbtxt('name: "m" parameters [{key: "execution_mode" value {string_value: "7"}}]')
    with pytest.raises(TritonError, match="execution_mode are 0 or 1"):
        session_options(ort, bad)
    with pytest.raises(TritonError) as e:
        session_options(ort, config, {"enable-global-threadpool": "1"})
    assert e.value.code == Code.UNSUPPORTED


def test_gpu_provider_selection_is_per_device():
    gpu_host = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    config = ModelConfig(name="m")
    assert providers(config, "KIND_CPU", 0, gpu_host) == ["CPUExecutionProvider"]
    chosen = providers(config, "KIND_GPU", 1, gpu_host)
    assert chosen[0] == ("CUDAExecutionProvider", {"device_id": "1"}) and chosen[-1] == "CPUExecutionProvider"
    trt = parse_pbtxt('name: "m" optimization { execution_accelerators { gpu_execution_accelerator [ '
                      '{ name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } '
                      'parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }')
    chosen = providers(trt, "KIND_GPU", 2, gpu_host)
    assert chosen[0] == ("TensorrtExecutionProvider", {"device_id": "2", "trt_fp16_enable": "True",
                                                       "trt_max_workspace_size": "1073741824"})
    assert chosen[1][0] == "CUDAExecutionProvider" and chosen[1][1]["device_id"] == "2"
    unknown = parse_pbtxt('name: "m" optimization { execution_accelerators { gpu_execution_accelerator [ '
                          '{ name: "warp" } ] } }')
    with pytest.raises(TritonError, match="unknown Execution Accelerator 'warp'"):
        providers(unknown, "KIND_GPU", 0, gpu_host)


def test_kind_gpu_without_cuda_is_unsupported(tmp_path):
    import onnxruntime as ort

    folder = write_onnx_model(tmp_path, "add_sub", add_sub_graph)
    config = prepare(folder)
    if "CUDAExecutionProvider" in ort.get_available_providers():  # a GPU build: the device check is on the GPU host
        chosen = providers(config, "KIND_GPU", 0, ort.get_available_providers())
        assert chosen[0][0] == "CUDAExecutionProvider"
        return
    with pytest.raises(TritonError) as e:
        get_backend("onnxruntime").load_instance(context(folder, config, "KIND_GPU", 0))
    assert e.value.code == Code.UNSUPPORTED
    assert "CUDAExecutionProvider" in e.value.message and 'trident-inference[onnxruntime-gpu]' in e.value.message


def test_missing_model_file_and_folder_form(tmp_path):
    folder = tmp_path / "dirform"
    add_sub_graph(folder / "1" / "model.onnx" / "model.onnx")  # model.onnx as a folder
    config = prepare(folder)
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    get_backend("onnxruntime").load_instance(context(folder, config)).finalize()
    empty = tmp_path / "empty"
    (empty / "1").mkdir(parents=True)
    config = cfg.complete_defaults(ModelConfig(backend="onnxruntime"), "empty", model_dir=empty)
    with pytest.raises(TritonError) as e:
        get_backend("onnxruntime").auto_complete_config(config, empty, empty / "1")
    assert e.value.code == Code.UNAVAILABLE and "unable to find" in e.value.message


def test_instances_run_in_parallel_threads(tmp_path):
    """Two instances used from two threads at once give correct, independent results."""
    folder = write_onnx_model(tmp_path, "mlp", mlp_graph)
    config = prepare(folder)
    backend = get_backend("onnxruntime")
    instances = [backend.load_instance(context(folder, config)) for _ in range(2)]
    x = np.random.default_rng(3).random((4, 64), dtype=np.float32)
    results: list = [None, None]

    def work(i: int) -> None:
        for _ in range(20):
            (resp,) = instances[i].execute([request("mlp", x=x)])
        results[i] = resp.output("logits").data

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_allclose(r, mlp_reference(x), rtol=1e-4, atol=1e-5)


def test_autocomplete_and_check_io_are_pure():
    ins = [IOSpec("a", "TYPE_FP32", [-1, 3]), IOSpec("w", "TYPE_FP32", [3], optional=True)]
    outs = [IOSpec("y", "", [-1, 3], framework_type="tensor(complex64)")]
    with pytest.raises(TritonError, match=r"tensor\(complex64\) has no Triton data type"):
        autocomplete(ModelConfig(name="m"), ins, outs, 4)
    config = autocomplete(ModelConfig(name="m"), ins[:1], [IOSpec("y", "TYPE_INT64", [-1])], 8)
    assert config.max_batch_size == 8 and list(config.output[0].dims) == [1]
    assert config.output[0].reshape is not None and list(config.output[0].reshape.shape) == []
    check_io(config, ins, [IOSpec("y", "TYPE_INT64", [-1])])  # the optional model input may be left out


def rss_mb() -> float:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def big_graph(path: Path, width: int = 3072) -> Path:
    """x[N,width] @ W[width,width]: 36 MB of FP32 weights at the default width."""
    w = numpy_helper.from_array(np.full((width, width), 0.5, np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], [w])
    return _save(graph, path)


def test_finalize_releases_memory(tmp_path):
    import gc

    folder = write_onnx_model(tmp_path, "big", big_graph)
    config = prepare(folder)
    backend = get_backend("onnxruntime")
    backend.load_instance(context(folder, config)).finalize()  # warm-up: allocator pools, imports
    gc.collect()
    before = rss_mb()
    instance = backend.load_instance(context(folder, config))
    loaded = rss_mb()
    instance.finalize()  # the object may outlive its unload: finalize alone must let go of the model
    gc.collect()
    after = rss_mb()
    assert loaded - before > 27  # the 36 MB of weights are resident
    assert loaded - after > 0.75 * (loaded - before), (before, loaded, after)


def initializer_input_graph(path: Path) -> Path:
    """y = x * scale, where 'scale' is a graph input with a default (an overridable initializer)."""
    scale = numpy_helper.from_array(np.array([2.0], np.float32), "scale")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "scaled",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2]),
                               helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], [scale])
    return _save(graph, path)


def test_overridable_initializer_is_an_optional_input(tmp_path):
    folder = write_onnx_model(tmp_path, "scaled", initializer_input_graph)
    auto = prepare(folder)
    assert [i.name for i in auto.input] == ["x"] and auto.max_batch_size == 4
    config = prepare(folder, 'max_batch_size: 0 input [{name: "x" data_type: TYPE_FP32 dims: [-1, 2]}, '
                             '{name: "scale" data_type: TYPE_FP32 dims: [1] optional: true}] '
                             'output [{name: "y" data_type: TYPE_FP32 dims: [-1, 2]}]')
    instance = get_backend("onnxruntime").load_instance(context(folder, config))
    x = np.ones((1, 2), np.float32)
    default, override = instance.execute([request("scaled", x=x), request("scaled", x=x, scale=np.array([5.0], np.float32))])
    assert default.output("y").data.tolist() == [[2.0, 2.0]] and override.output("y").data.tolist() == [[5.0, 5.0]]
