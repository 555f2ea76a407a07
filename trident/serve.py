"""``trident serve``: the server plus its front ends, until SIGINT/SIGTERM.

Nursery tree: ``open_server`` (repository nursery: models) > front-ends nursery (HTTP, gRPC,
metrics). A signal marks the server as stopping (new inferences get UNAVAILABLE, readiness
goes false, liveness stays true: the front ends keep answering), waits up to
``exit_timeout_secs`` for in-flight requests, stops the front ends, then ``open_server``
unloads the models.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import signal
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

import trident
from trident.batching import rounds
from trident.errors import TritonError
from trident.observability.logs import LogSettings
from trident.options import ServerOptions
from trident.server import EXTENSIONS, Server, open_server
from trident.server.cloud_repository import is_cloud_url, parse_cloud_url

log = logging.getLogger("trident.serve")


#: glibc malloc settings applied at start (mallopt parameter, value, environment variable that overrides it)
MALLOC_SETTINGS = ((-3, 32 << 20, "MALLOC_MMAP_THRESHOLD_"),  # M_MMAP_THRESHOLD: blocks up to 32 MiB from the heap
                   (-1, 128 << 20, "MALLOC_TRIM_THRESHOLD_"))  # M_TRIM_THRESHOLD: keep up to 128 MiB freed


def tune_malloc() -> list[str]:
    """Keep freed tensor-sized blocks for reuse instead of returning them to the kernel.

    With glibc's defaults a freed block of a few MiB (a request body, a gRPC message, a
    response) is unmapped or trimmed, and the next request faults every page of its new block
    in again (about 750 page faults per 1 MiB gRPC identity request here, half its CPU).
    Blocks up to 32 MiB now come from the heap, which keeps up to 128 MiB of free memory.
    A setting whose glibc environment variable is set (``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_``) is left to it. Returns what was set ("name=value"); nothing
    without glibc. Raises nothing.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return []
    done = []
    for param, value, env in MALLOC_SETTINGS:
        if env not in os.environ and mallopt(param, value) == 1:
            done.append(f"{env.strip('_')}={value}")
    return done


class _FirstComeFirstServed(random.Random):
    """trio's scheduler reverses each batch of runnable tasks when ``random() < 0.5`` and then
    takes tasks from the end of the batch: a ``random()`` of 0 always reverses, so each batch
    runs in the order its tasks became runnable. Anything else drawn from it (the clock's
    start offset) gets the low end of its range."""

    def random(self) -> float:
        return 0.0


