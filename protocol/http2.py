"""The server side of HTTP/2 (RFC 9113) as gRPC needs it, sans-IO: bytes in, events and bytes out.

:class:`H2Server` is a pure state machine. :meth:`H2Server.receive_data` takes one chunk of
the client's byte stream and returns the events it completed; everything the server must send
(SETTINGS, ACKs, WINDOW_UPDATEs, RST_STREAMs, GOAWAY, responses) accumulates in one buffer that
:meth:`H2Server.data_to_send` hands out, so the transport writes once per loop pass.

Events are tuples whose first item is the kind:

* ``(REQUEST, stream_id, headers, end_stream)``: a new stream's request header block, decoded
  and validated (RFC 9113 §8.2, §8.3); ``headers`` is a tuple of ``(name, value)`` bytes pairs,
  shared with the decode cache (never mutate it);
* ``(DATA, stream_id, data, flow_length, end_stream)``: payload bytes of an open stream, a
  ``memoryview`` slice of the chunk passed in when that chunk is immutable (``bytes``, or a
  ``memoryview`` of ``bytes``), else a copy (``bytes``) -- a large DATA frame spread over
  several chunks comes out as several events, never accumulated; whole DATA frames of one
  stream that follow each other in a chunk come out as one event whose ``data`` is the
  ``list`` of their slices (a 1 MiB message in 16 KiB frames: a few events, not 64), so
  ``data`` is a bytes-like object or a list of them; ``flow_length`` (padding included, all
  the frames') is what the consumer passes to :meth:`H2Server.acknowledge_received_data` once
  it has taken the bytes;
* ``(TRAILERS, stream_id, headers)``: the request's trailers; the stream's remote side ended;
* ``(RESET, stream_id, error_code)``: the client reset the stream, or the stream failed with a
  stream error (§5.4.2; the RST_STREAM is queued already);
* ``(WINDOW, stream_id)``: send window grew (``stream_id`` 0: the connection's, or a SETTINGS
  change of INITIAL_WINDOW_SIZE / MAX_FRAME_SIZE);
* ``(PING, data)`` (already acknowledged), ``(PING_ACK, data)``;
* ``(GOAWAY, error_code, last_stream_id, debug_data)``.

Connection errors (§5.4.1) queue a GOAWAY with the error code and raise :class:`ProtocolError`;
the connection is then dead (later input is ignored). Stream errors queue a RST_STREAM and,
for a stream the consumer knows, give a RESET event.

HPACK (RFC 7541: decoding :mod:`trident.protocol.hpack_decoder`, encoding the ``hpack``
library's) is behind :class:`~trident.protocol.http2_headers.HeaderCodec`
with its two caches: decoded (and validated) request header blocks keyed by the block's bytes,
and encoded response blocks keyed by the header tuple, each used only while the HPACK table it
depends on is unchanged, so a cached result is exactly what decoding or encoding would give.

Every count and size the client controls is bounded: header blocks (``max_header_block``
compressed bytes, ``max_header_list_hard`` decoded; the work of one call: a block of
``header_step`` bytes or more is decoded in pieces, see :class:`H2Server`), open streams
(``max_open_streams``; past it REFUSED_STREAM), the memory of streams reset (a bounded set),
buffered partial frames (one frame, at most ``max_frame_size``; while a block is decoded in
pieces, the input given meanwhile: the transport reads no more until then). Control-frame
floods are counted by the transport's :class:`~trident.protocol.h2_guard.FrameGuard`.

Nothing here does I/O, reads a clock or imports trident's server layers.
"""

from __future__ import annotations

import re
import struct
from collections import deque
from collections.abc import Generator, Sequence
from typing import Any, NoReturn

from hpack.exceptions import HPACKError, OversizedHeaderListError

from trident.protocol.http2_headers import HeaderCodec, validate_trailers

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types (§6) and flags
DATA_FRAME, HEADERS_FRAME, PRIORITY_FRAME, RST_STREAM_FRAME, SETTINGS_FRAME = 0, 1, 2, 3, 4
PUSH_PROMISE_FRAME, PING_FRAME, GOAWAY_FRAME, WINDOW_UPDATE_FRAME, CONTINUATION_FRAME = 5, 6, 7, 8, 9
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

# error codes (§7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT = 0, 1, 2, 3, 4
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
CONNECT_ERROR, ENHANCE_YOUR_CALM, INADEQUATE_SECURITY, HTTP_1_1_REQUIRED = 10, 11, 12, 13

# settings (§6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 1, 2, 3, 4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, ENABLE_CONNECT_PROTOCOL = 5, 6, 8

# event kinds
REQUEST, DATA, TRAILERS, RESET, WINDOW, PING, PING_ACK, GOAWAY = range(1, 9)

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
MIN_FRAME_SIZE = 16384
MAX_FRAME_SIZE_LIMIT = 2**24 - 1

_HEADER = struct.Struct(">HBBBL")  # 24-bit length as H+B, type, flags, stream id
#: an object's repr in an error message ("<memory at 0x7f...>"): its address stays out of the
#: GOAWAY debug data (it tells the client nothing, differs from run to run and leaks a pointer)
_ADDRESS = re.compile(r"<([\w.]+) at 0x[0-9a-fA-F]+>")
_SETTING = struct.Struct(">HL")
_U32 = struct.Struct(">L")
_GOAWAY = struct.Struct(">LL")


