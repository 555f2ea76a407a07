"""Abuse probe: what hostile clients cost a KServe v2 server (trident or Triton) and what they get back.

Not collected by pytest. Runs against an already running server, on 127.0.0.1 only:

    python tests/bench/probe_abuse.py --http 127.0.0.1:8000 --grpc 127.0.0.1:8001 --pid PID \\
        [--cases stall,pinned,soak,hold | a,b,...] [--scale 1.0] [--soak-secs 300] \\
        [--hold-cap-secs 180] [--out probe.jsonl] [--label NAME] [--slow-ms 8]

``--slow-ms`` lists each victim request of a stall case at least that slow with its start on the
system's monotonic clock (the stall records carry their cases' starts too), to set against a
trace of the server taken meanwhile.

Case groups (``--cases`` takes groups and single cases, comma separated):

* ``stall``: each abuse case below runs on its own connection while two victims (HTTP JSON
  infer and gRPC ModelInfer of FP32[16], each every ~5 ms, one at a time) record latency; the
  victims' max / p99 during the case is set against a quiet baseline, with what the abusive
  connection got back (HTTP status, GOAWAY + code, RST_STREAM codes, or nothing / held). The
  victims run in a process of their own (on the probe's CPUs), so that the abusive side's own
  work (building, sending or reading a large message) does not show in their times; the
  probe's own event-loop lag during each case is reported beside them.
  Cases: ``http_gzip_bomb`` (~254 KiB of gzip inflating to 256 MiB of zeros),
  ``http_json_bytes`` (~60 MiB: one BYTES input of 15M "" elements; to ``--bytes-model``, by
  default the victims' FP32 model, which refuses it), ``http_json_floats`` (12M
  floats), ``http_binary_bytes`` (~57 MiB: the same 15M "" elements as binary data, 4-byte
  length prefixes; ``http_binary_bytes_out``: the same answered as binary data;
  ``http_varied_bytes``: 2M elements of 0-31 bytes, ~39 MiB, answered as binary data), ``http_gzip_json`` (the 12M floats gzip-compressed: a legal body of
  ~45 MiB inflated), ``grpc_gzip_bomb`` (a compressed message inflating to 256 MiB),
  ``grpc_large_message`` (one legal ModelInfer of 15M floats from tritonclient.grpc, 60 MiB each
  way, in a process of its own), ``grpc_varied_bytes`` (the same client sending 2M BYTES elements
  of 0-31 bytes to ``--bytes-model``), ``grpc_rapid_reset``
  (HEADERS+DATA+RST_STREAM x 20,000 on one connection), ``settings_flood``, ``ping_flood``,
  ``empty_data_flood`` (100k frames each), ``continuation_flood`` (HEADERS without END_HEADERS,
  then CONTINUATION frames of 16 KiB, 64 MiB in all), ``huffman_header_flood`` (20 ModelInfer
  calls in one write, each with an 80,000-character header Huffman-coded to ~60 KB: over the
  64 KiB header list size, each answered RESOURCE_EXHAUSTED), ``max_streams`` (the advertised
  MAX_CONCURRENT_STREAMS + 1 streams opened: GOAWAY or RST_STREAM REFUSED_STREAM, and whether
  the connection still answers a PING).
* ``pinned``: ``--pinned-conns`` connections (default 50, not scaled) x 8 streams, each stream sending only a 5-byte gRPC
  prefix declaring 64 MiB (``pinned_prefix``), or the prefix and 1 MiB of payload as far as flow
  control lets it (``pinned_payload``); the server's RSS delta per connection, and when the
  server closed them (watched up to ``--hold-cap-secs``).
* ``soak``: ``--soak-secs`` of 4 HTTP + 4 gRPC clients sending checked infers, with one small
  abuse case every 10 s in rotation; RSS at the start, every 30 s and at the end, and the count of
  correct / failed requests.
* ``hold``: how long until the server closes a slow HTTP head (slowloris, a header byte a
  second), a slow HTTP body (a byte a second), a silent TCP connection to the gRPC port, an idle
  HTTP/2 connection (PINGs answered), a gRPC message dripping a byte a second; each capped at
  ``--hold-cap-secs``.

``--scale`` multiplies every count and size (frames, streams, elements, bomb sizes) for short
validation runs. ``--model``/``--input``/``--output`` name an FP32 model with a [-1] (or
[16]) input that returns its input (trident's bundled ``identity_fp32``; on Triton, a python
backend identity model of that name). Output: one JSON object per line in ``--out`` and a
markdown table on stdout. RSS comes from /proc/PID/status (VmRSS) when ``--pid`` is given.
Every loop is bounded in count and in time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import socket
import struct
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import h11
import hpack
import numpy as np
import trio
from hyperframe import frame as hf

# ---- helpers ---------------------------------------------------------------------------------

LOOPBACK = ("127.0.0.1", "localhost", "::1")
GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR", 4: "SETTINGS_TIMEOUT",
             5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR",
             10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM", 12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}  # fmt: skip


def parse_addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host not in LOOPBACK:
        raise SystemExit(f"refusing {text}: this probe only talks to 127.0.0.1")
    return ("127.0.0.1" if host == "localhost" else host), int(port)


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def pb_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def pb_field(number: int, payload: bytes) -> bytes:
    return pb_varint(number << 3 | 2) + pb_varint(len(payload)) + payload


def model_infer_request(model: str, input_name: str, values: np.ndarray) -> bytes:
    """A serialized inference.ModelInferRequest with one FP32 raw input (no protobuf library needed)."""
    shape = b"".join(pb_varint(d) for d in values.shape)
    tensor = pb_field(1, input_name.encode()) + pb_field(2, b"FP32") + pb_field(3, shape)
    return pb_field(1, model.encode()) + pb_field(5, tensor) + pb_field(7, values.astype("<f4").tobytes())


def raw_output_of(message: bytes) -> bytes | None:
    """raw_output_contents[0] (field 6) of a ModelInferResponse, by a minimal walk of the wire format."""
    pos = 0
    while pos < len(message):
        tag, pos = _read_varint(message, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = _read_varint(message, pos)
        elif wire == 2:
            n, pos = _read_varint(message, pos)
            if tag >> 3 == 6:
                return message[pos : pos + n]
            pos += n
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            return None
    return None


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    for _ in range(10):
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    raise ValueError("bad varint")


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", 1 if compressed else 0, len(message)) + message


_BOMBS: dict[int, bytes] = {}


def zeros_gzip(size: int) -> bytes:
    """gzip of ``size`` zero bytes, built in 1 MiB pieces (256 MiB -> ~254 KiB), cached."""
    if size not in _BOMBS:
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        chunk = bytes(1 << 20)
        parts = [c.compress(chunk) for _ in range(size >> 20)]
        parts.append(c.compress(bytes(size & ((1 << 20) - 1))))
        parts.append(c.flush())
        _BOMBS[size] = b"".join(parts)
    return _BOMBS[size]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# ---- a raw HTTP/2 client: frames as the probe wants them, flow control, what the server sent ---


@dataclass
class H2Seen:
    goaway: tuple[int, int] | None = None  # (error code, last stream id)
    rst: dict[int, int] = field(default_factory=dict)  # error code -> count
    closed_at: float | None = None  # monotonic time of EOF / reset from the server
    close_reason: str = ""
    settings: dict[int, int] = field(default_factory=dict)
    ping_acks: int = 0
    settings_acks: int = 0
    frames: int = 0

    def summary(self) -> str:
        out = []
        if self.goaway:
            out.append(f"GOAWAY {H2_ERRORS.get(self.goaway[0], self.goaway[0])} last={self.goaway[1]}")
        for code, n in sorted(self.rst.items()):
            out.append(f"RST_STREAM {H2_ERRORS.get(code, code)} x{n}")
        if self.closed_at is not None:
            out.append(f"closed ({self.close_reason})")
        return "; ".join(out) or "nothing (held open)"


class RawH2:
    """One HTTP/2 connection to ``addr``: the probe writes frames, a reader task records replies."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 1 << 16
        self.seen = H2Seen()
        self.next_id = 1
        self.send_window = 65535
        self.stream_windows: dict[int, int] = {}
        self.initial_window = 65535
        self.window_changed = trio.Event()
        self.headers: dict[int, list[tuple[str, str]]] = {}  # stream -> headers and trailers
        self.data: dict[int, bytearray] = {}
        self.done: dict[int, trio.Event] = {}
        self.ping_ack = trio.Event()
        self.settings_event = trio.Event()
        self.answer_pings = True
        self.read_responses = True
        self.closed = trio.Event()
        self.goaway_event = trio.Event()
        self._send_lock = trio.Lock()
        self._pending = bytearray()  # the reader's replies, while a writer holds the lock
        self.closing = False  # the probe closed it: not the server's doing

    @classmethod
    async def connect(cls, nursery: trio.Nursery, addr: tuple[str, int], settings: bool = True) -> RawH2:
        stream = await trio.open_tcp_stream(*addr)
        conn = cls(stream)
        nursery.start_soon(conn._reader)
        if settings:
            first = hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: (1 << 31) - 1,
                                                  hf.SettingsFrame.ENABLE_PUSH: 0})
            grow = hf.WindowUpdateFrame(0, window_increment=(1 << 31) - 1 - 65535)
            await conn.send(H2_PREFACE + first.serialize() + grow.serialize())
            with trio.move_on_after(5):
                await conn.settings_event.wait()
        return conn

    async def send(self, data: bytes | bytearray) -> bool:
        """Write bytes; False when the server has closed the connection."""
        if self.closed.is_set():
            return False
        try:
            async with self._send_lock:
                if self._pending:
                    data = bytes(self._pending) + data
                    self._pending.clear()
                await self.stream.send_all(data)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self._closed("write failed")
            return False

    async def _reply(self, data: bytes) -> None:
        """A reply from the reader (ACK, WINDOW_UPDATE): queued behind a writer instead of waiting on it."""
        if self._send_lock.locked():
            self._pending += data
        else:
            await self.send(data)

    def _closed(self, reason: str) -> None:
        if self.seen.closed_at is None and not self.closing:
            self.seen.closed_at = time.monotonic()
            self.seen.close_reason = reason
        self.closed.set()
        for event in self.done.values():
            event.set()
        self.window_changed.set()

    async def aclose(self) -> None:
        self.closing = True
        with trio.move_on_after(1):
            await self.stream.aclose()
        self.closed.set()

    def new_stream(self) -> int:
        sid = self.next_id
        self.next_id += 2
        self.done[sid] = trio.Event()
        self.stream_windows[sid] = self.initial_window
        return sid

    def headers_frame(self, sid: int, end_stream: bool = False, compressed: bool = False, extra=()) -> bytes:
        headers = [(":method", "POST"), (":scheme", "http"), (":path", GRPC_PATH), (":authority", "127.0.0.1"),
                   ("content-type", "application/grpc"), ("te", "trailers"), *extra]
        if compressed:
            headers.append(("grpc-encoding", "gzip"))
        flags = ["END_HEADERS"] + (["END_STREAM"] if end_stream else [])
        return hf.HeadersFrame(sid, data=self.encoder.encode(headers), flags=flags).serialize()

    @staticmethod
    def data_frames(sid: int, payload: bytes, end_stream: bool, max_frame: int = 16384) -> bytes:
        out = []
        for start in range(0, max(len(payload), 1), max_frame):
            piece = payload[start : start + max_frame]
            last = start + max_frame >= len(payload)
            out.append(hf.DataFrame(sid, data=piece, flags=["END_STREAM"] if (end_stream and last) else []).serialize())
        return b"".join(out)

    async def send_flow(self, sid: int, payload: bytes, end_stream: bool, wait: float) -> int:
        """DATA for ``payload`` (not empty) as flow control allows, waiting up to ``wait`` s for window; bytes sent."""
        sent = 0
        deadline = trio.current_time() + wait
        for _ in range(len(payload) + 1):
            if sent >= len(payload):
                break
            room = min(self.send_window, self.stream_windows.get(sid, 0), 16384, len(payload) - sent)
            if room <= 0:
                self.window_changed = trio.Event()
                with trio.move_on_at(deadline):
                    await self.window_changed.wait()
                if trio.current_time() >= deadline or self.closed.is_set():
                    break
                continue
            piece = payload[sent : sent + room]
            self.send_window -= len(piece)
            self.stream_windows[sid] = self.stream_windows.get(sid, 0) - len(piece)
            flags = ["END_STREAM"] if (end_stream and sent + len(piece) >= len(payload)) else []
            if not await self.send(hf.DataFrame(sid, data=piece, flags=flags).serialize()):
                break
            sent += len(piece)
        return sent

    async def _reader(self) -> None:
        buf = bytearray()
        try:
            while True:
                chunk = await self.stream.receive_some(1 << 16)
                if not chunk:
                    self._closed("EOF")
                    return
                buf += chunk
                while len(buf) >= 9:
                    frame, length = hf.Frame.parse_frame_header(memoryview(buf)[:9])
                    if len(buf) < 9 + length:
                        break
                    frame.parse_body(memoryview(bytes(buf[9 : 9 + length])))
                    del buf[: 9 + length]
                    await self._on_frame(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self._closed(f"reset: {type(e).__name__}")
        except Exception as e:  # a frame the probe cannot parse: note it, stop reading
            self._closed(f"probe could not parse: {type(e).__name__}: {e}")

    async def _on_frame(self, frame: hf.Frame) -> None:
        self.seen.frames += 1
        if isinstance(frame, hf.SettingsFrame):
            if "ACK" in frame.flags:
                self.seen.settings_acks += 1
            else:
                self.seen.settings.update(frame.settings)
                if hf.SettingsFrame.INITIAL_WINDOW_SIZE in frame.settings:
                    new = frame.settings[hf.SettingsFrame.INITIAL_WINDOW_SIZE]
                    for sid in self.stream_windows:
                        self.stream_windows[sid] += new - self.initial_window
                    self.initial_window = new
                    self.window_changed.set()
                await self._reply(hf.SettingsFrame(0, flags=["ACK"]).serialize())
                self.settings_event.set()
        elif isinstance(frame, hf.PingFrame):
            if "ACK" in frame.flags:
                self.seen.ping_acks += 1
                self.ping_ack.set()
            elif self.answer_pings:
                await self._reply(hf.PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]).serialize())
        elif isinstance(frame, hf.GoAwayFrame):
            self.seen.goaway = (frame.error_code, frame.last_stream_id)
            self.goaway_event.set()
            for sid, event in self.done.items():
                if sid > frame.last_stream_id:
                    event.set()
        elif isinstance(frame, hf.RstStreamFrame):
            self.seen.rst[frame.error_code] = self.seen.rst.get(frame.error_code, 0) + 1
            if frame.stream_id in self.done:
                self.done[frame.stream_id].set()
        elif isinstance(frame, hf.WindowUpdateFrame):
            if frame.stream_id == 0:
                self.send_window += frame.window_increment
            else:
                self.stream_windows[frame.stream_id] = self.stream_windows.get(frame.stream_id, 0) + frame.window_increment
            self.window_changed.set()
        elif isinstance(frame, (hf.HeadersFrame, hf.ContinuationFrame)):
            try:
                decoded = self.decoder.decode(bytes(frame.data), raw=False)
            except Exception:
                decoded = [("probe-error", "undecodable header block")]
            if self.read_responses:
                self.headers.setdefault(frame.stream_id, []).extend(decoded)
            if "END_STREAM" in frame.flags and frame.stream_id in self.done:
                self.done[frame.stream_id].set()
        elif isinstance(frame, hf.DataFrame):
            if self.read_responses:
                self.data.setdefault(frame.stream_id, bytearray()).extend(frame.data)
            if frame.flow_controlled_length:
                await self._reply(hf.WindowUpdateFrame(0, window_increment=frame.flow_controlled_length).serialize())
            if "END_STREAM" in frame.flags and frame.stream_id in self.done:
                self.done[frame.stream_id].set()

    def forget(self, sid: int) -> None:
        for table in (self.headers, self.data, self.done, self.stream_windows):
            table.pop(sid, None)


