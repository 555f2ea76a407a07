"""``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` over the :class:`Server` facade.

ModelInfer and ModelStreamInfer go through the hand-written codec
(:mod:`trident.protocol.grpc_codec`); the other RPCs use the betterproto2 messages generated
from ``protocol/grpc_service.proto``. Errors are TritonErrors whose status comes from
:func:`trident.errors.grpc_status`; the shared-memory RPCs, and tensors in shared memory, go
through the server's registry (:mod:`trident.server.shared_memory`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import betterproto2
import trio

from trident.errors import TritonError, invalid_arg, unavailable
from trident.grpc.call import Call, GrpcError, Method
from trident.observability.logs import serving, serving_of
from trident.observability.trace import TraceParent, parse_traceparent
from trident.protocol import grpc_codec, grpc_messages
from trident.protocol.generated import inference as pb
from trident.protocol.generated.grpc.health import v1 as health
from trident.protocol.kserve import serializes_many
from trident.restricted import GRPC_MESSAGE, Restriction, grpc_restrictions
from trident.types import InferenceRequest, InferenceResponse, ParamValue, let_go

if TYPE_CHECKING:
    from trident.server import RequestHandle, Server

log = logging.getLogger("trident.grpc")

SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
# requests of one ModelStreamInfer call in flight at once; beyond it the stream's window closes
MAX_STREAM_INFLIGHT = 1024
_TRACE_CONTEXT_CACHE = 256  # header tuples whose trace context (usually none) a service keeps

def _reply(message: betterproto2.Message) -> tuple[list[bytes], int]:
    data = bytes(message)
    return [data], len(data)


def _parse_now(cls: type[Any], data: bytearray) -> Any:
    try:
        return cls.parse(bytes(data))
    except Exception as e:  # betterproto2 raises EOFError, ValueError, KeyError... on bad input
        raise invalid_arg(f"failed to parse {cls.__name__}: {e}") from None


async def _parse(call: Call, cls: type[Any], data: bytearray) -> Any:
    """Decode a betterproto2 message: inline when small, in a worker thread from
    ``offload_size`` bytes (the call's task waits for it). Raises TritonError(INVALID_ARG)
    for bytes that are not the message (Triton answers INTERNAL "Unable to parse request")."""
    if len(data) < call.conn.config.offload_size:
        return _parse_now(cls, data)
    return await call.run_sync(_parse_now, cls, data)


def _log_value(value: Any) -> pb.LogSettingsResponseSettingValue:
    if isinstance(value, bool):
        return pb.LogSettingsResponseSettingValue(bool_param=value)
    if isinstance(value, int):
        return pb.LogSettingsResponseSettingValue(uint32_param=value)
    return pb.LogSettingsResponseSettingValue(string_param=str(value))


# restricted protocol group (trident.restricted) of each RPC
_RPC_CATEGORIES = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}


def _restricted(handler: Callable[..., Awaitable[Any]], restriction: Restriction) -> Callable[..., Awaitable[Any]]:
    """``handler`` behind ``restriction``: a call without the metadata gets UNAVAILABLE (as Triton)."""
    wanted = restriction.header.encode("latin-1")

    async def guarded(call: Call, *args: Any) -> Any:
        if not any(key == wanted and restriction.allows(value) for key, value in call.headers):
            raise unavailable(GRPC_MESSAGE.format(restriction.header))
        return await handler(call, *args)

    return guarded


def _decode_request(data: bytearray, shm: grpc_codec.ShmLookup | None,
                    check: grpc_codec.InputCheck | None = None) -> InferenceRequest:
    """grpc_codec.decode_model_infer_request, a malformed message raised as TritonError(INVALID_ARG)."""
    try:
        return grpc_codec.decode_model_infer_request(data, shm, check)
    except grpc_codec.DecodeError as e:
        raise invalid_arg(f"failed to parse ModelInferRequest: {e}") from None


class InferenceService:
    """The RPC handlers; :meth:`methods` is the table the transport serves."""

    def __init__(self, server: Server) -> None:
        self.server = server
        pattern = server.options.grpc_header_forward_pattern
        self.forward = re.compile(pattern, re.IGNORECASE) if pattern else None
        self.restrictions = grpc_restrictions(server.options)
        #: id(header tuple) -> (that tuple, its trace context): the HTTP/2 engine hands out the
        #: same tuple for a header block it decoded before (a call without a traceparent)
        self._contexts: dict[int, tuple[Any, TraceParent | None]] = {}
        self._last: tuple[Any, TraceParent | None] = (None, None)  # the entry used last

    def methods(self) -> dict[str, Method]:
        unary = {
            "ServerLive": self.server_live, "ServerReady": self.server_ready, "ModelReady": self.model_ready,
            "ServerMetadata": self.server_metadata, "ModelMetadata": self.model_metadata,
            "ModelInfer": self.model_infer, "ModelConfig": self.model_config,
            "ModelStatistics": self.model_statistics, "RepositoryIndex": self.repository_index,
            "RepositoryModelLoad": self.repository_model_load,
            "RepositoryModelUnload": self.repository_model_unload,
            "SystemSharedMemoryStatus": self.system_shm_status,
            "SystemSharedMemoryRegister": self.system_shm_register,
            "SystemSharedMemoryUnregister": self.system_shm_unregister,
            "CudaSharedMemoryStatus": self.cuda_shm_status,
            "CudaSharedMemoryRegister": self.cuda_shm_register,
            "CudaSharedMemoryUnregister": self.cuda_shm_unregister,
            "TraceSetting": self.trace_setting, "LogSettings": self.log_settings,
        }
        table = {f"/{SERVICE}/{name}": Method(handler) for name, handler in unary.items()}
        table[f"/{SERVICE}/ModelInfer"] = Method(self.model_infer, now=self.model_infer_now)
        table[f"/{SERVICE}/ModelStreamInfer"] = Method(self.model_stream_infer, streaming=True)
        table[f"/{HEALTH_SERVICE}/Check"] = Method(self.health_check)
        for path, method in table.items():
            restriction = self.restrictions.get(_RPC_CATEGORIES[path.rpartition("/")[2]])
            if restriction is not None:
                table[path] = Method(_restricted(method.handler, restriction), method.streaming)
        return table

    # ---- health and metadata --------------------------------------------------------------

    async def server_live(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        await _parse(call, pb.ServerLiveRequest, data)
        return _reply(pb.ServerLiveResponse(live=self.server.is_live()))

    async def server_ready(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        await _parse(call, pb.ServerReadyRequest, data)
        return _reply(pb.ServerReadyResponse(ready=self.server.is_ready()))

    async def model_ready(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.ModelReadyRequest, data)
        return _reply(pb.ModelReadyResponse(ready=await self.server.probe_model_ready(request.name, request.version)))

    async def health_check(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        await _parse(call, health.HealthCheckRequest, data)
        status = (health.HealthCheckResponseServingStatus.SERVING if self.server.is_ready()
                  else health.HealthCheckResponseServingStatus.NOT_SERVING)
        return _reply(health.HealthCheckResponse(status=status))

    async def server_metadata(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        await _parse(call, pb.ServerMetadataRequest, data)
        return _reply(grpc_messages.server_metadata(self.server.metadata()))

    async def model_metadata(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.ModelMetadataRequest, data)
        return _reply(grpc_messages.model_metadata(self.server.model_metadata(request.name, request.version)))

    async def model_config(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.ModelConfigRequest, data)
        return _reply(pb.ModelConfigResponse(config=self.server.model_config(request.name, request.version)))

    async def model_statistics(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.ModelStatisticsRequest, data)
        stats = await self.server.statistics(request.name, request.version)
        return _reply(grpc_messages.statistics(stats))

    # ---- repository -----------------------------------------------------------------------

    async def repository_index(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.RepositoryIndexRequest, data)
        return _reply(grpc_messages.repository_index(self.server.repository_index(request.ready)))

    async def repository_model_load(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.RepositoryModelLoadRequest, data)
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, param in request.parameters.items():
            kind, value = betterproto2.which_one_of(param, "parameter_choice")
            if key == "config":
                if kind != "string_param":
                    raise invalid_arg("the 'config' load parameter must be a string_param holding the JSON config")
                config = value
            elif key.startswith("file:"):
                if kind != "bytes_param":
                    raise invalid_arg(f"the '{key}' load parameter must be a bytes_param")
                files[key[len("file:"):]] = bytes(value or b"")
        if files and config is None:
            raise invalid_arg("file overrides need the 'config' load parameter")
        await self.server.load_model(request.model_name, config, files or None)
        return _reply(pb.RepositoryModelLoadResponse())

    async def repository_model_unload(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.RepositoryModelUnloadRequest, data)
        dependents = False
        param = request.parameters.get("unload_dependents")
        if param is not None:
            kind, value = betterproto2.which_one_of(param, "parameter_choice")
            if kind != "bool_param":
                raise invalid_arg("the 'unload_dependents' parameter must be a bool_param")
            dependents = bool(value)
        await self.server.unload_model(request.model_name, dependents)
        return _reply(pb.RepositoryModelUnloadResponse())

    # ---- shared memory (trident.server.shared_memory) ---------------------------------------------

    async def system_shm_status(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.SystemSharedMemoryStatusRequest, data)
        regions = self.server.shared_memory.system_status(request.name)
        return _reply(pb.SystemSharedMemoryStatusResponse(regions={
            r["name"]: pb.SystemSharedMemoryStatusResponseRegionStatus(**r) for r in regions}))

    async def system_shm_register(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.SystemSharedMemoryRegisterRequest, data)
        await self.server.register_system_shared_memory(request.name, request.key, request.offset,
                                                        request.byte_size)
        return _reply(pb.SystemSharedMemoryRegisterResponse())

    async def system_shm_unregister(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.SystemSharedMemoryUnregisterRequest, data)
        await self.server.unregister_shared_memory("system", request.name)
        return _reply(pb.SystemSharedMemoryUnregisterResponse())

    async def cuda_shm_status(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.CudaSharedMemoryStatusRequest, data)
        regions = self.server.shared_memory.cuda_status(request.name)
        return _reply(pb.CudaSharedMemoryStatusResponse(regions={
            r["name"]: pb.CudaSharedMemoryStatusResponseRegionStatus(**r) for r in regions}))

    async def cuda_shm_register(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.CudaSharedMemoryRegisterRequest, data)
        await self.server.register_cuda_shared_memory(request.name, request.raw_handle, request.device_id,
                                                      request.byte_size)
        return _reply(pb.CudaSharedMemoryRegisterResponse())

    async def cuda_shm_unregister(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.CudaSharedMemoryUnregisterRequest, data)
        await self.server.unregister_shared_memory("cuda", request.name)
        return _reply(pb.CudaSharedMemoryUnregisterResponse())

    # ---- settings -------------------------------------------------------------------------

    async def log_settings(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.LogSettingsRequest, data)
        changes = {key: betterproto2.which_one_of(v, "parameter_choice")[1] for key, v in request.settings.items()}
        current = await self.server.change_log_settings(changes) if changes else self.server.log_settings()
        return _reply(pb.LogSettingsResponse(settings={k: _log_value(v) for k, v in current.items()}))

    async def trace_setting(self, call: Call, data: bytearray) -> tuple[list[bytes], int]:
        request = await _parse(call, pb.TraceSettingRequest, data)
        changes = {key: (list(v.value) or None) for key, v in request.settings.items()}
        if changes:
            current = await self.server.change_trace_settings(request.model_name, changes)
        else:
            current = self.server.trace_settings(request.model_name)
        return _reply(pb.TraceSettingResponse(settings={
            k: pb.TraceSettingResponseSettingValue(value=v if isinstance(v, list) else [str(v)])
            for k, v in current.items()}))

    # ---- inference ------------------------------------------------------------------------

    def _trace_context(self, call: Call) -> TraceParent | None:
        """The client's W3C trace context (``traceparent`` / ``tracestate`` metadata; None
        without one, or a malformed or repeated one, as W3C says), remembered per header tuple."""
        headers = call.headers
        if headers is self._last[0]:  # the header block of the call before (one client, the usual case)
            return self._last[1]
        cached = self._contexts.get(id(headers))
        if cached is not None and cached[0] is headers:
            self._last = cached
            return cached[1]
        traceparent = [v for k, v in headers if k == b"traceparent"]
        context = None
        if len(traceparent) == 1:
            context = parse_traceparent(traceparent[0], b",".join(v for k, v in headers if k == b"tracestate"))
        if isinstance(headers, tuple):
            if len(self._contexts) >= _TRACE_CONTEXT_CACHE:
                self._contexts.clear()
            self._last = self._contexts[id(headers)] = (headers, context)  # holds the tuple: its id stays unique
        return context

    async def _request(self, call: Call, data: bytearray) -> InferenceRequest:
        """Decode a ModelInferRequest: inline unless it is heavy (:func:`grpc_codec.is_heavy` with
        ``offload_size``: typed contents or BYTES of that size, not raw tensors, which become views),
        then in a worker thread (the call's task waits for it). Raises TritonError(INVALID_ARG) for
        a bad message."""
        shm = self.server.shared_memory.input_view
        if not grpc_codec.is_heavy(data, call.conn.config.offload_size):
            request = _decode_request(data, shm)
        else:
            # an input the model refuses is refused before its data is decoded; a refusal in the
            # thread comes back as a TritonError, without the frames that hold the message
            named = grpc_codec.model_of(data)
            check = self.server.input_check(*named) if named is not None else None
            request = await call.run_sync(_decode_request, data, shm, check)
        if self.forward is not None:
            for key, value in call.metadata:
                if isinstance(value, str) and self.forward.fullmatch(key):
                    request.parameters[key] = value
        context = self._trace_context(call)
        if context is not None:
            request.trace = context
        if call.deadline != math.inf:  # grpc-timeout: the core starts nothing of it after (README "Deadlines")
            request.deadline = call.deadline
        return request

    async def model_infer(self, call: Call, data: bytearray) -> tuple[list[Any], int]:
        """ModelInfer in the call's task (a heavy message, decoded in a worker thread, forwarded
        headers, a restricted API): the reply ``(parts, size)``. Raises TritonError (decoupled
        models: UNSUPPORTED -> UNIMPLEMENTED)."""
        heavy = grpc_codec.is_heavy(data, call.conn.config.offload_size)
        request = await self._request(call, data)
        del data
        token = serving.set(serving_of(request))  # the lines logged meanwhile name the request
        try:
            shm_outputs = self._check_shm_outputs(request)
            handle = self.server.start(request, endpoint="ModelInfer RPC")
            if not heavy:
                return await self._reply(call, handle, shm_outputs)
            # decoded off the loop: encoded off the loop when it is large, and let go of off the
            # loop (it may hold millions of objects: BYTES elements)
            response: InferenceResponse | None = None
            try:
                response = await handle.wait()
                del handle
                return await self._encoded(call, response, shm_outputs)
            finally:
                holder = [request, response]
                del request, response
                with trio.CancelScope(shield=True):
                    await call.run_sync(let_go, holder)
        finally:
            serving.reset(token)

    def model_infer_now(self, call: Call, data: bytearray) -> None:
        """ModelInfer without a task where it can be (``Method.now``): the request is started on
        the server (Server.start) and its handle answers the call: at once when it ran here and
        now, from the task that delivers its response when it is queued and the call may be
        answered later, else from the call's task (:meth:`Call.run`). A heavy message (decoded
        in a worker thread) or forwarded headers take :meth:`model_infer`. Raises as model_infer."""
        if self.forward is not None or grpc_codec.is_heavy(data, call.conn.config.offload_size):
            call.run(self.model_infer(call, data))
            return
        request = _decode_request(data, self.server.shared_memory.input_view)
        context = self._trace_context(call)
        if context is not None:
            request.trace = context
        if call.deadline != math.inf:  # grpc-timeout: the core starts nothing of it after (README "Deadlines")
            request.deadline = call.deadline
        token = serving.set(serving_of(request))  # the lines logged meanwhile name the request
        try:
            shm_outputs = self._check_shm_outputs(request)
            handle = self.server.start(request, endpoint="ModelInfer RPC")
            if handle.response is not None:
                self._answer(call, handle.response, shm_outputs)
            elif call.may_answer_later and handle.on_final(lambda response: self._answer(call, response, shm_outputs)):
                call.answer_later(handle.cancel)  # queued: answered by whoever delivers the response
            else:
                call.run(self._reply_in_context(call, handle, shm_outputs, request))
        finally:
            serving.reset(token)

    def _answer(self, call: Call, response: InferenceResponse, shm_outputs: dict[str, Any] | None) -> None:
        """Answer a call of :meth:`model_infer_now` with its final response, here or (a large
        encode) from the call's task."""
        if response.error is not None:
            call.fail(response.error)
            return
        if serializes_many(response):
            call.run(self._encoded(call, response, shm_outputs))
            return
        try:
            parts, size = self._encode(call, response, shm_outputs)
        except Exception as e:  # writing a shared-memory output: its error is the call's
            call.fail(e)
            return
        call.answer(parts, size)

    async def _reply(self, call: Call, handle: RequestHandle,
                     shm_outputs: dict[str, Any] | None) -> tuple[list[Any], int]:
        """The reply of a request that did not run at once, awaited in the call's task (its
        cancellation cancels the request; a large encode runs in a worker thread). Raises the
        request's TritonError."""
        return await self._encoded(call, await handle.wait(), shm_outputs)

    async def _encoded(self, call: Call, response: InferenceResponse,
                       shm_outputs: dict[str, Any] | None) -> tuple[list[Any], int]:
        """:meth:`_encode` for the call's task: in a worker thread when it is large (BYTES
        elements to serialize: kserve.serializes_many). Raises as :meth:`_encode`."""
        if serializes_many(response):
            return await call.run_sync(self._encode, call, response, shm_outputs)  # type: ignore[no-any-return]
        return self._encode(call, response, shm_outputs)

    async def _reply_in_context(self, call: Call, handle: RequestHandle, shm_outputs: dict[str, Any] | None,
                                request: InferenceRequest) -> tuple[list[Any], int]:
        """:meth:`_reply` with the lines logged meanwhile naming the request (a task of its own)."""
        token = serving.set(serving_of(request))
        try:
            return await self._reply(call, handle, shm_outputs)
        finally:
            serving.reset(token)

    def _check_shm_outputs(self, request: InferenceRequest) -> dict[str, Any] | None:
        """The outputs requested in shared memory, checked before the model runs (as Triton);
        raises TritonError for a bad region."""
        shm_outputs = _shm_outputs(request)
        if shm_outputs is not None:
            self.server.shared_memory.check_outputs(shm_outputs)
        return shm_outputs

    def _encode(self, call: Call, response: InferenceResponse,
                shm_outputs: dict[str, Any] | None) -> tuple[list[Any], int]:
        """The reply's (parts, size); raises what writing a shared-memory output raises."""
        call.compress_responses = True
        if shm_outputs is None:
            return grpc_codec.encode_model_infer_response(response)
        return grpc_codec.encode_model_infer_response(response, shm_outputs=shm_outputs,
                                                      shm=self.server.shared_memory.output_view)

    async def model_stream_infer(self, call: Call) -> None:
        """ModelStreamInfer: each request runs in its own task; responses are sent as they come.

        Errors of one request travel in-band (``error_message``) and the stream stays open.
        Cancelling the call (client cancel, deadline, disconnect) cancels every request in flight.
        """
        call.compress_responses = True
        slots = trio.Semaphore(MAX_STREAM_INFLIGHT)
        async with trio.open_nursery() as nursery:
            while True:
                data = await call.recv()
                if data is None:
                    break
                await slots.acquire()
                try:
                    request = await self._request(call, data)
                except (GrpcError, TritonError) as e:
                    slots.release()
                    await self._send_error(call, InferenceResponse(), e.message)
                    continue
                nursery.start_soon(self._stream_one, call, request, slots)

    async def _stream_one(self, call: Call, request: InferenceRequest, slots: trio.Semaphore) -> None:
        serving.set(serving_of(request))  # a task of its own: the lines logged in it name the request
        empty_final = request.parameters.get("triton_enable_empty_final_response") is True
        stub = InferenceResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
        shm_outputs = _shm_outputs(request)
        if shm_outputs is not None:
            try:
                self.server.shared_memory.check_outputs(shm_outputs)
            except TritonError as e:
                slots.release()
                await self._send_error(call, stub, e.message)
                return

        async def send(response: InferenceResponse) -> None:
            if response.error is not None:
                await self._send_error(call, response if response.model_name else stub, response.error.message)
                return
            if response.flag_only and not empty_final:
                return
            params: dict[str, ParamValue] = dict(response.parameters)
            params["triton_final_response"] = response.final
            if shm_outputs is not None:  # written into their regions, sent without contents
                try:
                    inner, inner_size = grpc_codec.encode_model_infer_response(
                        response, params, shm_outputs, self.server.shared_memory.output_view)
                except TritonError as e:
                    await self._send_error(call, response, e.message)
                    return
                head = b"\x12" + grpc_codec.encode_varint(inner_size)
                await call.send_message([head, *inner], len(head) + inner_size)
                return
            parts, size = grpc_codec.encode_model_stream_infer_response(response, parameters=params)
            await call.send_message(parts, size)

        try:
            await self.server.infer_stream(request, send)
        except TritonError as e:
            await self._send_error(call, stub, e.message)
        finally:
            slots.release()

    async def _send_error(self, call: Call, response: InferenceResponse, message: str) -> None:
        parts, size = grpc_codec.encode_model_stream_infer_response(
            InferenceResponse(model_name=response.model_name, model_version=response.model_version, id=response.id),
            error_message=message,
        )
        await call.send_message(parts, size)


def _shm_outputs(request: InferenceRequest) -> dict[str, dict[str, ParamValue]] | None:
    """The requested outputs to write into shared memory (their parameters), or None."""
    found = {o.name: o.parameters for o in request.outputs if "shared_memory_region" in o.parameters}
    return found or None


def build_methods(server: Server) -> dict[str, Method]:
    """The transport's method table for ``server``."""
    return InferenceService(server).methods()
