"""The OpenAI-compatible front end end to end: the official ``openai`` client (sync, async,
streaming) and httpx for the wire and bad input, against real Python text models.

The models (written here at test time) follow Triton's convention for text models
(``text_input`` / ``stream`` / ``sampling_parameters`` / ``exclude_input_in_output`` in,
``text_output`` out) and use a real tokenizer (the ``tokenizers`` package, a word-level
vocabulary made here): the answer to a prompt is its tokens in reverse order, one response per
token when streaming, at most ``max_tokens`` of them, ending before a ``stop`` word.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from trident.options import EXAMPLE_REPOSITORY

WORDS = ("the quick brown fox jumps over lazy dog hello world user assistant system developer one two three "
         "four five six seven : < > . , ! ?").split()

MODEL_PY = '''
import json
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    """Answers a prompt with its tokens in reverse order (see tests/e2e/test_openai.py)."""

    def initialize(self, args):
        self.folder = Path(args["model_repository"])
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.delay = float(config.get("parameters", {}).get("token_delay_s", {}).get("string_value", "0"))
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))

    def _scalar(self, request, name, default):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return default if tensor is None else tensor.as_numpy().reshape(-1)[0]

    def _pieces(self, request):
        prompt = self._scalar(request, "text_input", b"").decode()
        sampling = json.loads(self._scalar(request, "sampling_parameters", b"{}"))
        exclude = bool(self._scalar(request, "exclude_input_in_output", True))
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        words = [self.tokenizer.id_to_token(i) for i in reversed(ids)]
        out = []
        for word in words[: sampling.get("max_tokens", 64)]:
            if word in sampling.get("stop", []):
                break
            out.append(word)
        pieces = [(" " if i else "") + w for i, w in enumerate(out)]
        if not exclude:
            pieces.insert(0, prompt + " ")
        return pieces

    def execute(self, requests):
        if not self.decoupled:
            responses = []
            for request in requests:
                if any(p.strip() == "!" for p in self._pieces(request)):
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("the model failed")))
                    continue
                shape = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().shape
                text = "".join(self._pieces(request)).encode()
                out = np.array([text], dtype=object).reshape(shape)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out)]))
            return responses
        for request in requests:
            threading.Thread(target=self._generate, args=(request,), daemon=True).start()
        return None

    def _generate(self, request):
        sender = request.get_response_sender()
        pieces = self._pieces(request)
        if not bool(self._scalar(request, "stream", False)):
            pieces = ["".join(pieces)]
        for piece in pieces:
            if piece.strip() == "!":  # a model error after the first tokens
                error = pb_utils.TritonError("the model failed")
                sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            if sender.is_cancelled():
                (self.folder / "cancelled").write_text("yes")
                break
            out = np.array([piece.encode()], dtype=object)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out)]))
            if self.delay:
                time.sleep(self.delay)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

CONFIG = '''
backend: "python"
max_batch_size: {mbs}
{policy}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]
parameters {{ key: "token_delay_s" value {{ string_value: "{delay}" }} }}
'''

TEMPLATE = ("{% for m in messages %}{% if m.role == 'developer' %}{{ raise_exception('no developer messages') }}"
            "{% endif %}<{{ m.role }}> {{ m.content }} {% endfor %}{% if add_generation_prompt %}<assistant>"
            "{% endif %}")

# name -> (decoupled, max_batch_size, seconds between tokens, chat template)
MODELS = {"gen": (True, 0, 0.0, None), "gen_slow": (True, 0, 0.05, None), "gen_unary": (False, 4, 0.0, None),
          "gen_chat": (True, 0, 0.0, TEMPLATE)}


def _tokenizer() -> Tokenizer:
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    return tokenizer


TOKENIZER = _tokenizer()


def tokens(text: str) -> list[str]:
    return [TOKENIZER.id_to_token(i) for i in TOKENIZER.encode(text, add_special_tokens=False).ids]


def answer(prompt: str, max_tokens: int = 64) -> str:
    """What the test models answer to ``prompt``."""
    return " ".join(list(reversed(tokens(prompt)))[:max_tokens])


def _build_repo(root: Path) -> Path:
    repo = root / "repo"
    for name, (decoupled, mbs, delay, template) in MODELS.items():
        folder = repo / name
        (folder / "1").mkdir(parents=True)
        policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
        (folder / "config.pbtxt").write_text(CONFIG.format(mbs=mbs, policy=policy, delay=delay))
        (folder / "1" / "model.py").write_text(MODEL_PY)
        TOKENIZER.save(str(folder / "tokenizer.json"))
        if template is not None:
            (folder / "chat_template.jinja").write_text(template)
    shutil.copytree(EXAMPLE_REPOSITORY / "identity_fp32", repo / "identity_fp32")  # not a text model
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = _build_repo(tmp_path_factory.mktemp("openai"))
    s = start_server("--openai-port", "0", "--allow-grpc=false", "--allow-metrics=false", repo=repo, timeout=120)
    s.repo = repo  # type: ignore[attr-defined]
    match = re.search(r"Started OpenAIFrontend at [\d.]+:(\d+)", s.log())
    assert match, s.log()
    s.openai_url = f"http://127.0.0.1:{match.group(1)}/v1"  # type: ignore[attr-defined]
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def raw(server):
    with httpx.Client(base_url=server.openai_url, timeout=30) as c:
        yield c


def _events(body: str) -> list[str]:
    """The data of each server-sent event; asserts the framing (``data: ...`` and a blank line)."""
    assert body.endswith("\n\n"), body
    events = body[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), body
    return [e[len("data: "):] for e in events]


# ---- models --------------------------------------------------------------------------------------


def test_models_list_and_retrieve(client):
    listed = client.models.list()
    assert [m.id for m in listed.data] == sorted(MODELS)  # identity_fp32 is not a text model
    assert all(m.object == "model" and m.owned_by == "trident" and m.created > 0 for m in listed.data)
    assert client.models.retrieve("gen_chat").id == "gen_chat"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("identity_fp32")
    assert info.value.body["code"] == "model_not_found"


# ---- completions ---------------------------------------------------------------------------------


def test_completion(client):
    prompt = "the quick brown fox jumps"
    result = client.completions.create(model="gen", prompt=prompt, max_tokens=3)
    assert result.object == "text_completion" and result.id.startswith("cmpl-") and result.model == "gen"
    assert result.choices[0].text == answer(prompt, 3) == "jumps fox brown"
    assert result.choices[0].finish_reason == "length"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (5, 3, 8)
    full = client.completions.create(model="gen", prompt=prompt, max_tokens=50)
    assert full.choices[0].text == answer(prompt) and full.choices[0].finish_reason == "stop"


def test_completion_sampling_parameters_reach_the_model(client):
    result = client.completions.create(model="gen", prompt="one two three four", stop=["two"], temperature=0.5,
                                       top_p=0.9, seed=7, n=1)
    assert result.choices[0].text == "four three"
    echoed = client.completions.create(model="gen", prompt="one two", echo=True)
    assert echoed.choices[0].text == "one two two one"


def test_completion_stream(client):
    prompt = "hello world the lazy dog"
    stream = client.completions.create(model="gen", prompt=prompt, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == answer(prompt)
    assert len([t for t in texts if t]) == 5  # one chunk per token
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-2])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == 5
    assert len({c.id for c in chunks}) == 1


def test_stream_wire_format(raw):
    """The events as the OpenAI API sends them: ``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``."""
    response = raw.post("/completions", json={"model": "gen", "prompt": "one two three", "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["three", " two", " one", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in chunks)


def test_regular_model(client):
    """A non-decoupled model (max_batch_size 4): one response, so one chunk when streaming."""
    prompt = "seven six five"
    assert client.completions.create(model="gen_unary", prompt=prompt).choices[0].text == answer(prompt)
    chunks = list(client.completions.create(model="gen_unary", prompt=prompt, stream=True))
    assert [c.choices[0].text for c in chunks] == [answer(prompt), ""]
    chat = client.chat.completions.create(model="gen_unary", messages=[{"role": "user", "content": prompt}])
    assert chat.choices[0].message.content == answer(f"user: {prompt}\nassistant:")


# ---- chat ----------------------------------------------------------------------------------------


def test_chat_default_template(client):
    messages = [{"role": "system", "content": "one two"}, {"role": "user", "content": "hello world"}]
    prompt = "system: one two\nuser: hello world\nassistant:"
    result = client.chat.completions.create(model="gen", messages=messages)
    assert result.object == "chat.completion" and result.id.startswith("chatcmpl-")
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == answer(prompt)
    assert result.choices[0].finish_reason == "stop"
    assert result.usage.prompt_tokens == len(tokens(prompt))
    assert result.usage.completion_tokens == len(tokens(prompt))
    limited = client.chat.completions.create(model="gen", messages=messages, max_completion_tokens=2)
    assert limited.choices[0].message.content == ": assistant" and limited.choices[0].finish_reason == "length"


def test_chat_stream(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "the quick"}, {"type": "text", "text": " fox"}]}]
    chunks = list(client.chat.completions.create(model="gen", messages=messages, stream=True))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer("user: the quick fox\nassistant:")
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].choices[0].delta.content is None


def test_chat_template_from_the_model_folder(client):
    messages = [{"role": "system", "content": "one"}, {"role": "user", "content": "hello"}]
    result = client.chat.completions.create(model="gen_chat", messages=messages)
    assert result.choices[0].message.content == answer("<system> one <user> hello <assistant>")
    with pytest.raises(openai.BadRequestError) as info:  # the template's raise_exception
        client.chat.completions.create(model="gen_chat", messages=[{"role": "developer", "content": "x"}])
    assert "no developer messages" in info.value.body["message"]


def test_async_client(server):
    async def main() -> tuple[str, str, list[str]]:
        async with openai.AsyncOpenAI(base_url=server.openai_url, api_key="unused", max_retries=0) as c:
            completion, chat = await asyncio.gather(
                c.completions.create(model="gen", prompt="one two three"),
                c.chat.completions.create(model="gen", messages=[{"role": "user", "content": "four"}]))
            stream = await c.chat.completions.create(model="gen_unary", stream=True,
                                                     messages=[{"role": "user", "content": "five six"}])
            deltas = [chunk.choices[0].delta.content or "" async for chunk in stream]
            return completion.choices[0].text, chat.choices[0].message.content or "", deltas

    text, content, deltas = asyncio.run(main())
    assert text == "three two one"
    assert content == answer("user: four\nassistant:")
    assert "".join(deltas) == answer("user: five six\nassistant:")


def test_model_errors(client, raw):
    """A model error before any token is the request's error; one after the first tokens ends the
    stream with an in-band error event, which the client raises."""
    with pytest.raises(openai.InternalServerError, match="the model failed"):
        client.completions.create(model="gen_unary", prompt="! one")
    with pytest.raises(openai.InternalServerError, match="the model failed"):
        client.completions.create(model="gen", prompt="one !", stream=True)  # "!" is the first token
    stream = client.completions.create(model="gen", prompt="! two one", stream=True)
    with pytest.raises(openai.APIError, match="the model failed"):
        for _ in stream:
            pass
    events = _events(raw.post("/completions", json={"model": "gen", "prompt": "! two one", "stream": True}).text)
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == ["one", " two"]
    assert json.loads(events[-1])["error"]["message"] == "the model failed"


# ---- cancellation --------------------------------------------------------------------------------


def _wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was not written: the model was not told the client went away")
        time.sleep(0.02)


def test_client_disconnect_cancels_generation(server, client):
    """The client closes the stream after 3 of 64 tokens (0.05 s apart): the model sees
    is_cancelled() and stops; the server keeps answering."""
    marker = server.repo / "gen_slow" / "cancelled"
    prompt = " ".join(WORDS[:20] * 3)
    stream = client.completions.create(model="gen_slow", prompt=prompt, max_tokens=60, stream=True)
    received = []
    for chunk in stream:
        received.append(chunk.choices[0].text)
        if len(received) == 3:
            break
    stream.close()
    _wait_for(marker)
    assert received == [" " + t if i else t for i, t in enumerate(answer(prompt).split(" ")[:3])]
    assert client.completions.create(model="gen", prompt="one").choices[0].text == "one"


# ---- bad input -----------------------------------------------------------------------------------


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"model": "gen", "prompt": "x", "n": 2}, "n", "unsupported_parameter"),
    ({"model": "gen", "prompt": "x", "logprobs": 2}, "logprobs", "unsupported_parameter"),
    ({"model": "gen", "prompt": "x", "best_of": 3}, "best_of", "unsupported_parameter"),
    ({"model": "gen", "prompt": "x", "suffix": "y"}, "suffix", "unsupported_parameter"),
    ({"model": "gen", "prompt": ["a", "b"]}, "prompt", "unsupported_parameter"),
    ({"model": "gen", "prompt": [1, 2]}, "prompt", "unsupported_parameter"),
    ({"model": "gen", "prompt": "x", "frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ({"model": "gen", "prompt": "x", "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"model": "gen", "prompt": "x", "max_tokens": 10**9}, "max_tokens", "invalid_value"),
    ({"model": "gen", "prompt": "x", "max_tokens": "8"}, "max_tokens", "invalid_type"),
    ({"model": "gen", "prompt": "x", "temperature": 3}, "temperature", "invalid_value"),
    ({"model": "gen", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"model": "gen", "prompt": "x", "stop": ["a" * 300]}, "stop", "invalid_value"),
    ({"model": "gen", "prompt": "x", "stream": "yes"}, "stream", "invalid_type"),
    ({"model": "gen", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", None),
    ({"model": "gen"}, "prompt", "invalid_type"),
    ({"prompt": "x"}, "model", "invalid_type"),
])
def test_bad_completion_requests(raw, body, param, code):
    error = _error(raw.post("/completions", json=body), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "gen", "messages": []}, "messages"),
    ({"model": "gen", "messages": [{"role": "user", "content": "x"}] * 1025}, "messages"),
    ({"model": "gen", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"model": "gen", "messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages[0]"),
    ({"model": "gen", "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": "gen", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"model": "gen", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"model": "gen", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
     "response_format"),
])
def test_bad_chat_requests(raw, body, param):
    assert _error(raw.post("/chat/completions", json=body), 400)["param"] == param


def test_unknown_and_non_text_models(raw, client):
    for name in ("nope", "identity_fp32"):
        error = _error(raw.post("/completions", json={"model": name, "prompt": "x"}), 404)
        assert error["code"] == "model_not_found" and error["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="gen", prompt="x", n=2)
    assert info.value.param == "n"


def test_bad_bodies_routes_and_methods(raw):
    _error(raw.post("/completions", content=b"{not json", headers={"content-type": "application/json"}), 400)
    _error(raw.post("/completions", content=b"[1, 2]"), 400)
    _error(raw.post("/completions", content=b""), 400)
    big = json.dumps({"model": "gen", "prompt": "x" * (4 * 1024 * 1024)}).encode()
    assert "exceeds the limit" in _error(raw.post("/completions", content=big), 413)["message"]
    _error(raw.post("/completions", content=b'{"model": "gen", "prompt": "x"}',
                    headers={"content-encoding": "gzip"}), 400)
    _error(raw.get("/completions"), 405)
    _error(raw.post("/models"), 405)
    _error(raw.post("/embeddings", json={"model": "gen", "input": "x"}), 404)
    assert raw.post("/completions", json={"model": "gen", "prompt": "two one"}).json()["choices"][0]["text"] == \
        "one two"


# ---- on the HTTP port ------------------------------------------------------------------------------


def test_routes_on_the_http_port(server):
    """The same routes under /v1 on the KServe HTTP port (next to /v2)."""
    with openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0, timeout=30) as c:
        assert [m.id for m in c.models.list().data] == sorted(MODELS)
        assert c.completions.create(model="gen", prompt="one two").choices[0].text == "two one"
        chunks = list(c.chat.completions.create(model="gen", stream=True,
                                                messages=[{"role": "user", "content": "three"}]))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == answer("user: three\nassistant:")
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("identity_fp32")
    assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200


def test_restricted_api_covers_v1(tmp_path):
    """--http-restricted-api: /v1/models is `metadata`, completions are `inference`, on the HTTP
    port and on the OpenAI port alike (the OpenAI port once served them to anyone)."""
    from e2e.conftest import start_server

    s = start_server("--http-restricted-api", "inference:key=secret", "--http-restricted-api", "metadata:meta=m",
                     "--openai-port", "0", "--allow-grpc=false", "--allow-metrics=false",
                     repo=_build_repo(tmp_path), timeout=120)
    try:
        openai_port = re.search(r"Started OpenAIFrontend at [\d.]+:(\d+)", s.log()).group(1)
        for url in (f"http://{s.http_url}/v1", f"http://127.0.0.1:{openai_port}/v1"):
            for path in ("/models", "/models/gen"):
                r = httpx.get(url + path)
                assert r.status_code == 403 and "expecting header 'meta'" in r.text, (url, path, r.text)
                assert httpx.get(url + path, headers={"meta": "m"}).status_code == 200
            for path in ("/completions", "/chat/completions"):
                for headers in ({}, {"key": "wrong"}, {"meta": "m"}):
                    r = httpx.post(url + path, json={"model": "gen", "prompt": "x"}, headers=headers)
                    assert r.status_code == 403 and "expecting header 'key'" in r.text, (url, path, headers)
            ok = httpx.post(f"{url}/completions", json={"model": "gen", "prompt": "one two"},
                            headers={"key": "secret"})
            assert ok.json()["choices"][0]["text"] == "two one"
            with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30) as c:
                with pytest.raises(openai.PermissionDeniedError):
                    c.completions.create(model="gen", prompt="one two")
            with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30,
                               default_headers={"key": "secret"}) as c:
                assert c.completions.create(model="gen", prompt="one two").choices[0].text == "two one"
    finally:
        s.stop()
