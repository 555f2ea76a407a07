"""``trident`` command line: ``trident serve`` with tritonserver's flag names and defaults.

Every flag of the current tritonserver's ``--help`` is accepted (read from its
src/command_line_parser.cc: tritonserver 2.51's flags and those added since), in tritonserver's
groups, with every value form tritonserver accepts: those for what trident does map to it (the
deprecated ``--trace-*`` and ``--response-cache-byte-size`` to their ``--trace-config`` /
``--cache-config`` settings), those with no meaning here (:data:`IGNORED_FLAGS`) are checked
as tritonserver checks them and logged once at start-up as ignored, with the reason, as is a
``--backend-config`` setting no backend reads (:mod:`trident.backends.settings`). The
``tritonserver`` command is ``trident serve``. An unknown flag or a bad value is a one-line
error (exit status 2). Booleans take ``--flag=true|false`` in any case (also ``1/0``,
``on/off``, ``yes/no``) or the bare ``--flag`` for true; the names tritonserver reads in any
case (``--model-control-mode``, ``--rate-limit``, ``--grpc-infer-response-compression-level``,
a ``--trace-config`` mode and level) are read in any case here too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

import trio

import trident
from trident.options import ServerOptions

log = logging.getLogger("trident.cli")

_TRUE = {"true", "1", "yes", "on", "t", "y"}
_FALSE = {"false", "0", "no", "off", "f", "n"}


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value '{text}'")


MAX_BUSY_POLL_US = 10_000


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value '{text}'") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got '{text}'")
    return v


def _byte_limit(text: str) -> int:
    """A size limit in bytes, at least 1 (tritonserver refuses 0: it would turn the limit off)."""
    v = _positive_int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got '{text}'")
    return v


def _memory_size(text: str) -> int:
    """Bytes, or a number with a K, M or G suffix (powers of 1024; KiB, MiB, GiB too)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if scale > 1 else t) * scale)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a number of bytes (optionally with K, M or G), got '{text}'") \
            from None


def _port(text: str) -> int:
    v = _positive_int(text)
    if v > 65535:
        raise argparse.ArgumentTypeError(f"invalid port '{text}'")
    return v


MAX_WORKERS = 256


def _workers(text: str) -> int:
    """``--workers``: a number from 1 to MAX_WORKERS, or ``auto`` (0: one per usable CPU)."""
    if text.strip().lower() == "auto":
        return 0
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got '{text}'") from None
    if not 1 <= v <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"expected from 1 to {MAX_WORKERS} workers or 'auto', got '{text}'")
    return v


def _busy_poll_us(text: str) -> int:
    v = _positive_int(text)
    if v > MAX_BUSY_POLL_US:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_BUSY_POLL_US} microseconds, got '{text}'")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds '{text}'") from None
    if not v >= 0 or v == float("inf"):  # nan and inf too
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got '{text}'")
    return v


