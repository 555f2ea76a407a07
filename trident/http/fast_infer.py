"""``POST /v2/models/{m}[/versions/{v}]/infer`` without ASGI: one connection's :class:`FastInfer`.

``serve_http_fast`` gives its connections the application's infer endpoint, and their task
answers an infer request itself, with the steps the ASGI application uses too
(:class:`trident.http.infer.InferExchange`): it reads the body (usually there with the head),
starts the request on the server and answers the handle it gets back:

* answered at once (an idle instance, inline: the usual case): encoded and written with one
  ``writev``; a small answer made while other tasks share the loop's round is kept for the end
  of the round (:meth:`trident.sockets_io.SocketIO.defer`: one wake-up of a client reading many
  connections instead of one per answer);
* queued, on a keep-alive connection with nothing else in its parser: answered later by the
  task that delivers the response (the handle's ``on_final``), while this connection's task
  reads on; a pipelined request waits until that answer is out (:meth:`FastInfer.settle`);
* anything else: awaited in the connection's task while the disconnect watcher
  (:mod:`trident.http.watch`) looks after the socket.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from trident.errors import TritonError
from trident.http import offload
from trident.http.infer import JSON, Disconnected, HTTPError, InferExchange, too_large
from trident.http.limits import BODY_RECEIVE_SIZE, DEFER_BYTES, DRAIN_LIMIT, MIN_BODY_RATE, RECEIVE_SIZE
from trident.http.watch import DisconnectWatch
from trident.protocol import kserve
from trident.protocol.http1 import CONTINUE, HTTPStatus, ProtocolError, RequestHead, encode_head
from trident.types import InferenceResponse

#: a body announced (Content-Length) at least this large and not all there with its head is
#: received into one buffer of its size
PLACED_BODY = 1 << 20

if TYPE_CHECKING:
    from trident.http.infer import InferEndpoint
    from trident.http.state import ConnectionState
    from trident.server import RequestHandle

log = logging.getLogger("trident.http")

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
_NEVER = math.inf


def framed(status: int, headers: list[tuple[bytes, bytes]], parts: list[Any], keep_alive: bool,
           http_version: str) -> tuple[list[Any], int]:
    """An answer as the parts to write, its head first, and its body's length."""
    total = len(parts[0]) if len(parts) == 1 else sum(len(p) for p in parts)
    return [encode_head(status, headers, total, keep_alive, http_version), *parts], total