def grpc_status(headers: list[tuple[str, str]]) -> tuple[str | None, str]:
    status = message = None
    for k, v in headers:
        if k == "grpc-status":
            status = v
        elif k == "grpc-message":
            message = v
    return status, message or ""


# ---- victims -----------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # monotonic start
    latency: float
    ok: bool
    proto: str


class Victims:
    """An HTTP and a gRPC client, each sending a small infer every ~5 ms, one at a time."""

    def __init__(self, args: argparse.Namespace, values: np.ndarray) -> None:
        self.args = args
        self.values = values
        self.samples: list[Sample] = []
        self.http_body = json.dumps({"inputs": [{"name": args.input, "shape": list(values.shape), "datatype": "FP32",
                                                 "data": values.tolist()}]}).encode()
        self.grpc_message = grpc_frame(model_infer_request(args.model, args.input, values))
        self.expected = values.astype("<f4").tobytes()

    async def run(self, stop: trio.Event, interval: float = 0.005) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.loop, stop, interval, "http", None)
            nursery.start_soon(self.loop, stop, interval, "grpc", None)

    async def loop(self, stop: trio.Event, interval: float, proto: str, counts: dict[str, int] | None,
                   deadline: float = math.inf) -> None:
        """Requests one at a time, every ``interval`` s at most, until ``stop`` or ``deadline``."""
        once = self.http_once if proto == "http" else self.grpc_once
        state: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            state["nursery"] = nursery
            for _ in range(100_000_000):  # bounded by ``stop`` / ``deadline`` in practice
                if stop.is_set() or time.monotonic() >= deadline:
                    break
                start = time.monotonic()
                ok = False
                with trio.move_on_after(self.args.victim_timeout):
                    try:
                        ok = await once(state)
                    except Exception:
                        ok = False
                if not ok:
                    await _drop(state)
                if counts is None:
                    self.samples.append(Sample(start, time.monotonic() - start, ok, proto))
                else:
                    counts[f"{proto}_{'ok' if ok else 'failed'}"] += 1
                await trio.sleep(max(0.0, interval - (time.monotonic() - start)))
            await _drop(state)
            nursery.cancel_scope.cancel()

    async def serve_samples(self, out: Any) -> None:
        """Run the two victims and send their samples to ``out`` (a multiprocessing connection;
        lines of start, latency, ok, protocol) every 20 ms, until cancelled:
        :class:`VictimsProcess`'s child."""
        sent = 0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.run, trio.Event())
            while True:
                await trio.sleep(0.02)
                new = self.samples[sent:]
                sent += len(new)
                if new:
                    out.send_bytes("".join(f"{s.t!r} {s.latency!r} {int(s.ok)} {s.proto}\n" for s in new).encode())

    async def http_once(self, state: dict[str, Any]) -> bool:
        conn = state.get("h11")
        if conn is not None and not (conn.our_state is h11.IDLE and conn.their_state is h11.IDLE):
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
            else:
                await _drop(state)
        if "http" not in state:
            state["http"] = await trio.open_tcp_stream(*self.args.http_addr)
            state["h11"] = h11.Connection(h11.CLIENT)
        stream, conn = state["http"], state["h11"]
        request = h11.Request(method="POST", target=f"/v2/models/{self.args.model}/infer",
                              headers=[("host", "127.0.0.1"), ("content-type", "application/json"),
                                       ("content-length", str(len(self.http_body)))])
        await stream.send_all(conn.send(request) + conn.send(h11.Data(data=self.http_body)) + conn.send(h11.EndOfMessage()))
        status, body = await _h11_response(stream, conn)
        if status != 200:
            return False
        outputs = json.loads(body).get("outputs", [])
        return bool(outputs) and np.array_equal(np.asarray(outputs[0]["data"], dtype=np.float32), self.values.reshape(-1))

    async def grpc_once(self, state: dict[str, Any]) -> bool:
        if "h2" not in state:
            state["h2"] = await RawH2.connect(state["nursery"], self.args.grpc_addr)
        return await grpc_unary(state["h2"], self.grpc_message, self.expected)