def _clamped_seconds(text: str) -> float:
    """Seconds; a negative number is 0 (tritonserver's ``--exit-timeout-secs``)."""
    try:
        return max(float(text), 0.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds '{text}'") from None


def _milliseconds(text: str) -> float:
    """A non-negative number of milliseconds, fractions included (tritonserver's
    ``--metrics-interval-ms`` is a float)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of milliseconds '{text}'") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a non-negative number of milliseconds, got '{text}'")
    return v


MAX_QUEUE_DELAY_TARGET_MS = 3_600_000  # an hour (batching.admission.MAX_QUEUE_DELAY_TARGET_US)


def _queue_delay_target(text: str) -> float:
    """``--queue-delay-target-ms``: milliseconds from 0 (off) to an hour."""
    v = _milliseconds(text)
    if v > MAX_QUEUE_DELAY_TARGET_MS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_QUEUE_DELAY_TARGET_MS} milliseconds, got '{text}'")
    return v


def _log_verbose(text: str) -> int:
    """tritonserver's ``--log-verbose``: true (1), false (0) in any case, or an integer level
    (below 0: off)."""
    t = text.strip().lower()
    if t in ("true", "false"):
        return int(t == "true")
    try:
        return max(int(t), 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected true, false or an integer level, got '{text}'") from None


def _lower(text: str) -> str:
    """A name tritonserver reads in any case (checked against the flag's choices)."""
    return text.strip().lower()


#: --trace-config / --trace-level levels as tritonserver reads them (any case) -> the level
_TRACE_LEVELS = {"off": "OFF", "false": "OFF", "on": "TIMESTAMPS", "true": "TIMESTAMPS", "min": "TIMESTAMPS",
                 "max": "TIMESTAMPS", "timestamps": "TIMESTAMPS", "tensors": "TENSORS"}
_TRACE_MODES = ("triton", "opentelemetry")


def _trace_setting(entry: str) -> str:
    """A ``--trace-config`` entry with the names tritonserver reads in any case (a mode, the
    ``level`` and ``mode`` values, levels true/on/min/max and false) in the form of the trace
    settings (:mod:`trident.observability.trace`); anything else is passed on as given."""
    head, sep, value = entry.partition("=")
    mode, comma, key = head.rpartition(",")
    if not sep:
        return entry
    if comma and mode.lower() in _TRACE_MODES:
        mode = mode.lower()
    elif not comma and key == "level":
        value = _TRACE_LEVELS.get(value.strip().lower(), value)
    elif not comma and key == "mode" and value.strip().lower() in _TRACE_MODES:
        value = value.strip().lower()
    return f"{mode}{comma}{key}={value}"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's help with its default, when it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, "", [], False) and not isinstance(action.default, bool) \
                or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action) or ""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog.split()[0]}: error: {message}\n")
        sys.exit(2)


def _flag(group: argparse._ArgumentGroup, name: str, default: bool, help: str) -> None:
    group.add_argument(name, type=_bool, nargs="?", const=True, default=default, metavar="BOOL",
                       help=help)


#: tritonserver flags accepted for drop-in use that mean nothing here: flag -> why (logged once
#: at start-up when given). The value is not checked beyond being present.
IGNORED_FLAGS: dict[str, str] = {
    "--backend-directory": "backends are Python modules (built in, or the 'trident.backends' entry points), "
                           "not shared libraries in a folder",
    "--repoagent-directory": "repository agents are not shared libraries in a folder here",
    "--cache-directory": "the response cache is built in ('local'); there are no cache libraries to find",
    "--pinned-memory-pool-byte-size": "no pinned-memory pool is pre-allocated; tensors live in host memory "
                                      "and frameworks allocate their own",
    "--cuda-memory-pool-byte-size": "no CUDA memory pool is pre-allocated; each framework backend uses its own "
                                    "allocator",
    "--cuda-virtual-address-size": "no CUDA memory pool is pre-allocated",
    "--min-supported-compute-capability": "GPU kernels come from the frameworks, which check the device themselves",
    "--buffer-manager-thread-count": "no buffer-manager threads: tensors are numpy arrays",
    "--http-thread-count": "HTTP runs on the trio event loop (heavy decoding on bounded worker threads); "
                           "there is no thread pool to size",
    "--grpc-infer-allocation-pool-size": "gRPC responses are not allocated from a pool",
    "--grpc-infer-thread-count": "gRPC calls run as tasks on the trio event loop (large decodes and "
                                 "decompression on bounded worker threads); there are no handler threads to size",
    "--grpc-max-response-pool-size": "gRPC responses are not kept in a pool: each is written as it is ready",
    "--host-policy": "there are no NUMA host policies",
    "--model-load-gpu-limit": "GPU memory is not accounted for at load",
    "--enable-peer-access": "CUDA peer access is left to the frameworks",
    "--model-load-retry-count": "a failed load is not retried (load it again through the load API)",
    "--model-namespacing": "model names are global across repositories (a name in two repositories is refused)",
    "--allow-sagemaker": "there is no SageMaker front end",
    "--sagemaker-port": "there is no SageMaker front end",
    "--sagemaker-safe-port-range": "there is no SageMaker front end",
    "--sagemaker-thread-count": "there is no SageMaker front end",
    "--allow-vertex-ai": "there is no Vertex AI front end",
    "--vertex-ai-port": "there is no Vertex AI front end",
    "--vertex-ai-thread-count": "there is no Vertex AI front end",
    "--vertex-ai-default-model": "there is no Vertex AI front end",
}


def _checked(parse: Callable[[str], object]) -> Callable[[str], str]:
    """A value check that keeps the text (an ignored flag's value is logged as given)."""
    def check(text: str) -> str:
        parse(text)
        return text

    return check


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value '{text}'") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number '{text}'") from None


def _pair(delim: str, second: Callable[[str], object], form: str) -> Callable[[str], str]:
    """``<integer><delim><second>`` (tritonserver's pair options: split at the first ``delim``)."""
    def check(text: str) -> str:
        first, sep, rest = text.partition(delim)
        if not sep:
            raise argparse.ArgumentTypeError(f"expected {form}, got '{text}'")
        _integer(first)
        second(rest)
        return text

    return check


def _named_setting(form: str) -> Callable[[str], str]:
    """``<name>,<setting>=<value>``, none of them empty (tritonserver's --host-policy)."""
    def check(text: str) -> str:
        name, _, kv = text.partition(",")
        key, sep, value = kv.partition("=")
        if not (name and key and sep and value):
            raise argparse.ArgumentTypeError(f"expected {form}, got '{text}'")
        return text

    return check


def _bounded(low: int, high: int | None) -> Callable[[str], str]:
    """An integer in [low, high] (high None: no upper bound), as tritonserver bounds it."""
    def check(text: str) -> str:
        v = _integer(text)
        if v < low or (high is not None and v > high):
            bounds = f"in the range {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got '{text}'")
        return text

    return check


