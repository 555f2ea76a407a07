"""Sans-IO wire for the load generator: prebuilt request bytes and lean response parsers.

Nothing here touches a socket. The HTTP/1.1 side builds one keep-alive POST (the binary tensor
extension) whose bytes are sent unchanged for every request, and :class:`HTTPResponseReader`
finds where each response ends (``Content-Length``). The gRPC side encodes ``ModelInferRequest``
by hand (a few protobuf fields) and :class:`H2Connection` is a minimal HTTP/2 client: one
prebuilt HPACK block for every call (after the first, only indexes into the server's dynamic
table); response header blocks made only of indexes are decoded once and cached until a block
that may change the table arrives, DATA sent
within the peer's flow-control windows, and the received bytes handed back per stream.
:func:`decode_fields` is a generic protobuf reader for the few responses the tool looks into
(metadata, config, statistics, stream responses).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import hpack

from trident.protocol.http2_headers import table_neutral

__all__ = [
    "PerfError", "Tensor", "http_infer_request", "HTTPResponseReader", "grpc_infer_message",
    "H2Connection", "H2Event", "decode_fields", "grpc_messages",
]


class PerfError(Exception):
    """A one-line, user-facing failure of ``trident perf`` (exit status 1)."""


@dataclass(frozen=True)
class Tensor:
    """One input as sent: name, datatype, shape (batch included) and its raw bytes, or a
    shared-memory reference (``shm`` = (region, offset, byte size)) instead of bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes = b""
    shm: tuple[str, int, int] | None = None


# ------------------------------------------------------------------ HTTP/1.1


def http_infer_request(host: str, model: str, version: str, inputs: Sequence[Tensor], outputs: Sequence[str],
                       output_shm: dict[str, tuple[str, int, int]] | None = None,
                       parameters: dict[str, object] | None = None) -> bytes:
    """The whole keep-alive ``POST .../infer`` (head and binary-tensor body), to send as is."""
    head_inputs = []
    tail = []
    for t in inputs:
        entry: dict[str, object] = {"name": t.name, "shape": list(t.shape), "datatype": t.datatype}
        if t.shm is not None:
            entry["parameters"] = {"shared_memory_region": t.shm[0], "shared_memory_offset": t.shm[1],
                                   "shared_memory_byte_size": t.shm[2]}
        else:
            entry["parameters"] = {"binary_data_size": len(t.data)}
            tail.append(t.data)
        head_inputs.append(entry)
    head_outputs = []
    for name in outputs:
        if output_shm and name in output_shm:
            region, offset, size = output_shm[name]
            head_outputs.append({"name": name, "parameters": {
                "shared_memory_region": region, "shared_memory_offset": offset, "shared_memory_byte_size": size}})
        else:
            head_outputs.append({"name": name, "parameters": {"binary_data": True}})
    doc: dict[str, object] = {"inputs": head_inputs, "outputs": head_outputs}
    if parameters:
        doc["parameters"] = parameters
    header = json.dumps(doc, separators=(",", ":")).encode()
    body = header + b"".join(tail)
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


class HTTPResponseReader:
    """Finds response boundaries on one keep-alive connection.

    :meth:`feed` takes received bytes and returns the statuses (and, for an error, the first
    bytes of the body) of the responses that completed. Raises :class:`PerfError` for a
    response without ``Content-Length`` (chunked) or a malformed head."""

    MAX_HEAD = 64 * 1024

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need = -1  # body bytes still to come for the current response, -1: reading a head
        self._status = 0
        self._error_body = False
        self._last_ok = b""  # the last 200 response whole, when it came in one piece

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if data == self._last_ok and self._need < 0 and not self._buf:  # the same answer again
            return [(200, b"")]
        if self._need < 0 and not self._buf:
            done = self._feed(data)
            if len(done) == 1 and done[0][0] == 200 and not self._buf and self._need < 0 and len(data) < 4096:
                self._last_ok = data
            return done
        return self._feed(data)

    def _feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        done: list[tuple[int, bytes]] = []
        while True:
            if self._need < 0:
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > self.MAX_HEAD:
                        raise PerfError("response head larger than 64 KiB")
                    return done
                head = bytes(self._buf[:end])
                del self._buf[:end + 4]
                self._status, self._need = _parse_head(head)
                self._error_body = self._status != 200
            if len(self._buf) < self._need:
                if not self._error_body:  # keep only what an error message needs
                    self._need -= len(self._buf)
                    self._buf.clear()
                return done
            body = bytes(self._buf[:self._need]) if self._error_body else b""
            del self._buf[:self._need]
            done.append((self._status, body[:500]))
            self._need = -1


