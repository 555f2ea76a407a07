"""The generate extension's JSON mapping (trident.protocol.generate), against a real in-process server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trident.errors import Code, TritonError
from trident.options import ServerOptions
from trident.protocol.generate import _shape_for, build_request, response_json
from trident.server import open_server
from trident.types import InferenceResponse, Tensor

CONFIG = '''
name: "llm"
backend: "python"
max_batch_size: 4
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "bias" data_type: TYPE_FP32 dims: [ -1 ] optional: true },
  { name: "pair" data_type: TYPE_INT64 dims: [ 2, -1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
'''

MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "text_input")]) for r in requests]
'''


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "llm" / "1").mkdir(parents=True)
    (tmp_path / "llm" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "llm" / "1" / "model.py").write_text(MODEL)
    return tmp_path


def test_shape_fill_follows_triton() -> None:
    assert _shape_for("x", [-1, 1], 1) == (1, 1)  # batch dimension: 1
    assert _shape_for("x", [-1, -1], 3) == (1, 3)  # the innermost variable dimension takes the rest
    assert _shape_for("x", [-1, 2, -1], 6) == (1, 2, 3)
    assert _shape_for("x", [3], 3) == (3,)
    with pytest.raises(TritonError, match="can not convert input 'x' to tensor with proper shape"):
        _shape_for("x", [2], 3)
    with pytest.raises(TritonError, match="proper shape"):
        _shape_for("x", [4], 2)


async def test_keys_map_to_inputs_and_parameters(repo: Path) -> None:
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        doc = {"id": "g1", "text_input": "héllo", "max_tokens": 7, "stream": True,
               "parameters": {"temperature": 0.25, "bias": [0.5, 1.5], "pair": [1, 2, 3, 4], "label": "x"}}
        request = build_request(server.model_metadata("llm"), doc, "llm", "")
        assert request.id == "g1" and request.model_name == "llm"
        got = {t.name: (t.datatype, t.shape, t.data.tolist()) for t in request.inputs}
        assert got == {
            "text_input": ("BYTES", (1, 1), [["héllo".encode()]]),
            "max_tokens": ("INT32", (1, 1), [[7]]),
            "bias": ("FP32", (1, 2), [[0.5, 1.5]]),
            "pair": ("INT64", (1, 2, 2), [[[1, 2], [3, 4]]]),
        }
        assert request.parameters == {"stream": True, "temperature": 0.25, "label": "x"}
        response = await server.infer(request)
        assert response_json(response) == {"id": "g1", "model_name": "llm", "model_version": "1",
                                           "text_input": "héllo"}


async def test_bad_requests(repo: Path) -> None:
    async with open_server(ServerOptions(model_repositories=[str(repo)])) as server:
        cases = [
            ([1], "expected a JSON object"),
            ({"text_input": "a", "parameters": "x"}, "Expected JSON object for keyword: 'parameters'"),
            ({"text_input": "a", "opts": {"x": 1}}, "Unsupported parameter type for parameter 'opts'"),
            ({"text_input": 3}, "text_input"),
            ({"text_input": "a", "max_tokens": "many"}, "max_tokens"),
            ({"text_input": "a", "pair": [1, 2, 3]}, "can not convert input 'pair'"),
        ]
        for doc, message in cases:
            with pytest.raises(TritonError, match=message) as info:
                build_request(server.model_metadata("llm"), doc, "llm", "")
            assert info.value.code == Code.INVALID_ARG
        with pytest.raises(TritonError) as info:
            server.model_metadata("missing")
        assert info.value.code == Code.NOT_FOUND


def test_response_json() -> None:
    response = InferenceResponse(
        model_name="m", model_version="2",
        outputs=[Tensor.from_numpy("text_output", np.array([b"hi"], dtype=object)),
                 Tensor.from_numpy("scores", np.array([0.5, 0.25], np.float32)),
                 Tensor.from_numpy("half", np.array([1.5], np.float16))],
        parameters={"index": 3, "done": False})
    assert response_json(response) == {"model_name": "m", "model_version": "2", "index": 3, "done": False,
                                       "text_output": "hi", "scores": [0.5, 0.25], "half": 1.5}
    binary = InferenceResponse(outputs=[Tensor.from_numpy("raw", np.array([b"\xff\xfe"], dtype=object))])
    with pytest.raises(TritonError, match="not UTF-8") as info:
        response_json(binary)
    assert info.value.code == Code.INTERNAL
