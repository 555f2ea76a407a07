"""``trident serve``: the server plus its front ends, until SIGINT/SIGTERM.

Nursery tree: ``open_server`` (repository nursery: models) > front-ends nursery (HTTP, gRPC,
metrics). A signal marks the server as stopping (new inferences get UNAVAILABLE, readiness
goes false, liveness stays true: the front ends keep answering), waits up to
``exit_timeout_secs`` for in-flight requests, stops the front ends, then ``open_server``
unloads the models.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from trident import trio_private
from trident.batching import rounds
from trident.errors import TritonError
from trident.observability.logs import VERBOSE
from trident.options import ServerOptions
from trident.server import Server, open_server
from trident.startup import check_start, start_logging, startup_tables
from trident.trio_private import fifo_task_order

if TYPE_CHECKING:
    from trident.cluster.link import WorkerLink

log = logging.getLogger("trident.serve")

__all__ = ["StartError", "fifo_task_order", "serve", "tune_malloc"]


#: glibc malloc settings applied at start (mallopt parameter, value, environment variable that overrides it)
MALLOC_SETTINGS = ((-3, 32 << 20, "MALLOC_MMAP_THRESHOLD_"),  # M_MMAP_THRESHOLD: blocks up to 32 MiB from the heap
                   (-1, 128 << 20, "MALLOC_TRIM_THRESHOLD_"))  # M_TRIM_THRESHOLD: keep up to 128 MiB freed


def tune_malloc(keep_freed: bool = True) -> list[str]:
    """Keep freed tensor-sized blocks for reuse instead of returning them to the kernel.

    With glibc's defaults a freed block of a few MiB (a request body, a gRPC message, a
    response) is unmapped or trimmed, and the next request faults every page of its new block
    in again (about 750 page faults per 1 MiB gRPC identity request here, half its CPU).
    Blocks up to 32 MiB now come from the heap, which keeps up to 128 MiB of free memory.
    A setting whose glibc environment variable is set (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_``) is left to it. ``keep_freed=False`` (models loaded on demand:
    evicting one must give its memory back) leaves the trim threshold to glibc. Returns what was
    set ("name=value"); nothing without glibc. Raises nothing.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return []
    done = []
    for param, value, env in MALLOC_SETTINGS:
        if param == -1 and not keep_freed:
            continue
        if env not in os.environ and mallopt(param, value) == 1:
            done.append(f"{env.strip('_')}={value}")
    return done


class StartError(Exception):
    """A front end could not start (its address is in use, or cannot be bound): one line."""


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError in ``exc`` (itself, or inside exception groups), if any."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _os_error(inner)
            if found is not None:
                return found
    return None


async def _start(nursery: trio.Nursery, fn: Any, service: str, host: str, port: int) -> Any:
    """``nursery.start(fn)``; raises StartError naming ``service``, its address and port when
    binding fails (instead of the traceback of a nested OSError)."""
    try:
        return await nursery.start(fn)
    except BaseException as exc:
        error = _os_error(exc)
        if error is None:
            raise
        why = "already in use" if error.errno == errno.EADDRINUSE else (error.strerror or str(error))
        raise StartError(f"failed to start {service}: address {host or '0.0.0.0'}:{port} {why}") from None