class FastInfer:
    """The /infer requests of one connection, answered without ASGI (see the module docstring).

    ``pending`` is the handle of a queued request answered later (and ``later`` its exchange
    and HTTP version) until its answer is made; ``settled`` is set then, for a task that waits
    for it (:meth:`settle`).
    """

    __slots__ = ("conn", "watch", "exchange", "pending", "later", "settled", "sent_continue", "protocol_error")

    def __init__(self, conn: ConnectionState, watch: DisconnectWatch, endpoint: InferEndpoint) -> None:
        self.conn = conn
        self.watch = watch
        self.exchange = InferExchange(endpoint)  # the connection's requests, one at a time
        self.pending: RequestHandle | None = None
        self.later: tuple[InferExchange, str] | None = None
        self.settled: trio.Event | None = None
        self.sent_continue = False
        self.protocol_error: ProtocolError | None = None  # of the body read

    async def answer(self, head: RequestHead, name: str, version: str) -> bool:
        """Answer an infer request (as the ASGI app would); True when the connection can take
        another. Raises ProtocolError for a body that timed out or is malformed (the connection
        answers 408/400 and closes)."""
        conn = self.conn
        exchange = self.exchange
        endpoint = exchange.endpoint
        parser = conn.parser
        self.sent_continue = False
        self.protocol_error = None
        try:
            if endpoint.restrictions:
                endpoint.check_restricted(head.headers, "inference")
            length = head.content_length
            if length is not None and length <= endpoint.limit and parser.buffered >= length:
                # the whole body came with the head (the usual case): taken in one piece, no wait
                got = parser.next_body(length)
                assert got is not None and got[1]  # a Content-Length body, all of it buffered
                body: bytes | bytearray | memoryview = got[0]
                # nothing else waits in the parser: a queued request may be answered later
                later_ok = head.keep_alive and not parser.buffered and not conn.state.shutting_down
            else:
                body = await self._wait_body(head, endpoint.limit)
                later_ok = False
            try:
                handle = await exchange.start(head.headers, body, name, version)
                del body
                response = handle.response
                if response is None:  # not answered at once
                    if later_ok and exchange.heavy is None and handle.on_final(self._answered):
                        # queued: answered by the task that delivers its response; this one reads on
                        self.pending = handle
                        self.later = (exchange, head.http_version)
                        self.exchange = InferExchange(endpoint)
                        return conn.request_done()
                    response = await self._wait(handle, exchange.heavy is not None)
                    if response is None:  # a heavy request whose client went away
                        raise Disconnected
                reply = exchange.reply(response)
                status, headers, parts = reply if reply is not None else await exchange.respond(response)
                if exchange.heavy is not None:
                    exchange.answered = response  # encoded: let go of off the loop (exchange.free)
                del response, reply, handle
            except Disconnected:
                raise
            except Exception as exc:
                status, headers, parts = exchange.error(exc)
            finally:
                exchange.end()
                if exchange.heavy is not None:
                    await exchange.free()
        except HTTPError as exc:
            status, headers, parts = exc.status, [JSON], [kserve.error_body(exc.message)]
        except TritonError as exc:  # the body's size
            status, headers, parts = exchange.error(exc)
        except Disconnected:
            if self.protocol_error is not None:  # a body timeout or bad chunked framing: 408/400 and close
                raise self.protocol_error from None
            return False
        keep_alive = head.keep_alive
        if conn.state.shutting_down:
            keep_alive = False
        elif not parser.body_done:
            remaining = parser.body_remaining
            if ((head.expect_continue and not self.sent_continue) or remaining is None
                    or remaining - parser.buffered > DRAIN_LIMIT):
                keep_alive = False  # the unread body is not worth reading
        out, total = framed(status, headers, parts, keep_alive, head.http_version)
        io = conn.io
        if (keep_alive and total <= DEFER_BYTES and parser.body_done and io.busy is None
                and not (conn.eof or io.broken) and conn.state.round.shared()):
            io.defer(out)  # written with the other answers of this pass of the loop
            return conn.request_done()
        await io.write(out, len(out[0]) + total)
        if keep_alive and parser.body_done and not (conn.eof or io.broken):
            return conn.request_done()  # the usual case: nothing of the body left to skip
        return await conn.next_request(keep_alive)

    async def _wait_body(self, head: RequestHead, limit: int) -> bytes | bytearray | memoryview:
        """The whole body of ``head``, when it is still arriving, or chunked; raises too_large
        (INVALID_ARG) past ``limit`` bytes, before reading when Content-Length says so, and
        Disconnected when the client goes away, the body times out (``protocol_error`` is set)
        or the socket breaks. One cancel scope for the whole body: its deadline is moved before
        each wait to ``body_timeout`` from then, or earlier when the body drips slower than
        MIN_BODY_RATE (``body_timeout`` from the first wait plus 1 s per MIN_BODY_RATE bytes
        received)."""
        if head.content_length is not None and head.content_length > limit:
            raise too_large(head.content_length, limit)
        conn = self.conn
        parser = conn.parser
        io = conn.io
        body: bytearray | None = None
        store: memoryview | None = None
        filled = mapped = 0  # bytes of ``store`` received into, and mapped (see offload.map_ahead)
        deadline = _NEVER
        body_timeout = conn.state.body_timeout
        with trio.CancelScope() as scope:
            while True:
                try:
                    room = parser.body_room if store is not None else 0
                    if room and store is not None:  # a placed body: the socket's bytes go straight into place
                        now = trio.current_time()
                        if deadline == _NEVER:  # the body so far came with the head: no wait yet
                            deadline = now + body_timeout
                        scope.deadline = min(now + body_timeout, deadline)
                        if filled >= mapped:  # the next pages mapped off the loop first
                            mapped = await offload.map_ahead(store, filled)
                        n = await io.receive_into(store[filled : filled + min(room, BODY_RECEIVE_SIZE,
                                                                              mapped - filled)])
                        if not n:
                            conn.eof = True
                            raise Disconnected
                        deadline += n / MIN_BODY_RATE
                        filled += n
                        if parser.body_received(n):
                            return store
                        continue
                    got = parser.next_body()
                    while got is None:
                        if head.expect_continue and not self.sent_continue:
                            self.sent_continue = True
                            await io.write([CONTINUE])
                        remaining = parser.body_remaining
                        size = (BODY_RECEIVE_SIZE if remaining is None
                                else max(RECEIVE_SIZE, min(remaining, BODY_RECEIVE_SIZE)))
                        now = trio.current_time()
                        if deadline == _NEVER:
                            deadline = now + body_timeout
                        scope.deadline = min(now + body_timeout, deadline)
                        data = await io.receive(size)
                        if not data:
                            conn.eof = True
                            raise Disconnected
                        deadline += len(data) / MIN_BODY_RATE
                        got = parser.body_from(data)
                except ProtocolError as exc:
                    self.protocol_error = exc
                    raise Disconnected from None
                except _STREAM_ERRORS:
                    io.broken = True
                    raise Disconnected from None
                chunk, done = got
                if store is not None:  # a large Content-Length body: copied into its place
                    store[filled : filled + len(chunk)] = chunk
                    filled += len(chunk)
                    if done:
                        return store
                    continue
                if body is None:
                    if len(chunk) > limit:
                        raise too_large(len(chunk), limit)
                    if done:
                        return chunk  # the whole body in one piece: no copy
                    length = head.content_length
                    if length is not None and length >= PLACED_BODY:
                        # one buffer of the announced size (the parser stops at it): a growing
                        # bytearray would be moved whole by realloc each time it outgrew its
                        # place in the heap (glibc serves up to the 32 MiB mmap threshold from
                        # it), tens of ms of copying on the event loop for a large body
                        store = offload.body_buffer(length)
                        store[: len(chunk)] = chunk
                        filled = len(chunk)
                        continue
                    body = bytearray(chunk)
                else:
                    if len(body) + len(chunk) > limit:
                        raise too_large(len(body) + len(chunk), limit)
                    body += chunk
                if done:
                    return body
        # a pause too long, or a body dripping slower than MIN_BODY_RATE
        self.protocol_error = ProtocolError(HTTPStatus.REQUEST_TIMEOUT, "request body timeout")
        raise Disconnected

    async def _wait(self, handle: RequestHandle, heavy: bool) -> InferenceResponse | None:
        """The response of a request that did not run at once (``handle.wait()``), while the
        connection's watcher looks for a disconnect.

        A client that goes away cancels the connection's scope: the request is cancelled (in
        the server too) and the connection closes. That costs no task, cancel scope or deadline
        per request (see :mod:`trident.http.watch`). A ``heavy`` request (decoded in a worker
        thread) has a scope of its own instead, so that a disconnect returns None and the
        caller can free the request off the loop. Raises what ``handle.wait()`` raises.
        """
        watch = self.watch
        watch.starts()
        try:
            if not heavy:
                return await handle.wait()
            with trio.CancelScope() as scope:
                watch.request_scope = scope
                try:
                    return await handle.wait()
                finally:
                    watch.request_scope = None
            return None
        finally:
            watch.ends()

    def _answered(self, response: InferenceResponse) -> None:
        """Answer the queued request that :meth:`answer` left for later, here in the task that
        delivers its response (the handle's ``on_final`` callback): encoded now and kept for
        the end of the round (or written now) when small; a large one (or one behind a write
        still in progress) is encoded and written by a task of the connection's, and the
        connection's next write waits for it. Never raises."""
        assert self.later is not None
        later, http_version = self.later
        self.later = self.pending = None
        conn = self.conn
        io = conn.io
        try:
            tasks = io.tasks
            if io.broken or tasks is None:  # the connection is going away: nobody to answer
                return
            keep_alive = not conn.state.shutting_down
            reply = later.reply(response) if io.busy is None else None
            if reply is not None:
                status, headers, parts = reply
                del response, reply
                out, total = framed(status, headers, parts, keep_alive, http_version)
                if keep_alive and total <= DEFER_BYTES and not conn.eof:
                    # kept for the end of this round even when this task is alone in it: the
                    # task that delivers a batch answers its other requests in the same step
                    io.defer(out)
                else:
                    io.write_soon(out)
            else:
                previous, busy = io.take_turn()
                tasks.start_soon(self._write_later, later, response, http_version, keep_alive, previous, busy,
                                 name="trident.http.write_later")
            if conn.at_head:
                conn.idle = True
                if not keep_alive and io.busy is None:  # shutting down: the connection closes now
                    conn.stop()
        except Exception:  # a bug: this connection's answer is lost, not the deliverer's others
            log.exception("error answering a queued request")
            io.broken = True
            conn.stop()
        finally:
            if self.settled is not None:
                self.settled.set()

    async def _write_later(self, later: InferExchange, response: InferenceResponse, http_version: str,
                           keep_alive: bool, previous: trio.Event | None, busy: trio.Event) -> None:
        """:meth:`_answered` for a large response: encoded (off the loop when large) and written
        in the connection's turn (``busy``), after the write in progress (``previous``)."""
        io = self.conn.io
        try:
            if previous is not None:
                await previous.wait()
            status, headers, parts = await later.respond(response)
            del response
            out, _ = framed(status, headers, parts, keep_alive, http_version)
            await io.write_in_turn(out)
        finally:
            io.end_turn(busy)

    async def settle(self) -> None:
        """Wait until the queued request left for later is answered; the disconnect watcher
        looks after the socket meanwhile (EOF stops the connection, whose end then cancels the
        request: :meth:`cancel`). Cancellation just stops the wait."""
        watch = self.watch
        self.settled = trio.Event()
        watch.starts()
        try:
            if self.pending is not None:
                await self.settled.wait()
        finally:
            self.settled = None
            watch.ends()

    def cancel(self) -> None:
        """The connection ends: the queued request left for later, if any, is cancelled."""
        if self.pending is not None:
            pending, self.pending, self.later = self.pending, None, None
            pending.cancel()
