"""A loaded model version (every model, ensembles included): its nursery, instances, queue,
request validation, response cache, tracing and statistics.

Lifetime (:meth:`ModelVersion.serve`, started with ``nursery.start`` in the repository's
nursery): load every instance in its own worker thread, register them with the rate limiter,
run the ``model_warmup`` samples on each, start the scheduler (one worker task per instance),
report READY, wait for unload, drain in-flight requests, cancel the workers, finalize the
instances in threads. A load or warmup failure raises out of ``nursery.start``.
:meth:`ModelVersion.update_instances` applies an instance-count change in place. An ensemble
loads nothing: its scheduler checks the steps against the composing models, and it is READY
while they are.

Request path (:meth:`ModelVersion.infer_stream`): validate, answer from the response cache
when enabled and it has the answer, else enqueue, then forward the request's responses as the
workers produce them (in dequeue order with ``preserve_ordering``). The awaiting task owns the
request: cancelling it marks the request cancelled, so a queued request is dropped before
batch assembly and a running one has its result discarded. An ensemble's request runs its
steps instead of queueing (trident.batching.ensemble).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import trio

from trident import config as cfg
from trident.backends import Backend, LoadContext, ModelInstance
from trident.backends.base import ModelHost, NoThreads, Threads
from trident.batching import make_scheduler
from trident.batching.admission import (
    QUEUE_DELAY_PARAMETER,
    LoadShedder,
    queue_delay_target_us,
    tensor_specs,
    validate_request,
)
from trident.batching.cache import request_key
from trident.batching.ensemble import EnsembleRequest, EnsembleScheduler, Resolve
from trident.batching.ensemble_plan import EnsemblePlan
from trident.batching.instances import InstanceSpec, instance_specs
from trident.batching.scheduler import Scheduler
from trident.batching.warmup import WarmupSample, warm_up, warmup_samples
from trident.config import INLINE_MODES, INLINE_PARAMETER
from trident.errors import Code, TritonError, internal, unavailable, unsupported
from trident.observability.model_metrics import observer_for
from trident.observability.stats import BACKEND, CANCELED, OTHER, REJECTED, ModelStatistics, StatsRecorder
from trident.observability.tracing import Tracer
from trident.options import ServerOptions
from trident.protocol.generated.inference import ModelConfig
from trident.server import deadlines
from trident.server.execution import BatchExecutor, InFlight, Pending
from trident.server.handle import RequestHandle
from trident.server.worker_threads import open_thread_nursery
from trident.types import InferenceRequest, InferenceResponse

log = logging.getLogger("trident.model")

SendResponse = Callable[[InferenceResponse], Awaitable[None]]
READY_PROBE_TIMEOUT_SECS = 5.0  # Triton's timeout for a model's is_ready()



class ClusterLink(Protocol):
    """What a worker's server asks of its supervisor (trident.cluster.worker implements it)."""

    ready: bool

    async def load(self, name: str, config: str | None, files: dict[str, bytes] | None) -> None: ...

    async def unload(self, name: str, unload_dependents: bool) -> None: ...

    async def statistics(self, name: str, version: str) -> list[ModelStatistics]: ...

    async def call_all(self, op: str, **fields: Any) -> None: ...

    async def call_first(self, op: str, **fields: Any) -> dict[str, Any]: ...

    def route_for(self, name: str, config: ModelConfig, backend: Any) -> Any: ...


class HostServer(ModelHost, Protocol):
    """The server a model version belongs to (trident.server.core.Server implements it): what
    model code may ask of it (:class:`ModelHost`), its options, its tracer and, under
    ``--workers``, its link to the supervisor."""

    options: ServerOptions
    tracer: Tracer

    @property
    def cluster(self) -> ClusterLink | None: ...

