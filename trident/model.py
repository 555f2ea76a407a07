"""A loaded model version: its nursery, instances, queue, request validation and statistics.

Lifetime (:meth:`ModelVersion.run`, started with ``nursery.start`` in the repository's
nursery): load every instance in its own worker thread, start one worker task per instance,
report READY, wait for unload, drain in-flight requests, cancel the workers, finalize the
instances in threads. A load failure raises out of ``nursery.start``.

Request path (:meth:`ModelVersion.infer_stream`): validate, enqueue, then forward the
request's responses as the workers produce them. The awaiting task owns the request:
cancelling it marks the request cancelled, so a queued request is dropped before batch
assembly and a running one has its result discarded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import trio

from trident import config as cfg
from trident.backends import Backend, LoadContext, ModelInstance
from trident.batching import make_scheduler
from trident.batching.scheduler import Scheduler
from trident.errors import Code, TritonError, internal, invalid_arg, unavailable
from trident.execution import BatchExecutor, Pending
from trident.protocol.generated.inference import ModelConfig, ModelInstanceGroupKind
from trident.stats import StatsRecorder
from trident.types import InferenceRequest, InferenceResponse

log = logging.getLogger("trident.model")

SendResponse = Callable[[InferenceResponse], Awaitable[None]]


class _TensorSpec:
    __slots__ = ("name", "datatype", "dims", "optional", "labels")

    def __init__(self, name: str, datatype: str, dims: list[int], optional: bool = False) -> None:
        self.name = name
        self.datatype = datatype
        self.dims = dims  # without the batch dimension
        self.optional = optional
        self.labels: list[str] | None = None


class ModelVersion:
    """One version of one model, loaded into its instances."""

    def __init__(
        self,
        name: str,
        version: int,
        config: ModelConfig,
        backend: Backend,
        model_dir: Path,
        *,
        backend_config: dict[str, str] | None = None,
        server: Any = None,
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
        self.inflight = 0
        self.dropped = 0  # cancelled while queued: never executed
        self.discarded = 0  # cancelled while running: result thrown away
        self.instances: list[ModelInstance] = []
        self._backend_config = backend_config or {}
        self._server = server
        self._unload = trio.Event()
        self.stopped = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self.executor = BatchExecutor(self)
        self.scheduler: Scheduler = make_scheduler(config, self.on_drop)
        self.inputs = {
            i.name: _TensorSpec(i.name, cfg.api_datatype(i.data_type), list(i.dims), bool(i.optional))
            for i in config.input
        }
        self.outputs: dict[str, _TensorSpec] = {}
        for o in config.output:
            spec = _TensorSpec(o.name, cfg.api_datatype(o.data_type), list(o.dims))
            if o.label_filename:
                spec.labels = (model_dir / o.label_filename).read_text().splitlines()
            self.outputs[o.name] = spec

    # ---- lifetime -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load, serve until :meth:`request_unload`, drain, finalize.

        Raises TritonError (before ``task_status.started``) when an instance fails to load.
        """
        try:
            await self._run(task_status)
        finally:
            self.state = "UNAVAILABLE"
            self.stopped.set()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        contexts = self._instance_contexts()
        try:
            async with trio.open_nursery() as loads:
                for i, ctx in enumerate(contexts):
                    loads.start_soon(self._load_instance, i, ctx)
        except BaseExceptionGroup as group:
            await self._finalize_instances()
            raise error_of(_first_leaf(group)) from group
        except BaseException:
            await self._finalize_instances()
            raise
        if len(self.instances) != len(contexts):  # pragma: no cover - defensive
            raise internal(f"failed to load all instances of '{self.name}'")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.scheduler.run, list(self.instances), self.executor)
            self.state = "READY"
            task_status.started()
            await self._unload.wait()
            self.state = "UNLOADING"
            await self._idle.wait()
            nursery.cancel_scope.cancel()
        await self._finalize_instances()
        self.state = "UNAVAILABLE"
        self.reason = "unloaded"

    def request_unload(self) -> None:
        """Stop accepting requests; :meth:`run` drains, finalizes and returns."""
        if self.state in ("READY", "LOADING"):
            self.state = "UNLOADING"
        self._unload.set()

    def _instance_contexts(self) -> list[LoadContext]:
        contexts: list[LoadContext] = []
        for group in self.config.instance_group:
            kind = "KIND_" + ModelInstanceGroupKind(group.kind).name  # betterproto2 strips the prefix
            devices = list(group.gpus) if kind == "KIND_GPU" and group.gpus else [0]
            for device in devices:
                for k in range(max(1, group.count)):
                    contexts.append(
                        LoadContext(
                            model_name=self.name,
                            version=self.version,
                            model_dir=self.model_dir,
                            version_dir=self.model_dir / str(self.version),
                            config=self.config,
                            config_json=self.config_json,
                            instance_name=f"{group.name}_{len(contexts)}" if group.name else f"{self.name}_{k}",
                            instance_kind=kind,
                            device_id=device,
                            backend_config=self._backend_config,
                            server=self._server,
                        )
                    )
        if not contexts:
            contexts.append(
                LoadContext(
                    self.name, self.version, self.model_dir, self.model_dir / str(self.version),
                    self.config, self.config_json, f"{self.name}_0", "KIND_CPU", 0,
                    self._backend_config, self._server,
                )
            )
        return contexts

    async def _load_instance(self, index: int, ctx: LoadContext) -> None:
        try:
            instance = await trio.to_thread.run_sync(self.backend.load_instance, ctx)
        except TritonError:
            raise
        except Exception as e:
            raise internal(f"failed to load '{self.name}' version {self.version}: {type(e).__name__}: {e}") from e
        self.instances.append(instance)

    async def _finalize_instances(self) -> None:
        instances, self.instances = self.instances, []
        for instance in instances:
            try:
                await trio.to_thread.run_sync(instance.finalize)
            except Exception:
                log.exception("finalize of '%s' version %d failed", self.name, self.version)

    def on_drop(self, pending: Pending) -> None:
        """A cancelled request left the queue without executing."""
        self.dropped += 1

    # ---- front door -----------------------------------------------------------------------

    def queued(self) -> int:
        """Requests waiting in the queue (not yet executing)."""
        return self.scheduler.queued()

    def is_ready(self) -> bool:
        return self.state == "READY"

    async def infer_stream(self, request: InferenceRequest, send: SendResponse) -> None:
        """Run ``request`` and ``await send(response)`` for each response (the last is final).

        Raises TritonError: INVALID_ARG for a bad request, UNAVAILABLE when the version is
        not serving. Cancellation: cancelling the caller cancels the request; a queued request
        is dropped, a running one has its result discarded.
        """
        if self.state != "READY":
            raise unavailable(f"model '{self.name}' version {self.version} is not ready (state {self.state})")
        batch_size = self.validate(request)
        pending = Pending(request, batch_size, self.executor.finish)
        self.inflight += 1
        self._idle = trio.Event() if self.inflight == 1 else self._idle
        try:
            self.scheduler.enqueue(pending)
            first = True
            async with pending.receive:
                async for response in pending.receive:
                    if response.error is not None and response.final and first:
                        self._record(pending, ok=False)
                        raise response.error
                    first = False
                    await send(response)
                    if response.final:
                        self._record(pending, ok=response.error is None)
                        return
        except trio.Cancelled:
            request.cancel()
            self.stats.record_failure(time.monotonic_ns() - request.arrival_ns, cancelled=True)
            raise
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    def _record(self, pending: Pending, ok: bool) -> None:
        now = time.monotonic_ns()
        request_ns = now - pending.request.arrival_ns
        if not ok:
            self.stats.record_failure(request_ns)
            return
        start, infer_end, end = pending.exec_ns or (now, now, now)
        self.stats.record_success(request_ns, start - pending.enqueued_ns, 0, infer_end - start, end - infer_end)

    def validate(self, request: InferenceRequest) -> int:
        """Check names, datatypes and shapes against the config; return the batch size.

        Raises TritonError(INVALID_ARG) with Triton's wording.
        """
        name = self.name
        seen: set[str] = set()
        batch = 1 if self.max_batch_size <= 0 else -1
        for tensor in request.inputs:
            spec = self.inputs.get(tensor.name)
            if spec is None:
                raise invalid_arg(f"unexpected inference input '{tensor.name}' for model '{name}'")
            if tensor.name in seen:
                raise invalid_arg(f"input '{tensor.name}' is specified more than once for model '{name}'")
            seen.add(tensor.name)
            if tensor.datatype != spec.datatype:
                raise invalid_arg(
                    f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                    f"but model '{name}' expects '{spec.datatype}'"
                )
            shape = list(tensor.shape)
            dims = shape
            if self.max_batch_size > 0:
                if not shape:
                    raise invalid_arg(
                        f"input '{tensor.name}' for model '{name}' has no batch dimension (max_batch_size "
                        f"{self.max_batch_size}); expected shape {[-1, *spec.dims]}"
                    )
                if batch == -1:
                    batch = shape[0]
                elif shape[0] != batch:
                    raise invalid_arg(f"input '{tensor.name}' batch size does not match other inputs for '{name}'")
                dims = shape[1:]
            if not _dims_match(dims, spec.dims):
                expected = [-1, *spec.dims] if self.max_batch_size > 0 else spec.dims
                raise invalid_arg(
                    f"unexpected shape for input '{tensor.name}' for model '{name}'. "
                    f"Expected {_fmt(expected)}, got {_fmt(shape)}"
                )
            if tensor.data.shape != tuple(tensor.shape) and tensor.data.size != int(np.prod(tensor.shape)):
                raise invalid_arg(f"input '{tensor.name}' data does not match its shape {_fmt(shape)}")
        missing = [n for n, s in self.inputs.items() if n not in seen and not s.optional]
        if missing:
            got = sorted(seen)
            raise invalid_arg(
                f"expected {len(self.inputs)} inputs but got {len(seen)} inputs for model '{name}'. "
                f"Got input(s) {got}, but missing required input(s) {missing}. Please provide all required input(s)."
            )
        if self.max_batch_size > 0:
            if batch < 1 and request.inputs:
                raise invalid_arg(f"inference request batch-size must be >= 1 for '{name}'")
            if batch > self.max_batch_size:
                raise invalid_arg(f"inference request batch-size must be <= {self.max_batch_size} for '{name}'")
        for wanted in request.outputs:
            if wanted.name not in self.outputs:
                raise invalid_arg(f"unexpected inference output '{wanted.name}' for model '{name}'")
            k = wanted.parameters.get("classification")
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
                raise invalid_arg(f"classification parameter of output '{wanted.name}' must be a non-negative integer")
        return max(batch, 1)


def _dims_match(shape: list[int], dims: list[int]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _fmt(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


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