async def _start_front_ends(server: Server, nursery: trio.Nursery, http_nursery: trio.Nursery,
                            shutdown: trio.Event, *, worker: bool = False) -> None:
    """Start the enabled front ends (a worker of ``--workers``: all but metrics, which its
    supervisor serves, and each "Started" line only at --log-verbose). Raises StartError when
    one cannot bind its address."""
    opts = server.options
    level = VERBOSE if worker else logging.INFO
    extra = {"verbose": 1}
    if opts.allow_grpc:
        from trident.grpc.serve import serve_grpc

        port = await _start(nursery, partial(serve_grpc, server, host=opts.grpc_address, port=opts.grpc_port),
                            "GRPC service", opts.grpc_address, opts.grpc_port)
        log.log(level, "Started GRPCInferenceService at %s:%s", opts.grpc_address, port, extra=extra)
    if opts.allow_http:
        if opts.http_server == "trident":
            from trident.http.fastserver import serve_http_fast as serve_http
        else:
            from trident.http.serve import serve_http

        port = await _start(http_nursery, partial(serve_http, server, host=opts.http_address, port=opts.http_port,
                                                  shutdown_trigger=shutdown.wait),
                            "HTTP service", opts.http_address, opts.http_port)
        log.log(level, "Started HTTPService at %s:%s", opts.http_address, port, extra=extra)
    if opts.openai_port is not None:
        from trident.openai.serve import serve_openai

        port = await _start(http_nursery, partial(serve_openai, server, host=opts.http_address, port=opts.openai_port,
                                                  shutdown_trigger=shutdown.wait),
                            "OpenAI frontend", opts.http_address, opts.openai_port)
        log.log(level, "Started OpenAIFrontend at %s:%s", opts.http_address, port, extra=extra)
    if opts.allow_metrics and not worker:
        from trident.observability.metrics import serve_metrics

        port = await _start(nursery, partial(serve_metrics, server, host=opts.metrics_address, port=opts.metrics_port),
                            "Metrics service", opts.metrics_address, opts.metrics_port)
        log.info("Started Metrics Service at %s:%s", opts.metrics_address, port)


async def _load_models(server: Server) -> int:
    """Load the start-up models, log tritonserver's tables; 1 when ``--exit-on-error`` and a
    model failed to load, else 0."""
    await server.load_models()
    for table in startup_tables(server):
        log.info("\n%s\n", table)
    index = server.repository_index()
    failed = [e for e in index if e.state == "UNAVAILABLE" and e.reason != "unloaded"]
    log.info("model loading complete: %d ready, %d unavailable",
             sum(e.state == "READY" for e in index), len(failed))
    if failed and server.options.exit_on_error:
        for e in failed:
            log.error("failed to load '%s': %s", e.name, e.reason)
        log.error("exiting: --exit-on-error is set and a model failed to load")
        return 1
    if server.repository.listing_errors() and server.options.exit_on_error:  # reasons logged when listed
        log.error("exiting: --exit-on-error is set and a model repository could not be read")
        return 1
    return 0


