"""The KServe v2 HTTP front end as one pure ASGI application (no framework).

``make_app(server)`` returns ``async def app(scope, receive, send)`` serving every endpoint of
Triton's HTTP API (reference §1) over the :class:`~trident.server.Server` facade; the transport
(hypercorn's trio worker, see :mod:`trident.http.serve`) can be swapped without touching routes.

* Routes use Triton's regular expressions; a wrong method is 405 "Method Not Allowed", an
  unmatched path 404 "Not Found". Errors are ``{"error": "<message>"}`` with the status from
  :func:`trident.errors.http_status`; an unexpected exception is a 500, never a crash.
* ``--http-max-input-size`` is enforced from ``Content-Length`` before any body byte is read,
  and while a chunked body streams in.
* ``/infer`` is :class:`trident.http.infer.InferEndpoint` (shared with the ASGI-free fast path
  of trident's own HTTP/1.1 server, :mod:`trident.http.fastserver`, so both answer alike). A
  client that disconnects during ``/infer`` cancels its request: here the inference runs in a
  nursery next to a task that waits for ``http.disconnect``.
* generate / generate_stream are served by :mod:`trident.http.generate` (server-sent events).
* Shared memory (``/v2/{system,cuda}sharedmemory/...``) goes to the server's registry
  (:mod:`trident.server.shared_memory`), shared with gRPC.
* ``/v1`` and ``/v1/...`` are the OpenAI-compatible routes (:mod:`trident.openai.app`, its own
  error shape); ``--http-restricted-api`` groups them as ``metadata`` (``/v1/models``) and
  ``inference``.
"""

from __future__ import annotations

import base64
import logging
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import trio

from trident.config import config_to_json
from trident.errors import HTTP_NOT_READY, invalid_arg, unsupported
from trident.http import generate
from trident.http.asgi import ASGIApp, Receive, Scope, Send
from trident.http.infer import (
    JSON,
    Disconnected,
    HTTPError,
    InferEndpoint,
    InferExchange,
    error_reply,
    too_large,
)
from trident.openai.app import PREFIX as OPENAI_PREFIX
from trident.openai.app import make_openai_app, restricted_category
from trident.protocol import kserve
from trident.types import InferenceResponse

if TYPE_CHECKING:
    from trident.server import RequestHandle, Server

log = logging.getLogger("trident.http")


_MODEL_RE = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
_REPOSITORY_RE = re.compile(r"/v2/repository(?:/([^/]+))?/(?:index|models/([^/]+)/(load|unload))")
_SHM_RE = re.compile(r"/v2/(system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|unregister)")

_JSON = JSON
_EMPTY_OK_HEADERS = [(b"content-length", b"0")]
_JOIN_LIMIT = 1 << 16  # responses smaller than this go out as one body message


_Disconnected = Disconnected
_HTTPError = HTTPError


_NOT_FOUND = _HTTPError(404, "Not Found")
_NOT_ALLOWED = _HTTPError(405, "Method Not Allowed")


# ---- ASGI plumbing ------------------------------------------------------------------------------


async def _send_bytes(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, value: Any, status: int = 200) -> None:
    await _send_bytes(send, status, [_JSON], kserve.dumps(value))


async def _send_error(send: Send, status: int, message: str) -> None:
    await _send_bytes(send, status, [_JSON], kserve.error_body(message))


async def _send_empty(send: Send, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _EMPTY_OK_HEADERS})
    await send({"type": "http.response.body", "body": b""})


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytearray:
    """The whole request body; INVALID_ARG as soon as it would exceed ``limit`` bytes.

    The buffer grows as chunks arrive (a large one is resized in place by the allocator; a
    buffer of the declared length would be zero-filled on the event loop at once).
    """
    length = -1
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise invalid_arg(f"Unable to parse Content-Length, got: {value.decode('latin-1')}") from None
            if length > limit:
                raise _too_large(length, limit)
            break
    body = bytearray()
    filled = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if chunk:
            end = filled + len(chunk)
            if end > limit:
                raise _too_large(end, limit)
            if end <= len(body):
                body[filled:end] = chunk
            else:
                body[filled:] = chunk
            filled = end
        if not message.get("more_body", False):
            if filled < len(body):
                del body[filled:]
            return body


_too_large = too_large