class ModelVersion:
    """One version of one model: the front door of every model, ensembles included.

    A regular model is loaded into its instances (``backend``) and queues requests for them;
    an ensemble (``platform: "ensemble"``, no backend) runs each request's steps through its
    :class:`~trident.batching.ensemble.EnsembleScheduler`. Both share the lifetime, the drain,
    validation, the response cache, tracing and statistics below.
    """

    def __init__(
        self,
        name: str,
        version: int,
        config: ModelConfig,
        backend: Backend | None,
        model_dir: Path,
        *,
        backend_config: dict[str, str] | None = None,
        server: HostServer | None = None,
        rate_limiter: Any = None,
        cache: Any = None,
        resolve: Resolve | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.config = config
        self.config_json = cfg.config_to_json(config)
        self.backend = backend
        self.model_dir = model_dir
        self.platform = config.platform or config.backend
        self.max_batch_size = int(config.max_batch_size)
        policy = config.model_transaction_policy
        self.decoupled = bool(policy and policy.decoupled)
        self.state = "LOADING"
        self.reason = ""
        self.stats = StatsRecorder(name, str(version))
        self.latency = observer_for(server.options if server is not None else None, config)  # summaries / first-response histogram (--metrics-config)
        self.load_duration_s = 0.0  # set by the repository once loaded (nv_model_load_duration_secs)
        self._tracer = server.tracer if server is not None else None
        #: requests that await in flight (unloading waits until none is)
        self.inflight = InFlight()
        self.dropped = 0  # cancelled while queued: never executed
        self.discarded = 0  # cancelled while running: result thrown away
        self.instances: list[ModelInstance] = []
        self._specs: dict[int, InstanceSpec] = {}  # id(instance) -> what it was loaded as
        self._samples: list[WarmupSample] = []
        self.rate_limiter = rate_limiter
        enabled = config.response_cache is not None and config.response_cache.enable
        self.cache = cache if enabled and not self.decoupled else None
        if enabled and cache is None:
            log.warning("model '%s' enables response_cache but the server has no cache (--cache-config)", name)
        self._backend_config = backend_config or {}
        self._server = server
        #: ``--workers``: where a request goes instead of here (``route(request)``: the peer
        #: worker that serves it, or None for this one): the owner of a sequence's correlation
        #: id, or the worker a model is placed on (trident.cluster.link); None: always here
        cluster = server.cluster if server is not None else None
        self.route: Any = cluster.route_for(name, config, backend) if cluster is not None else None
        #: the owner of the instances' threads (serve() opens the nursery that owns them)
        self.threads: Threads = NoThreads(f"model '{name}' version {version}")
        self._unload = trio.Event()
        self.stopped = trio.Event()
        self.executor = BatchExecutor(self, inline_mode(config))
        self.scheduler: Scheduler = make_scheduler(config, self.on_drop, rate_limiter=rate_limiter,
                                                   model_dir=model_dir)
        self.inputs, self.outputs = tensor_specs(config, model_dir)
        #: the queue-delay target (load shedding; set at load by :meth:`_start_shedding`), None: off
        self.shedder: LoadShedder | None = None
        #: input signatures that passed :meth:`validate` (admission.validate_request's table)
        self._signatures: dict[tuple[tuple[str, str, tuple[int, ...]], ...], int] = {}
        #: an ensemble's scheduler (``platform: "ensemble"``; ``resolve`` finds the composing
        #: models): it runs each request's steps, the version owns no instance and no queue
        self.ensemble: EnsembleScheduler | None = None
        if config.platform == cfg.ENSEMBLE_PLATFORM:
            if resolve is None:
                raise internal(f"ensemble '{name}' needs the repository to find its composing models")
            self.ensemble = EnsembleScheduler(name, version, config, self.outputs, resolve=resolve)
            self.cache = cache if enabled else None  # Triton caches an ensemble's top-level responses

    # ---- lifetime -------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load, serve until :meth:`request_unload`, drain, finalize.

        Raises TritonError (before ``task_status.started``) when an instance fails to load.
        """
        try:
            async with open_thread_nursery() as self.threads:  # owns the instances' threads
                await self._run(task_status)
        finally:
            self.state = "UNAVAILABLE"
            self.stopped.set()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        self._start_shedding()
        if self.ensemble is not None:
            self.ensemble.start()
            self.state = "READY"
            task_status.started()
            await self._unload.wait()
            self.state = "UNLOADING"
            await self.inflight.idle.wait()
            self.reason = "unloaded"
            return
        if self.config.model_warmup and not getattr(self.backend, "remote", False):  # placed elsewhere: warmed there
            self._samples = await trio.to_thread.run_sync(warmup_samples, self.config, self.model_dir)
        self.instances = await self._start_instances(instance_specs(self.config), self.config)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.scheduler.serve, list(self.instances), self.executor)
            self.state = "READY"
            task_status.started()
            await self._unload.wait()
            self.state = "UNLOADING"
            await self.inflight.idle.wait()
            nursery.cancel_scope.cancel()
        instances, self.instances = self.instances, []
        await self._finalize(instances)
        self.state = "UNAVAILABLE"
        self.reason = "unloaded"

    def _start_shedding(self) -> None:
        """The queue-delay target: the model's parameter, else the server's default, for a model
        whose requests wait in the dynamic batcher's (or default scheduler's) queue.

        Raises TritonError: INVALID_ARG for a bad parameter, UNSUPPORTED for the parameter on an
        ensemble, a sequence model or a decoupled model (the server's default leaves those alone).
        """
        options = getattr(self._server, "options", None)
        default_us = int(float(getattr(options, "queue_delay_target_ms", 0) or 0) * 1000)
        target_us = queue_delay_target_us(self.config, default_us)
        if not target_us:
            return
        if self.ensemble is not None or self.config.sequence_batching is not None or self.decoupled:
            if QUEUE_DELAY_PARAMETER in self.config.parameters:
                raise unsupported(f"parameter {QUEUE_DELAY_PARAMETER} of model '{self.name}' applies to models "
                                  "with dynamic_batching or the default scheduler that answer once, not to "
                                  "ensembles (their composing models shed), sequence models or decoupled models")
            return
        self.shedder = LoadShedder(self.name, target_us)

    def request_unload(self) -> None:
        """Stop accepting requests; :meth:`serve` drains, finalizes and returns."""
        if self.state in ("READY", "LOADING"):
            self.state = "UNLOADING"
        self._unload.set()

    def composing(self) -> list[tuple[str, str]]:
        """An ensemble's composing models, (name, version string) in step order; [] otherwise."""
        return self.ensemble.composing() if self.ensemble is not None else []

    def refresh(self) -> None:
        """An ensemble: check its steps against the composing models now serving (after one was
        reloaded). Raises TritonError(INVALID_ARG) when they no longer fit (the plan in use stays)."""
        if self.ensemble is not None and self.ensemble.refresh():
            self._decoupled_changed()

    def use(self, plan: EnsemblePlan) -> None:
        """An ensemble: run by ``plan`` (checked against the composing models)."""
        if self.ensemble is not None and self.ensemble.use(plan):
            self._decoupled_changed()

    def _decoupled_changed(self) -> None:
        assert self.ensemble is not None
        self.decoupled = self.ensemble.decoupled
        self.config_json = cfg.config_to_json(self.config)

    def _context(self, spec: InstanceSpec, config: ModelConfig) -> LoadContext:
        return LoadContext(
            model_name=self.name,
            version=self.version,
            model_dir=self.model_dir,
            version_dir=self.model_dir / str(self.version),
            config=config,
            config_json=cfg.config_to_json(config) if config is not self.config else self.config_json,
            instance_name=spec.name,
            instance_kind=spec.kind,
            device_id=spec.device,
            backend_config=self._backend_config,
            server=self._server,
            threads=self.threads,
        )

    async def _start_instances(self, specs: list[InstanceSpec], config: ModelConfig) -> list[ModelInstance]:
        """Load (in parallel threads), register with the rate limiter and warm up ``specs``.

        Raises TritonError when one fails; the instances already loaded are finalized first.
        """
        loaded: dict[int, ModelInstance] = {}
        try:
            async with trio.open_nursery() as loads:
                for i, spec in enumerate(specs):
                    loads.start_soon(self._load_instance, i, self._context(spec, config), loaded)
            instances = [loaded[i] for i in range(len(specs))]
            for spec, instance in zip(specs, instances, strict=True):
                self._specs[id(instance)] = spec
                if self.rate_limiter is not None:
                    self.rate_limiter.register(instance, spec.needs)
            if self._samples:
                async with trio.open_nursery() as warmups:
                    for instance in instances:
                        warmups.start_soon(self._warm_up, instance)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await self._finalize(list(loaded.values()))
            leaf = _first_leaf(exc) if isinstance(exc, BaseExceptionGroup) else exc
            if isinstance(leaf, (trio.Cancelled, KeyboardInterrupt)) or not isinstance(leaf, Exception):
                raise
            raise error_of(leaf) from exc
        return instances

    async def _load_instance(self, index: int, ctx: LoadContext, loaded: dict[int, ModelInstance]) -> None:
        if self.backend is None:
            raise internal(f"model '{self.name}' has no backend to load instances with")
        try:
            instance = await trio.to_thread.run_sync(self.backend.load_instance, ctx)
        except TritonError:
            raise
        except Exception as e:
            raise internal(f"failed to load '{self.name}' version {self.version}: {type(e).__name__}: {e}") from e
        loaded[index] = instance

    async def _warm_up(self, instance: ModelInstance) -> None:
        await warm_up(instance, self._samples, model_name=self.name, decoupled=self.decoupled, validate=self.validate,
                      make_pending=lambda r: Pending(r, 1, self.executor.finish),
                      thread=self.executor.thread(instance))

    async def _finalize(self, instances: list[ModelInstance]) -> None:
        for instance in instances:
            self.executor.release(instance)
            self._specs.pop(id(instance), None)
            if self.rate_limiter is not None:
                self.rate_limiter.unregister(instance)
            try:
                await trio.to_thread.run_sync(instance.finalize)
            except Exception:
                log.exception("finalize of '%s' version %d failed", self.name, self.version)

    async def update_instances(self, config: ModelConfig) -> None:
        """Apply ``config``, whose instance counts alone differ, without reloading.

        New instances are loaded and warmed up before they get batches; removed ones finish
        their current batch, then are finalized. Raises TritonError when a new instance fails
        to load or warm up (nothing changes then) or when the scheduler cannot change its
        instances (the caller reloads instead).
        """
        if not self.scheduler.supports_instance_update:
            raise internal(f"the scheduler of model '{self.name}' cannot change its instances")
        current = {spec.name: instance for instance in self.instances
                   if (spec := self._specs.get(id(instance))) is not None}
        wanted = instance_specs(config)
        added = await self._start_instances([s for s in wanted if s.name not in current], config)
        names = {s.name for s in wanted}
        removed = [instance for name, instance in current.items() if name not in names]
        self.config = config
        self.config_json = cfg.config_to_json(config)
        for instance in added:
            self.scheduler.add_instance(instance)
        self.instances = [i for i in self.instances if i not in removed] + added
        for instance in removed:
            await self.scheduler.remove_instance(instance)
        await self._finalize(removed)
        log.info("model '%s' version %d now has %d instance(s)", self.name, self.version, len(self.instances))

    def on_drop(self, pending: Pending) -> None:
        """A cancelled request left the queue without executing."""
        self.dropped += 1

    # ---- front door -----------------------------------------------------------------------

    def queued(self) -> int:
        """Requests waiting in the queue (not yet executing; an ensemble's steps queue at their models)."""
        return self.scheduler.queued() if self.ensemble is None else 0

    def is_ready(self) -> bool:
        """READY (an ensemble: and so is every composing model)."""
        return self.state == "READY" and (self.ensemble is None or self.ensemble.ready())

    async def probe_ready(self) -> bool:
        """READY and every instance's ``is_ready()`` (run in a thread, False after 5 s, as Triton).

        A probe that times out is abandoned (its thread finishes on its own).
        """
        if self.state != "READY":
            return False
        if self.ensemble is not None:
            return self.ensemble.ready() and await self.ensemble.probe() and self.state == "READY"
        for instance in list(self.instances):
            with trio.move_on_after(READY_PROBE_TIMEOUT_SECS):
                if await trio.to_thread.run_sync(instance.is_ready, abandon_on_cancel=True):
                    continue
            return False
        return self.state == "READY"

    def start(self, request: InferenceRequest) -> RequestHandle:
        """Start ``request`` of a model that answers once (:meth:`trident.server.Server.start`):
        its :class:`~trident.server.handle.RequestHandle`.

        The common case, an idle instance whose calls run inline with no batching, response
        cache, trace or ensemble in the way, executes here, synchronously: no response loop,
        no task switch, not even a checkpoint, and the handle comes back answered. A request
        that must wait in the queue of a scheduler that delivers at once (nothing in the way
        but the queue) is queued here, and the handle is completed by the task that delivers
        its response. Anything else (an ensemble, the response cache, a trace, a call on the
        instance's thread, a model that answers later through its response sender, another
        worker of ``--workers``: :attr:`route`) is a driven handle, run by the task that awaits it.

        Raises TritonError here: UNAVAILABLE when the version is not serving or the queue is
        full, INVALID_ARG for a bad request, and the error of a request answered at once. The
        handle's ``wait()`` raises the others. Cancellation: as :meth:`infer_stream`.
        """
        batch_size = self._admit(request)
        if self.route is not None:
            peer = self.route(request)
            if peer is not None:
                return RequestHandle(lambda handle, send: self._from_peer(peer, request, send))
        trace = self._tracer.sample(self.name, self.version, request) if self._tracer is not None else None
        if self.ensemble is not None or trace is not None or self.cache is not None:
            return RequestHandle(lambda handle, send: self._drive(handle, send, request, batch_size, trace))
        scheduler = self.scheduler
        slot = scheduler.claim()
        if slot is None:
            if request.response_window == 0 and scheduler.delivers_at_once():
                return self._enqueue(request, batch_size)
            return RequestHandle(lambda handle, send: self._respond(handle, send, request, batch_size, None))
        executor = self.executor
        choice = executor.inline_choice(slot.instance)
        if request.cancelled or choice is None:  # on the instance's thread: in the awaiting task
            scheduler.release(slot)
            return RequestHandle(lambda handle, send: self._respond(handle, send, request, batch_size, None))
        handle = RequestHandle()
        pending = Pending(request, batch_size, executor.finish, handle)
        try:
            response = executor.run_one_inline(slot.instance, choice, pending)
        finally:
            scheduler.release(slot)
        if response is None:  # the model answered through its response sender
            try:
                response = handle.receive_nowait()
            except trio.WouldBlock:  # the model answers later: the awaiting task waits for it
                handle._drive = lambda handle, send: self._await_response(pending, send)
                return handle
        request.responder = None  # no request <-> responder cycle
        handle.answer(self._answered(pending, response))
        return handle

    def _enqueue(self, request: InferenceRequest, batch_size: int) -> RequestHandle:
        """Queue a request whose handle the task that delivers its response completes (see
        :meth:`start`): what :meth:`_respond` does for a queued request, without a task waiting
        in it. Raises TritonError as the scheduler's ``enqueue``."""
        pending: Pending

        def final(response: InferenceResponse | None) -> None:
            request.responder = None  # no request <-> responder cycle
            self.inflight.leave()
            if response is None:  # cancelled: the queue drops it; a running execution's result is discarded
                request.cancel()
                self.stats.record_failure(time.monotonic_ns() - request.arrival_ns,
                                          reason=deadlines.cancel_reason(request, trio.current_time()))
                return
            if response.error is None and self.latency is not None:
                self.latency.first_response(time.monotonic_ns() - request.arrival_ns)
            self._record(pending, response.error)

        handle = RequestHandle(final=final)
        pending = Pending(request, batch_size, self.executor.finish, handle)
        self.inflight.enter()
        try:
            self.scheduler.enqueue(pending)
        except TritonError:
            request.responder = None
            self.inflight.leave()
            self.stats.record_failure(time.monotonic_ns() - request.arrival_ns, reason=REJECTED)
            raise
        return handle

    async def _await_response(self, pending: Pending, send: SendResponse) -> None:
        """The response of a request that ran inline and answers later, through its response
        sender. Cancellation cancels the request."""
        request = pending.request
        handle = pending.receive
        self.inflight.enter()
        try:
            response = await handle.receive()
        except trio.Cancelled:
            request.cancel()
            self.stats.record_failure(time.monotonic_ns() - request.arrival_ns,
                                      reason=deadlines.cancel_reason(request, trio.current_time()))
            raise
        finally:
            self.inflight.leave()
            handle.close()
            request.responder = None
        await send(self._answered(pending, response))

    def _answered(self, pending: Pending, response: InferenceResponse) -> InferenceResponse:
        """Record the one response of a request run by :meth:`start`; raises its error."""
        self._record(pending, response.error)
        if response.error is not None:
            raise response.error
        if self.latency is not None:
            self.latency.first_response(time.monotonic_ns() - pending.request.arrival_ns)
        return response

    async def _from_peer(self, peer: Any, request: InferenceRequest, send: SendResponse) -> None:
        """A request of a model that answers once, served by another worker (:attr:`route`)."""
        await send(await peer.infer(request))

    def start_stream(self, request: InferenceRequest, *, here: bool = False) -> RequestHandle:
        """Start ``request`` of any model (decoupled included): a driven handle whose
        ``stream(send)`` sends each response, the last one final; ``here``: in this process
        whatever :attr:`route` says (a request another worker forwarded here).

        Raises TritonError here: INVALID_ARG for a bad request, UNAVAILABLE when the version is
        not serving; ``stream`` raises UNAVAILABLE when the queue is full or the queue timeout
        expires. Cancellation: cancelling the task in ``stream`` cancels the request; a queued
        request is dropped, a running one has its result discarded.
        """
        batch_size = self._admit(request)
        if self.route is not None and not here:
            peer = self.route(request)
            if peer is not None:
                return RequestHandle(lambda handle, send: peer.stream(request, send))
        trace = self._tracer.sample(self.name, self.version, request) if self._tracer is not None else None
        return RequestHandle(lambda handle, send: self._drive(handle, send, request, batch_size, trace))

    async def infer_stream(self, request: InferenceRequest, send: SendResponse) -> None:
        """Run ``request`` and ``await send(response)`` for each response (the last is final).

        Raises TritonError: INVALID_ARG for a bad request, UNAVAILABLE when the version is
        not serving, when the queue is full or the queue timeout expires. Cancellation:
        cancelling the caller cancels the request; a queued request is dropped, a running
        one has its result discarded.
        """
        await self.start_stream(request).stream(send)

    async def infer_here(self, request: InferenceRequest, send: SendResponse) -> None:
        """:meth:`infer_stream` in this process whatever :attr:`route` says (a request another
        worker forwarded here). Raises and cancels as infer_stream."""
        await self.start_stream(request, here=True).stream(send)

    def _admit(self, request: InferenceRequest) -> int:
        """The request's batch size, once it may run. Raises TritonError: UNAVAILABLE when the
        version is not serving or its queue-delay target refuses the request (load shedding:
        :class:`~trident.batching.admission.LoadShedder`), INVALID_ARG for a bad request."""
        if self.state != "READY":
            raise unavailable(f"model '{self.name}' version {self.version} is not ready (state {self.state})")
        batch_size = self.validate(request)
        if self.shedder is not None:
            try:
                self.shedder.admit(self.inflight.count)  # the requests ahead: queued or executing
            except TritonError:
                self.stats.record_failure(time.monotonic_ns() - request.arrival_ns, reason=REJECTED)
                raise
        return batch_size

    async def _drive(self, handle: RequestHandle, send: SendResponse, request: InferenceRequest, batch_size: int,
                     trace: Any) -> None:
        """A driven request of this version (its responses through ``handle``, to ``send``)."""
        if self.ensemble is not None:
            await self._infer_ensemble(self.ensemble, request, send, batch_size, trace)
        else:
            await self._respond(handle, send, request, batch_size, trace)

    async def _respond(self, handle: RequestHandle, send: SendResponse, request: InferenceRequest,
                       batch_size: int, trace: Any) -> None:
        """A driven request of a model that is not an ensemble: the response cache, then an
        idle instance here and now or the queue, then its responses as they come, in order
        (``preserve_ordering``), each handed to ``send``."""
        pending = Pending(request, batch_size, self.executor.finish, handle)
        last: InferenceResponse | None = None
        self.inflight.enter()
        try:
            key = None
            if self.cache is not None:
                lookup_start = time.monotonic_ns()
                key = request_key(self.name, self.version, request)
                cached = self.cache.lookup(key)
                lookup_ns = time.monotonic_ns() - lookup_start
                if cached is not None:
                    await self._send_cached(pending, cached, send, lookup_start, lookup_ns)
                    return
            # an idle instance and nothing queued: run it here and now (not a decoupled model:
            # its responses must be consumed while it executes; not a request with a deadline:
            # run by the scheduler's worker, its task can leave at the deadline while the call
            # it started runs on)
            await trio.lowlevel.checkpoint_if_cancelled()  # a caller already cancelled runs nothing
            slot = None if self.decoupled or request.deadline is not None else self.scheduler.claim()
            if slot is not None:
                try:
                    await self.executor(slot.instance, [pending], direct=True)
                finally:
                    self.scheduler.release(slot)
            else:
                try:
                    self.scheduler.enqueue(pending)
                except TritonError:
                    self.stats.record_failure(time.monotonic_ns() - request.arrival_ns, reason=REJECTED)
                    raise
            first = True
            window = pending.responder.window
            async with handle:
                while True:
                    # a response already delivered (a direct or inline call) costs no task switch,
                    # but a cancelled caller (client gone, deadline) still stops here
                    await trio.lowlevel.checkpoint_if_cancelled()
                    try:
                        response = handle.receive_nowait()
                    except trio.WouldBlock:
                        response = await handle.receive()
                    if first and pending.turn is not None:
                        await pending.turn.wait()
                    if response.error is not None and response.final and first:
                        self._record(pending, response.error)
                        raise response.error
                    if first and self.latency is not None:
                        self.latency.first_response(time.monotonic_ns() - request.arrival_ns)
                    first = False
                    last = response
                    await send(response)
                    if window is not None:
                        window.leave()
                    if response.final:
                        self._record(pending, response.error)
                        if key is not None and response.error is None:
                            self._cache_insert(key, response, lookup_ns)
                        return
        except trio.Cancelled:
            request.cancel()
            self.stats.record_failure(time.monotonic_ns() - request.arrival_ns,
                                      reason=deadlines.cancel_reason(request, trio.current_time()))
            raise
        finally:
            if trace is not None and self._tracer is not None:
                self._tracer.complete(trace, pending, last)
            if pending.turn is not None:
                pending.turn.finish()
            if pending.responder.window is not None:
                pending.responder.window.close()
            request.responder = None  # no request <-> responder cycle: the request is freed when dropped
            self.inflight.leave()

    async def _infer_ensemble(self, ensemble: EnsembleScheduler, request: InferenceRequest, send: SendResponse,
                              batch: int, trace: Any) -> None:
        """An ensemble's request: the cache, then its steps (see infer_stream)."""
        run = ensemble.request(request, send, batch if self.max_batch_size > 0 else 0)
        run.trace = trace
        self.inflight.enter()
        try:
            if self.cache is not None and not self.decoupled:
                lookup_start = time.monotonic_ns()
                key = request_key(self.name, self.version, request)
                cached = self.cache.lookup(key)
                lookup_ns = time.monotonic_ns() - lookup_start
                if cached is not None:
                    cached.model_name, cached.model_version, cached.id = self.name, str(self.version), request.id
                    await send(cached)
                    self.stats.record_cache_hit(time.monotonic_ns() - request.arrival_ns,
                                                lookup_start - request.arrival_ns, lookup_ns)
                    return
                run.on_final = lambda response: self._cache_insert(key, response, lookup_ns)
            await run.execute()
        except TritonError:
            self.stats.record_failure(time.monotonic_ns() - request.arrival_ns, reason=OTHER)
            raise
        except BaseException as exc:  # cancelled (the steps' Cancelled come grouped by the nursery)
            cancelled = _only_cancelled(exc)
            if cancelled:
                request.cancel()
            self.stats.record_failure(time.monotonic_ns() - request.arrival_ns, reason=CANCELED if cancelled else OTHER)
            raise
        else:
            self._record_ensemble(run, batch)
        finally:
            if trace is not None and self._tracer is not None:
                self._tracer.record(trace, [("REQUEST_START", request.arrival_ns), ("QUEUE_START", run.started_ns),
                                            ("REQUEST_END", time.monotonic_ns())], run.response)
            self.inflight.leave()

    def _record_ensemble(self, run: EnsembleRequest, batch: int) -> None:
        sums = run.sums
        request = run.request
        request_ns = time.monotonic_ns() - request.arrival_ns
        queue_ns = run.started_ns - request.arrival_ns
        self.stats.record_success(request_ns, queue_ns, sums.input_ns, sums.infer_ns, sums.output_ns)
        self.stats.record_execution(max(1, batch), sums.input_ns, sums.infer_ns, sums.output_ns)
        if request.stats_sink is not None:  # a nested ensemble reports to its parent
            request.stats_sink.add(sums.input_ns, sums.infer_ns, sums.output_ns)
        if self.latency is not None:
            if run.first_response_ns is not None:
                self.latency.first_response(run.first_response_ns - request.arrival_ns)
            self.latency.request(request_ns, queue_ns, sums.input_ns, sums.infer_ns, sums.output_ns)

    async def _send_cached(self, pending: Pending, response: InferenceResponse, send: SendResponse,
                           lookup_start: int, lookup_ns: int) -> None:
        request = pending.request
        response.model_name = self.name
        response.model_version = str(self.version)
        response.id = request.id
        pending.turn = self.scheduler.next_turn()
        if pending.turn is not None:
            await pending.turn.wait()
        await send(response)
        self.stats.record_cache_hit(time.monotonic_ns() - request.arrival_ns, lookup_start - pending.enqueued_ns,
                                    lookup_ns)

    def _cache_insert(self, key: int, response: InferenceResponse, lookup_ns: int) -> None:
        assert self.cache is not None
        start = time.monotonic_ns()
        if self.cache.insert(key, response):
            self.stats.record_cache_miss(lookup_ns + time.monotonic_ns() - start)

    def _record(self, pending: Pending, error: TritonError | None) -> None:
        now = time.monotonic_ns()
        if self.shedder is not None and pending.exec_ns is not None:
            self.shedder.served(pending.exec_ns[0], pending.exec_ns[3])
        request_ns = now - pending.request.arrival_ns
        if error is not None:
            rejected = pending.exec_ns is None and error.code == Code.UNAVAILABLE
            self.stats.record_failure(request_ns, reason=REJECTED if rejected else BACKEND)
            return
        start, infer_start, infer_end, end = pending.exec_ns or (now, now, now, now)
        if pending.request.stats_sink is not None:
            pending.request.stats_sink.add(infer_start - start, infer_end - infer_start, end - infer_end)
        self.stats.record_success(request_ns, start - pending.enqueued_ns, infer_start - start,
                                  infer_end - infer_start, end - infer_end)
        if self.latency is not None:
            self.latency.request(request_ns, start - pending.enqueued_ns, infer_start - start,
                                 infer_end - infer_start, end - infer_end)

    def validate(self, request: InferenceRequest) -> int:
        """Check names, datatypes and shapes against the config; return the batch size.

        Raises TritonError(INVALID_ARG) with Triton's wording.
        """
        return validate_request(self.name, self.max_batch_size, self.inputs, self.outputs, request,
                                self._signatures)


def inline_mode(config: ModelConfig) -> str:
    """The ``TRIDENT_INLINE_EXECUTION`` parameter: auto (default), always or never
    (validate_config refuses other values)."""
    param = config.parameters.get(INLINE_PARAMETER)
    mode = param.string_value.strip().lower() if param is not None else ""
    return mode if mode in INLINE_MODES else "auto"


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(e) for e in exc.exceptions)
    return isinstance(exc, trio.Cancelled)


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def error_of(exc: BaseException) -> TritonError:
    """Any exception as a TritonError (INTERNAL unless it already is one)."""
    if isinstance(exc, TritonError):
        return exc
    return TritonError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")
