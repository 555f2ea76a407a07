"""Triton's (provisional) generate extension: ``POST .../generate`` and ``.../generate_stream``.

Request JSON (Triton's "exact mapping"): every top-level key, and every key of the optional
``"parameters"`` object, that names a model input becomes that input tensor; any other key
becomes a request parameter (string, number or boolean). A top-level string ``"id"`` is the
request id. A tensor value is a scalar or a 1-D array; its shape is the input's shape with the
fixed dimensions taken from the config, the innermost variable dimension holding the rest of
the elements and any other variable dimension (the batch dimension) set to 1. So
``{"text_input": "hi", "max_tokens": 8}`` feeds ``text_input`` BYTES [1] and ``max_tokens``.

Response JSON: ``id`` (when set), ``model_name``, ``model_version``, each response parameter,
and each output tensor by name (its data as a JSON array, a lone element unwrapped), so a
``text_output`` BYTES output becomes ``"text_output": "..."``.

* ``generate`` answers ``application/json`` and needs exactly one response (flag-only final
  responses of decoupled models do not count).
* ``generate_stream`` answers ``text/event-stream; charset=utf-8``, one ``data: {...}`` event
  per response as the model produces it (decoupled models included). The status is fixed by the
  first event (200, or 400 when the first response is an error); a later error arrives in-band
  as ``data: {"error": "..."}``. A request that fails before any response gets a plain JSON
  error with the error's status, as every endpoint.
* A client that disconnects cancels the request: a queued one is dropped, a running model sees
  ``is_cancelled()`` and a decoupled model's remaining responses are discarded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import numpy as np
import trio

from trident.errors import TritonError, generate_http_status, internal, invalid_arg
from trident.protocol import kserve
from trident.types import InferenceRequest, InferenceResponse, ParamValue, Tensor

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.http")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


# ---- request mapping ---------------------------------------------------------------------------


def _shape_for(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """Triton's two-pass shape fill: fixed dims divide ``count``, the innermost -1 takes the rest."""
    shape = list(dims)
    remaining = count
    for d in reversed(shape):
        if d != -1:
            if d == 0 or remaining % d:
                raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
            remaining //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = remaining
            remaining = 1
    if remaining != 1:
        raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def _tensor(name: str, datatype: str, dims: list[int], value: Any) -> Tensor:
    data = value if isinstance(value, list) else [value]
    shape = _shape_for(name, dims, len(data))
    count = int(np.prod(shape)) if shape else 1
    array = kserve._json_to_array(name, datatype, shape, count, data)
    return Tensor(name, datatype, shape, array)


def _parameter(key: str, value: Any) -> ParamValue:
    if isinstance(value, (bool, int, float, str)):
        return value
    raise invalid_arg(
        f"Unsupported parameter type for parameter '{key}': expected a string, number or boolean"
    )


def build_request(server: Server, doc: Any, name: str, version: str) -> InferenceRequest:
    """The InferenceRequest for a generate request body (see the module docstring).

    Raises TritonError: NOT_FOUND / UNAVAILABLE for the model, INVALID_ARG for a body that is
    not a JSON object, a bad tensor value or parameter.
    """
    if not isinstance(doc, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected a JSON object")
    metadata = server.model_metadata(name, version)
    specs = {t.name: t for t in metadata.inputs}
    inputs: list[Tensor] = []
    params: dict[str, ParamValue] = {}
    request_id = ""

    def place(key: str, value: Any) -> None:
        spec = specs.get(key)
        if spec is None:
            params[key] = _parameter(key, value)
        else:
            inputs.append(_tensor(key, spec.datatype, list(spec.shape), value))

    for key, value in doc.items():
        if key == "id" and isinstance(value, str) and "id" not in specs:
            request_id = value
        elif key == "parameters":
            if key in specs:
                raise invalid_arg("Keyword 'parameters' for nested schema also given as input tensor name")
            if not isinstance(value, dict):
                raise invalid_arg("Expected JSON object for keyword: 'parameters'")
            for inner, item in value.items():
                place(inner, item)
        else:
            place(key, value)
    return InferenceRequest(model_name=name, inputs=inputs, model_version=version, id=request_id,
                            parameters=params)


# ---- response mapping --------------------------------------------------------------------------


def _flag_only(response: InferenceResponse) -> bool:
    return response.error is None and not response.outputs and response.flag_only


def response_json(response: InferenceResponse) -> dict[str, Any]:
    """The generate response object for one response. Raises TritonError(INTERNAL) for an
    output with no JSON form (BYTES that are not UTF-8, FP16)."""
    out: dict[str, Any] = {}
    if response.id:
        out["id"] = response.id
    out["model_name"] = response.model_name
    out["model_version"] = response.model_version
    out.update(response.parameters)
    for tensor in response.outputs:
        if tensor.datatype == "FP16":
            values: Any = tensor.data.astype(np.float32).reshape(-1).tolist()
        else:
            values = kserve._json_data(tensor.datatype, tensor.data)
            if values is None:
                raise internal(f"output '{tensor.name}' holds bytes that are not UTF-8 text")
            if isinstance(values, np.ndarray):
                values = values.tolist()
        out[tensor.name] = values[0] if len(values) == 1 else values
    return out


# ---- serving -----------------------------------------------------------------------------------


async def _run(server: Server, request: InferenceRequest, receive: Receive,
               send_response: Callable[[InferenceResponse], Awaitable[None]]) -> None:
    """``server.infer_stream`` next to a task that cancels it when the client disconnects.

    Raises what ``infer_stream`` raises, and ClientGone after a disconnect.
    """
    inference = trio.CancelScope()
    gone = False
    error: BaseException | None = None

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
                inference.cancel()
                return

    async def guarded(response: InferenceResponse) -> None:
        nonlocal gone
        try:
            await send_response(response)
        except ClientGone:
            gone = True
            inference.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, name="trident.http.generate.watch_disconnect")
        try:
            with inference:
                await server.infer_stream(request, guarded)
        except Exception as exc:  # re-raised outside the nursery (no ExceptionGroup)
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    if gone:
        raise ClientGone


