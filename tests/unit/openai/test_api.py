"""The OpenAI wire, sans-IO (trident.openai.api): validation, bounds, the model inputs, the
response and chunk objects, the error shape."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trident.errors import Code, TritonError
from trident.openai import api
from trident.types import Tensor, TensorSpec


def _specs(*names: str, optional: bool = True) -> dict[str, TensorSpec]:
    types = {"text_input": "BYTES", "stream": "BOOL", "sampling_parameters": "BYTES",
             "exclude_input_in_output": "BOOL"}
    return {n: TensorSpec(n, types.get(n, "FP32"), [1], optional=optional and n != "text_input") for n in names}


def test_completion_maps_sampling_parameters() -> None:
    gen = api.parse_completion({"model": "m", "prompt": ["hi"], "max_tokens": 5, "temperature": 0, "top_p": 1,
                                "stop": "x", "n": 1, "seed": 3, "presence_penalty": -1, "user": "u",
                                "stream": True, "stream_options": {"include_usage": True}})
    assert (gen.model, gen.prompt, gen.stream, gen.include_usage, gen.max_tokens) == ("m", "hi", True, True, 5)
    assert gen.sampling == {"max_tokens": 5, "temperature": 0.0, "top_p": 1.0, "presence_penalty": -1.0,
                            "seed": 3, "stop": ["x"], "n": 1}


@pytest.mark.parametrize(("doc", "code", "param"), [
    ({"model": "m", "prompt": "x", "n": 3}, Code.UNSUPPORTED, "n"),
    ({"model": "m", "prompt": "x", "logit_bias": {"1": 2}}, Code.UNSUPPORTED, "logit_bias"),
    ({"model": "m", "prompt": "x", "max_tokens": api.MAX_TOKENS + 1}, Code.INVALID_ARG, "max_tokens"),
    ({"model": "m", "prompt": "x", "max_tokens": True}, Code.INVALID_ARG, "max_tokens"),
    ({"model": "m", "prompt": "x", "temperature": float("nan")}, Code.INVALID_ARG, "temperature"),
    ({"model": "m", "prompt": "x", "stop": [""]}, Code.INVALID_ARG, "stop"),
    ({"model": "m", "prompt": "x", "stop": [1]}, Code.INVALID_ARG, "stop"),
    ({"model": "m", "prompt": "x", "oops": 1}, Code.INVALID_ARG, "oops"),
    ({"model": "", "prompt": "x"}, Code.INVALID_ARG, "model"),
    ({"model": "m", "prompt": None}, Code.INVALID_ARG, "prompt"),
])
def test_bad_completions(doc: dict, code: Code, param: str) -> None:
    with pytest.raises(api.OpenAIError) as info:
        api.parse_completion(doc)
    assert (info.value.code, info.value.param) == (code, param)


def test_chat_messages_and_bounds() -> None:
    gen = api.parse_chat({"model": "m", "max_completion_tokens": 4, "tool_choice": "none", "logprobs": False,
                          "messages": [{"role": "system", "content": "s"},
                                       {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"},
                                                                                   {"type": "text", "text": "b"}]},
                                       {"role": "assistant", "content": None}]})
    assert gen.chat and gen.max_tokens == 4 and gen.sampling == {"max_tokens": 4}
    assert gen.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "ab", "name": "ann"},
                            {"role": "assistant", "content": ""}]
    with pytest.raises(api.OpenAIError, match="at most"):
        api.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}] * (api.MAX_MESSAGES + 1)})
    with pytest.raises(api.OpenAIError) as info:
        api.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
    assert info.value.code is Code.UNSUPPORTED
    with pytest.raises(api.OpenAIError, match="only allowed when 'stream' is true"):
        api.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}],
                        "stream_options": {"include_usage": True}})


def test_text_signature() -> None:
    assert api.is_text_model(_specs("text_input", "stream", "sampling_parameters"), {"text_output":
                             TensorSpec("text_output", "BYTES", [-1])})
    assert not api.is_text_model(_specs("text_input"), {"text_output": TensorSpec("text_output", "FP32", [1])})
    # another input that is required: the front end cannot feed it
    required = {**_specs("text_input"), "bias": TensorSpec("bias", "FP32", [1])}
    assert not api.is_text_model(required, {"text_output": TensorSpec("text_output", "BYTES", [1])})
    wrong = {**_specs("text_input"), "stream": TensorSpec("stream", "INT32", [1], optional=True)}
    assert not api.is_text_model(wrong, {"text_output": TensorSpec("text_output", "BYTES", [1])})


def test_request_feeds_the_inputs_the_model_declares() -> None:
    gen = api.parse_completion({"model": "m", "prompt": "héllo", "max_tokens": 2, "stream": True})
    request = api.build_request(gen, _specs("text_input", "stream", "sampling_parameters",
                                            "exclude_input_in_output"), 4, "cmpl-1")
    by_name = {t.name: t for t in request.inputs}
    assert by_name["text_input"].shape == (1, 1) and by_name["text_input"].data[0, 0] == "héllo".encode()
    assert by_name["stream"].data.dtype == np.bool_ and bool(by_name["stream"].data[0, 0])
    assert json.loads(by_name["sampling_parameters"].data[0, 0]) == {"max_tokens": 2}
    assert bool(by_name["exclude_input_in_output"].data[0, 0])  # echo is off: exclude the input
    assert request.id == "cmpl-1" and request.model_name == "m"
    bare = api.build_request(gen, _specs("text_input"), 0, "x")
    assert [t.name for t in bare.inputs] == ["text_input"] and bare.inputs[0].shape == (1,)
    with pytest.raises(api.OpenAIError, match="echo"):
        api.build_request(api.parse_completion({"model": "m", "prompt": "x", "echo": True}), _specs("text_input"),
                          0, "x")


def test_output_text() -> None:
    out = Tensor("text_output", "BYTES", (2,), np.array([b"ab", b"c"], dtype=object))
    assert api.output_text([out]) == "abc"
    assert api.output_text([]) == ""
    bad = Tensor("text_output", "BYTES", (1,), np.array([b"\xff"], dtype=object))
    with pytest.raises(api.OpenAIError) as info:
        api.output_text([bad])
    assert info.value.code is Code.INTERNAL


def test_objects_and_chunks() -> None:
    chat = api.parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                           "stream": True, "stream_options": {"include_usage": True}})
    assert api.finish_reason(chat, 3) == "length" and api.finish_reason(chat, 2) == "stop"
    first = api.chunk(chat, "id", 1, "", first=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""} and first["usage"] is None
    last = api.chunk(chat, "id", 1, None, "stop")
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert api.usage_chunk(chat, "id", 1, api.usage(2, 3))["usage"] == {"prompt_tokens": 2, "completion_tokens": 3,
                                                                         "total_tokens": 5}
    assert api.usage(None, 3) is None
    done = api.response_object(chat, "id", 1, "hi", "stop", None)
    assert done["object"] == "chat.completion" and done["choices"][0]["message"] == {"role": "assistant",
                                                                                     "content": "hi"}
    assert api.sse({"a": 1}) == b'data: {"a":1}\n\n'


def test_error_shape_and_status() -> None:
    assert api.error_of(api.unsupported_param("n")) == (400, {"error": {
        "message": "'n' is not supported", "type": "invalid_request_error", "param": "n",
        "code": "unsupported_parameter"}})
    status, payload = api.error_of(api.model_not_found("x"))
    assert status == 404 and payload["error"]["code"] == "model_not_found"
    status, payload = api.error_of(TritonError(Code.UNAVAILABLE, "busy"))
    assert status == 503 and payload["error"] == {"message": "busy", "type": "server_error", "param": None,
                                                  "code": "unavailable"}