_int_value, _float_value, _bool_value = _checked(_integer), _checked(_number), _checked(_bool)

#: how tritonserver parses each ignored flag's value (its ParseOption type, pair or range
#: check): a value tritonserver refuses is refused here too, one it accepts is accepted
_IGNORED_VALUES: dict[str, Callable[[str], str]] = {
    "--backend-directory": str, "--repoagent-directory": str, "--cache-directory": str,
    "--pinned-memory-pool-byte-size": _int_value,
    "--cuda-memory-pool-byte-size": _pair(":", _integer, "<GPU device ID>:<pool byte size>"),
    "--cuda-virtual-address-size": _pair(":", _integer, "<GPU device ID>:<CUDA virtual address size>"),
    "--min-supported-compute-capability": _float_value,
    "--buffer-manager-thread-count": _int_value,
    "--http-thread-count": _int_value,
    "--grpc-infer-allocation-pool-size": _int_value,
    "--grpc-infer-thread-count": _bounded(2, 128),
    "--grpc-max-response-pool-size": _bounded(1, None),
    "--host-policy": _named_setting("<policy_name>,<setting>=<value>"),
    "--model-load-gpu-limit": _pair(":", _number, "<device_id>:<fraction>"),
    "--enable-peer-access": _bool_value,
    "--model-load-retry-count": _int_value,
    "--model-namespacing": _bool_value,
    "--allow-sagemaker": _bool_value,
    "--sagemaker-port": _int_value,
    "--sagemaker-safe-port-range": _pair("-", _integer, "<integer>-<integer>"),
    "--sagemaker-thread-count": _int_value,
    "--allow-vertex-ai": _bool_value,
    "--vertex-ai-port": _int_value,
    "--vertex-ai-thread-count": _int_value,
    "--vertex-ai-default-model": str,
}


def _ignored(group: argparse._ArgumentGroup, name: str) -> None:
    """An ignored flag; its value is checked as tritonserver checks it. A boolean one may be
    given bare (true); the others need a value, as in tritonserver. Each use is kept (and
    logged): some of these flags repeat (--host-policy, --cuda-memory-pool-byte-size...)."""
    check = _IGNORED_VALUES.get(name)
    bare = {"nargs": "?", "const": "true"} if check in (None, _bool_value) else {}
    group.add_argument(name, dest=_ignored_dest(name), default=argparse.SUPPRESS, type=check or str,
                       action="append", metavar="VALUE", **bare,  # type: ignore[arg-type]
                       help=f"accepted for tritonserver compatibility and ignored: {IGNORED_FLAGS[name]}")


