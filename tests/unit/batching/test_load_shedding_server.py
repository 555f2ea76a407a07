"""Load shedding through the in-process server (the e2e suite drives it over HTTP and gRPC): the
server default reaches a model without the parameter and leaves a decoupled model alone; the
parameter on a decoupled model fails its load with UNSUPPORTED."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import trio

from trident.errors import Code, TritonError
from trident.options import ServerOptions
from trident.server import open_server
from trident.types import InferenceRequest, InferenceResponse, Tensor

SLEEPY_PY = '''
import json
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Takes 50 ms a request; answers Y = 2 X (decoupled: through its sender)."""

    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        out = []
        for r in requests:
            time.sleep(0.05)
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)])
            if self.decoupled:
                r.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                out.append(response)
        return None if self.decoupled else out
'''


def write(repo: Path, name: str, extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(SLEEPY_PY)
    (repo / name / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'instance_group [ { kind: KIND_CPU count: 1 } ]\n' + extra)


def request(model: str, x: float) -> InferenceRequest:
    return InferenceRequest(model, [Tensor.from_numpy("X", np.array([x], np.float32))])


TARGET = 'parameters { key: "TRIDENT_QUEUE_DELAY_TARGET_US" value { string_value: "100000" } }\n'


async def burst(server, model: str, count: int = 20) -> tuple[int, list[TritonError]]:
    answered = 0
    refused: list[TritonError] = []

    async def one(i: int) -> None:
        nonlocal answered
        responses: list[InferenceResponse] = []

        async def send(response: InferenceResponse) -> None:
            responses.append(response)

        try:
            await server.infer_stream(request(model, float(i)), send)
        except TritonError as e:
            refused.append(e)
            return
        assert [r.outputs[0].data.tolist() for r in responses if r.outputs] == [[2.0 * i]]
        answered += 1

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
    return answered, refused


DECOUPLED = "model_transaction_policy { decoupled: true }\n"


async def test_default_target_and_decoupled_models(tmp_path):
    write(tmp_path, "decoupled", DECOUPLED)  # the server's default leaves it alone
    write(tmp_path, "decoupled_target", TARGET + DECOUPLED)  # refused: UNSUPPORTED
    write(tmp_path, "plain")  # the server's default applies
    options = ServerOptions(model_repositories=[str(tmp_path)], queue_delay_target_ms=100.0)
    async with open_server(options) as server:
        assert server.repository.get("decoupled").shedder is None
        await burst(server, "decoupled", 1)
        assert await burst(server, "decoupled") == (20, [])
        failed = {r.name: r for r in server.repository_index()}["decoupled_target"]
        assert failed.state == "UNAVAILABLE"
        assert "TRIDENT_QUEUE_DELAY_TARGET_US" in failed.reason and "decoupled" in failed.reason
        model = "plain"
        await burst(server, model, 1)  # a completion to estimate from
        answered, refused = await burst(server, model)
        assert answered >= 1 and refused, (model, answered)
        assert all(e.code == Code.UNAVAILABLE and "Exceeds queue delay target" in e.message
                   and e.retry_after_s >= 1 for e in refused)
        mv = server.repository.get(model)
        assert mv.shedder is not None and mv.shedder.refused == len(refused)
        # the load is gone: admitted at once
        assert await burst(server, model, 1) == (1, [])
        rejected = server.model_statistics(model)[0].failure_count("REJECTED")
        assert rejected == len(refused)
