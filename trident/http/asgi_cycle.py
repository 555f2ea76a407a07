"""The ASGI application's side of trident's HTTP/1.1 server: one request, one :class:`Cycle`.

Every request but the fast path's /infer (:mod:`trident.http.fast_infer`) runs the ASGI 3
application (``http`` scope) in the connection's task:

* ``receive()`` returns the body as ``http.request`` messages (no larger than 256 KiB each, so
  a size limit can refuse a large body early) and sends ``100 Continue`` the first time it
  needs body bytes the client holds back; once the body is read, it returns ``http.disconnect``
  when the response is complete or the client goes away (it watches the socket from
  ``WATCH_DELAY`` after the call: most responses are done before, and waking on an event is
  cheaper than a socket wait that must be cancelled);
* a pause longer than ``body_timeout`` while the application waits for body bytes fails the
  request, and so does a body that drips in (the whole body must arrive within
  ``body_timeout`` plus one second per ``MIN_BODY_RATE`` bytes received): the application gets
  ``http.disconnect``, the client ``408`` and the connection closes;
* ``send()`` writes the head with the first body message in one write; a streamed body without
  ``content-length`` uses chunked transfer coding;
* an application that raises, or ends without a response, answers ``500``.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING
from urllib.parse import unquote_to_bytes

import trio

from trident.http.asgi import Message
from trident.http.limits import (
    BODY_RECEIVE_SIZE,
    DRAIN_LIMIT,
    MAX_READ_AHEAD,
    MIN_BODY_RATE,
    RECEIVE_SIZE,
    WATCH_DELAY,
)
from trident.protocol.http1 import CONTINUE, HTTPStatus, ProtocolError, RequestHead, ResponseFramer

if TYPE_CHECKING:
    from trident.http.state import ConnectionState

log = logging.getLogger("trident.http")

_ASGI = {"version": "3.0", "spec_version": "2.3"}
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
_NEVER = math.inf


class Cycle:
    """One request and its response, for the ASGI application: its ``receive`` and ``send``
    callables, and :meth:`serve`, which runs the application for it."""

    __slots__ = ("conn", "head", "framer", "body_done", "finished", "protocol_error", "sent_continue",
                 "body_deadline", "_watching", "_wait_scope", "_done")

    def __init__(self, conn: ConnectionState, head: RequestHead) -> None:
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

    async def serve(self) -> bool:
        """Run the application for this request; True when the connection can take another."""
        conn = self.conn
        head = self.head
        raw_path, _, query = head.target.partition(b"?")
        if b"%" in raw_path:
            path = unquote_to_bytes(raw_path).decode("utf-8", "replace")
        else:
            path = raw_path.decode("utf-8", "replace")
        scope = {
            "type": "http", "asgi": _ASGI, "http_version": head.http_version, "method": head.method,
            "scheme": "http", "path": path, "raw_path": raw_path, "query_string": query, "root_path": "",
            "headers": head.headers, "client": conn.client, "server": conn.sockname,
        }
        try:
            await conn.state.app(scope, self.receive, self.send)
        except Exception:
            log.exception("error in the ASGI application for %s %s", head.method, path)
        self.finish()
        framer = self.framer
        if conn.eof or conn.io.broken:
            return False
        if self.protocol_error is not None:  # the app was told http.disconnect; its sends were dropped
            await conn.refuse(self.protocol_error)
            return False
        if not framer.started:
            await conn.refuse(ProtocolError(HTTPStatus.INTERNAL_SERVER_ERROR, "Internal Server Error"))
            return False
        if not framer.complete:
            return False
        return await conn.next_request(framer.keep_alive)

    def finish(self) -> None:
        """Wake every ``receive()`` waiting for a disconnect: the response is over."""
        self.finished = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        if self._done is not None:
            self._done.set()

    async def receive(self) -> Message:
        """The next ``http.request`` chunk; ``http.disconnect`` once the client or the response is gone."""
        if self.finished or self.conn.eof or self.conn.io.broken:
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
                    await conn.io.write([CONTINUE])
                remaining = parser.body_remaining
                size = BODY_RECEIVE_SIZE if remaining is None else max(RECEIVE_SIZE, min(remaining, BODY_RECEIVE_SIZE))
                data = None
                now = trio.current_time()
                if self.body_deadline == _NEVER:
                    self.body_deadline = now + conn.state.body_timeout
                with trio.move_on_at(min(now + conn.state.body_timeout, self.body_deadline)):
                    data = await conn.io.receive(size)
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
            conn.io.broken = True
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
                    data = await conn.io.receive(RECEIVE_SIZE)
                    self._wait_scope = None
                    if not data:
                        conn.eof = True
                        self.finish()
                        return
                    conn.parser.feed(data)
                self._wait_scope = None
        except _STREAM_ERRORS:
            conn.io.broken = True
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
            io = self.conn.io
            if not io.broken:
                await io.write(parts)
                if io.broken:
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
