"""One connection's socket, read and written without trio's stream layer: what both front ends share.

trident's HTTP/1.1 server (:mod:`trident.http.connection`) and its gRPC transport
(:mod:`trident.grpc.transport`) move their bytes through a :class:`SocketIO`: non-blocking
``os.read`` / ``os.writev`` on the socket's descriptor that wait through trio only when the
kernel says so (a trio ``SocketStream`` costs a checkpoint, a lock and a memoryview per call).
What it does, in one place:

* **reads** (:meth:`SocketIO.receive`): one ``read`` while bytes are waiting; after a read that
  emptied the socket (fewer bytes than asked for) the next one waits for bytes first instead of
  trying a read that would almost always fail; ``yielded`` is set whenever the task let others
  run (a wait, or fairness);
* **writes of parts** (:meth:`SocketIO.write_now`, :meth:`~SocketIO.write`): one ``writev`` of
  a response's parts (head and body buffers, no join), the rest, if the kernel took part of it,
  after waiting for the socket;
* **flush order**: one write at a time. A write that must wait holds the connection's turn
  (``busy``), and every later write waits for it (:meth:`~SocketIO.wait_turn`); a write that
  cannot wait (:meth:`~SocketIO.write_soon`, from a task that delivers another connection's
  answer) writes what the socket takes and leaves the rest to a task that holds the turn; a
  small response may wait for the end of the loop's round (:meth:`~SocketIO.defer` and the
  server's :class:`Flusher`) and the next write carries it in front of its own parts;
* **back-pressure**: a peer that does not read blocks only the writes of its own connection,
  in their task (or the turn's), never the loop;
* **send timeout** (``send_timeout``, nginx's ``send_timeout``): a write that waits for the
  socket and sees none of its bytes taken for that long gives up: the socket is marked broken
  and ``timed_out``, and closes with a reset (``SO_LINGER`` 0: the kernel drops what it holds
  for the peer). The timer is the wait's own deadline, set only when a write must wait; the
  bytes such writes hold are counted in :data:`BACKLOG`;
* **fairness**: with ``yield_bytes``, a connection that moves that many bytes without waiting
  (a large body arriving fast, a response the socket takes at once) lets other tasks run.

A socket error marks it ``broken`` (nothing more is written; reads raise
``trio.BrokenResourceError``); the protocol decides what that ends. A stream other than a plain
TCP socket (TLS) goes through trio's stream calls, with the same order and turn. Used on the
trio thread only.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import trio

log = logging.getLogger("trident.sockets")

IOV_MAX = 512  # buffers per writev (the kernel takes up to 1024)
TLS_SEND_SIZE = 64 * 1024  # a TLS stream's writes, when a send timeout applies: bytes per timed send
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)


class SendBacklog:
    """What peers that do not read cost the server, across its connections (one per process,
    :data:`BACKLOG`; the metrics port reads it): ``waiting``, the bytes of writes that wait for
    a socket (and, for gRPC, of messages that wait for a flow-control window); ``timed_out``,
    per ``(protocol, what)``, the connections closed and streams reset by a send timeout."""

    __slots__ = ("waiting", "timed_out")

    def __init__(self) -> None:
        self.waiting = 0
        self.timed_out: dict[tuple[str, str], int] = {}

    def count_timeout(self, protocol: str, what: str) -> None:
        key = (protocol, what)
        self.timed_out[key] = self.timed_out.get(key, 0) + 1


BACKLOG = SendBacklog()


def size_of(parts: list[Any]) -> int:
    """The bytes in ``parts`` (buffers of any item size)."""
    return sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)


def consume(parts: list[Any], n: int) -> None:
    """Drop the first ``n`` bytes of ``parts`` (bytes-like buffers), in place."""
    done = 0
    while done < len(parts) and n >= len(parts[done]):
        n -= len(parts[done])
        done += 1
    del parts[:done]
    if n:
        parts[0] = memoryview(parts[0]).cast("B")[n:]


class SocketIO:
    """A connection's socket (see the module docstring). ``tasks`` is the connection's nursery,
    where :meth:`write_soon` starts the task that writes what the socket did not take (None:
    the connection is closing, and writes what is left itself); ``yield_bytes`` the bytes moved
    between two yields of a busy connection (inf: none); ``flusher`` the server's end-of-round
    writer (:meth:`defer`); ``send_timeout`` how long a write may wait for the socket to take
    any of its bytes (inf: for ever) and ``protocol`` the name its time-outs are counted under."""

    __slots__ = ("stream", "fd", "yield_bytes", "drained", "moved", "yielded", "broken", "busy", "deferred",
                 "tasks", "flusher", "on_broken", "send_timeout", "timed_out", "protocol")

    def __init__(self, stream: trio.abc.Stream, *, yield_bytes: float = math.inf,
                 flusher: Flusher | None = None, on_broken: Callable[[], None] | None = None,
                 send_timeout: float = math.inf, protocol: str = "") -> None:
        self.stream = stream
        self.send_timeout = send_timeout
        self.protocol = protocol
        self.timed_out = False  # a write gave up on the peer (send_timeout): the socket is broken
        #: the plain TCP socket's descriptor (-1: TLS or another stream, through trio's calls)
        self.fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self.yield_bytes = yield_bytes
        self.drained = False  # the last read emptied the socket: the next one waits first
        self.moved = 0  # bytes received or sent since the task last yielded
        self.yielded = False  # the task let others run (a wait or a yield); its user resets it
        self.broken = False  # a read or write failed: nothing more is written
        #: while a task writes what the socket did not take at once (the connection's turn),
        #: the event it sets when done: later writes wait for it (:meth:`wait_turn`)
        self.busy: trio.Event | None = None
        self.deferred: list[Any] | None = None  # parts waiting for the end of the round (see defer)
        self.tasks: trio.Nursery | None = None
        self.flusher = flusher
        #: called when a write in a task of its own (:meth:`write_soon`'s rest) finds the socket
        #: broken (the writes made in the caller's task leave ``broken`` for the caller to see)
        self.on_broken = on_broken

    # ---- reading -------------------------------------------------------------------------------

    async def receive(self, size: int) -> bytes | bytearray:
        """Up to ``size`` received bytes, b"" at EOF; raises trio.BrokenResourceError.

        Not a checkpoint when bytes are waiting, except once per ``yield_bytes`` moved without
        a wait. After a read that emptied the socket (fewer bytes than asked for), the next
        one waits for bytes first (a client waiting for its answer sends nothing meanwhile).
        """
        fd = self.fd
        if fd < 0:
            self.yielded = True
            try:
                return await self.stream.receive_some(size)
            except trio.ClosedResourceError as exc:
                raise trio.BrokenResourceError(exc) from exc
        if self.drained:
            self.yielded = True
            self.moved = 0
            await trio.lowlevel.wait_readable(fd)
        while True:
            try:
                data = os.read(fd, size)
            except BlockingIOError:
                self.yielded = True
                self.moved = 0
                await trio.lowlevel.wait_readable(fd)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(exc) from exc
            self.drained = len(data) < size
            self.moved += len(data)
            if self.moved >= self.yield_bytes:
                self.moved = 0
                self.yielded = True
                await trio.lowlevel.checkpoint()
            return data

    async def receive_into(self, view: memoryview) -> int:
        """Receive up to ``len(view)`` bytes straight into ``view`` (a writable byte view): the
        count, 0 at EOF; raises trio.BrokenResourceError. Checkpoints as :meth:`receive`; over a
        stream without a file descriptor (TLS) the bytes are received then copied in."""
        if self.fd < 0:
            data = await self.receive(len(view))
            view[: len(data)] = data
            return len(data)
        if self.drained:
            self.yielded = True
            self.moved = 0
            await trio.lowlevel.wait_readable(self.fd)
        while True:
            try:
                n = os.readv(self.fd, (view,))
            except BlockingIOError:
                self.yielded = True
                self.moved = 0
                await trio.lowlevel.wait_readable(self.fd)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(exc) from exc
            self.drained = n < len(view)
            self.moved += n
            if self.moved >= self.yield_bytes:
                self.moved = 0
                self.yielded = True
                await trio.lowlevel.checkpoint()
            return n

    async def wait_readable(self) -> None:
        """Wait until bytes (or EOF) can be read (cancelling the wait loses nothing)."""
        if self.fd < 0:
            raise RuntimeError("wait_readable needs a plain socket")
        await trio.lowlevel.wait_readable(self.fd)

    def read_now(self, size: int) -> bytes | None:
        """Up to ``size`` bytes read here and now without waiting: None when none is waiting,
        b"" at EOF or when the socket failed (``broken`` is then set)."""
        try:
            return os.read(self.fd, size)
        except BlockingIOError:
            return None
        except OSError:
            self.broken = True
            return b""

    # ---- writing -------------------------------------------------------------------------------

    async def wait_turn(self) -> None:
        """Wait until no other write is in progress (not a checkpoint when none is). The caller
        then writes with :meth:`write_now` before its next checkpoint, or with :meth:`write`."""
        while self.busy is not None:
            await self.busy.wait()

    def write_now(self, parts: list[Any], size: int = -1) -> bool:
        """One write of ``parts`` (``size`` bytes in all, or -1), here and now, at the
        caller's turn (:meth:`wait_turn`); True when all of it went out (or the socket is
        broken: nothing more will), else ``parts`` is left holding what remains for
        :meth:`write_rest` (which may also owe the loop a yield)."""
        if self.broken:
            return True
        fd = self.fd
        if fd < 0:
            return False
        try:
            n = os.writev(fd, parts[:IOV_MAX]) if len(parts) > 1 else os.write(fd, parts[0])
        except BlockingIOError:
            return False
        except OSError:
            self.broken = True
            return True
        self.moved += n
        if n == size and self.moved < self.yield_bytes:  # all of it at once (the usual case)
            return True
        consume(parts, n)
        return not parts and self.moved < self.yield_bytes

    async def write_rest(self, parts: list[Any]) -> None:
        """Write what :meth:`write_now` left, waiting for the socket through trio; the
        connection's turn is held meanwhile (later writes wait for it). Never raises but
        Cancelled (a failure marks the socket broken)."""
        busy = self.busy = trio.Event()
        try:
            await self._write_all(parts)
        finally:
            self.end_turn(busy)

    async def write(self, parts: list[Any], size: int = -1) -> None:
        """Write ``parts`` (``size`` bytes in all, when the caller knows) whole and in order,
        after the writes before it and what waits for the end of the round: one writev when the
        socket takes them. A no-op once broken; never raises but Cancelled."""
        if self.busy is not None:
            await self.wait_turn()
        if self.deferred is not None:
            parts[:0] = self.deferred
            self.deferred = None
            size = -1
        if parts and not self.write_now(parts, size):
            await self.write_rest(parts)

    def write_soon(self, parts: list[Any]) -> None:
        """Write ``parts`` without waiting (a task that delivers another's answer, the end of
        the round), behind what waits for the end of the round: what the socket takes now, the
        rest by a task of the connection's that holds the turn, after the write in progress,
        if any. Never raises."""
        if self.broken:
            return
        if self.deferred is not None:
            parts[:0] = self.deferred
            self.deferred = None
        if self.busy is None and (self.write_now(parts) or not parts):
            return
        if self.tasks is None:  # the connection is closing: it writes what is left itself
            self.deferred = parts if self.deferred is None else self.deferred + parts
            return
        previous, busy = self.take_turn()
        self.tasks.start_soon(self._write_after, previous, parts, busy, name="trident.sockets.write_rest")

    async def _write_after(self, previous: trio.Event | None, parts: list[Any], busy: trio.Event) -> None:
        try:
            if previous is not None:
                await previous.wait()
            await self._write_all(parts)
        finally:
            self.end_turn(busy)
        if self.broken and self.on_broken is not None:
            self.on_broken()

    def take_turn(self) -> tuple[trio.Event | None, trio.Event]:
        """Take the connection's turn now for a write whose parts a task makes later (a large
        answer encoded off the loop): later writes wait for it. Returns the write to wait for
        first (or None) and the turn, which :meth:`end_turn` gives back; write the parts with
        :meth:`write_in_turn`."""
        previous = self.busy
        busy = self.busy = trio.Event()
        return previous, busy

    async def write_in_turn(self, parts: list[Any]) -> None:
        """Write ``parts`` whole (behind what waits for the end of the round) in a turn taken
        with :meth:`take_turn`, once the write before it is done. Never raises but Cancelled."""
        if self.deferred is not None:
            parts[:0] = self.deferred
            self.deferred = None
        await self._write_all(parts)

    def end_turn(self, busy: trio.Event) -> None:
        """Give back a turn taken with :meth:`take_turn`: the writes behind it go on."""
        if self.busy is busy:
            self.busy = None
        busy.set()

    async def _write_all(self, parts: list[Any]) -> None:
        fd = self.fd
        waiting = 0  # the bytes left, counted in BACKLOG, once a wait for the socket started
        try:
            if fd < 0:
                if parts and not self.broken:
                    await self._send_stream(b"".join(parts))
                return
            while True:
                if self.moved >= self.yield_bytes:
                    self.moved = 0
                    self.yielded = True
                    await trio.lowlevel.checkpoint()
                if not parts or self.broken:
                    return
                try:
                    n = os.writev(fd, parts[:IOV_MAX]) if len(parts) > 1 else os.write(fd, parts[0])
                except BlockingIOError:
                    self.yielded = True
                    self.moved = 0
                    if not waiting:
                        waiting = size_of(parts)
                        BACKLOG.waiting += waiting
                    with trio.move_on_after(self.send_timeout) as waited:
                        await trio.lowlevel.wait_writable(fd)
                    if waited.cancelled_caught:
                        self.give_up()
                        return
                    continue
                self.moved += n
                consume(parts, n)
                if waiting:
                    BACKLOG.waiting -= n
                    waiting -= n
        except (OSError, *_STREAM_ERRORS):
            self.broken = True
        finally:
            if waiting:
                BACKLOG.waiting -= waiting

    async def _send_stream(self, data: bytes) -> None:
        """``data`` through the stream's own calls (TLS): whole, or, under a send timeout, in
        ``TLS_SEND_SIZE`` slices each of which must go within it (raises trio's stream errors)."""
        timeout = self.send_timeout
        if timeout == math.inf:
            await self.stream.send_all(data)
            return
        view = memoryview(data)
        left = len(view)
        BACKLOG.waiting += left
        try:
            for pos in range(0, len(view), TLS_SEND_SIZE):
                chunk = view[pos:pos + TLS_SEND_SIZE]
                with trio.move_on_after(timeout) as waited:
                    await self.stream.send_all(chunk)
                if waited.cancelled_caught:
                    self.give_up()
                    return
                BACKLOG.waiting -= len(chunk)
                left -= len(chunk)
        finally:
            BACKLOG.waiting -= left

    def give_up(self) -> None:
        """The peer took none of a write's bytes for ``send_timeout``: nothing more is written,
        and the socket, once closed, is reset (SO_LINGER 0: what the kernel holds for the peer
        is dropped instead of lingering). Counted in :data:`BACKLOG`. Never raises."""
        if self.timed_out:
            return
        self.timed_out = self.broken = True
        BACKLOG.count_timeout(self.protocol, "connection")
        log.debug("%s connection closed: the peer took no bytes for %g s (send timeout)",
                 self.protocol or "a", self.send_timeout)
        stream: Any = self.stream
        sock = getattr(stream, "socket", None) or getattr(getattr(stream, "transport_stream", None), "socket", None)
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass

    # ---- writes left for the end of the round ---------------------------------------------------

    def defer(self, parts: list[Any]) -> None:
        """Keep ``parts`` (a whole answer) for the end of the loop's round (the server's
        :class:`Flusher`), or for the connection's next write, which carries them first. The
        caller checked that no write is in progress (``busy`` is None)."""
        if self.deferred is None:
            self.deferred = parts
            flusher = self.flusher
            assert flusher is not None
            flusher.add(self)
        else:  # pipelined requests answered in the same pass
            self.deferred += parts

    def flush_deferred(self) -> None:
        """Write what waits for the end of the round, here and now (the flusher's call, or a
        closing connection's; never raises)."""
        parts = self.deferred
        if parts is not None:
            self.deferred = None
            self.write_soon(parts)


class Flusher:
    """Small answers written together, when the run loop is about to wait for I/O.

    An answer written the moment it is ready wakes its client once per answer: across CPUs
    that is an inter-processor interrupt inside the write, and the client's next request then
    interrupts the server in turn. Answers made in the same pass of the run loop (the requests
    of every connection that was readable) are instead kept by their connections
    (:meth:`SocketIO.defer`) and written back to back by :meth:`end_of_round` (called at the
    end of the loop's round, before it polls: :meth:`trident.batching.rounds.Round.at_end`), or
    as soon as ``limit`` of them wait: a client that reads many connections (wrk, a pool of
    keep-alive connections) is woken once for all of them. Never raises (an exception would
    disable the loop's instrument).
    """

    def __init__(self, limit: int = 32) -> None:
        self.limit = limit
        self.waiting: list[SocketIO] = []

    def add(self, io: SocketIO) -> None:
        self.waiting.append(io)
        if len(self.waiting) >= self.limit:
            self.flush()

    def end_of_round(self) -> None:
        if self.waiting:
            self.flush()

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        for io in waiting:
            try:
                io.flush_deferred()
            except Exception:  # a bug: that connection's answer is lost, not every later one's
                log.exception("error writing an answer")
                io.broken = True
