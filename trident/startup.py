"""What a server checks and logs once as it starts: options that cannot be served, notes on
the options, and tritonserver's start-up tables.

Both a single server (:mod:`trident.serve`) and a ``--workers`` supervisor
(:mod:`trident.cluster.supervisor`) run the checks and log the notes, once; the tables are
logged by whoever loaded the models (a supervisor asks one of its workers for them).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trident
from trident.errors import TritonError
from trident.observability.logs import LogSettings
from trident.options import ServerOptions
from trident.server import EXTENSIONS
from trident.server.cloud_repository import is_cloud_url, parse_cloud_url

if TYPE_CHECKING:
    from trident.server import Server

log = logging.getLogger("trident.serve")


def start_logging(opts: ServerOptions) -> LogSettings | None:
    """Install the log settings of ``opts`` (the ``trident`` loggers' handler); None, after one
    line on stderr, when ``--log-file`` cannot be opened (nothing could be logged)."""
    settings = LogSettings.from_options(opts)
    try:
        settings.install()
    except OSError as e:
        sys.stderr.write(f"error: cannot open --log-file '{opts.log_file}': {e.strerror or e}\n")
        return None
    return settings


def check_start(opts: ServerOptions) -> bool:
    """The checks and notes of a start: False, after one error line, when the server cannot
    start (:func:`startup_problem`); else the notes are logged (:func:`log_startup_notes`)."""
    problem = startup_problem(opts)
    if problem is not None:
        log.error("error: creating server: %s", problem)
        return False
    log_startup_notes(opts)
    return True


def startup_problem(opts: ServerOptions) -> str | None:
    """Why a server with these options cannot start (None when it can): a repository that
    cannot be served, TLS settings that cannot be used, a trace file that cannot be written."""
    return _missing_repository(opts) or _unusable_tls(opts) or _unwritable_trace_file(opts)


def log_startup_notes(opts: ServerOptions) -> None:
    """What a server logs once as it starts: warnings about its options, the flags it ignores."""
    _warn_open_model_control(opts)
    if opts.allow_http and opts.http_server == "hypercorn" and opts.http_send_timeout_secs:
        log.info("--http-send-timeout-secs=%g is not applied with --http-server hypercorn: an HTTP client that "
                 "never reads keeps its connection (--http-server trident applies it)", opts.http_send_timeout_secs)
    for flag, value, why in opts.ignored_flags:
        log.warning("ignoring %s=%s: %s", flag, value, why)
    log.info("trident %s (Triton-compatible inference server, KServe v2) starting", trident.__version__)


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
    """One line when explicit model control is open to code upload: a load may carry model files
    (``file:`` parameters) and an uploaded ``model.py`` runs as it loads, as in Triton, unless the
    model-repository API is restricted on every front end that serves it. The line names the
    flags that restrict it; INFO, or WARNING when an open front end listens on all interfaces."""
    if opts.model_control_mode != "explicit":
        return
    flags: list[str] = []
    public = False
    for allowed, address, restricted, flag in (
            (opts.allow_http, opts.http_address, opts.http_restricted_api, "--http-restricted-api"),
            (opts.allow_grpc, opts.grpc_address, opts.grpc_restricted_protocol, "--grpc-restricted-protocol")):
        if allowed and not any("model-repository" in spec.partition(":")[0].split(",") for spec in restricted):
            flags.append(f"{flag}=model-repository:<key>=<value>")
            public = public or address in ("", "0.0.0.0", "::")
    if not flags:
        return
    log.log(logging.WARNING if public else logging.INFO,
            "the model-control API is open to code upload%s: a load may carry model files and runs an "
            "uploaded model.py (as Triton does); restrict it with %s",
            " on all interfaces" if public else "", " and ".join(flags))


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
