"""Triton's (provisional) generate extension: ``POST .../generate`` and ``.../generate_stream``.

The JSON mapping of requests and responses is :mod:`trident.protocol.generate`; this module
serves it.

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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from trident.errors import TritonError, generate_http_status, internal
from trident.http.asgi import Receive, Send
from trident.protocol import generate as codec
from trident.protocol import kserve
from trident.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.http")


SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"
_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


# ---- serving -----------------------------------------------------------------------------------


async def infer_watching(server: Server, request: InferenceRequest, receive: Receive,
                        on_response: Callable[[InferenceResponse], Awaitable[None]]) -> None:
    """``server.infer_stream(request, on_response)`` next to a task that cancels it when the
    client disconnects (or ``on_response`` raises ClientGone). When ``on_response`` raises a
    TritonError, the inference is cancelled and that error raised.

    Raises what ``infer_stream`` and ``on_response`` raise, and ClientGone after a disconnect.
    """
    inference = trio.CancelScope()
    gone = False
    error: BaseException | None = None
    refused: TritonError | None = None

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
                inference.cancel()
                return

    async def guarded(response: InferenceResponse) -> None:
        nonlocal gone, refused
        if gone or refused is not None:
            return
        try:
            await on_response(response)
        except ClientGone:
            gone = True
            inference.cancel()
        except TritonError as e:
            refused = e
            inference.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, name="trident.http.watch_disconnect")
        try:
            with inference:
                await server.infer_stream(request, guarded)
        except Exception as exc:  # re-raised outside the nursery (no ExceptionGroup)
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        try:
            raise error
        finally:
            del error  # this frame is in the error's traceback: holding it there would be a cycle
    if gone:
        raise ClientGone
    if refused is not None:
        error = refused
        refused = None
        try:
            raise error
        finally:
            del error


async def send_body(send: Send, body: bytes, more: bool = True) -> None:
    """One ASGI body message. Raises ClientGone when the connection is gone."""
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
        if not codec.flag_only(response):
            responses.append(response)

    await infer_watching(server, request, receive, keep)
    for response in responses:
        if response.error is not None:
            raise response.error
    if len(responses) != 1:
        raise internal(_ONE_RESPONSE)
    body = kserve.dumps(codec.response_json(responses[0]))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send_body(send, body, False)


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
        await send_body(send, b"data: " + kserve.dumps(payload) + b"\n\n", True)

    async def emit(response: InferenceResponse) -> None:
        if codec.flag_only(response):
            return
        if response.error is not None:
            await event({"error": response.error.message}, generate_http_status(response.error.code))
            return
        try:
            payload = codec.response_json(response)
        except TritonError as e:
            payload = {"error": e.message}
        await event(payload)

    try:
        await infer_watching(server, request, receive, emit)
    except TritonError as e:
        if not started:
            raise
        await event({"error": e.message})
    if not started:  # only a flag-only final response: an empty stream
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", SSE_CONTENT_TYPE), (b"cache-control", b"no-cache")]})
    await send_body(send, b"", False)


async def handle(server: Server, receive: Receive, send: Send, name: str, version: str,
                 body: bytes | bytearray, *, streaming: bool) -> None:
    """Serve one generate / generate_stream request whose body has been read.

    Raises TritonError for errors before the response starts (the caller answers them as
    JSON); returns quietly when the client went away.
    """
    doc = kserve.parse_json(body) if body else None
    request = codec.build_request(server.model_metadata(name, version), doc, name, version)
    try:
        if streaming:
            await generate_stream(server, receive, send, request)
        else:
            await generate(server, receive, send, request)
    except ClientGone:
        log.debug("generate client for model '%s' went away", name)
