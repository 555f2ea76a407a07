"""The Python backend, driven directly (no server): real model.py files written to tmp_path."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from trident import config as model_config
from trident.backends import get_backend
from trident.backends.base import LoadContext
from trident.backends.python import pb_utils
from trident.backends.python.backend import PythonBackend, PythonInstance
from trident.errors import Code, TritonError
from trident.protocol.generated.inference import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelParameter,
    ModelSequenceBatching,
    ModelTransactionPolicy,
)
from trident.types import InferenceRequest, RequestedOutput, Tensor

ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", a + b),
                pb_utils.Tensor("OUTPUT1", a - b),
            ]))
        return responses
"""


def _config(name: str, *, max_batch_size: int = 0, dims: tuple[int, ...] = (4,), **kw: object) -> ModelConfig:
    return ModelConfig(
        name=name,
        backend="python",
        max_batch_size=max_batch_size,
        input=[
            ModelInput(name=n, data_type=DataType.TYPE_FP32, dims=list(dims)) for n in ("INPUT0", "INPUT1")
        ],
        output=[
            ModelOutput(name=n, data_type=DataType.TYPE_FP32, dims=list(dims)) for n in ("OUTPUT0", "OUTPUT1")
        ],
        **kw,  # type: ignore[arg-type]
    )


def _write(root: Path, name: str, code: str, version: int = 1, extra: dict[str, str] | None = None) -> Path:
    version_dir = root / name / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.py").write_text(textwrap.dedent(code))
    for fname, text in (extra or {}).items():
        (version_dir / fname).write_text(textwrap.dedent(text))
    return root / name


def _ctx(
    model_dir: Path, config: ModelConfig, version: int = 1, instance: str = "", kind: str = "KIND_CPU"
) -> LoadContext:
    return LoadContext(
        model_name=model_dir.name,
        version=version,
        model_dir=model_dir,
        version_dir=model_dir / str(version),
        config=config,
        config_json=model_config.config_to_json(config),
        instance_name=instance or f"{model_dir.name}_0",
        instance_kind=kind,
        device_id=0,
    )


def _load(
    tmp_path: Path, name: str, code: str, config: ModelConfig | None = None, **kw: object
) -> PythonInstance:
    model_dir = _write(tmp_path, name, code, extra=kw.pop("extra", None))  # type: ignore[arg-type]
    return PythonBackend().load_instance(_ctx(model_dir, config or _config(name), **kw))  # type: ignore[arg-type]


def _request(
    model: str,
    rid: str = "",
    params: dict | None = None,
    outputs: list[str] | None = None,
    **inputs: np.ndarray,
) -> InferenceRequest:
    return InferenceRequest(
        model_name=model,
        inputs=[Tensor.from_numpy(k, v) for k, v in inputs.items()],
        id=rid,
        parameters=params or {},
        outputs=[RequestedOutput(n) for n in outputs or []],
    )


def test_registry_resolves_python_backend() -> None:
    backend = get_backend("python")
    assert isinstance(backend, PythonBackend)
    assert backend.default_model_filename == "model.py"


def test_initialize_args(tmp_path: Path) -> None:
    inst = _load(tmp_path, "add_sub", ADD_SUB, instance="add_sub_0_1", kind="KIND_GPU")
    try:
        args = inst._model.args
        assert set(args) == {
            "model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
            "model_repository", "model_version", "model_name",
        }  # fmt: skip
        assert all(isinstance(v, str) for v in args.values())
        assert args["model_instance_kind"] == "GPU"
        assert args["model_instance_name"] == "add_sub_0_1"
        assert args["model_instance_device_id"] == "0"
        assert args["model_repository"] == str(tmp_path / "add_sub")
        assert args["model_version"] == "1"
        assert args["model_name"] == "add_sub"
        cfg = json.loads(args["model_config"])
        assert cfg["name"] == "add_sub"
        assert cfg["input"][0] == {
            "name": "INPUT0", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [4],
            "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False,
            "is_non_linear_format_io": False,
        }  # fmt: skip
        assert cfg["max_batch_size"] == 0
    finally:
        inst.finalize()


