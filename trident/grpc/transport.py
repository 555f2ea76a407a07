"""gRPC over HTTP/2 on trio: one connection, one task and cancel scope per call that waits.

:class:`Connection` drives a sans-IO HTTP/2 engine over a trio stream: trident's own
(:mod:`trident.protocol.http2`, the default) or the ``h2`` library's (``TransportConfig.http2``,
``--grpc-http2 h2``); see :mod:`trident.grpc.h2_engine`. Each request stream
becomes a :class:`Call` run by its own task in the connection's nursery, under a cancel scope
that RST_STREAM from the client, the ``grpc-timeout`` deadline and the connection's end cancel
(and with it whatever the handler awaits, inference included). A unary method with a
``Method.now`` handler (ModelInfer) starts no task until it must: once its one message is in,
the read loop calls ``now`` and, when that answers at once, queues the response and trailers
itself (:meth:`Connection._dispatch`); nothing then waits, so there is nothing to cancel.

Flow control: DATA belonging to a message still being received is acknowledged at once (the
size limit bounds it), while a stream with complete messages its handler has not yet taken gets
no more window until the handler catches up, so a slow handler holds at most one stream window
of buffered data and never stalls the other streams (the connection window is widened to the
maximum). Sends wait for the peer's windows; a peer that never reads blocks only its own calls.

Limits (every size, count and time a client controls is bounded; see :class:`TransportConfig`):

* a :class:`~trident.protocol.h2_guard.FrameGuard` reads the frame headers of every chunk before
  the engine does: rapid resets, control-frame floods and oversized header blocks get GOAWAY
  ENHANCE_YOUR_CALM, and a chunk is handed to the engine in slices of at most 64 frames with a
  checkpoint between them; client PINGs follow gRPC core's strike policy
  (:class:`~trident.protocol.h2_guard.PingPolicy`);
* a HEADERS frame beyond MAX_CONCURRENT_STREAMS is refused with RST_STREAM(REFUSED_STREAM)
  (the engine's own limit is set higher, so it never ends the connection), and a header list
  beyond MAX_HEADER_LIST_SIZE fails its stream with RESOURCE_EXHAUSTED after HPACK decoded it;
* request bytes held by the transport (messages in progress and messages not yet taken by
  their handler) count against a per-connection and a per-server (:class:`ServerBudget`)
  budget: the stream whose DATA would exceed one fails with RESOURCE_EXHAUSTED; a started
  message must complete within ``message_timeout`` (else DEADLINE_EXCEEDED);
* one watchdog task per connection enforces the handshake deadline (preface and first
  SETTINGS), the idle timeout (GOAWAY NO_ERROR after no call for that long), keepalive
  (PING after ``keepalive_time`` without inbound bytes, close when no ACK comes within
  ``keepalive_timeout``) and the maximum connection age (gRPC core's
  ``GRPC_ARG_MAX_CONNECTION_AGE_MS`` / ``_GRACE_MS``: GOAWAY NO_ERROR "max_age" once the
  connection is ``max_connection_age`` old, +-10% jitter, so that the client reconnects, maybe
  elsewhere; the calls running then may finish for ``max_connection_age_grace``, after which
  each ends with UNAVAILABLE and the connection closes);
* gzip and deflate messages inflate inline up to 1 MiB of output, the rest in worker threads (bounded
  by the server's limiter) in steps that the call's task awaits (:meth:`Call.run_sync`).

Handlers are :class:`Method` entries keyed by ``/package.Service/Method``. A unary handler gets
the request message and returns the response as ``(parts, size)``; a streaming handler uses
:meth:`Call.recv` and :meth:`Call.send_message`. Handlers raise :class:`GrpcError`,
:class:`~trident.errors.TritonError` (status from :func:`trident.errors.grpc_status`) or
:class:`~trident.protocol.grpc_framing.FramingError`; anything else answers INTERNAL.
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from trident.batching import rounds
from trident.errors import (
    GRPC_DEADLINE_EXCEEDED,
    GRPC_INTERNAL,
    GRPC_INVALID_ARGUMENT,
    GRPC_OK,
    GRPC_RESOURCE_EXHAUSTED,
    GRPC_UNAVAILABLE,
    GRPC_UNIMPLEMENTED,
    TritonError,
)
from trident.grpc.config import TransportConfig
from trident.grpc.h2_engine import make_engine
from trident.protocol import grpc_framing as framing
from trident.protocol import h2_guard, http2
from trident.protocol.grpc_framing import FramingError
from trident.protocol.h2_guard import FrameGuard, PingPolicy
from trident.server import worker_threads
from trident.sockets_io import SocketIO

log = logging.getLogger("trident.grpc")


Parts = Sequence[Any]  # buffers: bytes, bytearray, memoryview or 1-D uint8 numpy arrays

_RECEIVE_SIZE = 256 * 1024
_RECEIVE_MAX = 1024 * 1024 + 64 * 1024  # after a read that filled its buffer: a 1 MiB message and its frame headers
_WRITEV_SIZE = 64 * 1024  # a response message from this size is written from its parts (no copy)
_INLINE_INFLATE = 1024 * 1024  # gzip output inflated on the event loop; the rest in worker threads
_THREAD_INFLATE = 16 * 1024 * 1024  # gzip output per worker-thread step (cancellation between steps)
_KEEPALIVE_PING = b"trident\x00"
_LINGER_SECS = 1.0  # after a GOAWAY for abuse: read and drop what the client still sends, then close
_LINGER_BYTES = 16 * 1024 * 1024
_PARSED_HEADERS_CACHE = 64  # request header tuples whose parse a connection keeps
MAX_AGE_JITTER = 0.1  # a connection's max age is max_connection_age x (1 +- this), as gRPC core's
_MAX_AGE_DEBUG = b"max_age"  # the GOAWAY's debug data (gRPC core's)


def next_receive_size(size: int, got: int) -> int:
    """The size of the socket read after one of ``size`` bytes that returned ``got``:
    ``_RECEIVE_MAX`` after a full read (more bytes wait: a large message is arriving),
    ``_RECEIVE_SIZE`` again after a read shorter than that, else ``size``."""
    if got == size:
        return _RECEIVE_MAX
    if got < _RECEIVE_SIZE:
        return _RECEIVE_SIZE
    return size


class GrpcError(Exception):
    """End the call with this gRPC status and message."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Method:
    """A handler: unary ``(call, message) -> (parts, size)`` or streaming ``(call) -> None``.

    ``now``, for a unary method, is the same handler without a task where it can be, called
    once the call's one message is in (see :meth:`Connection._dispatch`): ``now(call, message)``
    answers the call itself, with exactly one of :meth:`Call.answer` / :meth:`Call.fail` (here
    and now, or later from whichever task has the answer, after :meth:`Call.answer_later`) or
    :meth:`Call.run` (the call's task awaits the reply); raising is :meth:`Call.fail`.
    """

    handler: Callable[..., Awaitable[Any]]
    streaming: bool = False
    now: Callable[[Call, bytearray], None] | None = None


