"""TCP listeners that accept every waiting connection in one step.

trio's ``SocketListener.accept`` takes one connection per scheduler pass. Under load each pass
runs one step of every busy connection, so when a client opens N connections at once the k-th is
accepted only after k passes, each longer than the last: the last of 64 connections waited
~480 ms for its first response on this machine while the others were served in ~6 ms (wrk's
coordinated-omission correction turns those few waits into a p99 of ~400 ms at 64 connections).
:meth:`TcpListener.accept_waiting` takes everything the kernel has queued (up to a limit) in one
step instead.

The listeners bind as ``trio.open_tcp_listeners`` does (every address ``host`` resolves to,
``SO_REUSEADDR``, IPv6 sockets IPv6-only), with ``SO_REUSEPORT`` when asked
(``--reuse-http-port``, ``--reuse-grpc-port``: several servers share a port, the kernel spreads
the connections).

A process started by a ``--workers`` supervisor is handed its listening sockets instead (file
descriptors named by the ``TRIDENT_LISTEN_FDS`` environment variable, as with systemd's socket
activation): :func:`open_tcp_listeners` serves a port from those when it has them, and binds
nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable, Collection
from typing import Any

import trio

log = logging.getLogger("trident.listening")

ACCEPT_BATCH = 64  # most connections taken from the kernel's queue in one scheduler pass
#: accept() errors of a full process or machine: logged, and accepting retries after 100 ms
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})

# accept() errors that concern one connection that is already gone: skip it, accept the next
_SKIP_ERRNOS = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN, errno.ENOPROTOOPT,
                errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH}


#: the environment variable naming the listening sockets a supervisor handed down ("fd,fd,...")
LISTEN_FDS_ENV = "TRIDENT_LISTEN_FDS"
_inherited: dict[int, list[socket.socket]] | None = None


def _inherited_sockets() -> dict[int, list[socket.socket]]:
    """Port -> the listening sockets handed down for it (read once per process)."""
    global _inherited
    if _inherited is None:
        _inherited = {}
        for text in filter(None, os.environ.get(LISTEN_FDS_ENV, "").split(",")):
            sock = socket.socket(fileno=int(text))
            _inherited.setdefault(int(sock.getsockname()[1]), []).append(sock)
    return _inherited


def take_inherited(port: int) -> list[socket.socket]:
    """The listening sockets handed down for ``port`` (see the module), taken: a second call
    for the port gets none. Empty when this process was given none for it."""
    return _inherited_sockets().pop(port, []) if port else []


class TcpListener:
    """One listening socket. Owned by the task that serves it; :meth:`close` releases it.

    ``accept_batch``: the most connections taken from the kernel's queue at once (1 for a queue
    shared with other processes, so that each takes its share)."""

    def __init__(self, sock: socket.socket, accept_batch: int = 0) -> None:
        sock.setblocking(False)
        self.socket = sock
        self.accept_batch = accept_batch or ACCEPT_BATCH

    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    async def accept_waiting(self, limit: int) -> list[trio.SocketStream]:
        """Wait until at least one connection is waiting, then accept up to ``limit`` (>= 1).

        Cancelled while nothing is waiting (nothing is accepted then). Raises OSError for an
        accept error other than a connection that went away before it was accepted (the caller
        handles EMFILE and kin), ``trio.ClosedResourceError`` after :meth:`close`.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            accepted: list[trio.SocketStream] = []
            while len(accepted) < limit:
                if self.socket.fileno() < 0:
                    raise trio.ClosedResourceError("the listener is closed")
                try:
                    conn, _ = self.socket.accept()
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno in _SKIP_ERRNOS:
                        continue
                    if accepted:  # hand over what was accepted; the next call raises again
                        break
                    raise
                accepted.append(trio.SocketStream(trio.socket.from_stdlib_socket(conn)))
            if accepted:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return accepted
            await trio.lowlevel.wait_readable(self.socket)

    def close(self) -> None:
        """Stop listening (a task waiting in :meth:`accept_waiting` gets ClosedResourceError)."""
        if self.socket.fileno() >= 0:
            trio.lowlevel.notify_closing(self.socket)
            self.socket.close()


