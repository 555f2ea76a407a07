"""``POST /v2/models/{m}[/versions/{v}]/infer``: the work both HTTP paths share.

The ASGI application (:mod:`trident.http.app`, served by hypercorn or by trident's server for
routes other than /infer) and the ASGI-free fast path of trident's HTTP/1.1 server
(:mod:`trident.http.fastserver`) both answer an infer request with :meth:`InferEndpoint.handle`,
so they decode, run, encode and map errors with the same code and give the same answers. The
caller supplies the transport's two operations: reading the body and running the request
while it watches for a client disconnect.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from trident.errors import Code, TritonError, http_status, invalid_arg
from trident.http import offload
from trident.observability.logs import serving, serving_of
from trident.observability.trace import TraceParent, parse_traceparent
from trident.protocol import kserve
from trident.restricted import HTTP_MESSAGE, http_restrictions
from trident.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.http")

Headers = Sequence[tuple[bytes, bytes]]
Parts = list[Any]  # bytes-like pieces of a body
Body = bytes | bytearray | memoryview
ReadBody = Callable[[], Awaitable[Body]]
RunInfer = Callable[[InferenceRequest, bool], "InferenceResponse | None | Awaitable[InferenceResponse | None]"]

#: what a request's headers ask for: Inference-Header-Content-Length, Content-Encoding,
#: Accept-Encoding, and the client's W3C trace context (traceparent, tracestate)
HeaderInfo = tuple[int | None, str | None, str | None, TraceParent | None]

JSON = (b"content-type", b"application/json")
OCTET = (b"content-type", b"application/octet-stream")
_HEADER_INFO_CACHE = 256  # header tuples whose scan an endpoint keeps


LATER: Any = object()  # what ``run`` returns when the transport takes the response later itself (see Later)


class Later:
    """An infer request that waits in a queue, answered later by the transport itself (the
    task that delivers the response calls back, :meth:`InferEndpoint.handle` returned this):
    how its response is encoded. Used on the trio thread only."""

    __slots__ = ("endpoint", "requested", "binary_default", "accept_encoding", "shm", "name", "version")

    def __init__(self, endpoint: InferEndpoint, requested: list[Any], binary_default: bool,
                 accept_encoding: str | None, shm: kserve.ShmOutputLookup | None, name: str, version: str) -> None:
        self.endpoint = endpoint
        self.requested = requested
        self.binary_default = binary_default
        self.accept_encoding = accept_encoding
        self.shm = shm
        self.name = name
        self.version = version

    def small(self, response: InferenceResponse) -> bool:
        """Whether :meth:`reply` may encode ``response`` here and now (else :meth:`respond`)."""
        return not kserve.response_is_large(response, self.requested, self.binary_default,
                                            self.accept_encoding is not None)

    def reply(self, response: InferenceResponse) -> tuple[int, list[tuple[bytes, bytes]], Parts]:
        """The reply for a small ``response`` (an error response's included); never raises."""
        try:
            if response.error is not None:
                raise response.error
            return _reply(response, self.requested, self.binary_default, self.accept_encoding, self.shm)
        except Exception as exc:
            return self.endpoint.error(exc, self.name, self.version)

    async def respond(self, response: InferenceResponse) -> tuple[int, list[tuple[bytes, bytes]], Parts]:
        """The reply for any ``response``, a large encode in a worker thread; never raises but
        Cancelled."""
        try:
            if response.error is not None:
                raise response.error
            return await _respond(response, self.requested, self.binary_default, self.accept_encoding, self.shm)
        except Exception as exc:
            return self.endpoint.error(exc, self.name, self.version)


class Disconnected(Exception):
    """The client went away before the request was answered (nothing is to be sent)."""


class HTTPError(Exception):
    """A protocol-level error with its own status (403, 404, 405)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def too_large(size: int, limit: int) -> TritonError:
    """The INVALID_ARG for a body of ``size`` bytes over ``--http-max-input-size``."""
    return invalid_arg(
        f"request body of {size} bytes exceeds the maximum HTTP input size of {limit} bytes "
        "(--http-max-input-size)"
    )


def error_reply(exc: Exception, method: str, path: str) -> tuple[int, bytes]:
    """The status and ``{"error": ...}`` body for an exception raised while handling a request.

    TritonError gets its code's status, HTTPError its own; anything else is a 500 (logged with
    its traceback) naming the exception.
    """
    if isinstance(exc, TritonError):
        return http_status(exc.code), kserve.error_body(exc.message)
    if isinstance(exc, HTTPError):
        return exc.status, kserve.error_body(exc.message)
    log.error("unexpected error handling %s %s", method, path, exc_info=exc)
    return http_status(Code.INTERNAL), kserve.error_body(f"internal server error: {type(exc).__name__}: {exc}")


class InferEndpoint:
    """The infer endpoint of one server: its size limit, restrictions and request handling.

    Raises ValueError (construction) for a malformed ``--http-restricted-api``.
    """

    __slots__ = ("server", "limit", "restrictions", "forward", "shm", "_header_info")

    def __init__(self, server: Server) -> None:
        self.server = server
        self.limit = int(server.options.http_max_input_size)
        self.restrictions = http_restrictions(server.options)
        pattern = server.options.http_header_forward_pattern
        #: --http-header-forward-pattern: headers whose name matches become request parameters
        self.forward = re.compile(pattern) if pattern else None
        self.shm = server.shared_memory
        #: id(header tuple) -> (that tuple, what _scan_headers made of it): a client sends the
        #: same head again and again, and the HTTP/1.1 parser hands out the same tuple for it
        self._header_info: dict[int, tuple[Headers, HeaderInfo]] = {}

    def check_restricted(self, headers: Headers, category: str) -> None:
        """Raises HTTPError(403) when ``category`` needs a header the request lacks."""
        restriction = self.restrictions.refused(category, headers)
        if restriction is not None:
            raise HTTPError(403, HTTP_MESSAGE.format(restriction.header))

    async def handle(self, headers: Headers, read_body: ReadBody | Body, run: RunInfer, name: str,
                     version: str) -> tuple[int, list[tuple[bytes, bytes]], Parts] | Later:
        """Answer one infer request: ``(status, headers, body parts)``, never an exception.

        ``read_body`` is the whole body, or a coroutine function that returns it (raising
        ``too_large`` past the limit); ``run(request, heavy)`` runs it and returns its response,
        None when the client went away meanwhile, or an awaitable of either (``heavy``: the
        request was decoded off the loop, and it is freed off the loop too, so ``run`` should
        return rather than let a cancellation through). A transport that has the body and a
        response at hand passes them as values: the common request then costs no task switch
        and no coroutine of its own. The headers returned lack ``content-length`` (the
        transport adds it). The restricted-API check is the caller's (it precedes the method
        check). ``run`` may also return LATER: the request is queued and the transport answers
        it itself when the response comes; ``handle`` then returns a :class:`Later` that encodes
        it. Raises Disconnected when the client went away (the transport sends nothing);
        cancellation propagates. The lines logged while the request runs here name it
        (trident.observability.logs.serving); a ``traceparent`` header becomes ``request.trace``.
        """
        token = None
        try:
            header_length, content_encoding, accept_encoding, context = self._scan_headers(headers)
            body = read_body if isinstance(read_body, (bytes, bytearray, memoryview)) else await read_body()
            if content_encoding is not None:
                body = await offload.decompress(body, content_encoding, self.limit)
            shm = self.shm.input_view
            if header_length == 0:
                request = _decode_raw(self.server, body, name, version)
                binary_default = True
            else:
                try:
                    if len(body) >= offload.OFFLOAD_THRESHOLD and kserve.is_heavy(
                            body, header_length, offload.OFFLOAD_THRESHOLD):
                        # a large JSON (or BYTES) decode: in a worker thread, not on the loop
                        return await self._handle_heavy(headers, body, header_length, accept_encoding,
                                                        run, name, version, context)
                    request = kserve.decode_infer_request(body, header_length, name, version, shm)
                except TritonError:
                    self.server.repository.get(name, version)  # an unknown model answers 404, as Triton, not 400
                    raise
                params = request.parameters
                binary_default = bool(params.pop("binary_data_output", False)) if params else False
            del body
            if context is not None:
                request.trace = context
            token = serving.set(serving_of(request))
            output_view = self._prepare(headers, request)
            response = run(request, False)
            if response is LATER:
                return Later(self, request.outputs, binary_default, accept_encoding, output_view, name, version)
            if isinstance(response, InferenceResponse) and not kserve.response_is_large(
                    response, request.outputs, binary_default, accept_encoding is not None):
                return _reply(response, request.outputs, binary_default, accept_encoding, output_view)  # the usual case
            return await _respond(response, request.outputs, binary_default, accept_encoding, output_view)
        except Disconnected:
            raise
        except Exception as exc:
            return self.error(exc, name, version)
        finally:
            if token is not None:
                serving.reset(token)

    def error(self, exc: Exception, name: str, version: str) -> tuple[int, list[tuple[bytes, bytes]], Parts]:
        path = f"/v2/models/{name}/versions/{version}/infer" if version else f"/v2/models/{name}/infer"
        status, body = error_reply(exc, "POST", path)
        # a traceback's frames may hold a large decoded request: the caller drops them with exc
        return status, [JSON], [body]

    def _prepare(self, headers: Headers, request: InferenceRequest) -> kserve.ShmOutputLookup | None:
        """Forwarded headers into ``request``'s parameters and the check of outputs asked for in
        shared memory (before the model runs, as Triton does): the lookup that writes them, if any."""
        if self.forward is not None:
            for key, value in headers:
                text = key.decode("latin-1")
                if self.forward.fullmatch(text):
                    request.parameters[text] = value.decode("latin-1")
        shm_outputs = {o.name: o.parameters for o in request.outputs if "shared_memory_region" in o.parameters}
        if not shm_outputs:
            return None
        self.shm.check_outputs(shm_outputs)
        return self.shm.output_view

    def _scan_headers(self, headers: Headers) -> HeaderInfo:
        """What a request's headers ask for (:data:`HeaderInfo`, None where absent), remembered
        for a header tuple seen before. Raises INVALID_ARG for a header length that is not a
        number; a malformed (or repeated) ``traceparent`` is ignored, as W3C says."""
        cached = self._header_info.get(id(headers))
        if cached is not None and cached[0] is headers:
            return cached[1]
        header_length: int | None = None
        content_encoding = accept_encoding = None
        traceparent: list[bytes] | None = None
        tracestate: list[bytes] = []
        for key, value in headers:
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
            elif key == b"traceparent":
                traceparent = [*(traceparent or ()), value]
            elif key == b"tracestate":
                tracestate.append(value)
        context = None
        if traceparent is not None and len(traceparent) == 1:
            context = parse_traceparent(traceparent[0], b",".join(tracestate))
        info = (header_length, content_encoding, accept_encoding, context)
        if isinstance(headers, tuple):
            if len(self._header_info) >= _HEADER_INFO_CACHE:
                self._header_info.clear()
            self._header_info[id(headers)] = (headers, info)  # holds the tuple: its id stays unique
        return info

    async def _handle_heavy(self, headers: Headers, body: Body, header_length: int | None,
                            accept_encoding: str | None, run: RunInfer, name: str,
                            version: str, context: TraceParent | None = None,
                            ) -> tuple[int, list[tuple[bytes, bytes]], Parts]:
        """:meth:`handle` for a body whose decode is long: decoded in a worker thread, and the
        request (it holds millions of objects: JSON lists) freed in one too, once nothing else
        (a traceback's frames) refers to it. Raises what the decode raises."""
        request = await offload.run_sync(kserve.decode_infer_request, body, header_length, name, version,
                                         self.shm.input_view)
        del body
        params = request.parameters
        binary_default = bool(params.pop("binary_data_output", False)) if params else False
        if context is not None:
            request.trace = context
        error: Exception | None = None
        reply = None
        token = serving.set(serving_of(request))
        try:
            output_view = self._prepare(headers, request)
            reply = await _respond(run(request, True), request.outputs, binary_default, accept_encoding, output_view)
        except Exception as exc:
            error = exc.with_traceback(None)
        finally:
            serving.reset(token)
        holder = [request]
        del request
        await offload.run_sync(holder.clear)
        if error is not None:
            raise error
        assert reply is not None
        return reply


def _reply(response: InferenceResponse, requested: list[Any], binary_default: bool,
           accept_encoding: str | None, shm: kserve.ShmOutputLookup | None = None,
           ) -> tuple[int, list[tuple[bytes, bytes]], Parts]:
    """The 200 reply for ``response``, encoded here and now (a small one: see :func:`_respond`)."""
    return _framed(*encode_response(response, requested, binary_default, accept_encoding, shm))


async def _respond(response: InferenceResponse | None | Awaitable[InferenceResponse | None], requested: list[Any],
                   binary_default: bool, accept_encoding: str | None, shm: kserve.ShmOutputLookup | None = None,
                   ) -> tuple[int, list[tuple[bytes, bytes]], Parts]:
    """:func:`_reply` for what ``run`` returned (awaited when it is an awaitable), with a large
    encode (JSON, shared-memory copies, compression) in a worker thread. Raises Disconnected
    when the client went away."""
    if not isinstance(response, InferenceResponse) and response is not None:
        response = await response
    if response is None:
        raise Disconnected
    if not kserve.response_is_large(response, requested, binary_default, accept_encoding is not None):
        return _reply(response, requested, binary_default, accept_encoding, shm)
    return _framed(*await offload.run_sync(encode_response, response, requested, binary_default,
                                           accept_encoding, shm))


def _framed(parts: Parts, json_length: int | None, encoding: str | None,
            ) -> tuple[int, list[tuple[bytes, bytes]], Parts]:
    headers = [JSON] if json_length is None else [OCTET, (b"inference-header-content-length", b"%d" % json_length)]
    if encoding is not None:
        headers.append((b"content-encoding", encoding.encode()))
    return 200, headers, parts


def encode_response(response: InferenceResponse, requested: list[Any], binary_default: bool,
                    accept_encoding: str | None, shm: kserve.ShmOutputLookup | None = None,
                    ) -> tuple[list[Any], int | None, str | None]:
    """The response body parts, its JSON header length and its Content-Encoding (None: identity);
    outputs requested in shared memory are written there through ``shm``."""
    parts, json_length = kserve.encode_infer_response(response, requested, binary_default, shm)
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