class ServerBudget:
    """What the connections of one server share: the request bytes they buffer (``buffered``,
    its high-water mark ``peak``, at most ``limit``) and the worker-thread limiter."""

    def __init__(self, limit: int, threads: int = 2) -> None:
        self.limit = limit
        self.buffered = 0
        self.peak = 0
        self.limiter = trio.CapacityLimiter(max(1, threads))


class Call:
    """One RPC as its handler sees it. Created and driven by :class:`Connection`."""

    # What a call starts with, as class attributes: a call on the direct path (a unary call
    # whose message came in one read) never sets most of them, and its creation costs less.
    #: set by a handler whose responses may be gzip-compressed (when the client accepts it)
    compress_responses = False
    reset = False
    scope: trio.CancelScope | None = None
    _decoder: framing.MessageDecoder | None = None  # made by the first DATA the call reads itself
    _queued = 0  # bytes of the messages in _queue
    _held = 0  # bytes this call has charged to the budgets
    partial_since = math.inf  # when the message in progress started (inf: none)
    _ended = False
    _error: FramingError | None = None
    _unacked = 0
    _wakeup: trio.Event | None = None
    _headers_sent = False
    _send_lock: trio.Lock | None = None  # created by the first send_message
    #: a unary call whose task is not started yet (Method.now): the connection looks at it
    #: each time its stream moves (:meth:`Connection._dispatch`)
    deferred: Method | None = None
    #: the unary method run by Method.now; what cancels the answer of a call answered later
    #: (:meth:`answer_later`); whether the call got a task after Method.now (:meth:`run`)
    method: Method | None = None
    later: Callable[[], None] | None = None
    tasked = False

    def __init__(self, conn: Connection, stream_id: int, path: str, headers: Sequence[tuple[bytes, bytes]],
                 deadline: float, encoding: str | None, response_encoding: str | None) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.path = path
        self.headers = headers
        self.deadline = deadline
        self.encoding = encoding
        #: how responses a handler marks compressible are compressed (the client's
        #: grpc-accept-encoding: gzip, else deflate), or None
        self.response_encoding = response_encoding
        self._queue: deque[tuple[bool, bytearray]] = deque()

    @property
    def may_answer_later(self) -> bool:
        """Whether ``Method.now`` may answer this call later (:meth:`answer_later`): it has no
        deadline to watch (a call's deadline is its task's cancel scope)."""
        return self.deadline == math.inf

    def answer(self, parts: Parts, size: int) -> None:
        """The reply of a call answered by ``Method.now``, at once or later: sent now, or by a
        task of the connection's when the windows cannot take it at once. Never waits, never
        raises; dropped if the call is over."""
        self.conn._answer(self, parts, size)

    def fail(self, error: Exception) -> None:
        """End a call answered by ``Method.now``, at once or later, with the status of
        ``error`` (as a handler raising it). Never waits, never raises; dropped if the call is
        over."""
        self.conn._answer_error(self, error)

    def answer_later(self, cancel: Callable[[], None]) -> None:
        """``Method.now`` answers the call later (:meth:`answer` / :meth:`fail`, from whichever
        task on the trio thread has the answer) and the call has no task meanwhile:
        ``cancel()`` is called, once, if the call ends first (a reset, the connection's end).
        Only when :attr:`may_answer_later`."""
        if self.conn.calls.get(self.stream_id) is self:  # not answered yet
            self.later = cancel

    def run(self, reply: Awaitable[tuple[Parts, int]]) -> None:
        """``Method.now`` cannot answer at once: the call's task awaits ``reply`` (an awaitable
        of ``(parts, size)``) and sends it, under the call's cancel scope (a reset, the
        deadline, the connection's end)."""
        self.conn._start_call(self, reply)

    @property
    def metadata(self) -> list[tuple[str, str | bytes]]:
        """Application metadata (``-bin`` values decoded). Raises GrpcError on bad base64."""
        try:
            return framing.decode_metadata(self.headers)
        except ValueError as e:
            raise GrpcError(GRPC_INTERNAL, str(e)) from None

    # ---- receiving ------------------------------------------------------------------------

    def _on_data(self, data: Any, flow_length: int) -> None:
        """Bytes of the stream's DATA (a bytes-like object, or a list of them: the engine's
        DATA event), ``flow_length`` the flow-controlled bytes they came in."""
        conn = self.conn
        if self._error is not None:
            conn._ack(flow_length, self.stream_id)
            return
        size = len(data) if type(data) is not list else sum(map(len, data))
        if size > conn._room():
            self._fail(FramingError(GRPC_RESOURCE_EXHAUSTED, conn._budget_message(size)))
            conn._ack(flow_length, self.stream_id)
            return
        held = bool(self._queue)
        decoder = self._decoder
        if decoder is None:
            decoder = self._decoder = framing.MessageDecoder(conn.config.max_message_size)
        try:
            messages = decoder.feed(data)
        except FramingError as e:
            self._fail(e)
            conn._ack(flow_length, self.stream_id)
            return
        if held:
            self._unacked += flow_length
        else:
            conn._ack(flow_length, self.stream_id)
        if messages:
            self._queue.extend(messages)
            for _, message in messages:
                self._queued += len(message)
        now_held = decoder.buffered + self._queued
        if now_held != self._held:
            conn._charge(now_held - self._held)
            self._held = now_held
        if decoder.partial:
            if messages or self.partial_since == math.inf:
                conn._message_started(self)
        else:
            self.partial_since = math.inf
        if messages:
            self._wake()

    def _fail(self, error: FramingError) -> None:
        """The stream cannot go on receiving: drop what it buffered; recv() raises ``error``."""
        self._error = error
        if self._decoder is not None:
            self._decoder.discard()
        self._queue.clear()
        self._queued = 0
        self.partial_since = math.inf
        self._release()
        self._wake()

    def _release(self) -> None:
        if self._held:
            self.conn._charge(-self._held)
            self._held = 0

    def _on_end(self) -> None:
        self._ended = True
        self._wake()

    def _on_reset(self) -> None:
        self.reset = True
        if self.scope is not None:
            self.scope.cancel()
        if self.later is not None:  # no task to end it: it ends here
            cancel, self.later = self.later, None
            cancel()
            self.conn._forget(self)
            return
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None
        elif self.deferred is not None:
            self.conn._dispatch(self)

    async def recv(self) -> bytearray | None:
        """The next request message, or None once the client has half-closed.

        Raises FramingError: RESOURCE_EXHAUSTED for a message over the size limit, INTERNAL
        for a stream that ends inside a message or a compressed message without an encoding.
        """
        while not self._queue:
            if self._error is not None:
                raise self._error
            if self._ended:
                if self._decoder is not None:
                    self._decoder.close()
                return None
            self._wakeup = event = trio.Event()
            await event.wait()
        compressed, message, acked = self._take()
        if acked:
            await self.conn._flush()
        if compressed:
            if self.encoding in (None, "identity"):
                raise FramingError(GRPC_INTERNAL, "compressed message received without a grpc-encoding")
            return await self._inflate(message)
        return message

    def _take(self) -> tuple[bool, bytearray, bool]:
        """The next queued message ``(compressed, message, window returned)``: it no longer
        counts against the budgets, and the window held back for the queue returns with the
        last one (the caller flushes)."""
        compressed, message = self._queue.popleft()
        size = len(message)
        self._queued -= size
        self._held -= size
        self.conn._charge(-size)
        if not self._queue and self._unacked:
            self.conn._ack(self._unacked, self.stream_id)
            self._unacked = 0
            return compressed, message, True
        return compressed, message, False

    async def _inflate(self, message: bytearray) -> bytearray:
        """gzip-inflate a message: the first MiB of output inline, the rest in worker-thread steps
        whose output is charged to the buffer budgets while it grows. Raises FramingError
        (RESOURCE_EXHAUSTED over the message size or a budget, INTERNAL for bad gzip)."""
        conn = self.conn
        inflater = framing.GzipInflater(message, conn.config.max_message_size, self.encoding or "gzip")
        if inflater.step(_INLINE_INFLATE):
            return inflater.output
        charged = 0
        try:
            while True:
                if _THREAD_INFLATE > conn._room():
                    raise FramingError(GRPC_RESOURCE_EXHAUSTED, conn._budget_message(_THREAD_INFLATE))
                conn._charge(_THREAD_INFLATE)
                charged += _THREAD_INFLATE
                if await self.run_sync(inflater.step, _THREAD_INFLATE):
                    return inflater.output
        finally:
            conn._charge(-charged)

    async def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in one of the server's worker threads and wait for it.

        The call's task owns the thread: cancellation is noticed before the thread starts and
        after it returns, never by abandoning it. Raises what ``fn`` raises."""
        return await worker_threads.run_sync(fn, *args, limiter=self.conn.budget.limiter)

    async def recv_unary(self) -> bytearray:
        """The single request message of a unary call. Raises FramingError / GrpcError(INTERNAL)."""
        message = await self.recv()
        if message is None:
            raise GrpcError(GRPC_INTERNAL, "unary call ended without a request message")
        if await self.recv() is not None:
            raise GrpcError(GRPC_INTERNAL, "unary call received more than one request message")
        return message

    # ---- sending --------------------------------------------------------------------------

    async def send_message(self, parts: Parts, size: int, *, flush: bool = True) -> None:
        """Frame and send one response message, waiting for flow-control window as needed.

        Raises FramingError(RESOURCE_EXHAUSTED) for a message over the size limit.
        Cancelled with the call (client reset, deadline, connection closed).
        """
        if self._send_lock is None:
            self._send_lock = trio.Lock()
        async with self._send_lock:
            await self._send(parts, size, flush)

    async def _send(self, parts: Parts, size: int, flush: bool) -> None:
        """Send one message; the caller makes sure no other send runs on this call."""
        framing.check_size(size, self.conn.config.max_message_size, "sent")
        encoding = self.response_encoding if self.compress_responses and self.conn.config.compression_level else None
        conn = self.conn
        if encoding is None and size >= _WRITEV_SIZE and conn.io.fd >= 0 and hasattr(conn.engine, "data_frames"):
            # a large message is written from its parts (headers and views: no copy)
            if not self._headers_sent:
                self._headers_sent = True
                conn._send_headers(self.stream_id, _response_headers(None))
            views = [memoryview(framing.frame_prefix(size))]
            views += [memoryview(p).cast("B") for p in parts if len(p)]
            await conn._send_views(self, views, size + framing.PREFIX_SIZE)
            return
        if encoding is not None:
            payload = framing.gzip_compress(b"".join(parts), conn.config.compression_level, encoding)
            message = framing.frame([payload], len(payload), compressed=True)
        else:
            message = framing.frame(parts, size)
        if not self._headers_sent:
            self._headers_sent = True
            conn._send_headers(self.stream_id, _response_headers(encoding))
        await conn._send_data(self, message, flush)

    def _trailers(self, status: int, message: str) -> tuple[tuple[bytes, bytes], ...]:
        if status == GRPC_OK and not message:
            return _TRAILERS_OK if self._headers_sent else _TRAILERS_ONLY_OK
        trailers: tuple[tuple[bytes, bytes], ...] = () if self._headers_sent else _RESPONSE_HEADERS
        trailers += ((b"grpc-status", str(status).encode()),)
        if message:
            trailers += ((b"grpc-message", framing.encode_grpc_message(message).encode("ascii")),)
        return trailers


def _response_headers(encoding: str | None) -> tuple[tuple[bytes, bytes], ...]:
    if encoding is None:
        return _RESPONSE_HEADERS
    return _RESPONSE_HEADERS_GZIP if encoding == "gzip" else _RESPONSE_HEADERS_DEFLATE


# constant header blocks, as tuples: the HTTP/2 engine's encode cache keys on them
_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"),
                     (b"grpc-accept-encoding", framing.ACCEPT_ENCODING.encode()))
_RESPONSE_HEADERS_GZIP = (*_RESPONSE_HEADERS, (b"grpc-encoding", b"gzip"))
_RESPONSE_HEADERS_DEFLATE = (*_RESPONSE_HEADERS, (b"grpc-encoding", b"deflate"))
_TRAILERS_OK = ((b"grpc-status", b"0"),)
_TRAILERS_ONLY_OK = (*_RESPONSE_HEADERS, *_TRAILERS_OK)


class Connection:
    """One HTTP/2 connection. :meth:`serve` serves it until the peer leaves or a drain completes.

    ``budget`` is shared by the connections of one server (a private one when None);
    ``handshake_deadline`` (trio time) is when the client's preface and first SETTINGS must
    have arrived (default: ``config.handshake_timeout`` after :meth:`serve` starts).
    """

    def __init__(self, stream: trio.abc.Stream, methods: dict[str, Method], config: TransportConfig,
                 budget: ServerBudget | None = None, *, handshake_deadline: float | None = None) -> None:
        self.stream = stream
        #: the connection's socket (trident.sockets_io): non-blocking reads and writes that wait
        #: through trio only when the kernel says so, one write at a time
        self.io = SocketIO(stream, on_broken=self._break)
        self.methods = methods
        self.config = config
        self.budget = budget if budget is not None else ServerBudget(config.max_buffered_bytes, config.worker_threads)
        #: the HTTP/2 engine (see trident.grpc.h2_engine)
        self.engine = make_engine(config)
        self.calls: dict[int, Call] = {}
        #: request bytes this connection holds (messages in progress and not yet handled)
        self.buffered = 0
        #: the reason of the GOAWAY ENHANCE_YOUR_CALM sent, if any
        self.abuse: str | None = None
        self._buffer_limit = config.connection_buffer_limit
        self._flush_queued = False  # a task of _kick's is to write what the engine holds
        self._answering = False  # Method.now runs: its answer is flushed by the read loop
        self._window_event = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._reader_scope = trio.CancelScope()
        self._drain = trio.Event()
        self._draining = False
        self._broken = False
        self._receive_size = _RECEIVE_SIZE  # the next read's size (grows while reads come back full)
        # the loop's clock, read directly (trio.current_time() is three calls deep): once per read
        self._now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        now = self._now()
        self.guard = FrameGuard(config.guard, now, max_frame_size=config.max_frame_size)
        self._pings = PingPolicy(config.min_recv_ping_interval, config.max_ping_strikes,
                                 config.keepalive_permit_without_calls)
        self._handshake_deadline = handshake_deadline
        self._last_received = now
        self._idle_since = now
        #: when this connection reaches its max age (GOAWAY "max_age"), and then when its grace
        #: period ends (inf: not set, or not yet started)
        self._age_deadline = (now + config.max_connection_age * random.uniform(1 - MAX_AGE_JITTER, 1 + MAX_AGE_JITTER)
                              if config.max_connection_age else math.inf)
        self._grace_deadline = math.inf
        self._goaway_debug = b""  # the drain's GOAWAY debug data
        self._sends = 0  # DATA/HEADERS sends so far (the ping policies reset on them)
        self._sends_at_ping = 0  # ... as of the last client PING
        self._sends_at_keepalive = 0  # ... as of the last keepalive PING we sent
        self._keepalives_without_data = 0
        self._ping_sent_at: float | None = None  # our keepalive PING awaiting its ACK
        self._timer: trio.CancelScope | None = None  # the watchdog's sleep
        #: id(header tuple) -> (that tuple, what _parse_headers made of it)
        self._parsed_headers: dict[int, tuple[Any, tuple[Any, ...]]] = {}

    # ---- lifecycle ------------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve until the peer disconnects, a protocol error, abuse, a timeout, or a requested
        drain finishes. Cancelling it cancels every call on the connection.
        """
        config = self.config
        if self._handshake_deadline is None and config.handshake_timeout:
            self._handshake_deadline = trio.current_time() + config.handshake_timeout
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = self.io.tasks = nursery
                nursery.start_soon(self._drainer)
                nursery.start_soon(self._watchdog)
                await self._flush()
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
                if not self._broken:
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
        self._draining = True
        self.engine.goaway(http2.NO_ERROR, self._goaway_debug)  # the streams still running may finish
        await self._flush()
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self._draining and not self.calls:
            self._reader_scope.cancel()

    def _close(self, why: str) -> None:
        """End the connection now (a timeout): the reader stops, the calls are cancelled."""
        log.debug("closing gRPC connection: %s", why)
        self._reader_scope.cancel()

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
                self._broken = True
                return
            if not data:
                return
            self._receive_size = next_receive_size(size, len(data))
            if not io.yielded:
                await trio.lowlevel.checkpoint()
            now = self._last_received = self._now()
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
        """Feed one slice to the engine and act on its events; False once the connection must end."""
        try:
            events = self.engine.receive_data(data)
        except http2.ProtocolError as e:
            log.debug("HTTP/2 protocol error from peer: %s", e)
            await self._flush()
            self._broken = True  # the engine already queued (and we sent) its GOAWAY
            return False
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
        await self._flush()
        return True

    async def _calm(self, reason: str) -> None:
        """GOAWAY ENHANCE_YOUR_CALM with ``reason`` as debug data; the connection then closes."""
        log.warning("gRPC client abuse (%s): GOAWAY ENHANCE_YOUR_CALM", reason)
        self.abuse = reason
        self.engine.goaway(http2.ENHANCE_YOUR_CALM, reason.encode("ascii"))
        await self._flush()
        self._broken = True  # nothing more is sent

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
                self._ack(flow, stream_id)
        elif kind == http2.TRAILERS:
            call = self.calls.get(event[1])
            if call is not None:
                call._on_end()
        elif kind == http2.RESET:
            call = self.calls.get(event[1])
            if call is not None:
                call._on_reset()
        elif kind == http2.WINDOW:
            self._window_event.set()
            self._window_event = trio.Event()
        elif kind == http2.PING:
            if self._sends != self._sends_at_ping:
                self._sends_at_ping = self._sends
                self._pings.reset()
            if self._pings.received_ping(self._last_received, not self.calls):
                self.abuse = h2_guard.TOO_MANY_PINGS
        elif kind == http2.PING_ACK:
            if event[1] == _KEEPALIVE_PING:
                self._ping_sent_at = None
        elif kind == http2.GOAWAY:
            self._drain.set()
            if event[1] != http2.NO_ERROR:
                for call in list(self.calls.values()):
                    call._on_reset()

    # ---- budgets and timers ---------------------------------------------------------------

    def _room(self) -> int:
        """Request bytes this connection may still buffer (its own budget and the server's)."""
        budget = self.budget
        return min(self._buffer_limit - self.buffered, budget.limit - budget.buffered)

    def _budget_message(self, size: int) -> str:
        budget = self.budget
        if self._buffer_limit - self.buffered < size:
            return (f"request bytes buffered on this connection would exceed the limit "
                    f"({self.buffered + size} vs. {self._buffer_limit})")
        return (f"request bytes buffered by the server would exceed the limit "
                f"({budget.buffered + size} vs. {budget.limit})")

    def _charge(self, size: int) -> None:
        self.buffered += size
        budget = self.budget
        budget.buffered += size
        if budget.buffered > budget.peak:
            budget.peak = budget.buffered

    def _message_started(self, call: Call) -> None:
        now = call.partial_since = self._now()
        if self.config.message_timeout:
            self._arm(now + self.config.message_timeout)

    def _arm(self, deadline: float) -> None:
        """Wake the watchdog by ``deadline`` at the latest."""
        timer = self._timer
        if timer is not None and deadline < timer.deadline:
            timer.deadline = deadline

    async def _watchdog(self) -> None:
        """Handshake, idle, keepalive, max-age and partial-message timers of this connection."""
        while True:
            wake = await self._check_timers(trio.current_time())
            with trio.CancelScope(deadline=wake) as self._timer:
                await trio.sleep_forever()
            self._timer = None

    async def _check_timers(self, now: float) -> float:
        """Act on the timers that are due; returns when to look again."""
        config = self.config
        wake = math.inf
        deadline = self._handshake_deadline
        if deadline is not None:
            if self.guard.handshake_done:
                self._handshake_deadline = None
            elif now >= deadline:
                self._close("no HTTP/2 preface and SETTINGS within the handshake timeout")
                return math.inf
            else:
                wake = deadline
        if now >= self._age_deadline:
            self._age_deadline = math.inf
            log.debug("gRPC connection reached its max age (%g ms): GOAWAY", config.max_connection_age * 1000)
            self.start_drain(_MAX_AGE_DEBUG)  # the client reconnects; the calls running may finish
            if config.max_connection_age_grace:
                self._grace_deadline = now + config.max_connection_age_grace
        wake = min(wake, self._age_deadline)
        if now >= self._grace_deadline:
            self._end_grace()
            return math.inf
        wake = min(wake, self._grace_deadline)
        if config.idle_timeout and not self.calls and not self._draining:
            deadline = self._idle_since + config.idle_timeout
            if now >= deadline:
                log.debug("gRPC connection idle for %.1f s: GOAWAY", config.idle_timeout)
                self.start_drain()
            else:
                wake = min(wake, deadline)
        if config.keepalive_time:
            wake = min(wake, await self._keepalive(now))
        if config.message_timeout:
            for call in list(self.calls.values()):
                deadline = call.partial_since + config.message_timeout
                if now >= deadline:
                    call._fail(FramingError(
                        GRPC_DEADLINE_EXCEEDED,
                        f"request message not received whole within {config.message_timeout:g} s"))
                else:
                    wake = min(wake, deadline)
        return wake

    def _end_grace(self) -> None:
        """The max-age grace period is over: each call still running ends with UNAVAILABLE (its
        trailers are queued, and written by :meth:`serve` as it closes, even behind a send that
        waits for a window; the call's task, cancelled with the connection, sends nothing more)
        and the connection closes, as gRPC core closes the transport then."""
        config = self.config
        self._grace_deadline = math.inf
        message = (f"connection closed by the server: max connection age "
                   f"({config.max_connection_age * 1000:g} ms) and its grace period "
                   f"({config.max_connection_age_grace * 1000:g} ms) are over")
        for call in list(self.calls.values()):
            call.reset = True
            try:
                self.engine.send_headers(call.stream_id, call._trailers(GRPC_UNAVAILABLE, message), end_stream=True)
            except http2.StreamClosedError:
                continue
            if not call._ended:
                self._reset_quietly(call.stream_id)
        self._close("max connection age grace period over")

    async def _keepalive(self, now: float) -> float:
        config = self.config
        sent = self._ping_sent_at
        if sent is not None:
            if self._last_received > sent:
                self._ping_sent_at = None  # the peer is alive: any bytes will do
            elif now >= sent + config.keepalive_timeout:
                self._close("keepalive PING not acknowledged")
                return math.inf
            else:
                return sent + config.keepalive_timeout
        due = self._last_received + config.keepalive_time
        if now < due:
            return due
        if not (self.calls or config.keepalive_permit_without_calls):
            return now + config.keepalive_time
        if self._sends != self._sends_at_keepalive:
            self._sends_at_keepalive = self._sends
            self._keepalives_without_data = 0
        if config.max_pings_without_data and self._keepalives_without_data >= config.max_pings_without_data:
            return now + config.keepalive_time  # gRPC core sends no more until data goes out
        self._keepalives_without_data += 1
        self._ping_sent_at = now
        self.engine.ping(_KEEPALIVE_PING)
        await self._flush()
        return now + config.keepalive_timeout

    # ---- calls ----------------------------------------------------------------------------

    def _open_call(self, stream_id: int, headers: Sequence[tuple[bytes, bytes]], ended: bool, data: Any = None,
                   flow: int = 0) -> bool:
        """A new stream: the one way a call starts. Refused (draining, over the stream limit,
        headers that ask for what is not served), or a :class:`Call`: a streaming method, or a
        unary one without ``Method.now``, starts its task now; a unary call with ``Method.now``
        waits without a task until its message is in (:meth:`_dispatch`).

        ``data`` and ``flow``: the stream's first DATA, read with its HEADERS and ending the
        stream (the usual unary call). When it carries exactly one whole uncompressed message
        within the limits and budgets, the call runs here and now (:meth:`_run_now`) without
        its message decoder, queue or wake-up, and True is returned (the DATA is consumed);
        otherwise False, and the DATA goes the usual way (:meth:`_handle`)."""
        if self._draining:
            self._reset_quietly(stream_id, http2.REFUSED_STREAM)
            return False
        if len(self.calls) >= self.config.max_concurrent_streams:
            # RFC 9113 §5.1.2: a stream error; the engine decoded the block, so HPACK stays in step
            self._reset_quietly(stream_id, http2.REFUSED_STREAM)
            if not self.guard.stream_refused(self._last_received):
                self.abuse = self.guard.abuse
            return False
        parsed = self._parsed(headers)
        if len(parsed) == 3:  # refused: (status, message, http status)
            self._refuse(stream_id, ended, *parsed)
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
            self._ack(flow, stream_id)
            self._run_now(call, entry, message)
            return True
        if ended:
            call._ended = True
        elif entry.now is not None:
            call.deferred = entry  # its message is still to come: see _dispatch
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
        if size < 0 or size > self.config.max_message_size or size > self._room():
            return None
        flag, length = framing.PREFIX.unpack_from(data)
        if flag or length != size:
            return None
        return bytearray(data[framing.PREFIX_SIZE:])

    def _parsed(self, headers: Sequence[tuple[bytes, bytes]]) -> tuple[Any, ...]:
        """:meth:`_parse_headers`, remembered for a header tuple the engine hands out again."""
        cached = self._parsed_headers.get(id(headers))
        if cached is not None and cached[0] is headers:
            return cached[1]  # type: ignore[no-any-return]
        parsed = self._parse_headers(headers)
        if isinstance(headers, tuple):  # the engine's decode cache hands out the same tuple again
            if len(self._parsed_headers) >= _PARSED_HEADERS_CACHE:
                self._parsed_headers.clear()
            self._parsed_headers[id(headers)] = (headers, parsed)  # holds headers: the id stays unique
        return parsed

    def _dispatch(self, call: Call) -> None:
        """A deferred unary call's stream moved (a message, its end, an error or a reset).

        Once its one message is in and the client has half-closed, it runs here and now
        (``Method.now``): decoded, inferred inline and answered into the engine's buffer,
        which the read loop flushes after the chunk, with no task, cancel scope or lock of
        its own. Anything else (a reset, an error, a compressed or second message, an
        expired deadline, a handler that must wait, a response the windows cannot take at
        once) starts the call's task, which finishes it the usual way.
        """
        if not (call._ended or call.reset or call._error is not None or len(call._queue) > 1):
            return  # END_STREAM is still to come
        method = call.deferred
        assert method is not None and method.now is not None and self._nursery is not None
        call.deferred = None
        if (call.reset or call._error is not None or len(call._queue) != 1 or call._queue[0][0]
                or (call.deadline != math.inf and trio.current_time() >= call.deadline)):
            self._nursery.start_soon(self._run_call, call, method)
            return
        _, message, _ = call._take()
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
                status, text = _status_of(e, call.path)
                self._end_call(call, status, text)
                self._forget(call)
            return
        finally:
            self._answering = False
        if self.calls.get(call.stream_id) is call and call.later is None and not call.tasked:
            log.error("gRPC handler for %s gave the call no answer", call.path)
            self._end_call(call, GRPC_INTERNAL, "the handler gave no answer")
            self._forget(call)

    def _answer(self, call: Call, parts: Parts, size: int) -> None:
        """:meth:`Call.answer`: queued in the engine's buffer when the windows take it whole (and
        written now, unless the read loop is answering and flushes after its chunk), else sent
        by a task of the call's. Dropped when the call is over (see :meth:`_answerable`)."""
        call.later = None
        if self.calls.get(call.stream_id) is not call or call.reset or self._broken:
            return
        if self._send_now(call, parts, size):
            self._end_call(call, GRPC_OK, "")
            self._forget(call)
            if not self._answering:
                self._kick()
            return
        self._start_call(call, reply=(parts, size))

    def _answer_error(self, call: Call, error: Exception) -> None:
        """:meth:`Call.fail`."""
        if not self._answerable(call):
            return
        status, text = _status_of(error, call.path)
        self._end_call(call, status, text)
        self._forget(call)
        if not self._answering:
            self._kick()

    def _start_call(self, call: Call, awaiting: Awaitable[tuple[Parts, int]] | None = None,
                    reply: tuple[Parts, int] | None = None) -> None:
        """Give a call answered by ``Method.now`` the task that finishes it (:meth:`_run_call`)."""
        assert call.method is not None and self._nursery is not None
        call.tasked = True
        self._nursery.start_soon(self._run_call, call, call.method, awaiting, reply)

    def _answerable(self, call: Call) -> bool:
        """Whether a call answered later is still waiting for its answer (it is then no longer)."""
        call.later = None
        return self.calls.get(call.stream_id) is call and not call.reset and not self._broken

    def _send_now(self, call: Call, parts: Parts, size: int) -> bool:
        """Queue a small response message in the engine at once, when no compression applies
        and the windows take it whole; False (nothing queued) otherwise."""
        if size >= _WRITEV_SIZE or (call.compress_responses and call.response_encoding is not None
                                    and self.config.compression_level):
            return False
        engine = self.engine
        stream_id = call.stream_id
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
            engine.send_headers(stream_id, _RESPONSE_HEADERS)
            call._headers_sent = True
            self._sends += 1
            frame_size = engine.max_outbound_frame_size
            view = memoryview(message)
            for pos in range(0, framed, frame_size):
                engine.send_data(stream_id, view[pos:pos + frame_size])
                frames += 1
        except http2.StreamClosedError:
            return True  # the stream is gone: nothing more goes out on it (its trailers neither)
        finally:
            if frames:
                self._sends += 1
                self.guard.data_sent(frames)
        return True

    def _parse_headers(self, headers: Sequence[tuple[bytes, bytes]]) -> tuple[Any, ...]:
        """What a request header list asks for: ``(path, method entry, encoding, timeout
        seconds or None, response encoding or None)``, or ``(status, message, http status)`` to refuse it.
        Depends on the headers alone (so it is cached for a header tuple the engine repeats)."""
        size = 0
        for key, value in headers:
            size += len(key) + len(value) + 32
        if size > self.config.max_header_list_size:
            return (GRPC_RESOURCE_EXHAUSTED, f"request header list of {size} bytes exceeds the limit of "
                                             f"{self.config.max_header_list_size}", b"200")
        fields = dict(headers)
        method = fields.get(b":method")
        content_type = fields.get(b"content-type", b"")
        path = fields.get(b":path", b"").decode("latin-1")
        if method != b"POST":
            return GRPC_UNIMPLEMENTED, "gRPC requires the POST method", b"405"
        if not (content_type == b"application/grpc" or content_type.startswith((b"application/grpc+proto",
                                                                                   b"application/grpc;"))):
            return (GRPC_INVALID_ARGUMENT, f"invalid gRPC request content-type {content_type.decode('latin-1')!r}",
                    b"415")
        entry = self.methods.get(path)
        if entry is None:
            service, _, name = path.lstrip("/").rpartition("/")
            known = any(p.startswith(f"/{service}/") for p in self.methods) if service else False
            text = f"unknown method {name} for service {service}" if known else f"unknown service {service or path}"
            return GRPC_UNIMPLEMENTED, text, b"200"
        encoding_raw = fields.get(b"grpc-encoding")
        encoding = encoding_raw.decode("latin-1") if encoding_raw is not None else None
        timeout = None
        try:
            framing.check_encoding(encoding)
            timeout_raw = fields.get(b"grpc-timeout")
            if timeout_raw is not None:
                timeout = framing.parse_timeout(timeout_raw)
        except FramingError as e:
            return e.status, e.message, b"200"
        except (ValueError, UnicodeDecodeError) as e:
            return GRPC_INVALID_ARGUMENT, str(e), b"200"
        return path, entry, encoding, timeout, framing.response_encoding(fields.get(b"grpc-accept-encoding", b""))

    def _refuse(self, stream_id: int, ended: bool, status: int, message: str, http_status: bytes = b"200") -> None:
        """Answer a stream with a trailers-only response (no handler runs)."""
        headers = [(b":status", http_status), (b"content-type", b"application/grpc"),
                   (b"grpc-status", str(status).encode()),
                   (b"grpc-message", framing.encode_grpc_message(message).encode("ascii"))]
        if status == GRPC_UNIMPLEMENTED:
            headers.append((b"grpc-accept-encoding", framing.ACCEPT_ENCODING.encode()))
        self.engine.send_headers(stream_id, headers, end_stream=True)
        self._sends += 1
        if not ended:
            self._reset_quietly(stream_id)

    def _reset_quietly(self, stream_id: int, error_code: int = http2.NO_ERROR) -> None:
        """RST_STREAM unless the stream is already closed: NO_ERROR after our trailers when the
        client has not finished its side; REFUSED_STREAM for a stream refused at open, which the
        client may have reset in the same chunk as its HEADERS (the engine read both first)."""
        try:
            self.engine.reset_stream(stream_id, error_code)
        except http2.StreamClosedError:
            pass

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
                await self._flush()
        finally:
            self._forget(call)

    def _end_call(self, call: Call, status: int | None, message: str) -> bool:
        """Queue the call's trailers (none for status None or a reset stream); True when queued."""
        self.calls.pop(call.stream_id, None)
        if status is None or call.reset:
            return False
        try:
            self.engine.send_headers(call.stream_id, call._trailers(status, message), end_stream=True)
        except http2.StreamClosedError:
            return False  # the stream was closed under us
        self._sends += 1
        self.guard.call_completed()
        if not call._ended:
            self._reset_quietly(call.stream_id)
        return True

    def _forget(self, call: Call) -> None:
        """The call is over: what it held is released, the idle timer starts with the last one."""
        self.calls.pop(call.stream_id, None)
        call._release()
        if not self.calls:
            self._idle_since = now = self._now()
            if self.config.idle_timeout:
                self._arm(now + self.config.idle_timeout)
        self._maybe_close()

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
            return _status_of(e, call.path)
        if scope.cancelled_caught:
            return (None, "") if call.reset else (GRPC_DEADLINE_EXCEEDED, "Deadline Exceeded")
        return GRPC_OK, ""

    # ---- sending --------------------------------------------------------------------------

    def _ack(self, size: int, stream_id: int) -> None:
        if size:
            self.engine.acknowledge_received_data(size, stream_id)

    def _send_headers(self, stream_id: int, headers: Sequence[tuple[bytes, bytes]]) -> None:
        try:
            self.engine.send_headers(stream_id, headers)
        except http2.StreamClosedError:
            raise _StreamGone() from None
        self._sends += 1

    async def _send_data(self, call: Call, data: bytes, flush: bool) -> None:
        view = memoryview(data)
        pos, end = 0, len(view)
        h2c = self.engine
        frames = 0
        while pos < end:
            if call.reset:
                raise _StreamGone()
            try:
                window = h2c.local_flow_control_window(call.stream_id)
                frame_size = h2c.max_outbound_frame_size
                while window > 0 and pos < end:
                    n = min(window, frame_size, end - pos)
                    h2c.send_data(call.stream_id, view[pos : pos + n])
                    pos += n
                    window -= n
                    frames += 1
            except http2.StreamClosedError:
                raise _StreamGone() from None
            finally:
                if frames:
                    self._sends += 1
                    self.guard.data_sent(frames)
                    frames = 0
            if pos < end:
                await self._wait_for_window(call)
        if flush:
            await self._flush()

    async def _wait_for_window(self, call: Call) -> None:
        """Flush what is queued, then, if ``call``'s send window is still closed, wait until the
        peer widens a window (the caller asks again). Raises _StreamGone."""
        waiter = self._window_event
        await self._flush()
        try:
            window = self.engine.local_flow_control_window(call.stream_id)
        except http2.StreamClosedError:
            raise _StreamGone() from None
        if window <= 0:
            await waiter.wait()

    async def _send_views(self, call: Call, views: list[memoryview], size: int) -> None:
        """Send one framed message given as byte views (a plain TCP connection and trident's
        engine): DATA frames as the windows allow, each batch written with ``writev`` behind
        what the engine has queued, so nothing is copied. Cancelled with the call."""
        h2c: Any = self.engine
        while size > 0:
            if call.reset:
                raise _StreamGone()
            try:
                window = h2c.local_flow_control_window(call.stream_id)
            except http2.StreamClosedError:
                raise _StreamGone() from None
            if window <= 0:
                await self._wait_for_window(call)
                continue
            n = min(window, size)
            chunk, views = _split_views(views, n)
            try:
                buffers, frames = h2c.data_frames(call.stream_id, chunk, n)
            except http2.StreamClosedError:
                raise _StreamGone() from None
            self._sends += 1
            self.guard.data_sent(frames)
            size -= n
            await self._write_views(buffers)

    async def _write_views(self, buffers: list[Any]) -> None:
        """Write what the engine has queued, then ``buffers``, in order, in the connection's
        turn (other writes wait behind them); on a broken connection, cancels every call."""
        io = self.io
        await io.wait_turn()
        queued = self.engine.data_to_send()
        if queued:
            buffers.insert(0, queued)
        if not io.write_now(buffers):
            await io.write_rest(buffers)
        if io.broken:
            await self._broken_connection()

    async def _flush(self) -> None:
        """Write whatever the engine has queued, behind the write in progress (without a
        checkpoint when nothing is queued, nor on a socket that takes it all at once while no
        other write is in progress). On a broken connection, cancels every call."""
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
                await self._broken_connection()

    def _kick(self) -> None:
        """Write what the engine queued, from a task that cannot wait for the socket (a call
        answered later, by another task): at once when the socket takes it all, the rest by a
        task of the connection that holds its turn; behind a write in progress, by a task of
        the connection (once, whatever it finds queued then)."""
        engine = self.engine
        if self._broken or not engine.has_data_to_send():
            return
        io = self.io
        if io.busy is None:
            data = engine.data_to_send()
            if data:
                io.write_soon([data])
            if io.broken:
                self._break()
            return
        if not self._flush_queued and self._nursery is not None:
            self._flush_queued = True
            self._nursery.start_soon(self._queued_flush)

    async def _queued_flush(self) -> None:
        self._flush_queued = False
        await self._flush()

    async def _broken_connection(self) -> None:
        """A write failed: nothing more is sent, every call is cancelled, the reader stops."""
        self._break()
        await trio.lowlevel.checkpoint()

    def _break(self) -> None:
        self._broken = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._reader_scope.cancel()


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


class _StreamGone(Exception):
    """The client reset the stream or the connection closed under a send."""


def _status_of(error: Exception, path: str) -> tuple[int | None, str]:
    leaf: BaseException = error
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    if isinstance(leaf, (GrpcError, FramingError)):
        return leaf.status, leaf.message
    if isinstance(leaf, TritonError):
        return leaf.grpc_status, leaf.message
    if isinstance(leaf, _StreamGone):
        return None, ""
    log.error("gRPC handler for %s failed", path, exc_info=error)
    return GRPC_INTERNAL, f"{type(leaf).__name__}: {leaf}"
