"""The frames one gRPC connection sends, and their way onto its socket: :class:`Outbound`.

Everything a connection sends goes through the HTTP/2 engine's buffer (HEADERS, DATA,
trailers, RST_STREAM, GOAWAY, PING) and from there onto the socket, in order, one write at a
time (:class:`trident.sockets_io.SocketIO`):

* DATA goes out as the peer's flow-control windows allow; a send that finds a window closed
  flushes what is queued and waits for a WINDOW_UPDATE (a peer that never reads blocks only its
  own calls); a message of ``_WRITEV_SIZE`` bytes or more is written from its parts with
  ``writev`` behind what the engine holds (trident's engine frames views: nothing is copied);
* a small answer made in the read loop (:meth:`Outbound.send_now`) waits in the engine's buffer
  and goes out with the others of the same read (:meth:`~Outbound.flush`); one made by another
  task (a call answered later) is written at once, the rest by a task of the connection's
  (:meth:`~Outbound.kick`);
* a write that finds the socket broken marks the connection broken (``on_broken``: every call
  is cancelled, the reader stops);
* a send that waits for a window records when its stream stalled (``stalled``, kept until the
  window opens for it) and wakes the connection's watchdog by the send timeout (``on_stall``),
  which resets a stream stalled that long; the message bytes such sends hold are counted in
  :data:`trident.sockets_io.BACKLOG`. What a stalled stream pins is bounded by its one
  message in progress (``max_message_size``; a bidirectional stream's other answers wait for
  the call's send lock, bounded by its handler's requests in flight) and the socket's write
  by the frames of one flush.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from trident.errors import GRPC_UNIMPLEMENTED
from trident.grpc.config import TransportConfig
from trident.protocol import grpc_framing as framing
from trident.protocol import http2
from trident.protocol.grpc_framing import FramingError
from trident.protocol.h2_guard import FrameGuard
from trident.sockets_io import BACKLOG, SocketIO

Parts = Sequence[Any]  # buffers: bytes, bytearray, memoryview or 1-D uint8 numpy arrays
Headers = Sequence[tuple[bytes, bytes]]

WRITEV_SIZE = 64 * 1024  # a response message from this size is written from its parts (no copy)

# constant header blocks, as tuples: the HTTP/2 engine's encode cache keys on them
RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"),
                    (b"grpc-accept-encoding", framing.ACCEPT_ENCODING.encode()))
RESPONSE_HEADERS_GZIP = (*RESPONSE_HEADERS, (b"grpc-encoding", b"gzip"))
RESPONSE_HEADERS_DEFLATE = (*RESPONSE_HEADERS, (b"grpc-encoding", b"deflate"))


class StreamGone(Exception):
    """The client reset the stream or the connection closed under a send."""


class OutStream(Protocol):
    """A stream something is sent on (a :class:`~trident.grpc.call.Call`)."""

    stream_id: int
    reset: bool  # the client reset it (or the connection ended it): nothing more goes out


class Outbound:
    """One connection's outgoing frames (see the module docstring). ``sends`` counts the
    HEADERS and DATA sends so far (the ping policies reset on them); ``broken``: nothing more
    is sent."""

    def __init__(self, engine: Any, io: SocketIO, guard: FrameGuard, config: TransportConfig,
                 on_broken: Callable[[], None]) -> None:
        self.engine = engine
        self.io = io
        self.guard = guard
        self.config = config
        self.on_broken = on_broken
        self.sends = 0
        self.broken = False
        self._window = trio.Event()  # set (and renewed) whenever the peer widens a window
        #: stream id -> when its send found the window closed (until the window opens for it)
        self.stalled: dict[int, float] = {}
        #: wakes the connection's watchdog by the given time (a stream stalled: its send timeout)
        self.on_stall: Callable[[float], None] | None = None
        self._flush_queued = False  # a task of kick's is to write what the engine holds

    # ---- frames --------------------------------------------------------------------------------

    def ack(self, size: int, stream_id: int) -> None:
        """Give ``size`` received flow-controlled bytes of ``stream_id`` back to the peer."""
        if size:
            self.engine.acknowledge_received_data(size, stream_id)

    def headers(self, stream_id: int, headers: Headers) -> None:
        """Queue a stream's response headers. Raises StreamGone."""
        try:
            self.engine.send_headers(stream_id, headers)
        except http2.StreamClosedError:
            raise StreamGone() from None
        self.sends += 1

    def trailers(self, stream_id: int, trailers: Headers, ended: bool) -> bool:
        """Queue a stream's trailers (ending it; RST_STREAM NO_ERROR after them when the client
        has not ``ended`` its side); False when the stream was closed under us."""
        try:
            self.engine.send_headers(stream_id, trailers, end_stream=True)
        except http2.StreamClosedError:
            return False
        self.sends += 1
        self.guard.call_completed()
        if not ended:
            self.reset_quietly(stream_id)
        return True

    def refuse(self, stream_id: int, ended: bool, status: int, message: str, http_status: bytes = b"200") -> None:
        """Answer a stream with a trailers-only response (no handler runs)."""
        headers = [(b":status", http_status), (b"content-type", b"application/grpc"),
                   (b"grpc-status", str(status).encode()),
                   (b"grpc-message", framing.encode_grpc_message(message).encode("ascii"))]
        if status == GRPC_UNIMPLEMENTED:
            headers.append((b"grpc-accept-encoding", framing.ACCEPT_ENCODING.encode()))
        self.engine.send_headers(stream_id, headers, end_stream=True)
        self.sends += 1
        if not ended:
            self.reset_quietly(stream_id)

    def reset_quietly(self, stream_id: int, error_code: int = http2.NO_ERROR) -> None:
        """RST_STREAM unless the stream is already closed: NO_ERROR after our trailers when the
        client has not finished its side; REFUSED_STREAM for a stream refused at open, which the
        client may have reset in the same chunk as its HEADERS (the engine read both first)."""
        try:
            self.engine.reset_stream(stream_id, error_code)
        except http2.StreamClosedError:
            pass

    def window_opened(self) -> None:
        """The peer widened a window (WINDOW_UPDATE, new SETTINGS): sends waiting for one retry."""
        self._window.set()
        self._window = trio.Event()

    # ---- messages ------------------------------------------------------------------------------

    def send_now(self, stream_id: int, parts: Parts, size: int) -> bool:
        """Queue a small message with the response headers in the engine at once, when the
        windows take it whole; False (nothing queued) otherwise (the caller sends it the usual
        way). True also when the stream is gone meanwhile (nothing more goes out on it)."""
        if size >= WRITEV_SIZE:
            return False
        engine = self.engine
        framed = size + framing.PREFIX_SIZE
        try:
            if framed > engine.local_flow_control_window(stream_id):
                return False
            framing.check_size(size, self.config.max_message_size, "sent")
        except (http2.StreamClosedError, FramingError):
            return False  # the call's task answers it
        message = framing.frame(parts, size)
        frames = 0
        try:
            engine.send_headers(stream_id, RESPONSE_HEADERS)
            self.sends += 1
            frame_size = engine.max_outbound_frame_size
            view = memoryview(message)
            for pos in range(0, framed, frame_size):
                engine.send_data(stream_id, view[pos:pos + frame_size])
                frames += 1
        except http2.StreamClosedError:
            return True  # the stream is gone: nothing more goes out on it (its trailers neither)
        finally:
            if frames:
                self.sends += 1
                self.guard.data_sent(frames)
        return True

    async def data(self, stream: OutStream, data: bytes, flush: bool) -> None:
        """Queue ``data`` (a framed message) as DATA frames as the windows allow, waiting for
        them; then write it when ``flush``. Raises StreamGone; cancelled with the call."""
        view = memoryview(data)
        pos, end = 0, len(view)
        h2c = self.engine
        frames = 0
        while pos < end:
            if stream.reset:
                raise StreamGone()
            try:
                window = h2c.local_flow_control_window(stream.stream_id)
                frame_size = h2c.max_outbound_frame_size
                while window > 0 and pos < end:
                    n = min(window, frame_size, end - pos)
                    h2c.send_data(stream.stream_id, view[pos : pos + n])
                    pos += n
                    window -= n
                    frames += 1
            except http2.StreamClosedError:
                raise StreamGone() from None
            finally:
                if frames:
                    self.sends += 1
                    self.guard.data_sent(frames)
                    frames = 0
            if pos < end:
                await self._wait_for_window(stream, end - pos)
        if flush:
            await self.flush()

    async def views(self, stream: OutStream, views: list[memoryview], size: int) -> None:
        """Send one framed message given as byte views (a plain TCP connection and trident's
        engine): DATA frames as the windows allow, each batch written with ``writev`` behind
        what the engine has queued, so nothing is copied. Raises StreamGone; cancelled with
        the call."""
        h2c: Any = self.engine
        while size > 0:
            if stream.reset:
                raise StreamGone()
            try:
                window = h2c.local_flow_control_window(stream.stream_id)
            except http2.StreamClosedError:
                raise StreamGone() from None
            if window <= 0:
                await self._wait_for_window(stream, size)
                continue
            n = min(window, size)
            chunk, views = _split_views(views, n)
            try:
                buffers, frames = h2c.data_frames(stream.stream_id, chunk, n)
            except http2.StreamClosedError:
                raise StreamGone() from None
            self.sends += 1
            self.guard.data_sent(frames)
            size -= n
            await self._write_views(buffers)

    async def _wait_for_window(self, stream: OutStream, left: int) -> None:
        """Flush what is queued, then, if the stream's send window is still closed, wait until
        the peer widens a window (the caller asks again), with ``left`` bytes of the message
        held meanwhile. The stream counts as stalled from its first wait until the window opens
        for it (the watchdog resets it after the send timeout). Raises StreamGone."""
        waiter = self._window
        await self.flush()
        stream_id = stream.stream_id
        engine = self.engine
        try:
            window = engine.local_flow_control_window(stream_id)
        except http2.StreamClosedError:
            self.stalled.pop(stream_id, None)
            raise StreamGone() from None
        if window > 0:
            self.stalled.pop(stream_id, None)
            return
        timeout = self.config.send_timeout
        if timeout and stream_id not in self.stalled:
            now = trio.current_time()
            self.stalled[stream_id] = now
            if self.on_stall is not None:
                self.on_stall(now + timeout)
        BACKLOG.waiting += left
        still_closed = False
        try:
            await waiter.wait()
            still_closed = engine.local_flow_control_window(stream_id) <= 0
        except http2.StreamClosedError:
            raise StreamGone() from None
        finally:
            BACKLOG.waiting -= left
            if not still_closed:
                self.stalled.pop(stream_id, None)

    async def _write_views(self, buffers: list[Any]) -> None:
        """Write what the engine has queued, then ``buffers``, in order, in the connection's
        turn (other writes wait behind them)."""
        io = self.io
        await io.wait_turn()
        queued = self.engine.data_to_send()
        if queued:
            buffers.insert(0, queued)
        if not io.write_now(buffers):
            await io.write_rest(buffers)
        if io.broken:
            await self._broke()

    # ---- onto the socket -----------------------------------------------------------------------

    async def flush(self) -> None:
        """Write whatever the engine has queued, behind the write in progress (without a
        checkpoint when nothing is queued, nor on a socket that takes it all at once while no
        other write is in progress). On a broken socket, the connection breaks."""
        engine = self.engine
        if not engine.has_data_to_send():
            return
        io = self.io
        if io.busy is not None:
            await io.wait_turn()
        data = engine.data_to_send()
        if data:
            parts = [data]
            if not io.write_now(parts, len(data)):
                await io.write_rest(parts)
            if io.broken:
                await self._broke()

    def kick(self) -> None:
        """Write what the engine queued, from a task that cannot wait for the socket (a call
        answered later, by another task): at once when the socket takes it all, the rest by a
        task of the connection that holds its turn; behind a write in progress, by a task of
        the connection (once, whatever it finds queued then)."""
        engine = self.engine
        if self.broken or not engine.has_data_to_send():
            return
        io = self.io
        if io.busy is None:
            data = engine.data_to_send()
            if data:
                io.write_soon([data])
            if io.broken:
                self.broken = True
                self.on_broken()
            return
        if not self._flush_queued and io.tasks is not None:
            self._flush_queued = True
            io.tasks.start_soon(self._queued_flush)

    async def _queued_flush(self) -> None:
        self._flush_queued = False
        await self.flush()

    async def _broke(self) -> None:
        """A write failed: nothing more is sent, every call is cancelled, the reader stops."""
        self.broken = True
        self.on_broken()
        await trio.lowlevel.checkpoint()


def _split_views(views: list[memoryview], n: int) -> tuple[list[memoryview], list[memoryview]]:
    """The first ``n`` bytes of ``views`` and the rest, as views."""
    head: list[memoryview] = []
    for i, view in enumerate(views):
        if n < len(view):
            head.append(view[:n])
            return head, [view[n:], *views[i + 1:]]
        head.append(view)
        n -= len(view)
        if n == 0:
            return head, views[i + 1:]
    return head, []