def test_execute_batch_of_requests(tmp_path: Path) -> None:
    inst = _load(tmp_path, "add_sub", ADD_SUB)
    try:
        reqs = [
            _request("add_sub", f"r{i}", INPUT0=np.full(4, i, np.float32), INPUT1=np.ones(4, np.float32))
            for i in range(3)
        ]
        responses = inst.execute(reqs)
        assert len(responses) == 3
        for i, resp in enumerate(responses):
            assert resp.error is None
            assert resp.id == f"r{i}"
            assert resp.model_name == "add_sub" and resp.model_version == "1"
            out0, out1 = resp.output("OUTPUT0"), resp.output("OUTPUT1")
            assert out0 is not None and out1 is not None
            assert out0.datatype == "FP32" and out0.shape == (4,)
            np.testing.assert_array_equal(out0.data, np.full(4, i + 1, np.float32))
            np.testing.assert_array_equal(out1.data, np.full(4, i - 1, np.float32))
    finally:
        inst.finalize()


def test_tensors_are_wrapped_not_copied(tmp_path: Path) -> None:
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(r.inputs()) for r in requests]
    """
    inst = _load(tmp_path, "identity", code)
    try:
        data = np.arange(4, dtype=np.float32)
        (resp,) = inst.execute([_request("identity", INPUT0=data, INPUT1=data)])
        assert resp.outputs[0].data is data
    finally:
        inst.finalize()


def test_model_exception_fails_the_batch_with_its_message(tmp_path: Path) -> None:
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            raise pb_utils.TritonModelException("input sums to more than 100")
    """
    inst = _load(tmp_path, "boom", code, instance="boom_0_0")
    try:
        with pytest.raises(TritonError) as info:
            inst.execute([_request("boom", INPUT0=np.ones(4, np.float32))])
        assert info.value.code == Code.INTERNAL
        msg = info.value.message
        assert msg.startswith("Failed to process the request(s) for model instance 'boom_0_0', message: ")
        assert "TritonModelException: input sums to more than 100" in msg
        assert "model.py(" in msg and "): execute" in msg
    finally:
        inst.finalize()


def test_any_exception_becomes_internal(tmp_path: Path) -> None:
    code = """
    class TritonPythonModel:
        def execute(self, requests):
            return {}["missing"]
    """
    inst = _load(tmp_path, "keyerr", code)
    try:
        with pytest.raises(TritonError) as info:
            inst.execute([_request("keyerr")])
        assert info.value.code == Code.INTERNAL
        assert "KeyError: 'missing'" in info.value.message
    finally:
        inst.finalize()


def test_error_response_fails_only_its_request(tmp_path: Path) -> None:
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                if (x < 0).any():
                    err = pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)
                    out.append(pb_utils.InferenceResponse(error=err))
                else:
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
            return out
    """
    inst = _load(tmp_path, "picky", code)
    try:
        good, bad = inst.execute(
            [
                _request("picky", "a", INPUT0=np.ones(2, np.int32)),
                _request("picky", "b", INPUT0=-np.ones(2, np.int32)),
            ]
        )
        assert good.error is None
        np.testing.assert_array_equal(good.outputs[0].data, [2, 2])
        assert good.outputs[0].datatype == "INT32"
        assert bad.error is not None and bad.id == "b"
        assert bad.error.code == Code.INVALID_ARG and bad.error.message == "negative input"
        assert bad.outputs == []
    finally:
        inst.finalize()


def test_bad_execute_returns_fail_the_batch(tmp_path: Path) -> None:
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.mode = "short"

        def execute(self, requests):
            if self.mode == "short":
                return [pb_utils.InferenceResponse()]
            if self.mode == "none":
                return None
            return ["not a response"] * len(requests)
    """
    inst = _load(tmp_path, "liar", code)
    try:
        reqs = [_request("liar"), _request("liar")]
        with pytest.raises(
            TritonError, match="InferenceRequest\\(s\\) size is:2, and InferenceResponse\\(s\\) size is:1"
        ):
            inst.execute(reqs)
        inst._model.mode = "none"  # None: the model must have answered through the response sender
        missing = inst.execute(reqs)
        assert missing is not None and all(
            r.error is not None and "no final response was sent" in r.error.message for r in missing
        )
        inst._model.mode = "dict"
        inst._model.execute = lambda requests: {"not": "a list"}
        with pytest.raises(TritonError, match="Expected a list in the execute return, got dict"):
            inst.execute(reqs)
        del inst._model.execute
        inst._model.mode = "junk"
        with pytest.raises(TritonError, match="pb_utils.InferenceResponse objects, got str") as info:
            inst.execute(reqs)
        assert info.value.code == Code.INTERNAL
    finally:
        inst.finalize()


