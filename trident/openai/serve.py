"""Serve the OpenAI-compatible front end on a port of its own (``--openai-port``).

trident's own HTTP/1.1 layer (:func:`trident.http.fastserver.serve_asgi`) serves
:func:`trident.openai.app.make_openai_app` with the HTTP front end's limits
(``http_header_timeout_secs``, ``http_body_timeout_secs``, ``http_max_connections``), the drain's
``exit_timeout_secs`` and ``reuse_http_port``, all read from the server's :class:`~trident.options.ServerOptions`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from trident.http.fastserver import serve_asgi
from trident.openai.app import make_openai_app
from trident.restricted import http_restrictions

if TYPE_CHECKING:
    from trident.server import Server


async def serve_openai(
    server: Server,
    *,
    host: str,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the OpenAI routes of ``server`` on ``host:port`` until cancelled.

    Start it with ``nursery.start``: it reports the bound port (the real one when ``port`` is
    0). When ``shutdown_trigger`` returns, it stops accepting and finishes in-flight requests
    (up to the server's ``exit_timeout_secs``).

    The HTTP port's ``--http-restricted-api`` groups apply: ``/v1/models`` is ``metadata``, the
    completions are ``inference``.

    Raises OSError when the address cannot be bound. Cancellation closes the listener and
    cancels every in-flight request (each is cancelled in the server too).
    """
    options = server.options
    # the HTTP port's restricted groups hold here too (this port serves the same /v1 routes)
    app = make_openai_app(server, restrictions=http_restrictions(options))
    await serve_asgi(app, host=host, port=port, shutdown_trigger=shutdown_trigger,
                     graceful_timeout=options.exit_timeout_secs, task_status=task_status,
                     header_timeout=options.http_header_timeout_secs, body_timeout=options.http_body_timeout_secs,
                     max_connections=options.http_max_connections, reuse_port=options.reuse_http_port)
