"""The backend interface: how a model version becomes executable instances.

This is trident's custom backend API (Triton's ``TRITONBACKEND_*`` C API, in Python). A
backend is selected by ``backend:`` (or ``platform:``) in config.pbtxt; third-party backends
register a :class:`Backend` subclass under the entry-point group ``trident.backends``::

    # pyproject.toml of the backend's package
    [project.entry-points."trident.backends"]
    scale = "my_package.backend:ScaleBackend"     # config.pbtxt: backend: "scale"

Lifecycle, for each model version (every call blocking, each in a worker thread, never on the
event loop):

1. :meth:`Backend.auto_complete_config` (unless ``--disable-auto-complete-config``) fills in what
   the model files know (inputs, outputs, max_batch_size...);
2. :meth:`Backend.load_instance` once per instance of ``instance_group`` returns a
   :class:`ModelInstance`; :class:`LoadContext` says which model, version, folder, config and
   device, and gives the :class:`~trident.server.Server` for backends that call other models;
3. :meth:`ModelInstance.execute` runs batches formed by the model's scheduler (one batch at a
   time per instance, so an instance needs no locking of its own);
4. :meth:`ModelInstance.is_ready` answers readiness probes (``/v2/models/<m>/ready``, 5 s limit);
5. :meth:`ModelInstance.finalize` when the version unloads (after in-flight requests drained).

Execution contract: ``execute(requests)`` returns one :class:`~trident.types.InferenceResponse`
per request in the same order. An exception raised by ``execute`` fails every request of the
batch with its message (raise :class:`~trident.errors.TritonError` to choose the code); a
response with ``error`` set fails only its request. ``request.cancelled`` turns true when the
client goes away; a long computation may stop early (its result is discarded anyway).

Decoupled models (``model_transaction_policy { decoupled: true }``) return ``None`` and answer
through each request's :class:`ResponseSender`, ``request.responder``, from any thread and at
any time (also after ``execute`` returned): 0..N ``send(response, final=False)`` calls, then one
``send(response_or_None, final=True)``; ``None`` with ``final=True`` is a flag-only final
response. ``responder.is_cancelled()`` turns true when the client cancels or closes its stream.

Threads: a backend that needs a thread of its own (a reader, an event loop, a helper per call)
starts it with ``ctx.threads.start(fn, *args, name=...)``, never with ``threading.Thread``: the
server's model version owns those threads (its nursery holds them, its unload waits for them,
the server's exit timeout abandons them). Without a server (a backend used on its own, in a
tool or a test) :class:`PlainThreads` starts ordinary threads, which the interpreter joins at
exit; a server's model version gives :class:`NoThreads` until its nursery owns them.

Custom metrics: ``trident.backends.metrics.custom_metrics_for(ctx.server)`` is the server's
registry of metric families exported on the metrics port.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from trident.protocol.generated.inference import ModelConfig
    from trident.types import InferenceRequest, InferenceResponse


class ModelHost(Protocol):
    """What model code may ask of the server that loaded it (``LoadContext.server``; the
    trident Server implements it): BLS requests, model control, readiness, configs and trace
    settings. Every call runs on the server's trio loop (model code crosses into it from its
    threads with ``trio.from_thread``) and raises TritonError as the server's API does."""

    @property
    def cluster(self) -> object | None:
        """The link to the other workers under ``--workers`` (None: a server of one process)."""

    def model_ready(self, name: str, version: str = "") -> bool: ...

    def model_config(self, name: str, version: str = "") -> ModelConfig: ...

    def trace_settings(self, model: str = "") -> dict[str, Any]: ...

    async def load_model(self, name: str, config: str | None = None,
                         files: dict[str, bytes] | None = None) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    async def infer(self, request: InferenceRequest, *, endpoint: str = ...) -> InferenceResponse: ...

    async def infer_stream(self, request: InferenceRequest,
                           send: Callable[[InferenceResponse], Awaitable[None]]) -> None: ...


class ResponseSender(Protocol):
    """``request.responder``: where a request's responses go (thread-safe)."""

    #: True once the final response was sent
    complete: bool

    def send(self, response: InferenceResponse | None, final: bool) -> None:
        """Deliver a response; ``None`` needs ``final=True`` (flag-only final response).

        Raises TritonError(INTERNAL) after the final response. A response for a client that
        went away is dropped silently.
        """

    def is_cancelled(self) -> bool:
        """True once the request was cancelled (client gone, stream closed, deadline passed)."""


class OwnedThread(Protocol):
    """A thread started by :meth:`Threads.start`."""

    def join(self, timeout: float | None = None) -> None:
        """Wait until the thread's function returned (at most ``timeout`` seconds)."""

    def is_alive(self) -> bool:
        """True until the thread's function returned."""


class Threads(Protocol):
    """Where a backend's threads come from (``LoadContext.threads``)."""

    def start(self, fn: Callable[..., object], *args: object, name: str) -> OwnedThread:
        """Run ``fn(*args)`` in a thread named ``name``; callable from any thread. An exception
        ``fn`` raises is logged. Raises RuntimeError when the owner no longer takes threads
        (the model version finished unloading)."""


class PlainThreads:
    """:class:`Threads` without a server: ordinary (non-daemon) threads, joined by the
    interpreter at exit (a backend used on its own, in a tool or a test)."""

    def start(self, fn: Callable[..., object], *args: object, name: str) -> OwnedThread:
        def main() -> None:
            try:
                fn(*args)
            except BaseException:
                logging.getLogger("trident.backends").exception("thread '%s' failed", name)

        thread = threading.Thread(target=main, name=name)
        thread.start()
        return thread