def _parse_head(head: bytes) -> tuple[int, int]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise PerfError(f"malformed HTTP response line {lines[0][:80]!r}")
    length = -1
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        low = name.strip().lower()
        if low == b"content-length":
            length = int(value.strip())
        elif low == b"transfer-encoding" and b"chunked" in value.lower():
            raise PerfError("chunked HTTP responses are not supported by the load generator")
    if length < 0:
        raise PerfError("HTTP response without Content-Length")
    return int(parts[1]), length


# ------------------------------------------------------------------ protobuf


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _parameter(key: str, value: object) -> bytes:
    if isinstance(value, bool):
        inner = _varint(1 << 3) + _varint(int(value))
    elif isinstance(value, int):
        inner = _varint(2 << 3) + _varint(value)
    else:
        inner = _field(3, str(value).encode())
    return _field(1, key.encode()) + _field(2, inner)


def grpc_infer_message(model: str, version: str, inputs: Sequence[Tensor], outputs: Sequence[str],
                       output_shm: dict[str, tuple[str, int, int]] | None = None,
                       parameters: dict[str, object] | None = None) -> bytes:
    """A serialized ``ModelInferRequest`` with the inputs in ``raw_input_contents``."""
    out = bytearray(_field(1, model.encode()))
    if version:
        out += _field(2, version.encode())
    for key, value in (parameters or {}).items():
        out += _field(4, _parameter(key, value))
    raws = []
    for t in inputs:
        tensor = _field(1, t.name.encode()) + _field(2, t.datatype.encode())
        tensor += _field(3, b"".join(_varint(d) for d in t.shape))
        if t.shm is not None:
            for key, value in (("shared_memory_region", t.shm[0]), ("shared_memory_offset", t.shm[1]),
                               ("shared_memory_byte_size", t.shm[2])):
                tensor += _field(4, _parameter(key, value))
        else:
            raws.append(t.data)
        out += _field(5, tensor)
    for name in outputs:
        tensor = _field(1, name.encode())
        if output_shm and name in output_shm:
            region, offset, size = output_shm[name]
            for key, value in (("shared_memory_region", region), ("shared_memory_offset", offset),
                               ("shared_memory_byte_size", size)):
                tensor += _field(2, _parameter(key, value))
        out += _field(6, tensor)
    for raw in raws:
        out += _field(7, raw)
    return bytes(out)


def decode_fields(buf: bytes) -> dict[int, list[object]]:
    """Protobuf fields of one message: number -> values (ints for varints, bytes for
    length-delimited). Raises :class:`PerfError` for a malformed message."""
    fields: dict[int, list[object]] = {}
    pos, end = 0, len(buf)
    try:
        while pos < end:
            key, pos = _read_varint(buf, pos)
            number, kind = key >> 3, key & 7
            value: object
            if kind == 0:
                value, pos = _read_varint(buf, pos)
            elif kind == 2:
                n, pos = _read_varint(buf, pos)
                if pos + n > end:
                    raise PerfError("truncated protobuf message")
                value, pos = buf[pos:pos + n], pos + n
            elif kind == 1:
                value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
            elif kind == 5:
                value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
            else:
                raise PerfError(f"unsupported protobuf wire type {kind}")
            fields.setdefault(number, []).append(value)
    except (IndexError, struct.error):
        raise PerfError("truncated protobuf message") from None
    return fields


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise PerfError("bad protobuf varint")


def grpc_messages(buf: bytearray) -> Iterator[bytes]:
    """Takes whole length-prefixed gRPC messages off the front of ``buf``."""
    while len(buf) >= 5:
        if buf[0] != 0:
            raise PerfError("compressed gRPC message received (none was asked for)")
        n = int.from_bytes(buf[1:5], "big")
        if len(buf) < 5 + n:
            return
        msg = bytes(buf[5:5 + n])
        del buf[:5 + n]
        yield msg


# ------------------------------------------------------------------ HTTP/2

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST, _SETTINGS, _PING, _GOAWAY, _WINDOW, _CONT = 0, 1, 3, 4, 6, 7, 8, 9
_END_STREAM, _END_HEADERS, _ACK = 0x1, 0x4, 0x1
_OUR_WINDOW = (1 << 31) - 1


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


@dataclass
class H2Event:
    """A call that ended: its stream, the gRPC status (-1 for an HTTP/2 reset), the message
    (grpc-message or reset reason) and, when ``keep_data`` was asked, the response body."""

    stream: int
    status: int
    message: str
    data: bytes = b""


