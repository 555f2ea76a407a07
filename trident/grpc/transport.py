"""gRPC over HTTP/2 on trio and h2: one connection, one task and cancel scope per call.

:class:`Connection` drives an ``h2`` state machine over a trio stream. Each request stream
becomes a :class:`Call` run by its own task in the connection's nursery, under a cancel scope
that RST_STREAM from the client, the ``grpc-timeout`` deadline and the connection's end cancel
(and with it whatever the handler awaits, inference included).

Flow control: DATA belonging to a message still being received is acknowledged at once (the
size limit bounds it), while a stream with complete messages its handler has not yet taken gets
no more window until the handler catches up, so a slow handler holds at most one stream window
of buffered data and never stalls the other streams (the connection window is widened to the
maximum). Sends wait for the peer's windows; a peer that never reads blocks only its own calls.

Handlers are :class:`Method` entries keyed by ``/package.Service/Method``. A unary handler gets
the request message and returns the response as ``(parts, size)``; a streaming handler uses
:meth:`Call.recv` and :meth:`Call.send_message`. Handlers raise :class:`GrpcError`,
:class:`~trident.errors.TritonError` (status from :func:`trident.errors.grpc_status`) or
:class:`~trident.protocol.grpc_framing.FramingError`; anything else answers INTERNAL.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio
from hyperframe.frame import DataFrame, GoAwayFrame

from trident.errors import (
    GRPC_DEADLINE_EXCEEDED,
    GRPC_INTERNAL,
    GRPC_INVALID_ARGUMENT,
    GRPC_OK,
    GRPC_UNIMPLEMENTED,
    TritonError,
)
from trident.protocol import grpc_framing as framing
from trident.protocol.grpc_framing import FramingError

log = logging.getLogger("trident.grpc")


def _data_frame_repr(frame: DataFrame) -> str:
    return f"data=<{len(frame.data)} bytes>"


# h2 logs repr(frame) for every frame it receives, eagerly, whatever the logger; hyperframe's
# DATA frame repr serializes and hex-encodes the whole payload to show 10 bytes of it, which cost
# ~15% of the server's CPU with 1 MiB tensors. Only the repr changes.
setattr(DataFrame, "_body_repr", _data_frame_repr)  # noqa: B010

Parts = Sequence[Any]  # buffers: bytes, bytearray, memoryview or 1-D uint8 numpy arrays

_RECEIVE_SIZE = 256 * 1024
_MAX_WINDOW = 2**31 - 1
_H2_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)


class GrpcError(Exception):
    """End the call with this gRPC status and message."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Method:
    """A handler: unary ``(call, message) -> (parts, size)`` or streaming ``(call) -> None``."""

    handler: Callable[..., Awaitable[Any]]
    streaming: bool = False


@dataclass(frozen=True)
class TransportConfig:
    """HTTP/2 and gRPC limits of one server (trident.grpc.serve.transport_config builds it from the options)."""

    max_message_size: int = framing.DEFAULT_MAX_MESSAGE_SIZE
    max_concurrent_streams: int = 1000
    initial_window_size: int = 1024 * 1024
    max_frame_size: int = 1024 * 1024
    compression_level: int = 0  # gzip level for responses a handler marks compressible; 0 = off


