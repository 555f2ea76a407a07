"""The gRPC listener: accept loop, TLS, per-connection tasks and graceful drain.

:func:`serve_grpc` serves Triton's ``inference.GRPCInferenceService`` and
``grpc.health.v1.Health`` for a :class:`trident.server.Server`; :func:`serve_methods` serves any
table of :class:`~trident.grpc.call.Method` (tests use it with their own handlers).

Options read from ``server.options`` (tritonserver's flag names): ``grpc_max_message_size``,
``grpc_use_ssl``, ``grpc_server_cert``, ``grpc_server_key``, ``grpc_root_cert``,
``grpc_use_ssl_mutual``, ``grpc_infer_response_compression_level`` (none|low|medium|high),
``grpc_header_forward_pattern`` and ``exit_timeout_secs`` (the drain grace period); the
keepalive and ping policy ``grpc_keepalive_time`` / ``grpc_keepalive_timeout`` (ms),
``grpc_keepalive_permit_without_calls``, ``grpc_http2_max_pings_without_data``,
``grpc_http2_min_recv_ping_interval_without_data`` (ms) and ``grpc_http2_max_ping_strikes``;
``grpc_max_connection_age`` / ``grpc_max_connection_age_grace`` (ms; 0: not set, as tritonserver
leaves gRPC core's default: no max age, an unbounded grace period); and trident's own
``grpc_max_connections`` (at the limit the accept loop pauses until a connection closes), ``grpc_handshake_timeout_secs`` (TLS handshake plus the client's preface
and first SETTINGS, counted from accept), ``grpc_idle_timeout_secs``,
``grpc_message_timeout_secs``, ``grpc_send_timeout_secs``, ``grpc_max_buffered_bytes`` and ``grpc_http2`` (the HTTP/2
implementation: ``trident`` or ``h2``; see
:class:`~trident.grpc.config.TransportConfig`; a time of 0 disables that timer).
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from trident.grpc.budget import ServerBudget
from trident.grpc.call import Method
from trident.grpc.config import TransportConfig
from trident.grpc.h2_engine import ENGINES
from trident.grpc.transport import Connection
from trident.listening import TcpListener, open_tcp_listeners, serve_listener
from trident.options import ServerOptions

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.grpc")

# tritonserver --grpc-infer-response-compression-level -> gzip level
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 6, "high": 9}


def transport_config(options: ServerOptions) -> TransportConfig:
    """TransportConfig from server options. Raises ValueError for an unknown compression level
    or HTTP/2 implementation."""
    level = options.grpc_infer_response_compression_level.lower()
    if level not in COMPRESSION_LEVELS:
        raise ValueError(f"unknown --grpc-infer-response-compression-level '{level}' "
                         f"(expected one of {', '.join(COMPRESSION_LEVELS)})")
    if options.grpc_http2 not in ENGINES:
        raise ValueError(f"unknown --grpc-http2 '{options.grpc_http2}' (expected one of {', '.join(ENGINES)})")
    return TransportConfig(
        max_message_size=options.grpc_max_message_size,
        compression_level=COMPRESSION_LEVELS[level],
        max_buffered_bytes=options.grpc_max_buffered_bytes,
        message_timeout=options.grpc_message_timeout_secs,
        send_timeout=options.grpc_send_timeout_secs,
        handshake_timeout=options.grpc_handshake_timeout_secs,
        idle_timeout=options.grpc_idle_timeout_secs,
        keepalive_time=options.grpc_keepalive_time / 1000.0,
        keepalive_timeout=options.grpc_keepalive_timeout / 1000.0,
        keepalive_permit_without_calls=options.grpc_keepalive_permit_without_calls,
        max_pings_without_data=options.grpc_http2_max_pings_without_data,
        min_recv_ping_interval=options.grpc_http2_min_recv_ping_interval_without_data / 1000.0,
        max_ping_strikes=options.grpc_http2_max_ping_strikes,
        max_connection_age=options.grpc_max_connection_age / 1000.0,
        max_connection_age_grace=options.grpc_max_connection_age_grace / 1000.0,
        max_connections=options.grpc_max_connections,
        http2=options.grpc_http2,
    )


def uses_tls(options: ServerOptions) -> bool:
    """Whether gRPC is served over TLS: ``--grpc-use-ssl`` or ``--grpc-use-ssl-mutual`` (mutual
    TLS is TLS: tritonserver turns TLS on for it too)."""
    return options.grpc_use_ssl or options.grpc_use_ssl_mutual


def check_tls_options(options: ServerOptions) -> list[tuple[str, str, str]]:
    """Refuse a gRPC TLS setting that would not be honoured; list those that mean nothing.

    Raises ValueError (one line naming the flags) when TLS is asked for without what it needs
    (a server certificate and key; a root certificate for client certificates), or when
    certificates are given while gRPC would be served in plain text. Returns ``(flag, value,
    why)`` for each setting given that is not used (a root certificate without
    ``--grpc-use-ssl-mutual``: no client certificate is requested), for the start-up log.
    Nothing is checked when gRPC is off. Reads no file (see :func:`ssl_context`).
    """
    if not options.allow_grpc:
        return []
    cert, key, root = options.grpc_server_cert, options.grpc_server_key, options.grpc_root_cert
    if not uses_tls(options):
        given = [flag for flag, value in (("--grpc-server-cert", cert), ("--grpc-server-key", key),
                                          ("--grpc-root-cert", root)) if value]
        if given:
            raise ValueError(f"{' and '.join(given)} given but gRPC TLS is off: refusing to serve gRPC in plain text; "
                             "add --grpc-use-ssl=true (or --grpc-use-ssl-mutual=true), or drop the certificate flags")
        return []
    tls_flag = "--grpc-use-ssl-mutual" if options.grpc_use_ssl_mutual else "--grpc-use-ssl"
    if not (cert and key):
        raise ValueError(f"{tls_flag} needs --grpc-server-cert and --grpc-server-key")
    if options.grpc_use_ssl_mutual and not root:
        raise ValueError("--grpc-use-ssl-mutual needs --grpc-root-cert (the CA that signs client certificates)")
    if root and not options.grpc_use_ssl_mutual:
        return [("--grpc-root-cert", root, "client certificates are only requested with --grpc-use-ssl-mutual=true")]
    return []


def ssl_context(options: ServerOptions) -> ssl.SSLContext | None:
    """Server TLS context (ALPN h2) when gRPC TLS is on (:func:`uses_tls`), else None.

    With ``grpc_use_ssl_mutual`` clients must present a certificate signed by
    ``grpc_root_cert``. Raises ValueError for options :func:`check_tls_options` refuses, and
    ValueError naming the flag and file when a certificate or key cannot be loaded.
    """
    check_tls_options(options)
    if not uses_tls(options):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    flag = "--grpc-server-cert"
    try:
        context.load_cert_chain(options.grpc_server_cert, options.grpc_server_key)
        context.set_alpn_protocols(["h2"])
        if options.grpc_use_ssl_mutual:
            flag = "--grpc-root-cert"
            context.load_verify_locations(options.grpc_root_cert)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        files = (f"'{options.grpc_root_cert}'" if flag == "--grpc-root-cert" else
                 f"'{options.grpc_server_cert}' / --grpc-server-key '{options.grpc_server_key}'")
        raise ValueError(f"gRPC TLS: cannot load {flag} {files}: {e.strerror or e}") from None
    return context


def _grace(server: Server) -> float:
    """Seconds in-flight calls may still take: what is left of the exit's deadline (set by
    trident.serve at the signal, one --exit-timeout-secs for the whole exit), at least one."""
    deadline = server.exit_deadline
    if deadline is None:
        return server.options.exit_timeout_secs
    return max(1.0, deadline - trio.current_time())


async def serve_grpc(server: Server, *, host: str, port: int, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve Triton's gRPC API for ``server`` on ``host:port`` until cancelled.

    ``port`` 0 picks a free port; the bound port is reported through ``task_status.started``.
    On cancellation: stop accepting, send GOAWAY on every connection, let in-flight calls
    finish for up to ``server.options.exit_timeout_secs``, then cancel what is left.
    Raises OSError when the address cannot be bound, ValueError/ssl.SSLError for bad TLS options.
    """
    from trident.grpc.service import build_methods

    await serve_methods(
        build_methods(server),
        transport_config(server.options),
        host=host,
        port=port,
        ssl_context=ssl_context(server.options),
        grace_period=lambda: _grace(server),
        reuse_port=server.options.reuse_grpc_port,
        task_status=task_status,
    )


