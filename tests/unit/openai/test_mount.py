"""``mount``: the OpenAI routes next to the KServe API on one port, with a real in-process
server, trident's HTTP/1.1 layer and httpx."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from trident.http.app import make_app
from trident.http.fastserver import serve_asgi
from trident.openai.app import make_openai_app, mount
from trident.options import ServerOptions
from trident.server import open_server

CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
'''

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()[0]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([text[::-1]], object))]))
        return out
'''


async def test_v1_next_to_v2(tmp_path: Path) -> None:
    (tmp_path / "rev" / "1").mkdir(parents=True)
    (tmp_path / "rev" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "rev" / "1" / "model.py").write_text(MODEL)
    async with open_server(ServerOptions(model_repositories=[str(tmp_path)])) as server:
        app = mount(make_openai_app(server), make_app(server))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(lambda task_status: serve_asgi(app, host="127.0.0.1", port=0,
                                                                      task_status=task_status))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                models = (await client.get("/v1/models")).json()
                assert [m["id"] for m in models["data"]] == ["rev"]
                done = (await client.post("/v1/completions", json={"model": "rev", "prompt": "abc"})).json()
                assert done["choices"][0]["text"] == "cba" and done["usage"] is None  # no tokenizer.json
                assert (await client.get("/v2/health/ready")).status_code == 200
                assert (await client.get("/v2/models/rev")).json()["name"] == "rev"
                missing = await client.get("/v1")
                assert missing.status_code == 404 and "error" in missing.json()
                assert (await client.get("/v2/nope")).json() == {"error": "Not Found"}
            nursery.cancel_scope.cancel()


async def test_answer_size_is_bounded(tmp_path: Path) -> None:
    """An answer past ``max_answer`` characters cancels the model and fails the request (500)."""
    (tmp_path / "rev" / "1").mkdir(parents=True)
    (tmp_path / "rev" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "rev" / "1" / "model.py").write_text(MODEL)
    async with open_server(ServerOptions(model_repositories=[str(tmp_path)])) as server:
        app = make_openai_app(server, max_answer=2)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(lambda task_status: serve_asgi(app, host="127.0.0.1", port=0,
                                                                      task_status=task_status))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for stream in (False, True):
                    answer = await client.post("/v1/completions", json={"model": "rev", "prompt": "abc",
                                                                        "stream": stream})
                    assert answer.status_code == 500
                    assert answer.json()["error"]["message"] == "the model's answer exceeds 2 characters"
                assert (await client.post("/v1/completions", json={"model": "rev", "prompt": "ab"})).json()[
                    "choices"][0]["text"] == "ba"
            nursery.cancel_scope.cancel()