class Call:
    """One RPC as its handler sees it. Created and driven by :class:`Connection`."""

    def __init__(self, conn: Connection, stream_id: int, path: str, headers: list[tuple[bytes, bytes]],
                 deadline: float, encoding: str | None, accepts_gzip: bool) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.path = path
        self.headers = headers
        self.deadline = deadline
        self.encoding = encoding
        self.accepts_gzip = accepts_gzip
        #: set by a handler whose responses may be gzip-compressed (when the client accepts it)
        self.compress_responses = False
        self.reset = False
        self.scope: trio.CancelScope | None = None
        self._decoder = framing.MessageDecoder(conn.config.max_message_size)
        self._queue: deque[tuple[bool, bytearray]] = deque()
        self._ended = False
        self._error: FramingError | None = None
        self._unacked = 0
        self._wakeup: trio.Event | None = None
        self._headers_sent = False
        self._send_lock: trio.Lock | None = None  # created by the first send_message

    @property
    def metadata(self) -> list[tuple[str, str | bytes]]:
        """Application metadata (``-bin`` values decoded). Raises GrpcError on bad base64."""
        try:
            return framing.decode_metadata(self.headers)
        except ValueError as e:
            raise GrpcError(GRPC_INTERNAL, str(e)) from None

    # ---- receiving ------------------------------------------------------------------------

    def _on_data(self, data: bytes, flow_length: int) -> None:
        if self._error is not None:
            self.conn._ack(flow_length, self.stream_id)
            return
        held = bool(self._queue)
        try:
            messages = self._decoder.feed(data)
        except FramingError as e:
            self._error = e
            messages = []
            held = False
        if held:
            self._unacked += flow_length
        else:
            self.conn._ack(flow_length, self.stream_id)
        self._queue.extend(messages)
        self._wake()

    def _on_end(self) -> None:
        self._ended = True
        self._wake()

    def _on_reset(self) -> None:
        self.reset = True
        if self.scope is not None:
            self.scope.cancel()
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    async def recv(self) -> bytearray | None:
        """The next request message, or None once the client has half-closed.

        Raises FramingError: RESOURCE_EXHAUSTED for a message over the size limit, INTERNAL
        for a stream that ends inside a message or a compressed message without an encoding.
        """
        while not self._queue:
            if self._error is not None:
                raise self._error
            if self._ended:
                self._decoder.close()
                return None
            self._wakeup = event = trio.Event()
            await event.wait()
        compressed, message = self._queue.popleft()
        if not self._queue and self._unacked:
            self.conn._ack(self._unacked, self.stream_id)
            self._unacked = 0
            await self.conn._flush()
        if compressed:
            if self.encoding in (None, "identity"):
                raise FramingError(GRPC_INTERNAL, "compressed message received without a grpc-encoding")
            return bytearray(framing.gzip_decompress(message, self.conn.config.max_message_size))
        return message

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
        compressed = bool(self.compress_responses and self.accepts_gzip and self.conn.config.compression_level)
        if compressed:
            payload = framing.gzip_compress(b"".join(parts), self.conn.config.compression_level)
            message = framing.frame([payload], len(payload), compressed=True)
        else:
            message = framing.frame(parts, size)
        if not self._headers_sent:
            self._headers_sent = True
            self.conn._send_headers(self.stream_id, _response_headers(compressed))
        await self.conn._send_data(self, message, flush)

    def _trailers(self, status: int, message: str) -> list[tuple[bytes, bytes]]:
        trailers = [] if self._headers_sent else _response_headers(False)
        trailers.append((b"grpc-status", str(status).encode()))
        if message:
            trailers.append((b"grpc-message", framing.encode_grpc_message(message).encode("ascii")))
        return trailers


def _response_headers(compressed: bool) -> list[tuple[bytes, bytes]]:
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc"),
               (b"grpc-accept-encoding", framing.ACCEPT_ENCODING.encode())]
    if compressed:
        headers.append((b"grpc-encoding", b"gzip"))
    return headers


