"""``trident serve``: the server plus its front ends, until SIGINT/SIGTERM.

Nursery tree: ``open_server`` (repository nursery: models) > front-ends nursery (HTTP, gRPC,
metrics). A signal marks the server as stopping (new inferences get UNAVAILABLE, readiness
goes false), waits up to ``exit_timeout_secs`` for in-flight requests, cancels the front ends,
then ``open_server`` unloads the models.
"""

from __future__ import annotations

import logging
import signal
from functools import partial

import trio

from trident.logs import LogSettings
from trident.options import ServerOptions
from trident.server import Server, open_server

log = logging.getLogger("trident.serve")


async def _start_front_ends(server: Server, nursery: trio.Nursery, http_nursery: trio.Nursery,
                            shutdown: trio.Event) -> None:
    opts = server.options
    if opts.allow_grpc:
        from trident.grpc.serve import serve_grpc

        port = await nursery.start(partial(serve_grpc, server, host=opts.grpc_address, port=opts.grpc_port))
        log.info("Started GRPCInferenceService at %s:%s", opts.grpc_address, port)
    if opts.allow_http:
        if opts.http_server == "trident":
            from trident.http.fastserver import serve_http_fast as serve_http
        else:
            from trident.http.serve import serve_http

        port = await http_nursery.start(partial(serve_http, server, host=opts.http_address, port=opts.http_port,
                                                shutdown_trigger=shutdown.wait))
        log.info("Started HTTPService at %s:%s", opts.http_address, port)
    if opts.allow_metrics:
        from trident.metrics import serve_metrics

        port = await nursery.start(partial(serve_metrics, server, host=opts.metrics_address, port=opts.metrics_port))
        log.info("Started Metrics Service at %s:%s", opts.metrics_address, port)


def _warn_open_model_control(opts: ServerOptions) -> None:
    """A note in the log when any client that reaches a public address may load models."""
    if opts.model_control_mode != "explicit":
        return
    for allowed, address, restricted, flag in (
            (opts.allow_http, opts.http_address, opts.http_restricted_api, "--http-restricted-api"),
            (opts.allow_grpc, opts.grpc_address, opts.grpc_restricted_protocol, "--grpc-restricted-protocol")):
        if allowed and address in ("", "0.0.0.0", "::") and not any(
                "model-repository" in spec.partition(":")[0].split(",") for spec in restricted):
            log.warning("explicit model control is open to every client on %s (all interfaces): loads run model "
                        "code uploaded with them; restrict it with %s=model-repository:<header>=<value>",
                        address or "0.0.0.0", flag)


async def serve(options: ServerOptions) -> int:
    """Run until SIGINT or SIGTERM; returns the process exit status."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        log_settings = LogSettings.from_options(options)
        log_settings.install()
        _warn_open_model_control(options)
        async with open_server(options, log_settings) as server:
            failed = [e for e in server.repository_index() if e.state == "UNAVAILABLE" and e.reason != "unloaded"]
            if failed and options.exit_on_error:
                for e in failed:
                    log.error("failed to load '%s': %s", e.name, e.reason)
                log.error("exiting: --exit-on-error is set and a model failed to load")
                return 1
            shutdown = trio.Event()
            # HTTP stops by itself once triggered (hypercorn finishes open responses); gRPC and
            # metrics are cancelled after the drain (gRPC sends GOAWAY and drains its calls)
            async with trio.open_nursery() as http_nursery:
                async with trio.open_nursery() as front_ends:
                    try:
                        await _start_front_ends(server, front_ends, http_nursery, shutdown)
                    except OSError as e:
                        log.error("failed to start a front end: %s", e)
                        front_ends.cancel_scope.cancel()
                        http_nursery.cancel_scope.cancel()
                        return 1
                    async for signum in signals:
                        log.info("signal (%d) received, waiting for in-flight inferences to complete", signum)
                        break
                    server.stopping = True
                    shutdown.set()
                    if not await server.wait_drained(options.exit_timeout_secs):
                        log.warning("exit timeout (%.0f s) expired with requests in flight", options.exit_timeout_secs)
                    front_ends.cancel_scope.cancel()
                http_nursery.cancel_scope.deadline = trio.current_time() + options.exit_timeout_secs
    log.info("server stopped")
    return 0
