"""The OpenAI-compatible front end as an ASGI application over the server facade.

Routes: ``GET /v1/models`` (every ready text model, see :mod:`trident.openai.api`), ``GET
/v1/models/{model}``, ``POST /v1/completions`` and ``POST /v1/chat/completions``, with
``stream`` false (one JSON object) or true (server-sent events, one ``data: {chunk}`` per model
response, a last chunk with ``finish_reason``, the usage chunk when
``stream_options.include_usage``, then ``data: [DONE]``).

* Errors are OpenAI's ``{"error": {...}}`` (:func:`trident.openai.api.error_of`); one that
  happens once a stream has started is sent in-band as ``data: {"error": {...}}`` and ends it.
* The body is limited to :data:`~trident.openai.api.MAX_BODY_BYTES` (413) before it is read.
* A client that disconnects (or stops reading: its send fails) cancels the inference: a queued
  request is dropped, a running decoupled model sees ``is_cancelled()`` and its remaining
  responses are discarded.
* Chat templates and tokenizers are read from the model folder once per loaded version, and
  templates render and tokenizers count in worker threads (a limiter of 2).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import trio

from trident.errors import Code, TritonError, http_status
from trident.http.asgi import ASGIApp, Receive, Scope, Send
from trident.http.generate import ClientGone, infer_watching, send_body
from trident.http.infer import HTTPError
from trident.openai import api
from trident.openai.template import Assets, load_assets
from trident.protocol import kserve
from trident.protocol.generate import flag_only
from trident.restricted import HTTP_MESSAGE, Restrictions
from trident.types import InferenceResponse

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.openai")


PREFIX = "/v1"
_MODEL_RE = re.compile(r"/v1/models/([^/]+)")
_NOT_FOUND = HTTPError(404, "Not Found")
_NOT_ALLOWED = HTTPError(405, "Method Not Allowed")


class _Disconnected(Exception):
    """The client went away while the request body was being read."""


def _too_large(size: int, limit: int) -> HTTPError:
    return HTTPError(413, f"request body of {size} bytes exceeds the limit of {limit} bytes")


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body. Raises HTTPError(413) as soon as it would exceed ``limit`` (from
    ``Content-Length`` before any byte is read), OpenAIError for a bad ``Content-Length`` or
    content encoding, _Disconnected."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise api.invalid("Content-Length is not a number") from None
            if length > limit:
                raise _too_large(length, limit)
        elif key == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
            raise api.invalid("Unsupported content-encoding, only 'identity' is supported.")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            parts.append(bytes(chunk))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _send_json(send: Send, value: Any, status: int = 200) -> None:
    body = kserve.dumps(value)
    await send({"type": "http.response.start", "status": status,
                "headers": [*api.JSON_HEADERS, (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def restricted_category(path: str) -> str:
    """The restricted-API group (``--http-restricted-api``) of an OpenAI route: ``metadata``
    for ``/v1/models...``, ``inference`` for everything else under ``/v1``."""
    return "metadata" if path.startswith(PREFIX + "/models") else "inference"


def make_openai_app(server: Server, *, max_body: int = api.MAX_BODY_BYTES,
                    max_answer: int = api.MAX_ANSWER_CHARS, restrictions: Restrictions | None = None) -> ASGIApp:
    """The ASGI application of the OpenAI routes under ``/v1`` for ``server``.

    ``max_body`` bounds a request body (bytes), ``max_answer`` an answer (characters).
    ``restrictions`` (``--http-restricted-api``; the OpenAI port passes the HTTP port's) make
    a request of a restricted group without its header a 403, before anything is read.

    Nothing is read or started until a request arrives; the application holds no task.
    """
    created = int(time.time())
    limiter = trio.CapacityLimiter(2)
    cache: dict[str, tuple[Any, Assets]] = {}

    def text_model(name: str) -> Any:
        """The ready version of a text model. Raises OpenAIError(NOT_FOUND), TritonError(UNAVAILABLE)."""
        try:
            mv = server.repository.get(name, "")
        except TritonError as e:
            if e.code is Code.NOT_FOUND or e.code is Code.INVALID_ARG:
                raise api.model_not_found(name) from None
            raise
        if not api.is_text_model(mv.inputs, mv.outputs):
            raise api.model_not_found(name)
        return mv

    def text_models() -> list[str]:
        names = {mv.name for mv in server.repository.serving()
                 if mv.state == "READY" and api.is_text_model(mv.inputs, mv.outputs)}
        return sorted(names)

    async def assets_for(mv: Any) -> Assets:
        hit = cache.get(mv.name)
        if hit is not None and hit[0] is mv:
            return hit[1]
        assets = await trio.to_thread.run_sync(load_assets, getattr(mv, "model_dir", None), limiter=limiter)
        cache[mv.name] = (mv, assets)
        return assets

    async def completion(receive: Receive, send: Send, gen: api.Generation) -> None:
        mv = text_model(gen.model)
        assets = await assets_for(mv)
        if gen.chat:
            gen.prompt = await trio.to_thread.run_sync(assets.prompt, gen.messages, limiter=limiter)
        prompt_tokens = None
        if assets.tokenizer is not None:
            prompt_tokens = await trio.to_thread.run_sync(assets.count, gen.prompt, limiter=limiter)
        rid = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex
        request = api.build_request(gen, mv.inputs, mv.max_batch_size, rid)
        pieces: list[str] = []
        size = 0

        def keep_text(text: str) -> None:
            nonlocal size
            size += len(text)
            if size > max_answer:
                raise api.OpenAIError(Code.INTERNAL, f"the model's answer exceeds {max_answer} characters")
            pieces.append(text)

        async def tokens() -> int:
            if assets.tokenizer is None:
                return sum(1 for p in pieces if p)
            count = await trio.to_thread.run_sync(assets.count, "".join(pieces), limiter=limiter)
            return int(count or 0)

        if not gen.stream:
            async def keep(response: InferenceResponse) -> None:
                if flag_only(response):
                    return
                if response.error is not None:
                    raise response.error
                keep_text(api.output_text(response.outputs))

            await infer_watching(server, request, receive, keep)
            count = await tokens()
            use = api.usage(prompt_tokens, count if assets.tokenizer is not None else None)
            await _send_json(send, api.response_object(gen, rid, created_now(), "".join(pieces),
                                                       api.finish_reason(gen, count), use))
            return

        stamp = created_now()
        started = False

        async def start() -> None:
            nonlocal started
            started = True
            try:
                await send({"type": "http.response.start", "status": 200, "headers": list(api.SSE_HEADERS)})
            except trio.Cancelled:
                raise
            except Exception as e:
                raise ClientGone from e
            if gen.chat:
                await send_body(send, api.sse(api.chunk(gen, rid, stamp, "", first=True)))

        async def emit(response: InferenceResponse) -> None:
            if flag_only(response):
                return
            if response.error is not None:
                raise response.error
            text = api.output_text(response.outputs)
            keep_text(text)
            if not started:
                await start()
            if text:
                await send_body(send, api.sse(api.chunk(gen, rid, stamp, text)))

        try:
            await infer_watching(server, request, receive, emit)
        except TritonError as e:
            if not started:
                raise
            await send_body(send, api.sse(api.error_of(e)[1]), False)
            return
        if not started:
            await start()
        count = await tokens()
        last = api.chunk(gen, rid, stamp, None if gen.chat else "", api.finish_reason(gen, count))
        body = api.sse(last)
        if gen.include_usage:
            use = api.usage(prompt_tokens, count if assets.tokenizer is not None else None)
            body += api.sse(api.usage_chunk(gen, rid, stamp, use))
        await send_body(send, body + api.DONE, False)

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if restrictions:
            refused = restrictions.refused(restricted_category(path), scope["headers"])
            if refused is not None:
                raise HTTPError(403, HTTP_MESSAGE.format(refused.header))
        if path == "/v1/models":
            if method != "GET":
                raise _NOT_ALLOWED
            await _send_json(send, {"object": "list", "data": [api.model_object(n, created) for n in text_models()]})
        elif (match := _MODEL_RE.fullmatch(path)) is not None:
            if method != "GET":
                raise _NOT_ALLOWED
            mv = text_model(unquote(match.group(1)))
            await _send_json(send, api.model_object(mv.name, created))
        elif path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                raise _NOT_ALLOWED
            body = await _read_body(scope, receive, max_body)
            if not body:
                raise api.invalid("the request body is empty")
            doc = kserve.parse_json(body)
            gen = api.parse_chat(doc) if path == "/v1/chat/completions" else api.parse_completion(doc)
            try:
                await completion(receive, send, gen)
            except ClientGone:
                log.debug("OpenAI client for model '%s' went away", gen.model)
        else:
            raise _NOT_FOUND

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await route(scope, receive, send)
        except _Disconnected:
            return
        except Exception as exc:
            status, payload = _error_reply(exc, scope.get("method", ""), scope.get("path", ""))
            try:
                await _send_json(send, payload, status)
            except Exception:  # the response had started, or the connection is gone
                log.debug("could not send the error response (%d %r)", status, payload, exc_info=True)

    return app


def created_now() -> int:
    return int(time.time())


def _error_reply(exc: Exception, method: str, path: str) -> tuple[int, dict[str, Any]]:
    """The status and OpenAI error object for an exception raised while handling a request."""
    if isinstance(exc, TritonError):
        return api.error_of(exc)
    if isinstance(exc, HTTPError):
        code = "not_found" if exc.status == http_status(Code.NOT_FOUND) else None
        return exc.status, api.error_payload(exc.message, Code.INVALID_ARG, None, code or "invalid_request")
    log.error("unexpected error handling %s %s", method, path, exc_info=exc)
    return http_status(Code.INTERNAL), api.error_payload(
        f"internal server error: {type(exc).__name__}: {exc}", Code.INTERNAL)


def mount(openai_app: ASGIApp, other: ASGIApp) -> ASGIApp:
    """An ASGI application that sends ``/v1`` and ``/v1/...`` to ``openai_app`` and every other
    request (and the lifespan) to ``other``: the OpenAI routes on the KServe HTTP port."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == PREFIX or path.startswith(PREFIX + "/"):
            await openai_app(scope, receive, send)
        else:
            await other(scope, receive, send)

    return app