def bind_tcp(sock: socket.socket, sockaddr: tuple[Any, ...], *, reuse_port: bool = False) -> None:
    """Bind a TCP socket as listeners here are bound: ``SO_REUSEADDR``, ``SO_REUSEPORT`` with
    ``reuse_port``, an IPv6 socket IPv6-only. Raises OSError."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind(sockaddr)


async def open_tcp_listeners(port: int, *, host: str | None = None, backlog: int = 1024,
                             reuse_port: bool = False) -> list[TcpListener]:
    """Listen on ``port`` at every address ``host`` resolves to (None: the IPv4 and IPv6 wildcards),
    with ``SO_REUSEPORT`` when ``reuse_port``; a port this process was handed sockets for by its
    supervisor is served from those (see the module).

    Raises OSError when an address cannot be bound (the listeners opened so far are closed)."""
    handed = take_inherited(port)
    if handed:
        given = []
        for sock in handed:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                given.append(TcpListener(sock, accept_batch=1))  # one queue for several processes
            else:
                sock.listen(backlog)  # this process's own: it listens once it serves
                given.append(TcpListener(sock))
        return given
    addresses = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[TcpListener] = []
    unsupported: list[OSError] = []
    try:
        for family, type_, proto, _, sockaddr in addresses:
            try:
                sock = socket.socket(family, type_, proto)
            except OSError as exc:
                if exc.errno != errno.EAFNOSUPPORT:
                    raise
                unsupported.append(exc)
                continue
            try:
                bind_tcp(sock, sockaddr, reuse_port=reuse_port)
                sock.listen(backlog)
            except BaseException:
                sock.close()
                raise
            listeners.append(TcpListener(sock))
    except BaseException:
        for listener in listeners:
            listener.close()
        raise
    if not listeners:
        raise OSError(errno.EAFNOSUPPORT, f"no socket could be opened for {host!r}") from (
            unsupported[0] if unsupported else None)
    return listeners


async def acquire_slots(slots: trio.Semaphore, most: int) -> int:
    """Wait for one of ``slots``, then take up to ``most - 1`` more that are free now; returns
    how many were taken (the caller releases the ones it does not use). Cancelled while waiting
    for the first."""
    await slots.acquire()
    taken = 1
    while taken < most and slots.value > 0:
        slots.acquire_nowait()
        taken += 1
    return taken


async def serve_listener(listener: TcpListener, slots: trio.Semaphore, start: Callable[[trio.SocketStream], None],
                         *, at_limit: Callable[[], None], retry_errnos: Collection[int] = CAPACITY_ERRNOS) -> None:
    """Accept connections on ``listener`` until cancelled, each holding one of ``slots`` (the
    connection releases it when it closes); ``start(stream)`` hands each one to its owner
    (starts its task). Every connection already waiting is accepted at once.

    At the limit (no slot free) ``at_limit()`` is called (to warn) and accepting waits. An
    accept error in ``retry_errnos`` (EMFILE and kin) is logged and retried after 100 ms; others
    raise OSError.
    """
    while True:
        if slots.value == 0:
            at_limit()
        taken = await acquire_slots(slots, listener.accept_batch)
        try:
            streams = await listener.accept_waiting(taken)
        except OSError as exc:
            for _ in range(taken):
                slots.release()
            if exc.errno not in retry_errnos:
                raise
            log.error("accept failed (%s): waiting 100 ms", errno.errorcode.get(exc.errno or 0, exc.errno))
            await trio.sleep(0.1)
            continue
        except BaseException:
            for _ in range(taken):
                slots.release()
            raise
        for _ in range(taken - len(streams)):
            slots.release()
        for stream in streams:
            start(stream)
