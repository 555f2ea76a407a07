"""What the parts of trident's HTTP/1.1 server share: the server's :class:`ServerState`, and
:class:`ConnectionState`, what a connection's rooms (:mod:`trident.http.fast_infer`,
:mod:`trident.http.asgi_cycle`, :mod:`trident.http.watch`) may use of their
:class:`~trident.http.connection.Connection`.
"""

from __future__ import annotations

import math
from typing import Protocol

import trio

from trident.batching import rounds
from trident.http.asgi import ASGIApp
from trident.http.infer import InferEndpoint
from trident.http.limits import DEFER_LIMIT, SEND_TIMEOUT
from trident.protocol.http1 import ProtocolError, RequestParser
from trident.sockets_io import Flusher, SocketIO


class ConnectionState(Protocol):
    """One connection, as its rooms see it."""

    state: ServerState
    io: SocketIO
    parser: RequestParser
    eof: bool  # the client closed its side
    idle: bool  # waiting for a request head: shutdown and the reaper may close it
    at_head: bool  # the connection's task waits for the next request's head
    served: int
    reaper_mark: int
    client: tuple[str, int] | None
    sockname: tuple[str, int] | None

    def stop(self) -> None:
        """Close the connection (its task ends at its next checkpoint). Idempotent."""

    def request_done(self) -> bool:
        """The request's answer is out (or left for later): the parser moves to the next one;
        True when the connection may take it."""

    async def next_request(self, keep_alive: bool) -> bool:
        """After an answer was written: drain what is left of the request body, then
        :meth:`request_done`; True when the connection can take another request."""

    async def refuse(self, error: ProtocolError) -> None:
        """Answer ``error``'s status; the connection then closes (lingering)."""


class Watched(Protocol):
    """A connection's disconnect watch, as the server's ticker sees it (trident.http.watch)."""

    busy: int  # odd while the connection's task waits for an answer
    seen: int  # ``busy`` at the ticker's last look

    def wake(self) -> None:
        """Watch the socket while the current request runs."""


class ServerState:
    """Settings and live connections of one server. Raises RuntimeError outside a trio run
    (the loop's rounds belong to it)."""

    def __init__(self, app: ASGIApp, max_head_size: int, keep_alive_timeout: float, header_timeout: float,
                 body_timeout: float, max_connections: int, endpoint: InferEndpoint | None = None,
                 send_timeout: float = SEND_TIMEOUT) -> None:
        self.app = app
        self.endpoint = endpoint  # set: /infer takes the fast path (no ASGI)
        self.max_head_size = max_head_size
        self.keep_alive_timeout = keep_alive_timeout
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        #: how long a response write may wait with none of its bytes taken (inf: for ever)
        self.send_timeout = send_timeout or math.inf
        self.slots = trio.Semaphore(max_connections, max_value=max_connections)  # one per open connection
        self.connections: set[ConnectionState] = set()
        self.watches: set[Watched] = set()  # the connections' disconnect watches (the ticker's)
        self.shutting_down = False
        self.ticker_park: trio.CancelScope | None = None  # the ticker's sleep while no request runs
        self.flusher = Flusher(DEFER_LIMIT)  # called at the end of each round while the server serves
        self.round: rounds.Round = rounds.current()

    def close_idle(self) -> None:
        for conn in self.connections:
            if conn.idle:
                conn.stop()
