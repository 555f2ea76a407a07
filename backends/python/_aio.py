"""The asyncio event loop of one Python model instance (``async def`` model methods).

Triton's stub keeps one event loop per instance running for the instance's lifetime, so tasks a
model schedules (``asyncio.create_task``, ``loop.call_later``, a decoupled ``execute`` that
sends its final flag later) keep running between and after calls. :class:`InstanceLoop` does
the same: the loop runs ``run_forever`` in a thread of its own, started on first use and owned
by the instance, which stops and joins it in ``finalize`` (:meth:`InstanceLoop.close`).
asyncio is used nowhere else in trident.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from trident.backends.base import OwnedThread, PlainThreads, Threads

log = logging.getLogger("trident.backends.python")

CLOSE_TIMEOUT_SECS = 30.0  # how long close() waits for the loop's clean-up


async def _await(awaitable: Awaitable[Any], enter: Callable[[], Any] | None) -> Any:
    if enter is None:
        return await awaitable
    with enter():
        return await awaitable


class InstanceLoop:
    """An asyncio loop running in its own thread until :meth:`close`; thread-safe."""

    def __init__(self, name: str, threads: Threads | None = None) -> None:
        self._name = name
        self._threads = threads if threads is not None else PlainThreads()  # the thread's owner
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: OwnedThread | None = None
        self._ident: int | None = None  # the loop thread's id
        self._closed = False

    @property
    def started(self) -> bool:
        return self._loop is not None

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the asyncio loop of model instance '{self._name}' is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                running = threading.Event()

                def main() -> None:
                    self._ident = threading.get_ident()
                    asyncio.set_event_loop(loop)
                    loop.call_soon(running.set)
                    try:
                        loop.run_forever()
                    finally:
                        asyncio.set_event_loop(None)

                # the owner abandons it at the server's exit timeout, so a task blocking the
                # loop forever cannot keep the process alive; close() joins it
                thread = self._threads.start(main, name=f"trident-asyncio-{self._name}")
                running.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def _future(self, awaitable: Awaitable[Any], enter: Callable[[], Any] | None) -> concurrent.futures.Future[Any]:
        try:
            if self._ident is not None and threading.get_ident() == self._ident:
                raise RuntimeError("a model method was called from its own asyncio loop and would wait on itself")
            loop = self._started_loop()
        except RuntimeError:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never to run: no "was never awaited" warning
            raise
        return asyncio.run_coroutine_threadsafe(_await(awaitable, enter), loop)

    def run(self, awaitable: Awaitable[Any], enter: Callable[[], Any] | None = None) -> Any:
        """Run ``awaitable`` as a task on the loop and wait for it; its result or its exception.

        ``enter`` (a context-manager factory) is entered inside the task around the await.
        Raises RuntimeError when the loop is closed or when called from the loop's own thread,
        ``asyncio.CancelledError`` when :meth:`close` cancelled the task. Nothing else cancels it.
        """
        return self._future(awaitable, enter).result()

    def submit(self, awaitable: Awaitable[Any], done: Callable[[BaseException | None, Any], None],
               enter: Callable[[], Any] | None = None) -> None:
        """Run ``awaitable`` on the loop in the background; ``done(exception, result)`` is called
        (on the loop's thread) when it ends. Raises RuntimeError as :meth:`run` does."""

        def finished(future: concurrent.futures.Future[Any]) -> None:
            try:
                done(None, future.result())
            except BaseException as e:  # noqa: BLE001 - reported to done, which decides
                done(e, None)

        self._future(awaitable, enter).add_done_callback(finished)

    def close(self, timeout: float = CLOSE_TIMEOUT_SECS) -> None:
        """Cancel the loop's remaining tasks, shut down its async generators and default
        executor, stop it and join its thread (idempotent; a no-op when it never started).

        Waits up to ``timeout`` seconds; a loop that a task keeps busy longer is left behind
        with a warning (its thread is a daemon and ends with the process).
        """
        with self._lock:
            loop, thread, self._closed = self._loop, self._thread, True
            self._loop = self._thread = None
            self._ident = None
        if loop is None or thread is None:
            return

        async def clean_up() -> None:
            tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await loop.shutdown_asyncgens()
            await loop.shutdown_default_executor()

        try:
            asyncio.run_coroutine_threadsafe(clean_up(), loop).result(timeout)
        except concurrent.futures.TimeoutError:
            log.warning("model instance '%s': its asyncio tasks did not end within %.0f s of finalize",
                        self._name, timeout)
        except Exception:
            log.warning("model instance '%s': cleaning up its asyncio loop failed", self._name, exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("model instance '%s': its asyncio loop is still busy; leaving it behind", self._name)
            return
        loop.close()
