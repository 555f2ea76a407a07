"""The KServe v2 HTTP front end as one pure ASGI application (no framework).

``make_app(server)`` returns ``async def app(scope, receive, send)`` serving every endpoint of
Triton's HTTP API (reference §1) over the :class:`~trident.server.Server` facade; the transport
(hypercorn's trio worker, see :mod:`trident.http.serve`) can be swapped without touching routes.

* Routes use Triton's regular expressions; a wrong method is 405 "Method Not Allowed", an
  unmatched path 404 "Not Found". Errors are ``{"error": "<message>"}`` with the status from
  :func:`trident.errors.http_status`; an unexpected exception is a 500, never a crash.
* ``--http-max-input-size`` is enforced from ``Content-Length`` before any body byte is read,
  and while a chunked body streams in.
* A client that disconnects during ``/infer`` cancels its request: the inference runs in a
  nursery next to a task that waits for ``http.disconnect``.
* generate / generate_stream are served by :mod:`trident.http.generate` (server-sent events).
* Shared memory answers 501 until it is implemented.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import trio

from trident.config import config_to_json
from trident.errors import Code, TritonError, http_status, invalid_arg, unsupported
from trident.http import generate, offload
from trident.protocol import kserve
from trident.restricted import HTTP_MESSAGE, http_restrictions
from trident.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_MODEL_RE = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
_REPOSITORY_RE = re.compile(r"/v2/repository(?:/([^/]+))?/(?:index|models/([^/]+)/(load|unload))")
_SHM_RE = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|unregister)")

_JSON = (b"content-type", b"application/json")
_OCTET = (b"content-type", b"application/octet-stream")
_EMPTY_OK_HEADERS = [(b"content-length", b"0")]
_JOIN_LIMIT = 1 << 16  # responses smaller than this go out as one body message


class _Disconnected(Exception):
    """The client went away before the request was answered."""


class _HTTPError(Exception):
    """A protocol-level error with its own status (404, 405)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_NOT_FOUND = _HTTPError(404, "Not Found")
_NOT_ALLOWED = _HTTPError(405, "Method Not Allowed")
_SHM_MESSAGE = "shared memory extension is not supported yet"


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


def _too_large(size: int, limit: int) -> TritonError:
    return invalid_arg(
        f"request body of {size} bytes exceeds the maximum HTTP input size of {limit} bytes "
        "(--http-max-input-size)"
    )


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


async def _lifespan(receive: Receive, send: Send) -> None:
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


async def _infer_and_respond(
    server: Server,
    request: InferenceRequest,
    receive: Receive,
    respond: Callable[[InferenceResponse], Awaitable[None]],
) -> None:
    """Run ``server.infer`` and ``await respond(response)``, cancelling the request on disconnect.

    A watcher task waits for ``http.disconnect`` next to the inference. After the response is
    sent, ASGI servers deliver ``http.disconnect`` to a pending ``receive()`` (hypercorn does so
    while the last body message is being sent), which ends the watcher without a cancellation;
    cancelling the nursery afterwards is only a fallback. Raises what ``server.infer`` or
    ``respond`` raise, and _Disconnected when the client went away first.
    """
    infer_scope = trio.CancelScope()
    error: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_disconnect, receive, infer_scope, name="trident.http.watch_disconnect")
        try:
            response = None
            with infer_scope:
                response = await server.infer(request)
            if response is None:
                error = _Disconnected()
            else:
                await respond(response)
        except Exception as exc:  # re-raised below, outside the nursery (no ExceptionGroup)
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error


# ---- the application ---------------------------------------------------------------------------


