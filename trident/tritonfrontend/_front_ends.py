"""``KServeHttp``, ``KServeGrpc`` and ``Metrics``: trident's front ends over an in-process
``trident.tritonserver.Server`` (see the package docstring)."""

from __future__ import annotations

import abc
import enum
import errno
import logging
from dataclasses import dataclass, field, fields
from typing import Any

from trident.cli import IGNORED_FLAGS
from trident.grpc.serve import serve_grpc
from trident.http.fastserver import serve_http_fast
from trident.observability.metrics import serve_metrics
from trident.server import Server as CoreServer
from trident.tritonfrontend._restricted import RestrictedFeatures
from trident.tritonserver import InvalidArgumentError, Server, UnavailableError, UnsupportedError
from trident.tritonserver._errors import to_api
from trident.tritonserver._loop import Service

log = logging.getLogger("trident.tritonfrontend")


def _check_fields(options: Any, checks: dict[str, type]) -> None:
    """InvalidArgumentError for a field of the wrong type or a port out of range."""
    for f in fields(options):
        value = getattr(options, f.name)
        kind = checks.get(f.name)
        if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise InvalidArgumentError(f"{type(options).__qualname__}.{f.name}: expected {kind.__name__}, "
                                       f"got {type(value).__name__}")
        if kind is int and value < 0:
            raise InvalidArgumentError(f"{type(options).__qualname__}.{f.name} must not be negative (got {value})")
    if not 0 <= options.port <= 65535:
        raise InvalidArgumentError(f"{type(options).__qualname__}.port must be in 0..65535 (got {options.port})")


def _leaf(error: BaseException) -> BaseException:
    """The error inside exception groups (the first; an OSError or ValueError first of all)."""
    while isinstance(error, BaseExceptionGroup):
        inner = error.exceptions
        error = next((e for e in inner if isinstance(e, OSError | ValueError | BaseExceptionGroup)), inner[0])
    return error


def _restricted(options: Any) -> list[str]:
    """The restricted-API values of ``options.restricted_features``. Raises InvalidArgumentError
    for something that is not a RestrictedFeatures."""
    restricted = options.restricted_features
    if not isinstance(restricted, RestrictedFeatures):
        raise InvalidArgumentError(f"{type(options).__qualname__}.restricted_features must be a "
                                   f"tritonfrontend.RestrictedFeatures (got {type(restricted).__name__})")
    return restricted.specs()


def _ignored(name: str, value: Any, default: Any, why: str) -> None:
    if value != default:
        log.warning("ignoring %s=%s: %s", name, value, why)


