"""The timers of one gRPC connection: :class:`Watchdog`, one task per connection.

* the handshake deadline: the client's preface and first SETTINGS (after TLS, counted from the
  accept) within ``handshake_timeout``, else the connection closes;
* the idle timeout: GOAWAY NO_ERROR after no call for ``idle_timeout``;
* keepalive: a PING after ``keepalive_time`` without inbound bytes (while calls are open, or
  always with ``keepalive_permit_without_calls``), and the connection closes when no ACK
  comes within ``keepalive_timeout``; at most ``max_pings_without_data`` of them between two
  sends of data (gRPC core's policy);
* the maximum connection age (gRPC core's ``GRPC_ARG_MAX_CONNECTION_AGE_MS`` / ``_GRACE_MS``):
  GOAWAY NO_ERROR "max_age" once the connection is ``max_connection_age`` old, +-10% jitter, so
  that the client reconnects, maybe elsewhere; the calls running then may finish for
  ``max_connection_age_grace``, after which each ends with UNAVAILABLE and the connection
  closes;
* a request message started must arrive whole within ``message_timeout`` (else its call fails
  with DEADLINE_EXCEEDED);
* a response that waits for a flow-control window for ``send_timeout`` (the peer holds the
  stream's or the connection's window at zero): its stream is reset with RST_STREAM CANCEL (the
  call ends as if the client had cancelled it). gRPC core has no such timer (a stalled stream
  waits for its deadline, keepalive or the connection's max age); CANCEL is the code core
  sends when it cancels a stream that cannot be answered with trailers. A peer that takes no
  bytes at all is the socket's send timeout (:mod:`trident.sockets_io`: the connection closes).

The task sleeps until the earliest of them; the connection moves that time earlier with
:meth:`Watchdog.arm` (a message started, the last call ended).
"""

from __future__ import annotations

import logging
import math
import random
from typing import Protocol

import trio

from trident.errors import GRPC_DEADLINE_EXCEEDED, GRPC_UNAVAILABLE
from trident.grpc.call import Call
from trident.grpc.config import TransportConfig
from trident.grpc.outbound import Outbound
from trident.protocol import http2
from trident.protocol.grpc_framing import FramingError
from trident.protocol.h2_guard import FrameGuard
from trident.sockets_io import BACKLOG

log = logging.getLogger("trident.grpc")

KEEPALIVE_PING = b"trident\x00"
MAX_AGE_JITTER = 0.1  # a connection's max age is max_connection_age x (1 +- this), as gRPC core's
_MAX_AGE_DEBUG = b"max_age"  # the GOAWAY's debug data (gRPC core's)


class Watched(Protocol):
    """What the watchdog uses of its connection (trident.grpc.transport.Connection)."""

    config: TransportConfig
    guard: FrameGuard
    out: Outbound
    calls: dict[int, Call]
    draining: bool
    last_received: float  # when bytes last came in (trio time)
    idle_since: float  # when the last call ended

    def start_drain(self, debug: bytes = b"") -> None:
        """GOAWAY NO_ERROR, refuse new streams, close once the calls finish."""

    def close(self, why: str) -> None:
        """End the connection now: the reader stops, the calls are cancelled."""


