"""Process-isolated Python instances in a real in-process server: start-up, auto-complete in a
throwaway process, logs, metrics, readiness, finalize, restart after a crash."""

from __future__ import annotations

import logging
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from trident.backends.metrics import custom_metrics_for
from trident.backends.python._execution import execution_options
from trident.backends.python.isolated.parent import IsolatedInstance
from trident.errors import Code, TritonError
from trident.options import ServerOptions
from trident.protocol.generated.inference import ModelConfig, ModelParameter
from trident.server import open_server
from trident.types import InferenceRequest, Tensor

PROCESS = 'parameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }'

WORKER = '''
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "Y", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "PID", "data_type": "TYPE_INT64", "dims": [1]})
        return config

    def initialize(self, args):
        self.folder = json.loads(args["model_config"])["parameters"]["folder"]["string_value"]
        pb_utils.Logger.log_warn("hello from pid %d" % os.getpid())
        self.family = pb_utils.MetricFamily("isolated_calls", "calls", pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels={"where": "child"})

    def is_ready(self):
        return not os.path.exists(os.path.join(self.folder, "not-ready"))

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            self.metric.increment(int(x[0]))
            try:
                self.metric.increment(-1)
                refused = ""
            except pb_utils.TritonModelException as e:
                refused = str(e)
            if x[0] == 13:
                os._exit(13)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))],
                parameters={"refused": refused, "value": int(self.metric.value())}))
        return out

    def finalize(self):
        with open(os.path.join(self.folder, "finalized"), "w") as f:
            f.write(str(os.getpid()))
'''


def _write(root: Path, name: str, config: str, code: str) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))
    return root / name


def _request(x: int) -> InferenceRequest:
    return InferenceRequest("worker", [Tensor.from_numpy("X", np.array([x], np.int32))])


def test_execution_options() -> None:
    config = ModelConfig(name="m")
    assert execution_options(config).mode == "thread"
    assert execution_options(config, {"execution-mode": "process", "execute-timeout-secs": "3"}).execute_timeout == 3
    config.parameters = {"TRIDENT_EXECUTION_MODE": ModelParameter(string_value="Process"),
                         "TRIDENT_SHM_BYTES": ModelParameter(string_value="65536")}
    options = execution_options(config, {"execution-mode": "thread"})
    assert (options.mode, options.shm_bytes, options.execute_timeout) == ("process", 65536, 0.0)
    config.parameters["TRIDENT_EXECUTE_TIMEOUT_SECS"] = ModelParameter(string_value="-1")
    with pytest.raises(TritonError, match="must be >= 0") as info:
        execution_options(config)
    assert info.value.code == Code.INVALID_ARG


async def test_isolated_model_lifecycle(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "repo"
    folder = tmp_path / "state"
    folder.mkdir()
    _write(root, "worker", f'''
        name: "worker"
        backend: "python"
        max_batch_size: 0
        {PROCESS}
        parameters {{ key: "folder" value: {{ string_value: "{folder}" }} }}
        ''', WORKER)
    caplog.set_level(logging.INFO, logger="trident.model")
    async with open_server(ServerOptions(model_repositories=[str(root)])) as server:
        config = server.model_config("worker")  # completed in a throwaway process
        assert [i.name for i in config.input] == ["X"] and [o.name for o in config.output] == ["Y", "PID"]
        mv = server.repository.get("worker")
        instance = mv.instances[0]
        assert isinstance(instance, IsolatedInstance)
        first_pid = instance.pid
        assert first_pid is not None and first_pid != os.getpid()
        assert any(r.getMessage() == f"hello from pid {first_pid}" and r.levelno == logging.WARNING
                   for r in caplog.records)

        response = await server.infer(_request(5))
        assert response.output("Y").data.tolist() == [10]
        assert response.output("PID").data.tolist() == [first_pid]
        assert "negative" in response.parameters["refused"] and response.parameters["value"] == 5
        assert b'isolated_calls{where="child"} 5' in custom_metrics_for(server).render()

        assert await server.probe_model_ready("worker")
        (folder / "not-ready").touch()
        assert not await server.probe_model_ready("worker")
        (folder / "not-ready").unlink()

        with pytest.raises(TritonError, match="exited with code 13") as info:
            await server.infer(_request(13))
        assert info.value.code == Code.INTERNAL
        # the dead process's metric references are gone; the restarted process counts afresh
        response = await server.infer(_request(2))
        last_pid = int(response.output("PID").data[0])
        assert last_pid != first_pid and instance.pid == last_pid
        assert response.parameters["value"] == 2
    assert (folder / "finalized").read_text() == str(last_pid)  # finalize ran in the model process


async def test_initialize_failure_is_reported_with_the_model_traceback(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _write(root, "broken", f'''
        name: "broken"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        {PROCESS}
        ''', '''
        class TritonPythonModel:
            def initialize(self, args):
                raise RuntimeError("no weights here")
        ''')
    async with open_server(ServerOptions(model_repositories=[str(root)])) as server:
        entry = {e.name: e for e in server.repository_index()}["broken"]
        assert entry.state == "UNAVAILABLE"
        assert "RuntimeError: no weights here" in entry.reason and "model.py" in entry.reason


async def test_backend_config_makes_process_mode_the_default(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _write(root, "pid", '''
        name: "pid"
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
        ''', '''
        import os
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                        for _ in requests]
        ''')
    options = ServerOptions(model_repositories=[str(root)],
                            backend_config={"python": {"execution-mode": "process"}})
    async with open_server(options) as server:
        response = await server.infer(InferenceRequest("pid", [Tensor.from_numpy("X", np.array([1], np.int32))]))
        assert response.output("PID").data.tolist() != [os.getpid()]
    async with open_server(ServerOptions(model_repositories=[str(root)])) as server:
        response = await server.infer(InferenceRequest("pid", [Tensor.from_numpy("X", np.array([1], np.int32))]))
        assert response.output("PID").data.tolist() == [os.getpid()]
