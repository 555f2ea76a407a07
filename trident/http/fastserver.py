"""A lean HTTP/1.1 server on trio for ASGI 3 applications (``http`` scopes).

``--http-server trident`` serves :func:`trident.http.app.make_app` with this module instead of
hypercorn. Parsing and response framing are sans-IO (:mod:`trident.protocol.http1`) and the
socket layer is the one both front ends share (:mod:`trident.sockets_io`); the rooms of the
server, each one job:

* this module: the listeners, the accept loop (at ``max_connections`` open connections,
  accepting pauses until one closes; the kernel's backlog holds the clients meanwhile), idle
  keep-alive connections closed after ``keep_alive_timeout`` (between 1x and 2x of it), the
  end-of-round writes (:class:`trident.sockets_io.Flusher`), the disconnect ticker, and the
  graceful shutdown: stop accepting, close idle connections, let in-flight requests finish
  within ``graceful_timeout``, then cancel the rest;
* :mod:`trident.http.connection`: one connection's request loop, one task per connection,
  requests in order, head timeouts, lingering close;
* :mod:`trident.http.fast_infer`: ``POST /v2/models/{m}[/versions/{v}]/infer`` without ASGI,
  when the server is given the app's :class:`~trident.http.infer.InferEndpoint`
  (``serve_http_fast`` does);
* :mod:`trident.http.asgi_cycle`: every other request, through the ASGI application;
* :mod:`trident.http.watch`: client disconnects noticed while a request runs, with no task
  per request;
* :mod:`trident.http.state`: what they share; :mod:`trident.http.limits`: sizes and times.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from trident.http.app import make_app
from trident.http.asgi import ASGIApp
from trident.http.connection import Connection
from trident.http.infer import InferEndpoint
from trident.http.limits import (
    BODY_TIMEOUT,
    HEADER_TIMEOUT,
    KEEP_ALIVE_TIMEOUT,
    MAX_CONNECTIONS,
    MIN_BODY_RATE,
    SEND_TIMEOUT,
)
from trident.http.state import ServerState
from trident.http.watch import watch_requests
from trident.listening import TcpListener, open_tcp_listeners, serve_listener
from trident.options import ServerOptions
from trident.protocol.http1 import DEFAULT_MAX_HEAD_SIZE

if TYPE_CHECKING:
    from trident.server import Server

__all__ = ["BODY_TIMEOUT", "HEADER_TIMEOUT", "KEEP_ALIVE_TIMEOUT", "MAX_CONNECTIONS", "MIN_BODY_RATE",
           "serve_asgi", "serve_http_fast"]

log = logging.getLogger("trident.http")


async def _accept_loop(listener: TcpListener, state: ServerState, nursery: trio.Nursery) -> None:
    """Accept connections, each holding one of ``state.slots`` (at the limit, accepting waits)."""

    def start(stream: trio.SocketStream) -> None:
        conn = Connection(state, stream)
        state.connections.add(conn)
        nursery.start_soon(conn.serve, name="trident.http.connection")

    def at_limit() -> None:
        log.warning("%d HTTP connections are open (--http-max-connections): accepting pauses until one "
                    "closes", state.slots.max_value)

    await serve_listener(listener, state.slots, start, at_limit=at_limit)


async def _reap_idle(state: ServerState) -> None:
    """Close connections idle (waiting for a request) for a whole keep-alive period."""
    while True:
        await trio.sleep(state.keep_alive_timeout)
        for conn in list(state.connections):
            if conn.idle and conn.reaper_mark == conn.served:
                conn.stop()
            conn.reaper_mark = conn.served


async def serve_asgi(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    graceful_timeout: float = ServerOptions.exit_timeout_secs,
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT,
    header_timeout: float = HEADER_TIMEOUT,
    body_timeout: float = BODY_TIMEOUT,
    send_timeout: float = SEND_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    max_head_size: int = DEFAULT_MAX_HEAD_SIZE,
    backlog: int = 1024,
    reuse_port: bool = False,
    infer_endpoint: InferEndpoint | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` over HTTP/1.1 on ``host:port`` (``SO_REUSEPORT`` with ``reuse_port``).

    Start it with ``nursery.start``: it reports the bound port (the real one when ``port`` is 0).
    Without ``shutdown_trigger`` it serves until cancelled. When ``shutdown_trigger`` returns,
    it stops accepting, closes idle connections, waits up to ``graceful_timeout`` seconds for
    in-flight requests (their responses carry ``connection: close``), cancels what is left, and
    returns. ``header_timeout``, ``body_timeout``, ``send_timeout`` (0: none) and
    ``max_connections`` bound what one client can hold (see the module docstring). With
    ``infer_endpoint`` (the one ``app`` uses), ``POST .../infer`` is answered by it directly,
    without ASGI.

    Raises OSError when the address cannot be bound. Cancellation closes the listener and every
    connection and cancels the application calls in flight.
    """
    listeners = await open_tcp_listeners(port, host=host, backlog=backlog, reuse_port=reuse_port)
    state = ServerState(app, max_head_size, keep_alive_timeout, header_timeout, body_timeout, max_connections,
                        infer_endpoint, send_timeout)
    stop_flushing = state.round.at_end(state.flusher.end_of_round)
    try:
        async with trio.open_nursery() as watching:
            if infer_endpoint is not None:
                watching.start_soon(watch_requests, state, name="trident.http.watch_requests")
            async with trio.open_nursery() as connections:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(_accept_loop, listener, state, connections)
                    accepting.start_soon(_reap_idle, state)
                    task_status.started(listeners[0].port())
                    if shutdown_trigger is None:
                        await trio.sleep_forever()
                    else:
                        await shutdown_trigger()
                    accepting.cancel_scope.cancel()
                for listener in listeners:
                    listener.close()
                state.shutting_down = True
                state.close_idle()
                connections.cancel_scope.deadline = trio.current_time() + graceful_timeout
            watching.cancel_scope.cancel()
    finally:
        stop_flushing()
        state.flusher.flush()
        for listener in listeners:
            listener.close()


async def serve_http_fast(
    server: Server,
    *,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the KServe v2 HTTP API of ``server`` on ``host:port`` (same contract as ``serve_http``).

    It reports the bound port through ``task_status``. When ``shutdown_trigger`` returns, it
    stops accepting and finishes in-flight requests (up to the server's ``exit_timeout_secs``).
    The server's ``http_header_timeout_secs``, ``http_body_timeout_secs``,
    ``http_send_timeout_secs`` and ``http_max_connections`` options set the limits of :func:`serve_asgi`, ``reuse_http_port``
    its ``SO_REUSEPORT``.

    Raises OSError when the address cannot be bound. Cancellation closes the listener and
    cancels every in-flight request (each is cancelled in the server too).
    """
    options = server.options
    endpoint = InferEndpoint(server)
    await serve_asgi(make_app(server, endpoint), host=host, port=port, shutdown_trigger=shutdown_trigger,
                     graceful_timeout=options.exit_timeout_secs, task_status=task_status, infer_endpoint=endpoint,
                     header_timeout=options.http_header_timeout_secs, body_timeout=options.http_body_timeout_secs,
                     send_timeout=options.http_send_timeout_secs,
                     max_connections=options.http_max_connections, reuse_port=options.reuse_http_port)