async def grpc_unary(conn: RawH2, message: bytes, expected: bytes | None) -> bool:
    sid = conn.new_stream()
    if not await conn.send(conn.headers_frame(sid) + RawH2.data_frames(sid, message, end_stream=True)):
        return False
    await conn.done[sid].wait()
    status, _ = grpc_status(conn.headers.get(sid, []))
    data = bytes(conn.data.get(sid, b""))
    conn.forget(sid)
    if status != "0" or len(data) < 5:
        return False
    return expected is None or raw_output_of(data[5:]) == expected


async def _drop(state: dict[str, Any]) -> None:
    """Close the victim's connections (a fresh one is opened for the next request)."""
    if "http" in state:
        with trio.move_on_after(1):
            await state["http"].aclose()
        state.pop("http")
        state.pop("h11", None)
    if "h2" in state:
        await state.pop("h2").aclose()


async def _h11_response(stream: trio.SocketStream, conn: h11.Connection, limit: int = 1 << 30) -> tuple[int, bytes]:
    status = 0
    body = bytearray()
    for _ in range(1 << 22):
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(1 << 16)
            conn.receive_data(data)
            if not data and conn.their_state is not h11.DONE:
                raise ConnectionError("server closed the connection")
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            if len(body) < limit:
                body += event.data
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, bytes(body)
    raise ConnectionError("response too long")


def _serve_victims(args: argparse.Namespace, values: np.ndarray, out: Any) -> None:
    """The victims' process (spawned): the two victims, their samples sent to ``out``."""
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        trio.run(Victims(args, values).serve_samples, out)


