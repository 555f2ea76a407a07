"""The OpenVINO backend reading ONNX graphs (built with onnx.helper) and IR it converts, no server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto
from unit.backends.test_onnxruntime import add_sub_graph, identity_graph, mlp_graph, mlp_reference

from trident import config as cfg
from trident.backends import get_backend
from trident.backends.base import LoadContext
from trident.backends.openvino_backend import OpenVINOBackend, compile_properties
from trident.config_validation import validate_config
from trident.errors import Code, TritonError
from trident.protocol import datatypes
from trident.protocol.generated.inference import DataType, ModelConfig
from trident.protocol.pbtxt import parse_pbtxt
from trident.types import InferenceRequest, Tensor

ONNX_CONFIG = 'backend: "openvino"\ndefault_model_filename: "model.onnx"\n'


def write_ov_model(repo: Path, name: str, build, config: str = ONNX_CONFIG, *, ir: bool = False, **kw) -> Path:
    """An ONNX graph in <repo>/<name>/1/model.onnx, or converted to IR (model.xml + model.bin)."""
    folder = repo / name
    onnx_path = build(folder / "1" / "model.onnx", **kw)
    if ir:
        import openvino as ov

        ov.save_model(ov.Core().read_model(str(onnx_path)), str(folder / "1" / "model.xml"), compress_to_fp16=False)
        onnx_path.unlink()
        config = config.replace('default_model_filename: "model.onnx"\n', "")
    (folder / "config.pbtxt").write_text(config)
    return folder


def prepare(model_dir: Path, backend_config: dict[str, str] | None = None) -> ModelConfig:
    config = parse_pbtxt((model_dir / "config.pbtxt").read_text())
    config = cfg.complete_defaults(config, model_dir.name, model_dir=model_dir)
    config = OpenVINOBackend().auto_complete_config(config, model_dir, model_dir / "1", backend_config)
    config = cfg.complete_defaults(config, model_dir.name)
    validate_config(config, model_dir.name, model_dir)
    return config


def load(model_dir: Path, kind: str = "KIND_CPU"):
    config = prepare(model_dir)
    ctx = LoadContext(model_dir.name, 1, model_dir, model_dir / "1", config, cfg.config_to_json(config),
                      f"{model_dir.name}_0", kind, 0)
    return get_backend("openvino").load_instance(ctx)


def test_ir_auto_complete_and_batched_execution(tmp_path):
    folder = write_ov_model(tmp_path, "mlp_ir", mlp_graph, 'backend: "openvino"\n', ir=True)
    assert (folder / "1" / "model.bin").is_file()
    config = prepare(folder)
    assert config.backend == "openvino" and config.default_model_filename == "model.xml"
    assert config.max_batch_size == 4 and config.dynamic_batching is not None
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("x", DataType.TYPE_FP32, [64])]
    instance = load(folder)
    rng = np.random.default_rng(0)
    xs = [rng.random((n, 64), dtype=np.float32) for n in (1, 3)]
    responses = instance.execute([InferenceRequest("mlp_ir", [Tensor.from_numpy("x", x)]) for x in xs])
    for x, resp in zip(xs, responses, strict=True):
        assert resp.error is None, resp.error
        np.testing.assert_allclose(resp.output("logits").data, mlp_reference(x), rtol=1e-4, atol=1e-4)
    instance.finalize()


def test_onnx_through_openvino_and_partial_config(tmp_path):
    config = ONNX_CONFIG + 'max_batch_size: 8\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
    folder = write_ov_model(tmp_path, "add_sub", add_sub_graph, config)
    completed = prepare(folder)  # the missing tensors are added, the given one kept
    assert [i.name for i in completed.input] == ["INPUT0", "INPUT1"]
    assert [o.name for o in completed.output] == ["OUTPUT0", "OUTPUT1"] and completed.max_batch_size == 8
    instance = load(folder)
    a, b = np.ones((2, 4), np.float32), np.full((2, 4), 3, np.float32)
    (resp,) = instance.execute([InferenceRequest("add_sub", [Tensor.from_numpy("INPUT0", a),
                                                             Tensor.from_numpy("INPUT1", b)])])
    assert resp.output("OUTPUT0").data.tolist() == (a + b).tolist()
    assert resp.output("OUTPUT1").data.tolist() == (a - b).tolist()


def test_static_batch_made_dynamic_and_batch_padding(tmp_path):
    folder = write_ov_model(tmp_path, "fixed", identity_graph, ONNX_CONFIG + 'max_batch_size: 4\n'
                            'input [{ name: "X" data_type: TYPE_FP32 dims: [3] }]\n'
                            'output [{ name: "Y" data_type: TYPE_FP32 dims: [3] }]\n',
                            elem=TensorProto.FLOAT, dims=[1, 3])
    instance = load(folder)  # the model's batch of 1 becomes dynamic
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    (resp,) = instance.execute([InferenceRequest("fixed", [Tensor.from_numpy("X", x)])])
    assert resp.output("Y").data.tolist() == x.tolist()
    padded = folder / "config.pbtxt"
    padded.write_text(padded.read_text() + 'parameters [{ key: "SKIP_OV_DYNAMIC_BATCHSIZE" value { string_value: "YES" } },'
                      '{ key: "ENABLE_BATCH_PADDING" value { string_value: "YES" } }]\n')
    instance = load(folder)
    (resp,) = instance.execute([InferenceRequest("fixed", [Tensor.from_numpy("X", x[:2])])])
    assert resp.output("Y").data.tolist() == x[:2].tolist()


def test_bf16_and_fp16(tmp_path):
    for elem, datatype in ((TensorProto.BFLOAT16, "BF16"), (TensorProto.FLOAT16, "FP16")):
        folder = write_ov_model(tmp_path, f"ident_{datatype}", identity_graph, elem=elem, dims=["N", 3])
        instance = load(folder)
        values = np.array([[1.5, -2.0, 0.25]], np.float32)
        data = datatypes.float32_to_bf16(values) if datatype == "BF16" else values.astype(np.float16)
        (resp,) = instance.execute([InferenceRequest("m", [Tensor("X", datatype, (1, 3), data)])])
        assert resp.error is None, resp.error
        assert resp.output("Y").datatype == datatype and resp.output("Y").data.tolist() == data.tolist()


def test_throughput_hint_and_streams_shared_by_instances(tmp_path):
    config = ONNX_CONFIG + ('parameters [{ key: "PERFORMANCE_HINT" value { string_value: "THROUGHPUT" } },'
                            '{ key: "NUM_STREAMS" value { string_value: "2" } },'
                            '{ key: "INFERENCE_NUM_THREADS" value { string_value: "2" } }]\n')
    folder = write_ov_model(tmp_path, "mlp", mlp_graph, config)
    assert compile_properties(prepare(folder)) == {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": "2",
                                                   "INFERENCE_NUM_THREADS": "2", "INFERENCE_PRECISION_HINT": "f32"}
    first, second = load(folder), load(folder)
    assert first.compiled is second.compiled and first.request is not second.request
    assert int(first.compiled.get_property("NUM_STREAMS")) == 2
    assert str(first.compiled.get_property("PERFORMANCE_HINT")).endswith("THROUGHPUT")
    first.finalize()
    second.finalize()


def test_unsupported_and_bad_configs(tmp_path):
    folder = write_ov_model(tmp_path, "add_sub", add_sub_graph)
    with pytest.raises(TritonError) as e:
        load(folder, "KIND_GPU")
    assert e.value.code == Code.UNSUPPORTED and "CPU only" in e.value.message
    strings = write_ov_model(tmp_path, "strings", identity_graph, elem=TensorProto.STRING)
    with pytest.raises(TritonError) as e:
        load(strings)
    assert e.value.code == Code.UNSUPPORTED and "BYTES" in e.value.message
    bad = write_ov_model(tmp_path, "bad", add_sub_graph, ONNX_CONFIG + 'max_batch_size: 4\n'
                         'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [4] }]\n')
    with pytest.raises(TritonError, match="configuration expects datatype TYPE_INT32 for input 'INPUT0'"):
        load(bad)
    missing = tmp_path / "missing"
    (missing / "1").mkdir(parents=True)
    (missing / "config.pbtxt").write_text('backend: "openvino"\n')
    with pytest.raises(TritonError) as e:
        prepare(missing)
    assert e.value.code == Code.UNAVAILABLE


def test_finalize_releases_the_compiled_model(tmp_path):
    import gc

    from unit.backends.test_onnxruntime import big_graph, rss_mb

    folder = write_ov_model(tmp_path, "big", big_graph, 'backend: "openvino"\n', ir=True)
    load(folder).finalize()  # warm-up
    gc.collect()
    before = rss_mb()
    instance = load(folder)
    loaded = rss_mb()
    instance.finalize()  # the object may outlive its unload: finalize alone must let go of the model
    gc.collect()
    after = rss_mb()
    assert loaded - before > 27  # 36 MB of weights
    assert loaded - after > 0.75 * (loaded - before), (before, loaded, after)
