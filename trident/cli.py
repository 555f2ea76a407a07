"""``trident`` command line: ``trident serve`` with tritonserver's flag names and defaults.

An unknown flag or a bad value is a one-line error (exit status 2). Booleans take
``--flag=true|false`` (also ``1/0``, ``yes/no``, ``on/off``) or the bare ``--flag`` for true.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

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


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value '{text}'") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got '{text}'")
    return v


def _port(text: str) -> int:
    v = _positive_int(text)
    if v > 65535:
        raise argparse.ArgumentTypeError(f"invalid port '{text}'")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds '{text}'") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got '{text}'")
    return v


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"trident: error: {message}\n")
        sys.exit(2)


def _flag(group: argparse._ArgumentGroup, name: str, default: bool, help: str) -> None:
    group.add_argument(name, type=_bool, nargs="?", const=True, default=default, metavar="BOOL",
                       help=f"{help} (default {str(default).lower()})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trident", description="Triton-compatible inference server on trio")
    parser.add_argument("--version", action="version", version=f"trident {trident.__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    serve = sub.add_parser("serve", help="serve a model repository (the bundled example without --model-repository)")
    d = ServerOptions()
    g = serve.add_argument_group("repository")
    g.add_argument("--model-repository", "--model-store", action="append", dest="model_repositories",
                   metavar="PATH", help="model repository path (repeatable; default: the bundled example repository)")
    g.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default=d.model_control_mode)
    g.add_argument("--load-model", action="append", dest="load_models", default=[], metavar="NAME",
                   help="model to load at start-up in explicit mode (repeatable; '*' loads all)")
    g.add_argument("--repository-poll-secs", type=_seconds, default=d.repository_poll_secs)
    g.add_argument("--model-load-thread-count", type=_positive_int, default=d.model_load_thread_count)
    g.add_argument("--model-config-name", default=d.model_config_name)
    g.add_argument("--disable-auto-complete-config", action="store_true")
    _flag(g, "--strict-model-config", False, "deprecated: true disables auto-complete")
    _flag(g, "--strict-readiness", d.strict_readiness, "ready only when every model is ready")
    _flag(g, "--exit-on-error", d.exit_on_error, "exit when a model fails to load at start-up")
    g.add_argument("--exit-timeout-secs", type=_seconds, default=d.exit_timeout_secs)
    g.add_argument("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE")
    _flag(g, "--allow-client-shm", d.allow_client_shm, "allow client shared memory registration")

    sc = serve.add_argument_group("scheduling")
    sc.add_argument("--rate-limit", choices=["off", "execution_count"], default=d.rate_limit,
                    help="gate instance executions on their rate_limiter resources (default off)")
    sc.add_argument("--rate-limit-resource", action="append", dest="rate_limit_resources", default=[],
                    metavar="NAME:COUNT[:DEVICE]", help="copies of a rate-limiter resource (repeatable)")
    sc.add_argument("--cache-config", action="append", dest="cache_config", default=[],
                    metavar="CACHE,KEY=VALUE", help="response cache settings, e.g. local,size=1048576 (repeatable)")
    g.add_argument("--id", dest="server_id", default=d.server_id, help="server identifier in server metadata")

    h = serve.add_argument_group("front ends")
    _flag(h, "--allow-http", d.allow_http, "serve HTTP")
    h.add_argument("--http-address", default=d.http_address)
    h.add_argument("--http-port", type=_port, default=d.http_port)
    h.add_argument("--http-max-input-size", type=_positive_int, default=d.http_max_input_size)
    h.add_argument("--http-server", choices=["hypercorn", "trident"], default=d.http_server,
                   help=f"HTTP/1.1 serving layer for the HTTP front end (default {d.http_server})")
    h.add_argument("--http-max-connections", type=_positive_int, default=d.http_max_connections,
                   help="open HTTP connections at most; at the limit accepting pauses (trident)")
    h.add_argument("--http-header-timeout-secs", type=_seconds, default=d.http_header_timeout_secs,
                   help="a request head must arrive whole within this (trident)")
    h.add_argument("--http-body-timeout-secs", type=_seconds, default=d.http_body_timeout_secs,
                   help="longest pause between request body bytes (trident)")
    h.add_argument("--http-restricted-api", action="append", dest="http_restricted_api", default=[],
                   metavar="API[,API...]:KEY=VALUE",
                   help="serve these API groups only to requests with header KEY: VALUE (repeatable)")
    _flag(h, "--allow-grpc", d.allow_grpc, "serve gRPC")
    h.add_argument("--grpc-address", default=d.grpc_address)
    h.add_argument("--grpc-port", type=_port, default=d.grpc_port)
    _flag(h, "--grpc-use-ssl", d.grpc_use_ssl, "TLS on the gRPC port")
    h.add_argument("--grpc-server-cert", default="")
    h.add_argument("--grpc-server-key", default="")
    h.add_argument("--grpc-root-cert", default="")
    _flag(h, "--grpc-use-ssl-mutual", d.grpc_use_ssl_mutual, "TLS with client certificates on the gRPC port")
    h.add_argument("--grpc-infer-response-compression-level", choices=["none", "low", "medium", "high"],
                   default=d.grpc_infer_response_compression_level)
    h.add_argument("--grpc-header-forward-pattern", default=d.grpc_header_forward_pattern,
                   help="regex of gRPC metadata keys copied into request parameters")
    h.add_argument("--grpc-max-message-size", type=_positive_int, default=d.grpc_max_message_size)
    h.add_argument("--grpc-restricted-protocol", action="append", dest="grpc_restricted_protocol", default=[],
                   metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
                   help="serve these RPC groups only to calls with metadata KEY: VALUE (repeatable)")
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
    h.add_argument("--grpc-max-connections", type=_positive_int, default=d.grpc_max_connections,
                   help="open gRPC connections at most; at the limit accepting pauses (trident)")
    h.add_argument("--grpc-idle-timeout-secs", type=_seconds, default=d.grpc_idle_timeout_secs,
                   help="GOAWAY a connection with no call for this long (trident; 0: never)")
    h.add_argument("--grpc-handshake-timeout-secs", type=_seconds, default=d.grpc_handshake_timeout_secs,
                   help="TLS handshake and HTTP/2 preface must complete within this (trident)")
    h.add_argument("--grpc-message-timeout-secs", type=_seconds, default=d.grpc_message_timeout_secs,
                   help="a started request message must arrive whole within this (trident)")
    h.add_argument("--grpc-max-buffered-bytes", type=_positive_int, default=d.grpc_max_buffered_bytes,
                   help="request bytes buffered across all gRPC connections (trident)")
    h.add_argument("--grpc-http2", choices=("trident", "h2"), default=d.grpc_http2,
                   help="HTTP/2 implementation under gRPC: trident's own, or the h2 library (fallback; trident)")
    _flag(h, "--allow-metrics", d.allow_metrics, "serve Prometheus metrics")
    _flag(h, "--allow-gpu-metrics", d.allow_gpu_metrics, "GPU metrics")
    _flag(h, "--allow-cpu-metrics", d.allow_cpu_metrics, "CPU metrics")
    h.add_argument("--metrics-address", default=d.metrics_address)
    h.add_argument("--metrics-port", type=_port, default=d.metrics_port)
    h.add_argument("--metrics-interval-ms", type=_positive_int, default=d.metrics_interval_ms)
    h.add_argument("--metrics-config", action="append", dest="metrics_config", default=[], metavar="KEY=VALUE",
                   help="summary_latencies, summary_quantiles, histogram_latencies, counter_latencies")
    h.add_argument("--trace-config", action="append", dest="trace_config", default=[],
                   metavar="[MODE,]KEY=VALUE", help="level, rate, count, mode; triton,file / triton,log-frequency")

    lg = serve.add_argument_group("logging")
    lg.add_argument("--log-verbose", type=_positive_int, default=d.log_verbose)
    _flag(lg, "--log-info", d.log_info, "info messages")
    _flag(lg, "--log-warning", d.log_warning, "warning messages")
    _flag(lg, "--log-error", d.log_error, "error messages")
    lg.add_argument("--log-format", choices=["default", "ISO8601"], default=d.log_format)
    lg.add_argument("--log-file", default=d.log_file)
    return parser


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    """ServerOptions from parsed ``serve`` arguments; raises ValueError for inconsistent ones."""
    opts = ServerOptions()
    for key, value in vars(args).items():
        if key in ("command", "model_repositories", "backend_config", "strict_model_config"):
            continue
        if hasattr(opts, key):
            setattr(opts, key, value)
    if args.model_repositories:
        opts.model_repositories = list(args.model_repositories)
    if args.strict_model_config:
        opts.disable_auto_complete_config = True
    for entry in args.backend_config:
        backend, _, kv = entry.partition(",")
        if not kv:  # a global setting: --backend-config=key=value
            backend, kv = "", entry
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise ValueError(f"--backend-config expects <backend>,<key>=<value>, got '{entry}'")
        opts.backend_config.setdefault(backend, {})[key] = value
    if "default-max-batch-size" in opts.backend_config.get("", {}):
        opts.default_max_batch_size = int(opts.backend_config[""]["default-max-batch-size"])
    from trident.batching.cache import parse_cache_config
    from trident.batching.rate_limiter import parse_resource

    for resource in opts.rate_limit_resources:
        parse_resource(resource)
    parse_cache_config(opts.cache_config)
    if "*" in opts.load_models and len(opts.load_models) > 1:
        raise ValueError("--load-model=* can not be combined with other --load-model values")
    if opts.load_models and opts.model_control_mode != "explicit":
        raise ValueError("--load-model is only allowed with --model-control-mode=explicit")
    if opts.grpc_use_ssl and not (opts.grpc_server_cert and opts.grpc_server_key):
        raise ValueError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if not opts.metrics_address:
        opts.metrics_address = opts.http_address
    from trident.model_metrics import parse_metrics_config
    from trident.restricted import grpc_restrictions, http_restrictions
    from trident.tracing import parse_trace_config

    parse_metrics_config(opts.metrics_config)
    parse_trace_config(opts.trace_config)
    http_restrictions(opts)
    grpc_restrictions(opts)
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "serve":
        parser.print_help()
        return 2
    try:
        options = options_from_args(args)
    except ValueError as e:
        sys.stderr.write(f"trident: error: {e}\n")
        return 2
    from trident.serve import serve

    try:
        return trio.run(serve, options)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
