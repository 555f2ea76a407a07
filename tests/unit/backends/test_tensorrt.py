"""The TensorRT backend on a host without CUDA or TensorRT (this CI).

The engine inspection, auto-complete and config checks run against a stand-in engine object
with TensorRT 10's inspection methods (num_io_tensors, get_tensor_name/mode/dtype/shape,
get_tensor_profile_shape), because the real tensorrt package cannot be imported here. Loading
and executing a real plan needs a GPU host: there, the error-path tests below check the
GPU branch instead.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

from trident import config as cfg
from trident.backends import get_backend
from trident.backends.base import LoadContext
from trident.backends.tensorrt_backend import (
    EngineTensor,
    autocomplete_engine,
    check_engine,
    engine_io,
    profile_max_batch,
)
from trident.errors import Code, TritonError
from trident.protocol.generated.inference import DataType, ModelConfig
from trident.protocol.pbtxt import parse_pbtxt

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


@dataclass
class _DType:
    name: str


class FakeEngine:
    """Two inputs [-1, 8] FP32 (profile max batch 16) and one output [-1, 4] FP16."""

    INPUT, OUTPUT = "INPUT", "OUTPUT"
    tensors = [("x", INPUT, "FLOAT", [-1, 8]), ("mask", INPUT, "BOOL", [-1, 8]), ("y", OUTPUT, "HALF", [-1, 4])]
    num_optimization_profiles = 1

    @property
    def num_io_tensors(self) -> int:
        return len(self.tensors)

    def get_tensor_name(self, i: int) -> str:
        return self.tensors[i][0]

    def _get(self, name: str) -> tuple:
        return next(t for t in self.tensors if t[0] == name)

    def get_tensor_mode(self, name: str) -> str:
        return self._get(name)[1]

    def get_tensor_dtype(self, name: str) -> _DType:
        return _DType(self._get(name)[2])

    def get_tensor_shape(self, name: str) -> list[int]:
        return list(self._get(name)[3])

    def get_tensor_profile_shape(self, name: str, profile: int) -> tuple[list[int], list[int], list[int]]:
        assert profile == 0
        return [1, 8], [8, 8], [16, 8]


def tensors() -> list[EngineTensor]:
    return engine_io(FakeEngine(), FakeEngine.INPUT)


def test_engine_io_description():
    ts = tensors()
    assert [(t.name, t.is_input, t.data_type, t.shape) for t in ts] == [
        ("x", True, "TYPE_FP32", [-1, 8]), ("mask", True, "TYPE_BOOL", [-1, 8]), ("y", False, "TYPE_FP16", [-1, 4])]
    assert ts[0].max_shape == [16, 8] and ts[2].max_shape is None
    assert profile_max_batch(ts) == 16


def test_autocomplete_from_engine():
    config = autocomplete_engine(ModelConfig(name="plan"), tensors(), default_batch=4)
    assert config.max_batch_size == 16 and config.dynamic_batching is not None  # the profile's max batch
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("x", DataType.TYPE_FP32, [8]), ("mask", DataType.TYPE_BOOL, [8])]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("y", DataType.TYPE_FP16, [4])]
    check_engine(cfg.complete_defaults(config, "plan"), tensors())


def test_engine_checked_against_config():
    base = ('name: "plan" max_batch_size: {mbs} input [{{name: "x" data_type: TYPE_FP32 dims: [8]}}, '
            '{{name: "mask" data_type: TYPE_BOOL dims: [8]}}] output [{{name: "y" data_type: {out} dims: [4]}}]')
    check_engine(parse_pbtxt(base.format(mbs=16, out="TYPE_FP16")), tensors())
    with pytest.raises(TritonError, match="configuration specified max-batch 32 but TensorRT engine only supports "
                                          "max-batch 16"):
        check_engine(parse_pbtxt(base.format(mbs=32, out="TYPE_FP16")), tensors())
    with pytest.raises(TritonError, match="expects datatype TYPE_FP32 for output 'y', model provides TYPE_FP16"):
        check_engine(parse_pbtxt(base.format(mbs=8, out="TYPE_FP32")), tensors())
    with pytest.raises(TritonError, match=r"missing \['mask'\]"):
        check_engine(parse_pbtxt('name: "plan" max_batch_size: 8 input [{name: "x" data_type: TYPE_FP32 dims: [8]}] '
                                 'output [{name: "y" data_type: TYPE_FP16 dims: [4]}]'), tensors())


def _plan_repo(tmp_path: Path) -> Path:
    folder = tmp_path / "plan"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.plan").write_bytes(b"not an engine")
    return folder


def test_kind_cpu_instances_are_refused(tmp_path):
    folder = _plan_repo(tmp_path)
    config = cfg.complete_defaults(ModelConfig(), "plan", model_dir=folder)
    assert config.backend == "tensorrt" and config.platform == "tensorrt_plan"
    ctx = LoadContext("plan", 1, folder, folder / "1", config, cfg.config_to_json(config), "plan_0", "KIND_CPU", 0)
    with pytest.raises(TritonError) as e:
        get_backend("tensorrt").load_instance(ctx)
    assert e.value.code == Code.UNSUPPORTED and "KIND_GPU instances only" in e.value.message


def test_without_tensorrt_or_cuda_load_and_autocomplete_are_unsupported(tmp_path):
    folder = _plan_repo(tmp_path)
    config = cfg.complete_defaults(ModelConfig(), "plan", model_dir=folder)
    backend = get_backend("tensorrt")
    ctx = LoadContext("plan", 1, folder, folder / "1", config, cfg.config_to_json(config), "plan_0", "KIND_GPU", 0)
    for attempt in (lambda: backend.auto_complete_config(config, folder, folder / "1"),
                    lambda: backend.load_instance(ctx)):
        with pytest.raises(TritonError) as e:
            attempt()
        if HAS_TENSORRT:  # a GPU host: no CUDA device, or the bytes are not an engine
            assert e.value.code in (Code.UNSUPPORTED, Code.INVALID_ARG)
        else:
            assert e.value.code == Code.UNSUPPORTED and 'pip install "trident-inference[tensorrt]"' in e.value.message