class Connection:
    """One HTTP/2 connection. :meth:`run` serves it until the peer leaves or a drain completes."""

    def __init__(self, stream: trio.abc.Stream, methods: dict[str, Method], config: TransportConfig) -> None:
        self.stream = stream
        self.methods = methods
        self.config = config
        self.h2 = h2.connection.H2Connection(_H2_CONFIG)
        self.calls: dict[int, Call] = {}
        self._send_lock = trio.StrictFIFOLock()
        self._window_event = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._reader_scope = trio.CancelScope()
        self._drain = trio.Event()
        self._draining = False
        self._broken = False

    # ---- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the peer disconnects, a protocol error, or a requested drain finishes.

        Cancelling it cancels every call on the connection.
        """
        h2c = self.h2
        # Our settings go in the first SETTINGS frame and apply at once: set with update_settings()
        # after initiate_connection() they would wait for the client's ACK, and a client opening
        # more than h2's default 100 streams before that ACK would get a connection error.
        h2c.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.config.max_concurrent_streams,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.config.initial_window_size,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: self.config.max_frame_size,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: h2c.DEFAULT_MAX_HEADER_LIST_SIZE,
        })
        h2c.max_inbound_frame_size = self.config.max_frame_size  # h2 copied the default in __init__
        h2c.initiate_connection()
        h2c.increment_flow_control_window(_MAX_WINDOW - 65535)  # the connection window starts at 65535
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._drainer)
                await self._flush()
                with self._reader_scope:
                    await self._read_loop()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if not self._broken:
                    with trio.move_on_after(1):
                        async with self._send_lock:
                            try:
                                self.h2.close_connection()
                                await self.stream.send_all(self.h2.data_to_send())
                            except (h2.exceptions.ProtocolError, trio.BrokenResourceError,
                                    trio.ClosedResourceError):
                                pass
                await trio.aclose_forcefully(self.stream)

    def start_drain(self) -> None:
        """Graceful shutdown: send GOAWAY, refuse new streams, close once the calls finish."""
        self._drain.set()

    async def _drainer(self) -> None:
        await self._drain.wait()
        self._draining = True
        # A GOAWAY written beside h2's state machine: h2's close_connection() would forbid
        # sending on the streams still running.
        goaway = GoAwayFrame(0)
        goaway.last_stream_id = self.h2.highest_inbound_stream_id
        goaway.error_code = h2.errors.ErrorCodes.NO_ERROR
        async with self._send_lock:
            await self._send_raw(self.h2.data_to_send() + goaway.serialize())
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self._draining and not self.calls:
            self._reader_scope.cancel()

    async def _read_loop(self) -> None:
        while True:
            try:
                data = await self.stream.receive_some(_RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._broken = True
                return
            if not data:
                return
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError as e:
                log.debug("HTTP/2 protocol error from peer: %s", e)
                await self._flush()
                self._broken = True  # h2 already queued (and we sent) its GOAWAY
                return
            for event in events:
                self._handle(event)
            await self._flush()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call._on_data(event.data, event.flow_controlled_length)
            else:
                self._ack(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.RequestReceived):
            self._open_call(event)
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call._on_end()
        elif isinstance(event, h2.events.StreamReset):
            call = self.calls.get(event.stream_id)
            if call is not None:
                call._on_reset()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._window_event.set()
            self._window_event = trio.Event()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._drain.set()
            if event.error_code != h2.errors.ErrorCodes.NO_ERROR:
                for call in self.calls.values():
                    call._on_reset()

    # ---- calls ----------------------------------------------------------------------------

    def _open_call(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        if self._draining:
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        headers = event.headers
        fields = dict(headers)
        ended = event.stream_ended is not None
        method = fields.get(b":method")
        content_type = fields.get(b"content-type", b"")
        path = fields.get(b":path", b"").decode("latin-1")
        if method != b"POST":
            self._refuse(stream_id, ended, GRPC_UNIMPLEMENTED, "gRPC requires the POST method", b"405")
            return
        if not (content_type == b"application/grpc" or content_type.startswith((b"application/grpc+proto",
                                                                                   b"application/grpc;"))):
            self._refuse(stream_id, ended, GRPC_INVALID_ARGUMENT,
                         f"invalid gRPC request content-type {content_type.decode('latin-1')!r}", b"415")
            return
        entry = self.methods.get(path)
        if entry is None:
            service, _, name = path.lstrip("/").rpartition("/")
            known = any(p.startswith(f"/{service}/") for p in self.methods) if service else False
            text = f"unknown method {name} for service {service}" if known else f"unknown service {service or path}"
            self._refuse(stream_id, ended, GRPC_UNIMPLEMENTED, text)
            return
        encoding_raw = fields.get(b"grpc-encoding")
        encoding = encoding_raw.decode("latin-1") if encoding_raw is not None else None
        deadline = math.inf
        try:
            framing.check_encoding(encoding)
            timeout = fields.get(b"grpc-timeout")
            if timeout is not None:
                deadline = trio.current_time() + framing.parse_timeout(timeout)
        except FramingError as e:
            self._refuse(stream_id, ended, e.status, e.message)
            return
        except ValueError as e:
            self._refuse(stream_id, ended, GRPC_INTERNAL, str(e))
            return
        accepts = fields.get(b"grpc-accept-encoding", b"")
        call = Call(self, stream_id, path, headers, deadline, encoding, b"gzip" in accepts)
        if ended:
            call._ended = True
        self.calls[stream_id] = call
        assert self._nursery is not None
        self._nursery.start_soon(self._run_call, call, entry)

    def _refuse(self, stream_id: int, ended: bool, status: int, message: str, http_status: bytes = b"200") -> None:
        """Answer a stream with a trailers-only response (no handler runs)."""
        headers = [(b":status", http_status), (b"content-type", b"application/grpc"),
                   (b"grpc-status", str(status).encode()),
                   (b"grpc-message", framing.encode_grpc_message(message).encode("ascii"))]
        if status == GRPC_UNIMPLEMENTED:
            headers.append((b"grpc-accept-encoding", framing.ACCEPT_ENCODING.encode()))
        self.h2.send_headers(stream_id, headers, end_stream=True)
        if not ended:
            self._reset_quietly(stream_id)

    def _reset_quietly(self, stream_id: int) -> None:
        """RST_STREAM(NO_ERROR) after our trailers, unless the client already finished its side."""
        try:
            self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
        except h2.exceptions.ProtocolError:
            pass

    async def _run_call(self, call: Call, method: Method) -> None:
        try:
            status, message = await self._invoke(call, method)
            self.calls.pop(call.stream_id, None)
            if status is None or call.reset:
                return
            try:
                self.h2.send_headers(call.stream_id, call._trailers(status, message), end_stream=True)
            except h2.exceptions.ProtocolError:
                return  # the stream was closed under us
            if not call._ended:
                self._reset_quietly(call.stream_id)
            await self._flush()
        finally:
            self.calls.pop(call.stream_id, None)
            self._maybe_close()

    async def _invoke(self, call: Call, method: Method) -> tuple[int | None, str]:
        """Run the handler; returns the status to end the call with (None: nothing to send)."""
        try:
            with trio.CancelScope(deadline=call.deadline) as scope:
                call.scope = scope
                if call.reset:
                    scope.cancel()
                if method.streaming:
                    await method.handler(call)
                else:
                    request = await call.recv_unary()
                    parts, size = await method.handler(call, request)
                    await call._send(parts, size, flush=False)  # flushed with the trailers
        except Exception as e:
            return _status_of(e, call.path)
        if scope.cancelled_caught:
            return (None, "") if call.reset else (GRPC_DEADLINE_EXCEEDED, "Deadline Exceeded")
        return GRPC_OK, ""

    # ---- sending --------------------------------------------------------------------------

    def _ack(self, size: int, stream_id: int) -> None:
        if size:
            self.h2.acknowledge_received_data(size, stream_id)

    def _send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        try:
            self.h2.send_headers(stream_id, headers)
        except h2.exceptions.ProtocolError:
            raise _StreamGone() from None

    async def _send_data(self, call: Call, data: bytes, flush: bool) -> None:
        view = memoryview(data)
        pos, end = 0, len(view)
        h2c = self.h2
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
            except h2.exceptions.ProtocolError:
                raise _StreamGone() from None
            if pos < end:
                waiter = self._window_event
                await self._flush()
                if h2c.local_flow_control_window(call.stream_id) <= 0:
                    await waiter.wait()
        if flush:
            await self._flush()

    async def _flush(self) -> None:
        """Write whatever h2 has queued. On a broken connection, cancels every call."""
        async with self._send_lock:
            data = self.h2.data_to_send()
            if data:
                await self._send_raw(data)

    async def _send_raw(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._broken = True
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
            self._reader_scope.cancel()
            await trio.lowlevel.checkpoint()


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