def _ignored_dest(name: str) -> str:
    return "ignored__" + name[2:].replace("-", "_")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trident", description="Triton-compatible inference server on trio")
    parser.add_argument("--version", action="version", version=f"trident {trident.__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    serve = sub.add_parser("serve", help="serve a model repository (the bundled example without --model-repository)",
                           formatter_class=_HelpFormatter,
                           description="Serve model repositories over HTTP, gRPC and Prometheus metrics. Every "
                                       "tritonserver flag is accepted; the ones that mean nothing here are logged "
                                       "as ignored at start-up, with the reason.")
    add_serve_arguments(serve)
    from trident.perf.options import add_perf_arguments

    perf = sub.add_parser("perf", help="measure a model's throughput and latency (perf_analyzer's flags and report)",
                          formatter_class=_HelpFormatter,
                          description="Load generator and latency report for trident or Triton, with "
                                      "perf_analyzer's flags, report and CSV layout.")
    add_perf_arguments(perf)
    from trident.perf.analyze import add_analyze_arguments

    analyze = sub.add_parser("analyze", help="sweep model configs and pick the best under a latency budget",
                             formatter_class=_HelpFormatter,
                             description="Load each candidate config through the model-control API, measure it "
                                         "with the trident perf engine, and write a report with the Pareto front, "
                                         "the chosen config.pbtxt and plots.")
    add_analyze_arguments(analyze)
    return parser


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The ``serve`` flags, in tritonserver's groups."""
    d = ServerOptions()
    g = serve.add_argument_group("Server")
    g.add_argument("--id", dest="server_id", default=d.server_id, help="server identifier in server metadata")
    g.add_argument("--exit-timeout-secs", type=_clamped_seconds, default=d.exit_timeout_secs,
                   help="on SIGTERM/SIGINT, how long in-flight inferences may take before they are cancelled")
    g.add_argument("--workers", type=_workers, default=d.workers, metavar="N|auto",
                   help="serve from N processes that behave as one server (auto: one per CPU this process may "
                        "use, from its affinity mask and cgroup CPU quota; 1: this process alone; trident)")
    g.add_argument("--worker-sockets", choices=("per-worker", "shared"), default=d.worker_sockets,
                   help="how --workers share a port: per-worker (SO_REUSEPORT, one accept queue each, the "
                        "kernel spreads connections) or shared (one accept queue for all; trident)")
    g.add_argument("--busy-poll-us", type=_busy_poll_us, default=d.busy_poll_us,
                   help="microseconds the event loop polls for the next request before it sleeps, while "
                        "requests keep coming that fast (0: never; at most 10000)")

    lg = serve.add_argument_group("Logging")
    lg.add_argument("--log-verbose", type=_log_verbose, default=d.log_verbose,
                    help="verbose logging level (0 or false: off, 1 (true) and up: more detail)")
    _flag(lg, "--log-info", d.log_info, "info messages")
    _flag(lg, "--log-warning", d.log_warning, "warning messages")
    _flag(lg, "--log-error", d.log_error, "error messages")
    lg.add_argument("--log-format", choices=["default", "ISO8601", "json"], default=d.log_format,
                    help="log line format (json: one JSON object per line)")
    lg.add_argument("--log-file", default=d.log_file, help="write the log to this file instead of the console")

    g = serve.add_argument_group("Model Repository")
    g.add_argument("--model-repository", "--model-store", action="append", dest="model_repositories",
                   metavar="PATH", help="model repository path (repeatable; default: the bundled example repository)")
    _flag(g, "--exit-on-error", d.exit_on_error, "exit when a model fails to load at start-up")
    g.add_argument("--disable-auto-complete-config", action="store_true",
                   help="do not complete model configs from the model files")
    _flag(g, "--strict-readiness", d.strict_readiness, "ready only when every model is ready")
    g.add_argument("--model-control-mode", type=_lower, choices=["none", "poll", "explicit"],
                   default=d.model_control_mode,
                   help="none: load all at start-up; poll: follow repository changes; explicit: the load API")
    g.add_argument("--repository-poll-secs", type=_seconds, default=d.repository_poll_secs,
                   help="seconds between repository polls (poll mode)")
    g.add_argument("--load-model", action="append", dest="load_models", default=[], metavar="NAME",
                   help="model to load at start-up in explicit mode (repeatable; '*' loads all)")
    g.add_argument("--model-config-name", default=d.model_config_name,
                   help="config file name to prefer over config.pbtxt in each model folder")
    g.add_argument("--model-load-thread-count", type=_positive_int, default=d.model_load_thread_count,
                   help="models loaded in parallel")
    for name in ("--model-load-retry-count", "--model-namespacing", "--enable-peer-access"):
        _ignored(g, name)
    _flag(g, "--model-load-on-demand", d.model_load_on_demand,
          "explicit mode: load a model on its first request (trident's own)")
    g.add_argument("--model-load-on-demand-timeout-secs", type=_seconds, default=d.model_load_on_demand_timeout_secs,
                   help="longest a request waits for its model's load on demand")
    g.add_argument("--model-budget-count", type=_integer, default=None, metavar="N",
                   help="most models loaded on demand at once (least recently used idle ones are unloaded)")
    g.add_argument("--model-budget-memory", type=_memory_size, default=None, metavar="BYTES",
                   help="most resident memory the models loaded on demand add (bytes, or with K/M/G)")

    h = serve.add_argument_group("HTTP")
    _flag(h, "--allow-http", d.allow_http, "serve HTTP")
    h.add_argument("--http-address", default=d.http_address, help="HTTP listen address")
    h.add_argument("--http-port", type=_port, default=d.http_port, help="HTTP port")
    _flag(h, "--reuse-http-port", d.reuse_http_port,
          "SO_REUSEPORT: other servers that set it too may listen on the same HTTP port (and the OpenAI port)")
    h.add_argument("--http-header-forward-pattern", default=d.http_header_forward_pattern,
                   help="regex of HTTP header names copied into inference request parameters")
    _ignored(h, "--http-thread-count")
    h.add_argument("--http-restricted-api", action="append", dest="http_restricted_api", default=[],
                   metavar="API[,API...]:KEY=VALUE",
                   help="serve these API groups only to requests with header KEY: VALUE (repeatable)")
    h.add_argument("--http-max-input-size", type=_byte_limit, default=d.http_max_input_size,
                   help="largest request body in bytes")
    h.add_argument("--http-server", choices=["hypercorn", "trident"], default=d.http_server,
                   help="HTTP/1.1 serving layer (trident)")
    h.add_argument("--http-max-connections", type=_positive_int, default=d.http_max_connections,
                   help="open HTTP connections at most; at the limit accepting pauses (trident)")
    h.add_argument("--http-header-timeout-secs", type=_seconds, default=d.http_header_timeout_secs,
                   help="a request head must arrive whole within this (trident)")
    h.add_argument("--http-body-timeout-secs", type=_seconds, default=d.http_body_timeout_secs,
                   help="longest pause between request body bytes (trident)")
    h.add_argument("--http-send-timeout-secs", type=_seconds, default=d.http_send_timeout_secs,
                   help="close a connection whose client takes none of its response bytes for this long "
                        "(trident; 0: never)")
    h.add_argument("--openai-port", type=_port, default=d.openai_port, metavar="PORT",
                   help="serve the OpenAI-compatible API (/v1) on this port too, at --http-address")

    h = serve.add_argument_group("GRPC")
    _flag(h, "--allow-grpc", d.allow_grpc, "serve gRPC")
    h.add_argument("--grpc-address", default=d.grpc_address, help="gRPC listen address")
    h.add_argument("--grpc-port", type=_port, default=d.grpc_port, help="gRPC port")
    _flag(h, "--reuse-grpc-port", d.reuse_grpc_port,
          "SO_REUSEPORT: other servers that set it too may listen on the same gRPC port")
    h.add_argument("--grpc-header-forward-pattern", default=d.grpc_header_forward_pattern,
                   help="regex of gRPC metadata keys copied into inference request parameters")
    _ignored(h, "--grpc-infer-thread-count")
    _ignored(h, "--grpc-infer-allocation-pool-size")
    _ignored(h, "--grpc-max-response-pool-size")
    # default None: an explicit --grpc-use-ssl=false contradicts --grpc-use-ssl-mutual=true
    h.add_argument("--grpc-use-ssl", type=_bool, nargs="?", const=True, default=None, metavar="BOOL",
                   help="TLS on the gRPC port (default: false)")
    _flag(h, "--grpc-use-ssl-mutual", d.grpc_use_ssl_mutual,
          "TLS with client certificates on the gRPC port (turns TLS on, as tritonserver)")
    h.add_argument("--grpc-server-cert", default="", help="server certificate file (PEM)")
    h.add_argument("--grpc-server-key", default="", help="server key file (PEM)")
    h.add_argument("--grpc-root-cert", default="", help="root certificate file for client certificates (PEM)")
    h.add_argument("--grpc-infer-response-compression-level", type=_lower, choices=["none", "low", "medium", "high"],
                   default=d.grpc_infer_response_compression_level, help="compression of inference responses")
    h.add_argument("--grpc-keepalive-time", type=_positive_int, default=d.grpc_keepalive_time, metavar="MS",
                   help="ping an idle connection after this many ms")
    h.add_argument("--grpc-keepalive-timeout", type=_positive_int, default=d.grpc_keepalive_timeout, metavar="MS",
                   help="close a connection whose ping is not answered within this many ms")
    _flag(h, "--grpc-keepalive-permit-without-calls", d.grpc_keepalive_permit_without_calls,
          "accept client keepalive pings on connections with no call")
    h.add_argument("--grpc-http2-max-pings-without-data", type=_positive_int,
                   default=d.grpc_http2_max_pings_without_data,
                   help="pings the server sends without data in between (0: no limit)")
    h.add_argument("--grpc-http2-min-recv-ping-interval-without-data", type=_positive_int,
                   default=d.grpc_http2_min_recv_ping_interval_without_data, metavar="MS",
                   help="client pings closer than this without data count as strikes")
    h.add_argument("--grpc-http2-max-ping-strikes", type=_positive_int, default=d.grpc_http2_max_ping_strikes,
                   help="strikes before GOAWAY ENHANCE_YOUR_CALM (0: no limit)")
    h.add_argument("--grpc-max-connection-age", type=_positive_int, default=d.grpc_max_connection_age,
                   metavar="MS", help="GOAWAY a connection this long (+-10%%) after it opened, so that its client "
                                      "reconnects (0: never)")
    h.add_argument("--grpc-max-connection-age-grace", type=_positive_int, default=d.grpc_max_connection_age_grace,
                   metavar="MS", help="after the max age, calls may run this much longer; then each ends with "
                                      "UNAVAILABLE and the connection closes (0: no limit)")
    h.add_argument("--grpc-restricted-protocol", action="append", dest="grpc_restricted_protocol", default=[],
                   metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
                   help="serve these RPC groups only to calls with metadata KEY: VALUE (repeatable)")
    h.add_argument("--grpc-max-message-size", type=_positive_int, default=d.grpc_max_message_size,
                   help="largest gRPC message in bytes")
    h.add_argument("--grpc-max-connections", type=_positive_int, default=d.grpc_max_connections,
                   help="open gRPC connections at most; at the limit accepting pauses (trident)")
    h.add_argument("--grpc-idle-timeout-secs", type=_seconds, default=d.grpc_idle_timeout_secs,
                   help="GOAWAY a connection with no call for this long (trident; 0: never)")
    h.add_argument("--grpc-handshake-timeout-secs", type=_seconds, default=d.grpc_handshake_timeout_secs,
                   help="TLS handshake and HTTP/2 preface must complete within this (trident)")
    h.add_argument("--grpc-message-timeout-secs", type=_seconds, default=d.grpc_message_timeout_secs,
                   help="a started request message must arrive whole within this (trident)")
    h.add_argument("--grpc-send-timeout-secs", type=_seconds, default=d.grpc_send_timeout_secs,
                   help="close a connection whose client takes none of its bytes, reset a stream held at a zero "
                        "window, for this long (trident; 0: never)")
    h.add_argument("--grpc-max-buffered-bytes", type=_positive_int, default=d.grpc_max_buffered_bytes,
                   help="request bytes buffered across all gRPC connections (trident)")
    h.add_argument("--grpc-http2", choices=("trident", "h2"), default=d.grpc_http2,
                   help="HTTP/2 implementation under gRPC: trident's own, or the h2 library (fallback; trident)")

    sm = serve.add_argument_group("Sagemaker")
    for name in ("--allow-sagemaker", "--sagemaker-port", "--sagemaker-safe-port-range", "--sagemaker-thread-count"):
        _ignored(sm, name)
    vx = serve.add_argument_group("Vertex")
    for name in ("--allow-vertex-ai", "--vertex-ai-port", "--vertex-ai-thread-count", "--vertex-ai-default-model"):
        _ignored(vx, name)

    m = serve.add_argument_group("Metrics")
    _flag(m, "--allow-metrics", d.allow_metrics, "serve Prometheus metrics")
    _flag(m, "--allow-gpu-metrics", d.allow_gpu_metrics, "GPU metrics")
    _flag(m, "--allow-cpu-metrics", d.allow_cpu_metrics, "CPU metrics")
    m.add_argument("--metrics-address", default=d.metrics_address, help="metrics listen address (default: HTTP's)")
    m.add_argument("--metrics-port", type=_port, default=d.metrics_port, help="metrics port")
    m.add_argument("--metrics-interval-ms", type=_milliseconds, default=d.metrics_interval_ms,
                   help="how often GPU/CPU metrics are sampled")
    m.add_argument("--metrics-config", action="append", dest="metrics_config", default=[], metavar="KEY=VALUE",
                   help="summary_latencies, summary_quantiles, histogram_latencies, counter_latencies")

    t = serve.add_argument_group("Tracing")
    t.add_argument("--trace-config", action="append", dest="trace_config", default=[],
                   metavar="[MODE,]KEY=VALUE", help="level, rate, count, mode; triton,file / triton,log-frequency")

    b = serve.add_argument_group("Backend")
    _ignored(b, "--backend-directory")
    b.add_argument("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE",
                   help="a backend setting (repeatable), e.g. python,shm-default-byte-size=...")

    a = serve.add_argument_group("Repository Agent")
    _ignored(a, "--repoagent-directory")

    c = serve.add_argument_group("Response Cache")
    c.add_argument("--cache-config", action="append", dest="cache_config", default=[],
                   metavar="CACHE,KEY=VALUE", help="response cache settings, e.g. local,size=1048576 (repeatable)")
    _ignored(c, "--cache-directory")

    r = serve.add_argument_group("Rate Limiter")
    r.add_argument("--rate-limit", type=_lower, choices=["off", "execution_count"], default=d.rate_limit,
                   help="gate instance executions on their rate_limiter resources")
    r.add_argument("--rate-limit-resource", action="append", dest="rate_limit_resources", default=[],
                   metavar="NAME:COUNT[:DEVICE]", help="copies of a rate-limiter resource (repeatable)")

    ls = serve.add_argument_group("Load Shedding")
    ls.add_argument("--queue-delay-target-ms", type=_queue_delay_target, default=d.queue_delay_target_ms,
                    metavar="MS", help="refuse a new request (503 / UNAVAILABLE) when the queue delay it would see "
                    "is estimated above this; a model's TRIDENT_QUEUE_DELAY_TARGET_US parameter overrides it "
                    "(0: off, the default)")

    mm = serve.add_argument_group("Memory/Device Management")
    for name in ("--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size", "--cuda-virtual-address-size",
                 "--min-supported-compute-capability", "--buffer-manager-thread-count", "--host-policy",
                 "--model-load-gpu-limit"):
        _ignored(mm, name)
    _flag(mm, "--allow-client-shm", d.allow_client_shm, "let clients register shared-memory regions (as tritonserver 2.60+)")

    dep = serve.add_argument_group("DEPRECATED")
    _flag(dep, "--strict-model-config", False, "true disables auto-complete (use --disable-auto-complete-config)")
    dep.add_argument("--response-cache-byte-size", type=_positive_int, default=None, metavar="BYTES",
                     help="the local response cache's size (use --cache-config=local,size=BYTES)")
    dep.add_argument("--trace-file", default=None, help="use --trace-config=triton,file=PATH")
    dep.add_argument("--trace-log-frequency", default=None, help="use --trace-config=triton,log-frequency=N")
    dep.add_argument("--trace-level", action="append", default=None, help="use --trace-config=level=LEVEL")
    dep.add_argument("--trace-rate", default=None, help="use --trace-config=rate=N")
    dep.add_argument("--trace-count", default=None, help="use --trace-config=count=N")


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    """ServerOptions from parsed ``serve`` arguments; raises ValueError for inconsistent ones."""
    opts = ServerOptions()
    deprecated = ("response_cache_byte_size", "trace_file", "trace_log_frequency", "trace_level", "trace_rate",
                  "trace_count")
    for key, value in vars(args).items():
        if key in ("command", "model_repositories", "backend_config", "strict_model_config", *deprecated):
            continue
        if key.startswith("ignored__"):
            flag = "--" + key[len("ignored__"):].replace("_", "-")
            opts.ignored_flags.extend((flag, str(v), IGNORED_FLAGS[flag]) for v in value)
            continue
        if hasattr(opts, key):
            setattr(opts, key, value)
    # tritonserver's deprecated flags, as the settings that replace them
    if getattr(args, "response_cache_byte_size", None) is not None:
        opts.cache_config = [f"local,size={args.response_cache_byte_size}", *opts.cache_config]
    legacy_trace = []
    for level in getattr(args, "trace_level", None) or []:
        legacy_trace.append(f"level={level}")
    for key, setting in (("trace_rate", "rate"), ("trace_count", "count"), ("trace_file", "triton,file"),
                         ("trace_log_frequency", "triton,log-frequency")):
        if getattr(args, key, None) is not None:
            legacy_trace.append(f"{setting}={getattr(args, key)}")
    opts.trace_config = [_trace_setting(entry) for entry in (*legacy_trace, *opts.trace_config)]
    if args.model_repositories:
        opts.model_repositories = list(args.model_repositories)
    if args.strict_model_config:
        opts.disable_auto_complete_config = True
    for entry in args.backend_config:
        backend, comma, kv = entry.partition(",")
        if not comma:  # a global setting: --backend-config=key=value
            backend, kv = "", entry
        key, sep, value = kv.partition("=")
        if (comma and not backend) or not (sep and key and value):  # as tritonserver refuses them
            raise ValueError(f"--backend-config expects <backend>,<key>=<value> or <key>=<value>, got '{entry}'")
        opts.backend_config.setdefault(backend, {})[key] = value
    if "default-max-batch-size" in opts.backend_config.get("", {}):
        text = opts.backend_config[""]["default-max-batch-size"]
        try:
            opts.default_max_batch_size = int(text)
        except ValueError:
            raise ValueError(f"--backend-config default-max-batch-size must be an integer, got '{text}'") from None
    if opts.backend_config:  # a setting nothing reads is logged at start-up as ignored, with what is read
        from trident.backends.settings import backend_names, unread

        builtin, other = backend_names()
        opts.ignored_flags.extend(("--backend-config", entry, why)
                                  for entry, why in unread(opts.backend_config, builtin, other))
    from trident.batching.cache import parse_cache_config
    from trident.batching.rate_limiter import parse_resource

    for resource in opts.rate_limit_resources:
        parse_resource(resource)
    parse_cache_config(opts.cache_config)
    if "*" in opts.load_models and len(opts.load_models) > 1:
        raise ValueError("--load-model=* can not be combined with other --load-model values")
    if opts.load_models and opts.model_control_mode != "explicit":
        raise ValueError("--load-model is only allowed with --model-control-mode=explicit")
    from trident.server.on_demand import options_problem

    problem = options_problem(opts)
    if problem:
        raise ValueError(problem)
    # mutual TLS is TLS (tritonserver sets use_ssl for --grpc-use-ssl-mutual); a TLS flag that
    # would not be honoured stops the start (trident.grpc.serve.check_tls_options)
    if args.grpc_use_ssl is None:
        opts.grpc_use_ssl = opts.grpc_use_ssl_mutual
    elif opts.grpc_use_ssl_mutual and not args.grpc_use_ssl:
        raise ValueError("--grpc-use-ssl=false contradicts --grpc-use-ssl-mutual=true (mutual TLS is TLS); "
                         "drop one of them")
    from trident.grpc.serve import check_tls_options

    opts.ignored_flags.extend(check_tls_options(opts))
    if not opts.metrics_address:
        opts.metrics_address = opts.http_address
    from trident.observability.model_metrics import parse_metrics_config
    from trident.observability.tracing import parse_trace_config
    from trident.restricted import grpc_restrictions, http_restrictions

    parse_metrics_config(opts.metrics_config)
    parse_trace_config(opts.trace_config)
    http_restrictions(opts)
    grpc_restrictions(opts)
    return opts


