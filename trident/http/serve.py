"""Serve the HTTP front end with hypercorn's trio worker (``--http-server hypercorn``).

trident's own HTTP limits map onto hypercorn's settings where it has one:

* ``http_header_timeout_secs`` and ``http_body_timeout_secs``: hypercorn has a single read
  timeout, the longest pause in what a client sends (``read_timeout``), so it gets the larger
  of the two (rounded up to whole seconds). It is a pause limit, not a deadline for the whole
  head, and it also closes idle keep-alive connections after that pause.
* The largest request head: ``h11_max_incomplete_size`` is trident's 64 KiB (hypercorn's
  default is 16 KiB).
* ``http_max_connections``: hypercorn has no connection cap; the limit is trident-layer only.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from trident.http.app import make_app
from trident.listening import open_tcp_listeners
from trident.protocol.http1 import DEFAULT_MAX_HEAD_SIZE

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.http")


def hypercorn_config(host: str, port: int, graceful_timeout: float = 5.0, *, header_timeout: float = 30.0,
                     body_timeout: float = 60.0) -> Config:
    """Hypercorn settings for inference traffic: long keep-alive, no request cap, no access log.

    ``header_timeout`` and ``body_timeout`` become hypercorn's ``read_timeout`` (see the module).
    """
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.backlog = 1024  # Triton's listen backlog
    config.keep_alive_timeout = 75.0
    config.keep_alive_max_requests = 2**62  # never close a busy keep-alive connection
    config.accesslog = None
    config.errorlog = logging.getLogger("trident.http.hypercorn")
    config.include_server_header = False
    config.graceful_timeout = graceful_timeout
    config.h2_max_concurrent_streams = 1000
    config.max_app_queue_size = 16
    config.read_timeout = max(1, math.ceil(max(header_timeout, body_timeout)))
    config.h11_max_incomplete_size = DEFAULT_MAX_HEAD_SIZE
    return config


async def serve_http(
    server: Server,
    *,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the KServe v2 HTTP API of ``server`` on ``host:port`` until cancelled.

    Start it with ``nursery.start``: it reports the bound port (the real one when ``port`` is
    0) once the socket listens. When ``shutdown_trigger`` returns, hypercorn stops accepting
    and finishes in-flight requests (up to the server's ``exit_timeout_secs``).

    Raises OSError when the address cannot be bound. Cancellation closes the listener and
    cancels every in-flight request (each is cancelled in the server too).
    """
    options = server.options
    config = hypercorn_config(host, port, options.exit_timeout_secs, header_timeout=options.http_header_timeout_secs,
                              body_timeout=options.http_body_timeout_secs)
    # trident binds (SO_REUSEPORT with --reuse-http-port; a --workers supervisor's sockets) and
    # hands hypercorn the sockets
    listeners = await open_tcp_listeners(port, host=host or None, backlog=config.backlog,
                                         reuse_port=options.reuse_http_port)
    bound = listeners[0].port()
    try:  # hypercorn owns (and closes) copies of the descriptors
        config.bind = [f"fd://{os.dup(listener.socket.fileno())}" for listener in listeners]
    finally:
        for listener in listeners:
            listener.close()
    app = make_app(server)

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await hypercorn_serve(
            cast(Any, app), config, shutdown_trigger=shutdown_trigger, task_status=task_status, mode="asgi"
        )

    async with trio.open_nursery() as nursery:
        await nursery.start(run)
        task_status.started(bound)