def make_app(server: Server) -> ASGIApp:
    """The ASGI application for ``server`` (HTTP scopes and lifespan).

    Raises ValueError for a malformed ``--http-restricted-api``.
    """
    limit = int(server.options.http_max_input_size)
    restrictions = http_restrictions(server.options)

    def check_restricted(scope: Scope, category: str) -> None:
        """Raises _HTTPError(403) when ``category`` needs a header the request lacks."""
        restriction = restrictions.get(category)
        if restriction is None:
            return
        wanted = restriction.header.encode("latin-1")
        for key, value in scope["headers"]:
            if key.lower() == wanted and restriction.allows(value):
                return
        raise _HTTPError(403, HTTP_MESSAGE.format(restriction.header))

    async def infer(scope: Scope, receive: Receive, send: Send, name: str, version: str) -> None:
        header_length: int | None = None
        content_encoding = accept_encoding = None
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                try:
                    header_length = int(value)
                except ValueError:
                    raise invalid_arg(
                        f"Unable to parse Inference-Header-Content-Length, got: {value.decode('latin-1')}"
                    ) from None
            elif key == b"content-encoding":
                content_encoding = value.decode("latin-1")
            elif key == b"accept-encoding":
                accept_encoding = value.decode("latin-1")
        body: bytes | bytearray | memoryview = await _read_body(scope, receive, limit)
        if content_encoding is not None:
            body = await offload.decompress(body, content_encoding, limit)
        heavy = False
        if header_length == 0:
            request = _decode_raw(server, body, name, version)
            binary_default = True
        else:
            if len(body) < offload.OFFLOAD_THRESHOLD or not kserve.is_heavy(
                    body, header_length, offload.OFFLOAD_THRESHOLD):
                request = kserve.decode_infer_request(body, header_length, name, version)
            else:  # a large JSON (or BYTES) decode: in a worker thread, not on the loop
                heavy = True
                request = await offload.run_sync(kserve.decode_infer_request, body, header_length, name, version)
            params = request.parameters
            binary_default = bool(params.pop("binary_data_output", False)) if params else False
        requested = request.outputs

        async def respond(response: InferenceResponse) -> None:
            if kserve.response_is_large(response):  # a large encode (and compression): in a worker thread
                parts, json_length, encoding = await offload.run_sync(
                    _encode_response, response, requested, binary_default, accept_encoding)
            else:
                parts, json_length, encoding = _encode_response(response, requested, binary_default, accept_encoding)
            if json_length is None:
                headers = [_JSON]
            else:
                headers = [_OCTET, (b"inference-header-content-length", b"%d" % json_length)]
            if encoding is not None:
                headers.append((b"content-encoding", encoding.encode()))
            total = sum(len(p) for p in parts)
            if len(parts) == 1 or total < _JOIN_LIMIT:
                await _send_bytes(send, 200, headers, parts[0] if len(parts) == 1 else b"".join(parts))
                return
            headers.append((b"content-length", b"%d" % total))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            last = len(parts) - 1
            for i, part in enumerate(parts):
                await send({"type": "http.response.body", "body": part, "more_body": i < last})

        if not heavy:
            await _infer_and_respond(server, request, receive, respond)
            return
        # a request decoded off the loop holds millions of objects (JSON lists): they are freed
        # off the loop too, once nothing else (a traceback's frames) refers to them
        error: Exception | None = None
        try:
            await _infer_and_respond(server, request, receive, respond)
        except Exception as exc:
            error = exc.with_traceback(None)
        holder = [request]
        del request
        await offload.run_sync(holder.clear)
        if error is not None:
            raise error

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
            await _send_json(send, server.model_metadata(name, version))
        elif kind == "ready":
            if method != "GET":
                raise _NOT_ALLOWED
            if await server.probe_model_ready(name, version):
                await _send_empty(send, 200)
            else:
                await _send_error(send, 400, "Model version not ready")
        elif kind == "config":
            if method != "GET":
                raise _NOT_ALLOWED
            await _send_json(send, config_to_json(server.model_config(name, version)))
        elif kind == "stats":
            if method != "GET":
                raise _NOT_ALLOWED
            await _send_json(
                send, {"model_stats": [s.to_json() for s in server.model_statistics(name, version)]}
            )
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
            await _send_json(send, server.update_trace_settings(model, settings))
        else:
            raise _NOT_ALLOWED

    async def logging_route(scope: Scope, receive: Receive, send: Send, method: str) -> None:
        if method == "GET":
            await _send_json(send, server.log_settings())
        elif method == "POST":
            settings = await _read_json_object(scope, receive, limit, required=True)
            await _send_json(send, server.update_log_settings(settings))
        else:
            raise _NOT_ALLOWED

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
            await _send_json(send, [_index_entry(e) for e in server.repository_index(ready)])
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
            await _send_json(send, {})
        else:
            dependents = params.get("unload_dependents", False)
            if not isinstance(dependents, bool):
                raise invalid_arg("Unable to parse 'unload_dependents': expected a boolean")
            await server.unload_model(model, dependents)
            await _send_bytes(send, 200, [_JSON], b"")

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if path.startswith("/v2/models/"):
            if path == "/v2/models/stats":
                if restrictions:
                    check_restricted(scope, "statistics")
                if method != "GET":
                    raise _NOT_ALLOWED
                await _send_json(send, {"model_stats": [s.to_json() for s in server.model_statistics()]})
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
            await _send_empty(send, 200 if ok else 400)
        elif path == "/v2":
            if method != "GET":
                raise _NOT_ALLOWED
            await _send_json(send, server.metadata())
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
            if method != ("GET" if match.group(2) == "status" else "POST"):
                raise _NOT_ALLOWED
            raise unsupported(_SHM_MESSAGE)
        else:
            raise _NOT_FOUND

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await _lifespan(receive, send)
            return
        try:
            await route(scope, receive, send)
        except TritonError as exc:
            await _reply_error(send, http_status(exc.code), exc.message)
        except _HTTPError as exc:
            await _reply_error(send, exc.status, exc.message)
        except _Disconnected:
            return
        except Exception as exc:
            log.exception("unexpected error handling %s %s", scope.get("method"), scope.get("path"))
            await _reply_error(
                send, http_status(Code.INTERNAL), f"internal server error: {type(exc).__name__}: {exc}"
            )

    return app