class VictimsProcess:
    """The two victims of :class:`Victims` in a process of their own, their samples read back
    as they come: the probe's abusive clients share this process's event loop and GIL, and a
    stall of the probe's own (building or reading a large message) would show in the victims'
    times as if the server had caused it. :attr:`lags` keeps this process's own loop lag, to
    say how far the abusive side itself was held up."""

    def __init__(self, args: argparse.Namespace, values: np.ndarray) -> None:
        self.args = args
        self.values = values
        self.samples: list[Sample] = []
        self.lags: list[tuple[float, float]] = []

    async def run(self, stop: trio.Event, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The victims until ``stop``; started once their first samples have come."""
        spawn = multiprocessing.get_context("spawn")
        reader, writer = spawn.Pipe(duplex=False)
        process = spawn.Process(target=_serve_victims, args=(self.args, self.values, writer), daemon=True)
        process.start()  # the child inherits this process's CPU affinity
        writer.close()
        try:
            async with trio.open_nursery() as nursery:
                first = trio.Event()
                nursery.start_soon(self._read, reader, first)
                await first.wait()
                nursery.start_soon(self._watch_lag, stop)
                task_status.started()
                await stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            process.terminate()
            await trio.to_thread.run_sync(process.join, 5)
            reader.close()

    async def _read(self, reader: Any, first: trio.Event) -> None:
        while True:
            try:
                data = await trio.to_thread.run_sync(reader.recv_bytes, abandon_on_cancel=True)
            except EOFError:
                raise RuntimeError("the victims' process ended") from None
            for line in data.splitlines():
                t, latency, ok, proto = line.split()
                self.samples.append(Sample(float(t), float(latency), ok == b"1", proto.decode()))
            first.set()

    async def _watch_lag(self, stop: trio.Event, period: float = 0.001) -> None:
        """This process's own event loop, late by more than 2 ms."""
        while not stop.is_set():
            start = time.monotonic()
            await trio.sleep(period)
            late = time.monotonic() - start - period
            if late > 0.002:
                self.lags.append((start, late))

    def lag_ms(self, start: float, end: float) -> float:
        """This process's longest loop lag between ``start`` and ``end`` (ms)."""
        return round(max((late * 1000 for t, late in self.lags if start <= t <= end), default=0.0), 1)


def latency_stats(samples: list[Sample], proto: str) -> dict[str, Any]:
    mine = [s for s in samples if s.proto == proto]
    lat = [s.latency * 1000 for s in mine]
    return {"n": len(mine), "failed": sum(not s.ok for s in mine),
            "p50_ms": _r(percentile(lat, 0.5)), "p99_ms": _r(percentile(lat, 0.99)), "max_ms": _r(max(lat, default=None))}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


# ---- abuse cases: each returns what the abusive connection got back ------------------------------


async def http_post(args, path: str, body: bytes, headers: list[tuple[str, str]], wait: float) -> str:
    """POST ``body`` on a fresh connection; the status (and a snippet of the answer), or what happened."""
    try:
        stream = await trio.open_tcp_stream(*args.http_addr)
    except OSError as e:
        return f"connect failed: {e}"
    conn = h11.Connection(h11.CLIENT)
    result = "nothing (held)"
    with trio.move_on_after(wait):
        try:
            request = h11.Request(method="POST", target=path, headers=[("host", "127.0.0.1"),
                                  ("content-length", str(len(body))), *headers])
            await stream.send_all(conn.send(request))
            view = memoryview(body)
            for start in range(0, len(body), 1 << 20):
                await stream.send_all(conn.send(h11.Data(data=view[start : start + (1 << 20)])))
            await stream.send_all(conn.send(h11.EndOfMessage()))
            status, answer = await _h11_response(stream, conn, limit=4096)
            result = f"HTTP {status} {answer[:160].decode('utf-8', 'replace')}"
        except (trio.BrokenResourceError, ConnectionError, OSError, h11.ProtocolError) as e:
            result = f"connection closed/reset: {type(e).__name__}"
    with trio.move_on_after(1):
        await stream.aclose()
    return result


def infer_path(args) -> str:
    return f"/v2/models/{args.model}/infer"


async def case_http_gzip_bomb(args, nursery) -> str:
    body = zeros_gzip(int((256 << 20) * args.scale))
    return await http_post(args, infer_path(args), body, [("content-type", "application/json"),
                                                          ("content-encoding", "gzip")], args.case_wait)


_JSON_BODIES: dict[tuple[str, int, str], bytes] = {}


def json_body(args, datatype: str) -> bytes:
    """The large JSON infer body of a case (~60 MiB), cached: built before the clock starts,
    since building it here would stall the probe's own loop (and its victims' timings)."""
    n = max(1, int((15_000_000 if datatype == "BYTES" else 12_000_000) * args.scale))
    key = (datatype, n, args.input)
    if key not in _JSON_BODIES:
        element = b'""' if datatype == "BYTES" else b"0.5"
        _JSON_BODIES[key] = (b'{"inputs":[{"name":"' + args.input.encode() + b'","shape":[' + str(n).encode()
                             + b'],"datatype":"' + datatype.encode() + b'","data":['
                             + (element + b", ") * (n - 1) + element + b"]}]}")
    return _JSON_BODIES[key]


def bytes_path(args) -> str:
    """Where the BYTES cases post: ``--bytes-model`` (a model with a BYTES input of shape [-1]
    takes them; the default, the victims' FP32 model, refuses them)."""
    return f"/v2/models/{args.bytes_model or args.model}/infer"


async def case_http_json_bytes(args, nursery) -> str:
    body = json_body(args, "BYTES")
    return await http_post(args, bytes_path(args), body, [("content-type", "application/json")], args.case_wait)


async def case_http_json_floats(args, nursery) -> str:
    body = json_body(args, "FP32")
    return await http_post(args, infer_path(args), body, [("content-type", "application/json")], args.case_wait)


_GZIP_BODIES: dict[tuple[str, int, str], bytes] = {}


def gzip_json_body(args) -> bytes:
    """The JSON body of ``http_json_floats``, gzip-compressed (a legal body that inflates to
    ~45 MiB, under the input limit), cached like :func:`json_body`."""
    body = json_body(args, "FP32")
    key = ("FP32", len(body), args.input)
    if key not in _GZIP_BODIES:
        _GZIP_BODIES[key] = zlib.compress(body, 1, wbits=31)
    return _GZIP_BODIES[key]


async def case_http_gzip_json(args, nursery) -> str:
    return await http_post(args, infer_path(args), gzip_json_body(args), [("content-type", "application/json"),
                                                                        ("content-encoding", "gzip")], args.case_wait)


_BINARY_BODIES: dict[tuple[str, int, str], tuple[bytes, int]] = {}


def binary_bytes_body(args, kind: str = "empty") -> tuple[bytes, int]:
    """The binary infer body of ``http_binary_bytes`` (15M empty BYTES elements, 4-byte length
    prefixes: ~57 MiB; its answer in JSON), ``http_binary_bytes_out`` (the same, its answer as
    binary data) or ``http_varied_bytes`` (2M elements of 0-31 bytes, ~39 MiB, its answer as
    binary data) and its JSON header's length, cached like :func:`json_body`."""
    n = max(1, int((2_000_000 if kind == "varied" else 15_000_000) * args.scale))
    key = (kind, n, args.input)
    if key not in _BINARY_BODIES:
        if kind == "varied":
            data = b"".join(struct.pack("<I", i % 32) + b"v" * (i % 32) for i in range(n))
        else:
            data = b"\x00\x00\x00\x00" * n
        header = (b'{"inputs":[{"name":"' + args.input.encode() + b'","shape":[' + str(n).encode()
                  + b'],"datatype":"BYTES","parameters":{"binary_data_size":' + str(len(data)).encode() + b"}}]"
                  + (b',"parameters":{"binary_data_output":true}' if kind != "empty" else b"") + b"}")
        _BINARY_BODIES[key] = (header + data, len(header))
    return _BINARY_BODIES[key]


async def _post_binary_bytes(args, kind: str) -> str:
    body, header_length = binary_bytes_body(args, kind)
    return await http_post(args, bytes_path(args), body, [("content-type", "application/octet-stream"),
                                                          ("inference-header-content-length", str(header_length))],
                           args.case_wait)


async def case_http_binary_bytes(args, nursery) -> str:
    return await _post_binary_bytes(args, "empty")


async def case_http_binary_bytes_out(args, nursery) -> str:
    return await _post_binary_bytes(args, "empty_out")


async def case_http_varied_bytes(args, nursery) -> str:
    return await _post_binary_bytes(args, "varied")


async def case_grpc_gzip_bomb(args, nursery) -> str:
    conn = await RawH2.connect(nursery, args.grpc_addr)
    sid = conn.new_stream()
    message = grpc_frame(zeros_gzip(int((256 << 20) * args.scale)), compressed=True)
    await conn.send(conn.headers_frame(sid, compressed=True))
    await conn.send_flow(sid, message, end_stream=True, wait=args.case_wait)
    with trio.move_on_after(args.case_wait):
        await conn.done[sid].wait()
    status, text = grpc_status(conn.headers.get(sid, []))
    await conn.aclose()
    got = f"grpc-status {status} {text[:120]}" if status is not None else ""
    return "; ".join(x for x in (got, conn.seen.summary()) if x)


_GRPC_LARGE_CLIENT = """
import os, sys, numpy as np, tritonclient.grpc as g
os.nice(19)  # the victims, on the same core, come first
url, model, name, n, datatype = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
if datatype == "BYTES":  # elements of 0-31 bytes
    values = np.array([b"v" * (i % 32) for i in range(n)], dtype=object)
else:
    values = np.arange(n, dtype=np.float32)
options = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]
client = g.InferenceServerClient(url, channel_args=options)
item = g.InferInput(name, [n], datatype)
item.set_data_from_numpy(values)
try:
    result = client.infer(model, [item])
    out = result.as_numpy(result.get_response().outputs[0].name)
    print("OK" if out.reshape(-1).tolist() == values.tolist() else "WRONG ANSWER")
except Exception as e:
    print("error:", str(e)[:160])
"""


async def case_grpc_large_message(args, nursery) -> str:
    """One legal ModelInfer of 15M floats (60 MiB each way) from tritonclient.grpc, in a process
    of its own (so its work does not share the probe's GIL with the victims)."""
    return await _grpc_client_case(args, args.model, max(1, int(15_000_000 * args.scale)), "FP32")


async def case_grpc_varied_bytes(args, nursery) -> str:
    """One legal ModelInfer of 2M BYTES elements of 0-31 bytes (~39 MiB) from tritonclient.grpc
    to ``--bytes-model``, in a process of its own."""
    return await _grpc_client_case(args, args.bytes_model or args.model, max(1, int(2_000_000 * args.scale)), "BYTES")


async def _grpc_client_case(args, model: str, n: int, datatype: str) -> str:
    with trio.move_on_after(args.case_wait):
        done = await trio.run_process([sys.executable, "-c", _GRPC_LARGE_CLIENT, args.grpc, model, args.input,
                                       str(n), datatype], capture_stdout=True, capture_stderr=True, check=False)
        return "tritonclient.grpc: " + done.stdout.decode(errors="replace").strip()[:200]
    return "nothing (held)"


async def case_grpc_rapid_reset(args, nursery) -> str:
    conn = await RawH2.connect(nursery, args.grpc_addr)
    conn.read_responses = False
    message = grpc_frame(model_infer_request(args.model, args.input, np.zeros(16, np.float32)))
    total = max(1, int(20_000 * args.scale))
    sent = 0
    with trio.move_on_after(args.case_wait):
        while sent < total and not conn.closed.is_set():
            batch = bytearray()
            for i in range(min(100, total - sent)):
                if i % 10 == 9:  # building 100 streams' frames takes ~4 ms: the victims' requests go on
                    await trio.sleep(0)
                sid = conn.next_id
                conn.next_id += 2
                batch += conn.headers_frame(sid) + RawH2.data_frames(sid, message, end_stream=False)
                batch += hf.RstStreamFrame(sid, error_code=8).serialize()
                sent += 1
            if not await conn.send(batch):
                break
        with trio.move_on_after(2):
            await conn.closed.wait()
    await conn.aclose()
    return f"sent {sent}/{total}: " + conn.seen.summary()


async def _send_repeated(args, conn, frame: bytes, total: int, batch: int) -> int:
    """Send ``frame`` ``total`` times in writes of ``batch`` frames until the server closes (or
    the case's time is up); then give it 2 s to close. Returns how many went out."""
    sent = 0
    with trio.move_on_after(args.case_wait):
        while sent < total and not conn.closed.is_set():
            n = min(batch, total - sent)
            if not await conn.send(frame * n):
                break
            sent += n
        with trio.move_on_after(2):
            await conn.closed.wait()
    await conn.aclose()
    return sent


async def _flood(args, nursery, make_frame, total: int, open_stream: bool = False) -> str:
    conn = await RawH2.connect(nursery, args.grpc_addr)
    sid = 0
    if open_stream:
        sid = conn.new_stream()
        await conn.send(conn.headers_frame(sid))
    sent = await _send_repeated(args, conn, make_frame(sid), total, 1000)
    return (f"sent {sent}/{total}, acks: settings {conn.seen.settings_acks} ping {conn.seen.ping_acks}; "
            + conn.seen.summary())


async def case_settings_flood(args, nursery) -> str:
    return await _flood(args, nursery, lambda sid: hf.SettingsFrame(0).serialize(), max(1, int(100_000 * args.scale)))


async def case_ping_flood(args, nursery) -> str:
    return await _flood(args, nursery, lambda sid: hf.PingFrame(0, opaque_data=b"12345678").serialize(),
                        max(1, int(100_000 * args.scale)))


async def case_empty_data_flood(args, nursery) -> str:
    return await _flood(args, nursery, lambda sid: hf.DataFrame(sid, data=b"").serialize(),
                        max(1, int(100_000 * args.scale)), open_stream=True)


async def case_continuation_flood(args, nursery) -> str:
    conn = await RawH2.connect(nursery, args.grpc_addr)
    sid = conn.new_stream()
    block = conn.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", GRPC_PATH),
                                 (":authority", "127.0.0.1"), ("content-type", "application/grpc")])
    await conn.send(hf.HeadersFrame(sid, data=block).serialize())  # no END_HEADERS
    # literal header fields without indexing, new name: "x-pad: aaaa..." repeated, 16 KiB a frame
    field_ = b"\x00\x05x-pad" + bytes([100]) + b"a" * 100
    payload = (field_ * (16384 // len(field_) + 1))[:16384]
    total = max(1, int(4096 * args.scale))
    sent = await _send_repeated(args, conn, hf.ContinuationFrame(sid, data=payload).serialize(), total, 64)
    return f"sent {sent}/{total} CONTINUATION ({sent * 16384 >> 20} MiB): " + conn.seen.summary()


_HUFFMAN_LITERALS: dict[int, bytes] = {}


def huffman_literal(size: int) -> bytes:
    """A never-indexed header field ``x-big`` whose value, ``size`` random letters and digits, is
    Huffman-coded (RFC 7541 §5.2, §6.2.3); built in linear time and cached (hpack's encoder takes
    about a second for 80 KB, which would stall the probe's own victims)."""
    if size not in _HUFFMAN_LITERALS:
        from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

        rng = np.random.default_rng(size)
        value = rng.choice(np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8), size).tobytes()
        codes = [format(c, f"0{n}b") for c, n in zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=False)]
        bits = "".join(codes[b] for b in value)
        bits += "1" * (-len(bits) % 8)
        coded = int(bits, 2).to_bytes(len(bits) // 8, "big")
        length, n = bytearray([0xFF]), len(coded) - 0x7F  # H bit, 7-bit prefix full, then the rest
        while n >= 0x80:
            length.append((n & 0x7F) | 0x80)
            n >>= 7
        length.append(n)
        _HUFFMAN_LITERALS[size] = b"\x10\x05x-big" + bytes(length) + coded
    return _HUFFMAN_LITERALS[size]


def _huffman_flood_size(args) -> tuple[int, int]:
    return max(1, int(20 * args.scale)), max(200, int(80_000 * args.scale))


async def case_huffman_header_flood(args, nursery) -> str:
    conn = await RawH2.connect(nursery, args.grpc_addr)
    count, size = _huffman_flood_size(args)
    literal = huffman_literal(size)
    message = grpc_frame(model_infer_request(args.model, args.input, np.zeros(16, np.float32)))
    headers = [(":method", "POST"), (":scheme", "http"), (":path", GRPC_PATH), (":authority", "127.0.0.1"),
               ("content-type", "application/grpc"), ("te", "trailers")]
    batch = bytearray()
    sids = []
    for _ in range(count):
        sid = conn.new_stream()
        sids.append(sid)
        block = conn.encoder.encode(headers) + literal
        batch += hf.HeadersFrame(sid, data=block, flags=["END_HEADERS"]).serialize()
        batch += RawH2.data_frames(sid, message, end_stream=True)
    await conn.send(batch)
    with trio.move_on_after(args.case_wait):
        for sid in sids:
            await conn.done[sid].wait()
    statuses: dict[str, int] = {}
    for sid in sids:
        status, _ = grpc_status(conn.headers.get(sid, []))
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    await conn.aclose()
    return (f"{count} x {len(literal) >> 10} KiB Huffman-coded header; grpc-status {statuses}; "
            + conn.seen.summary())


async def case_max_streams(args, nursery) -> str:
    conn = await RawH2.connect(nursery, args.grpc_addr)
    advertised = conn.seen.settings.get(hf.SettingsFrame.MAX_CONCURRENT_STREAMS)
    limit = advertised if advertised is not None else 1000
    count = min(limit + 1, 100_000)
    batch = bytearray()
    last = 0
    for i in range(count):
        if i % 50 == 49:  # ~35 us a stream's HEADERS: the victims' requests go on meanwhile
            await trio.sleep(0)
        last = conn.new_stream()
        batch += conn.headers_frame(last)
        if len(batch) > 1 << 16:
            await conn.send(batch)
            batch = bytearray()
    await conn.send(batch)
    with trio.move_on_after(2):
        await conn.done[last].wait()
    conn.ping_ack = trio.Event()
    alive = False
    if await conn.send(hf.PingFrame(0, opaque_data=b"survive?").serialize()):
        with trio.move_on_after(3):
            await conn.ping_ack.wait()
            alive = True
    await conn.aclose()
    return (f"advertised {advertised}, opened {count}; connection {'survived (PING answered)' if alive else 'lost'}; "
            + conn.seen.summary())


STALL_CASES = {
    "http_gzip_bomb": case_http_gzip_bomb,
    "http_json_bytes": case_http_json_bytes,
    "http_json_floats": case_http_json_floats,
    "http_binary_bytes": case_http_binary_bytes,
    "http_binary_bytes_out": case_http_binary_bytes_out,
    "http_varied_bytes": case_http_varied_bytes,
    "http_gzip_json": case_http_gzip_json,
    "grpc_gzip_bomb": case_grpc_gzip_bomb,
    "grpc_large_message": case_grpc_large_message,
    "grpc_varied_bytes": case_grpc_varied_bytes,
    "grpc_rapid_reset": case_grpc_rapid_reset,
    "settings_flood": case_settings_flood,
    "ping_flood": case_ping_flood,
    "empty_data_flood": case_empty_data_flood,
    "continuation_flood": case_continuation_flood,
    "huffman_header_flood": case_huffman_header_flood,
    "max_streams": case_max_streams,
}


async def run_stall(args, emit, case_names: list[str]) -> None:
    values = np.arange(16, dtype=np.float32)
    victims = VictimsProcess(args, values)
    stop = trio.Event()
    if "huffman_header_flood" in case_names:
        huffman_literal(_huffman_flood_size(args)[1])  # before the victims run: it takes a while
    async with trio.open_nursery() as nursery:
        await nursery.start(victims.run, stop)
        base_start = time.monotonic()
        await trio.sleep(args.baseline_secs)
        base = list(victims.samples)
        emit({"case": "baseline", "group": "stall", "start": round(base_start, 4), "secs": args.baseline_secs,
              "http": latency_stats(base, "http"), "grpc": latency_stats(base, "grpc"), "rss_mib": _r(rss_mib(args.pid)),
              "probe_lag_ms": victims.lag_ms(base_start, time.monotonic())})
        for name in case_names:
            await trio.sleep(args.settle_secs)
            before = rss_mib(args.pid)
            mark = len(victims.samples)
            start = time.monotonic()
            async with trio.open_nursery() as case_nursery:
                try:
                    got = await STALL_CASES[name](args, case_nursery)
                except Exception as e:
                    got = f"probe error: {type(e).__name__}: {e}"
                case_nursery.cancel_scope.cancel()
            secs = time.monotonic() - start
            await trio.sleep(0.5)  # the victims' requests in flight at the end
            during = [s for s in victims.samples[mark:] if s.t <= start + secs + 0.5]
            slow = [{"t": round(s.t, 4), "ms": round(s.latency * 1000, 1), "proto": s.proto}
                    for s in during if s.latency * 1000 >= args.slow_ms] if args.slow_ms > 0 else []
            emit({"case": name, "group": "stall", "start": round(start, 4), "secs": round(secs, 2), "got": got,
                  "http": latency_stats(during, "http"), "grpc": latency_stats(during, "grpc"),
                  "rss_before_mib": _r(before), "rss_after_mib": _r(rss_mib(args.pid)),
                  "probe_lag_ms": victims.lag_ms(start, start + secs + 0.5),
                  **({"slow": slow} if args.slow_ms > 0 else {})})
        stop.set()


# ---- memory pinned by partial messages ---------------------------------------------------------


async def run_pinned(args, emit, variant: str) -> None:
    conns_n = max(1, args.pinned_conns)
    payload = bytes(1 << 20) if variant == "pinned_payload" else b""
    prefix = struct.pack(">BI", 0, 64 << 20)
    before = rss_mib(args.pid)
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        conns: list[RawH2] = []
        sent = [0]

        async def one_conn() -> None:
            try:
                conn = await RawH2.connect(nursery, args.grpc_addr)
            except OSError:
                return
            conn.read_responses = False
            conns.append(conn)
            for _ in range(8):
                sid = conn.new_stream()
                if not await conn.send(conn.headers_frame(sid)):
                    return
                n = await conn.send_flow(sid, prefix + payload, end_stream=False, wait=1.0)
                sent[0] += n

        with trio.move_on_after(args.case_wait):
            async with trio.open_nursery() as senders:
                for _ in range(conns_n):
                    senders.start_soon(one_conn)
                    await trio.sleep(0.005)
        sent_bytes = sent[0]
        await trio.sleep(2)
        after = rss_mib(args.pid)
        open_after_send = sum(not c.closed.is_set() for c in conns)
        with trio.move_on_after(args.hold_cap_secs):
            for c in conns:
                await c.closed.wait()
        closes = sorted(c.seen.closed_at - start for c in conns if c.seen.closed_at is not None)
        reasons = sorted({c.seen.summary() for c in conns})
        for c in conns:
            await c.aclose()
        nursery.cancel_scope.cancel()
    delta = None if before is None or after is None else after - before
    emit({"case": variant, "group": "pinned", "conns": len(conns), "streams_per_conn": 8,
          "bytes_sent": sent_bytes, "rss_before_mib": _r(before), "rss_after_mib": _r(after),
          "rss_delta_per_conn_kib": None if delta is None or not conns else round(delta * 1024 / len(conns), 1),
          "open_after_send": open_after_send, "closed_by_server": len(closes),
          "closed_after_s": {"first": _r(closes[0]) if closes else None, "last": _r(closes[-1]) if closes else None},
          "watched_s": args.hold_cap_secs, "got": reasons[:4]})


# ---- soak -------------------------------------------------------------------------------------


async def run_soak(args, emit) -> None:
    values = np.arange(16, dtype=np.float32)
    counts = {"http_ok": 0, "http_failed": 0, "grpc_ok": 0, "grpc_failed": 0}
    rss_series: list[tuple[float, float | None]] = []
    abuse_log: list[str] = []
    small = argparse.Namespace(**{**vars(args), "scale": min(args.scale, 0.05), "case_wait": 10.0})
    rotation = ["grpc_rapid_reset", "http_gzip_bomb", "settings_flood", "grpc_gzip_bomb", "ping_flood",
                "http_json_floats", "empty_data_flood", "max_streams", "continuation_flood", "http_json_bytes"]
    start = time.monotonic()
    deadline = start + args.soak_secs

    async def client(proto: str) -> None:
        await Victims(args, values).loop(trio.Event(), 0.01, proto, counts, deadline)

    async def abuse() -> None:
        for i in range(100_000):
            await trio.sleep(10)
            if time.monotonic() + 12 >= deadline:
                break
            name = rotation[i % len(rotation)]
            async with trio.open_nursery() as nursery:
                try:
                    got = await STALL_CASES[name](small, nursery)
                except Exception as e:
                    got = f"probe error: {type(e).__name__}"
                nursery.cancel_scope.cancel()
            abuse_log.append(f"{name}: {got[:100]}")

    async def sampler() -> None:
        for _ in range(100_000):
            rss_series.append((round(time.monotonic() - start, 1), _r(rss_mib(args.pid))))
            if time.monotonic() >= deadline:
                break
            await trio.sleep(min(30, max(0.0, deadline - time.monotonic())))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler)
        nursery.start_soon(abuse)
        for _ in range(4):
            nursery.start_soon(client, "http")
            nursery.start_soon(client, "grpc")
    if not rss_series or rss_series[-1][0] < args.soak_secs - 0.5:
        rss_series.append((round(time.monotonic() - start, 1), _r(rss_mib(args.pid))))
    emit({"case": "soak", "group": "soak", "secs": args.soak_secs, **counts, "rss_mib": rss_series,
          "abuse": abuse_log})


