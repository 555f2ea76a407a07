"""Threads with owners: heavy request work for the front ends, and long-lived threads of a model.

:func:`run_sync` runs one job in a thread of the caller's limiter, awaited by the request's own
task: the thread has an owner, and a cancelled request still waits for it to return (nothing is
abandoned). While any such job runs, the interpreter's GIL switch interval is ``SWITCH_INTERVAL``
instead of the default 5 ms: a job running Python code then hands the GIL back to the event loop
within that, so other clients wait for it about as long, not 5 ms at every turn.

:func:`open_thread_nursery` gives a model version the owner of its long-lived threads (instance
threads, a Python model's asyncio loop, process readers, BLS helpers): each runs as a task of a
nursery (``trio.to_thread.run_sync``), so the model's unload waits for them to end and a
cancelled owner (the server's exit timeout) abandons the ones still running, which end with the
process. Backends reach it as ``LoadContext.threads`` (:class:`trident.backends.base.Threads`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import trio

from trident import priority
from trident.errors import TritonError

T = TypeVar("T")

SWITCH_INTERVAL = priority.SWITCH_INTERVAL  # seconds: the GIL switch interval while a job runs
LOW_PRIORITY = priority.LOW_PRIORITY  # the nice value of a thread while it runs a job


async def run_sync(fn: Callable[..., T], *args: object, limiter: trio.CapacityLimiter) -> T:
    """``fn(*args)`` in a worker thread of ``limiter``; returns or raises what it does.

    A TritonError (a refused request: an expected answer, not a fault) reaches the caller
    without the thread's traceback or the exception it was raised from: their frames hold what
    the job worked on (a decoded body of hundreds of MB), and the way trio hands an exception
    back from a thread leaves it in a reference cycle that only the cyclic collector frees, which
    may not run for a long while. Other exceptions keep their tracebacks.

    Waiting for a free thread can be cancelled; once the thread runs, cancellation takes effect
    when it returns.
    """
    priority.enter()
    try:
        result = await trio.to_thread.run_sync(_low_priority, fn, args, limiter=limiter)
        if isinstance(result, _Refused):
            error = result.error
            del result
            try:
                raise error
            finally:
                del error  # this frame, in the error's traceback, must not hold it: a cycle
        return result
    finally:
        priority.leave()



class _Refused:
    """A TritonError a job raised, returned instead (see :func:`run_sync`)."""

    __slots__ = ("error",)

    def __init__(self, error: TritonError) -> None:
        self.error = error


def _low_priority(fn: Callable[..., T], args: tuple[object, ...]) -> T | _Refused:
    """``fn(*args)`` at the lowest CPU priority (nice 19) for this thread while it runs, so
    the event loop's thread, when runnable, gets the core first (on a server pinned to one core
    the two otherwise share it in equal slices). The priority is restored afterwards where
    the process may raise it again (root or CAP_SYS_NICE); elsewhere the cached thread stays
    low, which suits the background work trio's threads do."""
    before = priority.lower()
    try:
        return fn(*args)
    except TritonError as e:  # handed back bare: no frames, no chained exception
        e.__traceback__ = e.__context__ = e.__cause__ = None
        return _Refused(e)
    finally:
        priority.restore(before)


log = logging.getLogger("trident.threads")


class OwnedThread:
    """A thread of a :class:`ThreadNursery` (``join`` and ``is_alive`` as ``threading.Thread``'s)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def _main(self, fn: Callable[..., object], args: tuple[object, ...]) -> None:
        thread = threading.current_thread()
        cached_name, thread.name = thread.name, self.name
        try:
            fn(*args)
        except BaseException:
            log.exception("thread '%s' failed", self.name)
        finally:
            thread.name = cached_name  # trio's thread goes back to its cache
            self._done.set()


class ThreadNursery:
    """Starts threads as tasks of one nursery (see :func:`open_thread_nursery`)."""

    def __init__(self, nursery: trio.Nursery, token: trio.lowlevel.TrioToken) -> None:
        self._nursery = nursery
        self._token = token
        self._limiter = trio.CapacityLimiter(math.inf)  # the owner bounds nothing: its users do
        self._closed = False

    def start(self, fn: Callable[..., object], *args: object, name: str) -> OwnedThread:
        """Run ``fn(*args)`` in a thread owned by the nursery; callable from any thread.

        Raises RuntimeError once the nursery no longer takes threads, or when the trio run
        that owns it has finished."""
        thread = OwnedThread(name)

        def spawn() -> None:
            if self._closed:
                raise RuntimeError(f"thread '{name}' cannot start: its owner has finished")
            self._nursery.start_soon(self._run, thread, fn, args, name=f"trident.thread {name}")

        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:  # not on the event loop's thread
            try:
                trio.from_thread.run_sync(spawn, trio_token=self._token)
            except trio.RunFinishedError:
                raise RuntimeError(f"thread '{name}' cannot start: the server has stopped") from None
        else:
            spawn()
        return thread

    async def _run(self, thread: OwnedThread, fn: Callable[..., object], args: tuple[object, ...]) -> None:
        await trio.to_thread.run_sync(thread._main, fn, args, limiter=self._limiter, abandon_on_cancel=True)


@asynccontextmanager
async def open_thread_nursery() -> AsyncIterator[ThreadNursery]:
    """A :class:`ThreadNursery` for the body; on exit it takes no new threads and waits until
    every thread it started has returned, then lets the body's exception go on as itself (not
    in an exception group).

    Cancelling the waiting task abandons the threads still running (they are daemons and end
    with the process); nothing else stops a thread, so its function must return on its own
    (its user closes what it waits on)."""
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        threads = ThreadNursery(nursery, trio.lowlevel.current_trio_token())
        try:
            yield threads
        except BaseException as exc:  # raised again below, once the threads are waited for
            error = exc
        finally:
            threads._closed = True
    if error is not None:
        try:
            raise error
        finally:
            del error  # this frame is in the error's traceback: holding it there would be a cycle