async def serve(options: ServerOptions, *, link: WorkerLink | None = None) -> int:
    """Run until SIGINT or SIGTERM; returns the process exit status.

    With ``options.workers`` other than 1 this process becomes the supervisor of that many
    workers (:func:`trident.cluster.supervisor.serve_supervisor`). With ``link`` it is one of
    those workers: the supervisor checked the options and logged what a server logs once, its
    front ends serve the sockets it handed down (the metrics port is the supervisor's), the
    models load when the supervisor says, and it drains when the supervisor says (or on a
    signal).
    """
    if link is None and options.workers != 1:
        from trident.cluster.supervisor import serve_supervisor

        return await serve_supervisor(options)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        log_settings = start_logging(options)
        if log_settings is None:
            return 1
        if link is None and not check_start(options):
            return 1
        tuned = tune_malloc(keep_freed=not options.model_load_on_demand)
        if tuned:
            log.debug("malloc: %s", ", ".join(tuned))
        gone = trio_private.missing()
        if gone:  # another trio than pyproject.toml pins: the server runs without these gains
            log.warning("this trio (%s) lacks private names trident uses: %s; requests are served without "
                        "the gains they bring (see trident.trio_private)", trio.__version__, "; ".join(gone))
        if options.busy_poll_us and not rounds.current().busy_poll(options.busy_poll_us / 1e6):
            log.info("--busy-poll-us: this trio's poller is out of reach; the loop sleeps at once")
        # the front ends listen before the models load: live is true and ready false meanwhile
        async with open_server(options, log_settings, load=False) as server, trio.open_nursery() as control:
            if link is not None:
                await link.attach(server, control)  # staged loads and forwarding run in `control`
            shutdown = trio.Event()
            stop = trio.Event()
            # HTTP stops by itself once triggered (hypercorn finishes open responses); gRPC and
            # metrics are cancelled after the drain (gRPC sends GOAWAY and drains its calls)
            # (a return inside these nurseries would be lost when their cancellation unwinds)
            status = 0
            async with trio.open_nursery() as http_nursery:
                async with trio.open_nursery() as front_ends:
                    status = await _bring_up(server, front_ends, http_nursery, shutdown, link)
                    if status:
                        front_ends.cancel_scope.cancel()
                        http_nursery.cancel_scope.cancel()
                    else:
                        front_ends.start_soon(_wait_for_signal, signals, stop)
                        if link is not None:
                            front_ends.start_soon(_wait_for_drain, link, stop)
                        await stop.wait()
                        # drain with the front ends up: new inferences get 503 / UNAVAILABLE,
                        # ready is false, live true, keep-alive clients get answers
                        server.stopping = True
                        # one --exit-timeout-secs for the whole exit: drain, the front ends'
                        # last responses and the unload share it (open_server reads the deadline)
                        server.exit_deadline = trio.current_time() + options.exit_timeout_secs
                        if not await server.wait_drained(options.exit_timeout_secs):
                            log.warning("exit timeout (%.0f s) expired with requests in flight",
                                        options.exit_timeout_secs)
                        shutdown.set()
                        front_ends.cancel_scope.cancel()
                http_nursery.cancel_scope.deadline = max(server.exit_deadline or 0.0, trio.current_time() + 1.0)
            control.cancel_scope.cancel()
    if status:
        return status
    log.info("server stopped")
    return 0


async def _wait_for_signal(signals: Any, stop: trio.Event) -> None:
    async for signum in signals:
        log.info("signal (%d) received, waiting for in-flight inferences to complete", signum)
        stop.set()
        return


async def _wait_for_drain(link: WorkerLink, stop: trio.Event) -> None:
    await link.drain.wait()
    log.log(VERBOSE, "worker %d: draining, as the supervisor asks", link.index, extra={"verbose": 1})
    stop.set()


async def _bring_up(server: Server, front_ends: trio.Nursery, http_nursery: trio.Nursery, shutdown: trio.Event,
                    link: WorkerLink | None) -> int:
    """Start the front ends and load the models; the exit status so far (0: serving).

    Alone: the front ends listen, then the start-up models load. A worker of ``--workers``
    attaches to its supervisor after its front ends listen, and the supervisor loads the
    models; a worker started anew (after one exited) attaches first, and listens only once the
    supervisor has given it every model and setting the others have."""
    if link is not None and link.restart:
        status = await _join(server, link)
        if status:
            return status
        async with trio.open_nursery() as waiting:  # in step, or told to drain meanwhile
            async def until(event: trio.Event) -> None:
                await event.wait()
                waiting.cancel_scope.cancel()

            waiting.start_soon(until, link.in_step)
            waiting.start_soon(until, link.drain)
        if link.drain.is_set():
            return 0
    try:
        await _start_front_ends(server, front_ends, http_nursery, shutdown, worker=link is not None)
    except StartError as e:
        log.error("%s", e)
        return 1
    if link is None:
        return await _load_models(server)
    return 0 if link.restart else await _join(server, link)


async def _join(server: Server, link: WorkerLink) -> int:
    """A worker attaches to its supervisor, which then drives its model loads (readiness waits
    for the supervisor: link.ready). 0, or 1 when the supervisor is gone."""
    server.loading = False
    try:
        await link.channel.call("attach")
    except TritonError as e:
        log.error("worker %d: the supervisor is gone: %s", link.index, e.message)
        return 1
    return 0