@dataclass
class _Stream:
    pending: memoryview
    end_stream: bool
    window: int
    status: int | None = None
    message: str = ""
    body: bytearray = field(default_factory=bytearray)


class H2Connection:
    """Minimal HTTP/2 client for gRPC over cleartext (prior knowledge).

    ``initiate()`` returns the preface and SETTINGS to send first; ``start(path)`` opens a call
    and returns its stream id; ``send_message(stream, msg, end)`` queues a gRPC message;
    ``receive(data)`` consumes bytes and returns ended calls (:class:`H2Event`), plus, through
    :attr:`messages`, per-stream messages of open calls (for streaming). ``outgoing()`` returns
    (and clears) the bytes to write. Raises :class:`PerfError` on a protocol violation or GOAWAY.
    """

    def __init__(self, authority: str, keep_data: bool = False, collect_messages: bool = False) -> None:
        self.authority = authority
        self.keep_data = keep_data
        self.collect_messages = collect_messages
        self._out = bytearray()
        self._in = bytearray()
        self._next_stream = 1
        self._streams: dict[int, _Stream] = {}
        self._peer_initial_window = 65535
        self._conn_window = 65535
        self._max_frame = 16384
        self._unacked = 0
        self._decoder = hpack.Decoder()
        self._header_cache: dict[bytes, list[tuple[str, str]]] = {}
        self._blocks: dict[str, bytes] = {}
        self._encoder = hpack.Encoder()  # only the first request per path adds table entries
        self._indexed: set[str] = set()  # paths whose first (table-filling) block was sent
        self._templates: dict[tuple[str, bytes], tuple[bytearray, int]] = {}
        self._header_buf: dict[int, tuple[bytearray, int]] = {}
        self.messages: dict[int, bytearray] = {}
        #: a successful unary answer that came in one read: (its bytes, where its frames' stream
        #: ids are, its DATA length, the connection window it returns), see :func:`_whole_answer`
        self._answer: tuple[bytearray, tuple[int, ...], int, int] | None = None

    def initiate(self) -> bytes:
        settings = struct.pack(">HI", 0x2, 0) + struct.pack(">HI", 0x4, _OUR_WINDOW)
        return (_PREFACE + _frame(_SETTINGS, 0, 0, settings)
                + _frame(_WINDOW, 0, 0, struct.pack(">I", _OUR_WINDOW - 65535)))

    def _block(self, path: str) -> bytes:
        """The request's HPACK block: the first one for a path adds its fields to the server's
        dynamic table, every later one is the same few bytes of indexes."""
        block = self._blocks.get(path)
        if block is None:
            headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.authority),
                       ("content-type", "application/grpc"), ("te", "trailers")]
            first = self._encoder.encode(headers)
            self._blocks[path] = self._encoder.encode(headers)
            return first
        return block

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def start(self, path: str) -> int:
        self._indexed.add(path)
        return self._new_stream(self._block(path))

    def unary(self, path: str, message: bytes) -> tuple[int, bytes]:
        """Open a call that sends one message and ends: its stream id and every byte to write
        (from a template with the stream id patched in, when the message fits the windows)."""
        size = len(message) + 5
        if size > min(self._max_frame, self._peer_initial_window, self._conn_window) or self._out:
            stream = self.start(path)
            self.send_message(stream, message, end=True)
            return stream, self.outgoing()
        key = (path, message)
        template = self._templates.get(key)
        if template is None:
            block = self._block(path)
            if path not in self._indexed:  # the first block adds table entries: not a template
                self._indexed.add(path)
                stream = self._new_stream(block)
                self.send_message(stream, message, end=True)
                return stream, self.outgoing()
            head = _frame(_HEADERS, _END_HEADERS, 0, block)
            template = (bytearray(head + _frame(_DATA, _END_STREAM, 0, b"\x00" + struct.pack(">I", len(message))
                                                 + message)), len(head))
            if len(self._templates) < 64:
                self._templates[key] = template
        buf, at = template
        stream = self._next_stream
        self._next_stream += 2
        sid = struct.pack(">I", stream)
        buf[5:9] = sid
        buf[at + 5:at + 9] = sid
        self._streams[stream] = _Stream(memoryview(b""), False, self._peer_initial_window - size)
        self._conn_window -= size
        return stream, bytes(buf)

    def _new_stream(self, block: bytes) -> int:
        stream = self._next_stream
        self._next_stream += 2
        self._out += _frame(_HEADERS, _END_HEADERS, stream, block)
        self._streams[stream] = _Stream(memoryview(b""), False, self._peer_initial_window)
        if self.collect_messages:
            self.messages[stream] = bytearray()
        return stream

    def send_message(self, stream: int, message: bytes, end: bool) -> None:
        s = self._streams[stream]
        data = b"\x00" + struct.pack(">I", len(message)) + message
        s.pending = memoryview(bytes(s.pending) + data) if len(s.pending) else memoryview(data)
        s.end_stream = end
        self._flush(stream, s)

    def end(self, stream: int) -> None:
        s = self._streams.get(stream)
        if s is not None:
            s.end_stream = True
            self._flush(stream, s)

    def _flush(self, stream: int, s: _Stream) -> None:
        while len(s.pending):
            n = min(len(s.pending), s.window, self._conn_window, self._max_frame)
            if n <= 0:
                return
            chunk = s.pending[:n]
            s.pending = s.pending[n:]
            s.window -= n
            self._conn_window -= n
            last = not len(s.pending) and s.end_stream
            self._out += _frame(_DATA, _END_STREAM if last else 0, stream, bytes(chunk))
            if last:
                s.end_stream = False
                return
        if s.end_stream:
            self._out += _frame(_DATA, _END_STREAM, stream)
            s.end_stream = False

    def outgoing(self) -> bytes:
        if not self._out:
            return b""
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive(self, data: bytes) -> list[H2Event]:
        answer = self._answer
        if answer is not None and not self._in and len(data) == len(answer[0]):
            # the same whole answer again (a unary call's HEADERS, DATA and trailers in one read,
            # byte for byte but the stream id): its blocks leave the HPACK table as it is, so
            # nothing needs decoding (as HTTPResponseReader does for HTTP/1.1)
            buf, positions, data_length, window = answer
            sid = data[5:9]
            for at in positions:
                buf[at:at + 4] = sid
            if buf == data:
                stream = int.from_bytes(sid, "big") & 0x7FFFFFFF
                if self._streams.pop(stream, None) is not None:
                    self._count_data(data_length)
                    self._conn_window += window
                    return [H2Event(stream, 0, "")]
        fresh = not self._in
        self._in += data
        events: list[H2Event] = []
        buf = self._in
        while len(buf) >= 9:
            length = int.from_bytes(buf[0:3], "big")
            if len(buf) < 9 + length:
                break
            kind, flags = buf[3], buf[4]
            stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload = bytes(buf[9:9 + length])
            del buf[:9 + length]
            self._frame_in(kind, flags, stream, payload, events)
        if fresh and not buf and answer is None and not self.keep_data and not self.collect_messages \
                and len(events) == 1 and events[0].status == 0 and len(data) <= 4096:
            self._answer = _whole_answer(data, events[0].stream)
        return events

    def _count_data(self, n: int) -> None:
        self._unacked += n
        if self._unacked > (1 << 28):
            self._out += _frame(_WINDOW, 0, 0, struct.pack(">I", self._unacked))
            self._unacked = 0

    def _frame_in(self, kind: int, flags: int, stream: int, payload: bytes, events: list[H2Event]) -> None:
        if kind == _DATA:
            if flags & 0x8:  # padded
                payload = payload[1:len(payload) - payload[0]]
            self._count_data(len(payload))
            s = self._streams.get(stream)
            if s is not None:
                if self.collect_messages:
                    self.messages[stream] += payload
                elif self.keep_data:
                    s.body += payload
            if flags & _END_STREAM:
                self._close(stream, events)
        elif kind in (_HEADERS, _CONT):
            if kind == _HEADERS:
                if flags & 0x8:
                    payload = payload[1:len(payload) - payload[0]]
                if flags & 0x20:  # priority
                    payload = payload[5:]
                self._header_buf[stream] = (bytearray(payload), flags)
            else:
                if stream not in self._header_buf:
                    raise PerfError("HTTP/2 CONTINUATION without HEADERS")
                self._header_buf[stream][0].extend(payload)
            if flags & _END_HEADERS:
                block, first_flags = self._header_buf.pop(stream)
                self._headers(stream, bytes(block), bool(first_flags & _END_STREAM), events)
        elif kind == _SETTINGS:
            if not flags & _ACK:
                for i in range(0, len(payload) - 5, 6):
                    ident, value = struct.unpack_from(">HI", payload, i)
                    if ident == 0x4:
                        delta = value - self._peer_initial_window
                        self._peer_initial_window = value
                        for s in self._streams.values():
                            s.window += delta
                    elif ident == 0x5:
                        self._max_frame = value
                self._out += _frame(_SETTINGS, _ACK, 0)
                self._resume()
        elif kind == _PING:
            if not flags & _ACK:
                self._out += _frame(_PING, _ACK, 0, payload)
        elif kind == _WINDOW:
            inc = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
            if stream == 0:
                self._conn_window += inc
                self._resume()
            elif stream in self._streams:
                self._streams[stream].window += inc
                self._flush(stream, self._streams[stream])
        elif kind == _RST:
            code = struct.unpack(">I", payload[:4])[0]
            if stream in self._streams:
                self._streams.pop(stream)
                self.messages.pop(stream, None)
                events.append(H2Event(stream, -1, f"stream reset by the server (HTTP/2 error {code})"))
        elif kind == _GOAWAY:
            code = struct.unpack_from(">I", payload, 4)[0] if len(payload) >= 8 else 0
            text = payload[8:].decode(errors="replace")
            raise PerfError(f"the server closed the gRPC connection (GOAWAY {code}{': ' + text if text else ''})")

    def _resume(self) -> None:
        for stream, s in list(self._streams.items()):
            if len(s.pending) or s.end_stream:
                self._flush(stream, s)

    def _headers(self, stream: int, block: bytes, end_stream: bool, events: list[H2Event]) -> None:
        headers = self._header_cache.get(block)
        if headers is None:
            try:
                headers = [(k if isinstance(k, str) else k.decode(), v if isinstance(v, str) else v.decode())
                           for k, v in self._decoder.decode(block)]
            except hpack.HPACKError as e:
                raise PerfError(f"bad HPACK block from the server: {e}") from None
            if not table_neutral(block):
                # the block may have changed the dynamic table: the same bytes may mean other headers
                self._header_cache.clear()
                self._answer = None
            elif len(self._header_cache) < 512:
                self._header_cache[block] = headers
        s = self._streams.get(stream)
        if s is not None:
            for k, v in headers:
                if k == "grpc-status":
                    s.status = int(v)
                elif k == "grpc-message":
                    s.message = _unpercent(v)
                elif k == ":status" and v != "200":
                    s.status, s.message = 14, f"HTTP status {v}"
        if end_stream:
            self._close(stream, events)

    def _close(self, stream: int, events: list[H2Event]) -> None:
        s = self._streams.pop(stream, None)
        if s is None:
            return
        if self.collect_messages:
            body = bytes(self.messages.pop(stream, b""))
        else:
            body = bytes(s.body)
        events.append(H2Event(stream, 2 if s.status is None else s.status,
                              s.message or ("" if s.status is not None else "no grpc-status"), body))