# restricted API group (trident.restricted) of each route
_MODEL_CATEGORIES = {"infer": "inference", "generate": "inference", "generate_stream": "inference",
                     "": "metadata", "ready": "health", "config": "model-config", "stats": "statistics",
                     "trace/setting": "trace"}


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


async def _reply_error(send: Send, status: int, message: str) -> None:
    try:
        await _send_error(send, status, message)
    except Exception:  # the response may have started, or the connection is gone
        log.debug("could not send the error response (%d %s)", status, message, exc_info=True)


def _encode_response(response: InferenceResponse, requested: list[Any], binary_default: bool,
                     accept_encoding: str | None) -> tuple[list[Any], int | None, str | None]:
    """The response body parts, its JSON header length and its Content-Encoding (None: identity)."""
    parts, json_length = kserve.encode_infer_response(response, requested, binary_default)
    if accept_encoding is None:
        return parts, json_length, None
    data, encoding = kserve.compress(b"".join(parts), accept_encoding)
    return ([data], json_length, encoding) if encoding is not None else (parts, json_length, None)


def _decode_raw(
    server: Server, body: bytes | bytearray | memoryview, name: str, version: str
) -> InferenceRequest:
    inputs = server.model_input_info(name, version)
    if len(inputs) != 1:
        raise invalid_arg(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)} inputs in "
            f"'{name}' model configuration"
        )
    input_name, datatype, shape = inputs[0]
    if server.model_config(name, version).max_batch_size > 0:
        shape = [1, *shape[1:]]
    return kserve.decode_raw_request(body, name, version, input_name, datatype, shape)


def _index_entry(entry: Any) -> dict[str, str]:
    out = {"name": entry.name}
    if entry.version:
        out["version"] = entry.version
    if entry.state:
        out["state"] = entry.state
    if entry.reason:
        out["reason"] = entry.reason
    return out


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