def tritonserver_main(argv: Sequence[str] | None = None) -> int:
    """The ``tritonserver`` command: ``trident serve`` under tritonserver's name and usage."""
    parser = _Parser(prog="tritonserver", formatter_class=_HelpFormatter,
                     description="trident, serving as tritonserver: the flags of trident serve.")
    parser.add_argument("--version", action="version", version=f"trident {trident.__version__}")
    add_serve_arguments(parser)
    return _serve(parser.parse_args(argv), "tritonserver")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "perf":
        return _perf(args)
    if args.command == "analyze":
        return _analyze(args)
    if args.command != "serve":
        parser.print_help()
        return 2
    return _serve(args, "trident")


def _perf(args: argparse.Namespace) -> int:
    """``trident perf``: a failure is one line on stderr and exit status 1 (as perf_analyzer)."""
    from trident.perf.engine import run_perf
    from trident.perf.options import perf_options
    from trident.perf.wire import PerfError

    try:
        return run_perf(perf_options(args))
    except PerfError as e:
        sys.stderr.write(f"trident perf: error: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("trident perf: interrupted\n")
        return 130


def _analyze(args: argparse.Namespace) -> int:
    """``trident analyze``: a failure is one line on stderr and exit status 1."""
    from trident.perf.analyze import run_analyze
    from trident.perf.wire import PerfError

    try:
        return run_analyze(args)
    except PerfError as e:
        sys.stderr.write(f"trident analyze: error: {e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("trident analyze: interrupted (the models' own configs were restored)\n")
        return 130


def _serve(args: argparse.Namespace, prog: str) -> int:
    try:
        options = options_from_args(args)
    except ValueError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return 2
    from trident.serve import fifo_task_order, serve

    fifo_task_order()  # the process's trio runs ready tasks first come, first served
    try:
        return trio.run(serve, options)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
