"""One RPC as its handler sees it (:class:`Call`), the handler contract (:class:`Method`,
:class:`GrpcError`) and how a handler's exception becomes a gRPC status (:func:`status_of`).

A :class:`Call` is driven by its connection (:class:`trident.grpc.transport.Connection`, its
:class:`CallHost`): DATA of its stream arrives through ``_on_data`` and becomes request
messages (:meth:`Call.recv`; a stream with complete messages its handler has not taken gets no
more window until the handler catches up), and responses go out through the connection's
:class:`~trident.grpc.outbound.Outbound` (:meth:`Call.send_message`). A unary method with a
``Method.now`` handler answers its call without a task where it can (:meth:`Call.answer`,
:meth:`Call.fail`, :meth:`Call.answer_later`, :meth:`Call.run`).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from trident.errors import GRPC_INTERNAL, GRPC_OK, GRPC_RESOURCE_EXHAUSTED, TritonError
from trident.grpc.budget import ConnectionBudget
from trident.grpc.config import TransportConfig
from trident.grpc.outbound import (
    RESPONSE_HEADERS,
    RESPONSE_HEADERS_DEFLATE,
    RESPONSE_HEADERS_GZIP,
    WRITEV_SIZE,
    Outbound,
    Parts,
    StreamGone,
)
from trident.protocol import grpc_framing as framing
from trident.protocol.grpc_framing import FramingError
from trident.server import worker_threads

log = logging.getLogger("trident.grpc")

_INLINE_INFLATE = 1024 * 1024  # gzip output inflated on the event loop; the rest in worker threads
_THREAD_INFLATE = 16 * 1024 * 1024  # gzip output per worker-thread step (cancellation between steps)
_TRAILERS_OK = ((b"grpc-status", b"0"),)
_TRAILERS_ONLY_OK = (*RESPONSE_HEADERS, *_TRAILERS_OK)


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


class CallHost(Protocol):
    """What a :class:`Call` uses of its connection (trident.grpc.transport.Connection)."""

    config: TransportConfig
    budget: ConnectionBudget  # the request bytes the connection holds
    out: Outbound  # its outgoing frames
    calls: dict[int, Call]  # its calls still running, by stream

    def message_started(self, call: Call) -> None:
        """A request message started arriving (its timeout starts)."""

    def dispatch(self, call: Call) -> None:
        """A call waiting without a task (``Method.now``) moved: run it if its message is in."""

    def forget(self, call: Call) -> None:
        """The call is over: release what it holds."""

    def answer(self, call: Call, parts: Parts, size: int) -> None:
        """:meth:`Call.answer`."""

    def answer_error(self, call: Call, error: Exception) -> None:
        """:meth:`Call.fail`."""

    def start_call(self, call: Call, awaiting: Awaitable[tuple[Parts, int]] | None = None,
                   reply: tuple[Parts, int] | None = None) -> None:
        """Give the call the task that finishes it."""


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

    def __init__(self, conn: CallHost, stream_id: int, path: str, headers: Sequence[tuple[bytes, bytes]],
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
        self._queue: deque[tuple[bool, bytearray | framing.Pieces]] = deque()

    @property
    def may_answer_later(self) -> bool:
        """Whether ``Method.now`` may answer this call later (:meth:`answer_later`): it has no
        deadline to watch (a call's deadline is its task's cancel scope)."""
        return self.deadline == math.inf

    def answer(self, parts: Parts, size: int) -> None:
        """The reply of a call answered by ``Method.now``, at once or later: sent now, or by a
        task of the connection's when the windows cannot take it at once. Never waits, never
        raises; dropped if the call is over."""
        self.conn.answer(self, parts, size)

    def fail(self, error: Exception) -> None:
        """End a call answered by ``Method.now``, at once or later, with the status of
        ``error`` (as a handler raising it). Never waits, never raises; dropped if the call is
        over."""
        self.conn.answer_error(self, error)

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
        self.conn.start_call(self, reply)

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
            conn.out.ack(flow_length, self.stream_id)
            return
        size = len(data) if type(data) is not list else sum(map(len, data))
        if size > conn.budget.room():
            self._fail(FramingError(GRPC_RESOURCE_EXHAUSTED, conn.budget.refusal(size)))
            conn.out.ack(flow_length, self.stream_id)
            return
        held = bool(self._queue)
        decoder = self._decoder
        if decoder is None:
            decoder = self._decoder = framing.MessageDecoder(conn.config.max_message_size)
        try:
            messages = decoder.feed(data)
        except FramingError as e:
            self._fail(e)
            conn.out.ack(flow_length, self.stream_id)
            return
        if held:
            self._unacked += flow_length
        else:
            conn.out.ack(flow_length, self.stream_id)
        if messages:
            self._queue.extend(messages)
            for _, message in messages:
                self._queued += len(message)
        now_held = decoder.buffered + self._queued
        if now_held != self._held:
            conn.budget.charge(now_held - self._held)
            self._held = now_held
        if decoder.partial:
            if messages or self.partial_since == math.inf:
                conn.message_started(self)
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
            self.conn.budget.charge(-self._held)
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
            self.conn.forget(self)
            return
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None
        elif self.deferred is not None:
            self.conn.dispatch(self)

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
        compressed, payload, acked = self._take()
        if acked:
            await self.conn.out.flush()
        # a large payload that came in pieces is joined in a worker thread (see framing.Pieces)
        message = payload if type(payload) is bytearray else await self.run_sync(payload.join)
        del payload
        if compressed:
            if self.encoding in (None, "identity"):
                raise FramingError(GRPC_INTERNAL, "compressed message received without a grpc-encoding")
            return await self._inflate(message)
        return message

    def _take(self) -> tuple[bool, bytearray | framing.Pieces, bool]:
        """The next queued message ``(compressed, message, window returned)``: it no longer
        counts against the budgets, and the window held back for the queue returns with the
        last one (the caller flushes)."""
        compressed, message = self._queue.popleft()
        size = len(message)
        self._queued -= size
        self._held -= size
        self.conn.budget.charge(-size)
        if not self._queue and self._unacked:
            self.conn.out.ack(self._unacked, self.stream_id)
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
                if _THREAD_INFLATE > conn.budget.room():
                    raise FramingError(GRPC_RESOURCE_EXHAUSTED, conn.budget.refusal(_THREAD_INFLATE))
                conn.budget.charge(_THREAD_INFLATE)
                charged += _THREAD_INFLATE
                if await self.run_sync(inflater.step, _THREAD_INFLATE):
                    return inflater.output
        finally:
            conn.budget.charge(-charged)

    async def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in one of the server's worker threads and wait for it.

        The call's task owns the thread: cancellation is noticed before the thread starts and
        after it returns, never by abandoning it. Raises what ``fn`` raises."""
        return await worker_threads.run_sync(fn, *args, limiter=self.conn.budget.server.limiter)

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
        conn = self.conn
        framing.check_size(size, conn.config.max_message_size, "sent")
        encoding = self.response_encoding if self.compress_responses and conn.config.compression_level else None
        out = conn.out
        if encoding is None and size >= WRITEV_SIZE and out.io.fd >= 0 and hasattr(out.engine, "data_frames"):
            # a large message is written from its parts (headers and views: no copy)
            if not self._headers_sent:
                self._headers_sent = True
                out.headers(self.stream_id, RESPONSE_HEADERS)
            views = [memoryview(framing.frame_prefix(size))]
            views += [memoryview(p).cast("B") for p in parts if len(p)]
            await out.views(self, views, size + framing.PREFIX_SIZE)
            return
        if encoding is not None:
            payload = framing.gzip_compress(b"".join(parts), conn.config.compression_level, encoding)
            message = framing.frame([payload], len(payload), compressed=True)
        else:
            message = framing.frame(parts, size)
        if not self._headers_sent:
            self._headers_sent = True
            out.headers(self.stream_id, _response_headers(encoding))
        await out.data(self, message, flush)

    def _trailers(self, status: int, message: str) -> tuple[tuple[bytes, bytes], ...]:
        if status == GRPC_OK and not message:
            return _TRAILERS_OK if self._headers_sent else _TRAILERS_ONLY_OK
        trailers: tuple[tuple[bytes, bytes], ...] = () if self._headers_sent else RESPONSE_HEADERS
        trailers += ((b"grpc-status", str(status).encode()),)
        if message:
            trailers += ((b"grpc-message", framing.encode_grpc_message(message).encode("ascii")),)
        return trailers


def _response_headers(encoding: str | None) -> tuple[tuple[bytes, bytes], ...]:
    if encoding is None:
        return RESPONSE_HEADERS
    return RESPONSE_HEADERS_GZIP if encoding == "gzip" else RESPONSE_HEADERS_DEFLATE


def status_of(error: Exception, path: str) -> tuple[int | None, str]:
    """The status and message a call ends with when its handler raised ``error`` (None: the
    stream is gone, nothing to send). Anything but GrpcError, FramingError or TritonError is
    INTERNAL, logged with its traceback."""
    leaf: BaseException = error
    while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
        leaf = leaf.exceptions[0]
    if isinstance(leaf, (GrpcError, FramingError)):
        return leaf.status, leaf.message
    if isinstance(leaf, TritonError):
        return leaf.grpc_status, leaf.message
    if isinstance(leaf, StreamGone):
        return None, ""
    log.error("gRPC handler for %s failed", path, exc_info=error)
    return GRPC_INTERNAL, f"{type(leaf).__name__}: {leaf}"
