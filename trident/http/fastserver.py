"""A lean HTTP/1.1 server on trio for ASGI 3 applications (``http`` scopes).

``--http-server trident`` serves :func:`trident.http.app.make_app` with this module instead of
hypercorn. Parsing and response framing are sans-IO (:mod:`trident.protocol.http1`); this module
only moves bytes and drives the ASGI calls:

* one trio task per connection, requests handled in order (pipelined bytes wait in the parser);
  the application runs in the connection's task, so a request costs no task switch of its own;
  the socket is read and written with non-blocking calls that wait through trio only when the
  kernel says so (one checkpoint per ``YIELD_BYTES`` moved or ``YIELD_EVERY`` requests served
  without a wait, so a busy connection does not hold the loop);
* ``POST /v2/models/{m}[/versions/{v}]/infer`` skips ASGI when the server is given the app's
  :class:`~trident.http.infer.InferEndpoint` (``serve_http_fast`` does): the connection task
  reads the body, calls the endpoint (the same decode, run, encode and error mapping as the
  app's /infer) and writes the head and body with one ``writev``; a small response made while
  other tasks share the loop's round is kept and written with theirs when the round ends
  (:class:`_Flusher`: one wake-up of a client reading many connections instead of one per
  response), and the connection's next write waits for it, so responses stay in order.
  Disconnects are watched without a task per request: one ticker per server (:func:`_tick`)
  finds requests still running after ``WATCH_DELAY`` and wakes their connection's watcher task
  (started the first time it is needed), which reads the socket until the request ends; EOF or
  a reset cancels the request and closes the connection;
* ``receive()`` returns the body as ``http.request`` messages (no larger than 1 MiB each, so a
  size limit can refuse a large body early) and sends ``100 Continue`` the first time it needs
  body bytes the client holds back; once the body is read, ``receive()`` returns
  ``http.disconnect`` when the response is complete or the client goes away (it watches the
  socket from ``WATCH_DELAY`` after the call: most responses are done before, and waking on an
  event is cheaper than a socket wait that must be cancelled);
* ``send()`` writes the head with the first body message in one write; a streamed body
  without ``content-length`` uses chunked transfer coding;
* malformed requests get ``400`` (``431`` for a head over 64 KiB) and the connection closes; a
  connection closed with request bytes unread is shut down for writing and drained first
  (lingering close), so the client reads the response instead of a reset;
* idle keep-alive connections close after ``keep_alive_timeout`` (between 1x and 2x of it);
* a request head must arrive whole within ``header_timeout`` of its first byte (of the accept,
  for a connection's first request): a partial head then gets ``408`` and the connection
  closes, a connection that sent nothing is closed without a response;
* a pause longer than ``body_timeout`` while the application waits for body bytes fails the
  request, and so does a body that drips in: the whole body must arrive within
  ``body_timeout`` plus one second per ``MIN_BODY_RATE`` bytes received; the application gets
  ``http.disconnect``, the client ``408`` and the connection closes;
* at ``max_connections`` open connections, accepting pauses until one closes (the kernel's
  backlog holds the clients meanwhile);
* graceful shutdown: stop accepting, close idle connections, let in-flight requests finish
  within ``graceful_timeout``, then cancel the rest.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

import trio

from trident.batching import rounds
from trident.http.app import make_app
from trident.http.asgi import ASGIApp, Message
from trident.http.infer import JSON, LATER, Disconnected, HTTPError, InferEndpoint, Later, too_large
from trident.listening import TcpListener, open_tcp_listeners, serve_listener
from trident.protocol import kserve
from trident.protocol.http1 import (
    CONTINUE,
    DEFAULT_MAX_HEAD_SIZE,
    HTTPStatus,
    ProtocolError,
    RequestHead,
    RequestParser,
    ResponseFramer,
    encode_head,
    error_response,
)
from trident.server.execution import Answer, Completion
from trident.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.http")

RECEIVE_SIZE = 64 * 1024
BODY_RECEIVE_SIZE = 256 * 1024
MAX_READ_AHEAD = 64 * 1024  # pipelined bytes buffered while a request runs; beyond, reading pauses
DRAIN_LIMIT = 64 * 1024  # an unread request body up to this is skipped to keep the connection open
LINGER_SECONDS = 2.0  # lingering close: longest pause in what the client still sends
LINGER_TOTAL_SECONDS = 30.0
WATCH_DELAY = 0.02
YIELD_EVERY = 8  # a connection serving requests without waiting for its socket yields after this many
YIELD_BYTES = 256 * 1024  # ... and after moving this many bytes
KEEP_ALIVE_TIMEOUT = 75.0
HEADER_TIMEOUT = 30.0  # the defaults of --http-header-timeout-secs, --http-body-timeout-secs and
BODY_TIMEOUT = 60.0  # --http-max-connections (trident.options)
MAX_CONNECTIONS = 4096
MIN_BODY_RATE = 64 * 1024  # bytes/s: a body's deadline grows by 1 s per this many bytes received
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
_NEVER = math.inf
_IOV_MAX = 512  # buffers per writev
DEFER_BYTES = 64 * 1024  # an /infer response up to this size waits for the loop's flush (see _Flusher)
DEFER_LIMIT = 32  # responses waiting for the flush: at this many they are written at once
_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")


class _Flusher:
    """Small /infer responses written together, when the run loop is about to wait for I/O.

    A response written the moment it is ready wakes its client once per response: across CPUs
    that is an inter-processor interrupt inside the write, and the client's next request then
    interrupts the server in turn. Responses made in the same pass of the run loop (the requests
    of every connection that was readable) are instead kept by their connections and written
    back to back by :meth:`end_of_round` (called at the end of the loop's round, before it
    polls: :meth:`trident.batching.rounds.Round.at_end`), or as soon as DEFER_LIMIT of them
    wait: a client that reads many connections (wrk, a pool of keep-alive connections) is woken
    once for all of them. A response whose task is alone in its round (one client, one
    connection: ``Round.shared()`` is false) is written at once instead, as waiting would only
    delay it. Never raises (an exception would disable the loop's instrument).
    """

    def __init__(self) -> None:
        self.waiting: list[_Connection] = []

    def end_of_round(self) -> None:
        if self.waiting:
            self.flush()

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        for conn in waiting:
            try:
                conn.flush_deferred()
            except Exception:  # a bug: that connection's response is lost, not every later one's
                log.exception("error writing a response")
                conn.broken = True


class _State:
    """Settings and live connections of one server."""

    def __init__(self, app: ASGIApp, max_head_size: int, keep_alive_timeout: float, header_timeout: float,
                 body_timeout: float, max_connections: int, endpoint: InferEndpoint | None = None) -> None:
        self.app = app
        self.endpoint = endpoint  # set: /infer takes the fast path (no ASGI)
        self.max_head_size = max_head_size
        self.keep_alive_timeout = keep_alive_timeout
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.slots = trio.Semaphore(max_connections, max_value=max_connections)  # one per open connection
        self.connections: set[_Connection] = set()
        self.shutting_down = False
        self.ticker_park: trio.CancelScope | None = None  # the ticker's sleep while no request runs
        self.flusher = _Flusher()  # installed by serve_asgi while it serves
        self.round: rounds.Round | None = None  # this run's rounds (serve_asgi sets it)

    def close_idle(self) -> None:
        for conn in self.connections:
            if conn.idle:
                conn.stop()


def _framed(status: int, headers: list[tuple[bytes, bytes]], parts: list[Any], keep_alive: bool,
            http_version: str) -> tuple[list[Any], int]:
    """A response as the parts to write, its head first, and its body's length."""
    total = len(parts[0]) if len(parts) == 1 else sum(len(p) for p in parts)
    return [encode_head(status, headers, total, keep_alive, http_version), *parts], total


class _Connection:
    __slots__ = ("state", "stream", "fd", "parser", "cancel_scope", "idle", "served", "reaper_mark", "client",
                 "sockname", "eof", "broken", "linger", "head_deadline", "watcher", "yielded", "streak", "moved", "sent_continue",
                 "protocol_error", "busy", "seen", "park", "watching", "request_scope", "drained", "answer",
                 "tasks", "deferred", "stuck", "later_ok", "pending", "later", "settled", "at_head", "stopped")

    def __init__(self, state: _State, stream: trio.SocketStream) -> None:
        self.state = state
        self.stream = stream
        self.fd = stream.socket.fileno()
        self.parser = RequestParser(state.max_head_size)
        self.cancel_scope = trio.CancelScope()  # cancelled by stop() only (it has no deadline)
        self.stopped = False  # stop() was called: what cancel_scope.cancel_called says, without a clock read
        self.idle = False  # waiting for a request head: shutdown and the reaper may close it
        self.served = 0
        self.reaper_mark = -1
        self.eof = False  # the client closed its side
        self.broken = False  # a write failed
        self.linger = False  # close with request bytes unread: drain before closing
        self.head_deadline = trio.current_time() + state.header_timeout  # first request: from the accept
        self.watcher = False  # the disconnect watcher has started (the first time a request ran long)
        self.yielded = False  # the task waited for the socket since the last request
        self.streak = 0  # requests served since the task last yielded (fairness: see YIELD_EVERY)
        self.moved = 0  # bytes received or sent since then (see YIELD_BYTES)
        self.drained = False  # the last read emptied the socket: the next one waits first
        self.sent_continue = False
        self.protocol_error: ProtocolError | None = None  # of the fast path's body read
        # the disconnect watcher (see _watch): ``busy`` is odd while a request runs (+1 at its
        # start and end; ``seen`` is its value at the ticker's last look), ``park`` the
        # watcher's sleep, ``watching`` its scope while it reads the socket
        self.busy = 0
        self.seen = -1
        self.request_scope: trio.CancelScope | None = None  # a heavy request's
        self.park: trio.CancelScope | None = None
        self.watching: trio.CancelScope | None = None
        # output kept for the flusher (see _Flusher), and while part of it could not be written
        # then, the event its writer task sets when the socket has taken it (the connection's
        # next write waits for that, so responses stay in order)
        self.deferred: list[Any] | None = None
        self.stuck: trio.Event | None = None
        self.tasks: trio.Nursery | None = None  # the connection's nursery (the watcher, a stuck write)
        self.answer = Answer()  # how a queued request's response comes back (one request at a time)
        # a queued request answered by the task that delivers its response (see _answered): the
        # connection's task reads on meanwhile. ``later_ok`` while a request may take that path,
        # ``pending`` its completion and ``later`` how to encode it (with the HTTP version)
        # until it is answered, ``settled`` set then for a task that waits for it (_settle);
        # ``at_head`` while the task waits for the next request's head
        self.later_ok = False
        self.pending: Completion | None = None
        self.later: tuple[Later, str] | None = None
        self.settled: trio.Event | None = None
        self.at_head = False
        try:
            self.client: tuple[str, int] | None = tuple(stream.socket.getpeername()[:2])  # type: ignore[assignment]
            self.sockname: tuple[str, int] | None = tuple(stream.socket.getsockname()[:2])  # type: ignore[assignment]
        except OSError:
            self.client = self.sockname = None

    async def serve(self) -> None:
        """Serve the connection's requests until it closes; the slot it holds is released at the end."""
        state = self.state
        try:
            with self.cancel_scope:
                try:
                    async with trio.open_nursery() as nursery:
                        self.tasks = nursery
                        await self._serve()
                        if self.pending is not None and not (self.eof or self.broken):
                            await self._settle()  # shutting down: the queued request is answered first
                        if self.deferred is not None or self.stuck is not None:
                            await self.writev([])  # what waits for the flusher goes out before the close
                        nursery.cancel_scope.cancel()  # the watcher
                finally:
                    self.tasks = None
                    if self.pending is not None:  # the client went away (or the server gave up)
                        pending, self.pending, self.later = self.pending, None, None
                        pending.cancel()
        finally:
            state.connections.discard(self)
            try:
                await self._close()
            finally:
                state.slots.release()

    def stop(self) -> None:
        """Close the connection: its scope is cancelled (the task ends at its next checkpoint,
        the queued request it holds, if any, is cancelled). Idempotent."""
        self.stopped = True
        self.cancel_scope.cancel()

    async def _serve(self) -> None:
        parser = self.parser
        state = self.state
        endpoint = state.endpoint
        try:
            while True:
                head = parser.next_head()
                if head is None:
                    if state.shutting_down:
                        return
                    self.idle = self.pending is None  # else its answer marks it idle (_answered)
                    self.at_head = True
                    if self.head_deadline == _NEVER:
                        if parser.buffered:  # the next head has started: the clock runs
                            self.head_deadline = trio.current_time() + state.header_timeout
                            continue
                        data = await self._recv(RECEIVE_SIZE)
                    else:
                        data = None
                        with trio.move_on_at(self.head_deadline):
                            data = await self._recv(RECEIVE_SIZE)
                        if data is None and not self.stopped:
                            if parser.buffered:  # a partial head: answer 408
                                raise ProtocolError(HTTPStatus.REQUEST_TIMEOUT, "request head timeout")
                            return  # nothing sent: close quietly, like an idle keep-alive connection
                    self.idle = self.at_head = False
                    if not data:
                        self.eof = True
                        return
                    if self.stopped:
                        return
                    parser.feed(data)
                    continue
                if self.pending is not None:  # a pipelined request: its answer goes out after the queued one's
                    await self._settle()
                self.head_deadline = _NEVER
                if self.yielded:
                    self.yielded = False
                    self.streak = 0
                else:  # requests served back to back: let other connections run now and then
                    self.streak += 1
                    if self.streak >= YIELD_EVERY:
                        self.streak = 0
                        await trio.lowlevel.checkpoint()
                target = None
                if endpoint is not None and head.method == "POST":
                    target = _infer_target(head.target)
                if target is not None:
                    if not await self._infer(head, endpoint, *target):  # type: ignore[arg-type]
                        return
                elif not await self._cycle(head):
                    return
        except ProtocolError as exc:
            self.linger = True
            await self.write(error_response(exc.status, exc.message))
        except _STREAM_ERRORS:
            self.broken = True

    # ---- raw socket I/O (the socket is non-blocking; waits go through trio) -----------------

    async def _recv(self, size: int) -> bytes:
        """Up to ``size`` received bytes, b"" at EOF; raises trio.BrokenResourceError.

        Not a checkpoint when bytes are waiting, except once per YIELD_BYTES moved without a
        wait (a large body arriving fast does not hold the loop). After a read that emptied the
        socket (fewer bytes than asked for), the next one waits for bytes first instead of
        trying a read that would almost always fail (a client waiting for its answer).
        """
        fd = self.fd
        if self.drained:
            self.yielded = True
            self.moved = 0
            await trio.lowlevel.wait_readable(fd)
        while True:
            try:
                data = os.read(fd, size)
            except BlockingIOError:
                self.yielded = True
                self.moved = 0
                await trio.lowlevel.wait_readable(fd)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(exc) from exc
            self.drained = len(data) < size
            self.moved += len(data)
            if self.moved >= YIELD_BYTES:
                self.moved = 0
                await trio.lowlevel.checkpoint()
            return data

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self.writev([data])

    async def writev(self, parts: list[Any], size: int = -1) -> None:
        """Write ``parts`` (``size`` bytes in all, when the caller knows) in order: one writev
        when the socket takes them; a no-op once broken."""
        if self.stuck is not None:
            await self.stuck.wait()
        if self._behind_deferred(parts):
            size = -1
        if parts and not self._write_now(parts, size):
            await self._write_rest(parts)

    def _behind_deferred(self, parts: list[Any]) -> bool:
        """Put what waits for the flusher in front of ``parts``, to be written first, with them
        (the flusher then finds nothing here); True when there was something."""
        if self.deferred is None:
            return False
        parts[:0] = self.deferred
        self.deferred = None
        return True

    def defer(self, parts: list[Any]) -> None:
        """Keep ``parts`` (a whole response) for the flusher (see _Flusher). The caller checked
        that the connection stays open and is not waiting for an earlier write (:attr:`stuck`)."""
        if self.deferred is None:
            self.deferred = parts
            flusher = self.state.flusher
            flusher.waiting.append(self)
            if len(flusher.waiting) >= DEFER_LIMIT:
                flusher.flush()
        else:  # pipelined requests answered in the same pass
            self.deferred += parts

    def flush_deferred(self) -> None:
        """Write what waits for the flusher, here and now (the flusher's call; never raises).
        What the socket does not take is written by a task of the connection's, and the
        connection's next write waits for it (:attr:`stuck`)."""
        parts = self.deferred
        if parts is None:
            return
        self.deferred = None
        if self.broken:
            return
        try:
            n = os.writev(self.fd, parts[:_IOV_MAX]) if len(parts) > 1 else os.write(self.fd, parts[0])
        except BlockingIOError:
            n = 0
        except OSError:
            self.broken = True
            return
        _consume(parts, n)
        if not parts:
            return
        if self.tasks is None:  # the connection is closing: it writes what is left itself
            self.deferred = parts
            return
        stuck = self.stuck = trio.Event()
        self.tasks.start_soon(self._write_stuck, parts, stuck, name="trident.http.write_rest")

    async def _write_stuck(self, parts: list[Any], stuck: trio.Event) -> None:
        try:
            await self._write_rest(parts)
        finally:
            if self.stuck is stuck:
                self.stuck = None
            stuck.set()

    def _write_now(self, parts: list[Any], size: int) -> bool:
        """One write of ``parts`` (``size`` bytes in all, or -1), here and now; True when all of
        it went out (or the socket is broken: nothing more will), else ``parts`` is left holding
        what remains for :meth:`_write_rest` (which may also owe the loop a checkpoint)."""
        if self.broken:
            return True
        try:
            n = os.writev(self.fd, parts[:_IOV_MAX]) if len(parts) > 1 else os.write(self.fd, parts[0])
        except BlockingIOError:
            return False
        except OSError:
            self.broken = True
            return True
        self.moved += n
        if n == size and self.moved < YIELD_BYTES:  # all of it at once (the usual case)
            return True
        _consume(parts, n)
        return not parts and self.moved < YIELD_BYTES

    async def _write_rest(self, parts: list[Any]) -> None:
        """Write what :meth:`_write_now` left, waiting for the socket through trio."""
        fd = self.fd
        try:
            while True:
                if self.moved >= YIELD_BYTES:
                    self.moved = 0
                    await trio.lowlevel.checkpoint()
                if not parts or self.broken:
                    return
                try:
                    n = os.writev(fd, parts[:_IOV_MAX]) if len(parts) > 1 else os.write(fd, parts[0])
                except BlockingIOError:
                    self.yielded = True
                    self.moved = 0
                    await trio.lowlevel.wait_writable(fd)
                    continue
                self.moved += n
                _consume(parts, n)
        except OSError:
            self.broken = True

    async def _close(self) -> None:
        if self.deferred is not None:  # the connection was cancelled before its last flush
            parts, self.deferred = self.deferred, None
            self._write_now(parts, -1)
        try:
            if (self.linger or self.parser.buffered) and not (self.eof or self.broken):
                # read and drop what the client still sends until it closes (or pauses)
                with trio.move_on_after(LINGER_TOTAL_SECONDS):
                    await self.stream.send_eof()
                    data = b"-"
                    while data:
                        data = b""
                        with trio.move_on_after(LINGER_SECONDS):
                            data = await self._recv(BODY_RECEIVE_SIZE)
        except (*_STREAM_ERRORS, OSError):
            pass
        finally:
            self.stream.socket.close()

    # ---- /infer without ASGI ----------------------------------------------------------------

    async def _infer(self, head: RequestHead, endpoint: InferEndpoint, name: str, version: str) -> bool:
        """Answer an infer request (as the ASGI app would); True when the connection can take another."""
        self.sent_continue = False
        self.protocol_error = None
        try:
            if endpoint.restrictions:
                endpoint.check_restricted(head.headers, "inference")
            length = head.content_length
            body: Any
            if length is not None and length <= endpoint.limit and self.parser.buffered >= length:
                # the whole body came with the head (the usual case): taken in one piece, no wait
                got = self.parser.next_body(length)
                assert got is not None and got[1]  # a Content-Length body, all of it buffered
                body = got[0]
                # nothing else waits in the parser: a queued request may be answered later
                self.later_ok = head.keep_alive and not self.parser.buffered and not self.state.shutting_down
            else:
                async def body() -> bytes | bytearray:
                    return await self._wait_body(head, endpoint.limit)

            try:
                reply = await endpoint.handle(head.headers, body, self._run, name, version)
            finally:
                self.later_ok = False
            if isinstance(reply, Later):
                self.later = (reply, head.http_version)
                self.parser.start_next()
                self.served += 1
                if self.answer.response is not None:  # answered already, before it was set up
                    response, self.answer.response = self.answer.response, None
                    self._answered(response)
                return not self.state.shutting_down
            status, headers, parts = reply
        except HTTPError as exc:
            status, headers, parts = exc.status, [JSON], [kserve.error_body(exc.message)]
        except Disconnected:
            if self.protocol_error is not None:  # a body timeout or bad chunked framing: 408/400 and close
                raise self.protocol_error from None
            return False
        parser = self.parser
        keep_alive = head.keep_alive
        if self.state.shutting_down:
            keep_alive = False
        elif not parser.body_done:
            remaining = parser.body_remaining
            if ((head.expect_continue and not self.sent_continue) or remaining is None
                    or remaining - parser.buffered > DRAIN_LIMIT):
                keep_alive = False  # the unread body is not worth reading
        out, total = _framed(status, headers, parts, keep_alive, head.http_version)
        if (keep_alive and total <= DEFER_BYTES and parser.body_done and self.stuck is None
                and not (self.eof or self.broken) and self.state.round is not None and self.state.round.shared()):
            self.defer(out)  # written with the other responses of this pass of the loop
            parser.start_next()
            self.served += 1
            return not self.state.shutting_down
        await self.writev(out, len(out[0]) + total)
        if self.eof or self.broken:
            return False
        if not parser.body_done:
            if not keep_alive or not await self._drain_body():
                self.linger = True
                return False
        if not keep_alive:
            return False
        parser.start_next()
        self.served += 1
        return not self.state.shutting_down

    async def _wait_body(self, head: RequestHead, limit: int) -> bytes | bytearray:
        """The whole body of ``head``, when it is still arriving, or chunked; raises too_large
        (INVALID_ARG) past ``limit`` bytes, before reading when Content-Length says so, and
        Disconnected when the client goes away, the body times out (``protocol_error`` is set)
        or the socket breaks. One cancel scope
        for the whole body: its deadline is moved before each wait to ``body_timeout`` from
        then, or earlier when the body drips slower than MIN_BODY_RATE (``body_timeout`` from
        the first wait plus 1 s per MIN_BODY_RATE bytes received)."""
        if head.content_length is not None and head.content_length > limit:
            raise too_large(head.content_length, limit)
        parser = self.parser
        body: bytearray | None = None
        deadline = _NEVER
        body_timeout = self.state.body_timeout
        with trio.CancelScope() as scope:
            while True:
                try:
                    got = parser.next_body()
                    while got is None:
                        if head.expect_continue and not self.sent_continue:
                            self.sent_continue = True
                            await self.write(CONTINUE)
                        remaining = parser.body_remaining
                        size = (BODY_RECEIVE_SIZE if remaining is None
                                else max(RECEIVE_SIZE, min(remaining, BODY_RECEIVE_SIZE)))
                        now = trio.current_time()
                        if deadline == _NEVER:
                            deadline = now + body_timeout
                        scope.deadline = min(now + body_timeout, deadline)
                        data = await self._recv(size)
                        if not data:
                            self.eof = True
                            raise Disconnected
                        deadline += len(data) / MIN_BODY_RATE
                        got = parser.body_from(data)
                except ProtocolError as exc:
                    self.protocol_error = exc
                    raise Disconnected from None
                except _STREAM_ERRORS:
                    self.broken = True
                    raise Disconnected from None
                chunk, done = got
                if body is None:
                    if len(chunk) > limit:
                        raise too_large(len(chunk), limit)
                    if done:
                        return chunk  # the whole body in one piece: no copy
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

    def _run(self, request: InferenceRequest, heavy: bool) -> Any:
        """``server.infer(request)``: its response when it ran here and now (Server.infer_now:
        nothing to watch), else an awaitable of it, awaited while the connection's watcher looks
        for a disconnect.

        A client that goes away cancels the connection's scope: the request is cancelled (in
        the server too) and the connection closes. That costs no task, cancel scope or deadline
        per request (see :meth:`_watch`). A ``heavy`` request (decoded in a worker thread) has a
        scope of its own instead, so that its awaitable returns None and the caller can free the
        request off the loop. A request that waits in a queue, when ``later_ok``, returns LATER
        instead: the task that delivers its response answers it (:meth:`_answered`). Raises
        (here or from the awaitable) what ``server.infer`` raises.
        """
        if heavy:
            return self._run_heavy(request)
        result = self.state.endpoint.server.infer_now(request, on_done=self._on_done)  # type: ignore[union-attr]
        if isinstance(result, InferenceResponse):  # it ran here and now: nothing to watch
            return result
        if self.later_ok and isinstance(result, Completion):  # queued: answered later, without this task
            self.pending = result
            return LATER
        return self._finish(result)

    async def _run_heavy(self, request: InferenceRequest) -> InferenceResponse | None:
        with trio.CancelScope() as scope:
            self.request_scope = scope
            try:
                result = self._run(request, False)
                return result if isinstance(result, InferenceResponse) else await result
            finally:
                self.request_scope = None
        return None

    async def _finish(self, result: Completion | Awaitable[InferenceResponse]) -> InferenceResponse:
        """The response of a request that did not run at once, watched (see :meth:`_run`)."""
        self._wait_starts()
        try:
            if isinstance(result, Completion):  # queued: answered through ``answer``
                response = await self.answer.wait(result)
                if response.error is not None:
                    raise response.error
                return response
            return await result
        finally:
            self._wait_ends()

    def _wait_starts(self) -> None:
        """The connection's task waits for an answer: the ticker may start the disconnect
        watcher if the wait runs long (see :meth:`_watch`)."""
        self.busy += 1
        state = self.state
        if state.ticker_park is not None:  # the ticker sleeps (no request was running): wake it
            state.ticker_park.cancel()
            state.ticker_park = None

    def _wait_ends(self) -> None:
        """The wait of :meth:`_wait_starts` is over: a watcher started meanwhile stops its
        socket wait at once (the socket is the task's again)."""
        self.busy += 1
        if self.watching is not None:
            self.watching.cancel()

    def _on_done(self, response: InferenceResponse) -> None:
        """A queued request's final response (Completion's callback, in the delivering task)."""
        if self.later is not None:
            self._answered(response)
        else:
            self.answer.done(response)

    def _answered(self, response: InferenceResponse) -> None:
        """Answer the queued request that ``_infer`` left for later, here in the task that
        delivers its response: encoded now and kept for the end of the round (or written now)
        when small; a large one (or one behind a write still in progress) is encoded and
        written by a task of the connection's, and the connection's next write waits for it.
        Never raises."""
        assert self.later is not None
        later, http_version = self.later
        self.later = self.pending = None
        try:
            tasks = self.tasks
            if self.broken or tasks is None:  # the connection is going away: nobody to answer
                return
            keep_alive = not self.state.shutting_down
            if self.stuck is None and later.small(response):
                status, headers, parts = later.reply(response)
                del response
                out, total = _framed(status, headers, parts, keep_alive, http_version)
                if keep_alive and total <= DEFER_BYTES and not self.eof:
                    # kept for the end of this round even when this task is alone in it: the
                    # task that delivers a batch answers its other requests in the same step
                    self.defer(out)
                else:
                    self._behind_deferred(out)
                    self.deferred = out
                    self.flush_deferred()
            else:
                previous = self.stuck
                stuck = self.stuck = trio.Event()
                tasks.start_soon(self._write_later, later, response, http_version, keep_alive, previous, stuck,
                                 name="trident.http.write_later")
            if self.at_head:
                self.idle = True
                if not keep_alive and self.stuck is None:  # shutting down: the connection closes now
                    self.stop()
        except Exception:  # a bug: this connection's answer is lost, not the deliverer's others
            log.exception("error answering a queued request")
            self.broken = True
            self.stop()
        finally:
            if self.settled is not None:
                self.settled.set()

    async def _write_later(self, later: Later, response: InferenceResponse, http_version: str, keep_alive: bool,
                           previous: trio.Event | None, stuck: trio.Event) -> None:
        """:meth:`_answered` for a large response: encoded (off the loop when large) and written
        after the write in progress (``previous``), then ``stuck`` is set."""
        try:
            if previous is not None:
                await previous.wait()
            status, headers, parts = await later.respond(response)
            del response
            out, _ = _framed(status, headers, parts, keep_alive, http_version)
            self._behind_deferred(out)
            await self._write_rest(out)
        finally:
            if self.stuck is stuck:
                self.stuck = None
            stuck.set()

    async def _settle(self) -> None:
        """Wait until the queued request left for later is answered; the disconnect watcher
        looks after the socket meanwhile (see :meth:`_watch`: EOF cancels the connection, and
        :meth:`serve` then cancels the request). Cancellation just stops the wait."""
        self.settled = trio.Event()
        self._wait_starts()
        try:
            if self.pending is not None:
                await self.settled.wait()
        finally:
            self.settled = None
            self._wait_ends()

    def watch(self) -> None:
        """Start watching the socket for a disconnect while the current request runs (the
        ticker's call, see :func:`_tick`)."""
        if self.park is not None:
            self.park.cancel()
        elif self.tasks is not None and not self.watcher and self.watching is None:
            self.tasks.start_soon(self._watch, name="trident.http.watch_disconnect")
            self.watcher = True  # started once

    async def _watch(self) -> None:
        """The connection's disconnect watcher: one task for all its requests, started the first
        time a request runs long (the ticker, :func:`_tick`, finds it running on two ticks).

        While that request runs it reads the socket: pipelined bytes go to the parser (up to
        MAX_READ_AHEAD), EOF or a reset cancels the connection's scope, and with it the request
        (a heavy request: its own scope). :meth:`_run` stops the read when the request ends;
        then it sleeps until the ticker wakes it for another long request. Runs until the
        connection closes.
        """
        fd = self.fd
        while True:
            if self.busy & 1:
                with trio.CancelScope() as watching:
                    self.watching = watching
                    try:
                        while not (self.eof or self.broken):
                            if self.parser.buffered >= MAX_READ_AHEAD:
                                await trio.sleep_forever()
                            await trio.lowlevel.wait_readable(fd)
                            if watching.cancel_called:
                                break
                            try:
                                data = os.read(fd, RECEIVE_SIZE)
                            except BlockingIOError:
                                continue
                            except OSError:
                                data = None
                            if not data:
                                if data is None:
                                    self.broken = True
                                else:
                                    self.eof = True
                                # the request and the connection (a heavy request: its own scope)
                                if self.request_scope is not None:
                                    self.request_scope.cancel()
                                else:
                                    self.stop()
                                break
                            self.parser.feed(data)
                    finally:
                        self.watching = None
            with trio.CancelScope() as park:
                self.park = park
                try:
                    await trio.sleep_forever()
                finally:
                    self.park = None

    # ---- everything else: the ASGI application ----------------------------------------------

    async def _cycle(self, head: RequestHead) -> bool:
        """Run the application for one request; True when the connection can take another."""
        raw_path, _, query = head.target.partition(b"?")
        if b"%" in raw_path:
            path = unquote_to_bytes(raw_path).decode("utf-8", "replace")
        else:
            path = raw_path.decode("utf-8", "replace")
        scope = {
            "type": "http", "asgi": _ASGI, "http_version": head.http_version, "method": head.method,
            "scheme": "http", "path": path, "raw_path": raw_path, "query_string": query, "root_path": "",
            "headers": head.headers, "client": self.client, "server": self.sockname,
        }
        cycle = _Cycle(self, head)
        try:
            await self.state.app(scope, cycle.receive, cycle.send)
        except Exception:
            log.exception("error in the ASGI application for %s %s", head.method, path)
        cycle.finish()
        framer = cycle.framer
        if self.eof or self.broken:
            return False
        if cycle.protocol_error is not None:  # the app was told http.disconnect; its sends were dropped
            self.linger = True
            await self.write(error_response(cycle.protocol_error.status, cycle.protocol_error.message))
            return False
        if not framer.started:
            self.linger = True
            await self.write(error_response(HTTPStatus.INTERNAL_SERVER_ERROR, "Internal Server Error"))
            return False
        if not framer.complete:
            return False
        if not self.parser.body_done:
            if not framer.keep_alive or not await self._drain_body():
                self.linger = True
                return False
        if not framer.keep_alive:
            return False
        self.parser.start_next()
        self.served += 1
        return not self.state.shutting_down

    async def _drain_body(self) -> bool:
        """Skip the rest of an unread request body (at most DRAIN_LIMIT bytes); True when done."""
        skipped = 0
        with trio.move_on_after(LINGER_SECONDS):
            while skipped <= DRAIN_LIMIT:
                try:
                    got = self.parser.next_body()
                except ProtocolError:
                    return False
                if got is None:
                    data = await self._recv(RECEIVE_SIZE)
                    if not data:
                        self.eof = True
                        return False
                    self.parser.feed(data)
                    continue
                skipped += len(got[0])
                if got[1]:
                    return True
        return False


class _Cycle:
    """One request and its response: the ASGI ``receive`` and ``send`` callables."""

    __slots__ = ("conn", "head", "framer", "body_done", "finished", "protocol_error", "sent_continue",
                 "body_deadline", "_watching", "_wait_scope", "_done")

    def __init__(self, conn: _Connection, head: RequestHead) -> None:
        self.conn = conn
        self.head = head
        self.framer = ResponseFramer(head)
        self.body_done = False
        self.finished = False  # response complete, or the connection is unusable
        self.protocol_error: ProtocolError | None = None
        self.sent_continue = False
        self.body_deadline = _NEVER  # set by the first body read: body_timeout, plus 1 s per MIN_BODY_RATE bytes
        self._watching = False
        self._wait_scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None

    def finish(self) -> None:
        """Wake every ``receive()`` waiting for a disconnect: the response is over."""
        self.finished = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        if self._done is not None:
            self._done.set()

    async def receive(self) -> Message:
        """The next ``http.request`` chunk; ``http.disconnect`` once the client or the response is gone."""
        if self.finished or self.conn.eof or self.conn.broken:
            return {"type": "http.disconnect"}
        if self.body_done:
            await self._wait_disconnect()
            return {"type": "http.disconnect"}
        conn = self.conn
        parser = conn.parser
        try:
            got = parser.next_body()
            while got is None:
                if self.head.expect_continue and not self.sent_continue:
                    self.sent_continue = True
                    await conn.write(CONTINUE)
                remaining = parser.body_remaining
                size = BODY_RECEIVE_SIZE if remaining is None else max(RECEIVE_SIZE, min(remaining, BODY_RECEIVE_SIZE))
                data = None
                now = trio.current_time()
                if self.body_deadline == _NEVER:
                    self.body_deadline = now + conn.state.body_timeout
                with trio.move_on_at(min(now + conn.state.body_timeout, self.body_deadline)):
                    data = await conn._recv(size)
                if data is None:  # a pause too long, or a body dripping slower than MIN_BODY_RATE: 408
                    raise ProtocolError(HTTPStatus.REQUEST_TIMEOUT, "request body timeout")
                if not data:
                    conn.eof = True
                    self.finish()
                    return {"type": "http.disconnect"}
                self.body_deadline += len(data) / MIN_BODY_RATE
                got = parser.body_from(data)
        except ProtocolError as exc:
            self.protocol_error = exc
            self.finish()
            return {"type": "http.disconnect"}
        except _STREAM_ERRORS:
            conn.broken = True
            self.finish()
            return {"type": "http.disconnect"}
        body, done = got
        if done:
            self.body_done = True
        return {"type": "http.request", "body": body, "more_body": not done}

    async def _wait_disconnect(self) -> None:
        """Read ahead (pipelined bytes go to the parser) until EOF or the end of the response."""
        if self._watching:  # another task already watches the socket
            await self._event().wait()
            return
        conn = self.conn
        self._watching = True
        try:
            if WATCH_DELAY:
                # most responses are sent within this: waking on an event costs less than
                # registering the socket and cancelling the wait
                with trio.move_on_after(WATCH_DELAY):
                    await self._event().wait()
            while not self.finished:
                if conn.parser.buffered >= MAX_READ_AHEAD:
                    await self._event().wait()
                    return
                with trio.CancelScope() as scope:
                    self._wait_scope = scope
                    data = await conn._recv(RECEIVE_SIZE)
                    self._wait_scope = None
                    if not data:
                        conn.eof = True
                        self.finish()
                        return
                    conn.parser.feed(data)
                self._wait_scope = None
        except _STREAM_ERRORS:
            conn.broken = True
            self.finish()
        finally:
            self._watching = False

    def _event(self) -> trio.Event:
        if self._done is None:
            self._done = trio.Event()
            if self.finished:
                self._done.set()
        return self._done

    async def send(self, message: Message) -> None:
        """Write ``http.response.start`` / ``http.response.body``; a no-op once the connection broke.

        Raises ResponseError (trident.protocol.http1) for a response that cannot be framed and
        RuntimeError for another message type.
        """
        kind = message["type"]
        framer = self.framer
        if self.protocol_error is not None:
            return
        if kind == "http.response.body":
            parts = framer.body(message.get("body", b""), message.get("more_body", False))
            if framer.complete:
                self.finish()  # a waiting receive() returns http.disconnect as the last bytes go out
            conn = self.conn
            if not conn.broken:
                await conn.writev(parts)
                if conn.broken:
                    self.finish()
        elif kind == "http.response.start":
            conn = self.conn
            if conn.state.shutting_down:
                framer.keep_alive = False
            elif not conn.parser.body_done:
                remaining = conn.parser.body_remaining
                if ((self.head.expect_continue and not self.sent_continue) or remaining is None
                        or remaining - conn.parser.buffered > DRAIN_LIMIT):
                    framer.keep_alive = False  # the unread body is not worth reading
            framer.start(message["status"], message.get("headers", ()))
        else:
            raise RuntimeError(f"unexpected ASGI message type {kind!r}")


def _consume(parts: list[Any], n: int) -> None:
    """Drop the first ``n`` bytes of ``parts`` (bytes-like buffers), in place."""
    done = 0
    while done < len(parts) and n >= len(parts[done]):
        n -= len(parts[done])
        done += 1
    del parts[:done]
    if n:
        parts[0] = memoryview(parts[0]).cast("B")[n:]


def _infer_target(target: bytes) -> tuple[str, str] | None:
    """``(model, version)`` when the request target is an infer path, else None (cached)."""
    hit = _TARGETS.get(target)
    if hit is not None:
        return hit
    raw_path = target.partition(b"?")[0]
    if not raw_path.endswith(b"/infer"):
        return None
    if b"%" in raw_path:
        path = unquote_to_bytes(raw_path).decode("utf-8", "replace")
    else:
        path = raw_path.decode("utf-8", "replace")
    match = _INFER_PATH.fullmatch(path)
    if match is None:
        return None
    hit = match.group(1), match.group(2) or ""
    if len(_TARGETS) < 1024:
        _TARGETS[target] = hit
    return hit


_TARGETS: dict[bytes, tuple[str, str]] = {}  # infer targets seen (bounded)


async def _accept_loop(listener: TcpListener, state: _State, nursery: trio.Nursery) -> None:
    """Accept connections, each holding one of ``state.slots`` (at the limit, accepting waits)."""

    def start(stream: trio.SocketStream) -> None:
        conn = _Connection(state, stream)
        state.connections.add(conn)
        nursery.start_soon(conn.serve, name="trident.http.connection")

    def at_limit() -> None:
        log.warning("%d HTTP connections are open (--http-max-connections): accepting pauses until one "
                    "closes", state.slots.max_value)

    await serve_listener(listener, state.slots, start, at_limit=at_limit)


async def _tick(state: _State) -> None:
    """Every ``WATCH_DELAY`` while requests run, start the disconnect watch of each connection
    whose request has been running since the previous tick (so for ``WATCH_DELAY`` to twice
    that): one task for the server, nothing per request. Sleeps while no request runs (the next
    request wakes it). Runs until cancelled.
    """
    while True:
        running = False
        for conn in state.connections:
            busy = conn.busy
            if busy & 1:
                running = True
                if conn.seen == busy:
                    conn.watch()
            conn.seen = busy
        if running:
            await trio.sleep(WATCH_DELAY)
            continue
        with trio.CancelScope() as park:
            state.ticker_park = park
            await trio.sleep_forever()
        state.ticker_park = None
        await trio.sleep(WATCH_DELAY)


async def _reap_idle(state: _State) -> None:
    """Close connections idle (waiting for a request) for a whole keep-alive period."""
    while True:
        await trio.sleep(state.keep_alive_timeout)
        for conn in list(state.connections):
            if conn.idle and conn.reaper_mark == conn.served:
                conn.stop()
            conn.reaper_mark = conn.served


async def serve_asgi(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    graceful_timeout: float = 5.0,
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT,
    header_timeout: float = HEADER_TIMEOUT,
    body_timeout: float = BODY_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    max_head_size: int = DEFAULT_MAX_HEAD_SIZE,
    backlog: int = 1024,
    reuse_port: bool = False,
    infer_endpoint: InferEndpoint | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` over HTTP/1.1 on ``host:port`` (``SO_REUSEPORT`` with ``reuse_port``).

    Start it with ``nursery.start``: it reports the bound port (the real one when ``port`` is 0).
    Without ``shutdown_trigger`` it serves until cancelled. When ``shutdown_trigger`` returns,
    it stops accepting, closes idle connections, waits up to ``graceful_timeout`` seconds for
    in-flight requests (their responses carry ``connection: close``), cancels what is left, and
    returns. ``header_timeout``, ``body_timeout`` and ``max_connections`` bound what one client
    can hold (see the module docstring). With ``infer_endpoint`` (the one ``app`` uses),
    ``POST .../infer`` is answered by it directly, without ASGI.

    Raises OSError when the address cannot be bound. Cancellation closes the listener and every
    connection and cancels the application calls in flight.
    """
    listeners = await open_tcp_listeners(port, host=host, backlog=backlog, reuse_port=reuse_port)
    state = _State(app, max_head_size, keep_alive_timeout, header_timeout, body_timeout, max_connections,
                   infer_endpoint)
    state.round = rounds.current()
    stop_flushing = state.round.at_end(state.flusher.end_of_round)
    try:
        async with trio.open_nursery() as watching:
            if infer_endpoint is not None:
                watching.start_soon(_tick, state, name="trident.http.watch_requests")
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(_accept_loop, listener, state, connections)
                    accepting.start_soon(_reap_idle, state)
                    task_status.started(listeners[0].port())
                    if shutdown_trigger is None:
                        await trio.sleep_forever()
                    else:
                        await shutdown_trigger()
                    accepting.cancel_scope.cancel()
                for listener in listeners:
                    listener.close()
                state.shutting_down = True
                state.close_idle()
                connections.cancel_scope.deadline = trio.current_time() + graceful_timeout
            watching.cancel_scope.cancel()
    finally:
        stop_flushing()
        state.flusher.flush()
        for listener in listeners:
            listener.close()


async def serve_http_fast(
    server: Server,
    *,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the KServe v2 HTTP API of ``server`` on ``host:port`` (same contract as ``serve_http``).

    It reports the bound port through ``task_status``. When ``shutdown_trigger`` returns, it
    stops accepting and finishes in-flight requests (up to the server's ``exit_timeout_secs``).
    The server's ``http_header_timeout_secs``, ``http_body_timeout_secs`` and
    ``http_max_connections`` options set the limits of :func:`serve_asgi`, ``reuse_http_port``
    its ``SO_REUSEPORT``.

    Raises OSError when the address cannot be bound. Cancellation closes the listener and
    cancels every in-flight request (each is cancelled in the server too).
    """
    options = server.options
    endpoint = InferEndpoint(server)
    await serve_asgi(make_app(server, endpoint), host=host, port=port, shutdown_trigger=shutdown_trigger,
                     graceful_timeout=options.exit_timeout_secs, task_status=task_status, infer_endpoint=endpoint,
                     header_timeout=options.http_header_timeout_secs, body_timeout=options.http_body_timeout_secs,
                     max_connections=options.http_max_connections, reuse_port=options.reuse_http_port)