class _FrontEnd(abc.ABC):
    """What the three share: the server, the service on its loop, start/stop/with."""

    _name = ""
    _graceful = False

    def __init__(self, server: Server, options: Any, options_type: type) -> None:
        if not isinstance(options, options_type):
            raise InvalidArgumentError(f"Incorrect type for options. options argument must be of type "
                                       f"{options_type.__qualname__}")
        if not isinstance(server, Server):
            raise InvalidArgumentError(f"server must be a started trident.tritonserver.Server (got "
                                       f"{type(server).__name__})")
        server._loop_or_raise()
        self._server = server
        self._options: Any = options
        self._service: Service | None = None

    @abc.abstractmethod
    async def _serve(self, server: CoreServer, shutdown: Any, task_status: Any) -> None:
        """Serve this front end for ``server`` until ``await shutdown()`` returns
        (``task_status.started()`` once it listens)."""

    @property
    def port(self) -> int:
        """The port it listens on once started (the one chosen for ``port=0``), else 0."""
        return self._service.port if self._service is not None else 0

    def start(self) -> None:
        """Start listening; returns once it does. Raises InvalidArgumentError when it runs
        already or for a bad option, UnavailableError when its address cannot be bound,
        InvalidArgumentError / UnavailableError when the server is not started / stopping."""
        if self._service is not None and not self._service.done.is_set():
            raise InvalidArgumentError(f"{self._name} is already started")
        address = f"{self._options.address}:{self._options.port}"
        try:
            self._service = self._server._start_service(self._name, self._serve, graceful=self._graceful)
        except Exception as e:
            error = _leaf(e)
            if isinstance(error, OSError):
                why = "already in use" if error.errno == errno.EADDRINUSE else (error.strerror or str(error))
                raise UnavailableError(f"failed to start {self._name}: address {address} {why}") from None
            raise to_api(error) from None
        log.info("Started %s at %s:%d", self._name, self._options.address, self.port)

    def stop(self) -> None:
        """Stop listening and finish (HTTP) or drain (gRPC) what is in flight, within the
        server's ``exit_timeout``. Nothing when it is not running."""
        service, self._service = self._service, None
        if service is not None:
            self._server._stop_service(service)

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class KServeHttp(_FrontEnd):
    """The KServe v2 HTTP front end (Triton's HTTP API, ``trident serve``'s HTTP port)."""

    @dataclass
    class Options:
        """``address`` and ``port`` (0: a free one); ``reuse_port`` sets SO_REUSEPORT;
        ``header_forward_pattern`` forwards matching headers to the models as request
        parameters (``--http-header-forward-pattern``); ``restricted_features`` restricts API
        groups to requests with a header (``--http-restricted-api``); ``thread_count`` is
        ignored."""

        address: str = "0.0.0.0"
        port: int = 8000
        reuse_port: bool = False
        thread_count: int = 8
        header_forward_pattern: str = ""
        restricted_features: RestrictedFeatures = field(default_factory=RestrictedFeatures)

        def __post_init__(self) -> None:
            _check_fields(self, {"address": str, "port": int, "reuse_port": bool, "thread_count": int,
                                 "header_forward_pattern": str})
            _restricted(self)
            if self.thread_count <= 0:
                raise InvalidArgumentError(f"KServeHttp.Options.thread_count must be positive (got {self.thread_count})")

    _name = "HTTPService"
    _graceful = True  # stops accepting and finishes its in-flight requests

    def __init__(self, server: Server, options: KServeHttp.Options | None = None) -> None:
        """Raises InvalidArgumentError for options of another type or a server not started."""
        super().__init__(server, options if options is not None else KServeHttp.Options(), KServeHttp.Options)

    async def _serve(self, server: CoreServer, shutdown: Any, task_status: Any) -> None:
        o: KServeHttp.Options = self._options
        _ignored("KServeHttp.Options.thread_count", o.thread_count, 8, IGNORED_FLAGS["--http-thread-count"])
        # read by serve_http_fast before it first waits: this front end's settings
        server.options.reuse_http_port = o.reuse_port
        server.options.http_header_forward_pattern = o.header_forward_pattern
        server.options.http_restricted_api = _restricted(o)
        await serve_http_fast(server, host=o.address, port=o.port, shutdown_trigger=shutdown, task_status=task_status)


class Grpc_compression_level(enum.IntEnum):  # noqa: N801 - Triton's name
    """gRPC response compression (``--grpc-infer-response-compression-level``)."""

    NONE = 0
    LOW = 1
    MED = 2
    HIGH = 3
    COUNT = 4


_LEVELS = {Grpc_compression_level.NONE: "none", Grpc_compression_level.LOW: "low",
           Grpc_compression_level.MED: "medium", Grpc_compression_level.HIGH: "high"}