def test_bytes_in_and_out(tmp_path: Path) -> None:
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "TEXT")
                assert x.triton_dtype() == 13
                words = [b.decode() for b in x.as_numpy().reshape(-1)]
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("UPPER", np.array([w.upper() for w in words], dtype=object)),
                    pb_utils.Tensor("UNICODE", np.array(words)),
                    pb_utils.Tensor("FIXED", np.array([w.encode() for w in words], dtype=np.bytes_)),
                    pb_utils.Tensor("MIXED", np.array([b"raw", "txt", 7], dtype=object)),
                ]))
            return out
    """
    inst = _load(tmp_path, "text", code)
    try:
        text = np.array([b"hello", "wörld".encode()], dtype=object)
        (resp,) = inst.execute([_request("text", TEXT=text)])
        assert resp.error is None, resp.error
        expected = {
            "UPPER": [b"HELLO", "WÖRLD".encode()],
            "UNICODE": [b"hello", "wörld".encode()],
            "FIXED": [b"hello", "wörld".encode()],
            "MIXED": [b"raw", b"txt", b"7"],
        }
        for name, values in expected.items():
            t = resp.output(name)
            assert t is not None and t.datatype == "BYTES", name
            assert t.data.dtype == object and t.data.tolist() == values, name
    finally:
        inst.finalize()


def test_async_execute_uses_one_private_loop(tmp_path: Path) -> None:
    code = """
    import asyncio
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def initialize(self, args):
            await asyncio.sleep(0)
            self.loops = []

        async def execute(self, requests):
            loop = asyncio.get_running_loop()
            self.loops.append(loop)
            results = await asyncio.gather(*(self.one(r) for r in requests))
            return list(results)

        async def one(self, request):
            await asyncio.sleep(0)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1)])
    """
    inst = _load(tmp_path, "aio", code)
    model = inst._model
    first = inst.execute(
        [_request("aio", INPUT0=np.zeros(2, np.float32)), _request("aio", INPUT0=np.ones(2, np.float32))]
    )
    second = inst.execute([_request("aio", INPUT0=np.zeros(2, np.float32))])
    np.testing.assert_array_equal(first[1].outputs[0].data, [2, 2])
    np.testing.assert_array_equal(second[0].outputs[0].data, [1, 1])
    assert len(model.loops) == 2 and model.loops[0] is model.loops[1]
    inst.finalize()
    assert model.loops[0].is_closed()


AUTO = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        cfg = auto_complete_model_config
        cfg.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
        cfg.add_input({"name": "MASK", "data_type": "TYPE_BOOL", "dims": [-1], "optional": True})
        cfg.add_output({"name": "OUT", "data_type": "TYPE_STRING", "dims": [1]})
        cfg.set_max_batch_size(8)
        cfg.set_dynamic_batching()
        return cfg

    def execute(self, requests):
        return []
"""


def test_auto_complete_config_fills_inputs_outputs_and_batching(tmp_path: Path) -> None:
    model_dir = _write(tmp_path, "auto", AUTO)
    before = set(sys.modules)
    done = PythonBackend().auto_complete_config(
        ModelConfig(name="auto", backend="python"), model_dir, model_dir / "1"
    )
    assert isinstance(done, ModelConfig)
    assert done.name == "auto" and done.backend == "python"
    assert done.max_batch_size == 8
    assert done.dynamic_batching is not None
    assert [(i.name, i.data_type, list(i.dims), i.optional) for i in done.input] == [
        ("IN", DataType.TYPE_FP32, [4], False),
        ("MASK", DataType.TYPE_BOOL, [-1], True),
    ]
    assert [(o.name, o.data_type, list(o.dims)) for o in done.output] == [("OUT", DataType.TYPE_STRING, [1])]
    # the throwaway import leaves nothing behind
    assert not [n for n in set(sys.modules) - before if n.startswith("_trident_python_model_")]