def _whole_answer(data: bytes, stream: int) -> tuple[bytearray, tuple[int, ...], int, int] | None:
    """``data`` as a template for the same answer on another stream, when it is exactly one
    unary call's answer on ``stream``: HEADERS, DATA frames, trailing HEADERS with END_STREAM,
    nothing padded or prioritised, both header blocks table-neutral, optionally followed by
    connection WINDOW_UPDATEs (gRPC C++ servers, Triton among them, return the request's bytes
    that way in the same write). None otherwise. The last item is the window they return."""
    positions: list[int] = []
    kinds: list[tuple[int, int]] = []
    data_length = 0
    window = 0
    i = 0
    while i + 9 <= len(data):
        length = int.from_bytes(data[i:i + 3], "big")
        kind, flags = data[i + 3], data[i + 4]
        frame_stream = int.from_bytes(data[i + 5:i + 9], "big") & 0x7FFFFFFF
        if i + 9 + length > len(data):
            return None
        payload = data[i + 9:i + 9 + length]
        if kind == _WINDOW and frame_stream == 0 and length == 4 and kinds and kinds[-1] == (_HEADERS, _END_STREAM):
            window += int.from_bytes(payload, "big") & 0x7FFFFFFF
            i += 9 + length
            continue
        if frame_stream != stream or window:
            return None
        if kind == _HEADERS:
            if flags & 0x28 or not flags & _END_HEADERS or not table_neutral(payload):
                return None
        elif kind == _DATA:
            if flags & (0x8 | _END_STREAM):
                return None
            data_length += length
        else:
            return None
        positions.append(i + 5)
        kinds.append((kind, flags & _END_STREAM))
        i += 9 + length
    if i != len(data) or len(kinds) < 3 or kinds[0] != (_HEADERS, 0) or kinds[-1] != (_HEADERS, _END_STREAM) \
            or any(k != (_DATA, 0) for k in kinds[1:-1]):
        return None
    return bytearray(data), tuple(positions), data_length, window


def _unpercent(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)
