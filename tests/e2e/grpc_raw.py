"""A raw HTTP/2 gRPC client on trio + h2, for tests that must send what real clients never do
(bad prefixes, truncated messages, wrong content types, resets mid-message, never reading)."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from trident.protocol.grpc_framing import decode_grpc_message


@dataclass
class RawStream:
    stream_id: int
    headers: dict[bytes, bytes] = field(default_factory=dict)
    trailers: dict[bytes, bytes] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    reset_code: int | None = None
    closed: trio.Event = field(default_factory=trio.Event)
    changed: trio.Event = field(default_factory=trio.Event)

    @property
    def status(self) -> int | None:
        raw = self.trailers.get(b"grpc-status", self.headers.get(b"grpc-status"))
        return None if raw is None else int(raw)

    @property
    def message(self) -> str:
        raw = self.trailers.get(b"grpc-message", self.headers.get(b"grpc-message", b""))
        return decode_grpc_message(raw)

    def messages(self) -> list[bytes]:
        out, pos = [], 0
        while pos + 5 <= len(self.data):
            _, n = struct.unpack_from(">BI", self.data, pos)
            out.append(bytes(self.data[pos + 5 : pos + 5 + n]))
            pos += 5 + n
        return out


def request_headers(path: str, content_type: bytes = b"application/grpc",
                    extra: list[tuple[bytes, bytes]] | None = None) -> list[tuple[bytes, bytes]]:
    """A gRPC request's header list (``extra`` appended)."""
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"localhost"),
            (b"content-type", content_type), (b"te", b"trailers"), *(extra or [])]


def frame(payload: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(payload)) + payload


class RawClient:
    """One HTTP/2 connection. ``read_window=False`` never acknowledges received DATA."""

    def __init__(self, stream: trio.SocketStream, read_window: bool) -> None:
        self.sock = stream
        self.read_window = read_window
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.streams: dict[int, RawStream] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.ping_acks: list[bytes] = []
        self.pings: list[bytes] = []  # PINGs the server sent (h2 answers them)
        self.closed = trio.Event()
        self.lock = trio.StrictFIFOLock()
        self.window_changed = trio.Event()

    async def flush(self) -> None:
        async with self.lock:
            data = self.h2.data_to_send()
            if data:
                await self.sock.send_all(data)

    async def _pump(self) -> None:
        try:
            while True:
                data = await self.sock.receive_some(65536)
                if not data:
                    break
                for event in self.h2.receive_data(data):
                    self._handle(event)
                await self.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed.set()
            for s in self.streams.values():
                s.closed.set()

    def _handle(self, event: h2.events.Event) -> None:
        s = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and s:
            s.headers = dict(event.headers)
        elif isinstance(event, h2.events.TrailersReceived) and s:
            s.trailers = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived) and s:
            s.data += event.data
            if self.read_window:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and s:
            s.closed.set()
        elif isinstance(event, h2.events.StreamReset) and s:
            s.reset_code = event.error_code
            s.closed.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event
            if event.error_code == h2.errors.ErrorCodes.NO_ERROR:
                # like grpc-core: a graceful GOAWAY lets the open streams finish (h2 alone would
                # refuse every further frame once it has seen a GOAWAY)
                self.h2.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        elif isinstance(event, h2.events.PingAckReceived):
            self.ping_acks.append(event.ping_data)
        elif isinstance(event, h2.events.PingReceived):
            self.pings.append(event.ping_data)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.window_changed.set()
            self.window_changed = trio.Event()
        if s is not None:
            s.changed.set()
            s.changed = trio.Event()

    async def open(self, path: str, *, content_type: bytes = b"application/grpc",
                   extra: list[tuple[bytes, bytes]] | None = None, end_stream: bool = False) -> RawStream:
        stream_id = self.h2.get_next_available_stream_id()
        headers = request_headers(path, content_type, extra)
        s = self.streams[stream_id] = RawStream(stream_id)
        self.h2.send_headers(stream_id, headers, end_stream=end_stream)
        await self.flush()
        return s

    async def send(self, s: RawStream, data: bytes, end_stream: bool = False) -> None:
        """Send raw bytes (not framed), waiting for window when needed."""
        view = memoryview(data)
        while True:
            window = min(self.h2.local_flow_control_window(s.stream_id), self.h2.max_outbound_frame_size)
            n = min(window, len(view))
            if n or not view:
                last = n == len(view)
                try:
                    self.h2.send_data(s.stream_id, bytes(view[:n]), end_stream=end_stream and last)
                except h2.exceptions.StreamClosedError:
                    return  # the server answered (trailers-only) before the body went out
                view = view[n:]
                await self.flush()
                if last:
                    return
            else:
                await self.window_changed.wait()

    async def end(self, s: RawStream) -> None:
        self.h2.end_stream(s.stream_id)
        await self.flush()

    async def reset(self, s: RawStream) -> None:
        self.h2.reset_stream(s.stream_id, h2.errors.ErrorCodes.CANCEL)
        await self.flush()

    async def at_once(self, path: str, body: bytes, *, extra: list[tuple[bytes, bytes]] | None = None) -> RawStream:
        """A call whose HEADERS and one DATA frame with END_STREAM (``body``: raw bytes, not
        framed) leave in one write, as most clients send a small unary request."""
        stream_id = self.h2.get_next_available_stream_id()
        s = self.streams[stream_id] = RawStream(stream_id)
        async with self.lock:
            self.h2.send_headers(stream_id, request_headers(path, extra=extra))
            self.h2.send_data(stream_id, body, end_stream=True)
            await self.sock.send_all(self.h2.data_to_send())
        await s.closed.wait()
        return s

    async def burst(self, path: str, bodies: list[bytes]) -> list[RawStream]:
        """Calls whose HEADERS and one DATA frame each (``bodies``: raw messages, not framed) all
        leave in one write, as a client multiplexing many unary calls sends them."""
        headers = request_headers(path)
        streams = []
        async with self.lock:
            for body in bodies:
                stream_id = self.h2.get_next_available_stream_id()
                s = self.streams[stream_id] = RawStream(stream_id)
                self.h2.send_headers(stream_id, headers)
                self.h2.send_data(stream_id, frame(body), end_stream=True)
                streams.append(s)
            await self.sock.send_all(self.h2.data_to_send())
        for s in streams:
            await s.closed.wait()
        return streams

    async def unary(self, path: str, payload: bytes, **kwargs) -> RawStream:
        s = await self.open(path, **kwargs)
        await self.send(s, frame(payload), end_stream=True)
        await s.closed.wait()
        return s


