"""The server: its nursery tree and the operations every front end calls.

``open_server`` owns the repository nursery; front ends run in a nursery inside it, so on
shutdown they stop first, in-flight requests drain (``exit_timeout_secs``) and only then are the
models unloaded. :class:`Server` is the single facade the HTTP and gRPC front ends (and
in-process users) call; it raises :class:`~trident.errors.TritonError` and never names a status.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeVar

import trio

import trident
from trident.batching.admission import check_input
from trident.errors import Code, TritonError, invalid_arg, unavailable, unsupported
from trident.observability.logs import VERBOSE, LogSettings
from trident.observability.stats import ModelStatistics
from trident.observability.trace import TraceSettings
from trident.observability.tracing import Tracer, parse_trace_config
from trident.options import ServerOptions
from trident.protocol.generated.inference import ModelConfig
from trident.server import deadlines
from trident.server.execution import InFlight, abandon_running_calls
from trident.server.handle import RequestHandle
from trident.server.model import ClusterLink, ModelVersion
from trident.server.repository import ModelRepository
from trident.server.shared_memory import SharedMemory
from trident.types import (
    IndexEntry,
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ServerMetadata,
    TensorMetadata,
)

log = logging.getLogger("trident.server")
T = TypeVar("T")

EXTENSIONS = [
    "classification",
    "sequence",
    "sequence(string_id)",
    "model_repository",
    "model_repository(unload_dependents)",
    "model_configuration",
    "schedule_policy",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]

SendResponse = Callable[[InferenceResponse], Awaitable[None]]


class Server:
    """What a Triton server answers, independent of the wire."""

    def __init__(self, options: ServerOptions, repository_nursery: trio.Nursery,
                 log_settings: LogSettings | None = None) -> None:
        self.options = options
        self.repository = ModelRepository(options, repository_nursery, server=self)
        self.logging = log_settings or LogSettings.from_options(options)
        self.tracing = TraceSettings.from_options(options)
        self.tracer = Tracer(self.tracing, parse_trace_config(list(options.trace_config))[1])
        #: client shared-memory regions (system; CUDA answers UNSUPPORTED), for both front ends
        self.shared_memory = SharedMemory(options.allow_client_shm)
        self.stopping = False
        #: when the exit must be over (trio clock), once a signal started it (trident.serve)
        self.exit_deadline: float | None = None
        #: models still loading at start-up (the front ends listen meanwhile: live, not ready)
        self.loading = False
        self._repository_nursery = repository_nursery
        self._inflight = InFlight()
        #: the link to the supervisor when this server is a worker of ``--workers`` (None: alone).
        #: Control operations (load/unload, settings, shared-memory registrations, statistics)
        #: then go through it, so that every worker applies them and answers alike.
        self.cluster: ClusterLink | None = None

    # ---- health and metadata --------------------------------------------------------------

    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        if self.stopping or self.loading:
            return False
        if self.cluster is not None and not self.cluster.ready:
            return False  # every worker must be ready (design: readiness is their conjunction)
        return self.repository.all_ready() if self.options.strict_readiness else True

    def metadata(self) -> ServerMetadata:
        return ServerMetadata(self.options.server_id, trident.__version__, tuple(EXTENSIONS))

    def model_ready(self, name: str, version: str = "") -> bool:
        """The version's state is READY (no model code runs; see :meth:`probe_model_ready`)."""
        try:
            return self.repository.get(name, version).is_ready()
        except TritonError:
            return False

    async def probe_model_ready(self, name: str, version: str = "") -> bool:
        """READY and the model's instances answer ``is_ready()`` with True within 5 s
        (``/v2/models/<m>/ready``, gRPC ModelReady). Never raises."""
        try:
            mv = self.repository.get(name, version)
        except TritonError:
            return False
        return await mv.probe_ready()

    def _get(self, name: str, version: str) -> ModelVersion:
        if not name:
            raise invalid_arg("model name is required")
        return self.repository.get(name, version)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        """KServe model metadata. Raises TritonError NOT_FOUND / UNAVAILABLE."""
        mv = self._get(name, version)
        versions = sorted(v.version for v in self.repository.serving() if v.name == name and v.state == "READY")
        batch = (-1,) if mv.max_batch_size > 0 else ()
        return ModelMetadata(
            name,
            tuple(str(v) for v in versions) if not version else (str(mv.version),),
            mv.platform,
            tuple(TensorMetadata(s.name, s.datatype, batch + tuple(s.dims)) for s in mv.inputs.values()),
            tuple(TensorMetadata(s.name, s.datatype, batch + tuple(s.dims)) for s in mv.outputs.values()),
        )

    def model_input_info(self, name: str, version: str = "") -> list[tuple[str, str, list[int]]]:
        """(name, datatype, full shape) of each input, for the raw binary request body."""
        mv = self._get(name, version)
        batch = [-1] if mv.max_batch_size > 0 else []
        return [(s.name, s.datatype, batch + s.dims) for s in mv.inputs.values()]

    def input_check(self, name: str, version: str = "") -> Callable[[str, str, tuple[int, ...]], None] | None:
        """``check(input_name, datatype, shape)`` for a decoder (protocol.kserve.InputCheck): raises
        what the model's admission would for that input, so a tensor the model refuses is refused
        before its data is read; None where the model is not serving (its request then fails
        where it starts, with that error). Never raises."""
        try:
            mv = self._get(name, version)
        except TritonError:
            return None
        return partial(check_input, mv.name, mv.max_batch_size, mv.inputs)

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        """The model's final config. Raises TritonError NOT_FOUND / UNAVAILABLE."""
        return self._get(name, version).config

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Statistics of every serving version, of one model, or of one version.

        Raises TritonError INVALID_ARG for a model or version that is not serving (Triton's
        "requested model 'm' is not available" / "requested model version is not available
        for model 'm'"), and for a version without a model name.
        """
        if not name:
            if version:
                raise invalid_arg("model version given without a model name")
            return [mv.stats.snapshot() for mv in sorted(self.repository.serving(), key=lambda m: (m.name, m.version))]
        try:
            mv = self._get(name, version)
        except TritonError as e:  # Triton's words (and INVALID_ARG) for what is not serving
            if e.code not in (Code.NOT_FOUND, Code.UNAVAILABLE):
                raise
            if version and any(v.name == name for v in self.repository.serving()):
                raise invalid_arg(f"requested model version is not available for model '{name}'") from None
            raise invalid_arg(f"requested model '{name}' is not available") from None
        if version:
            return [mv.stats.snapshot()]
        ready = [v for v in self.repository.serving() if v.name == name]
        if not ready:
            raise invalid_arg(f"requested model '{name}' is not available")
        return [v.stats.snapshot() for v in sorted(ready, key=lambda m: m.version)]

    async def statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """:meth:`model_statistics`, summed over every worker of ``--workers`` (the statistics
        extension of both front ends). Raises what :meth:`model_statistics` raises."""
        if self.cluster is not None:
            return await self.cluster.statistics(name, version)
        return self.model_statistics(name, version)

    # ---- repository -----------------------------------------------------------------------

    def repository_index(self, ready: bool = False) -> list[IndexEntry]:
        return self.repository.index(ready)

    async def load_model(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Load or reload a model (explicit mode); with ``--workers``, in every worker, answering
        once all have it ready (or with the first failure, none left half-loaded). Raises
        TritonError with the reason."""
        if self.cluster is not None:
            self.repository.check_load(name, config, files)
            await self.cluster.load(name, config, files)
            return
        await self.repository.load(name, config, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Drain and unload a model (explicit mode), in every worker. Raises TritonError."""
        if self.cluster is not None:
            self.repository.check_unload(name)
            await self.cluster.unload(name, unload_dependents)
            return
        await self.repository.unload(name, unload_dependents)

    # ---- client shared memory (trident.server.shared_memory; in every worker) ------------------

    async def register_system_shared_memory(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register a system shared-memory region (every worker maps it). Raises TritonError."""
        if self.cluster is not None:
            self.shared_memory.check_register(name)
            await self.cluster.call_all("shm_register_system", name=name, key=key, offset=offset,
                                        byte_size=byte_size)
            return
        self.shared_memory.register_system(name, key, offset, byte_size)

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register a CUDA shared-memory region (opened in a worker thread: CUDA starts on first
        use). Raises TritonError."""
        if self.cluster is not None:
            self.shared_memory.check_register(name)
            from trident.cluster.wire import encode_bytes

            await self.cluster.call_all("shm_register_cuda", name=name, raw_handle=encode_bytes(raw_handle),
                                        device_id=device_id, byte_size=byte_size)
            return
        await trio.to_thread.run_sync(self.shared_memory.register_cuda, name, raw_handle, device_id, byte_size)

    async def unregister_shared_memory(self, kind: str, name: str = "") -> None:
        """Unregister a ``kind`` ("system" or "cuda") region, or every one of that kind when
        ``name`` is "". Raises TritonError."""
        if self.cluster is not None:
            self.shared_memory.check_allowed()
            await self.cluster.call_all("shm_unregister", kind=kind, name=name)
            return
        if kind == "system":
            self.shared_memory.unregister_system(name)
        else:
            self.shared_memory.unregister_cuda(name)

    # ---- inference ------------------------------------------------------------------------

    def _admit(self) -> None:
        if self.stopping:
            raise unavailable("Server is stopping")
        self._inflight.enter()

    def _release(self) -> None:
        self._inflight.leave()

    def start(self, request: InferenceRequest, *, endpoint: str = "HTTP end point") -> RequestHandle:
        """Start a request that must give exactly one response: its
        :class:`~trident.server.handle.RequestHandle`, whatever the model (see that module for
        what a handle is and how to finish one).

        Without a task switch where it can be: a request that ran here and now (an idle
        instance run inline, nothing in the way) comes back answered (``handle.response``);
        a queued one is completed by the task that delivers its response (``handle.on_final``,
        or ``await handle.wait()``); anything else runs in the task that awaits
        ``handle.wait()``. A handle not answered holds the server's admission until it is
        over: the caller awaits it in the task that owns the request, or cancels it.

        Raises TritonError here: NOT_FOUND / UNAVAILABLE for the model, INVALID_ARG for the
        request, UNSUPPORTED (naming ``endpoint``) for decoupled models, UNAVAILABLE when the
        server is stopping or the queue is full, and the model's error for a request answered
        at once; ``handle.wait()`` raises the others. Cancellation: cancelling the task that
        awaits the handle (or ``handle.cancel()``) cancels the request (dropped if still queued).
        """
        # a timeout parameter: answered by its deadline, in the awaiting task (a deadline set by
        # the gRPC front end or a BLS call is kept by their own cancel scopes)
        if request.parameters and deadlines.apply_timeout_parameter(request, trio.current_time()):
            return RequestHandle(lambda handle, send: self._by_deadline(request, endpoint, send))
        if log.isEnabledFor(VERBOSE):  # the logged way: in the awaiting task
            return RequestHandle(lambda handle, send: self._logged_infer(request, endpoint, send))
        return self._start(request, endpoint)

    async def _by_deadline(self, request: InferenceRequest, endpoint: str, send: SendResponse) -> None:
        """:meth:`start`'s request with a deadline: its response, or UNAVAILABLE "Request
        timeout expired" when the deadline passes first (see :meth:`_within_deadline`).
        Cancellation: as :meth:`infer`."""
        if log.isEnabledFor(VERBOSE):
            response = await self._within_deadline(request, lambda: self._logged(self._started(request, endpoint),
                                                                                 request))
        else:
            response = await self._within_deadline(request, lambda: self._start(request, endpoint).wait())
        await send(response)

    async def _stream_by_deadline(self, request: InferenceRequest, forwarded: bool, send: SendResponse) -> None:
        """:meth:`start_stream`'s request with a deadline: the responses sent before it stand,
        then UNAVAILABLE "Request timeout expired" (see :meth:`_within_deadline`)."""
        await self._within_deadline(request, lambda: self._start_stream(request, forwarded).stream(send))

    @staticmethod
    async def _within_deadline(request: InferenceRequest, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()`` until ``request.deadline``: its result, or UNAVAILABLE "Request timeout
        expired" when the deadline passes first (the request is cancelled: dropped if queued, its
        result discarded if running, nothing of it starts after; the executor's own drop at the
        deadline, a CANCELLED error, is answered the same). Raises what ``call`` raises before
        the deadline."""
        deadline = request.deadline
        assert deadline is not None
        if trio.current_time() >= deadline:
            raise deadlines.timeout_expired()
        with trio.move_on_at(deadline):
            try:
                return await call()
            except TritonError as e:  # dropped by the executor at its deadline (deadlines.expired)
                if e.code is not Code.CANCELLED or trio.current_time() < deadline:
                    raise
        raise deadlines.timeout_expired()

    def _start(self, request: InferenceRequest, endpoint: str) -> RequestHandle:
        """:meth:`start` without its logging."""
        try:
            mv = self.repository.get(request.model_name, request.model_version)
        except TritonError:
            if not self.repository.loads_on_demand(request.model_name):
                raise
            return RequestHandle(lambda handle, send: self._on_demand(request, send, endpoint=endpoint))
        if mv.decoupled:
            raise unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")
        self._admit()
        try:
            handle = mv.start(request)
        except BaseException:
            self._release()
            raise
        if handle.response is not None:
            self._release()
        else:
            handle.on_close(self._release)
        return handle

    async def infer(self, request: InferenceRequest, *, endpoint: str = "HTTP end point") -> InferenceResponse:
        """Run a request that must give exactly one response: :meth:`start`, awaited.

        Raises TritonError: NOT_FOUND / UNAVAILABLE for the model, INVALID_ARG for the
        request, UNSUPPORTED for decoupled models, the model's error for a failed execution.
        Cancellation: cancelling the caller cancels the request (dropped if still queued).
        """
        await trio.lowlevel.checkpoint_if_cancelled()  # a caller already cancelled runs nothing
        return await self.start(request, endpoint=endpoint).wait()

    def infer_now(self, request: InferenceRequest, *,
                  endpoint: str = "HTTP end point") -> InferenceResponse | Awaitable[InferenceResponse]:
        """:meth:`infer` without a task switch where it can be: the response when the request
        ran here and now, else an awaitable that finishes it, to be awaited in the task that
        owns the request (it holds the server's admission: never drop it). :meth:`start` says
        the same with a handle. Raises, here or from the awaitable, what :meth:`infer` raises."""
        handle = self.start(request, endpoint=endpoint)
        response = handle.response
        return response if response is not None else handle.wait()

    async def _logged_infer(self, request: InferenceRequest, endpoint: str, send: SendResponse) -> None:
        """:meth:`start`'s request, logged (--log-verbose >= 1), its response to ``send``."""
        await send(await self._logged(self._started(request, endpoint), request))

    async def _started(self, request: InferenceRequest, endpoint: str) -> InferenceResponse:
        """:meth:`_start`, awaited: its errors raise inside :meth:`_logged`, so they are logged."""
        return await self._start(request, endpoint).wait()

    async def _logged(self, call: Awaitable[Any], request: InferenceRequest) -> Any:
        """``await call``, logging the request's id, model and outcome (--log-verbose >= 1)."""
        what = f"model '{request.model_name}'" + (f" version {request.model_version}" if request.model_version else "")
        rid = request.id or "<id_unknown>"
        log.log(VERBOSE, "infer request %s to %s: %d input(s)", rid, what, len(request.inputs), extra={"verbose": 1})
        try:
            result = await call
        except TritonError as e:
            log.log(VERBOSE, "infer request %s to %s failed: %s %s", rid, what, e.code.value, e.message,
                    extra={"verbose": 1})
            raise
        except BaseException as e:
            log.log(VERBOSE, "infer request %s to %s ended: %s", rid, what, type(e).__name__, extra={"verbose": 1})
            raise
        log.log(VERBOSE, "infer request %s to %s: OK", rid, what, extra={"verbose": 1})
        return result

    def start_stream(self, request: InferenceRequest, *, forwarded: bool = False) -> RequestHandle:
        """Start a request of any model (decoupled included): its handle, whose
        ``await handle.stream(send)`` sends each response, the last one final (the task that
        awaits it runs the request). ``forwarded``: a request another worker of ``--workers``
        forwarded here, served here whatever its route says.

        Raises TritonError here: NOT_FOUND / UNAVAILABLE for the model, INVALID_ARG for the
        request, UNAVAILABLE when the server is stopping; ``stream`` raises the errors before
        the first response (later errors arrive as responses with ``error`` set).
        Cancellation: cancelling the task in ``stream`` cancels the request.
        """
        if request.parameters and deadlines.apply_timeout_parameter(request, trio.current_time()):
            return RequestHandle(lambda handle, send: self._stream_by_deadline(request, forwarded, send))
        return self._start_stream(request, forwarded)

    def _start_stream(self, request: InferenceRequest, forwarded: bool) -> RequestHandle:
        """:meth:`start_stream` without its deadline."""
        try:
            mv = self.repository.get(request.model_name, request.model_version)
        except TritonError:
            if not self.repository.loads_on_demand(request.model_name):
                raise
            return RequestHandle(lambda handle, send: self._on_demand(request, send, stream=True))
        self._admit()
        try:
            handle = mv.start_stream(request, here=forwarded)
        except BaseException:
            self._release()
            raise
        handle.on_close(self._release)
        return handle

    async def _on_demand(self, request: InferenceRequest, send: SendResponse, *, endpoint: str = "",
                         stream: bool = False) -> None:
        """A request whose model is not loaded (``--model-load-on-demand``): wait for its load
        (:meth:`ModelRepository.load_on_demand`), then start it again. Raises what the load
        raises, then what :meth:`start` / :meth:`start_stream` raise. Cancellation: the request
        stops waiting (the load goes on)."""
        if self.stopping:
            raise unavailable("Server is stopping")
        await self.repository.load_on_demand(request.model_name)
        if stream:
            await self.start_stream(request).stream(send)
        else:
            await send(await self._start(request, endpoint).wait())

    async def infer_stream(self, request: InferenceRequest, send: SendResponse) -> None:
        """Run a request and ``await send(response)`` for each of its responses (last is final):
        :meth:`start_stream`, streamed.

        Raises TritonError for errors before the first response; later errors arrive as
        responses with ``error`` set. Cancellation: as :meth:`infer`.
        """
        if log.isEnabledFor(VERBOSE):
            await self._logged(self._infer_stream(request, send), request)
        else:
            await self.start_stream(request).stream(send)

    async def _infer_stream(self, request: InferenceRequest, send: SendResponse) -> None:
        await self.start_stream(request).stream(send)

    async def infer_forwarded(self, request: InferenceRequest, send: SendResponse) -> None:
        """Serve a request another worker of ``--workers`` forwarded to this one, here (its
        responses through ``send``; decoupled models too). Raises as :meth:`infer_stream`."""
        await self.start_stream(request, forwarded=True).stream(send)

    async def load_models(self) -> None:
        """Load what the control mode asks for at start-up (and start polling in poll mode);
        readiness is false until it returns. Raises what the repository's start-up raises."""
        self.loading = True
        try:
            await self.repository.startup()
            if self.options.model_control_mode == "poll":
                await self._repository_nursery.start(self.repository.serve_polling)
        finally:
            self.loading = False

    async def wait_drained(self, timeout: float) -> bool:
        """Wait until no request is in flight or ``timeout`` seconds pass; True if drained."""
        with trio.move_on_after(timeout):
            await self._inflight.idle.wait()
            return True
        return False

    # ---- logging and trace settings -------------------------------------------------------

    def log_settings(self) -> dict[str, Any]:
        return self.logging.as_dict()

    def update_log_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        return self.logging.update(settings)

    async def change_log_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        """:meth:`update_log_settings` in every worker (the logging extension). Raises TritonError."""
        if self.cluster is not None:
            return await self.cluster.call_first("log_settings", settings=settings)
        return self.update_log_settings(settings)

    def trace_settings(self, model: str = "") -> dict[str, Any]:
        if model:
            self._check_model_known(model)
        return self.tracing.get(model)

    def update_trace_settings(self, model: str, settings: dict[str, Any], *,
                              allow_trace_file: bool = False) -> dict[str, Any]:
        """Change the global (``model`` "") or a model's trace settings; returns the result.

        Raises TritonError: UNSUPPORTED when ``trace_file`` is among the keys (as Triton, the
        trace file can be set on the command line only: a client must not pick a path the
        server writes to) unless ``allow_trace_file`` (in-process callers); INVALID_ARG for an
        unknown model, key or bad value.
        """
        if model:
            self._check_model_known(model)
        if "trace_file" in settings and not allow_trace_file:
            raise unsupported("trace file location can not be updated through network protocol")
        return self.tracing.update(model, settings)

    async def change_trace_settings(self, model: str, settings: dict[str, Any]) -> dict[str, Any]:
        """:meth:`update_trace_settings` (never the trace file) in every worker (the trace
        extension). Raises TritonError."""
        if self.cluster is not None:
            if model:
                self._check_model_known(model)
            if "trace_file" in settings:
                raise unsupported("trace file location can not be updated through network protocol")
            return await self.cluster.call_first("trace_settings", model=model, settings=settings)
        return self.update_trace_settings(model, settings)

    def _check_model_known(self, model: str) -> None:
        if model not in self.repository.names():
            raise invalid_arg(f"Request for unknown model : {model}")


@asynccontextmanager
async def open_server(options: ServerOptions | None = None,
                      log_settings: LogSettings | None = None, *, load: bool = True) -> AsyncIterator[Server]:
    """A running server without front ends (in-process use and the base of ``serve``).

    Raises TritonError UNSUPPORTED for ``options.workers`` other than 1 (one process only).

    Loads the models the control mode asks for before yielding (with ``load=False`` the caller
    does, with :meth:`Server.load_models`: ``serve`` listens first, and the server is not ready
    until that load has run); on exit drains in-flight requests (up to ``exit_timeout_secs``)
    and unloads every model.
    """
    options = options or ServerOptions()
    if options.workers != 1:  # the in-process API is one process: --workers is trident serve's
        raise unsupported(f"workers={options.workers}: an in-process server runs in this process only; "
                          "several worker processes are a `trident serve --workers` feature")
    async with trio.open_nursery() as repository_nursery:
        server = Server(options, repository_nursery, log_settings)
        # not ready before the start-up load: front ends that listen first answer not ready
        server.loading = True
        if load:
            await server.load_models()
        try:
            yield server
        finally:
            server.stopping = True
            with trio.CancelScope(shield=True):
                # the exit's one deadline (set by serve at the signal), else exit_timeout_secs from now
                deadline = server.exit_deadline or trio.current_time() + options.exit_timeout_secs
                if not await server.wait_drained(max(0.0, deadline - trio.current_time())):
                    log.warning("exit timeout expired with %d request(s) in flight", server._inflight.count)
                # well-behaved models still get a moment to finalize after a drain that used it all
                with trio.move_on_at(max(deadline, trio.current_time() + 1.0)) as unloading:
                    await server.repository.unload_all()
                if unloading.cancelled_caught:  # a model stuck in execute must not keep the process up
                    abandon_running_calls(server)
            server.tracer.close()
            server.shared_memory.close()
            repository_nursery.cancel_scope.cancel()