# ---- hold times -------------------------------------------------------------------------------


async def _tcp_hold(addr, cap: float, drip: bytes | None, head: bytes = b"") -> tuple[float | None, str]:
    """Connect, send ``head``, then a byte of ``drip`` a second; seconds until the server closed."""
    start = time.monotonic()
    try:
        stream = await trio.open_tcp_stream(*addr)
    except OSError as e:
        return None, f"connect failed: {e}"
    answer = bytearray()
    how: list[str] = []
    ended = trio.Event()

    async def reader() -> None:
        for _ in range(1 << 20):
            try:
                data = await stream.receive_some(4096)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                how.append(f"reset ({type(e).__name__})")
                break
            if not data:
                how.append("EOF")
                break
            if len(answer) < 512:
                answer.extend(data)
        ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        with trio.move_on_after(cap):
            try:
                if head:
                    await stream.send_all(head)
                for i in range(int(cap) + 2):
                    if drip:
                        await stream.send_all(drip[i % len(drip) : i % len(drip) + 1])
                    with trio.move_on_after(1):
                        await ended.wait()
                    if ended.is_set():
                        break
            except (trio.BrokenResourceError, OSError):
                how.append("write failed")
                with trio.move_on_after(2):
                    await ended.wait()
        took = time.monotonic() - start
        nursery.cancel_scope.cancel()
    with trio.move_on_after(1):
        await stream.aclose()
    if not ended.is_set() and not how:
        return None, "held to the cap"
    if answer.startswith(b"HTTP/"):
        first = bytes(answer[:80]).split(b"\r\n")[0].decode("latin-1")
    else:
        first = f"{len(answer)} bytes" if answer else ""
    return round(took, 1), ", ".join(x for x in (*how, first and f"answer: {first!r}") if x)


