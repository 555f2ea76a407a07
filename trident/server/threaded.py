"""The in-process server for asyncio and plain-threaded programs: trio in a thread of its own.

:func:`trident.open_server` needs a trio task, so it cannot run under ``asyncio.run``. A
:class:`ServerThread` runs it on a dedicated thread with its own trio loop, and its calls are
safe from any other thread:

* plain calls (``infer``, ``call``) block the calling thread until the server answers;
* the ``a``-prefixed coroutines (``ainfer``, ``acall``, ``astart``, ``aclose``) await from an
  asyncio loop without blocking it (no extra thread per call: the result is handed back with
  ``loop.call_soon_threadsafe``), and cancelling the awaiting asyncio task cancels the request
  on the server (the model sees ``is_cancelled()``), as cancelling a trio task does.

The handle owns its thread: :meth:`ServerThread.close` (or leaving ``with`` / ``async with``)
cancels what is still running, drains, unloads the models and joins the thread. Calls after
close raise RuntimeError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trident.options import ServerOptions
from trident.server import Server, open_server
from trident.types import InferenceRequest, InferenceResponse


class ServerThread:
    """A trident server on its own thread (see the module docstring)."""

    def __init__(self, options: ServerOptions | None = None) -> None:
        self.options = options or ServerOptions()
        self._thread: threading.Thread | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._server: Server | None = None
        self._stop: trio.Event | None = None
        self._closed = False

    # ---- life cycle ------------------------------------------------------------------------

    def start(self) -> ServerThread:
        """Start the thread and return once the models are loaded. Raises what start-up raises."""
        self._launch()
        self._started.result()
        return self

    async def astart(self) -> ServerThread:
        """:meth:`start` for asyncio: the loop keeps running while the models load."""
        self._launch()
        await asyncio.wrap_future(self._started)
        return self

    def close(self) -> None:
        """Cancel running calls, drain, unload every model and join the thread (idempotent)."""
        if self._thread is None or self._closed:
            return
        self._closed = True
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):  # the server's loop already ended
                self._token.run_sync_soon(self._stop.set)
        self._thread.join()

    async def aclose(self) -> None:
        """:meth:`close` for asyncio (the join waits in a worker thread of the loop)."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ServerThread:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _launch(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the server thread was already started")
        self._thread = threading.Thread(target=self._main, name="trident-server")
        self._thread.start()

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # start-up failed: the starter gets the error
            if self._started.done():
                raise
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # the nurseries' wrapping of the one error
            self._started.set_exception(exc)

    async def _serve(self) -> None:
        self._stop = trio.Event()
        async with open_server(self.options) as server:
            async with trio.open_nursery() as nursery:
                self._server, self._nursery = server, nursery
                self._token = trio.lowlevel.current_trio_token()
                self._started.set_result(None)
                await self._stop.wait()
                nursery.cancel_scope.cancel()  # calls still running when closed

    # ---- calls -----------------------------------------------------------------------------

    def _ready(self) -> tuple[trio.lowlevel.TrioToken, trio.Nursery, Server]:
        if self._closed or self._token is None or self._nursery is None or self._server is None:
            raise RuntimeError("the server thread is not running")
        return self._token, self._nursery, self._server

    def call(self, fn: Callable[[Server], Any]) -> Any:
        """``fn(server)`` on the server's thread (awaited when it returns an awaitable); blocks
        the calling thread. Returns or raises what ``fn`` does."""
        token, _, server = self._ready()

        async def run() -> Any:
            result = fn(server)
            if isinstance(result, Awaitable):
                return await result
            return result

        return trio.from_thread.run(run, trio_token=token)

    async def acall(self, fn: Callable[[Server], Any]) -> Any:
        """``fn(server)`` on the server's thread, awaited from asyncio. Cancelling the awaiting
        task cancels the call on the server. Returns or raises what ``fn`` does."""
        token, nursery, server = self._ready()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        scope = trio.CancelScope()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        async def run() -> None:
            result: Any = None
            error: BaseException | None = None
            with scope:
                try:
                    value = fn(server)
                    result = await value if isinstance(value, Awaitable) else value
                except Exception as exc:
                    error = exc
            if scope.cancelled_caught and error is None:
                error = asyncio.CancelledError("cancelled on the server")
            with contextlib.suppress(RuntimeError):  # the asyncio loop closed: nobody waits for it
                loop.call_soon_threadsafe(settle, result, error)

        token.run_sync_soon(nursery.start_soon, run)
        try:
            return await future
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):  # the server's loop already ended
                token.run_sync_soon(scope.cancel)
            raise

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """``Server.infer(request)``, blocking the calling thread. Raises TritonError."""
        response: InferenceResponse = self.call(lambda server: server.infer(request))
        return response

    async def ainfer(self, request: InferenceRequest) -> InferenceResponse:
        """``Server.infer(request)`` awaited from asyncio; cancelling the awaiting task cancels
        the request. Raises TritonError."""
        response: InferenceResponse = await self.acall(lambda server: server.infer(request))
        return response


def start_server(options: ServerOptions | None = None) -> ServerThread:
    """A :class:`ServerThread` for ``options``, not started yet: use it in ``with`` (threads)
    or ``async with`` (asyncio), or call ``start()`` / ``await astart()`` and ``close()``."""
    return ServerThread(options)
