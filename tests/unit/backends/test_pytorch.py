"""The PyTorch backend with TorchScript and torch.export modules made at test time, no server.

The model builders here are shared with tests/e2e/test_backends_pytorch.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trident import config as cfg
from trident.backends import get_backend
from trident.backends._common import require
from trident.backends.base import LoadContext
from trident.backends.pytorch_backend import PyTorchBackend, device_for, input_positions, output_positions
from trident.config_validation import validate_config
from trident.errors import Code, TritonError
from trident.protocol import datatypes
from trident.protocol.generated.inference import DataType, ModelConfig
from trident.protocol.pbtxt import parse_pbtxt
from trident.types import InferenceRequest, RequestedOutput, Tensor

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

# ---------------------------------------------------------------- model builders


class AddSub(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x - y


class DictOut(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": x + y, "prod": x * y}


class DictIn(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"] - inputs["b"]


class Upper(torch.nn.Module):
    def forward(self, words: list[str]) -> list[str]:
        return [w.upper() for w in words]


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


ADD_SUB_CONFIG = '''
backend: "pytorch"
max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: {t} dims: [ 4 ] }}, {{ name: "INPUT__1" data_type: {t} dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: {t} dims: [ 4 ] }}, {{ name: "OUTPUT__1" data_type: {t} dims: [ 4 ] }} ]
dynamic_batching {{ }}
'''


def write_torchscript(repo: Path, name: str, module: torch.nn.Module, config: str, version: int = 1) -> Path:
    folder = repo / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    torch.jit.script(module).save(str(folder / str(version) / "model.pt"))
    (folder / "config.pbtxt").write_text(config)
    return folder


def write_exported(repo: Path, name: str, config: str = "", version: int = 1) -> Path:
    """AddSub exported with a dynamic batch dimension, saved as model.pt2."""
    folder = repo / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(AddSub(), (torch.ones(2, 4), torch.ones(2, 4)),
                                  dynamic_shapes={"x": {0: batch}, "y": {0: batch}})
    torch.export.save(program, str(folder / str(version) / "model.pt2"))
    (folder / "config.pbtxt").write_text(config or 'backend: "pytorch"\n')
    return folder


# ---------------------------------------------------------------- helpers


def prepare(model_dir: Path) -> ModelConfig:
    config = cfg.complete_defaults(parse_pbtxt((model_dir / "config.pbtxt").read_text()), model_dir.name,
                                   model_dir=model_dir)
    config = PyTorchBackend().auto_complete_config(config, model_dir, model_dir / "1")
    config = cfg.complete_defaults(config, model_dir.name)
    validate_config(config, model_dir.name, model_dir)
    return config


def load(model_dir: Path, kind: str = "KIND_CPU", device: int = 0):
    config = prepare(model_dir)
    ctx = LoadContext(model_dir.name, 1, model_dir, model_dir / "1", config, cfg.config_to_json(config),
                      f"{model_dir.name}_0", kind, device)
    return get_backend("pytorch").load_instance(ctx)


def request(model: str, **inputs: np.ndarray) -> InferenceRequest:
    return InferenceRequest(model, [Tensor.from_numpy(k, v) for k, v in inputs.items()])


# ---------------------------------------------------------------- tests


def test_indexed_names_tuple_outputs_and_batching(tmp_path):
    folder = write_torchscript(tmp_path, "add_sub", AddSub(), ADD_SUB_CONFIG.format(t="TYPE_FP32"))
    instance = load(folder)
    rng = np.random.default_rng(0)
    pairs = [(rng.random((n, 4), dtype=np.float32), rng.random((n, 4), dtype=np.float32)) for n in (2, 1, 3)]
    reqs = [request("add_sub", INPUT__0=a, INPUT__1=b) for a, b in pairs]
    reqs[2].outputs = [RequestedOutput("OUTPUT__1")]
    responses = instance.execute(reqs)
    for (a, b), resp in zip(pairs, responses, strict=True):
        assert resp.error is None, resp.error
        np.testing.assert_allclose(resp.output("OUTPUT__1").data, a - b, rtol=1e-6)
    np.testing.assert_allclose(responses[0].output("OUTPUT__0").data, pairs[0][0] + pairs[0][1], rtol=1e-6)
    assert [t.name for t in responses[2].outputs] == ["OUTPUT__1"]
    instance.finalize()


def test_forward_argument_names_and_dict_outputs(tmp_path):
    config = '''backend: "pytorch" max_batch_size: 0
input [ { name: "y" data_type: TYPE_INT64 dims: [ 3 ] }, { name: "x" data_type: TYPE_INT64 dims: [ 3 ] } ]
output [ { name: "prod" data_type: TYPE_INT64 dims: [ 3 ] }, { name: "sum" data_type: TYPE_INT64 dims: [ 3 ] } ]'''
    instance = load(write_torchscript(tmp_path, "dict_out", DictOut(), config))
    x, y = np.array([1, 2, 3]), np.array([10, 20, 30])
    (resp,) = instance.execute([request("dict_out", y=y, x=x)])
    assert resp.output("sum").data.tolist() == [11, 22, 33] and resp.output("prod").data.tolist() == [10, 40, 90]


def test_dict_input_and_config_order(tmp_path):
    config = '''backend: "pytorch" max_batch_size: 4
input [ { name: "a" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "b" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "diff" data_type: TYPE_FP32 dims: [ 2 ] } ]'''
    instance = load(write_torchscript(tmp_path, "dict_in", DictIn(), config))
    (resp,) = instance.execute([request("dict_in", a=np.ones((1, 2), np.float32), b=np.full((1, 2), 3, np.float32))])
    assert resp.output("diff").data.tolist() == [[-2.0, -2.0]]


def test_string_lists(tmp_path):
    config = '''backend: "pytorch" max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]'''
    instance = load(write_torchscript(tmp_path, "upper", Upper(), config))
    words = np.array([b"abc", "héllo".encode()], dtype=object)
    (resp,) = instance.execute([request("upper", INPUT__0=words)])
    assert resp.output("OUTPUT__0").datatype == "BYTES"
    assert resp.output("OUTPUT__0").data.tolist() == [b"ABC", "HéLLO".encode()]  # TorchScript upper() is ASCII


@pytest.mark.parametrize("ctype,datatype", [("TYPE_FP16", "FP16"), ("TYPE_BF16", "BF16"), ("TYPE_FP64", "FP64")])
def test_half_precision(tmp_path, ctype, datatype):
    config = f'''backend: "pytorch" max_batch_size: 4
input [ {{ name: "INPUT__0" data_type: {ctype} dims: [ 3 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: {ctype} dims: [ 3 ] }} ]'''
    instance = load(write_torchscript(tmp_path, "double", Double(), config))
    values = np.array([[1.5, -2.0, 0.25]], np.float32)
    if datatype == "BF16":
        x = Tensor("INPUT__0", "BF16", (1, 3), datatypes.float32_to_bf16(values))
    else:
        x = Tensor.from_numpy("INPUT__0", values.astype(datatypes.numpy_dtype(datatype)))
    (resp,) = instance.execute([InferenceRequest("double", [x])])
    out = resp.output("OUTPUT__0")
    assert out.datatype == datatype
    got = datatypes.bf16_to_float32(out.data) if datatype == "BF16" else out.data.astype(np.float32)
    assert got.tolist() == (values * 2).tolist()


def test_wrong_output_dtype_is_an_error_response(tmp_path):
    instance = load(write_torchscript(tmp_path, "add_sub", AddSub(), ADD_SUB_CONFIG.format(t="TYPE_INT32")))
    a = np.ones((1, 4), np.float32)  # the config says INT32 but float tensors flow through
    (resp,) = instance.execute([InferenceRequest("add_sub", [Tensor("INPUT__0", "INT32", (1, 4), a),
                                                             Tensor("INPUT__1", "INT32", (1, 4), a)])])
    assert resp.error is not None and resp.error.code == Code.INTERNAL and "data type float32" in resp.error.message


def test_exported_program_auto_completes_and_runs(tmp_path):
    folder = write_exported(tmp_path, "exported")
    config = prepare(folder)
    assert config.max_batch_size == 4 and config.dynamic_batching is not None
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("x", DataType.TYPE_FP32, [4]), ("y", DataType.TYPE_FP32, [4])]
    assert [o.name for o in config.output] == ["OUTPUT__0", "OUTPUT__1"]
    instance = load(folder)
    a, b = np.ones((3, 4), np.float32), np.full((3, 4), 2, np.float32)
    (resp,) = instance.execute([request("exported", x=a, y=b)])
    assert resp.output("OUTPUT__0").data.tolist() == (a + b).tolist()


def test_naming_conventions():
    config = parse_pbtxt('input [{name: "b"}, {name: "a"}] output [{name: "out__1"}, {name: "out__0"}]')
    assert input_positions(config, ["a", "b"]) == {"b": 1, "a": 0}
    assert output_positions(config) == {"out__1": 1, "out__0": 0}
    config = parse_pbtxt('input [{name: "IN__1"}, {name: "IN__0"}] output [{name: "z"}, {name: "w"}]')
    assert input_positions(config, ["x", "y"]) == {"IN__1": 1, "IN__0": 0}
    assert output_positions(config) == {"z": 0, "w": 1}
    config = parse_pbtxt('input [{name: "p"}, {name: "q__0"}]')
    assert input_positions(config, ["x", "y"]) == {"p": 0, "q__0": 1}


def test_device_selection_and_kind_gpu_without_cuda(tmp_path):
    assert device_for(torch, "KIND_CPU", 3, "m") == "cpu"
    if torch.cuda.is_available():
        assert device_for(torch, "KIND_GPU", 0, "m") == "cuda:0"
        return
    with pytest.raises(TritonError) as e:
        device_for(torch, "KIND_GPU", 0, "m")
    assert e.value.code == Code.UNSUPPORTED and "torch.cuda.is_available() is False" in e.value.message
    folder = write_torchscript(tmp_path, "add_sub", AddSub(), ADD_SUB_CONFIG.format(t="TYPE_FP32"))
    with pytest.raises(TritonError) as e:
        load(folder, "KIND_GPU", 0)
    assert e.value.code == Code.UNSUPPORTED


def test_weight_sharing_and_missing_file(tmp_path):
    config = ADD_SUB_CONFIG.format(t="TYPE_FP32") + 'parameters { key: "ENABLE_WEIGHT_SHARING" value { string_value: "true" } }'
    folder = write_torchscript(tmp_path, "shared", AddSub(), config)
    first, second = load(folder), load(folder)
    assert first.module is second.module
    first.finalize()
    second.finalize()
    (folder / "1" / "model.pt").unlink()
    with pytest.raises(TritonError) as e:
        load(folder)
    assert e.value.code == Code.UNAVAILABLE and "unable to find" in e.value.message


def test_missing_framework_names_the_extra():
    with pytest.raises(TritonError) as e:
        require("torch_that_is_not_installed", "pytorch", "pytorch")
    assert e.value.code == Code.UNSUPPORTED and 'pip install "trident-inference[pytorch]"' in e.value.message