async def _h2_hold(args, cap: float, drip: bool) -> tuple[float | None, str]:
    """An idle HTTP/2 connection (PINGs answered), or one stream dripping a 1 KiB message a byte a second."""
    start = time.monotonic()
    ended = False
    async with trio.open_nursery() as nursery:
        conn = await RawH2.connect(nursery, args.grpc_addr)
        sid = conn.new_stream() if drip else 0
        with trio.move_on_after(cap):
            if drip:
                await conn.send(conn.headers_frame(sid) + hf.DataFrame(sid, data=struct.pack(">BI", 0, 1024)).serialize())
                for _ in range(int(cap) + 2):
                    if not await conn.send(hf.DataFrame(sid, data=b"\x00").serialize()):
                        break
                    with trio.move_on_after(1):
                        await conn.done[sid].wait()
                    if conn.done[sid].is_set() or conn.goaway_event.is_set():
                        break
            else:
                async with trio.open_nursery() as waiters:
                    async def wait_for(event: trio.Event) -> None:
                        await event.wait()
                        waiters.cancel_scope.cancel()
                    waiters.start_soon(wait_for, conn.closed)
                    waiters.start_soon(wait_for, conn.goaway_event)
        took = time.monotonic() - start
        ended = conn.closed.is_set() or conn.goaway_event.is_set() or (drip and conn.done[sid].is_set())
        got = conn.seen.summary()
        if drip and sid in conn.headers:
            status, text = grpc_status(conn.headers[sid])
            got = f"stream ended: grpc-status {status} {text[:80]}; " + got
        await conn.aclose()
        nursery.cancel_scope.cancel()
    if not ended:
        return None, "held to the cap"
    return round(took, 1), got