class KServeGrpc(_FrontEnd):
    """The KServe v2 gRPC front end (Triton's GRPCInferenceService, ``trident serve``'s gRPC
    port), with TLS, keepalive and compression as its options say."""

    Grpc_compression_level = Grpc_compression_level

    @dataclass
    class Options:
        """The gRPC settings of ``trident serve``'s flags of the same meaning (times in ms;
        ``restricted_features``: ``--grpc-restricted-protocol``); ``infer_allocation_pool_size``
        is ignored."""

        address: str = "0.0.0.0"
        port: int = 8001
        reuse_port: bool = False
        use_ssl: bool = False
        server_cert: str = ""
        server_key: str = ""
        root_cert: str = ""
        use_mutual_auth: bool = False
        keepalive_time_ms: int = 7_200_000
        keepalive_timeout_ms: int = 20_000
        keepalive_permit_without_calls: bool = False
        http2_max_pings_without_data: int = 2
        http2_min_recv_ping_interval_without_data_ms: int = 300_000
        http2_max_ping_strikes: int = 2
        max_connection_age_ms: int = 0
        max_connection_age_grace_ms: int = 0
        infer_compression_level: int | Grpc_compression_level = Grpc_compression_level.NONE
        infer_allocation_pool_size: int = 8
        forward_header_pattern: str = ""
        restricted_features: RestrictedFeatures = field(default_factory=RestrictedFeatures)

        def __post_init__(self) -> None:
            checks: dict[str, type] = {f.name: int for f in fields(self)
                                       if f.name.endswith(("_ms", "_data", "_strikes", "_size")) or f.name == "port"}
            checks.update({name: bool for name in ("reuse_port", "use_ssl", "use_mutual_auth",
                                                    "keepalive_permit_without_calls")})
            checks.update({name: str for name in ("address", "server_cert", "server_key", "root_cert",
                                                   "forward_header_pattern")})
            _check_fields(self, checks)
            try:
                level = Grpc_compression_level(self.infer_compression_level)
            except ValueError:
                level = Grpc_compression_level.COUNT
            if level not in _LEVELS:
                raise InvalidArgumentError(f"KServeGrpc.Options.infer_compression_level must be NONE, LOW, MED or "
                                           f"HIGH (got {self.infer_compression_level!r})")
            self.infer_compression_level = int(level)
            _restricted(self)

    _name = "GRPCInferenceService"

    def __init__(self, server: Server, options: KServeGrpc.Options | None = None) -> None:
        """Raises InvalidArgumentError for options of another type or a server not started."""
        super().__init__(server, options if options is not None else KServeGrpc.Options(), KServeGrpc.Options)

    async def _serve(self, server: CoreServer, shutdown: Any, task_status: Any) -> None:
        o: KServeGrpc.Options = self._options
        _ignored("KServeGrpc.Options.infer_allocation_pool_size", o.infer_allocation_pool_size, 8,
                 IGNORED_FLAGS["--grpc-infer-allocation-pool-size"])
        # read by serve_grpc before it first waits: this front end's settings
        opts = server.options
        opts.allow_grpc = True
        opts.reuse_grpc_port = o.reuse_port
        opts.grpc_use_ssl = o.use_ssl
        opts.grpc_use_ssl_mutual = o.use_mutual_auth
        opts.grpc_server_cert, opts.grpc_server_key, opts.grpc_root_cert = o.server_cert, o.server_key, o.root_cert
        opts.grpc_keepalive_time = o.keepalive_time_ms
        opts.grpc_keepalive_timeout = o.keepalive_timeout_ms
        opts.grpc_keepalive_permit_without_calls = o.keepalive_permit_without_calls
        opts.grpc_http2_max_pings_without_data = o.http2_max_pings_without_data
        opts.grpc_http2_min_recv_ping_interval_without_data = o.http2_min_recv_ping_interval_without_data_ms
        opts.grpc_http2_max_ping_strikes = o.http2_max_ping_strikes
        opts.grpc_max_connection_age = o.max_connection_age_ms
        opts.grpc_max_connection_age_grace = o.max_connection_age_grace_ms
        opts.grpc_infer_response_compression_level = _LEVELS[Grpc_compression_level(o.infer_compression_level)]
        opts.grpc_header_forward_pattern = o.forward_header_pattern
        opts.grpc_restricted_protocol = _restricted(o)
        await serve_grpc(server, host=o.address, port=o.port, task_status=task_status)


class Metrics(_FrontEnd):
    """The Prometheus metrics endpoint (``GET /metrics``, ``trident serve``'s metrics port)."""

    @dataclass
    class Options:
        """``address`` and ``port`` (0: a free one); ``thread_count`` is ignored."""

        address: str = "0.0.0.0"
        port: int = 8002
        thread_count: int = 8

        def __post_init__(self) -> None:
            _check_fields(self, {"address": str, "port": int, "thread_count": int})

    _name = "Metrics Service"

    def __init__(self, server: Server, options: Metrics.Options | None = None) -> None:
        """Raises InvalidArgumentError for options of another type or a server not started,
        UnsupportedError when the server's options turned metrics off."""
        super().__init__(server, options if options is not None else Metrics.Options(), Metrics.Options)
        if not server.options.metrics:
            raise UnsupportedError("the metrics front end of a server whose metrics are off (Options.metrics=False)")

    async def _serve(self, server: CoreServer, shutdown: Any, task_status: Any) -> None:
        o: Metrics.Options = self._options
        _ignored("Metrics.Options.thread_count", o.thread_count, 8,
                 "the metrics endpoint runs on the event loop; there is no thread pool to size")
        await serve_metrics(server, host=o.address, port=o.port, task_status=task_status)


# the 24.08 spelling: KServeHttp.Server(server, options)
KServeHttp.Server = KServeHttp  # type: ignore[attr-defined]
KServeGrpc.Server = KServeGrpc  # type: ignore[attr-defined]
Metrics.Server = Metrics  # type: ignore[attr-defined]