def test_auto_complete_config_conflicts_and_passthrough(tmp_path: Path) -> None:
    model_dir = _write(tmp_path, "auto", AUTO)
    backend = PythonBackend()
    configured = ModelConfig(
        name="auto", max_batch_size=4, input=[ModelInput(name="IN", data_type=DataType.TYPE_FP32, dims=[4])]
    )
    done = backend.auto_complete_config(configured, model_dir, model_dir / "1")
    assert done.max_batch_size == 8 and len(done.input) == 2  # configured IN completed, not duplicated
    wrong_dims = ModelConfig(
        name="auto", input=[ModelInput(name="IN", data_type=DataType.TYPE_FP32, dims=[3])]
    )
    with pytest.raises(
        TritonError, match="the model expects dims \\[4\\] but the model configuration specifies dims \\[3\\]"
    ):
        backend.auto_complete_config(wrong_dims, model_dir, model_dir / "1")
    too_big = ModelConfig(name="auto", max_batch_size=16)
    with pytest.raises(TritonError, match="configuration specified max_batch_size 16"):
        backend.auto_complete_config(too_big, model_dir, model_dir / "1")
    sequence = ModelConfig(name="auto", sequence_batching=ModelSequenceBatching())
    with pytest.raises(TritonError, match="scheduling_choice as 'sequence_batching'"):
        backend.auto_complete_config(sequence, model_dir, model_dir / "1")
    # no auto_complete_config method, no version folder: unchanged
    plain_dir = _write(tmp_path, "plain", ADD_SUB)
    cfg = _config("plain")
    assert backend.auto_complete_config(cfg, plain_dir, plain_dir / "1") is cfg
    assert backend.auto_complete_config(cfg, plain_dir, None) is cfg


def test_auto_complete_config_must_return_model_config(tmp_path: Path) -> None:
    code = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(cfg):
            return cfg.as_dict()
    """
    model_dir = _write(tmp_path, "lazy", code)
    with pytest.raises(TritonError, match="must return a valid pb.ModelConfig object") as info:
        PythonBackend().auto_complete_config(ModelConfig(name="lazy"), model_dir, model_dir / "1")
    assert info.value.code == Code.INTERNAL


SIBLING_MODEL = """
import helper
from . import rel
import triton_python_backend_utils as pb_utils

VALUE = {value}

class TritonPythonModel:
    def execute(self, requests):
        vals = [VALUE, helper.VALUE, rel.VALUE]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", __import__("numpy").array(vals))]) for _ in requests]
"""


def test_models_with_the_same_file_names_do_not_collide(tmp_path: Path) -> None:
    insts = []
    for name, value in (("first", 1), ("second", 2)):
        model_dir = _write(
            tmp_path, name, SIBLING_MODEL.format(value=value),
            extra={"helper.py": f"VALUE = {value * 10}\n", "rel.py": f"VALUE = {value * 100}\n"},
        )  # fmt: skip
        insts.append(PythonBackend().load_instance(_ctx(model_dir, _config(name))))
    try:
        assert "helper" not in sys.modules  # sibling modules do not leak under their plain name
        a = insts[0].execute([_request("first")])[0].outputs[0].data.tolist()
        b = insts[1].execute([_request("second")])[0].outputs[0].data.tolist()
        assert a == [1, 10, 100] and b == [2, 20, 200]
        assert insts[0]._loaded.module is not insts[1]._loaded.module
    finally:
        for inst in insts:
            inst.finalize()
    assert str((tmp_path / "first" / "1").resolve()) not in sys.path


def test_parallel_instance_loads_keep_models_apart(tmp_path: Path) -> None:
    dirs = {}
    for name, value in (("left", 1), ("right", 2)):
        dirs[name] = _write(
            tmp_path,
            name,
            SIBLING_MODEL.format(value=value),
            extra={"helper.py": f"VALUE = {value * 10}\n", "rel.py": f"VALUE = {value * 100}\n"},
        )
    backend = PythonBackend()
    with ThreadPoolExecutor(8) as pool:
        futures = {
            (name, i): pool.submit(backend.load_instance, _ctx(d, _config(name), instance=f"{name}_{i}"))
            for name, d in dirs.items()
            for i in range(4)
        }
        insts = {key: f.result() for key, f in futures.items()}
    try:
        for (name, _), inst in insts.items():
            value = 1 if name == "left" else 2
            got = inst.execute([_request(name)])[0].outputs[0].data.tolist()
            assert got == [value, value * 10, value * 100]
        assert len({id(inst._loaded.module) for inst in insts.values()}) == 8
    finally:
        for inst in insts.values():
            inst.finalize()
    assert not [n for n in sys.modules if n.startswith("_trident_python_model_")]
    assert not [p for p in sys.path if p.startswith(str(tmp_path.resolve()))]


def test_siblings_import_lazily_while_loaded(tmp_path: Path) -> None:
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            import lazyhelper

            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([lazyhelper.X]))]) for _ in requests]
    """
    inst = _load(tmp_path, "lazy", code, extra={"lazyhelper.py": "X = 42\n"})
    try:
        assert inst.execute([_request("lazy")])[0].outputs[0].data.tolist() == [42]
    finally:
        inst.finalize()
        sys.modules.pop("lazyhelper", None)
    assert str((tmp_path / "lazy" / "1").resolve()) not in sys.path


