"""How one request's responses travel from the server's loop to whoever iterates them.

:func:`request_job` is the loop's side: it runs a request (``Server.infer`` for a one-to-one
model, ``Server.infer_stream`` for a decoupled one) and puts each response, or the
:class:`Failure` that ends it, into an exchange. The exchange hands them to the consumer's side
without blocking the loop: a ``queue.SimpleQueue`` for a thread (:class:`ThreadExchange`), the
consumer's asyncio loop (``call_soon_threadsafe``, :class:`AsyncioExchange`) or trio loop
(``TrioToken.run_sync_soon``, :class:`TrioExchange`). Responses wait in the exchange until they
are taken (as Triton's response queues, unbounded).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
from collections.abc import Callable
from typing import Any

import trio

from trident.errors import TritonError as CoreError
from trident.server import Server
from trident.tritonserver._errors import TritonError, UnavailableError, UnknownError, from_core
from trident.types import InferenceRequest as CoreRequest
from trident.types import InferenceResponse as CoreResponse

log = logging.getLogger("trident.tritonserver")

CANCELLED = "Request was cancelled"


class Failure:
    """The end of a request without (further) responses: its error, and whether the server
    refused the request before running it (then it is raised whatever ``raise_on_error`` is)."""

    __slots__ = ("error", "rejected")

    def __init__(self, error: TritonError, rejected: bool = False) -> None:
        self.error = error
        self.rejected = rejected


Item = CoreResponse | Failure


def is_final(item: Item) -> bool:
    return isinstance(item, Failure) or item.final


class Exchange:
    """The way from the loop to one consumer. ``put`` is called on the loop's thread only;
    ``cancelled`` is set by the consumer before it cancels the request."""

    def __init__(self, user_queue: Any = None, convert: Callable[[Item], Any] | None = None) -> None:
        self.cancelled = False
        self._closed = False
        self._user_queue = user_queue
        self._convert = convert

    def put(self, item: Item) -> None:
        if self._closed:
            return
        self._closed = is_final(item)
        self._hand_over(item)

    def _hand_over(self, item: Item) -> None:
        raise NotImplementedError

    def _to_user_queue(self, item: Item) -> None:
        """Also give the converted response to the caller's ``response_queue`` (its
        ``put_nowait``, on the consumer's side where it has one). Raises nothing."""
        if self._user_queue is None or self._convert is None:
            return
        try:
            self._user_queue.put_nowait(self._convert(item))
        except Exception:
            log.exception("could not put a response into the request's response_queue")


class ThreadExchange(Exchange):
    """For a consumer thread: :meth:`get` blocks."""

    def __init__(self, user_queue: Any = None, convert: Callable[[Item], Any] | None = None) -> None:
        super().__init__(user_queue, convert)
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()

    def _hand_over(self, item: Item) -> None:
        self._queue.put(item)
        self._to_user_queue(item)

    def get(self) -> Item:
        return self._queue.get()


class AsyncioExchange(Exchange):
    """For a consumer on an asyncio loop: :meth:`get` awaits without blocking the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, user_queue: Any = None,
                 convert: Callable[[Item], Any] | None = None) -> None:
        super().__init__(user_queue, convert)
        self._loop = loop
        self._queue: asyncio.Queue[Item] = asyncio.Queue()

    def _hand_over(self, item: Item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._deliver, item)
        except RuntimeError:  # the asyncio loop is closed: nobody is left to read
            pass

    def _deliver(self, item: Item) -> None:
        self._queue.put_nowait(item)
        self._to_user_queue(item)

    async def get(self) -> Item:
        return await self._queue.get()


class TrioExchange(Exchange):
    """For a consumer on a trio loop (not the server's): :meth:`get` awaits."""

    def __init__(self, token: trio.lowlevel.TrioToken, user_queue: Any = None,
                 convert: Callable[[Item], Any] | None = None) -> None:
        super().__init__(user_queue, convert)
        self._token = token
        self._send, self._receive = trio.open_memory_channel[Item](math.inf)

    def _hand_over(self, item: Item) -> None:
        try:
            self._token.run_sync_soon(self._deliver, item)
        except trio.RunFinishedError:  # the consumer's loop ended: nobody is left to read
            pass

    def _deliver(self, item: Item) -> None:
        try:
            self._send.send_nowait(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        self._to_user_queue(item)

    async def get(self) -> Item:
        return await self._receive.receive()


def request_job(request: CoreRequest, exchange: Exchange) -> Callable[[Server], Any]:
    """The loop's side of one request: run it and put its responses into ``exchange``.

    The model's name and version are checked first: an unknown model, or one not ready, ends in
    a rejected Failure. A decoupled model's responses are put as they come (the last one final);
    a one-to-one model's single response is final. An error of the server or the model ends in
    a Failure; so does cancellation (the consumer's: UnknownError, as Triton's package reports
    CANCELLED; the server stopping: UnavailableError), after which the cancellation goes on.
    """
    async def job(server: Server) -> None:
        try:
            policy = server.model_config(request.model_name, request.model_version).model_transaction_policy
        except CoreError as e:
            exchange.put(Failure(from_core(e), rejected=True))
            return
        try:
            if policy is not None and policy.decoupled:
                final = False

                async def send(response: CoreResponse) -> None:
                    nonlocal final
                    final = final or response.final
                    exchange.put(response)

                await server.infer_stream(request, send)
                if not final:
                    exchange.put(CoreResponse(request.model_name, request.model_version, request.id, final=True,
                                              flag_only=True))
            else:
                exchange.put(await server.infer(request))
        except CoreError as e:
            exchange.put(Failure(from_core(e)))
        except trio.Cancelled:
            exchange.put(Failure(UnknownError(CANCELLED) if exchange.cancelled
                                 else UnavailableError("the server stopped before the request finished")))
            raise

    return job