async def serve_methods(
    methods: dict[str, Method],
    config: TransportConfig,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    grace_period: float | Callable[[], float] = 30.0,
    budget: ServerBudget | None = None,
    reuse_port: bool = False,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``methods`` over gRPC until cancelled (see :func:`serve_grpc` for the drain).

    ``budget`` (default: a new one from ``config``) is shared by all connections; tests pass
    their own to read its counters. ``reuse_port`` sets ``SO_REUSEPORT`` on the listeners."""
    listeners = await open_tcp_listeners(port, host=host or None, reuse_port=reuse_port)
    bound = listeners[0].port()
    connections: set[Connection] = set()
    draining = False
    if budget is None:
        budget = ServerBudget(config.max_buffered_bytes, config.worker_threads)
    slots = trio.Semaphore(max(1, config.max_connections))

    async def handle(stream: trio.abc.Stream) -> None:
        try:
            await _serve_connection(stream)
        finally:
            slots.release()

    async def _serve_connection(stream: trio.abc.Stream) -> None:
        deadline = trio.current_time() + config.handshake_timeout if config.handshake_timeout else math.inf
        try:
            if ssl_context is not None:
                stream = trio.SSLStream(stream, ssl_context, server_side=True)
                with trio.move_on_at(deadline) as handshake:
                    await stream.do_handshake()
                if handshake.cancelled_caught:
                    raise trio.BrokenResourceError("TLS handshake timed out")
            conn = Connection(stream, methods, config, budget,
                              handshake_deadline=deadline if config.handshake_timeout else None)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            log.debug("gRPC connection failed before HTTP/2: %s", e)
            await trio.aclose_forcefully(stream)
            return
        connections.add(conn)
        if draining:
            conn.start_drain()
        try:
            await conn.serve()
        except Exception:
            log.exception("gRPC connection failed")  # one connection's failure never stops the server
        finally:
            connections.discard(conn)

    async with trio.open_nursery() as outer:
        conn_nursery, conn_scope, stop = await outer.start(_connection_nursery)
        try:
            async with trio.open_nursery() as acceptors:
                for listener in listeners:
                    acceptors.start_soon(_accept_loop, listener, conn_nursery, handle, slots)
                log.info("gRPC server listening on %s:%d%s", host, bound, _tls_note(ssl_context))
                task_status.started(bound)
        finally:
            draining = True
            for listener in listeners:
                listener.close()
            conn_scope.deadline = trio.current_time() + (grace_period() if callable(grace_period) else grace_period)
            for conn in list(connections):
                conn.start_drain()
            stop.set()


def _tls_note(context: ssl.SSLContext | None) -> str:
    if context is None:
        return ""
    return " (TLS, client certificates required)" if context.verify_mode == ssl.CERT_REQUIRED else " (TLS)"


async def _connection_nursery(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A nursery for connections shielded from the server's cancellation, so that they drain;
    its scope's deadline (set when the drain starts) bounds the grace period."""
    stop = trio.Event()
    with trio.CancelScope(shield=True) as scope:
        async with trio.open_nursery() as nursery:
            task_status.started((nursery, scope, stop))
            await stop.wait()


async def _accept_loop(listener: TcpListener, nursery: trio.Nursery, handle: Any,
                       slots: trio.Semaphore) -> None:
    """Accept while a connection slot is free; ``handle`` releases the slot when it returns."""
    warned = -math.inf

    def at_limit() -> None:
        nonlocal warned
        if trio.current_time() - warned > 60:
            warned = trio.current_time()
            log.warning("gRPC connection limit reached: accepting pauses until a connection closes")

    await serve_listener(listener, slots, lambda stream: nursery.start_soon(handle, stream),
                         at_limit=at_limit)