class NoThreads:
    """:class:`Threads` of an owner that does not take threads (yet, or any more): a model
    version before its nursery opens. ``start`` raises RuntimeError naming the thread."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def start(self, fn: Callable[..., object], *args: object, name: str) -> OwnedThread:
        raise RuntimeError(f"thread '{name}' cannot start: {self.owner} is not serving")


@dataclass
class LoadContext:
    """Everything a backend needs to load one instance of one model version."""

    model_name: str
    version: int
    model_dir: Path  # <repository>/<model>
    version_dir: Path  # <repository>/<model>/<version>
    config: ModelConfig  # final (auto-completed, validated) config
    config_json: dict[str, Any]  # the same config in Triton's JSON shape
    instance_name: str = ""  # e.g. "add_sub_0"
    instance_kind: str = "KIND_CPU"  # KIND_CPU | KIND_GPU | KIND_MODEL
    device_id: int = 0
    backend_config: dict[str, str] = field(default_factory=dict)  # --backend-config=<backend>,k=v
    server: ModelHost | None = None  # the trident Server (for BLS and model management from model code)
    threads: Threads = field(default_factory=PlainThreads)  # the owner of the backend's threads

    @property
    def repository_path(self) -> Path:
        return self.model_dir.parent


class ModelInstance(abc.ABC):
    """One loaded instance of a model version; used from one worker thread at a time."""

    #: True when ``execute`` may run on the event-loop thread: plain CPU work that never waits
    #: on the server (BLS, model control), another process or a device. trident then runs a
    #: batch inline when this instance's calls measure short (trident.server.execution.InlineChoice)
    #: and on the instance's thread otherwise. Read before every batch; False keeps every
    #: batch on the thread.
    inline_safe: bool = False

    #: True when :meth:`interrupt` can stop a running ``execute``: trident then calls it once
    #: every request of the running batch is cancelled (client gone, gRPC cancel or deadline)
    interruptible: bool = False

    def interrupt(self) -> None:  # noqa: B027 - optional hook (``interruptible`` says whether it acts)
        """Stop the ``execute`` call running now (or about to start) on this instance, whose
        requests were all cancelled: that call then ends soon, failing its requests with
        CANCELLED (their results are discarded anyway). Called by trident from its event-loop
        thread, never blocking, only between the submission of a batch to the instance's thread
        and the server learning it returned; it may come after ``execute`` finished (then it
        must change nothing: a later call must not be stopped). :class:`CallGuard` does that
        bookkeeping. Only read when ``interruptible`` is true; the default does nothing."""

    @abc.abstractmethod
    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse] | None:
        """Run a batch. See the module docstring for the contract. Blocking; runs in a thread."""

    def finalize(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the instance's resources. Blocking; runs in a worker thread."""

    def is_ready(self) -> bool:
        """Readiness probe for /v2/models/<m>/ready (default: ready once loaded)."""
        return True


class CallGuard:
    """The bookkeeping of an interruptible instance (:meth:`ModelInstance.interrupt`): which
    call is running, so that an interrupt stops that call and never a later one.

    ``execute`` brackets its work with :meth:`begin` (False: every request was cancelled
    before the call started, so do not run) and :meth:`end`; ``interrupt`` calls
    :meth:`interrupt`, which calls the framework's ``stop`` (thread-safe, non-blocking) while
    a call is between the two, and otherwise does nothing. :attr:`stopped` tells the running
    call, between framework calls, that it was stopped.
    """

    __slots__ = ("_lock", "_stop", "stopped")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None
        #: True once the current call was interrupted (reset by the next :meth:`begin`)
        self.stopped = False

    def begin(self, requests: list[InferenceRequest], stop: Callable[[], None]) -> bool:
        """A call of ``requests`` starts; ``stop()`` will stop it. False when every request is
        already cancelled (an interrupt may have come before the call began: nothing to run)."""
        with self._lock:
            self.stopped = False
            for request in requests:
                if not request.cancelled:
                    self._stop = stop
                    return True
            self.stopped = True
            return False

    def end(self) -> None:
        """The call returned: a later interrupt changes nothing."""
        with self._lock:
            self._stop = None

    def interrupt(self) -> None:
        """Stop the running call, if any (its ``stop`` runs under the guard's lock)."""
        with self._lock:
            if self._stop is not None and not self.stopped:
                self.stopped = True
                self._stop()


class Backend(abc.ABC):
    """A backend implementation, registered by name (see :mod:`trident.backends`)."""

    #: the name used in ``backend:`` of config.pbtxt
    name: str = ""
    #: ``platform:`` values that select this backend
    platforms: tuple[str, ...] = ()
    #: the file or folder a version folder holds by default (``default_model_filename``)
    default_model_filename: str = ""

    def auto_complete_config(self, config: ModelConfig, model_dir: Path, version_dir: Path | None) -> ModelConfig:
        """Return ``config`` completed from the model files (default: unchanged). Blocking."""
        return config

    @abc.abstractmethod
    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        """Load one instance. Blocking; runs in a worker thread. Raise TritonError on failure."""

    def model_file(self, ctx: LoadContext) -> Path:
        """The version's model file: ``default_model_filename`` from config, else the backend's."""
        name = ctx.config.default_model_filename or self.default_model_filename
        return ctx.version_dir / name
