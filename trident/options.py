"""Server options: tritonserver's flag names and defaults, as one dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import trident

EXAMPLE_REPOSITORY = Path(trident.__file__).parent / "example_repository"


@dataclass
class ServerOptions:
    model_repositories: list[str] = field(default_factory=lambda: [str(EXAMPLE_REPOSITORY)])
    server_id: str = "triton"
    # processes serving the repository (trident.cluster; 1: this process alone, 0: one per CPU
    # this process may use) and how their connections are spread (trident.cluster.sockets)
    workers: int = 1
    worker_sockets: str = "per-worker"
    # the event loop polls this long for the next request before it sleeps (0: off; trident's
    # own, see trident.batching.rounds)
    busy_poll_us: int = 100
    # front ends
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    http_server: str = "trident"  # trident (trident.http.fastserver) | hypercorn
    reuse_http_port: bool = False  # SO_REUSEPORT on the HTTP (and OpenAI) listeners
    # trident's own HTTP/1.1 limits (Triton has no flag for these)
    http_max_connections: int = 4096  # open connections; at the limit, accepting pauses
    http_header_timeout_secs: float = 30.0  # a request head must arrive whole within this
    http_body_timeout_secs: float = 60.0  # longest pause between request body bytes
    http_send_timeout_secs: float = 60.0  # response bytes unsent, none taken this long: close (0: never)
    # the OpenAI-compatible front end (trident.openai) on a port of its own, at http_address
    # (None: only under /v1 on the HTTP port)
    openai_port: int | None = None
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    reuse_grpc_port: bool = False  # SO_REUSEPORT on the gRPC listeners
    grpc_use_ssl: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    grpc_use_ssl_mutual: bool = False
    grpc_infer_response_compression_level: str = "none"  # none | low | medium | high
    grpc_header_forward_pattern: str = ""
    http_header_forward_pattern: str = ""
    grpc_max_message_size: int = 1024 * 1024 * 1024
    # gRPC keepalive and HTTP/2 ping policy (tritonserver's flags and defaults; times in ms)
    grpc_keepalive_time: int = 7_200_000
    grpc_keepalive_timeout: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    # GOAWAY a connection this long (+-10%) after it opened, then its calls may run this much
    # longer (gRPC core's max connection age and grace; 0: not set, as tritonserver's default)
    grpc_max_connection_age: int = 0
    grpc_max_connection_age_grace: int = 0
    # trident's own gRPC limits (Triton has no flag for these)
    grpc_max_connections: int = 4096  # open connections; at the limit, accepting pauses
    grpc_idle_timeout_secs: float = 120.0  # a connection with no call for this long gets GOAWAY
    grpc_handshake_timeout_secs: float = 10.0  # TLS handshake + HTTP/2 preface after accept
    grpc_message_timeout_secs: float = 60.0  # a started request message must complete within this
    grpc_send_timeout_secs: float = 60.0  # no write progress / a stream at a zero window this long (0: never)
    grpc_max_buffered_bytes: int = 2 * 1024 * 1024 * 1024  # request bytes buffered, all connections
    grpc_http2: str = "trident"  # HTTP/2 implementation: trident (trident.protocol.http2) | h2 (fallback)
    # restricted APIs: "<api>[,<api>...]:<header>=<value>" entries (tritonserver's syntax)
    http_restricted_api: list[str] = field(default_factory=list)
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    allow_metrics: bool = True
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True
    metrics_address: str = ""
    metrics_port: int = 8002
    metrics_interval_ms: float = 2000.0  # a float, as tritonserver's flag
    metrics_config: list[str] = field(default_factory=list)  # <key>=<value> (trident.observability.model_metrics)
    trace_config: list[str] = field(default_factory=list)  # [<mode>,]<key>=<value> (trident.observability.tracing)
    # repository and lifecycle
    model_control_mode: str = "none"  # none | poll | explicit
    load_models: list[str] = field(default_factory=list)
    repository_poll_secs: float = 15.0
    model_load_thread_count: int = 4
    # trident's own: models loaded on their first request within a budget, least recently used
    # out first (explicit mode; trident.server.on_demand). Budgets: None is none
    model_load_on_demand: bool = False
    model_load_on_demand_timeout_secs: float = 60.0
    model_budget_count: int | None = None
    model_budget_memory: int | None = None  # bytes
    model_config_name: str = ""
    disable_auto_complete_config: bool = False
    strict_readiness: bool = True
    exit_on_error: bool = False
    exit_timeout_secs: float = 30.0
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    default_max_batch_size: int = 4
    allow_client_shm: bool = False
    # scheduling
    rate_limit: str = "off"  # off | execution_count
    rate_limit_resources: list[str] = field(default_factory=list)  # <name>:<count>[:<device>]
    cache_config: list[str] = field(default_factory=list)  # <cache>,<key>=<value> (local,size=N)
    # trident's own: refuse a request whose estimated queue delay is above this (0: off; a model's
    # TRIDENT_QUEUE_DELAY_TARGET_US parameter overrides it; trident.batching.admission)
    queue_delay_target_ms: float = 0.0
    # logging
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    log_file: str = ""
    # tritonserver flags given that mean nothing here: (flag, value, why), logged at start-up
    ignored_flags: list[tuple[str, str, str]] = field(default_factory=list)
