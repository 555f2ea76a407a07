"""A load-generator worker process: non-blocking sockets on one epoll loop, no framework.

The parent (:mod:`trident.perf.engine`) starts one or more of these with
:func:`serve_worker` and drives them over a pipe:

* ``("concurrency", n)``: keep ``n`` requests outstanding, one per keep-alive connection;
* ``("rate", per_second, distribution, seed, max_connections)``: send on a schedule (constant
  or Poisson), on the first idle connection, opening more up to ``max_connections``; a request
  that finds none waits and counts as delayed;
* ``("pause",)``: start nothing new, finish what is in flight, then answer ``("paused", ...)``;
* ``("stop",)``: close the connections and exit.

While running it sends ``("records", array bytes, cpu seconds, delayed, now_ns, error)`` about
every 50 ms: the requests that finished since the last report (see
:mod:`trident.perf.measure` for the layout), its own CPU time, and the first error message.
The request bytes are built once by the parent (:mod:`trident.perf.wire`) and sent unchanged.
"""

from __future__ import annotations

import errno
import random
import select
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from trident.perf.wire import H2Connection, HTTPResponseReader, PerfError, decode_fields, grpc_messages

__all__ = ["WorkerSpec", "serve_worker"]

_FLUSH_NS = 50_000_000
_RECV = 1 << 18
_SOLO_CHECK_NS = 5_000_000  # how often the one-connection loop looks at the pipe and the clock
_SOLO_TIMEOUT = struct.pack("ll", 0, 20_000)  # its read's timeout (SO_RCVTIMEO): 20 ms


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker sends and where: ``protocol`` is ``http``, ``grpc`` or ``stream``;
    ``payloads`` are whole HTTP requests, or serialized ``ModelInferRequest`` messages, sent in
    turn (one per ``--input-data`` entry)."""

    protocol: str
    host: str
    port: int
    payloads: tuple[bytes, ...]
    connect_timeout_s: float = 5.0


class _Conn:
    __slots__ = ("sock", "http", "h2", "stream", "busy", "start", "sent", "first", "out", "msgbuf", "open")

    def __init__(self, sock: socket.socket, spec: WorkerSpec) -> None:
        self.sock = sock
        self.http = HTTPResponseReader() if spec.protocol == "http" else None
        self.h2 = H2Connection(f"{spec.host}:{spec.port}", collect_messages=spec.protocol == "stream") \
            if spec.protocol != "http" else None
        self.stream = 0
        self.busy = False
        self.start = self.sent = self.first = 0
        self.out = b""
        self.msgbuf = bytearray()
        self.open = True  # False once dropped


class _Worker:
    def __init__(self, conn: Connection, spec: WorkerSpec) -> None:
        self.pipe = conn
        self.spec = spec
        self.ep = select.epoll()
        self.pipe_fd = conn.fileno()
        self.ep.register(self.pipe_fd, select.EPOLLIN)
        self.by_fd: dict[int, _Conn] = {}
        self.conns: list[_Conn] = []
        self.idle: deque[_Conn] = deque()
        self.records: list[tuple[int, int, int, int, int]] = []
        self.error = ""
        self.delayed = 0
        self.payloads = spec.payloads
        self.turn = 0
        self.busy = 0  # requests in flight
        self.received = 0  # when the bytes being handled arrived (0: not in a receive)
        # connections whose next request goes out once this poll's events are handled (as wrk
        # does: answers first, then the new requests, rather than one connection at a time)
        self.to_send: list[_Conn] = []
        self.backlog = 0  # rate mode: scheduled requests waiting for a connection
        self.mode = "idle"
        self.target = 0
        self.rate = 0.0
        self.poisson = False
        self.rng = random.Random(0)
        self.next_send = 0
        self.max_conns = 1
        self.pausing = False
        self.last_flush = time.monotonic_ns()
        self.cpu_mark = time.process_time()

    # -- connections

    def _open(self) -> _Conn:
        try:
            sock = socket.create_connection((self.spec.host, self.spec.port), timeout=self.spec.connect_timeout_s)
        except OSError as e:
            raise PerfError(f"cannot connect to {self.spec.host}:{self.spec.port}: {e.strerror or e}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        c = _Conn(sock, self.spec)
        if c.h2 is not None:
            c.out = c.h2.initiate()
            if self.spec.protocol == "stream":
                c.stream = c.h2.start("/inference.GRPCInferenceService/ModelStreamInfer")
                c.out += c.h2.outgoing()
        self.ep.register(sock.fileno(), select.EPOLLIN)
        self.by_fd[sock.fileno()] = c
        self.conns.append(c)
        return c

    def _drop(self, c: _Conn, why: str) -> None:
        if c.busy:
            self._finish(c, ok=False, message=why)
        fd = c.sock.fileno()
        if self.by_fd.pop(fd, None) is not None:
            self.ep.unregister(fd)
        c.sock.close()
        c.open = False
        if c in self.conns:
            self.conns.remove(c)
        if c in self.idle:
            self.idle.remove(c)

    # -- requests

    def _send(self, c: _Conn) -> None:
        c.busy = True
        self.busy += 1
        c.first = 0
        payload = self.payloads[self.turn]
        self.turn = (self.turn + 1) % len(self.payloads)
        if c.h2 is None:
            data = payload
        elif self.spec.protocol == "grpc":
            c.stream, data = c.h2.unary("/inference.GRPCInferenceService/ModelInfer", payload)
            if c.out:
                data, c.out = c.out + data, b""
        else:
            c.h2.send_message(c.stream, payload, end=False)
            data = c.out + c.h2.outgoing()
            c.out = b""
        # the clock runs from the write to the read that completes the answer (as the C tools
        # time it), so building and parsing the messages is not counted as latency
        c.start = time.monotonic_ns()
        self._write(c, data)
        c.sent = time.monotonic_ns()

    def _write(self, c: _Conn, data: bytes) -> None:
        if c.out:
            data = c.out + data
            c.out = b""
        try:
            n = c.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError as e:
            self._drop(c, f"send failed: {e.strerror or e}")
            return
        if n < len(data):
            c.out = data[n:]
            self.ep.modify(c.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)

    def _finish(self, c: _Conn, ok: bool, message: str = "") -> None:
        end = self.received or time.monotonic_ns()
        self.records.append((c.start, c.sent, c.first or end, end, 1 if ok else 0))
        if not ok and not self.error:
            self.error = message
        c.busy = False
        self.busy -= 1

    def _readable(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(_RECV)
        except BlockingIOError:
            return
        except OSError as e:
            self._drop(c, f"receive failed: {e.strerror or e}")
            return
        if not data:
            self._drop(c, "the server closed the connection")
            return
        self.received = time.monotonic_ns()
        if c.busy and not c.first:
            c.first = self.received
        try:
            if c.http is not None:
                self._http_answers(c, c.http.feed(data))
            elif self.spec.protocol == "grpc":
                for ev in c.h2.receive(data):  # type: ignore[union-attr]
                    if ev.stream == c.stream and c.busy:
                        self._finish(c, ev.status == 0, f"gRPC status {ev.status}: {ev.message}")
                        self._next(c)
                out = c.h2.outgoing()  # type: ignore[union-attr]
                if out:
                    self._write(c, out)
            else:
                self._stream_data(c, data)
        except PerfError as e:
            self._drop(c, str(e))
        self.received = 0

    def _http_answers(self, c: _Conn, answers: list[tuple[int, bytes]]) -> None:
        for status, body in answers:
            ok = status == 200
            self._finish(c, ok, "" if ok else f"HTTP {status}: {body.decode(errors='replace')}")
            self._next(c)

    def _stream_data(self, c: _Conn, data: bytes) -> None:
        h2 = c.h2
        assert h2 is not None
        for ev in h2.receive(data):
            if ev.stream == c.stream:
                self._drop(c, f"the stream ended: gRPC status {ev.status}: {ev.message}")
                return
        buf = h2.messages.get(c.stream)
        if buf:
            for msg in grpc_messages(buf):
                f = decode_fields(msg)
                err = f.get(1, [b""])[0]
                if isinstance(err, bytes) and err:
                    if c.busy:
                        self._finish(c, False, f"stream error: {err.decode(errors='replace')}")
                        self._next(c)
                    continue
                if _final(f) and c.busy:
                    self._finish(c, True)
                    self._next(c)
        out = h2.outgoing()
        if out:
            self._write(c, out)

    def _next(self, c: _Conn) -> None:
        if not c.open:
            return
        if self.mode == "concurrency" and not self.pausing and self.busy + len(self.to_send) < self.target:
            self.to_send.append(c)
            return
        if self.mode == "rate" and not self.pausing and self.backlog:
            self.backlog -= 1
            self.to_send.append(c)
            return
        self.idle.append(c)

    # -- commands

    def _command(self, msg: tuple) -> bool:  # type: ignore[type-arg]
        kind = msg[0]
        if kind == "stop":
            return False
        if kind == "pause":
            self.pausing = True
            self.backlog = 0
        elif kind == "concurrency":
            self.mode, self.target, self.pausing = "concurrency", int(msg[1]), False
            while len(self.conns) < self.target:
                self.idle.append(self._open())
            while self.busy < self.target and self.idle:
                self._send(self.idle.popleft())
        elif kind == "rate":
            self.mode, self.rate, self.pausing = "rate", float(msg[1]), False
            self.poisson = msg[2] == "poisson"
            self.rng = random.Random(int(msg[3]))
            self.max_conns = int(msg[4])
            self.next_send = time.monotonic_ns()
            if not self.conns:
                self.idle.append(self._open())
        return True

    def _solo_ready(self) -> bool:
        """Whether the load is one HTTP/1.1 request at a time on one connection (see :meth:`_solo`)."""
        if self.mode != "concurrency" or self.target != 1 or self.pausing or self.spec.protocol != "http":
            return False
        if len(self.conns) != 1 or self.to_send:
            return False
        c = self.conns[0]
        return c.busy and not c.out

    def _solo(self) -> None:
        """Concurrency 1 over HTTP/1.1: wait for each answer in a blocking read and send the next
        request at once, with no epoll wait and no event dispatch in between. At one connection the
        generator's own time between an answer and the next request is part of every round trip
        (and wrk and h2load spend about 3 us there). Returns, with the connection back to
        non-blocking and its state as the event loop keeps it, when a command arrives or anything
        unusual happens (a partial write, a closed or failed connection, a failed answer)."""
        c = self.conns[0]
        sock = c.sock
        reader = c.http
        assert reader is not None
        mono = time.monotonic_ns
        sock.setblocking(True)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _SOLO_TIMEOUT)
        check_at = mono() + _SOLO_CHECK_NS
        try:
            while True:
                try:
                    data = sock.recv(_RECV)
                except BlockingIOError:  # SO_RCVTIMEO: nothing yet
                    data = None
                except OSError as e:
                    self._drop(c, f"receive failed: {e.strerror or e}")
                    return
                now = mono()
                answered = False
                if data is not None:
                    if not data:
                        self._drop(c, "the server closed the connection")
                        return
                    c.first = c.first or now
                    try:
                        answers = reader.feed(data)
                    except PerfError as e:
                        self._drop(c, str(e))
                        return
                    if answers and (len(answers) != 1 or answers[0][0] != 200):
                        self.received = now
                        self._http_answers(c, answers)
                        self.received = 0
                        return
                    if answers:
                        self.records.append((c.start, c.sent, c.first, now, 1))
                        answered = True
                if now >= check_at:  # the pipe and the clock, now and then
                    check_at = now + _SOLO_CHECK_NS
                    if now - self.last_flush >= _FLUSH_NS:
                        self._flush(now)
                    if self.pipe.poll():
                        if answered:  # idle: the command decides what it sends next
                            c.busy = False
                            self.busy -= 1
                            self.idle.append(c)
                        return
                if answered and not self._solo_send(c):
                    return
        finally:
            if c.open:
                sock.setblocking(False)

    def _solo_send(self, c: _Conn) -> bool:
        """The next request of :meth:`_solo` (``c`` stays busy); False when the loop must hand the
        connection back: a failed write (the request fails) or a partial one (epoll finishes it)."""
        payload = self.payloads[self.turn]
        self.turn = (self.turn + 1) % len(self.payloads)
        c.first = 0
        c.start = time.monotonic_ns()
        try:
            n = c.sock.send(payload)
        except OSError as e:
            self._drop(c, f"send failed: {e.strerror or e}")
            return False
        c.sent = time.monotonic_ns()
        if n < len(payload):
            c.out = payload[n:]
            self.ep.modify(c.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
            return False
        return True

    def _schedule(self, now: int) -> None:
        while self.next_send <= now:
            gap = self.rng.expovariate(self.rate) if self.poisson else 1.0 / self.rate
            self.next_send += int(gap * 1e9)
            if self.idle:
                self._send(self.idle.popleft())
            elif len(self.conns) < self.max_conns:
                self._send(self._open())
            else:
                self.delayed += 1
                self.backlog += 1

    def _flush(self, now: int, kind: str = "records") -> None:
        arr = np.array(self.records, dtype=np.int64).reshape(-1, 5)
        self.records = []
        cpu = time.process_time()
        self.pipe.send((kind, arr.tobytes(), cpu - self.cpu_mark, self.delayed, now, self.error))
        self.cpu_mark = cpu
        self.delayed = 0
        self.error = ""
        self.last_flush = now

    def run(self) -> None:
        running = True
        while running:
            if self._solo_ready():
                self._solo()
            now = time.monotonic_ns()
            timeout = max(0, self.last_flush + _FLUSH_NS - now)
            if self.mode == "rate" and not self.pausing:
                timeout = min(timeout, max(0, self.next_send - now))
            for fd, mask in self.ep.poll(timeout / 1e9):
                if fd == self.pipe_fd:
                    try:
                        running = self._command(self.pipe.recv())
                    except PerfError as e:
                        self.error = self.error or str(e)
                        self._flush(time.monotonic_ns(), "failed")
                        self.mode = "idle"
                    except EOFError:
                        running = False
                    continue
                c = self.by_fd.get(fd)
                if c is None:
                    continue
                if mask & select.EPOLLOUT and c.out:
                    data, c.out = c.out, b""
                    self.ep.modify(fd, select.EPOLLIN)
                    self._write(c, data)
                if mask & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP) and fd in self.by_fd:
                    self._readable(c)
            if self.to_send:
                batch, self.to_send = self.to_send, []
                for c in batch:
                    if c.open:
                        self._send(c)
            now = time.monotonic_ns()
            if self.mode == "rate" and not self.pausing:
                try:
                    self._schedule(now)
                except PerfError as e:
                    self.error = self.error or str(e)
            if self.pausing and self.mode != "idle" and not self.busy:
                self._flush(now, "paused")
                self.mode, self.pausing = "idle", False
                continue
            if now - self.last_flush >= _FLUSH_NS and self.mode != "idle":
                self._flush(now)
        for c in list(self.conns):
            c.sock.close()
        self.ep.close()


def _final(fields: dict[int, list[object]]) -> bool:
    """Whether a ``ModelStreamInferResponse`` is a request's last (``triton_final_response``
    true, or absent: a model that is not decoupled answers once)."""
    inner = fields.get(2, [b""])[0]
    if not isinstance(inner, bytes):
        return True
    for entry in decode_fields(inner).get(4, []):
        kv = decode_fields(entry)  # type: ignore[arg-type]
        if kv.get(1, [b""])[0] == b"triton_final_response":
            value = decode_fields(kv.get(2, [b""])[0])  # type: ignore[arg-type]
            return bool(value.get(1, [0])[0])
    return True


def serve_worker(conn: Connection, spec: WorkerSpec) -> None:
    """Process entry point: run commands from ``conn`` until ``stop`` or the pipe closes.
    A failure to connect is reported as a ``failed`` message; nothing is raised."""
    try:
        conn.send(("ready", b"", 0.0, 0, time.monotonic_ns(), ""))
        _Worker(conn, spec).run()
    except KeyboardInterrupt:
        pass
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
