"""Running a batch on an instance and delivering each request's responses.

:class:`Pending` is a queued request with the handle its responses travel through
(:class:`~trident.server.handle.RequestHandle`). :class:`Responder` is the thread-safe sink a
decoupled model sends 0..N responses into (from any thread); a regular model's list of
responses goes through the same handle, so unary, decoupled and streaming calls share one path. :class:`BatchExecutor` runs one batch in the
instance's worker thread (or inline on the event loop when the instance's calls are short:
:class:`InlineChoice`), post-processes outputs (requested outputs, classification, BF16
labels) and records statistics.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import outcome
import trio

from trident.backends import ModelInstance
from trident.backends.base import OwnedThread, Threads
from trident.batching import rounds
from trident.batching.outputs import finish_outputs
from trident.config import INLINE_MODES, INLINE_PARAMETER
from trident.errors import Code, TritonError, internal
from trident.server import deadlines
from trident.server.handle import RequestHandle
from trident.types import InferenceRequest, InferenceResponse, TensorSpec

if TYPE_CHECKING:
    from trident.observability.stats import StatsRecorder


log = logging.getLogger("trident.execution")


class Window:
    """A bound on a request's unconsumed responses that blocks sending threads (back-pressure).

    Every delivered response enters the window (:meth:`enter`); the consumer calls
    :meth:`leave` once it has handled one, and :meth:`close` when it stops consuming (every
    waiting thread is let through). A thread that may wait blocks while ``size`` responses are
    unconsumed; a wait longer than ``timeout`` seconds proceeds anyway, as Triton's ensemble
    step limiter does, so a stuck consumer cannot hang a model forever.
    """

    def __init__(self, size: int, timeout: float = 5.0) -> None:
        self.size = size
        self.unconsumed = 0
        self._timeout = timeout
        self._closed = False
        self._cond = threading.Condition()

    def enter(self, wait: bool) -> None:
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: self._closed or self.unconsumed < self.size, timeout=self._timeout)
            self.unconsumed += 1

    def leave(self) -> None:
        with self._cond:
            self.unconsumed = max(0, self.unconsumed - 1)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Responder:
    """Where a request's responses go. ``send`` may be called from any thread.

    The last response must be sent with ``final=True``; a flag-only final response
    (``response=None``) is allowed. Sending after the final one raises TritonError.
    """

    # what every responder starts with (class attributes: set on the instance once they change)
    complete = False
    #: set by the backend when the model answers this request later, from its own threads
    #: (a non-decoupled Python model whose execute returned None): the executor sends nothing
    deferred = False
    sent = 0
    undelivered = 0

    def __init__(self, channel: RequestHandle, token: trio.lowlevel.TrioToken,
                 request: InferenceRequest,
                 finish: Callable[[InferenceRequest, InferenceResponse], InferenceResponse]) -> None:
        self._channel = channel
        self._token = token
        self._trio_thread = threading.get_ident()
        self._request = request
        self._finish = finish
        self.window = Window(request.response_window) if request.response_window > 0 else None

    def is_cancelled(self) -> bool:
        return self._request.cancelled

    def send(self, response: InferenceResponse | None, final: bool, *, blocking: bool = True) -> None:
        """Deliver one response (``None`` with ``final`` = flag-only completion).

        With a response window (``request.response_window``) a call from a thread other than
        trio's blocks while the window is full, unless ``blocking`` is false (a reader thread
        shared by many requests must not block). Raises TritonError(INTERNAL) when the
        request already completed. A response for a client that went away is discarded silently.
        """
        if self.complete:
            raise internal("the request has already been completed (a final response was sent)")
        if response is None:
            if not final:
                raise internal("a response without outputs must carry the final flag")
            response = InferenceResponse(flag_only=True)
        response = self._finish(self._request, response)
        response.final = final
        if final:
            self.complete = True
        self.sent += 1
        if threading.get_ident() == self._trio_thread:
            if self.window is not None:
                self.window.enter(wait=False)
            self._deliver(response)
        else:
            if self.window is not None:
                self.window.enter(wait=blocking and not final)
            try:
                trio.from_thread.run_sync(self._deliver, response, trio_token=self._token)
            except trio.RunFinishedError:
                self.complete = True

    def _deliver(self, response: InferenceResponse) -> None:
        try:
            self._channel.send_nowait(response)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.undelivered += 1  # the client went away: nothing is waiting for this response


class InFlight:
    """Work in progress on the trio thread: a count, and ``idle``, an event set whenever the count
    is zero (a drain awaits ``idle.wait()``, reading the attribute when it starts waiting).

    The event is made when a drain first asks for it while work is in flight, not each time the
    count leaves zero: a request run inline enters and leaves within one call, every time.
    """

    __slots__ = ("count", "_idle")

    _IDLE = trio.Event()  # an event already set: what ``idle`` is while nothing is in flight
    _IDLE.set()

    def __init__(self) -> None:
        self.count = 0
        self._idle: trio.Event | None = None

    @property
    def idle(self) -> trio.Event:
        if self.count == 0:
            return self._IDLE
        if self._idle is None:
            self._idle = trio.Event()
        return self._idle

    def enter(self) -> None:
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()
            self._idle = None


class Pending:
    """A queued request: what the scheduler sees, and the handle its responses travel through
    (``send`` and ``receive`` are that :class:`~trident.server.handle.RequestHandle`)."""

    __slots__ = ("request", "batch_size", "send", "receive", "enqueued_ns", "exec_ns", "responder", "turn")

    def __init__(self, request: InferenceRequest, batch_size: int,
                 finish: Callable[[InferenceRequest, InferenceResponse], InferenceResponse],
                 handle: RequestHandle | None = None) -> None:
        self.request = request
        self.batch_size = batch_size
        #: where responses go, and where its consumer takes them
        self.send = self.receive = handle if handle is not None else RequestHandle()
        self.enqueued_ns = time.monotonic_ns()
        #: (batch start, model call start, model call end, response sent) in monotonic ns
        self.exec_ns: tuple[int, int, int, int] | None = None
        self.responder = Responder(self.send, trio.lowlevel.current_trio_token(), request, finish)
        request.responder = self.responder
        self.turn: Any = None  # the place in the response order (preserve_ordering), set at dequeue

    @property
    def cancelled(self) -> bool:
        return self.request.cancelled




class Interrupter:
    """Stops a running call whose requests are all cancelled (:meth:`ModelInstance.interrupt`
    of an ``interruptible`` instance): registered with each request of the call (``on_cancel``),
    it calls the instance's ``interrupt()`` on trio's thread when the last one is cancelled, as
    long as the executor has not seen the call return (:attr:`done`). A batch with one live
    request runs on. Made on trio's thread for each call that goes to an interruptible
    instance's thread (inline calls cannot be interrupted: they hold the loop).
    """

    __slots__ = ("instance", "requests", "token", "thread", "done", "fired")

    def __init__(self, instance: ModelInstance, requests: list[InferenceRequest], token: trio.lowlevel.TrioToken,
                 thread: int) -> None:
        self.instance = instance
        self.requests = requests
        self.token = token  # trio's, and its thread: where the check runs
        self.thread = thread
        self.done = False  # set on trio's thread once the executor saw the call return
        self.fired = False  # interrupt() was called
        for request in requests:
            request.on_cancel(self.cancelled)

    def finish(self) -> None:
        """The executor saw the call return (on trio's thread): later cancels change nothing.
        The requests are let go (they hold this object's callback: no reference cycle)."""
        self.done = True
        self.requests = []

    def cancelled(self) -> None:
        """One request was cancelled (on the cancelling thread): the check runs on trio's."""
        if self.done:
            return
        if threading.get_ident() == self.thread:
            self.check()
        else:
            with contextlib.suppress(trio.RunFinishedError):
                self.token.run_sync_soon(self.check)

    def check(self) -> None:
        if self.done or self.fired:
            return
        for request in self.requests:
            if not request.cancelled:
                return
        self.fired = True
        try:
            self.instance.interrupt()
        except Exception:  # a backend's bug must not break the cancelling task
            log.exception("interrupting a running call of %r failed", self.instance)


class InlineChoice:
    """Whether an instance's next batch runs inline on the event-loop thread (pure: fed the
    measured duration of every call, no clock of its own).

    ``auto``: the first ``probe_calls`` calls run on the instance's thread and are measured;
    after them a batch runs inline while the moving average of call times stays under
    ``threshold_ns``, and on the thread as soon as it rises above (every call is measured in
    either place, so a model that gets faster comes back inline). A call that runs inline costs
    no thread hand-off (a queue, a futex, a GIL hand-over and a loop wake-up each way) and, for
    models that hold the GIL anyway (Python), no parallelism. ``always`` / ``never`` force it.
    """

    __slots__ = ("mode", "threshold_ns", "probe_calls", "calls", "average_ns")

    def __init__(self, mode: str = "auto", threshold_ns: int = 200_000, probe_calls: int = 8) -> None:
        if mode not in INLINE_MODES:
            raise ValueError(f"{INLINE_PARAMETER} must be one of {', '.join(INLINE_MODES)}, got '{mode}'")
        self.mode = mode
        self.threshold_ns = threshold_ns
        self.probe_calls = probe_calls
        self.calls = 0
        self.average_ns = 0.0

    def inline(self) -> bool:
        if self.mode != "auto":
            return self.mode == "always"
        return self.calls >= self.probe_calls and self.average_ns < self.threshold_ns

    def record(self, ns: int) -> None:
        """One call took ``ns`` (inline or on the thread)."""
        self.calls += 1
        if self.calls == 1:
            self.average_ns = float(ns)
        else:  # weighs the recent calls; one long call is enough to move off the loop
            self.average_ns += 0.2 * (ns - self.average_ns)


class _Call:
    __slots__ = ("fn", "args", "task", "token", "abandoned")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.task = trio.lowlevel.current_task()
        self.token = trio.lowlevel.current_trio_token()
        self.abandoned = False


class InstanceThread:
    """The one long-lived thread an instance's batches (and warmup samples) run on, in order.

    Cheaper than ``trio.to_thread.run_sync`` per batch: a queue put, and one trio wake-up when
    the call returns. Calls never overlap (the thread runs them one after another), and a call
    is never abandoned: :meth:`run` waits for it even when cancelled, then raises Cancelled at
    the caller's next checkpoint. The one exception is the server's exit after its exit
    timeout (:meth:`abandon`): a call that has not returned by then is given up.
    """

    def __init__(self, name: str, threads: Threads) -> None:
        self._name = name
        self._threads = threads  # the owner of the thread (the model version's nursery)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: OwnedThread | None = None
        self._calls: list[_Call] = []  # queued or running (touched on trio's thread only)
        self._abandoned: TritonError | None = None
        self._round = rounds.current()  # counts the calls away on threads (no busy polling meanwhile)

    async def run(self, fn: Callable[..., Any], *args: Any, on_cancel: Callable[[], None] | None = None) -> Any:
        """``fn(*args)`` on the thread; its result, or its exception raised here.

        Cancelling the caller calls ``on_cancel`` at once (e.g. to tell the running requests)
        but still waits for ``fn``; Cancelled is raised at the caller's next checkpoint. Raises
        the TritonError given to :meth:`abandon` when the call was abandoned (or the thread was
        before it).
        """
        if self._abandoned is not None:
            raise self._abandoned
        if self._thread is None:
            self._thread = self._threads.start(self._loop, name=self._name)
        call = _Call(fn, args)
        self._calls.append(call)
        self._queue.put(call)
        self._round.away += 1

        def abort(_: Any) -> trio.lowlevel.Abort:
            if on_cancel is not None:
                on_cancel()
            return trio.lowlevel.Abort.FAILED

        result = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def _loop(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            if not call.abandoned:
                result = outcome.capture(call.fn, *call.args)
                with contextlib.suppress(trio.RunFinishedError):
                    call.token.run_sync_soon(self._finish, call, result)
                del result
            # the thread must not hold its last batch while it waits for the next: the batch's
            # requests hold their inputs, which may be a client's shared memory (a region
            # unregistered meanwhile must be released when its last request is done)
            del call

    def _finish(self, call: _Call, result: outcome.Outcome[Any]) -> None:
        with contextlib.suppress(ValueError):
            self._calls.remove(call)
        if not call.abandoned:
            self._round.away -= 1
            trio.lowlevel.reschedule(call.task, result)

    def abandon(self, error: TritonError) -> int:
        """Stop waiting for the calls queued or running: each caller gets ``error`` now, and
        every later :meth:`run` raises it. For the server's exit only, once its exit timeout
        has passed (a model stuck in ``execute`` must not keep the process up); the thread
        itself cannot be stopped: its owner abandons it and it ends with the process. Call
        from trio's thread; returns how many calls were given up."""
        calls, self._calls = self._calls, []
        self._abandoned = error
        for call in calls:
            call.abandoned = True
            self._round.away -= 1
            trio.lowlevel.reschedule(call.task, outcome.Error(error))
        return len(calls)

    def close(self) -> None:
        """Let the thread end once its queued calls are done."""
        if self._thread is not None:
            self._queue.put(None)


_EXECUTORS: weakref.WeakSet[BatchExecutor] = weakref.WeakSet()


def abandon_running_calls(server: object) -> int:
    """Give up the model calls of ``server``'s models that are still running or queued on
    their instance threads (see :meth:`InstanceThread.abandon`): the server's exit, after its
    exit timeout. Their requests fail with CANCELLED; each model with such calls is named in a
    warning. Returns how many calls were given up. Call from trio's thread."""
    total = 0
    for executor in list(_EXECUTORS):
        if getattr(executor.model, "_server", None) is server:
            total += executor.abandon()
    return total


class ExecutedModel(Protocol):
    """What a :class:`BatchExecutor` needs of the model version it executes (trident.server.model.ModelVersion)."""

    name: str
    version: int
    decoupled: bool
    max_batch_size: int
    outputs: dict[str, TensorSpec]
    stats: StatsRecorder
    discarded: int
    threads: Threads

    def on_drop(self, pending: Pending) -> None: ...


def _execute(instance: ModelInstance, requests: list[InferenceRequest],
             ) -> tuple[list[InferenceResponse] | None, TritonError | None]:
    """``instance.execute(requests)`` here and now: its responses, or the error it raised
    (anything other than a TritonError as INTERNAL)."""
    try:
        return instance.execute(requests), None
    except TritonError as e:
        return None, e
    except Exception as e:
        return None, internal(f"{type(e).__name__}: {e}")


def _count_error(model: str, responses: list[InferenceResponse] | None, count: int) -> TritonError | None:
    """The error of a (non-decoupled) model that did not return one response per request."""
    if responses is not None and len(responses) == count:
        return None
    got = "None" if responses is None else f"{len(responses)} responses"
    return internal(f"model '{model}' returned {got} for a batch of {count} requests")


def _instance_key(instance: Any) -> int:
    """Threads and inline choices belong to a model instance: a scheduler's wrapper around one
    (the sequence batcher's, which names it ``wrapped_instance``) shares its instance's, so the
    thread warmup used runs the batches too and releasing the instance ends it."""
    return id(getattr(instance, "wrapped_instance", instance))


class BatchExecutor:
    """Executes batches of one model version on its instances."""

    def __init__(self, model: ExecutedModel, inline_mode: str = "auto") -> None:
        self.model = model
        self._version = str(model.version)  # what each response names
        self.inline_mode = inline_mode
        self._threads: dict[int, InstanceThread] = {}
        self._choices: dict[int, InlineChoice] = {}
        self._bf16: bool | None = None  # whether an output is BF16 (known at the first response)
        _EXECUTORS.add(self)

    def abandon(self) -> int:
        """Abandon the calls in progress on this model's instance threads (server exit)."""
        model = self.model
        error = TritonError(Code.CANCELLED, f"model '{model.name}' was still executing when the server's exit "
                                            "timeout expired; the request was cancelled")
        total = 0
        for thread in self._threads.values():
            count = thread.abandon(error)
            if count:
                log.warning("exit timeout: model '%s' version %d did not return from execute on thread '%s'; "
                            "cancelling %d call(s) and leaving the thread to end with the process",
                            model.name, model.version, thread._name, count)
            total += count
        return total

    def choice(self, instance: ModelInstance) -> InlineChoice:
        """Where ``instance``'s batches run (see InlineChoice)."""
        key = _instance_key(instance)
        choice = self._choices.get(key)
        if choice is None:
            choice = self._choices[key] = InlineChoice(self.inline_mode)
        return choice

    def thread(self, instance: ModelInstance) -> InstanceThread:
        """The instance's thread (batches and warmup of an instance never overlap)."""
        key = _instance_key(instance)
        thread = self._threads.get(key)
        if thread is None:
            thread = self._threads[key] = InstanceThread(f"trident-{self.model.name}-{len(self._threads)}",
                                                         self.model.threads)
        return thread

    def release(self, instance: ModelInstance) -> None:
        """The instance is going away: end its thread."""
        key = _instance_key(instance)
        self._choices.pop(key, None)
        thread = self._threads.pop(key, None)
        if thread is not None:
            thread.close()

    def runs_inline(self, instance: ModelInstance) -> bool:
        """Whether ``instance``'s next batch runs inline on the event-loop thread (InlineChoice;
        never for decoupled models: their responses are consumed while they run)."""
        return self.inline_choice(instance) is not None

    def inline_choice(self, instance: ModelInstance) -> InlineChoice | None:
        """``instance``'s InlineChoice when its next batch runs inline (:meth:`runs_inline`), else None."""
        if not instance.inline_safe or self.model.decoupled:
            return None
        choice = self.choice(instance)
        return choice if choice.inline() else None

    async def __call__(self, instance: ModelInstance, batch: list[Pending], *, direct: bool = False) -> None:
        """Run ``batch`` on ``instance`` and deliver the responses. Never raises (``direct``:
        only Cancelled, after the execution).

        Requests cancelled before execution are dropped. A running kernel is never abandoned:
        a worker task waits for the thread under a shielded scope; a ``direct`` caller (the
        request's own task, ModelVersion.infer_stream) is not shielded: its cancellation marks
        the requests cancelled at once (models see ``is_cancelled()``, BLS calls they made are
        cancelled), waits for the call, and raises Cancelled at its next checkpoint. Results
        of cancelled requests are discarded. On an ``interruptible`` instance, a call on its
        thread whose requests all get cancelled is stopped (:class:`Interrupter`); such a call
        is not recorded as an execution (its requests count as cancelled, as queued ones do).
        """
        live = self._live(batch)
        if not live:
            return
        if self.runs_inline(instance):
            self.run_inline(instance, live)  # on the event-loop thread: short, measured calls only
            return
        start = time.monotonic_ns()
        requests = [p.request for p in live]
        error: TritonError | None = None
        responses: list[InferenceResponse] | None = None
        called = [start, start]  # model call start and end, taken in the worker thread
        interrupter = None
        if instance.interruptible:
            responder = live[0].responder  # knows trio's token and thread already
            interrupter = Interrupter(instance, requests, responder._token, responder._trio_thread)

        def call() -> list[InferenceResponse] | None:
            called[0] = time.monotonic_ns()
            try:
                return instance.execute(requests)
            finally:
                called[1] = time.monotonic_ns()

        try:
            if direct:
                def cancel_all() -> None:
                    for r in requests:
                        r.cancel()

                responses = await self.thread(instance).run(call, on_cancel=cancel_all)
            else:
                with trio.CancelScope(shield=True):
                    responses = await self.thread(instance).run(call)
        except TritonError as e:
            error = e
        except Exception as e:
            error = internal(f"{type(e).__name__}: {e}")
        finally:
            if interrupter is not None:
                interrupter.finish()
        self._deliver(instance, live, responses, error, start, called[0], max(called[1], called[0]),
                      interrupter is not None and interrupter.fired)

    def run_inline(self, instance: ModelInstance, live: list[Pending]) -> None:
        """Execute ``live`` (requests not cancelled) on the event-loop thread now and deliver the
        responses (the caller checked :meth:`runs_inline`). Never raises."""
        start = time.monotonic_ns()
        responses, error = _execute(instance, [p.request for p in live])
        self._deliver(instance, live, responses, error, start, start, time.monotonic_ns())

    def run_one_inline(self, instance: ModelInstance, choice: InlineChoice,
                       pending: Pending) -> InferenceResponse | None:
        """:meth:`run_inline` for one request (``choice``: :meth:`inline_choice`'s), its final
        response returned instead of sent through its mailbox: no hand-over through the
        responder, the mailbox and back. None when the model answered it through its response
        sender, or will (then it is delivered as run_inline delivers it). Never raises."""
        request = pending.request
        start = time.monotonic_ns()
        responses, error = _execute(instance, [request])
        infer_end = time.monotonic_ns()
        responder = pending.responder
        if responder.complete or responder.deferred or responder.window is not None:
            self._deliver(instance, [pending], responses, error, start, start, infer_end)
            return None
        model = self.model
        choice.record(infer_end - start)
        if error is None:
            error = _count_error(model.name, responses, 1)
        response = self.finish(request, InferenceResponse(error=error) if error is not None
                               else responses[0])  # type: ignore[index]
        response.final = True
        responder.complete = True
        responder.sent += 1
        end = time.monotonic_ns()
        pending.exec_ns = (start, start, infer_end, end)
        if request.cancelled:
            model.discarded += 1
        model.stats.record_execution(pending.batch_size, 0, infer_end - start, end - infer_end)
        return response

    def _live(self, batch: list[Pending]) -> list[Pending]:
        """The requests of ``batch`` not cancelled (the others are dropped); a request whose
        deadline has passed never starts: it is answered UNAVAILABLE "Request timeout expired"
        (README "Deadlines"; its caller's own cancel scope usually got there first)."""
        live = []
        for p in batch:
            if p.request.deadline is not None and trio.current_time() >= p.request.deadline and not p.request.cancelled:
                p.request.responder.send(InferenceResponse(error=deadlines.timeout_expired()), final=True)
                continue
            if p.request.cancelled:
                self.model.on_drop(p)
            else:
                live.append(p)
        return live

    def _deliver(self, instance: ModelInstance, live: list[Pending], responses: list[InferenceResponse] | None,
                 error: TritonError | None, start: int, infer_start: int, infer_end: int,
                 interrupted: bool = False) -> None:
        """After an execution: each request's response (or the error), the call time for the
        inline choice, and the execution's statistics. An ``interrupted`` call (all its requests
        cancelled, stopped early) records neither: its time says nothing of the model's calls
        (it must not bring a long model inline), and it performed no inference."""
        model = self.model
        if not interrupted:
            self.choice(instance).record(infer_end - infer_start)
        if error is None and not model.decoupled:
            error = _count_error(model.name, responses, len(live))
        for i, pending in enumerate(live):
            pending.exec_ns = (start, infer_start, infer_end, time.monotonic_ns())
            responder = pending.responder
            if error is not None:
                if not responder.complete:
                    responder.send(InferenceResponse(error=error), final=True)
            elif not model.decoupled and not responder.complete and not responder.deferred:
                # complete: sent through the model's response sender; deferred: it will be
                assert responses is not None
                responder.send(responses[i], final=True)
            if pending.request.cancelled:
                model.discarded += 1
        if interrupted:
            return
        end = time.monotonic_ns()
        model.stats.record_execution(sum(p.batch_size for p in live), infer_start - start, infer_end - infer_start,
                                     end - infer_end)

    def finish(self, request: InferenceRequest, response: InferenceResponse) -> InferenceResponse:
        """Name the response, then its outputs' post-processing (trident.batching.outputs)."""
        model = self.model
        response.model_name = model.name
        response.model_version = self._version
        response.id = request.id
        if response.error is not None:
            return response
        if not request.outputs:  # every output, as produced: only BF16 ones need a look
            bf16 = self._bf16
            if bf16 is None:
                bf16 = self._bf16 = any(spec.datatype == "BF16" for spec in model.outputs.values())
            if not bf16:
                return response
        return finish_outputs(response, request, model.outputs, model.name, model.max_batch_size > 0)
