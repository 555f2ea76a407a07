"""One HTTP/1.1 connection of trident's server: its :class:`Connection` and request loop.

A connection's task reads request heads (parsing is sans-IO: :mod:`trident.protocol.http1`),
hands each request to its room and moves to the next one, in order (pipelined bytes wait in the
parser); the request runs in the connection's task, so it costs no task switch of its own:

* ``POST .../infer`` on a server with the fast path: :class:`trident.http.fast_infer.FastInfer`;
* everything else: the ASGI application (:class:`trident.http.asgi_cycle.Cycle`).

The socket is the connection's :class:`trident.sockets_io.SocketIO` (non-blocking reads and
writes, one writer at a time); a connection serving requests back to back without waiting for
its socket yields every ``YIELD_EVERY`` requests (and ``YIELD_BYTES`` bytes), so a busy
connection does not hold the loop. Its limits:

* malformed requests get ``400`` (``431`` for a head over the size limit) and the connection
  closes; a connection closed with request bytes unread is shut down for writing and drained
  first (lingering close), so the client reads the answer instead of a reset;
* a request head must arrive whole within ``header_timeout`` of its first byte (of the accept,
  for a connection's first request): a partial head then gets ``408`` and the connection
  closes, a connection that sent nothing is closed without an answer;
* an unread request body up to ``DRAIN_LIMIT`` is skipped to keep the connection open;
* a client that takes none of a response's bytes for ``send_timeout`` (the socket's send
  timeout, :mod:`trident.sockets_io`) loses its connection, closed with a reset. What it pins
  meanwhile is bounded: the response being written (one at a time: the next request is not
  read before it is out), ``MAX_READ_AHEAD`` pipelined bytes and the kernel's socket buffers.
"""

from __future__ import annotations

import logging
import math
import re
from urllib.parse import unquote_to_bytes

import trio

from trident.http.asgi_cycle import Cycle
from trident.http.fast_infer import FastInfer
from trident.http.limits import (
    BODY_RECEIVE_SIZE,
    DRAIN_LIMIT,
    LINGER_SECONDS,
    LINGER_TOTAL_SECONDS,
    RECEIVE_SIZE,
    YIELD_BYTES,
    YIELD_EVERY,
)
from trident.http.state import ServerState
from trident.http.watch import DisconnectWatch
from trident.protocol.http1 import HTTPStatus, ProtocolError, RequestParser, error_response
from trident.sockets_io import SocketIO

log = logging.getLogger("trident.http")

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
_NEVER = math.inf
_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")


