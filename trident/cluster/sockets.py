"""The supervisor's listening ports, and how its workers share each one.

``per-worker`` (``--worker-sockets``, the default): every worker gets sockets of its own on the
port, with ``SO_REUSEPORT``; the kernel spreads new connections over the listening ones by a
hash of their addresses, and each worker accepts from its own queue. A worker's sockets are
bound by the supervisor but not listening when they are handed down: the worker listens once
it serves, so no connection waits in the queue of a worker that is still starting. When a
worker exits its sockets close with it (connections still queued there are reset, and clients
reconnect to the others); its successor gets new ones. The supervisor holds one more set,
bound and never listening, that keeps the port while no worker has it. Unless
``--reuse-http-port`` / ``--reuse-grpc-port`` says the port may be shared with other servers,
a fixed port is first checked with a socket without ``SO_REUSEPORT``, so that a port another
process listens on is refused as "already in use" (SO_REUSEPORT alone would let two trident
servers of one user share it).

``shared``: one set of listening sockets for all workers (one accept queue); the worker that
is idle first takes a connection.

:class:`Port` is one such port; the supervisor closes it when it exits.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

from trident.listening import bind_tcp

PER_WORKER = "per-worker"
SHARED = "shared"
MODES = (PER_WORKER, SHARED)


def _addresses(host: str | None, port: int) -> list[tuple[int, int, int, tuple]]:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen: set[tuple] = set()
    out: list[tuple[int, int, int, tuple]] = []
    for family, type_, proto, _, sockaddr in infos:
        key = (family, sockaddr[0])
        if key in seen:
            continue
        seen.add(key)
        out.append((family, type_, proto, sockaddr))
    return out


def _bind(family: int, type_: int, proto: int, sockaddr: tuple, port: int, *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, type_, proto)
    try:
        bind_tcp(sock, (sockaddr[0], port, *sockaddr[2:]), reuse_port=reuse_port)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class Port:
    """One listening port of the supervisor (``name``: "HTTP", "GRPC", "OpenAI")."""

    name: str
    host: str
    port: int
    mode: str
    reuse: bool  # --reuse-*-port: other servers may share the port
    backlog: int = 1024
    _addresses: list[tuple[int, int, int, tuple]] = field(default_factory=list)
    _held: list[socket.socket] = field(default_factory=list)

    def open(self) -> None:
        """Bind (and in shared mode listen). Raises OSError (EADDRINUSE for a port in use)."""
        self._addresses = _addresses(self.host, self.port)
        if not self._addresses:
            raise OSError(errno.EADDRNOTAVAIL, f"no address for {self.host!r}")
        try:
            if self.mode == SHARED:
                self._held = self._bind_set(reuse_port=self.reuse)
                for sock in self._held:
                    sock.listen(self.backlog)
            else:
                if self.port and not self.reuse:
                    self._probe()
                self._held = self._bind_set(reuse_port=True)  # the reservation: bound, never listening
        except BaseException:
            self.close()
            raise

    def _probe(self) -> None:
        """Raises EADDRINUSE when any process listens on the port (see the module)."""
        probes = []
        try:
            for family, type_, proto, sockaddr in self._addresses:
                probe = _bind(family, type_, proto, sockaddr, self.port, reuse_port=False)
                probes.append(probe)
                probe.listen(1)
        finally:
            for probe in probes:
                probe.close()

    def _bind_set(self, *, reuse_port: bool) -> list[socket.socket]:
        out: list[socket.socket] = []
        try:
            for family, type_, proto, sockaddr in self._addresses:
                sock = _bind(family, type_, proto, sockaddr, self.port, reuse_port=reuse_port)
                out.append(sock)
                if not self.port:
                    self.port = int(sock.getsockname()[1])  # port 0: the others take the same one
        except BaseException:
            for sock in out:
                sock.close()
            raise
        return out

    def for_worker(self) -> list[socket.socket]:
        """The sockets to hand a worker being started. Per-worker: a new set (bound, not
        listening) the caller closes once the worker has them; shared: the shared set (not to
        be closed). Raises OSError."""
        if self.mode == SHARED:
            return list(self._held)
        return self._bind_set(reuse_port=True)

    @property
    def per_worker(self) -> bool:
        return self.mode != SHARED

    def close(self) -> None:
        for sock in self._held:
            sock.close()
        self._held = []