@asynccontextmanager
async def open_raw(port: int, host: str = "127.0.0.1", *, read_window: bool = True,
                   settings: dict | None = None) -> AsyncIterator[RawClient]:
    sock = await trio.open_tcp_stream(host, port)
    client = RawClient(sock, read_window)
    client.h2.initiate_connection()
    if settings:
        client.h2.update_settings(settings)
    await client.flush()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._pump)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(sock)


# ---- hand-built frames, for floods a real client never sends -------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def h2_frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame, serialized by hand."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream_id) + payload


def request_block(path: str, extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    """An HPACK header block for a gRPC request that leaves the decoder's dynamic table alone
    (static-table entries and never-indexed literals), so it can be sent any number of times."""
    from hpack import Encoder, NeverIndexedHeaderTuple

    encoder = Encoder()
    return encoder.encode([NeverIndexedHeaderTuple(k, v) for k, v in request_headers(path, extra=extra)],
                          huffman=False)


def rapid_reset(path: str, count: int, payload: bytes = b"") -> bytes:
    """``count`` x (HEADERS + DATA(one gRPC message) + RST_STREAM(CANCEL)) on streams 1, 3, 5, ..."""
    block = request_block(path)
    body = frame(payload)
    rst = struct.pack(">I", 8)  # CANCEL
    out = bytearray()
    for i in range(count):
        sid = 1 + 2 * i
        out += h2_frame(HEADERS, END_HEADERS, sid, block) + h2_frame(DATA, 0, sid, body) + h2_frame(RST_STREAM, 0, sid, rst)
    return bytes(out)


@dataclass
class Seen:
    """What a raw connection received until the server closed it."""

    frames: list[tuple[int, int, int, bytes]] = field(default_factory=list)  # (type, flags, stream, payload)

    def goaway(self) -> tuple[int, int, bytes] | None:
        """(last_stream_id, error_code, debug data) of the last GOAWAY, or None."""
        for kind, _, _, payload in reversed(self.frames):
            if kind == GOAWAY:
                last, code = struct.unpack_from(">II", payload)
                return last & 0x7FFFFFFF, code, payload[8:]
        return None

    def of(self, kind: int) -> list[tuple[int, int, int, bytes]]:
        return [f for f in self.frames if f[0] == kind]


async def read_frames(sock: trio.abc.Stream, seen: Seen) -> None:
    """Collect the frames the server sends until it closes the connection (or resets it)."""
    buf = bytearray()
    try:
        while True:
            data = await sock.receive_some(1 << 16)
            if not data:
                return
            buf += data
            while len(buf) >= 9:
                length = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + length:
                    break
                kind, flags = buf[3], buf[4]
                sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                seen.frames.append((kind, flags, sid, bytes(buf[9 : 9 + length])))
                del buf[: 9 + length]
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


async def flood(port: int, payload: bytes, *, host: str = "127.0.0.1", timeout: float = 20.0,
                chunk: int = 1 << 16) -> Seen:
    """Connect, send the preface, an empty SETTINGS and ``payload`` (in ``chunk``-sized writes, while
    reading), and return what the server sent until it closed the connection. Raises
    trio.TooSlowError when the server has not closed it within ``timeout``."""
    seen = Seen()
    sock = await trio.open_tcp_stream(host, port)
    try:
        with trio.fail_after(timeout):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_frames, sock, seen)

                async def send() -> None:
                    try:
                        await sock.send_all(PREFACE + h2_frame(SETTINGS, 0, 0))
                        view = memoryview(payload)
                        for pos in range(0, len(view), chunk):
                            await sock.send_all(view[pos : pos + chunk])
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass

                nursery.start_soon(send)
    finally:
        await trio.aclose_forcefully(sock)
    return seen


