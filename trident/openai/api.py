"""The OpenAI API's wire, sans-IO: requests in, model inputs, response objects and errors out.

A text model (Triton's convention for models other than TensorRT-LLM) has a ``text_input``
BYTES input and a ``text_output`` BYTES output, and optionally ``stream`` BOOL,
``sampling_parameters`` BYTES (one JSON object) and ``exclude_input_in_output`` BOOL inputs.
Every other input it declares must be optional. A request becomes one inference request
feeding the inputs the model declares: the prompt (for chat, the rendered chat template),
``stream``, the sampling parameters the client gave (``max_tokens``, ``temperature``,
``top_p``, ``stop``, ``n``, ``seed``, ``frequency_penalty``, ``presence_penalty``) and
``exclude_input_in_output`` (true unless a completion asks for ``echo``).

Each response's ``text_output`` is the text that follows what came before (a delta): a
streaming request sends one chunk per response, a non-streaming one joins them.

Limits (every size and count a client controls): the body (:data:`MAX_BODY_BYTES`),
``max_tokens`` (:data:`MAX_TOKENS`), messages (:data:`MAX_MESSAGES`), stop sequences
(:data:`MAX_STOP`, each at most :data:`MAX_STOP_CHARS`), ``n`` = 1; and an answer holds at most
:data:`MAX_ANSWER_CHARS` characters (a model past it is cancelled, the request fails with INTERNAL).

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with the HTTP
status of the error's Triton code, except that UNSUPPORTED answers 400 as the OpenAI API does
for a parameter it cannot honour (a 5xx would make the official clients retry).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trident.errors import Code, TritonError, http_status
from trident.protocol import kserve
from trident.types import InferenceRequest, Tensor, TensorSpec

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_TOKENS = 32768
MAX_MESSAGES = 1024
MAX_STOP = 4
MAX_STOP_CHARS = 256
MAX_SEED = 2**63 - 1
MAX_ANSWER_CHARS = 16 * 1024 * 1024  # what one answer may hold (the model's bound, kept for usage)

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
STREAM = "stream"
SAMPLING = "sampling_parameters"
EXCLUDE_INPUT = "exclude_input_in_output"
_OPTIONAL_INPUTS = {STREAM: "BOOL", SAMPLING: "BYTES", EXCLUDE_INPUT: "BOOL"}

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
JSON_HEADERS = [(b"content-type", b"application/json")]

ROLES = ("system", "developer", "user", "assistant")


class OpenAIError(TritonError):
    """A TritonError that names the request field at fault (``param``) and OpenAI's ``code``."""

    def __init__(self, code: Code, message: str, param: str | None = None, oa_code: str | None = None) -> None:
        super().__init__(code, message)
        self.param = param
        self.oa_code = oa_code


def invalid(message: str, param: str | None = None, oa_code: str | None = None) -> OpenAIError:
    return OpenAIError(Code.INVALID_ARG, message, param, oa_code)


def unsupported_param(param: str, why: str = "") -> OpenAIError:
    return OpenAIError(Code.UNSUPPORTED, f"'{param}' is not supported{': ' + why if why else ''}", param,
                       "unsupported_parameter")


def model_not_found(name: str) -> OpenAIError:
    return OpenAIError(Code.NOT_FOUND, f"The model '{name}' does not exist or is not a text model "
                       "(text_input and text_output BYTES)", "model", "model_not_found")


# ---- errors ------------------------------------------------------------------------------------


def status_of(code: Code) -> int:
    """The HTTP status of an error code on this wire (UNSUPPORTED answers as INVALID_ARG)."""
    return http_status(Code.INVALID_ARG if code is Code.UNSUPPORTED else code)


