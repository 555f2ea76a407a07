"""A request in flight, as the server hands it to its caller: :class:`RequestHandle`.

:meth:`trident.server.Server.start` (a request that gives one response) and
:meth:`~trident.server.Server.start_stream` (any number: decoupled models, streams) answer every
request with a handle, whatever the model kind: a model run inline, a queued request, an
ensemble, a response-cache hit, a request served by another worker of ``--workers``. The handle
carries the request's responses, its completion and its cancellation; the front ends never look
at what the server did to answer it. It is in one of three states:

* **answered**: the request ran here and now (an idle instance, inline): ``response`` is set
  before :meth:`~trident.server.Server.start` returns, and nothing is left to do;
* **queued**: the request waits in a model's queue and the task that delivers its response (the
  model's worker) completes it: :meth:`RequestHandle.on_final` has that task call back, with no
  task of the caller's waiting, or ``await handle.wait()`` waits for it;
* **driven**: the request needs a task to run in (a stream, an ensemble's steps, the response
  cache, a trace, a model call on an instance thread, another worker): the caller's task runs
  it in ``await handle.wait()`` or ``await handle.stream(send)``; :meth:`on_final` refuses.

A handle that is not answered holds the server's admission (and its model's in-flight count)
until it completes: it must be awaited, in the task that owns the request, or called back
through :meth:`on_final` and then completed or cancelled. Cancelling the awaiting task, or
calling :meth:`RequestHandle.cancel`, cancels the request: a queued request is dropped before
its batch forms, a running one has its result discarded.

The handle is also the request's response channel inside the server (what its responder sends
into, :class:`trident.server.execution.Responder`): one object per request, in place of a
mailbox. Used on the trio thread only (responders from other threads hop to it first).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trident.errors import internal
from trident.types import InferenceResponse

log = logging.getLogger("trident.execution")

SendResponse = Callable[[InferenceResponse], Awaitable[None]]
#: what runs a driven request, in the awaiting task: ``await drive(handle, send)`` sends its
#: responses to ``send`` (raising the TritonError of a request refused before any response)
Drive = Callable[["RequestHandle", SendResponse], Awaitable[None]]
#: a queued request's end, run once by the handle: the final response, or None when cancelled
Final = Callable[[InferenceResponse | None], None]


class RequestHandle:
    """One request in flight (see the module docstring for its three states).

    ``response`` is the final response once the request is answered: a request answered at
    once has it set before the server returns the handle (``handle.response is not None``:
    nothing to await), a queued one when ``wait()`` returns or the ``on_final`` callback runs.
    An error response never stays there: :meth:`wait` raises its error, and an ``on_final``
    callback gets it (``response.error`` set).
    """

    __slots__ = ("response", "_items", "_waiter", "_closed", "_callback", "_final", "_closers", "_drive")

    def __init__(self, drive: Drive | None = None, final: Final | None = None) -> None:
        self.response: InferenceResponse | None = None
        self._items: deque[InferenceResponse] | None = None  # responses queued for the driver
        self._waiter: trio.lowlevel.Task | None = None
        self._closed = False
        self._callback: Callable[[InferenceResponse], None] | None = None
        self._final = final  # queued: the model's end of the request
        self._closers: list[Callable[[], None]] | None = None
        self._drive = drive  # driven: what runs the request in the awaiting task

    # ---- the caller's side ----------------------------------------------------------------

    def on_final(self, callback: Callable[[InferenceResponse], None]) -> bool:
        """Have ``callback(response)`` called with the final response (an error response
        included) by the task that delivers it, on the trio thread, with no task of the
        caller's waiting: True for a queued request. The callback must not block and should
        not raise (what it raises is logged). The caller then calls :meth:`cancel` if it gives
        up. False (nothing done) for a request answered already or one that needs the caller's
        task (a driven one): ``await wait()`` then."""
        if self._final is None or self._closed:
            return False
        self._callback = callback
        return True

    async def wait(self) -> InferenceResponse:
        """The final response. Returns at once, without a checkpoint, when the request was
        answered already; otherwise waits for the queued request's response, or runs a driven
        request here. Raises TritonError: the request's error (an error response's included).
        Cancellation cancels the request."""
        response = self.response
        if response is None:
            if self._drive is not None:
                await self._run(self._keep)
                response = self.response
                if response is None:
                    raise internal("the request ended without a response")
            else:
                response = await self._wait_final()
        if response.error is not None:
            raise response.error
        return response

    async def stream(self, send: SendResponse) -> None:
        """``await send(response)`` for each response, the last one final. Raises TritonError
        for a request refused before its first response (later errors arrive as responses with
        ``error`` set), and what ``send`` raises. Cancellation cancels the request."""
        if self._drive is not None:
            await self._run(send)
            return
        await send(await self.wait())

    def cancel(self) -> None:
        """The caller gives up: the request is cancelled (dropped if still queued, its result
        discarded if running) and its answer, if any comes, is discarded. Idempotent; a no-op
        once the request is over. For a handle accepted by :meth:`on_final` (the others are
        cancelled by cancelling the task that awaits them)."""
        if not self._closed:
            self._end(None)

    # ---- inside the server ------------------------------------------------------------------

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the request ends (answered, failed or cancelled), before its answer
        is handed over: what the request holds (an admission, an in-flight count) is given back.
        A request already over runs it now."""
        if self._closed:
            fn()
            return
        if self._closers is None:
            self._closers = [fn]
        else:
            self._closers.append(fn)

    def send_nowait(self, response: InferenceResponse) -> None:
        """Deliver one response (the request's responder does). A queued request keeps only its
        final response, which completes it; otherwise the response waits for :meth:`receive`.
        Raises trio.BrokenResourceError once the request is over (the caller went away)."""
        if self._closed:
            raise trio.BrokenResourceError("the request's consumer is gone")
        if self._final is not None:
            if response.final:
                self._end(response)
            return
        items = self._items
        if items is None:
            items = self._items = deque()
        items.append(response)
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            trio.lowlevel.reschedule(waiter)

    def receive_nowait(self) -> InferenceResponse:
        """The next response delivered (a driver's loop reads them); raises trio.WouldBlock
        when none is there."""
        if self._items:
            return self._items.popleft()
        raise trio.WouldBlock

    async def receive(self) -> InferenceResponse:
        """Wait for the next response delivered (cancellable: a response that arrives later
        stays queued). Raises trio.BusyResourceError when another task is waiting already."""
        if self._items:
            await trio.lowlevel.checkpoint()
            return self._items.popleft()
        if self._waiter is not None:
            raise trio.BusyResourceError("another task is already receiving")
        self._waiter = trio.lowlevel.current_task()

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._waiter = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        assert self._items
        return self._items.popleft()

    def __aiter__(self) -> RequestHandle:
        return self

    async def __anext__(self) -> InferenceResponse:
        return await self.receive()

    async def __aenter__(self) -> RequestHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The responses are no longer wanted (the driver is done with them): later sends raise
        trio.BrokenResourceError. Runs the ``on_close`` functions once."""
        if not self._closed:
            self._closed = True
            if self._items:
                self._items.clear()
            self._run_closers()

    def answer(self, response: InferenceResponse) -> None:
        """The request was answered here and now with ``response`` (not an error response):
        the handle is over (its ``on_close`` functions run)."""
        self._closed = True
        self.response = response
        if self._closers is not None:
            self._run_closers()

    # ---- internals --------------------------------------------------------------------------

    async def _run(self, send: SendResponse) -> None:
        drive, self._drive = self._drive, None
        assert drive is not None
        try:
            await drive(self, send)
        finally:
            self.close()

    async def _keep(self, response: InferenceResponse) -> None:
        self.response = response  # a unary caller keeps the last

    async def _wait_final(self) -> InferenceResponse:
        if not self._closed:
            self._waiter = trio.lowlevel.current_task()

            def abort(_: Any) -> trio.lowlevel.Abort:
                self._waiter = None
                self.cancel()
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        else:
            await trio.lowlevel.checkpoint()
        response = self.response
        if response is None:  # over without an answer (a bug: a queued request always gets one)
            raise internal("the request ended without a response")
        return response

    def _end(self, response: InferenceResponse | None) -> None:
        """A queued request is over: ``response`` is its final response, None when cancelled.
        What it holds is given back, then the model records it, then the caller gets it."""
        self._closed = True
        # the callbacks hold the request and its caller, which hold this: dropped here, so that
        # no cycle is left for the garbage collector (a request is freed as soon as it is over)
        final, self._final = self._final, None
        callback, self._callback = self._callback, None
        try:
            self._run_closers()
            if final is not None:
                final(response)
            if response is None:
                return
            if callback is not None:
                callback(response)
                return
            self.response = response
            if self._waiter is not None:
                waiter, self._waiter = self._waiter, None
                trio.lowlevel.reschedule(waiter)
        except Exception:  # a bug: the deliverer (a model's worker) must go on
            log.exception("completing a request failed")

    def _run_closers(self) -> None:
        closers, self._closers = self._closers, None
        if closers is not None:
            for fn in closers:
                fn()
