"""gRPC over HTTP/2 on trio: one :class:`Connection`, its calls, and a task per call that waits.

:class:`Connection` drives a sans-IO HTTP/2 engine over the connection's socket: trident's own
(:mod:`trident.protocol.http2`, the default) or the ``h2`` library's (``TransportConfig.http2``,
``--grpc-http2 h2``; see :mod:`trident.grpc.h2_engine`). It reads, hands the engine's events to
the calls, and runs the calls; its other jobs are rooms of their own:

* :mod:`trident.grpc.call`: one RPC as its handler sees it (:class:`Call`), the handler
  contract (:class:`Method`, :class:`GrpcError`);
* :mod:`trident.grpc.routes`: which handler a stream's request headers ask for (or why not);
* :mod:`trident.grpc.outbound`: the frames it sends, in order, as the windows allow;
* :mod:`trident.grpc.budget`: the request bytes it holds, bounded per connection and server;
* :mod:`trident.grpc.watchdog`: its timers (handshake, idle, keepalive, max age, messages);
* :mod:`trident.sockets_io`: the socket layer both front ends share.

A call runs one of two ways. A streaming method, or a unary one without ``Method.now``, gets a
task in the connection's nursery at once, under a cancel scope that RST_STREAM from the client,
the ``grpc-timeout`` deadline and the connection's end cancel (and with it whatever the handler
awaits, inference included). A unary method with a ``Method.now`` handler (ModelInfer) starts
no task until it must: once its one message is in (usually in the read that brought its
HEADERS), the read loop calls ``now``, which answers at once into the engine's buffer (flushed
after the read), or later from whichever task has the answer (a queued request's), or hands
the call an awaitable for a task of its own.

Flow control: DATA belonging to a message still being received is acknowledged at once (the
size limit bounds it), while a stream with complete messages its handler has not yet taken gets
no more window until the handler catches up, so a slow handler holds at most one stream window
of buffered data and never stalls the other streams (the connection window is widened to the
maximum). Sends wait for the peer's windows; a peer that never reads blocks only its own calls.

Limits (every size, count and time a client controls is bounded; see
:class:`~trident.grpc.config.TransportConfig`):

* a :class:`~trident.protocol.h2_guard.FrameGuard` reads the frame headers of every chunk before
  the engine does: rapid resets, control-frame floods and oversized header blocks get GOAWAY
  ENHANCE_YOUR_CALM, and a chunk is handed to the engine in slices of at most 64 frames (and
  about 16 KiB of large header blocks: one 60 KB block is a slice) with a checkpoint between
  them, and trident's engine decodes a header block of 4 KiB or more in 4 KiB pieces with a
  checkpoint between them (its ``header_work``); client PINGs follow gRPC core's strike policy
  (:class:`~trident.protocol.h2_guard.PingPolicy`);
* a HEADERS frame beyond MAX_CONCURRENT_STREAMS is refused with RST_STREAM(REFUSED_STREAM)
  (the engine's own limit is set higher, so it never ends the connection), and a header list
  beyond MAX_HEADER_LIST_SIZE fails its stream with RESOURCE_EXHAUSTED after HPACK decoded it;
* request bytes held count against the budgets; a started message must complete within
  ``message_timeout``; the watchdog's timers;
* a peer that does not read: a write whose bytes the socket takes none of for ``send_timeout``
  closes the connection (reset: a GOAWAY could not reach a peer that takes no bytes), and a
  response that waits that long at a zero flow-control window resets its stream (CANCEL; the
  watchdog's timer);
* gzip and deflate messages inflate inline up to 1 MiB of output, the rest in worker threads
  (bounded by the server's limiter) in steps that the call's task awaits
  (:meth:`Call.run_sync`).

Handlers are :class:`Method` entries keyed by ``/package.Service/Method``. A unary handler gets
the request message and returns the response as ``(parts, size)``; a streaming handler uses
:meth:`Call.recv` and :meth:`Call.send_message`. Handlers raise :class:`GrpcError`,
:class:`~trident.errors.TritonError` (status from :func:`trident.errors.grpc_status`) or
:class:`~trident.protocol.grpc_framing.FramingError`; anything else answers INTERNAL.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from trident.batching import rounds
from trident.errors import GRPC_DEADLINE_EXCEEDED, GRPC_INTERNAL, GRPC_OK
from trident.grpc.budget import ConnectionBudget, ServerBudget
from trident.grpc.call import Call, GrpcError, Method, status_of
from trident.grpc.config import TransportConfig
from trident.grpc.h2_engine import make_engine
from trident.grpc.outbound import Outbound, Parts
from trident.grpc.routes import Routes
from trident.grpc.watchdog import Watchdog
from trident.protocol import grpc_framing as framing
from trident.protocol import h2_guard, http2
from trident.protocol.h2_guard import FrameGuard, PingPolicy
from trident.sockets_io import SocketIO

__all__ = ["Call", "Connection", "GrpcError", "Method", "ServerBudget", "TransportConfig", "next_receive_size"]

log = logging.getLogger("trident.grpc")

_RECEIVE_SIZE = 256 * 1024
_RECEIVE_MAX = 1024 * 1024 + 64 * 1024  # after a read that filled its buffer: a 1 MiB message and its frame headers
_LINGER_SECS = 1.0  # after a GOAWAY for abuse: read and drop what the client still sends, then close
_LINGER_BYTES = 16 * 1024 * 1024


def next_receive_size(size: int, got: int) -> int:
    """The size of the socket read after one of ``size`` bytes that returned ``got``:
    ``_RECEIVE_MAX`` after a full read (more bytes wait: a large message is arriving),
    ``_RECEIVE_SIZE`` again after a read shorter than that, else ``size``."""
    if got == size:
        return _RECEIVE_MAX
    if got < _RECEIVE_SIZE:
        return _RECEIVE_SIZE
    return size


class Connection:
    """One HTTP/2 connection. :meth:`serve` serves it until the peer leaves or a drain completes.

    ``budget`` is shared by the connections of one server (a private one when None);
    ``handshake_deadline`` (trio time) is when the client's preface and first SETTINGS must
    have arrived (default: ``config.handshake_timeout`` after :meth:`serve` starts).
    """

    def __init__(self, stream: trio.abc.Stream, methods: dict[str, Method], config: TransportConfig,
                 budget: ServerBudget | None = None, *, handshake_deadline: float | None = None) -> None:
        self.stream = stream
        self.config = config
        self.routes = Routes(methods, config)
        server_budget = budget if budget is not None else ServerBudget(config.max_buffered_bytes,
                                                                       config.worker_threads)
        #: the request bytes this connection holds (messages in progress and not yet handled)
        self.budget = ConnectionBudget(server_budget, config.connection_buffer_limit)
        #: the HTTP/2 engine (see trident.grpc.h2_engine)
        self.engine = make_engine(config)
        self.calls: dict[int, Call] = {}
        #: the reason of the GOAWAY ENHANCE_YOUR_CALM sent, if any
        self.abuse: str | None = None
        self.draining = False  # GOAWAY sent: new streams are refused, the connection closes with its last call
        # the loop's clock, read directly (trio.current_time() is three calls deep): once per read
        self._now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        now = self._now()
        self.last_received = now  # when bytes last came in
        self.idle_since = now  # when the last call ended
        self.guard = FrameGuard(config.guard, now, max_frame_size=config.max_frame_size)
        #: the socket (trident.sockets_io) and what goes out on it (trident.grpc.outbound)
        self.io = SocketIO(stream, on_broken=self._break, send_timeout=config.send_timeout or math.inf,
                           protocol="grpc")
        self.out = Outbound(self.engine, self.io, self.guard, config, on_broken=self._break)
        self.watchdog = Watchdog(self, now, handshake_deadline)
        self.out.on_stall = self.watchdog.arm
        self._pings = PingPolicy(config.min_recv_ping_interval, config.max_ping_strikes,
                                 config.keepalive_permit_without_calls)
        self._sends_at_ping = 0  # the sends as of the last client PING
        self._answering = False  # Method.now runs: its answer is flushed by the read loop
        self._nursery: trio.Nursery | None = None
        self._reader_scope = trio.CancelScope()
        self._drain = trio.Event()
        self._goaway_debug = b""  # the drain's GOAWAY debug data
        self._receive_size = _RECEIVE_SIZE  # the next read's size (grows while reads come back full)

    # ---- lifecycle ------------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve until the peer disconnects, a protocol error, abuse, a timeout, or a requested
        drain finishes. Cancelling it cancels every call on the connection.
        """
        config = self.config
        if self.watchdog.handshake_deadline is None and config.handshake_timeout:
            self.watchdog.handshake_deadline = trio.current_time() + config.handshake_timeout
        out = self.out
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = self.io.tasks = nursery
                nursery.start_soon(self._drainer)
                nursery.start_soon(self.watchdog.serve)
                await out.flush()
                with self._reader_scope:
                    await self._read_loop()
                nursery.cancel_scope.cancel()
        finally:
            for call in self.calls.values():
                if call.deferred is not None:  # no task of its own to release what it holds
                    call.deferred = None
                    call._release()
                if call.later is not None:  # answered later: no task of its own to cancel
                    cancel, call.later = call.later, None
                    cancel()
            self.io.tasks = None
            with trio.CancelScope(shield=True):
                if not out.broken:
                    with trio.move_on_after(1):
                        await self.io.wait_turn()
                        self.engine.goaway(http2.NO_ERROR)
                        await self.io.write([self.engine.data_to_send()])
                elif self.abuse is not None:
                    await self._linger()
                await trio.aclose_forcefully(self.stream)

    def start_drain(self, debug: bytes = b"") -> None:
        """Graceful shutdown: send GOAWAY NO_ERROR (with ``debug`` as its debug data, when the
        first to ask), refuse new streams, close once the calls finish."""
        if not self._drain.is_set():
            self._goaway_debug = debug
        self._drain.set()

    async def _drainer(self) -> None:
        await self._drain.wait()
        self.draining = True
        self.engine.goaway(http2.NO_ERROR, self._goaway_debug)  # the streams still running may finish
        await self.out.flush()
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self.draining and not self.calls:
            self._reader_scope.cancel()

    def close(self, why: str) -> None:
        """End the connection now (a timeout): the reader stops, the calls are cancelled."""
        log.debug("closing gRPC connection: %s", why)
        self._reader_scope.cancel()

    def _break(self) -> None:
        """A write failed: nothing more is sent, every call is cancelled, the reader stops."""
        self.out.broken = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._reader_scope.cancel()

    # ---- reading --------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        """Read the socket and feed the engine until the connection ends. Each read is exactly
        one checkpoint, as trio's ``receive_some``: the wait for bytes, or a yield when they
        were there. A read that fills its buffer (a large message arriving) makes the next one
        ``_RECEIVE_MAX`` bytes, until a read returns less than ``_RECEIVE_SIZE``: a 1 MiB
        message then takes a read or two, not five."""
        guard = self.guard
        io = self.io
        while True:
            io.yielded = False
            size = self._receive_size
            try:
                data = await io.receive(size)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.out.broken = True
                return
            if not data:
                return
            self._receive_size = next_receive_size(size, len(data))
            if not io.yielded:
                await trio.lowlevel.checkpoint()
            now = self.last_received = self._now()
            cuts = guard.feed(data, now)
            if guard.abuse is not None:
                await self._calm(guard.abuse)
                return
            if cuts:  # a chunk of many frames: the engine gets it in slices, other tasks run in between
                start = 0
                view = memoryview(data)  # slices of the bytes read, not copies
                for cut in [*cuts, len(data)]:
                    if start:
                        await trio.lowlevel.checkpoint()  # a flush that writes at once does not yield
                    if not await self._receive(view[start:cut]):
                        return
                    start = cut
            elif not await self._receive(data):
                return

    async def _receive(self, data: bytes | bytearray | memoryview) -> bool:
        """Feed one slice to the engine and act on its events; False once the connection must end.
        A large header block that the engine decodes in pieces (its ``header_work``) gets a
        checkpoint between the pieces."""
        engine = self.engine
        try:
            events = engine.receive_data(data)
        except http2.ProtocolError as e:
            return await self._protocol_error(e)
        while True:
            handle = self._handle
            count = len(events)
            if count > 2 and sum(1 for event in events if event[0] == http2.DATA) > 1:
                rounds.current().crowd()  # several messages in one read: a batching model batches them
            i = 0
            while i < count:
                event = events[i]
                i += 1
                if event[0] == http2.REQUEST:
                    message = events[i] if i < count and not event[3] else None
                    if message is not None and message[0] == http2.DATA and message[1] == event[1] and message[4]:
                        # the request's message, END_STREAM, in the same read: may run at once
                        if self._open_call(event[1], event[2], False, message[2], message[3]):
                            i += 1
                        continue
                    self._open_call(event[1], event[2], event[3])
                    continue
                handle(event)
            if self.abuse is not None:
                await self._calm(self.abuse)
                return False
            await self.out.flush()
            if engine.header_work is None:
                return True
            await trio.lowlevel.checkpoint()
            try:
                events = engine.continue_headers()
            except http2.ProtocolError as e:
                return await self._protocol_error(e)

    async def _protocol_error(self, e: http2.ProtocolError) -> bool:
        log.debug("HTTP/2 protocol error from peer: %s", e)
        await self.out.flush()
        self.out.broken = True  # the engine already queued (and we sent) its GOAWAY
        return False

    def _handle(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == http2.DATA:
            _, stream_id, data, flow, ended = event
            call = self.calls.get(stream_id)
            if call is not None:
                if data or flow:
                    call._on_data(data, flow)
                if ended:
                    call._on_end()
            else:
                self.out.ack(flow, stream_id)
        elif kind == http2.TRAILERS:
            call = self.calls.get(event[1])
            if call is not None:
                call._on_end()
        elif kind == http2.RESET:
            call = self.calls.get(event[1])
            if call is not None:
                call._on_reset()
        elif kind == http2.WINDOW:
            self.out.window_opened()
        elif kind == http2.PING:
            sends = self.out.sends
            if sends != self._sends_at_ping:
                self._sends_at_ping = sends
                self._pings.reset()
            if self._pings.received_ping(self.last_received, not self.calls):
                self.abuse = h2_guard.TOO_MANY_PINGS
        elif kind == http2.PING_ACK:
            self.watchdog.ping_acked(event[1])
        elif kind == http2.GOAWAY:
            self._drain.set()
            if event[1] != http2.NO_ERROR:
                for call in list(self.calls.values()):
                    call._on_reset()

    async def _calm(self, reason: str) -> None:
        """GOAWAY ENHANCE_YOUR_CALM with ``reason`` as debug data; the connection then closes."""
        log.warning("gRPC client abuse (%s): GOAWAY ENHANCE_YOUR_CALM", reason)
        self.abuse = reason
        self.engine.goaway(http2.ENHANCE_YOUR_CALM, reason.encode("ascii"))
        await self.out.flush()
        self.out.broken = True  # nothing more is sent

    async def _linger(self) -> None:
        """After a GOAWAY for abuse: half-close, then read and drop what the client still sends
        (bounded in time and bytes), so that closing does not reset the connection before the
        client has read the GOAWAY."""
        with trio.move_on_after(_LINGER_SECS):
            try:
                if isinstance(self.stream, trio.abc.HalfCloseableStream):
                    await self.stream.send_eof()
                dropped = 0
                while dropped < _LINGER_BYTES:
                    data = await self.io.receive(_RECEIVE_SIZE)
                    if not data:
                        break
                    dropped += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    # ---- calls (the CallHost of trident.grpc.call) ------------------------------------------

    def message_started(self, call: Call) -> None:
        """A request message of ``call`` started arriving: it must be whole within ``message_timeout``."""
        now = call.partial_since = self._now()
        if self.config.message_timeout:
            self.watchdog.arm(now + self.config.message_timeout)

    def _open_call(self, stream_id: int, headers: Sequence[tuple[bytes, bytes]], ended: bool, data: Any = None,
                   flow: int = 0) -> bool:
        """A new stream: the one way a call starts. Refused (draining, over the stream limit,
        headers that ask for what is not served), or a :class:`Call`: a streaming method, or a
        unary one without ``Method.now``, starts its task now; a unary call with ``Method.now``
        waits without a task until its message is in (:meth:`dispatch`).

        ``data`` and ``flow``: the stream's first DATA, read with its HEADERS and ending the
        stream (the usual unary call). When it carries exactly one whole uncompressed message
        within the limits and budgets, the call runs here and now (:meth:`_run_now`) without
        its message decoder, queue or wake-up, and True is returned (the DATA is consumed);
        otherwise False, and the DATA goes the usual way (:meth:`_handle`)."""
        out = self.out
        if self.draining:
            out.reset_quietly(stream_id, http2.REFUSED_STREAM)
            return False
        if len(self.calls) >= self.config.max_concurrent_streams:
            # RFC 9113 §5.1.2: a stream error; the engine decoded the block, so HPACK stays in step
            out.reset_quietly(stream_id, http2.REFUSED_STREAM)
            if not self.guard.stream_refused(self.last_received):
                self.abuse = self.guard.abuse
            return False
        parsed = self.routes.route(headers)
        if len(parsed) == 3:  # refused: (status, message, http status)
            out.refuse(stream_id, ended, *parsed)
            return False
        path, entry, encoding, timeout, response_encoding = parsed
        message = None
        if data is not None and entry.now is not None and (timeout is None or timeout > 0):
            message = self._whole_message(data)
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        call = Call(self, stream_id, path, headers, deadline, encoding, response_encoding)
        self.calls[stream_id] = call
        if message is not None:
            call._ended = True
            out.ack(flow, stream_id)
            self._run_now(call, entry, message)
            return True
        if ended:
            call._ended = True
        elif entry.now is not None:
            call.deferred = entry  # its message is still to come: see dispatch
            return False
        assert self._nursery is not None
        self._nursery.start_soon(self._run_call, call, entry)
        return False

    def _whole_message(self, data: Any) -> bytearray | None:
        """The one uncompressed message that ``data`` (a stream's only DATA) carries whole, within
        the size limit and the budgets; None for anything else."""
        if type(data) is list:
            return None
        size = len(data) - framing.PREFIX_SIZE
        if size < 0 or size > self.config.max_message_size or size > self.budget.room():
            return None
        flag, length = framing.PREFIX.unpack_from(data)
        if flag or length != size:
            return None
        return bytearray(data[framing.PREFIX_SIZE:])

    def dispatch(self, call: Call) -> None:
        """A deferred unary call's stream moved (a message, its end, an error or a reset).

        Once its one message is in and the client has half-closed, it runs here and now
        (:meth:`_run_now`). Anything else (a reset, an error, a compressed or second message,
        a large one still in pieces, an expired deadline) starts the call's task, which
        finishes it the usual way.
        """
        if not (call._ended or call.reset or call._error is not None or len(call._queue) > 1):
            return  # END_STREAM is still to come
        method = call.deferred
        assert method is not None and method.now is not None and self._nursery is not None
        call.deferred = None
        if (call.reset or call._error is not None or len(call._queue) != 1 or call._queue[0][0]
                or type(call._queue[0][1]) is not bytearray  # framing.Pieces: joined in the task
                or (call.deadline != math.inf and trio.current_time() >= call.deadline)):
            self._nursery.start_soon(self._run_call, call, method)
            return
        _, message, _ = call._take()
        assert type(message) is bytearray
        self._run_now(call, method, message)

    def _run_now(self, call: Call, method: Method, message: bytearray) -> None:
        """Run a unary call whose one message is in and whose client half-closed: ``Method.now``
        answers it into the engine's buffer (flushed by the read loop after the chunk) when it
        can, at once, or later from another task, or gives it a task of its own
        (:meth:`Call.run`), which owns it from then on."""
        assert method.now is not None
        call.method = method
        self._answering = True
        try:
            method.now(call, message)
        except Exception as e:
            if self._answerable(call) and not call.tasked:
                status, text = status_of(e, call.path)
                self._end_call(call, status, text)
                self.forget(call)
            return
        finally:
            self._answering = False
        if self.calls.get(call.stream_id) is call and call.later is None and not call.tasked:
            log.error("gRPC handler for %s gave the call no answer", call.path)
            self._end_call(call, GRPC_INTERNAL, "the handler gave no answer")
            self.forget(call)

    def answer(self, call: Call, parts: Parts, size: int) -> None:
        """:meth:`Call.answer`: queued in the engine's buffer when the windows take it whole (and
        written now, unless the read loop is answering and flushes after its chunk), else sent
        by a task of the call's. Dropped when the call is over (see :meth:`_answerable`)."""
        call.later = None
        if self.calls.get(call.stream_id) is not call or call.reset or self.out.broken:
            return
        if not (call.compress_responses and call.response_encoding is not None and self.config.compression_level):
            if self.out.send_now(call.stream_id, parts, size):
                call._headers_sent = True
                self._end_call(call, GRPC_OK, "")
                self.forget(call)
                if not self._answering:
                    self.out.kick()
                return
        self.start_call(call, reply=(parts, size))

    def answer_error(self, call: Call, error: Exception) -> None:
        """:meth:`Call.fail`."""
        if not self._answerable(call):
            return
        status, text = status_of(error, call.path)
        self._end_call(call, status, text)
        self.forget(call)
        if not self._answering:
            self.out.kick()

    def _answerable(self, call: Call) -> bool:
        """Whether a call answered by ``Method.now`` is still waiting for its answer (it is then no longer)."""
        call.later = None
        return self.calls.get(call.stream_id) is call and not call.reset and not self.out.broken

    def start_call(self, call: Call, awaiting: Awaitable[tuple[Parts, int]] | None = None,
                   reply: tuple[Parts, int] | None = None) -> None:
        """Give a call answered by ``Method.now`` the task that finishes it (:meth:`_run_call`)."""
        assert call.method is not None and self._nursery is not None
        call.tasked = True
        self._nursery.start_soon(self._run_call, call, call.method, awaiting, reply)

    async def _run_call(self, call: Call, method: Method, awaiting: Awaitable[tuple[Parts, int]] | None = None,
                        reply: tuple[Parts, int] | None = None) -> None:
        """The call's task: run its handler (``awaiting``: the reply ``Method.now`` left to this
        task; ``reply``: one it made that the windows could not take at once) and end the call."""
        try:
            status, message = await self._invoke(call, method, awaiting, reply)
            self.calls.pop(call.stream_id, None)
            if status is None or call.reset:
                return
            if self._end_call(call, status, message):
                await self.out.flush()
        finally:
            self.forget(call)

    async def _invoke(self, call: Call, method: Method, awaiting: Awaitable[tuple[Parts, int]] | None = None,
                      reply: tuple[Parts, int] | None = None) -> tuple[int | None, str]:
        """Run the handler; returns the status to end the call with (None: nothing to send)."""
        try:
            with trio.CancelScope(deadline=call.deadline) as scope:
                call.scope = scope
                if call.reset:
                    scope.cancel()
                if method.streaming:
                    await method.handler(call)
                else:
                    if reply is None:
                        if awaiting is None:
                            awaiting = method.handler(call, await call.recv_unary())
                        reply = await awaiting
                    await call._send(*reply, flush=False)  # flushed with the trailers
        except Exception as e:
            return status_of(e, call.path)
        if scope.cancelled_caught:
            return (None, "") if call.reset else (GRPC_DEADLINE_EXCEEDED, "Deadline Exceeded")
        return GRPC_OK, ""

    def _end_call(self, call: Call, status: int | None, message: str) -> bool:
        """Queue the call's trailers (none for status None or a reset stream); True when queued."""
        self.calls.pop(call.stream_id, None)
        if status is None or call.reset:
            return False
        return self.out.trailers(call.stream_id, call._trailers(status, message), call._ended)

    def forget(self, call: Call) -> None:
        """The call is over: what it held is released, the idle timer starts with the last one."""
        self.calls.pop(call.stream_id, None)
        call._release()
        if not self.calls:
            self.idle_since = now = self._now()
            if self.config.idle_timeout:
                self.watchdog.arm(now + self.config.idle_timeout)
        self._maybe_close()