def fifo_task_order() -> bool:
    """Run each batch of runnable trio tasks first come, first served, for the whole process.

    trio runs a batch of ready tasks (those woken by one poll of the sockets, say) in arrival
    order half the time and in reverse order otherwise, so that code cannot rely on an order.
    Under load that doubles the tail: a connection whose request came first in one batch and
    was served first can be served last in the next one, after a whole round of the others
    (measured with wrk at 64 connections: p99 17.0 ms with trio's order, 12.5 ms first come
    first served, at the same p50). Both orders are allowed by trio's contract; this picks
    the fair one through trio's scheduler's random source, a private name: when it is not
    there (another trio) or trio runs deterministically for tests, nothing changes and this
    returns False. Raises nothing.
    """
    try:
        from trio._core import _run
    except ImportError:
        return False
    current = getattr(_run, "_r", None)
    if isinstance(current, _FirstComeFirstServed):
        return True  # applied already
    if type(current) is not random.Random or getattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True):
        return False
    _run._r = _FirstComeFirstServed()
    return True


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
                            shutdown: trio.Event) -> None:
    """Start the enabled front ends. Raises StartError when one cannot bind its address."""
    opts = server.options
    if opts.allow_grpc:
        from trident.grpc.serve import serve_grpc

        port = await _start(nursery, partial(serve_grpc, server, host=opts.grpc_address, port=opts.grpc_port),
                            "GRPC service", opts.grpc_address, opts.grpc_port)
        log.info("Started GRPCInferenceService at %s:%s", opts.grpc_address, port)
    if opts.allow_http:
        if opts.http_server == "trident":
            from trident.http.fastserver import serve_http_fast as serve_http
        else:
            from trident.http.serve import serve_http

        port = await _start(http_nursery, partial(serve_http, server, host=opts.http_address, port=opts.http_port,
                                                  shutdown_trigger=shutdown.wait),
                            "HTTP service", opts.http_address, opts.http_port)
        log.info("Started HTTPService at %s:%s", opts.http_address, port)
    if opts.openai_port is not None:
        from trident.openai.serve import serve_openai

        port = await _start(http_nursery, partial(serve_openai, server, host=opts.http_address, port=opts.openai_port,
                                                  shutdown_trigger=shutdown.wait),
                            "OpenAI frontend", opts.http_address, opts.openai_port)
        log.info("Started OpenAIFrontend at %s:%s", opts.http_address, port)
    if opts.allow_metrics:
        from trident.observability.metrics import serve_metrics

        port = await _start(nursery, partial(serve_metrics, server, host=opts.metrics_address, port=opts.metrics_port),
                            "Metrics service", opts.metrics_address, opts.metrics_port)
        log.info("Started Metrics Service at %s:%s", opts.metrics_address, port)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A text table in tritonserver's start-up style (``+---+`` rules, ``| a | b |`` rows)."""
    widths = [max([len(h), *(len(str(r[i])) for r in rows)]) for i, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([rule, line(headers), rule, *(line(r) for r in rows), rule])


def startup_tables(server: Server) -> list[str]:
    """The tables tritonserver logs once its models are loaded: backends, models (version,
    status with the reason of a failure) and options."""
    opts = server.options
    backends: dict[str, str] = {}
    for mv in server.repository.serving():
        name = mv.config.backend or mv.config.platform
        if name and name not in backends:
            config = opts.backend_config.get(name, {})
            backends[name] = json.dumps({"cmdline": {**opts.backend_config.get("", {}), **config}}, sort_keys=True)
    models = [(e.name, e.version or "-", e.state if e.state == "READY" or not e.reason else f"{e.state}: {e.reason}")
              for e in server.repository_index() if e.state and e.reason != "unloaded"]
    mode = {"none": "MODE_NONE", "poll": "MODE_POLL", "explicit": "MODE_EXPLICIT"}[opts.model_control_mode]
    options: list[tuple[str, str]] = [
        ("server_id", opts.server_id), ("server_version", f"trident {trident.__version__}"),
        ("server_extensions", " ".join(EXTENSIONS)),
        *((f"model_repository_path[{i}]", path) for i, path in enumerate(opts.model_repositories)),
        ("model_control_mode", mode),
        *((f"startup_models_{i}", name) for i, name in enumerate(opts.load_models)),
        ("strict_model_config", str(int(opts.disable_auto_complete_config))),
        ("model_config_name", opts.model_config_name),
        ("rate_limit", "OFF" if opts.rate_limit == "off" else "EXEC_COUNT"),
        ("strict_readiness", str(int(opts.strict_readiness))), ("exit_timeout", f"{opts.exit_timeout_secs:g}"),
        ("cache_enabled", str(int(bool(opts.cache_config)))),
        ("http_server", opts.http_server), ("grpc_http2", opts.grpc_http2),
    ]
    return [format_table(("Backend", "Config"), list(backends.items())),
            format_table(("Model", "Version", "Status"), models),
            format_table(("Option", "Value"), options)]


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


def _missing_repository(opts: ServerOptions) -> str | None:
    """Why a ``--model-repository`` cannot be served (None when all can): a missing or
    unreadable folder stops the server at start-up, as tritonserver does."""
    for path in opts.model_repositories:
        if is_cloud_url(path):  # listed by the repository; a listing failure is each load's reason
            try:
                parse_cloud_url(path)
            except TritonError as e:
                return e.message
            continue
        folder = Path(path)
        if not folder.exists():
            return f"model repository '{path}' does not exist"
        if not folder.is_dir():
            return f"model repository '{path}' is not a directory"
        if not os.access(folder, os.R_OK | os.X_OK):
            return f"model repository '{path}' cannot be read"
    return None


def _unusable_tls(opts: ServerOptions) -> str | None:
    """Why gRPC's TLS settings cannot be used (None when they can, or gRPC is off): a bad
    combination, or a certificate or key that cannot be loaded."""
    if not opts.allow_grpc:
        return None
    from trident.grpc.serve import ssl_context

    try:
        ssl_context(opts)
    except ValueError as e:
        return str(e)
    return None


def _unwritable_trace_file(opts: ServerOptions) -> str | None:
    """Why ``--trace-config triton,file=PATH`` cannot be written (None when it can, or none is
    set): traces are written later, so a folder that is missing or read-only is found now."""
    from trident.observability.tracing import parse_trace_config

    path = parse_trace_config(opts.trace_config)[0].get("trace_file")
    if not path:
        return None
    folder = Path(path).parent
    if not folder.is_dir():
        return f"--trace-config triton,file={path}: folder '{folder}' does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"--trace-config triton,file={path}: folder '{folder}' is not writable"
    return None


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
        try:
            log_settings.install()
        except OSError as e:  # --log-file cannot be opened: nothing could be logged
            sys.stderr.write(f"error: cannot open --log-file '{options.log_file}': {e.strerror or e}\n")
            return 1
        missing = _missing_repository(options) or _unusable_tls(options) or _unwritable_trace_file(options)
        if missing is not None:
            log.error("error: creating server: %s", missing)
            return 1
        _warn_open_model_control(options)
        for flag, value, why in options.ignored_flags:
            log.warning("ignoring %s=%s: %s", flag, value, why)
        log.info("trident %s (Triton-compatible inference server, KServe v2) starting", trident.__version__)
        tuned = tune_malloc()
        if tuned:
            log.debug("malloc: %s", ", ".join(tuned))
        if options.busy_poll_us and not rounds.current().busy_poll(options.busy_poll_us / 1e6):
            log.info("--busy-poll-us: this trio's poller is out of reach; the loop sleeps at once")
        # the front ends listen before the models load: live is true and ready false meanwhile
        async with open_server(options, log_settings, load=False) as server:
            shutdown = trio.Event()
            # HTTP stops by itself once triggered (hypercorn finishes open responses); gRPC and
            # metrics are cancelled after the drain (gRPC sends GOAWAY and drains its calls)
            # (a return inside these nurseries would be lost when their cancellation unwinds)
            status = 0
            async with trio.open_nursery() as http_nursery:
                async with trio.open_nursery() as front_ends:
                    try:
                        await _start_front_ends(server, front_ends, http_nursery, shutdown)
                    except StartError as e:
                        log.error("%s", e)
                        status = 1
                    else:
                        status = await _load_models(server)
                    if status:
                        front_ends.cancel_scope.cancel()
                        http_nursery.cancel_scope.cancel()
                    else:
                        async for signum in signals:
                            log.info("signal (%d) received, waiting for in-flight inferences to complete", signum)
                            break
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
    if status:
        return status
    log.info("server stopped")
    return 0