async def _send_body(send: Send, body: bytes, more: bool) -> None:
    try:
        await send({"type": "http.response.body", "body": body, "more_body": more})
    except trio.Cancelled:
        raise
    except Exception as e:  # the connection is gone
        raise ClientGone from e


async def generate(server: Server, receive: Receive, send: Send, request: InferenceRequest) -> None:
    """Answer ``/generate``: exactly one response as JSON.

    Raises TritonError (before anything is sent) for the request's or the model's error, and
    INTERNAL when the model gives other than one response; ClientGone after a disconnect.
    """
    responses: list[InferenceResponse] = []

    async def keep(response: InferenceResponse) -> None:
        if not _flag_only(response):
            responses.append(response)

    await _run(server, request, receive, keep)
    for response in responses:
        if response.error is not None:
            raise response.error
    if len(responses) != 1:
        raise internal(_ONE_RESPONSE)
    body = kserve.dumps(response_json(responses[0]))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await _send_body(send, body, False)


async def generate_stream(server: Server, receive: Receive, send: Send, request: InferenceRequest) -> None:
    """Answer ``/generate_stream`` with one server-sent event per response.

    Raises TritonError only before the first event; later errors are sent in-band.
    """
    started = False

    async def event(payload: dict[str, Any], status: int = 200) -> None:
        nonlocal started
        if not started:
            started = True
            try:
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", SSE_CONTENT_TYPE), (b"cache-control", b"no-cache")]})
            except trio.Cancelled:
                raise
            except Exception as e:
                raise ClientGone from e
        await _send_body(send, b"data: " + kserve.dumps(payload) + b"\n\n", True)

    async def emit(response: InferenceResponse) -> None:
        if _flag_only(response):
            return
        if response.error is not None:
            await event({"error": response.error.message}, generate_http_status(response.error.code))
            return
        try:
            payload = response_json(response)
        except TritonError as e:
            payload = {"error": e.message}
        await event(payload)

    try:
        await _run(server, request, receive, emit)
    except TritonError as e:
        if not started:
            raise
        await event({"error": e.message})
    if not started:  # only a flag-only final response: an empty stream
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", SSE_CONTENT_TYPE), (b"cache-control", b"no-cache")]})
    await _send_body(send, b"", False)


async def handle(server: Server, receive: Receive, send: Send, name: str, version: str,
                 body: bytes | bytearray, *, streaming: bool) -> None:
    """Serve one generate / generate_stream request whose body has been read.

    Raises TritonError for errors before the response starts (the caller answers them as
    JSON); returns quietly when the client went away.
    """
    request = build_request(server, kserve.parse_json(body) if body else None, name, version)
    try:
        if streaming:
            await generate_stream(server, receive, send, request)
        else:
            await generate(server, receive, send, request)
    except ClientGone:
        log.debug("generate client for model '%s' went away", name)
