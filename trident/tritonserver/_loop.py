"""The in-process server's own trio event loop, on a thread the API owns.

:class:`ServerLoop` runs :func:`trident.server.open_server` with ``trio.run`` on one thread,
``trident-tritonserver``, owned by the loop object: :meth:`ServerLoop.stop` joins it (and an
``atexit`` hook stops every loop still running when the interpreter exits; the thread is a
daemon so that the interpreter reaches that hook instead of waiting for it). The tasks form one
nursery tree::

    open_server                 the models (the exit drains in-flight requests, then unloads)
      calls                     one task per in-process call: a request, a load, a query
        services                the front ends trident.tritonfrontend starts, the metrics poller

Other threads reach the loop only through ``TrioToken.run_sync_soon``: :meth:`submit` starts
a job as a task of ``calls`` and returns at once (a :class:`Call` whose ``cancel()`` cancels
it, from any thread); :meth:`call` runs a function on the loop and blocks the calling thread for
its result. Every method is safe from any thread. Calls from the loop's own thread (a model's
code running inline) that would block on the loop are refused, as are calls in a forked child
(the loop does not exist there).

:meth:`stop` stops the front ends (HTTP finishes its in-flight requests first), lets the
in-process calls finish for up to ``exit_timeout_secs``, cancels the rest (their callers get
UnavailableError), and leaves ``open_server`` to unload the models.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trident.observability.logs import LogSettings
from trident.options import ServerOptions
from trident.server import Server, open_server
from trident.tritonserver._errors import InternalError, InvalidArgumentError, UnavailableError

log = logging.getLogger("trident.tritonserver")

Job = Callable[[Server], Awaitable[None]]
#: a front end: ``await serve(server, shutdown_trigger, task_status)`` (reports its port)
Serve = Callable[[Server, Callable[[], Awaitable[Any]], Any], Awaitable[None]]

NOT_STARTED = "Server not started"
STOPPING = "Server is stopping"


class Call:
    """A job submitted to the loop (:meth:`ServerLoop.submit`)."""

    __slots__ = ("job", "fail", "scope", "_loop", "__weakref__")

    def __init__(self, loop: ServerLoop, job: Job, fail: Callable[[BaseException], None]) -> None:
        self.job = job
        self.fail = fail
        self.scope = trio.CancelScope()
        self._loop = loop

    def cancel(self) -> None:
        """Cancel the job (its request is cancelled in the server), from any thread; nothing
        when it has finished or the loop is gone. Raises nothing."""
        self._loop.run_soon(self.scope.cancel)


class Service:
    """A front end running in the loop's services nursery (:meth:`ServerLoop.start_service`)."""

    def __init__(self, name: str, graceful: bool) -> None:
        self.name = name
        self.graceful = graceful  # HTTP: finishes its in-flight requests when shut down
        self.port = 0
        self.scope = trio.CancelScope()
        self.shutdown = trio.Event()
        self.done = trio.Event()

    async def run(self, serve: Serve, server: Server, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.scope:
                await serve(server, self.shutdown.wait, task_status)
        finally:
            self.done.set()

    def begin_stop(self) -> None:
        """Stop accepting: HTTP drains its requests, the others are cancelled (gRPC sends GOAWAY
        and drains its calls). On the loop."""
        self.shutdown.set()
        if not self.graceful:
            self.scope.cancel()


class ServerLoop:
    """``open_server(options)`` on a thread of its own (see the module docstring)."""

    def __init__(self, options: ServerOptions, log_settings: LogSettings | None = None,
                 background: tuple[Job, ...] = ()) -> None:
        self.options = options
        self._log_settings = log_settings
        self._background = background  # run in the services nursery for the loop's life
        self._lock = threading.Lock()
        self._state = "new"  # new | starting | running | stopping | stopped
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._ident: int | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._token: trio.lowlevel.TrioToken | None = None
        self._server: Server | None = None
        self._calls: trio.Nursery | None = None
        self._services: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._pending: set[Call] = set()
        self._pending_lock = threading.Lock()
        self._running: set[Service] = set()

    # ---- life cycle ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._state == "running" and not self.forked

    @property
    def forked(self) -> bool:
        """True in a child process forked while the loop ran (it has no loop thread)."""
        return os.getpid() != self._pid

    def start(self) -> None:
        """Start the thread; return once the start-up models are loaded.

        Raises InvalidArgumentError for a second start, and what the start raised (the
        server's TritonError, ValueError for a bad setting...); the thread has ended then.
        """
        with self._lock:
            if self._state != "new":
                raise InvalidArgumentError("Server already started")
            self._state = "starting"
        self._thread = threading.Thread(target=self._main, name="trident-tritonserver", daemon=True)
        _LIVE.add(self)
        self._thread.start()
        try:
            self._started.result()
        except BaseException:
            self.stop()
            raise
        with self._lock:
            if self._state == "starting":
                self._state = "running"

    def stop(self) -> None:
        """Stop the front ends, let in-process calls finish (up to ``exit_timeout_secs``),
        cancel the rest, unload the models and join the thread. Idempotent; blocks until done.

        In a forked child it only marks the copy stopped (the loop is the parent's). Raises
        InvalidArgumentError from the loop's own thread (a model's code: it would wait for
        itself).
        """
        if self.forked:
            self._state = "stopped"
            return
        if threading.get_ident() == self._ident:
            raise InvalidArgumentError("stop() called from the server's own thread (a model's code); "
                                       "stop the server from another thread")
        with self._lock:
            if self._state == "new":
                return
            if self._state in ("starting", "running"):
                self._state = "stopping"
        with contextlib.suppress(BaseException):  # a failed start: the thread is ending by itself
            self._started.result()
        if self._stop is not None:
            self.run_soon(self._stop.set)
        if self._thread is not None:
            self._thread.join()
        _LIVE.discard(self)

    def _main(self) -> None:
        self._ident = threading.get_ident()
        try:
            trio.run(self._serve)
        except BaseException as exc:
            exc = _single(exc)
            if self._started.done():
                log.error("the in-process server's event loop ended with an error", exc_info=exc)
            else:
                self._started.set_exception(exc)
        finally:
            if not self._started.done():
                self._started.set_exception(UnavailableError("the server stopped while starting"))
            with self._lock:
                self._state = "stopped"
            with self._pending_lock:
                pending, self._pending = self._pending, set()
            for call in pending:
                _fail(call, UnavailableError("Server stopped before the call started"))

    async def _serve(self) -> None:
        self._stop = trio.Event()
        async with open_server(self.options, self._log_settings) as server:
            async with trio.open_nursery() as calls:
                async with trio.open_nursery() as services:
                    background = trio.CancelScope()
                    for job in self._background:
                        services.start_soon(_scoped, background, job, server)
                    self._server, self._calls, self._services = server, calls, services
                    self._token = trio.lowlevel.current_trio_token()
                    self._started.set_result(None)
                    await self._stop.wait()
                    background.cancel()
                    await self._stop_services(services)
                # the front ends are down: let the in-process calls finish, then cancel them
                await server.wait_drained(self.options.exit_timeout_secs)
                calls.cancel_scope.cancel()

    async def _stop_services(self, services: trio.Nursery) -> None:
        for service in list(self._running):
            service.begin_stop()
        with trio.move_on_after(self.options.exit_timeout_secs + 1.0):
            for service in list(self._running):
                await service.done.wait()
        services.cancel_scope.cancel()

    # ---- calls -----------------------------------------------------------------------------

    def run_soon(self, fn: Callable[[], Any]) -> None:
        """``fn()`` on the loop, soon, from any thread (it must not block or raise); nothing
        once the loop is gone. Raises nothing."""
        token = self._token
        if token is None or self.forked:
            return
        try:
            token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass

    def check_usable(self) -> None:
        """Raise InvalidArgumentError unless calls can be made (started, not stopped, this
        process), UnavailableError while stopping."""
        if self.forked:
            raise InvalidArgumentError(f"this server runs in process {self._pid}; a forked child cannot use it "
                                       "(start a Server in the child instead)")
        state = self._state
        if state == "stopping":
            raise UnavailableError(STOPPING)
        if state != "running":
            raise InvalidArgumentError(NOT_STARTED)

    def check_blocking(self) -> None:
        """Raise InvalidArgumentError on the loop's own thread (a model's code), where waiting
        for the loop would wait forever."""
        if threading.get_ident() == self._ident:
            raise InvalidArgumentError("a blocking call of the in-process API from the server's own thread "
                                       "(a model's code) would wait for itself")

    def submit(self, job: Job, fail: Callable[[BaseException], None]) -> Call:
        """Run ``await job(server)`` as a task of the loop; returns at once.

        ``job`` reports its own outcome; ``fail(error)`` is called instead (on the loop's
        thread) when it cannot run: the server stopped first (UnavailableError) or the job
        raised (InternalError, logged). Raises what :meth:`check_usable` raises.
        """
        self.check_usable()
        call = Call(self, job, fail)
        with self._pending_lock:
            self._pending.add(call)
        assert self._token is not None
        try:
            self._token.run_sync_soon(self._launch, call)
        except trio.RunFinishedError:
            with self._pending_lock:
                self._pending.discard(call)
            raise InvalidArgumentError(NOT_STARTED) from None
        return call

    def _launch(self, call: Call) -> None:
        # on the loop, from run_sync_soon: must not raise
        with self._pending_lock:
            if call not in self._pending:
                return
            self._pending.discard(call)
        try:
            assert self._calls is not None
            self._calls.start_soon(self._run, call)
        except RuntimeError:  # the calls nursery is closed: the server is stopping
            _fail(call, UnavailableError(STOPPING))

    async def _run(self, call: Call) -> None:
        assert self._server is not None
        with call.scope:
            try:
                await call.job(self._server)
            except Exception as exc:  # a job reports its own errors: this is a bug, kept from the loop
                log.exception("in-process call failed")
                _fail(call, InternalError(f"in-process call failed: {exc!r}"))

    def call(self, fn: Callable[[Server], Any]) -> Any:
        """``fn(server)`` on the loop (awaited when it returns an awaitable); blocks this thread
        until it returns, and returns or raises what it does (interrupting the wait cancels it).

        Raises what :meth:`check_usable` and :meth:`check_blocking` raise, and
        UnavailableError when the server stops before ``fn`` finished.
        """
        self.check_blocking()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def job(server: Server) -> None:
            try:
                result = fn(server)
                if inspect.isawaitable(result):
                    result = await result
            except trio.Cancelled:
                _settle(future, error=UnavailableError("the server stopped before the call finished"))
                raise
            except Exception as exc:
                _settle(future, error=exc)
            else:
                _settle(future, result=result)

        call = self.submit(job, lambda exc: _settle(future, error=exc))
        try:
            return future.result()
        except BaseException:
            if not future.done():  # interrupted (KeyboardInterrupt): the call is abandoned
                call.cancel()
            raise

    # ---- front ends ------------------------------------------------------------------------

    def start_service(self, name: str, serve: Serve, *, graceful: bool) -> Service:
        """Start ``serve`` in the services nursery; returns once it listens (its port in
        ``.port``). Raises what ``serve`` raises before it listens (OSError for an address in
        use...) and what :meth:`call` raises."""
        async def start(server: Server) -> Service:
            service = Service(name, graceful)
            self._running.add(service)
            try:
                assert self._services is not None
                service.port = await self._services.start(service.run, serve, server)
            except BaseException:
                self._running.discard(service)
                raise
            return service

        started: Service = self.call(start)
        return started

    def stop_service(self, service: Service) -> None:
        """Stop a front end (HTTP drains its requests for up to ``exit_timeout_secs``) and wait
        for it. Nothing when the server is not running (it stopped the front end already)."""
        async def stop(server: Server) -> None:
            service.begin_stop()
            with trio.move_on_after(self.options.exit_timeout_secs + 1.0):
                await service.done.wait()
            service.scope.cancel()
            await service.done.wait()
            self._running.discard(service)

        if self.running:
            try:
                self.call(stop)
            except (InvalidArgumentError, UnavailableError):
                pass  # the server stopped meanwhile, and its front ends with it


async def _scoped(scope: trio.CancelScope, job: Job, server: Server) -> None:
    with scope:
        await job(server)


def _settle(future: concurrent.futures.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _fail(call: Call, error: BaseException) -> None:
    try:
        call.fail(error)
    except Exception:
        log.exception("could not report an in-process call's failure")


def _single(exc: BaseException) -> BaseException:
    """The one error inside nested single-exception groups (the nurseries' wrapping)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


# ---- every loop still running: stopped at exit, disowned in a forked child --------------------

_LIVE: weakref.WeakSet[ServerLoop] = weakref.WeakSet()


def _stop_all() -> None:
    for loop in list(_LIVE):
        try:
            loop.stop()
        except Exception:
            log.exception("could not stop an in-process server at exit")


def _forget_all() -> None:
    _LIVE.clear()  # the child has none of their threads; its copies refuse calls (ServerLoop.forked)


atexit.register(_stop_all)
os.register_at_fork(after_in_child=_forget_all)