def huffman_encode(data: bytes) -> bytes:
    """``data`` Huffman-coded as HPACK strings are (RFC 7541 §5.2), in linear time (hpack's
    encoder takes about a second for 80 KB)."""
    from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

    codes = [format(code, f"0{length}b") for code, length in zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=False)]
    bits = "".join(codes[byte] for byte in data)
    bits += "1" * (-len(bits) % 8)  # padding: the most significant bits of EOS
    return int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""


def huffman_literal(name: bytes, value: bytes) -> bytes:
    """A header field never indexed (§6.2.3) with a new name, its value Huffman-coded: a block
    can carry it any number of times and the decoder's dynamic table stays as it was."""
    def string(prefix: int, raw: bytes) -> bytes:
        n, out = len(raw), bytearray()
        if n < 0x7F:
            return bytes([prefix | n]) + raw
        out.append(prefix | 0x7F)
        n -= 0x7F
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out) + raw

    return b"\x10" + string(0, name) + string(0x80, huffman_encode(value))


async def exchange(port: int, payload: bytes, streams: list[int], *, host: str = "127.0.0.1",
                   timeout: float = 30.0) -> dict[int, tuple[dict[bytes, bytes], bytes]]:
    """Connect, send the preface, an empty SETTINGS and ``payload`` in one write, and read until
    each of ``streams`` has ended (HEADERS or DATA with END_STREAM, or RST_STREAM). Returns per
    stream its response headers and trailers (merged, decoded with the connection's HPACK
    state; an RST_STREAM as ``b":reset"``) and its DATA. Raises trio.TooSlowError after
    ``timeout``, AssertionError if the server closed the connection first."""
    import hpack

    decoder = hpack.Decoder()
    fields: dict[int, dict[bytes, bytes]] = {sid: {} for sid in streams}
    data: dict[int, bytearray] = {sid: bytearray() for sid in streams}
    left = set(streams)
    sock = await trio.open_tcp_stream(host, port)
    try:
        with trio.fail_after(timeout):
            await sock.send_all(PREFACE + h2_frame(SETTINGS, 0, 0) + payload)
            buf = bytearray()
            while left:
                chunk = await sock.receive_some(1 << 16)
                assert chunk, f"the server closed the connection; streams {sorted(left)} not answered"
                buf += chunk
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    kind, flags = buf[3], buf[4]
                    sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    body = bytes(buf[9 : 9 + length])
                    del buf[: 9 + length]
                    if kind == HEADERS:  # the server sends END_HEADERS blocks without padding or priority
                        decoded = dict(decoder.decode(body, raw=True))
                        fields.setdefault(sid, {}).update(decoded)
                    elif kind == DATA:
                        data.setdefault(sid, bytearray()).extend(body)
                    elif kind == RST_STREAM:
                        fields.setdefault(sid, {})[b":reset"] = str(int.from_bytes(body, "big")).encode()
                        left.discard(sid)
                    elif kind == SETTINGS and not flags & ACK:
                        await sock.send_all(h2_frame(SETTINGS, ACK, 0))
                    if kind in (HEADERS, DATA) and flags & END_STREAM:
                        left.discard(sid)
    finally:
        await trio.aclose_forcefully(sock)
    return {sid: (fields[sid], bytes(data[sid])) for sid in streams}