class Watchdog:
    """The timers of one connection (see the module docstring)."""

    def __init__(self, conn: Watched, now: float, handshake_deadline: float | None) -> None:
        self.conn = conn
        config = conn.config
        self.handshake_deadline = handshake_deadline
        #: when this connection reaches its max age (GOAWAY "max_age"), and then when its grace
        #: period ends (inf: not set, or not yet started)
        self._age_deadline = (now + config.max_connection_age * random.uniform(1 - MAX_AGE_JITTER, 1 + MAX_AGE_JITTER)
                              if config.max_connection_age else math.inf)
        self._grace_deadline = math.inf
        self._sends_at_keepalive = 0  # the connection's sends as of the last keepalive PING
        self._keepalives_without_data = 0
        self._ping_sent_at: float | None = None  # our keepalive PING awaiting its ACK
        self._timer: trio.CancelScope | None = None  # the task's sleep

    def arm(self, deadline: float) -> None:
        """Wake the watchdog by ``deadline`` at the latest."""
        timer = self._timer
        if timer is not None and deadline < timer.deadline:
            timer.deadline = deadline

    def ping_acked(self, data: bytes) -> None:
        """The client acknowledged a PING with ``data``."""
        if data == KEEPALIVE_PING:
            self._ping_sent_at = None

    async def serve(self) -> None:
        """Act on the timers as they come due. Runs until cancelled (with the connection)."""
        if self.handshake_deadline is None and self.conn.config.handshake_timeout:
            self.handshake_deadline = trio.current_time() + self.conn.config.handshake_timeout
        while True:
            wake = await self._check(trio.current_time())
            with trio.CancelScope(deadline=wake) as self._timer:
                await trio.sleep_forever()
            self._timer = None

    async def _check(self, now: float) -> float:
        """Act on the timers that are due; returns when to look again."""
        conn = self.conn
        config = conn.config
        wake = math.inf
        deadline = self.handshake_deadline
        if deadline is not None:
            if conn.guard.handshake_done:
                self.handshake_deadline = None
            elif now >= deadline:
                conn.close("no HTTP/2 preface and SETTINGS within the handshake timeout")
                return math.inf
            else:
                wake = deadline
        if now >= self._age_deadline:
            self._age_deadline = math.inf
            log.debug("gRPC connection reached its max age (%g ms): GOAWAY", config.max_connection_age * 1000)
            conn.start_drain(_MAX_AGE_DEBUG)  # the client reconnects; the calls running may finish
            if config.max_connection_age_grace:
                self._grace_deadline = now + config.max_connection_age_grace
        wake = min(wake, self._age_deadline)
        if now >= self._grace_deadline:
            self._end_grace()
            return math.inf
        wake = min(wake, self._grace_deadline)
        if config.idle_timeout and not conn.calls and not conn.draining:
            deadline = conn.idle_since + config.idle_timeout
            if now >= deadline:
                log.debug("gRPC connection idle for %.1f s: GOAWAY", config.idle_timeout)
                conn.start_drain()
            else:
                wake = min(wake, deadline)
        if config.keepalive_time:
            wake = min(wake, await self._keepalive(now))
        if config.send_timeout and conn.out.stalled:
            wake = min(wake, self._reset_stalled(now))
        if config.message_timeout:
            for call in list(conn.calls.values()):
                deadline = call.partial_since + config.message_timeout
                if now >= deadline:
                    call._fail(FramingError(
                        GRPC_DEADLINE_EXCEEDED,
                        f"request message not received whole within {config.message_timeout:g} s"))
                else:
                    wake = min(wake, deadline)
        return wake

    def _reset_stalled(self, now: float) -> float:
        """Reset the streams stalled at a zero window for the send timeout (RST_STREAM CANCEL;
        their calls end as reset by the client); returns when the next one is due."""
        conn = self.conn
        out = conn.out
        timeout = conn.config.send_timeout
        wake = math.inf
        reset = False
        for stream_id, since in list(out.stalled.items()):
            deadline = since + timeout
            if now < deadline:
                wake = min(wake, deadline)
                continue
            del out.stalled[stream_id]
            log.debug("gRPC stream %d held at a zero window for %g s: RST_STREAM CANCEL", stream_id, timeout)
            BACKLOG.count_timeout("grpc", "stream")
            out.reset_quietly(stream_id, http2.CANCEL)
            reset = True
            call = conn.calls.get(stream_id)
            if call is not None:
                call._on_reset()
        if reset:
            out.window_opened()  # the stalled sends look again, and find their stream gone
            out.kick()
        return wake

    def _end_grace(self) -> None:
        """The max-age grace period is over: each call still running ends with UNAVAILABLE (its
        trailers are queued, and written as the connection closes, even behind a send that
        waits for a window; the call's task, cancelled with the connection, sends nothing more)
        and the connection closes, as gRPC core closes the transport then."""
        conn = self.conn
        config = conn.config
        out = conn.out
        self._grace_deadline = math.inf
        message = (f"connection closed by the server: max connection age "
                   f"({config.max_connection_age * 1000:g} ms) and its grace period "
                   f"({config.max_connection_age_grace * 1000:g} ms) are over")
        for call in list(conn.calls.values()):
            call.reset = True
            try:
                out.engine.send_headers(call.stream_id, call._trailers(GRPC_UNAVAILABLE, message), end_stream=True)
            except http2.StreamClosedError:
                continue
            if not call._ended:
                out.reset_quietly(call.stream_id)
        conn.close("max connection age grace period over")

    async def _keepalive(self, now: float) -> float:
        conn = self.conn
        config = conn.config
        sent = self._ping_sent_at
        if sent is not None:
            if conn.last_received > sent:
                self._ping_sent_at = None  # the peer is alive: any bytes will do
            elif now >= sent + config.keepalive_timeout:
                conn.close("keepalive PING not acknowledged")
                return math.inf
            else:
                return sent + config.keepalive_timeout
        due = conn.last_received + config.keepalive_time
        if now < due:
            return due
        if not (conn.calls or config.keepalive_permit_without_calls):
            return now + config.keepalive_time
        out = conn.out
        if out.sends != self._sends_at_keepalive:
            self._sends_at_keepalive = out.sends
            self._keepalives_without_data = 0
        if config.max_pings_without_data and self._keepalives_without_data >= config.max_pings_without_data:
            return now + config.keepalive_time  # gRPC core sends no more until data goes out
        self._keepalives_without_data += 1
        self._ping_sent_at = now
        out.engine.ping(KEEPALIVE_PING)
        await out.flush()
        return now + config.keepalive_timeout