class Connection:
    """One connection: its socket, parser and request loop (:meth:`serve`), and the rooms it
    hands requests to (see the module docstring)."""

    __slots__ = ("state", "io", "parser", "cancel_scope", "stopped", "idle", "at_head", "served", "reaper_mark",
                 "eof", "linger", "head_deadline", "streak", "client", "sockname", "watch", "infer")

    def __init__(self, state: ServerState, stream: trio.SocketStream) -> None:
        self.state = state
        self.io = SocketIO(stream, yield_bytes=YIELD_BYTES, flusher=state.flusher, on_broken=self.stop,
                           send_timeout=state.send_timeout, protocol="http")
        self.parser = RequestParser(state.max_head_size)
        self.cancel_scope = trio.CancelScope()  # cancelled by stop() only (it has no deadline)
        self.stopped = False  # stop() was called: what cancel_scope.cancel_called says, without a clock read
        self.idle = False  # waiting for a request head: shutdown and the reaper may close it
        self.at_head = False  # the task waits for the next request's head
        self.served = 0
        self.reaper_mark = -1
        self.eof = False  # the client closed its side
        self.linger = False  # close with request bytes unread: drain before closing
        self.head_deadline = trio.current_time() + state.header_timeout  # first request: from the accept
        self.streak = 0  # requests served since the task last yielded (fairness: see YIELD_EVERY)
        self.watch = DisconnectWatch(self)
        #: the fast path's /infer (None: every request goes to the ASGI application)
        self.infer = FastInfer(self, self.watch, state.endpoint) if state.endpoint is not None else None
        try:
            self.client: tuple[str, int] | None = tuple(stream.socket.getpeername()[:2])  # type: ignore[assignment]
            self.sockname: tuple[str, int] | None = tuple(stream.socket.getsockname()[:2])  # type: ignore[assignment]
        except OSError:
            self.client = self.sockname = None

    async def serve(self) -> None:
        """Serve the connection's requests until it closes; the slot it holds is released at the end."""
        state = self.state
        io = self.io
        infer = self.infer
        state.watches.add(self.watch)
        try:
            with self.cancel_scope:
                try:
                    async with trio.open_nursery() as nursery:
                        io.tasks = nursery
                        await self._serve()
                        if infer is not None and infer.pending is not None and not (self.eof or io.broken):
                            await infer.settle()  # shutting down: the queued request is answered first
                        if io.deferred is not None or io.busy is not None:
                            await io.write([])  # what waits for the end of the round goes out before the close
                        nursery.cancel_scope.cancel()  # the watcher
                finally:
                    io.tasks = None
                    if infer is not None:  # the client went away (or the server gave up)
                        infer.cancel()
        finally:
            state.connections.discard(self)
            state.watches.discard(self.watch)
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
        io = self.io
        infer = self.infer
        try:
            while True:
                head = parser.next_head()
                if head is None:
                    if state.shutting_down:
                        return
                    self.idle = infer is None or infer.pending is None  # else its answer marks it idle
                    self.at_head = True
                    if self.head_deadline == _NEVER:
                        if parser.buffered:  # the next head has started: the clock runs
                            self.head_deadline = trio.current_time() + state.header_timeout
                            continue
                        data = await io.receive(RECEIVE_SIZE)
                    else:
                        data = None
                        with trio.move_on_at(self.head_deadline):
                            data = await io.receive(RECEIVE_SIZE)
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
                if infer is not None and infer.pending is not None:
                    await infer.settle()  # a pipelined request: its answer goes out after the queued one's
                self.head_deadline = _NEVER
                if io.yielded:
                    io.yielded = False
                    self.streak = 0
                else:  # requests served back to back: let other connections run now and then
                    self.streak += 1
                    if self.streak >= YIELD_EVERY:
                        self.streak = 0
                        await trio.lowlevel.checkpoint()
                target = None
                if infer is not None and head.method == "POST":
                    target = infer_target(head.target)
                if target is not None:
                    assert infer is not None
                    if not await infer.answer(head, *target):
                        return
                elif not await Cycle(self, head).serve():
                    return
        except ProtocolError as exc:
            await self.refuse(exc)
        except _STREAM_ERRORS:
            io.broken = True

    # ---- between requests (the rooms' calls) --------------------------------------------------

    def request_done(self) -> bool:
        """The request's answer is out (or left for later): the parser moves to the next one;
        True when the connection may take it."""
        self.parser.start_next()
        self.served += 1
        return not self.state.shutting_down

    async def next_request(self, keep_alive: bool) -> bool:
        """After an answer was written: drain what is left of the request body (at most
        DRAIN_LIMIT bytes), then :meth:`request_done`; True when the connection can take another
        request."""
        if self.eof or self.io.broken:
            return False
        if not self.parser.body_done:
            if not keep_alive or not await self._drain_body():
                self.linger = True
                return False
        if not keep_alive:
            return False
        return self.request_done()

    async def refuse(self, error: ProtocolError) -> None:
        """Answer ``error``'s status; the connection then closes, lingering (the client reads
        the answer before the close)."""
        self.linger = True
        await self.io.write([error_response(error.status, error.message)])

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
                    data = await self.io.receive(RECEIVE_SIZE)
                    if not data:
                        self.eof = True
                        return False
                    self.parser.feed(data)
                    continue
                skipped += len(got[0])
                if got[1]:
                    return True
        return False

    async def _close(self) -> None:
        io = self.io
        if io.deferred is not None:  # the connection was cancelled before its last flush
            parts, io.deferred = io.deferred, None
            io.write_now(parts)
        stream = io.stream
        assert isinstance(stream, trio.SocketStream)
        try:
            if (self.linger or self.parser.buffered) and not (self.eof or io.broken):
                # read and drop what the client still sends until it closes (or pauses)
                with trio.move_on_after(LINGER_TOTAL_SECONDS):
                    await stream.send_eof()
                    data: bytes | bytearray = b"-"
                    while data:
                        data = b""
                        with trio.move_on_after(LINGER_SECONDS):
                            data = await io.receive(BODY_RECEIVE_SIZE)
        except (*_STREAM_ERRORS, OSError):
            pass
        finally:
            stream.socket.close()


def infer_target(target: bytes) -> tuple[str, str] | None:
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