def error_payload(message: str, code: Code = Code.INVALID_ARG, param: str | None = None,
                  oa_code: str | None = None) -> dict[str, Any]:
    kind = {Code.INTERNAL: "server_error", Code.UNAVAILABLE: "server_error",
            Code.UNKNOWN: "server_error"}.get(code, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": oa_code or code.value.lower()}}


def error_of(exc: TritonError) -> tuple[int, dict[str, Any]]:
    """The status and OpenAI error object of a TritonError (an OpenAIError keeps its param)."""
    param = getattr(exc, "param", None)
    oa_code = getattr(exc, "oa_code", None)
    return status_of(exc.code), error_payload(exc.message, exc.code, param, oa_code)


def sse(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event: ``data: {json}`` and a blank line."""
    return b"data: " + kserve.dumps(payload) + b"\n\n"


# ---- requests ----------------------------------------------------------------------------------


@dataclass
class Generation:
    """A validated completions or chat completions request."""

    chat: bool
    model: str
    prompt: str = ""  # completions: the prompt; chat: filled in from the template
    messages: list[dict[str, str]] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)


# keys accepted and ignored (they carry no generation behaviour)
_IGNORED = {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"}
_SAMPLING_COMMON = ("model", "max_tokens", "temperature", "top_p", "stop", "n", "stream", "stream_options", "seed",
                    "frequency_penalty", "presence_penalty", "logprobs", "logit_bias")
# key -> a predicate: the value is a harmless default, anything else is UNSUPPORTED
_COMPLETION_ONLY_DEFAULT = {
    "best_of": lambda v: v in (None, 1),
    "suffix": lambda v: v in (None, ""),
}
_CHAT_ONLY_DEFAULT = {
    "top_logprobs": lambda v: v in (None, 0),
    "tools": lambda v: v in (None, []),
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "parallel_tool_calls": lambda v: v is None or isinstance(v, bool),
    "functions": lambda v: v in (None, []),
    "function_call": lambda v: v in (None, "none", "auto"),
    "response_format": lambda v: v is None or v == {"type": "text"},
    "modalities": lambda v: v in (None, ["text"]),
    "audio": lambda v: v is None,
    "prediction": lambda v: v is None,
    "reasoning_effort": lambda v: v is None,
    "web_search_options": lambda v: v is None,
    "verbosity": lambda v: v is None,
}


def _check_keys(doc: dict[str, Any], allowed: set[str], defaults: dict[str, Any]) -> None:
    for key, value in doc.items():
        if key in allowed or key in _IGNORED:
            continue
        check = defaults.get(key)
        if check is None:
            raise invalid(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
        if not check(value):
            raise unsupported_param(key)


def _integer(doc: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{key}' must be an integer", key, "invalid_type")
    if not lo <= value <= hi:
        raise invalid(f"'{key}' must be between {lo} and {hi}, got {value}", key, "invalid_value")
    return value


def _number(doc: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"'{key}' must be a number", key, "invalid_type")
    if not lo <= value <= hi:
        raise invalid(f"'{key}' must be between {lo:g} and {hi:g}, got {value:g}", key, "invalid_value")
    return float(value)


def _boolean(doc: dict[str, Any], key: str) -> bool:
    value = doc.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"'{key}' must be a boolean", key, "invalid_type")
    return value


def _stop(doc: dict[str, Any]) -> list[str] | None:
    value = doc.get("stop")
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("'stop' must be a string or a list of strings", "stop", "invalid_type")
    if len(stops) > MAX_STOP:
        raise invalid(f"'stop' holds at most {MAX_STOP} sequences, got {len(stops)}", "stop", "invalid_value")
    for s in stops:
        if not s or len(s) > MAX_STOP_CHARS:
            raise invalid(f"each 'stop' sequence must be 1 to {MAX_STOP_CHARS} characters", "stop", "invalid_value")
    return stops


def _common(doc: dict[str, Any], chat: bool) -> Generation:
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' must be a non-empty string", "model", "invalid_type")
    gen = Generation(chat=chat, model=model, stream=_boolean(doc, "stream"))
    options = doc.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or any(k not in ("include_usage", "include_obfuscation") for k in options):
            raise invalid("'stream_options' must be an object with 'include_usage'", "stream_options")
        if not gen.stream:
            raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
        gen.include_usage = _boolean(options, "include_usage")
    n = _integer(doc, "n", 1, 128)
    if n is not None and n != 1:
        raise unsupported_param("n", "only n=1 is served")
    key = "max_completion_tokens" if chat and doc.get("max_completion_tokens") is not None else "max_tokens"
    gen.max_tokens = _integer(doc, key, 1, MAX_TOKENS)
    sampling: dict[str, Any] = {}
    if gen.max_tokens is not None:
        sampling["max_tokens"] = gen.max_tokens
    for name, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0),
                         ("frequency_penalty", -2.0, 2.0), ("presence_penalty", -2.0, 2.0)):
        value = _number(doc, name, lo, hi)
        if value is not None:
            sampling[name] = value
    seed = _integer(doc, "seed", -MAX_SEED, MAX_SEED)
    if seed is not None:
        sampling["seed"] = seed
    stops = _stop(doc)
    if stops is not None:
        sampling["stop"] = stops
    if n is not None:
        sampling["n"] = n
    bias = doc.get("logit_bias")
    if bias not in (None, {}):
        raise unsupported_param("logit_bias")
    logprobs = doc.get("logprobs")
    if logprobs not in (None, False, 0):
        raise unsupported_param("logprobs")
    gen.sampling = sampling
    return gen


def parse_completion(doc: Any) -> Generation:
    """A ``/v1/completions`` body. Raises OpenAIError (INVALID_ARG, UNSUPPORTED)."""
    if not isinstance(doc, dict):
        raise invalid("the request body must be a JSON object")
    _check_keys(doc, {*_SAMPLING_COMMON, "prompt", "echo"}, _COMPLETION_ONLY_DEFAULT)
    gen = _common(doc, chat=False)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        raise unsupported_param("prompt", "a list of several prompts (one prompt per request)")
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) or isinstance(p, list) for p in prompt):
        raise unsupported_param("prompt", "token ids (send text)")
    if not isinstance(prompt, str):
        raise invalid("'prompt' must be a string", "prompt", "invalid_type")
    gen.prompt = prompt
    gen.echo = _boolean(doc, "echo")
    return gen


def _content(message: dict[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None:
        if message.get("role") == "assistant":
            return ""
        raise invalid(f"messages[{index}].content is required", f"messages[{index}].content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise unsupported_param(f"messages[{index}].content", f"content parts of type '{kind}' (text only)")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid(f"messages[{index}].content must be a string or a list of text parts",
                  f"messages[{index}].content", "invalid_type")


def parse_chat(doc: Any) -> Generation:
    """A ``/v1/chat/completions`` body. Raises OpenAIError (INVALID_ARG, UNSUPPORTED)."""
    if not isinstance(doc, dict):
        raise invalid("the request body must be a JSON object")
    _check_keys(doc, {*_SAMPLING_COMMON, "messages", "max_completion_tokens"}, _CHAT_ONLY_DEFAULT)
    gen = _common(doc, chat=True)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list", "messages", "invalid_type")
    if len(messages) > MAX_MESSAGES:
        raise invalid(f"'messages' holds at most {MAX_MESSAGES} messages, got {len(messages)}", "messages",
                      "invalid_value")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
        role = message.get("role")
        if role == "tool" or message.get("tool_calls") or message.get("function_call"):
            raise unsupported_param(f"messages[{i}]", "tool and function calls")
        if role not in ROLES:
            raise invalid(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role",
                          "invalid_value")
        entry = {"role": role, "content": _content(message, i)}
        name = message.get("name")
        if isinstance(name, str):
            entry["name"] = name
        gen.messages.append(entry)
    return gen


# ---- models ------------------------------------------------------------------------------------


def is_text_model(inputs: Mapping[str, TensorSpec], outputs: Mapping[str, TensorSpec]) -> bool:
    """The model has Triton's text signature (see the module docstring)."""
    text_in = inputs.get(TEXT_INPUT)
    text_out = outputs.get(TEXT_OUTPUT)
    if text_in is None or text_in.datatype != "BYTES" or text_out is None or text_out.datatype != "BYTES":
        return False
    for name, spec in inputs.items():
        if name == TEXT_INPUT:
            continue
        wanted = _OPTIONAL_INPUTS.get(name)
        if wanted is None and not spec.optional:
            return False
        if wanted is not None and spec.datatype != wanted:
            return False
    return True


def _shape(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    dims = [1 if d == -1 else d for d in spec.dims]
    shape = ([1] if batched else []) + dims
    if int(np.prod(shape)) != 1:
        raise invalid(f"input '{spec.name}' must hold one element (its dims are {spec.dims})")
    return tuple(shape)


def build_request(gen: Generation, inputs: Mapping[str, TensorSpec], max_batch_size: int,
                  request_id: str) -> InferenceRequest:
    """The inference request for ``gen`` (its ``prompt`` already rendered) on a text model.

    Raises OpenAIError(UNSUPPORTED) for ``echo`` on a model without ``exclude_input_in_output``.
    """
    batched = max_batch_size > 0
    values: dict[str, tuple[str, Any]] = {TEXT_INPUT: ("BYTES", gen.prompt.encode())}
    if STREAM in inputs:
        values[STREAM] = ("BOOL", gen.stream)
    if SAMPLING in inputs:
        values[SAMPLING] = ("BYTES", json.dumps(gen.sampling).encode())
    if EXCLUDE_INPUT in inputs:
        values[EXCLUDE_INPUT] = ("BOOL", not gen.echo)
    elif gen.echo:
        raise unsupported_param("echo", f"the model has no '{EXCLUDE_INPUT}' input")
    tensors = []
    for name, (datatype, value) in values.items():
        shape = _shape(inputs[name], batched)
        array = np.empty(shape, dtype=object) if datatype == "BYTES" else np.empty(shape, dtype=np.bool_)
        array.reshape(-1)[0] = value
        tensors.append(Tensor(name, datatype, shape, array))
    return InferenceRequest(model_name=gen.model, inputs=tensors, id=request_id)


def output_text(outputs: list[Tensor]) -> str:
    """The ``text_output`` of one response ("" without one). Raises OpenAIError(INTERNAL) for
    bytes that are not UTF-8."""
    for tensor in outputs:
        if tensor.name == TEXT_OUTPUT:
            try:
                return "".join(bytes(x).decode() if isinstance(x, (bytes, bytearray, memoryview)) else str(x)
                               for x in tensor.data.reshape(-1))
            except UnicodeDecodeError:
                raise OpenAIError(Code.INTERNAL, f"the model's '{TEXT_OUTPUT}' is not UTF-8 text") from None
    return ""


# ---- responses ---------------------------------------------------------------------------------


def finish_reason(gen: Generation, completion_tokens: int) -> str:
    return "length" if gen.max_tokens is not None and completion_tokens >= gen.max_tokens else "stop"


def usage(prompt_tokens: int | None, completion_tokens: int | None) -> dict[str, int] | None:
    if prompt_tokens is None or completion_tokens is None:
        return None
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_object(gen: Generation, rid: str, created: int, text: str, finish: str,
                    use: dict[str, int] | None) -> dict[str, Any]:
    """The non-streaming answer (``text_completion`` or ``chat.completion``)."""
    if gen.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion" if gen.chat else "text_completion", "created": created,
            "model": gen.model, "choices": [choice], "usage": use, "system_fingerprint": None}


def chunk(gen: Generation, rid: str, created: int, text: str | None, finish: str | None = None,
          *, first: bool = False) -> dict[str, Any]:
    """One streamed chunk: a text delta (``text`` None: none), the finish reason on the last."""
    if gen.chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    out = {"id": rid, "object": "chat.completion.chunk" if gen.chat else "text_completion", "created": created,
           "model": gen.model, "choices": [choice], "system_fingerprint": None}
    if gen.include_usage:
        out["usage"] = None
    return out


def usage_chunk(gen: Generation, rid: str, created: int, use: dict[str, int] | None) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
    return {"id": rid, "object": "chat.completion.chunk" if gen.chat else "text_completion", "created": created,
            "model": gen.model, "choices": [], "usage": use, "system_fingerprint": None}


def model_object(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "trident"}