async def run_hold(args, emit) -> None:
    cap = args.hold_cap_secs
    path = infer_path(args).encode()
    results: dict[str, tuple[float | None, str]] = {}

    async def one(name, coro_fn, *a) -> None:
        results[name] = await coro_fn(*a)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "slow_http_head", _tcp_hold, args.http_addr, cap,
                           b"X-Slow: " + b"a" * 4096, b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        nursery.start_soon(one, "slow_http_body", _tcp_hold, args.http_addr, cap, b"[1.0, ",
                           b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 1000000\r\n\r\n")
        nursery.start_soon(one, "silent_tcp_grpc", _tcp_hold, args.grpc_addr, cap, None)
        nursery.start_soon(one, "idle_h2", _h2_hold, args, cap, False)
        nursery.start_soon(one, "drip_grpc_message", _h2_hold, args, cap, True)
    for name, (secs, how) in results.items():
        emit({"case": name, "group": "hold", "closed_after_s": secs, "cap_s": cap, "got": how})


# ---- main -------------------------------------------------------------------------------------

GROUPS = {"stall": list(STALL_CASES), "pinned": ["pinned_prefix", "pinned_payload"], "soak": ["soak"], "hold": ["hold"]}


def markdown(records: list[dict[str, Any]]) -> str:
    lines = []
    stall = [r for r in records if r["group"] == "stall"]
    if stall:
        lines += ["| case | secs | HTTP victim p99 / max ms (fail) | gRPC victim p99 / max ms (fail) | probe's own lag ms | RSS MiB | abusive connection got |",
                  "|---|---|---|---|---|---|---|"]
        for r in stall:
            h, g = r["http"], r["grpc"]
            rss = r.get("rss_mib") or (f"{r.get('rss_before_mib')} -> {r.get('rss_after_mib')}")
            lines.append(f"| {r['case']} | {r['secs']} | {h['p99_ms']} / {h['max_ms']} ({h['failed']}/{h['n']}) | "
                         f"{g['p99_ms']} / {g['max_ms']} ({g['failed']}/{g['n']}) | {r.get('probe_lag_ms', '-')} | {rss} | "
                         f"{r.get('got', '')[:160]} |")
        lines.append("")
    pinned = [r for r in records if r["group"] == "pinned"]
    if pinned:
        lines += ["| case | conns x streams | bytes sent | RSS before -> after MiB | KiB per conn | closed by server (first / last s) |",
                  "|---|---|---|---|---|---|"]
        for r in pinned:
            c = r["closed_after_s"]
            lines.append(f"| {r['case']} | {r['conns']} x {r['streams_per_conn']} | {r['bytes_sent']} | "
                         f"{r['rss_before_mib']} -> {r['rss_after_mib']} | {r['rss_delta_per_conn_kib']} | "
                         f"{r['closed_by_server']}/{r['conns']} ({c['first']} / {c['last']}, watched {r['watched_s']} s) |")
        lines.append("")
    for r in records:
        if r["group"] == "soak":
            lines += [f"soak {r['secs']} s: HTTP {r['http_ok']} correct / {r['http_failed']} failed, "
                      f"gRPC {r['grpc_ok']} correct / {r['grpc_failed']} failed",
                      "RSS MiB (t s, MiB): " + ", ".join(f"({t}, {m})" for t, m in r["rss_mib"]), ""]
    hold = [r for r in records if r["group"] == "hold"]
    if hold:
        lines += ["| hold case | closed after s (cap) | how |", "|---|---|---|"]
        for r in hold:
            lines.append(f"| {r['case']} | {r['closed_after_s'] if r['closed_after_s'] is not None else 'held'} "
                         f"({r['cap_s']}) | {r['got'][:160]} |")
    return "\n".join(lines)


async def amain(args) -> None:
    selected: list[str] = []
    for name in args.cases.split(","):
        name = name.strip()
        if not name:
            continue
        for case in GROUPS.get(name, [name]):
            if case not in selected:
                selected.append(case)
    unknown = [c for c in selected if c not in STALL_CASES and c not in ("pinned_prefix", "pinned_payload", "soak", "hold")]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; groups: {list(GROUPS)}, cases: {[c for g in GROUPS.values() for c in g]}")
    records: list[dict[str, Any]] = []
    out = open(args.out, "a")  # noqa: SIM115 - kept open for the run, lines flushed as they come

    def emit(record: dict[str, Any]) -> None:
        record = {"label": args.label, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **record}
        records.append(record)
        out.write(json.dumps(record) + "\n")
        out.flush()
        print(f"# {record['case']}: {json.dumps({k: v for k, v in record.items() if k not in ('label', 'time')})[:400]}",
              file=sys.stderr)

    emit({"case": "start", "group": "meta", "http": args.http, "grpc": args.grpc, "pid": args.pid,
          "scale": args.scale, "rss_mib": _r(rss_mib(args.pid)), "cases": selected})
    stall = [c for c in selected if c in STALL_CASES]
    if stall:
        if any(c.endswith("gzip_bomb") for c in stall):
            zeros_gzip(int((256 << 20) * args.scale))  # built before the clock starts
        for case, datatype in (("http_json_bytes", "BYTES"), ("http_json_floats", "FP32")):
            if case in stall:
                json_body(args, datatype)  # likewise
        for case, kind in (("http_binary_bytes", "empty"), ("http_binary_bytes_out", "empty_out"),
                           ("http_varied_bytes", "varied")):
            if case in stall:
                binary_bytes_body(args, kind)
        if "http_gzip_json" in stall:
            gzip_json_body(args)
        await run_stall(args, emit, stall)
    for variant in ("pinned_prefix", "pinned_payload"):
        if variant in selected:
            await run_pinned(args, emit, variant)
    if "hold" in selected:
        await run_hold(args, emit)
    if "soak" in selected:
        await run_soak(args, emit)
    out.close()
    print(markdown(records))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", default="127.0.0.1:8000", help="the server's HTTP address (127.0.0.1 only)")
    parser.add_argument("--grpc", default="127.0.0.1:8001", help="the server's gRPC address (127.0.0.1 only)")
    parser.add_argument("--pid", type=int, default=None, help="the server's process id, for RSS")
    parser.add_argument("--cases", default="stall,pinned,hold,soak", help="groups or cases, comma separated")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every count and size")
    parser.add_argument("--soak-secs", type=float, default=300.0)
    parser.add_argument("--hold-cap-secs", type=float, default=180.0)
    parser.add_argument("--pinned-conns", type=int, default=50, help="connections of the pinned cases (not scaled)")
    parser.add_argument("--baseline-secs", type=float, default=5.0, help="quiet victim window before the stall cases")
    parser.add_argument("--settle-secs", type=float, default=2.0, help="quiet time between stall cases")
    parser.add_argument("--case-wait", type=float, default=60.0, help="the most one abuse case may take")
    parser.add_argument("--victim-timeout", type=float, default=30.0, help="a victim request slower than this failed")
    parser.add_argument("--model", default="identity_fp32")
    parser.add_argument("--input", default="INPUT0")
    parser.add_argument("--bytes-model", default="",
                        help="the model of the BYTES cases (its input --input, BYTES [-1]); default: --model")
    parser.add_argument("--slow-ms", type=float, default=0.0,
                        help="list each victim request of a stall case at least this slow (its start on the "
                             "system's monotonic clock, to set against a server-side trace); 0: none")
    parser.add_argument("--out", default="probe_abuse.jsonl", help="JSON lines, appended")
    parser.add_argument("--label", default="", help="a name for this run in the JSON lines (e.g. old / new)")
    args = parser.parse_args()
    args.http_addr = parse_addr(args.http)
    args.grpc_addr = parse_addr(args.grpc)
    socket.setdefaulttimeout(30)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    trio.run(amain, args)


if __name__ == "__main__":
    main()
