"""``POST /v2/models/{m}[/versions/{v}]/infer``: the work both HTTP paths share.

The ASGI application (:mod:`trident.http.app`, served by hypercorn or by trident's server for
routes other than /infer) and the ASGI-free fast path of trident's HTTP/1.1 server
(:mod:`trident.http.connection`) answer an infer request with the same steps, which they run
in their own task, one after the other: :meth:`InferExchange.start` decodes the body and starts
the request on the server (its :class:`~trident.server.RequestHandle`), the transport waits for
the handle as it can (watching for a client disconnect), and :meth:`InferExchange.reply` (or
:meth:`~InferExchange.respond`, for a large encode) makes the answer; :meth:`~InferExchange.error`
maps an exception to its answer. So both decode, run, encode and map errors alike.
:class:`InferEndpoint` holds what the requests of one server share (the size limit, the
restricted API, forwarded headers, shared memory).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from trident.errors import Code, TritonError, http_status, invalid_arg
from trident.http import offload
from trident.observability.logs import serving, serving_of
from trident.observability.trace import TraceParent, parse_traceparent
from trident.protocol import kserve
from trident.restricted import HTTP_MESSAGE, http_restrictions
from trident.types import InferenceRequest, InferenceResponse, let_go

if TYPE_CHECKING:
    from trident.server import RequestHandle, Server

log = logging.getLogger("trident.http")

Headers = Sequence[tuple[bytes, bytes]]
Parts = list[Any]  # bytes-like pieces of a body
Body = bytes | bytearray | memoryview
#: an answer: its status, its headers (without content-length: the transport adds it) and body parts
Reply = tuple[int, list[tuple[bytes, bytes]], Parts]

#: what a request's headers ask for: Inference-Header-Content-Length, Content-Encoding,
#: the response coding chosen from Accept-Encoding (None: identity), and the client's W3C trace context (traceparent, tracestate)
HeaderInfo = tuple[int | None, str | None, str | None, TraceParent | None]

JSON = (b"content-type", b"application/json")
OCTET = (b"content-type", b"application/octet-stream")
_HEADER_INFO_CACHE = 256  # header tuples whose scan an endpoint keeps


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

    def error(self, exc: Exception, name: str, version: str) -> Reply:
        path = f"/v2/models/{name}/versions/{version}/infer" if version else f"/v2/models/{name}/infer"
        status, body = error_reply(exc, "POST", path)
        # a traceback's frames may hold a large decoded request: the caller drops them with exc
        retry_after = getattr(exc, "retry_after_s", 0)  # load shedding: when to try again
        if retry_after:
            return status, [JSON, (b"retry-after", b"%d" % retry_after)], [body]
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
                # the coding chosen now: "identity" (or none acceptable) is None, so a client that
                # only says identity gets the plain path (no join of the body, no thread hop)
                accept_encoding = kserve.choose_encoding(value.decode("latin-1"))
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


class InferExchange:
    """Infer requests, one at a time: decoded, started on the server and answered (see the
    module docstring). The fast path keeps one per connection (a request answered later takes
    it along, and the connection makes a new one); the ASGI application makes one per request.
    Used on the trio thread only.

    Between :meth:`start` and :meth:`end` the lines logged in the calling task name the request
    (:data:`trident.observability.logs.serving`), and :meth:`reply` / :meth:`respond` encode
    the response as the request asked (its requested outputs, binary or JSON, compression,
    outputs written to shared memory).
    """

    __slots__ = ("endpoint", "name", "version", "requested", "binary", "accept", "shm", "heavy", "answered", "_token")

    def __init__(self, endpoint: InferEndpoint) -> None:
        self.endpoint = endpoint
        self.name = self.version = ""
        self.requested: list[Any] = []
        self.binary = False  # outputs as binary unless asked otherwise (binary_data_output, raw requests)
        self.accept: str | None = None  # the response's coding chosen from Accept-Encoding (None: identity)
        self.shm: kserve.ShmOutputLookup | None = None  # writes the outputs asked for in shared memory
        #: a request decoded off the loop (held here until :meth:`free` drops it off the loop too)
        self.heavy: InferenceRequest | None = None
        #: a heavy request's response once encoded (its object arrays are let go of by :meth:`free`)
        self.answered: InferenceResponse | None = None
        self._token: Any = None

    async def start(self, headers: Headers, body: Body, name: str, version: str) -> RequestHandle:
        """Decode ``body`` (inline, or in a worker thread when large: :attr:`heavy` then holds the
        request) and start the request on the server: its handle. Raises TritonError (a bad
        request: INVALID_ARG, an unknown model NOT_FOUND, what Server.start raises), HTTPError;
        cancellation propagates (a decode in a thread is waited for). The caller calls
        :meth:`end` whatever happens."""
        endpoint = self.endpoint
        header_length, content_encoding, accept_encoding, context = endpoint._scan_headers(headers)
        self.name, self.version, self.accept = name, version, accept_encoding
        if content_encoding is not None:
            body = await offload.decompress(body, content_encoding, endpoint.limit)
        shm = endpoint.shm.input_view
        if header_length == 0:
            request = _decode_raw(endpoint.server, body, name, version)
            self.binary = True
        else:
            try:
                if len(body) >= offload.OFFLOAD_THRESHOLD and kserve.is_heavy(
                        body, header_length, offload.OFFLOAD_THRESHOLD):
                    # a large JSON (or BYTES) decode: in a worker thread, not on the loop
                    # an input the model refuses is refused before its data is decoded
                    check = endpoint.server.input_check(name, version)
                    request = await offload.run_sync(kserve.decode_infer_request, body, header_length, name,
                                                     version, shm, check)
                    self.heavy = request
                else:
                    request = kserve.decode_infer_request(body, header_length, name, version, shm)
            except TritonError:
                endpoint.server.model_config(name, version)  # an unknown model answers 404, as Triton, not 400
                raise
            params = request.parameters
            self.binary = bool(params.pop("binary_data_output", False)) if params else False
        del body
        if context is not None:
            request.trace = context
        self._token = serving.set(serving_of(request))
        self.requested = request.outputs
        self.shm = endpoint._prepare(headers, request)
        return endpoint.server.start(request)

    def end(self) -> None:
        """The request is answered (or given up): the lines logged in the task no longer name it."""
        token, self._token = self._token, None
        if token is not None:
            serving.reset(token)

    async def free(self) -> None:
        """Drop a request decoded off the loop, and its response once encoded (:attr:`answered`),
        off the loop too: they may hold millions of objects (JSON lists, BYTES elements), let go
        of a slice at a time where nothing else holds them (types.release_objects). Cancellation
        waits for it."""
        holder = [self.heavy, self.answered]  # held by nothing else here: the thread lets go of them
        self.heavy = self.answered = None
        with trio.CancelScope(shield=True):
            await offload.run_sync(let_go, holder)

    def reply(self, response: InferenceResponse) -> Reply | None:
        """The answer for ``response`` (an error response's included), encoded here and now;
        None when the encode is large (JSON, shared-memory copies, compression): :meth:`respond`
        then makes it off the loop. Never raises."""
        try:
            if response.error is not None:
                raise response.error
            if kserve.response_is_large(response, self.requested, self.binary, self.accept is not None):
                return None
            return _framed(*encode_response(response, self.requested, self.binary, self.accept, self.shm))
        except Exception as exc:
            return self.error(exc)

    async def respond(self, response: InferenceResponse) -> Reply:
        """The answer for any ``response``, a large encode in a worker thread; never raises but
        Cancelled."""
        reply = self.reply(response)
        if reply is not None:
            return reply
        try:
            if response.error is not None:
                raise response.error
            return _framed(*await offload.run_sync(encode_response, response, self.requested, self.binary,
                                                   self.accept, self.shm))
        except Exception as exc:
            return self.error(exc)

    def error(self, exc: Exception) -> Reply:
        """The answer for ``exc`` raised while handling the request (see :func:`error_reply`)."""
        return self.endpoint.error(exc, self.name, self.version)


def _framed(parts: Parts, json_length: int | None, encoding: str | None) -> Reply:
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