def test_syntax_error_names_the_file(tmp_path: Path) -> None:
    broken = _write(tmp_path, "syntax", "def oops(:\n")
    with pytest.raises(TritonError, match="SyntaxError") as info:
        PythonBackend().load_instance(_ctx(broken, _config("syntax")))
    assert "model.py" in info.value.message and "<frozen" not in info.value.message


def test_reload_of_a_changed_file_runs_the_new_code(tmp_path: Path) -> None:
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([{v}]))]) for _ in requests]
    """
    first = _load(tmp_path, "changing", code.format(v=1))
    assert first.execute([_request("changing")])[0].outputs[0].data.tolist() == [1]
    first.finalize()
    second = _load(tmp_path, "changing", code.format(v=2))
    try:
        assert second.execute([_request("changing")])[0].outputs[0].data.tolist() == [2]
    finally:
        second.finalize()


def test_finalize_is_called_and_releases_the_module(tmp_path: Path) -> None:
    code = """
    from pathlib import Path

    class TritonPythonModel:
        def initialize(self, args):
            self.marker = Path(args["model_repository"]) / "finalized"

        def execute(self, requests):
            return []

        def finalize(self):
            self.marker.write_text("bye")
    """
    inst = _load(tmp_path, "fin", code)
    package = inst._loaded.package
    assert package in sys.modules
    inst.finalize()
    inst.finalize()  # idempotent
    assert (tmp_path / "fin" / "finalized").read_text() == "bye"
    assert package not in sys.modules
    assert not inst.is_ready()


def test_load_failures_are_clear(tmp_path: Path) -> None:
    backend = PythonBackend()
    empty = tmp_path / "empty"
    (empty / "1").mkdir(parents=True)
    with pytest.raises(TritonError, match="Python model file not found") as info:
        backend.load_instance(_ctx(empty, _config("empty")))
    assert info.value.code == Code.INTERNAL
    no_class = _write(tmp_path, "noclass", "X = 1\n")
    with pytest.raises(TritonError, match="does not define class TritonPythonModel"):
        backend.load_instance(_ctx(no_class, _config("noclass")))
    broken = _write(tmp_path, "broken", "import does_not_exist_anywhere\n")
    with pytest.raises(TritonError, match="ModuleNotFoundError"):
        backend.load_instance(_ctx(broken, _config("broken")))
    before = set(sys.modules)
    bad_init = _write(
        tmp_path,
        "badinit",
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise ValueError('no weights')\n",
    )
    with pytest.raises(TritonError, match="failed to initialize model 'badinit'.*ValueError: no weights"):
        backend.load_instance(_ctx(bad_init, _config("badinit")))
    assert not [n for n in set(sys.modules) - before if n.startswith("_trident_python_model_")]
    decoupled = _write(tmp_path, "dec", ADD_SUB)
    cfg = _config("dec", model_transaction_policy=ModelTransactionPolicy(decoupled=True))
    with pytest.raises(TritonError, match="must return None") as info:  # decoupled models load
        backend.load_instance(_ctx(decoupled, cfg)).execute([_request("dec", INPUT0=np.zeros(4, np.float32),
                                                                       INPUT1=np.zeros(4, np.float32))])
    assert info.value.code == Code.INTERNAL
    bad_mode = _write(tmp_path, "badmode", ADD_SUB)
    cfg = _config("badmode", parameters={"TRIDENT_EXECUTION_MODE": ModelParameter(string_value="fork")})
    with pytest.raises(TritonError, match="TRIDENT_EXECUTION_MODE must be 'thread' or 'process'") as info:
        backend.load_instance(_ctx(bad_mode, cfg))
    assert info.value.code == Code.INVALID_ARG
    env = _write(tmp_path, "env", ADD_SUB)
    cfg = _config("env", parameters={"EXECUTION_ENV_PATH": ModelParameter(string_value="/x.tar.gz")})
    with pytest.raises(TritonError, match="EXECUTION_ENV_PATH") as info:
        backend.load_instance(_ctx(env, cfg))
    assert info.value.code == Code.UNSUPPORTED


def test_request_view(tmp_path: Path) -> None:
    code = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                view = {
                    "id": r.request_id(), "corr": r.correlation_id(), "flags": r.flags(),
                    "timeout": r.timeout(), "params": json.loads(r.parameters()),
                    "outputs": r.requested_output_names(), "cancelled": r.is_cancelled(),
                    "inputs": [t.name() for t in r.inputs()],
                }
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("VIEW", np.array([json.dumps(view)], dtype=object))],
                    parameters={"seen": True},
                ))
            return out
    """
    inst = _load(tmp_path, "view", code)
    try:
        plain = _request("view", "r1", INPUT0=np.zeros(1, np.float32))
        seq = _request(
            "view", "r2", outputs=["OUTPUT1"],
            params={"sequence_id": "abc", "sequence_start": True, "sequence_end": True, "timeout": 5000,
                    "priority": 1, "custom": "x", "n": 3},
        )  # fmt: skip
        seq.cancel()
        r1, r2 = inst.execute([plain, seq])
        v1 = json.loads(r1.outputs[0].data[0])
        v2 = json.loads(r2.outputs[0].data[0])
        assert v1 == {
            "id": "r1", "corr": 0, "flags": 0, "timeout": 0, "params": {},
            "outputs": ["OUTPUT0", "OUTPUT1"], "cancelled": False, "inputs": ["INPUT0"],
        }  # fmt: skip
        assert v2 == {
            "id": "r2", "corr": "abc", "flags": 3, "timeout": 5000, "params": {"custom": "x", "n": 3},
            "outputs": ["OUTPUT1"], "cancelled": True, "inputs": [],
        }  # fmt: skip
        assert r1.parameters == {"seen": True}
    finally:
        inst.finalize()