async def _read_json_object(scope: Scope, receive: Receive, limit: int, *, required: bool) -> dict[str, Any]:
    body = await _read_body(scope, receive, limit)
    if not body:
        if required:
            raise invalid_arg("failed to parse the request JSON buffer: the request body is empty")
        return {}
    doc = kserve.parse_json(body)
    if not isinstance(doc, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected a JSON object")
    return doc


async def answer_lifespan(receive: Receive, send: Send) -> None:
    """Answer an ASGI ``lifespan`` scope (nothing to start or stop): returns after shutdown.
    Every ASGI app of trident (this one, the metrics port's) uses it."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _watch_disconnect(receive: Receive, infer_scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            infer_scope.cancel()  # a no-op once the inference is over
            return


async def _wait_watching(handle: RequestHandle, receive: Receive) -> InferenceResponse | None:
    """``await handle.wait()``; None when ``http.disconnect`` arrived first (the request is
    cancelled then).

    A watcher task waits for ``http.disconnect`` next to the request and is cancelled once it
    is over (trident's own HTTP/1.1 server answers /infer without ASGI and without a task per
    request; this path serves hypercorn and direct ASGI callers). Raises what ``handle.wait()``
    raises.
    """
    infer_scope = trio.CancelScope()
    error: Exception | None = None
    response = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_disconnect, receive, infer_scope, name="trident.http.watch_disconnect")
        try:
            with infer_scope:
                response = await handle.wait()
        except Exception as exc:  # re-raised below, outside the nursery (no ExceptionGroup)
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        try:
            raise error
        finally:
            del error  # this frame is in the error's traceback: holding it there would be a cycle
    return response


async def _send_parts(send: Send, status: int, headers: list[tuple[bytes, bytes]], parts: list[Any]) -> None:
    """Send a response made of ``parts`` (one body message unless it is large)."""
    total = sum(len(p) for p in parts)
    if len(parts) == 1 or total < _JOIN_LIMIT:
        await _send_bytes(send, status, headers, parts[0] if len(parts) == 1 else b"".join(parts))
        return
    headers.append((b"content-length", b"%d" % total))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    last = len(parts) - 1
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": i < last})


# ---- the application ---------------------------------------------------------------------------


def make_app(server: Server, endpoint: InferEndpoint | None = None) -> ASGIApp:
    """The ASGI application for ``server`` (HTTP scopes and lifespan).

    ``endpoint`` shares the infer endpoint with another path (trident's HTTP/1.1 fast path).
    Raises ValueError for a malformed ``--http-restricted-api``.
    """
    if endpoint is None:
        endpoint = InferEndpoint(server)
    limit = endpoint.limit
    restrictions = endpoint.restrictions
    openai_app = make_openai_app(server)  # the OpenAI-compatible routes under /v1 (trident.openai)

    def check_restricted(scope: Scope, category: str) -> None:
        """Raises HTTPError(403) when ``category`` needs a header the request lacks."""
        endpoint.check_restricted(scope["headers"], category)

    async def infer(scope: Scope, receive: Receive, send: Send, name: str, version: str) -> None:
        exchange = InferExchange(endpoint)
        try:
            body = await _read_body(scope, receive, limit)
            try:
                handle = await exchange.start(scope["headers"], body, name, version)
                del body
                response = handle.response if handle.response is not None else await _wait_watching(handle, receive)
                if response is None:
                    raise _Disconnected
                status, headers, parts = await exchange.respond(response)
                del response
            finally:
                exchange.end()
                if exchange.heavy is not None:
                    await exchange.free()
        except _Disconnected:
            raise
        except Exception as exc:
            status, headers, parts = exchange.error(exc)
        await _send_parts(send, status, headers, parts)

    async def model_route(
        scope: Scope, receive: Receive, send: Send, method: str, name: str, version: str, kind: str
    ) -> None:
        if restrictions:
            check_restricted(scope, _MODEL_CATEGORIES[kind])
        if kind == "infer":
            if method != "POST":
                raise _NOT_ALLOWED
            await infer(scope, receive, send, name, version)
        elif kind == "":
            if method != "GET":
                raise _NOT_ALLOWED
            await _send_json(send, kserve.model_metadata_json(server.model_metadata(name, version)))
        elif kind == "ready":
            if method != "GET":
                raise _NOT_ALLOWED
            if await server.probe_model_ready(name, version):
                await _send_empty(send, 200)
            else:
                await _send_error(send, HTTP_NOT_READY, "Model version not ready")
        elif kind == "config":
            if method != "GET":
                raise _NOT_ALLOWED
            await _send_json(send, config_to_json(server.model_config(name, version)))
        elif kind == "stats":
            if method != "GET":
                raise _NOT_ALLOWED
            await _send_json(send, kserve.statistics_json(await server.statistics(name, version)))
        elif kind == "trace/setting":
            if version:  # Triton has no versioned trace settings: the path falls through to 404
                raise _NOT_FOUND
            await trace(scope, receive, send, method, name)
        else:  # generate, generate_stream (trident.http.generate)
            if method != "POST":
                raise _NOT_ALLOWED
            for key, value in scope["headers"]:
                if key == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                    raise invalid_arg("Unsupported content-encoding, only 'identity' is supported.")
            body = await _read_body(scope, receive, limit)
            await generate.handle(server, receive, send, name, version, body, streaming=kind == "generate_stream")

    async def trace(scope: Scope, receive: Receive, send: Send, method: str, model: str) -> None:
        if method == "GET":
            await _send_json(send, server.trace_settings(model))
        elif method == "POST":
            settings = await _read_json_object(scope, receive, limit, required=True)
            await _send_json(send, await server.change_trace_settings(model, settings))
        else:
            raise _NOT_ALLOWED

    async def logging_route(scope: Scope, receive: Receive, send: Send, method: str) -> None:
        if method == "GET":
            await _send_json(send, server.log_settings())
        elif method == "POST":
            settings = await _read_json_object(scope, receive, limit, required=True)
            await _send_json(send, await server.change_log_settings(settings))
        else:
            raise _NOT_ALLOWED

    async def shm_route(scope: Scope, receive: Receive, send: Send, kind: str, region: str, action: str) -> None:
        """/v2/{system,cuda}sharedmemory[/region/R]/{status,register,unregister}
        (trident.server.shared_memory, the registry the gRPC RPCs use too)."""
        registry = server.shared_memory
        if action == "status":
            regions = registry.system_status(region) if kind == "system" else registry.cuda_status(region)
            await _send_json(send, regions)
            return
        if action == "unregister":
            await _read_body(scope, receive, limit)
            await server.unregister_shared_memory(kind, region)
            await _send_empty(send, 200)
            return
        doc = await _read_json_object(scope, receive, limit, required=True)
        if kind == "system":
            key = doc.get("key")
            if not isinstance(key, str):
                raise invalid_arg("Shared memory register request needs a string 'key'")
            await server.register_system_shared_memory(region, key, _int_field(doc, "offset", 0),
                                                       _int_field(doc, "byte_size"))
        else:
            handle = doc.get("raw_handle")
            b64 = handle.get("b64") if isinstance(handle, dict) else None
            try:
                raw = base64.b64decode(b64, validate=True) if isinstance(b64, str) else None
            except ValueError:
                raw = None
            if raw is None:
                raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
            await server.register_cuda_shared_memory(region, raw, _int_field(doc, "device_id", 0),
                                                     _int_field(doc, "byte_size"))
        await _send_empty(send, 200)

    async def repository_route(
        scope: Scope,
        receive: Receive,
        send: Send,
        method: str,
        repo: str | None,
        model: str | None,
        action: str | None,
    ) -> None:
        if method != "POST":
            raise _NOT_ALLOWED
        if model is None:  # index
            doc = await _read_json_object(scope, receive, limit, required=False)
            ready = doc.get("ready", False)
            if not isinstance(ready, bool):
                raise invalid_arg("Unable to parse 'ready': expected a boolean")
            await _send_json(send, kserve.repository_index_json(server.repository_index(ready)))
            return
        if repo:
            raise unsupported("'repository_name' specification is not supported")
        doc = await _read_json_object(scope, receive, limit, required=False)
        params = doc.get("parameters", {})
        if not isinstance(params, dict):
            raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
        if action == "load":
            config, files = _load_parameters(params)
            await server.load_model(model, config, files)
            await _send_bytes(send, 200, [_JSON], b"")  # Triton's empty answer
        else:
            dependents = params.get("unload_dependents", False)
            if not isinstance(dependents, bool):
                raise invalid_arg("Unable to parse 'unload_dependents': expected a boolean")
            await server.unload_model(model, dependents)
            await _send_bytes(send, 200, [_JSON], b"")

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if path == OPENAI_PREFIX or path.startswith(OPENAI_PREFIX + "/"):
            if restrictions:
                check_restricted(scope, restricted_category(path))
            await openai_app(scope, receive, send)
            return
        if path.startswith("/v2/models/"):
            if path == "/v2/models/stats":
                if restrictions:
                    check_restricted(scope, "statistics")
                if method != "GET":
                    raise _NOT_ALLOWED
                await _send_json(send, kserve.statistics_json(await server.statistics()))
                return
            match = _MODEL_RE.fullmatch(path)
            if match is not None:
                name, version, kind = match.groups()
                await model_route(scope, receive, send, method, name, version or "", kind or "")
                return
            raise _NOT_FOUND
        if restrictions:
            category = _category_of(path)
            if category is not None:
                check_restricted(scope, category)
        if path == "/v2/health/live" or path == "/v2/health/ready":
            if method != "GET":
                raise _NOT_ALLOWED
            ok = server.is_live() if path == "/v2/health/live" else server.is_ready()
            await _send_empty(send, 200 if ok else HTTP_NOT_READY)
        elif path == "/v2":
            if method != "GET":
                raise _NOT_ALLOWED
            await _send_json(send, kserve.server_metadata_json(server.metadata()))
        elif path == "/v2/logging":
            await logging_route(scope, receive, send, method)
        elif path == "/v2/trace/setting":
            await trace(scope, receive, send, method, "")
        elif path.startswith("/v2/repository/"):
            match = _REPOSITORY_RE.fullmatch(path)
            if match is None:
                raise _NOT_FOUND
            await repository_route(scope, receive, send, method, *match.groups())
        elif (match := _SHM_RE.fullmatch(path)) is not None:
            if method != ("GET" if match.group(3) == "status" else "POST"):
                raise _NOT_ALLOWED
            await shm_route(scope, receive, send, match.group(1), unquote(match.group(2) or ""), match.group(3))
        else:
            raise _NOT_FOUND

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await answer_lifespan(receive, send)
            return
        try:
            await route(scope, receive, send)
        except Disconnected:
            return
        except Exception as exc:
            status, body = error_reply(exc, scope.get("method", ""), scope.get("path", ""))
            await _reply_error(send, status, body)

    return app


# restricted API group (trident.restricted) of each route
_MODEL_CATEGORIES = {"infer": "inference", "generate": "inference", "generate_stream": "inference",
                     "": "metadata", "ready": "health", "config": "model-config", "stats": "statistics",
                     "trace/setting": "trace"}


def _int_field(doc: dict[str, Any], name: str, default: int | None = None) -> int:
    """An integer field of a shared-memory register body. Raises INVALID_ARG when it is missing
    (without a default) or not an integer."""
    value = doc.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_arg(f"Shared memory register request needs an integer '{name}'")
    return value


def _category_of(path: str) -> str | None:
    """The group of a path outside /v2/models/ (None: no group, e.g. an unknown path)."""
    if path.startswith("/v2/health/"):
        return "health"
    if path == "/v2":
        return "metadata"
    if path == "/v2/logging":
        return "logging"
    if path == "/v2/trace/setting":
        return "trace"
    if path.startswith("/v2/repository/"):
        return "model-repository"
    if path.startswith(("/v2/systemsharedmemory", "/v2/cudasharedmemory")):
        return "shared-memory"
    return None


async def _reply_error(send: Send, status: int, body: bytes) -> None:
    try:
        await _send_bytes(send, status, [_JSON], body)
    except Exception:  # the response may have started, or the connection is gone
        log.debug("could not send the error response (%d %r)", status, body, exc_info=True)


def _load_parameters(params: dict[str, Any]) -> tuple[str | None, dict[str, bytes] | None]:
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if not isinstance(value, str):
            raise invalid_arg(f"Unable to parse parameter '{key}': expected a string")
        if key == "config":
            config = value
        elif key.startswith("file:"):
            files[key[5:]] = kserve.decode_base64(value, key)
        else:
            raise invalid_arg(
                f"unexpected load parameter '{key}': expected 'config' or 'file:<version>/<name>'"
            )
    return config, files or None