_RESET_MEMORY = 1024  # streams reset (by either side) whose late frames are dropped quietly


class ProtocolError(Exception):
    """A connection error (RFC 9113 §5.4.1): a GOAWAY with ``error_code`` is queued already."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


class StreamClosedError(Exception):
    """A send on a stream that is not open for sending (reset, ended, or never opened)."""


class FlowControlError(Exception):
    """A DATA send larger than the flow-control window (the caller checks the window first)."""


def _add_data(events: list[Any], stream_id: int, data: Any, flow: int, ended: bool) -> None:
    """Add a DATA event of ``data`` (a chunk, or a list of them), joined to the event just
    before it when that is DATA of the same stream (adjacent frames: one event, flows summed)."""
    last = events[-1] if events else None
    if last is None or last[0] != DATA or last[1] != stream_id:
        events.append((DATA, stream_id, data, flow, ended))
        return
    parts = last[2] if type(last[2]) is list else [last[2]]
    if type(data) is list:
        parts += data
    else:
        parts.append(data)
    events[-1] = (DATA, stream_id, parts, last[3] + flow, ended)


class _HeaderWork:
    """A large header block being decoded in pieces, and what its completion needs."""

    __slots__ = ("steps", "stream_id", "flags", "self_dependent")

    def __init__(self, steps: Generator[None, None, tuple[tuple[tuple[bytes, bytes], ...], str | None]],
                 stream_id: int, flags: int, self_dependent: bool) -> None:
        self.steps = steps
        self.stream_id = stream_id
        self.flags = flags
        self.self_dependent = self_dependent


class _Stream:
    __slots__ = ("stream_id", "send_window", "recv_window", "recv_processed", "remote_ended", "local_ended")

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.stream_id = stream_id
        self.send_window = send_window
        self.recv_window = recv_window
        self.recv_processed = 0  # bytes acknowledged by the consumer, not yet given back
        self.remote_ended = False
        self.local_ended = False


def frame_header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """The 9-byte frame header (RFC 9113 §4.1)."""
    return _HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


class H2Server:
    """One server-side HTTP/2 connection (see the module docstring).

    ``max_header_list_size`` and ``max_concurrent_streams`` are advertised (the consumer applies
    them as stream errors); ``max_header_list_hard`` bounds a decoded header list (beyond it:
    GOAWAY ENHANCE_YOUR_CALM), ``max_header_block`` a compressed block (HEADERS + CONTINUATION;
    beyond it: GOAWAY ENHANCE_YOUR_CALM), ``max_open_streams`` the streams open at once (beyond
    it: RST_STREAM REFUSED_STREAM). ``connection_window``: the receive window of the connection,
    announced with the first SETTINGS. ``header_cache=False`` turns both HPACK caches off (the
    fuzz target compares the two).

    ``header_step`` bounds the HPACK work of one call: a header block of that many bytes or more
    is decoded in pieces of about that size. The call that completes such a block returns the
    events before it and leaves :attr:`header_work` set (the rest of its input kept); each
    :meth:`continue_headers` decodes one more piece, and the one that finishes the block
    returns its events and those of the input that followed (which may leave the next large
    block pending). Input given while a block is pending is kept behind it. 0: blocks decode whole.
    """

    def __init__(self, *, max_concurrent_streams: int = 100, initial_window_size: int = DEFAULT_WINDOW,
                 max_frame_size: int = MIN_FRAME_SIZE, max_header_list_size: int = 64 * 1024,
                 max_header_list_hard: int = 1024 * 1024, max_header_block: int = 256 * 1024,
                 max_open_streams: int = 1 << 16, connection_window: int = MAX_WINDOW,
                 header_cache: bool = True, header_step: int = 4 * 1024) -> None:
        if not MIN_FRAME_SIZE <= max_frame_size <= MAX_FRAME_SIZE_LIMIT:
            raise ValueError(f"max_frame_size {max_frame_size} outside [{MIN_FRAME_SIZE}, {MAX_FRAME_SIZE_LIMIT}]")
        if not 0 <= initial_window_size <= MAX_WINDOW or not DEFAULT_WINDOW <= connection_window <= MAX_WINDOW:
            raise ValueError("window size out of range")
        self.max_concurrent_streams = max_concurrent_streams
        self.local_initial_window = initial_window_size
        self.max_inbound_frame_size = max_frame_size
        self.max_header_list_size = max_header_list_size
        self.max_header_block = max_header_block
        self.max_open_streams = max_open_streams
        self._connection_window = connection_window
        #: the peer's SETTINGS_MAX_FRAME_SIZE: the largest DATA payload to send in one frame
        self.max_outbound_frame_size = MIN_FRAME_SIZE
        self.remote_initial_window = DEFAULT_WINDOW
        #: the highest stream id the client opened
        self.highest_inbound_stream_id = 0
        self.streams: dict[int, _Stream] = {}
        self.closed = False  # a connection error happened, or we sent GOAWAY for one
        self.goaway_received = False
        self._out = bytearray()
        self._in = bytearray()  # a partial frame (header, or a frame that is not DATA)
        self._preface = 0  # preface bytes matched so far (len(PREFACE): done)
        self._settings_seen = False
        self._send_window = DEFAULT_WINDOW  # connection send window
        self._recv_window = connection_window  # connection receive window
        self._recv_processed = 0
        # a DATA frame in progress across chunks
        self._data_left = 0  # payload bytes (padding excluded) still to come
        self._pad_left = 0
        self._data_stream: _Stream | None = None  # None: dropped (closed stream)
        self._data_end = False
        # a header block in progress: (stream id, flags of the HEADERS frame, fragments, size)
        self._block_stream = 0
        self._block_flags = 0
        self._block_parts: list[bytes] = []
        self._block_size = 0
        self._block_self_dependent = False
        self._reset: set[int] = set()
        self._reset_order: deque[int] = deque()
        #: HPACK with the decode and encode caches
        self.header_codec = HeaderCodec(max_header_list_hard, cache=header_cache)
        self.header_step = header_step
        #: a large header block being decoded in pieces (see the class docstring), else None
        self.header_work: _HeaderWork | None = None

    # ---- handshake ------------------------------------------------------------------------

    def initiate_connection(self) -> None:
        """Queue the server preface: SETTINGS (our limits) and the connection WINDOW_UPDATE."""
        payload = b"".join(_SETTING.pack(k, v) for k, v in (
            (MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
            (INITIAL_WINDOW_SIZE, self.local_initial_window),
            (MAX_FRAME_SIZE, self.max_inbound_frame_size),
            (MAX_HEADER_LIST_SIZE, self.max_header_list_size),
            (ENABLE_PUSH, 0),
        ))
        out = self._out
        out += frame_header(len(payload), SETTINGS_FRAME, 0, 0)
        out += payload
        if self._connection_window > DEFAULT_WINDOW:
            out += frame_header(4, WINDOW_UPDATE_FRAME, 0, 0)
            out += _U32.pack(self._connection_window - DEFAULT_WINDOW)

    def has_data_to_send(self) -> bool:
        """Whether anything is queued for the client."""
        return bool(self._out)

    def data_to_send(self) -> bytes | bytearray:
        """Everything queued for the client since the last call (b"" when nothing); the buffer
        itself is handed over, not copied (the caller owns it)."""
        data = self._out
        if not data:
            return b""
        self._out = bytearray()
        return data

    # ---- receiving ------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Consume one chunk of the client's bytes; returns the events it completed.

        Raises ProtocolError on a connection error (its GOAWAY queued; the connection is then
        closed and later input is ignored)."""
        if self.closed:
            return []
        events: list[Any] = []
        if self.header_work is not None:
            self._in += data  # behind the block being decoded
            return events
        try:
            self._receive(data, events)
        except ProtocolError:
            self.closed = True
            raise
        return events

    def continue_headers(self) -> list[Any]:
        """Decode the next piece of the pending large header block (:attr:`header_work`); once
        it is done, its events and those of the input kept behind it. Raises ProtocolError as
        :meth:`receive_data` does."""
        work = self.header_work
        events: list[Any] = []
        if work is None or self.closed:
            return events
        try:
            try:
                next(work.steps)
                return events
            except StopIteration as done:
                entry = done.value
            except HPACKError as e:
                self._hpack_failed(e)
            self.header_work = None
            self._header_block_decoded(work.stream_id, work.flags, entry, events, work.self_dependent)
            if self._in:  # the input kept behind the block, parsed as if it had just arrived
                kept = bytes(self._in)
                self._in.clear()
                self._frames(memoryview(kept), 0, events, owned=True)
        except ProtocolError:
            self.closed = True
            raise
        return events

    def _receive(self, data: bytes | bytearray | memoryview, events: list[Any]) -> None:
        if self._preface < len(PREFACE):
            need = len(PREFACE) - self._preface
            head = bytes(data[:need])
            if head != PREFACE[self._preface : self._preface + len(head)]:
                self._connection_error(PROTOCOL_ERROR, "invalid HTTP/2 connection preface")
            self._preface += len(head)
            data = data[len(head):]
            if self._preface < len(PREFACE):
                return
        # an immutable chunk (bytes, or a view of bytes: the transport's slices of a read) is
        # handed out in slices; anything else may change after the call and is copied
        owned = isinstance(data, bytes) or (isinstance(data, memoryview) and isinstance(data.obj, bytes))
        view = data if isinstance(data, memoryview) else memoryview(data)
        end = len(view)
        pos = 0
        if end and (self._data_left or self._pad_left):
            pos = self._continue_data(view, 0, events, owned)
        while self._in and self.header_work is None:  # complete what an earlier chunk began
            need = self._pending_need()
            if need:
                take = min(need, end - pos)
                self._in += view[pos : pos + take]
                pos += take
                if take < need:
                    return
                if self._pending_need():  # the header is whole now; the frame is not yet
                    continue
            buf = bytes(self._in)
            self._in.clear()
            self._frames(memoryview(buf), 0, events, owned=True)
        if pos < end:
            if self.header_work is not None:
                self._in += view[pos:end]
            else:
                self._frames(view, pos, events, owned)

    def _pending_need(self) -> int:
        """Bytes still missing from the first unit in ``_in``: a frame header, a whole frame
        that is not DATA, or a padded DATA frame's header and pad length (DATA streams); 0 when
        it is whole. ``_in`` holds more than one unit only behind a large header block
        (:attr:`header_work`): never less than 0, or :meth:`_receive` would loop on it."""
        buf = self._in
        if len(buf) < 9:
            return 9 - len(buf)
        if buf[3] == DATA_FRAME:
            return max(0, 10 - len(buf)) if buf[4] & FLAG_PADDED and (buf[0] or buf[1] or buf[2]) else 0
        length = (buf[0] << 16) | (buf[1] << 8) | buf[2]
        return max(0, 9 + length - len(buf))

    def _data_run(self, view: memoryview, pos: int, stream: _Stream, events: list[Any], owned: bool) -> int:
        """After a whole DATA frame of ``stream`` (its event last in ``events``): the whole DATA
        frames of the same stream that follow at ``pos``, added to that event, as long as each
        is plain (no flag but END_STREAM), within the frame size and both windows, and whole in
        the chunk. Returns where the run ends; the frame that ends it (anything else) is parsed
        the usual way, which raises what it must. The per-frame work of a large message in
        small frames (16 KiB: 64 per MiB) is a few lines here."""
        end = len(view)
        unpack = _HEADER.unpack_from
        stream_id = stream.stream_id
        max_size = self.max_inbound_frame_size
        room = min(self._recv_window, stream.recv_window)
        parts: list[Any] = []
        flow = 0
        ended = False
        while end - pos >= 9:
            hi, lo, kind, flags, sid = unpack(view, pos)
            length = (hi << 8) | lo
            if (kind != DATA_FRAME or sid != stream_id or flags & ~FLAG_END_STREAM or length > max_size
                    or flow + length > room or end - pos - 9 < length):
                break
            start = pos + 9
            pos = start + length
            parts.append(view[start:pos] if owned else bytes(view[start:pos]))
            flow += length
            if flags:  # END_STREAM
                ended = True
                break
        if not parts:
            return pos
        self._recv_window -= flow
        stream.recv_window -= flow
        _add_data(events, stream_id, parts, flow, ended)
        if ended:
            self._remote_end(stream)
        return pos

    def _continue_data(self, view: memoryview, pos: int, events: list[Any], owned: bool) -> int:
        """Pass on the rest of a DATA frame that began in an earlier chunk."""
        end = len(view)
        stream = self._data_stream
        take = min(self._data_left, end - pos)
        flow = take
        self._data_left -= take
        chunk = view[pos : pos + take]
        pos += take
        if not self._data_left and self._pad_left:
            pad = min(self._pad_left, end - pos)
            self._pad_left -= pad
            flow += pad
            pos += pad
        done = not self._data_left and not self._pad_left
        if stream is None:
            self._auto_ack(flow)
        elif take or flow:
            ended = done and self._data_end
            events.append((DATA, stream.stream_id, chunk if owned else bytes(chunk), flow, ended))
            if ended:
                self._remote_end(stream)
        elif done and self._data_end:
            events.append((DATA, stream.stream_id, b"", 0, True))
            self._remote_end(stream)
        return pos

    def _frames(self, view: memoryview, pos: int, events: list[Any], owned: bool) -> int:
        """Parse whole frames from ``view[pos:]``; a partial one is kept (DATA streams)."""
        end = len(view)
        unpack = _HEADER.unpack_from
        max_size = self.max_inbound_frame_size
        while pos < end:
            if self._data_left or self._pad_left:
                pos = self._continue_data(view, pos, events, owned)
                continue
            if end - pos < 9:
                self._in += view[pos:end]
                return end
            hi, lo, kind, flags, stream_id = unpack(view, pos)
            length = (hi << 8) | lo
            stream_id &= 0x7FFFFFFF
            if length > max_size:
                self._connection_error(FRAME_SIZE_ERROR, f"frame of {length} bytes exceeds SETTINGS_MAX_FRAME_SIZE")
            if not self._settings_seen:
                if kind != SETTINGS_FRAME or flags & FLAG_ACK:
                    self._connection_error(PROTOCOL_ERROR, "the client's first frame is not SETTINGS")
            if self._block_stream and kind != CONTINUATION_FRAME:
                self._connection_error(PROTOCOL_ERROR, "header block interrupted by another frame")
            start = pos + 9
            if kind == DATA_FRAME:
                pos = self._data_frame(view, start, length, flags, stream_id, events, owned)
                continue
            if end - start < length:
                self._in += view[pos:end]
                return end
            payload = view[start : start + length]
            pos = start + length
            if kind == HEADERS_FRAME or kind == CONTINUATION_FRAME:
                if kind == HEADERS_FRAME:
                    self._headers_frame(payload, flags, stream_id, events)
                else:
                    self._continuation_frame(payload, flags, stream_id, events)
                if self.header_work is not None:  # a large block to decode in pieces: keep the rest
                    self._in += view[pos:end]
                    return end
            elif kind == SETTINGS_FRAME:
                self._settings_frame(payload, flags, stream_id, events)
            elif kind == WINDOW_UPDATE_FRAME:
                self._window_update_frame(payload, stream_id, events)
            elif kind == PING_FRAME:
                self._ping_frame(payload, flags, stream_id, events)
            elif kind == RST_STREAM_FRAME:
                self._rst_stream_frame(payload, stream_id, events)
            elif kind == PRIORITY_FRAME:
                self._priority_frame(payload, stream_id, events)
            elif kind == GOAWAY_FRAME:
                self._goaway_frame(payload, stream_id, events)
            elif kind == PUSH_PROMISE_FRAME:
                self._connection_error(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
            # unknown frame types are ignored (§4.1, §5.5)
        return pos

    # ---- DATA -----------------------------------------------------------------------------

    def _data_frame(self, view: memoryview, start: int, length: int, flags: int, stream_id: int,
                    events: list[Any], owned: bool) -> int:
        end = len(view)
        if stream_id == 0:
            self._connection_error(PROTOCOL_ERROR, "DATA on stream 0")
        pad = 0
        body = start
        if flags & FLAG_PADDED:
            if not length:
                self._connection_error(FRAME_SIZE_ERROR, "padded DATA without a pad length")
            if end - start < 1:  # the pad length has not arrived: keep the header
                self._in += view[start - 9 : end]
                return end
            pad = view[start]
            body = start + 1
            if pad >= length:
                self._connection_error(PROTOCOL_ERROR, "DATA padding exceeds the payload")
        data_length = length - pad - (body - start)
        # flow control (§6.9): the whole payload counts
        if length > self._recv_window:
            self._connection_error(FLOW_CONTROL_ERROR, "DATA exceeds the connection's flow-control window")
        self._recv_window -= length
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_ended:
            if stream is None and stream_id > self.highest_inbound_stream_id:
                self._connection_error(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if stream is not None:  # half-closed (remote): §5.1
                self._stream_error(stream_id, STREAM_CLOSED, events)
            elif stream_id not in self._reset:
                self._send_rst(stream_id, STREAM_CLOSED)
            target = None
        elif length > stream.recv_window:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)
            target = None
        else:
            stream.recv_window -= length
            target = stream
        ended = bool(flags & FLAG_END_STREAM)
        have = end - body
        if have >= data_length + pad:  # the whole frame is here
            pos = body + data_length + pad
            if target is None:
                self._auto_ack(length)
            else:
                chunk = view[body : body + data_length] if owned else bytes(view[body : body + data_length])
                _add_data(events, stream_id, chunk, length, ended)
                if ended:
                    self._remote_end(target)
                else:
                    pos = self._data_run(view, pos, target, events, owned)
            return pos
        # the frame goes on in later chunks: pass on what is here now
        take = min(have, data_length)
        pad_here = have - take  # < pad: the frame is not whole
        self._data_left = data_length - take
        self._pad_left = pad - pad_here
        self._data_stream = target
        self._data_end = ended
        flow = take + pad_here + (body - start)
        if target is None:
            self._auto_ack(flow)
        elif flow:
            chunk = view[body : body + take] if owned else bytes(view[body : body + take])
            events.append((DATA, stream_id, chunk, flow, False))
        return end

    def _auto_ack(self, size: int) -> None:
        """Give back the connection window of DATA dropped here (its stream is gone)."""
        if size:
            self._ack_connection(size)

    def acknowledge_received_data(self, size: int, stream_id: int) -> None:
        """The consumer took ``size`` flow-controlled bytes of ``stream_id``: widen the windows
        again (WINDOW_UPDATE once half a window is used, as h2 does)."""
        if size <= 0:
            return
        self._ack_connection(size)
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_ended:
            return
        stream.recv_processed, increment = self._window_update(
            stream.recv_processed + size, self.local_initial_window, stream.recv_window, stream_id)
        stream.recv_window += increment

    def _ack_connection(self, size: int) -> None:
        self._recv_processed, increment = self._window_update(
            self._recv_processed + size, self._connection_window, self._recv_window, 0)
        self._recv_window += increment

    def _window_update(self, processed: int, limit: int, window: int, stream_id: int) -> tuple[int, int]:
        """A window's bookkeeping once ``processed`` bytes were consumed since its last update:
        ``(processed left to count, increment granted)``; the WINDOW_UPDATE is queued when half
        the window is used (or it is closed and a little was used), as h2 does."""
        if processed < limit // 2 and not (window == 0 and processed > min(1024, limit // 4)):
            return processed, 0
        increment = min(processed, limit - window)
        if increment > 0:
            self._out += frame_header(4, WINDOW_UPDATE_FRAME, 0, stream_id)
            self._out += _U32.pack(increment)
        return 0, max(increment, 0)

    # ---- HEADERS and CONTINUATION ---------------------------------------------------------

    def _headers_frame(self, payload: memoryview, flags: int, stream_id: int, events: list[Any]) -> None:
        if stream_id == 0:
            self._connection_error(PROTOCOL_ERROR, "HEADERS on stream 0")
        pos, end = 0, len(payload)
        if flags & FLAG_PADDED:
            if end < 1:
                self._connection_error(FRAME_SIZE_ERROR, "padded HEADERS without a pad length")
            pad = payload[0]
            pos = 1
            end -= pad
            if end < pos:
                self._connection_error(PROTOCOL_ERROR, "HEADERS padding exceeds the payload")
        if flags & FLAG_PRIORITY:
            if end - pos < 5:
                self._connection_error(FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            pos += 5
        fragment = bytes(payload[pos:end])
        if len(fragment) > self.max_header_block:
            self._connection_error(ENHANCE_YOUR_CALM, "header_block_too_large")
        self_dependent = bool(flags & FLAG_PRIORITY) and self._depends_on_self(
            payload, 1 if flags & FLAG_PADDED else 0, stream_id)
        if flags & FLAG_END_HEADERS:
            self._header_block(stream_id, flags, fragment, events, self_dependent)
        else:
            self._block_self_dependent = self_dependent
            self._block_stream = stream_id
            self._block_flags = flags
            self._block_parts = [fragment]
            self._block_size = len(fragment)

    @staticmethod
    def _depends_on_self(payload: memoryview, pos: int, stream_id: int) -> bool:
        return bool((_U32.unpack_from(payload, pos)[0] & 0x7FFFFFFF) == stream_id)

    def _continuation_frame(self, payload: memoryview, flags: int, stream_id: int, events: list[Any]) -> None:
        if not self._block_stream or stream_id != self._block_stream:
            self._connection_error(PROTOCOL_ERROR, "CONTINUATION without a header block in progress on its stream")
        self._block_size += len(payload)
        if self._block_size > self.max_header_block:
            self._connection_error(ENHANCE_YOUR_CALM, "header_block_too_large")
        self._block_parts.append(bytes(payload))
        if flags & FLAG_END_HEADERS:
            block = b"".join(self._block_parts)
            self._block_parts = []
            self._block_stream = 0
            first = self._block_flags
            self._header_block(stream_id, first, block, events, self._block_self_dependent)

    def _decode(self, block: bytes) -> tuple[tuple[tuple[bytes, bytes], ...], str | None]:
        """Decode a header block (HPACK state follows every block). Raises ProtocolError:
        ENHANCE_YOUR_CALM for a list over the hard limit, COMPRESSION_ERROR for bad HPACK."""
        try:
            return self.header_codec.decode(block)
        except HPACKError as e:
            self._hpack_failed(e)

    def _hpack_failed(self, e: HPACKError) -> NoReturn:
        if isinstance(e, OversizedHeaderListError):
            self._connection_error(ENHANCE_YOUR_CALM, "decoded header list exceeds the limit")
        reason = _ADDRESS.sub(r"<\1>", str(e))
        self._connection_error(COMPRESSION_ERROR, f"HPACK decoding failed: {reason}")

    def _header_block(self, stream_id: int, flags: int, block: bytes, events: list[Any],
                      self_dependent: bool) -> None:
        # always decoded: the HPACK state must follow every block
        if self.header_step and len(block) >= self.header_step:
            steps = self.header_codec.decode_steps(block, self.header_step)
            self.header_work = _HeaderWork(steps, stream_id, flags, self_dependent)
            return
        self._header_block_decoded(stream_id, flags, self._decode(block), events, self_dependent)

    def _header_block_decoded(self, stream_id: int, flags: int, entry: tuple[tuple[tuple[bytes, bytes], ...], str | None],
                              events: list[Any], self_dependent: bool) -> None:
        headers, request_error = entry
        ended = bool(flags & FLAG_END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers (§8.1)
            if stream.remote_ended:
                self._stream_error(stream_id, STREAM_CLOSED, events)
            elif not ended or validate_trailers(headers) is not None:
                self._stream_error(stream_id, PROTOCOL_ERROR, events)
            else:
                events.append((TRAILERS, stream_id, headers))
                self._remote_end(stream)
            return
        if stream_id <= self.highest_inbound_stream_id:
            if stream_id not in self._reset:
                self._send_rst(stream_id, STREAM_CLOSED)  # a closed stream (§5.1)
            return
        if not stream_id & 1:
            self._connection_error(PROTOCOL_ERROR, f"client stream id {stream_id} is even")
        self.highest_inbound_stream_id = stream_id
        if self_dependent or request_error is not None:
            self._send_rst(stream_id, PROTOCOL_ERROR)  # malformed request: a stream error (§8.1.1)
            return
        if len(self.streams) >= self.max_open_streams:
            self._send_rst(stream_id, REFUSED_STREAM)
            return
        stream = _Stream(stream_id, self.remote_initial_window, self.local_initial_window)
        self.streams[stream_id] = stream
        events.append((REQUEST, stream_id, headers, ended))
        if ended:
            stream.remote_ended = True  # a stream never both ends here: we have not answered

    def _remote_end(self, stream: _Stream) -> None:
        stream.remote_ended = True
        if stream.local_ended:
            del self.streams[stream.stream_id]

    # ---- control frames -------------------------------------------------------------------

    def _settings_frame(self, payload: memoryview, flags: int, stream_id: int, events: list[Any]) -> None:
        if stream_id:
            self._connection_error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & FLAG_ACK:
            if len(payload):
                self._connection_error(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            self._connection_error(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        self._settings_seen = True
        changed = False
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == ENABLE_PUSH or key == ENABLE_CONNECT_PROTOCOL:
                if value > 1:
                    self._connection_error(PROTOCOL_ERROR, f"setting {key} must be 0 or 1")
            elif key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    self._connection_error(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta = value - self.remote_initial_window
                self.remote_initial_window = value
                if delta:
                    for stream in self.streams.values():
                        stream.send_window += delta
                        if stream.send_window > MAX_WINDOW:
                            self._connection_error(FLOW_CONTROL_ERROR, "stream window over 2^31-1")
                    changed = True
            elif key == MAX_FRAME_SIZE:
                if not MIN_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT:
                    self._connection_error(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                if value != self.max_outbound_frame_size:
                    self.max_outbound_frame_size = value
                    changed = True
            elif key == HEADER_TABLE_SIZE:
                # the encoder's table may not exceed it; a size update goes in the next block
                self.header_codec.set_peer_table_size(value)
            # MAX_CONCURRENT_STREAMS (we push nothing), MAX_HEADER_LIST_SIZE, unknown: no action
        self._out += frame_header(0, SETTINGS_FRAME, FLAG_ACK, 0)
        if changed:
            events.append((WINDOW, 0))

    def _window_update_frame(self, payload: memoryview, stream_id: int, events: list[Any]) -> None:
        if len(payload) != 4:
            self._connection_error(FRAME_SIZE_ERROR, "WINDOW_UPDATE length is not 4")
        increment = _U32.unpack_from(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if not increment:
                self._connection_error(PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                self._connection_error(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            events.append((WINDOW, 0))
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.highest_inbound_stream_id:
                self._connection_error(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
            return  # closed: ignored
        if not increment:
            self._stream_error(stream_id, PROTOCOL_ERROR, events)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, events)
            return
        events.append((WINDOW, stream_id))

    def _ping_frame(self, payload: memoryview, flags: int, stream_id: int, events: list[Any]) -> None:
        if stream_id:
            self._connection_error(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            self._connection_error(FRAME_SIZE_ERROR, "PING length is not 8")
        data = bytes(payload)
        if flags & FLAG_ACK:
            events.append((PING_ACK, data))
        else:
            self._out += frame_header(8, PING_FRAME, FLAG_ACK, 0)
            self._out += data
            events.append((PING, data))

    def _rst_stream_frame(self, payload: memoryview, stream_id: int, events: list[Any]) -> None:
        if stream_id == 0:
            self._connection_error(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            self._connection_error(FRAME_SIZE_ERROR, "RST_STREAM length is not 4")
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            if stream_id > self.highest_inbound_stream_id:
                self._connection_error(PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
            return
        self._remember_reset(stream_id)
        if self._data_stream is stream:
            self._data_stream = None
        events.append((RESET, stream_id, _U32.unpack_from(payload)[0]))

    def _priority_frame(self, payload: memoryview, stream_id: int, events: list[Any]) -> None:
        if stream_id == 0:
            self._connection_error(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error(stream_id, FRAME_SIZE_ERROR, events)  # §6.3: a stream error
        # otherwise ignored (§5.3.2); a stream depending on itself is harmless without priorities

    def _goaway_frame(self, payload: memoryview, stream_id: int, events: list[Any]) -> None:
        if stream_id:
            self._connection_error(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            self._connection_error(FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
        last, code = _GOAWAY.unpack_from(payload)
        self.goaway_received = True
        events.append((GOAWAY, code, last & 0x7FFFFFFF, bytes(payload[8:])))

    # ---- errors ---------------------------------------------------------------------------

    def _connection_error(self, code: int, message: str) -> NoReturn:
        """Queue GOAWAY(code) and raise ProtocolError."""
        debug = message.encode("ascii", "replace")[:256]
        self._out += frame_header(8 + len(debug), GOAWAY_FRAME, 0, 0)
        self._out += _GOAWAY.pack(self.highest_inbound_stream_id, code)
        self._out += debug
        raise ProtocolError(code, message)

    def _stream_error(self, stream_id: int, code: int, events: list[Any]) -> None:
        """RST_STREAM(code) on an open stream, which the consumer hears of as RESET."""
        stream = self.streams.pop(stream_id, None)
        self._send_rst(stream_id, code)
        if stream is not None:
            if self._data_stream is stream:
                self._data_stream = None
            events.append((RESET, stream_id, code))

    def _send_rst(self, stream_id: int, code: int) -> None:
        self._out += frame_header(4, RST_STREAM_FRAME, 0, stream_id)
        self._out += _U32.pack(code)
        self._remember_reset(stream_id)

    def _remember_reset(self, stream_id: int) -> None:
        if stream_id in self._reset:
            return
        self._reset.add(stream_id)
        order = self._reset_order
        order.append(stream_id)
        if len(order) > _RESET_MEMORY:
            self._reset.discard(order.popleft())

    # ---- sending --------------------------------------------------------------------------

    def _open_stream(self, stream_id: int) -> _Stream:
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_ended:
            raise StreamClosedError(f"stream {stream_id} is not open for sending")
        return stream

    def send_headers(self, stream_id: int, headers: Sequence[tuple[bytes, bytes]], end_stream: bool = False) -> None:
        """Queue a HEADERS frame (response headers or trailers), with CONTINUATIONs when the
        block exceeds the peer's frame size. Raises StreamClosedError."""
        stream = self._open_stream(stream_id)
        block = self.header_codec.encode(headers)
        out = self._out
        size = self.max_outbound_frame_size
        flags = FLAG_END_STREAM if end_stream else 0
        if len(block) <= size:
            out += frame_header(len(block), HEADERS_FRAME, flags | FLAG_END_HEADERS, stream_id)
            out += block
        else:
            out += frame_header(size, HEADERS_FRAME, flags, stream_id)
            out += block[:size]
            pos = size
            while pos < len(block):
                piece = block[pos : pos + size]
                pos += len(piece)
                out += frame_header(len(piece), CONTINUATION_FRAME, FLAG_END_HEADERS if pos >= len(block) else 0,
                                    stream_id)
                out += piece
        if end_stream:
            self._local_end(stream)

    def send_data(self, stream_id: int, data: bytes | bytearray | memoryview, end_stream: bool = False) -> None:
        """Queue ``data`` as DATA frames of at most the peer's frame size.

        Raises StreamClosedError, FlowControlError when ``data`` exceeds the window
        (:meth:`local_flow_control_window`)."""
        stream = self._open_stream(stream_id)
        size = len(data)
        if size > stream.send_window or size > self._send_window:
            raise FlowControlError(f"{size} bytes exceed the flow-control window")
        stream.send_window -= size
        self._send_window -= size
        out = self._out
        frame = self.max_outbound_frame_size
        if size <= frame:
            out += frame_header(size, DATA_FRAME, FLAG_END_STREAM if end_stream else 0, stream_id)
            out += data
        else:
            view = memoryview(data)
            pos = 0
            while pos < size:
                n = min(frame, size - pos)
                last = pos + n >= size
                out += frame_header(n, DATA_FRAME, FLAG_END_STREAM if end_stream and last else 0, stream_id)
                out += view[pos : pos + n]
                pos += n
        if end_stream:
            self._local_end(stream)

    def data_frames(self, stream_id: int, parts: Sequence[memoryview], size: int) -> tuple[list[Any], int]:
        """DATA frames carrying ``parts`` (byte views, ``size`` bytes in all) as buffers to write,
        in order, after what :meth:`data_to_send` returns: frame headers and slices of
        ``parts``, nothing copied (the caller writes them before the views change). Returns
        ``(buffers, frames)``. Raises as :meth:`send_data` (the stream does not end here)."""
        stream = self._open_stream(stream_id)
        if size > stream.send_window or size > self._send_window:
            raise FlowControlError(f"{size} bytes exceed the flow-control window")
        stream.send_window -= size
        self._send_window -= size
        frame = self.max_outbound_frame_size
        full = frame_header(frame, DATA_FRAME, 0, stream_id)  # every frame but the last
        out: list[Any] = []
        frames = 0
        index = offset = 0
        left = size
        while left > 0:
            if left > frame:
                n = frame
                out.append(full)
            else:
                n = left
                out.append(frame_header(n, DATA_FRAME, 0, stream_id))
            frames += 1
            left -= n
            part = parts[index]
            if len(part) - offset > n:  # inside one part (most frames of a large message)
                out.append(part[offset:offset + n])
                offset += n
                continue
            while n:
                part = parts[index]
                take = min(n, len(part) - offset)
                out.append(part[offset:offset + take])
                offset += take
                n -= take
                if offset == len(part):
                    index += 1
                    offset = 0
        return out, frames

    def _local_end(self, stream: _Stream) -> None:
        stream.local_ended = True
        if stream.remote_ended:
            del self.streams[stream.stream_id]

    def local_flow_control_window(self, stream_id: int) -> int:
        """Bytes of DATA that may be sent on ``stream_id`` now. Raises StreamClosedError."""
        stream = self._open_stream(stream_id)
        window = stream.send_window
        return window if window < self._send_window else self._send_window

    def reset_stream(self, stream_id: int, error_code: int = NO_ERROR) -> None:
        """Queue RST_STREAM and forget the stream. Raises StreamClosedError when it is closed."""
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            raise StreamClosedError(f"stream {stream_id} is closed")
        if self._data_stream is stream:
            self._data_stream = None
        self._send_rst(stream_id, error_code)

    def ping(self, data: bytes) -> None:
        """Queue a PING with 8 bytes of ``data``."""
        if len(data) != 8:
            raise ValueError("PING data must be 8 bytes")
        self._out += frame_header(8, PING_FRAME, 0, 0)
        self._out += data

    def goaway(self, error_code: int = NO_ERROR, debug_data: bytes = b"", last_stream_id: int | None = None) -> None:
        """Queue a GOAWAY (the streams already open may still be answered)."""
        last = self.highest_inbound_stream_id if last_stream_id is None else last_stream_id
        self._out += frame_header(8 + len(debug_data), GOAWAY_FRAME, 0, 0)
        self._out += _GOAWAY.pack(last, error_code)
        self._out += debug_data