def test_is_ready_sync_and_async(tmp_path: Path) -> None:
    sync_code = "class TritonPythonModel:\n    def is_ready(self):\n        return False\n"
    async_code = "class TritonPythonModel:\n    async def is_ready(self):\n        return True\n"
    plain = _load(tmp_path, "plain", "class TritonPythonModel:\n    pass\n")
    not_ready = _load(tmp_path, "notready", sync_code)
    ready = _load(tmp_path, "ready", async_code)
    try:
        assert plain.is_ready() and ready.is_ready() and not not_ready.is_ready()
    finally:
        for inst in (plain, not_ready, ready):
            inst.finalize()


def test_logger_goes_to_trident_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            pb_utils.Logger.log_info("hello info")
            pb_utils.Logger.log_warn("hello warn")
            pb_utils.Logger.log("hello verbose", pb_utils.Logger.VERBOSE)
            pb_utils.Logger.log_error("hello error")
    """
    with caplog.at_level(logging.DEBUG, logger="trident.model"):
        inst = _load(tmp_path, "chatty", code)
    inst.finalize()
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name == "trident.model"]
    assert records == [
        ("trident.model", logging.INFO, "hello info"),
        ("trident.model", logging.WARNING, "hello warn"),
        ("trident.model", logging.DEBUG, "hello verbose"),
        ("trident.model", logging.ERROR, "hello error"),
    ]
    assert all(r.filename == "model.py" for r in caplog.records if r.name == "trident.model")


# ---- pb_utils on its own ----


def test_pb_utils_is_registered_under_triton_name() -> None:
    pb_utils.register()
    pb_utils.register()
    import triton_python_backend_utils  # type: ignore[import-not-found]

    assert triton_python_backend_utils is pb_utils


def test_serialize_deserialize_bytes_round_trip() -> None:
    values = np.array([b"", b"a", "é".encode(), b"\x00\xff" * 10], dtype=object)
    blob = pb_utils.serialize_byte_tensor(values)
    assert blob is not None and blob[:4] == b"\x00\x00\x00\x00"
    back = pb_utils.deserialize_bytes_tensor(blob)
    assert back.dtype == object and back.tolist() == values.tolist()
    assert (
        pb_utils.serialize_byte_tensor(np.array([["x", "yz"]], dtype=object))
        == b"\x01\x00\x00\x00x\x02\x00\x00\x00yz"
    )
    assert pb_utils.serialize_byte_tensor(np.zeros(0, dtype=object)) == b""
    assert pb_utils.serialize_byte_tensor(np.zeros(3, np.float32)) is None


def test_type_conversions_match_triton_numbers() -> None:
    table = {
        1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
        8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
    }  # fmt: skip
    for number, np_type in table.items():
        assert pb_utils.triton_to_numpy_type(number) is np_type
        assert pb_utils.numpy_to_triton_type(np_type) == number
        assert pb_utils.numpy_to_triton_type(np.dtype(np_type)) == number
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.triton_to_numpy_type(14) is None
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_NOPE")
    t = pb_utils.Tensor("x", np.zeros((2, 3), np.float16))
    assert t.triton_dtype() == 10 and t.shape() == [2, 3] and t.is_cpu() and t.name() == "x"
    assert pb_utils.Tensor("s", np.array(["a"])).triton_dtype() == 13
    with pytest.raises(pb_utils.TritonModelException, match="unsupported numpy dtype"):
        pb_utils.Tensor("c", np.zeros(2, np.complex64))


def test_tensor_contiguity_and_byte_order() -> None:
    base = np.arange(6, dtype=np.int32).reshape(2, 3)
    t = pb_utils.Tensor("t", base.T)
    assert t.as_numpy().flags.c_contiguous and t.shape() == [3, 2]
    np.testing.assert_array_equal(t.as_numpy(), base.T)
    big = np.arange(3, dtype=">i4")
    be = pb_utils.Tensor("be", big)
    assert be.as_numpy().dtype == np.dtype("<i4") and be.as_numpy().tolist() == [0, 1, 2]


def test_dlpack_round_trip() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("x", data)
    back = pb_utils.Tensor.from_dlpack("y", t.to_dlpack())
    assert back.name() == "y" and back.triton_dtype() == 11 and back.shape() == [2, 3]
    assert np.shares_memory(back.as_numpy(), data)
    via_protocol = np.from_dlpack(t)
    assert np.shares_memory(via_protocol, data)
    assert t.__dlpack_device__() == (1, 0)
    from_obj = pb_utils.Tensor.from_dlpack("z", data)  # any object with __dlpack__
    assert np.shares_memory(from_obj.as_numpy(), data)
    readonly = np.frombuffer(bytes(8), dtype=np.float32)
    exported = pb_utils.Tensor.from_dlpack("r", pb_utils.Tensor("ro", readonly).to_dlpack())
    assert exported.as_numpy().tolist() == [0.0, 0.0]
    with pytest.raises(pb_utils.TritonModelException, match="BYTES"):
        pb_utils.Tensor("b", np.array([b"x"], dtype=object)).to_dlpack()


def test_errors_responses_and_requests() -> None:
    err = pb_utils.TritonError("nope")
    assert err.code() == pb_utils.TritonError.INTERNAL == 1 and err.message() == "nope"
    codes = [
        "UNKNOWN",
        "INTERNAL",
        "NOT_FOUND",
        "INVALID_ARG",
        "UNAVAILABLE",
        "UNSUPPORTED",
        "ALREADY_EXISTS",
        "CANCELLED",
    ]
    assert [int(getattr(pb_utils.TritonError, c)) for c in codes] == list(range(8))
    resp = pb_utils.InferenceResponse(error=pb_utils.TritonError("x", pb_utils.TritonError.NOT_FOUND))
    assert resp.has_error() and resp.error().code() == pb_utils.TritonError.NOT_FOUND  # type: ignore[union-attr]
    assert resp.output_tensors() == [] and resp.parameters() == "{}"
    out = pb_utils.Tensor("o", np.ones(1))
    ok = pb_utils.InferenceResponse([out], parameters={"a": 1, "b": "c", "d": True})
    assert (
        pb_utils.get_output_tensor_by_name(ok, "o") is out
        and pb_utils.get_output_tensor_by_name(ok, "p") is None
    )
    assert json.loads(ok.parameters()) == {"a": 1, "b": "c", "d": True}
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse([np.ones(1)])  # type: ignore[list-item]
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse([], parameters={"x": [1]})
    req = pb_utils.InferenceRequest(
        model_name="m", inputs=[out], requested_output_names=["y"], correlation_id=7, parameters={"k": "v"}
    )
    assert pb_utils.get_input_tensor_by_name(req, "o") is out
    assert (
        req.correlation_id() == 7
        and req.requested_output_names() == ["y"]
        and req.parameters() == '{"k": "v"}'
    )
    assert not req.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="BLS .* only available to models loaded by a trident"):
        req.exec()
    with pytest.raises(pb_utils.TritonModelException, match="only available on requests passed to execute"):
        req.get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
        pb_utils.InferenceRequest(model_name="m", correlation_id=1.5)  # type: ignore[arg-type]


def test_config_dict_helpers() -> None:
    cfg = model_config.config_to_json(
        _config("m", model_transaction_policy=ModelTransactionPolicy(decoupled=True))
    )
    assert pb_utils.get_input_config_by_name(cfg, "INPUT1")["data_type"] == "TYPE_FP32"  # type: ignore[index]
    assert pb_utils.get_output_config_by_name(cfg, "OUTPUT0")["dims"] == [4]  # type: ignore[index]
    assert pb_utils.get_input_config_by_name(cfg, "nope") is None
    assert pb_utils.using_decoupled_model_transaction_policy(cfg)
    assert not pb_utils.using_decoupled_model_transaction_policy(model_config.config_to_json(_config("m")))
    assert model_config.config_from_json(json.dumps(cfg)) == _config(
        "m", model_transaction_policy=ModelTransactionPolicy(decoupled=True)
    )


def test_model_config_rules() -> None:
    mc = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0, "input": [], "output": []}))
    with pytest.raises(ValueError, match="contains property other than"):
        mc.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [1], "format": "FORMAT_NCHW"})
    with pytest.raises(ValueError, match="is missing 'dims' property"):
        mc.add_output({"name": "a", "data_type": "TYPE_FP32"})
    mc.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [2]})
    with pytest.raises(
        ValueError, match="configuration expects datatype TYPE_FP32 for input 'a', model provides TYPE_INT32"
    ):
        mc.add_input({"name": "a", "data_type": "TYPE_INT32", "dims": [2]})
    mc.as_dict()["input"][0]["optional"] = False  # as Triton's JSON prints a configured input
    with pytest.raises(ValueError, match="the model expects optional True"):
        mc.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [2], "optional": True})
    mc.set_max_batch_size(4)
    mc.set_max_batch_size(4)
    with pytest.raises(ValueError, match="max_batch_size 4"):
        mc.set_max_batch_size(2)
    mc.set_dynamic_batching()
    assert mc.as_dict()["dynamic_batching"] == {}
    mc.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        mc.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="other than 'decoupled'"):
        mc.set_model_transaction_policy({"other": 1})
    assert model_config.config_from_json(json.dumps(mc.as_dict())).max_batch_size == 4


def test_responses_without_parameters_share_nothing_a_caller_can_change() -> None:
    from trident.backends.python import _convert

    out = pb_utils.Tensor("OUTPUT0", np.arange(3, dtype=np.float32))
    plain = [pb_utils.InferenceResponse(output_tensors=[out]) for _ in range(2)]
    assert [r.parameters() for r in plain] == ["{}", "{}"]
    first, second = (_convert.to_response(r) for r in plain)
    first.parameters["added"] = 1  # a later layer writing into one response's parameters
    assert second.parameters == {} and plain[1]._param_dict == {}
    assert _convert.to_response(plain[0]).parameters == {}
    with_params = pb_utils.InferenceResponse(output_tensors=[out], parameters={"k": "v", "n": 2})
    assert json.loads(with_params.parameters()) == {"k": "v", "n": 2}
    assert _convert.to_response(with_params).parameters == {"k": "v", "n": 2}
    with pytest.raises(pb_utils.TritonModelException, match="keys must be str"):
        pb_utils.InferenceResponse(output_tensors=[out], parameters={"k": [1]})
    with pytest.raises(pb_utils.TritonModelException, match="pb_utils.Tensor objects"):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(2)])


def test_a_plain_request_is_wrapped_with_every_output_and_no_sequence_fields() -> None:
    from trident.backends.python import _convert

    tensor = Tensor("INPUT0", "FP32", (1, 2), np.zeros((1, 2), np.float32))
    plain = _convert.wrap_request(InferenceRequest(model_name="m", inputs=[tensor]), ["A", "B"])
    assert plain.requested_output_names() == ["A", "B"]
    assert (plain.correlation_id(), plain.flags(), plain.timeout(), plain.parameters()) == (0, 0, 0, "{}")
    assert pb_utils.get_input_tensor_by_name(plain, "INPUT0").as_numpy() is tensor.data
    assert pb_utils.get_input_tensor_by_name(plain, "missing") is None
    asked = _convert.wrap_request(InferenceRequest(model_name="m", inputs=[tensor], outputs=[RequestedOutput("B")],
                                                   parameters={"sequence_id": 7, "sequence_start": True, "x": 1}),
                                  ["A", "B"])
    assert asked.requested_output_names() == ["B"]
    assert asked.correlation_id() == 7 and asked.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert json.loads(asked.parameters()) == {"x": 1}
