"""Serve the HTTP front end with hypercorn's trio worker."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from trident.http.app import make_app

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.http")


def hypercorn_config(host: str, port: int, graceful_timeout: float = 5.0) -> Config:
    """Hypercorn settings for inference traffic: long keep-alive, no request cap, no access log."""
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
    graceful = float(getattr(server.options, "exit_timeout_secs", 5.0))
    config = hypercorn_config(host, port, graceful)
    app = make_app(server)

    async def run(*, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await hypercorn_serve(
            cast(Any, app), config, shutdown_trigger=shutdown_trigger, task_status=task_status, mode="asgi"
        )

    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(run)
        bound = int(binds[0].rsplit(":", 1)[1]) if binds else port
        task_status.started(bound)
