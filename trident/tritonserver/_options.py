"""``tritonserver.Options``: Triton's server options, and what trident makes of each.

:func:`server_options` turns them into trident's :class:`~trident.options.ServerOptions`. An
option trident serves is passed on; one with no meaning in trident (a directory of Triton's
installation, a pinned or CUDA memory pool, a thread count of Triton's own, model namespacing)
is recorded as ignored with the reason ``trident serve`` gives for the same tritonserver flag
(:data:`trident.cli.IGNORED_FLAGS`) and logged when the server starts (as a warning: the log
settings of the options decide whether it is shown, and Triton's defaults log nothing).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Annotated, Any

from trident.cli import IGNORED_FLAGS
from trident.options import ServerOptions
from trident.tritonserver._enums import InstanceGroupKind, LogFormat, ModelControlMode, RateLimitMode
from trident.tritonserver._errors import InvalidArgumentError

uint = Annotated[int, ctypes.c_uint]


@dataclass(slots=True)
class RateLimiterResource:
    """A resource count for the rate limiter (``--rate-limit-resource name:count:device``)."""

    name: str
    count: uint
    device: uint


@dataclass(slots=True)
class ModelLoadDeviceLimit:
    """A limit on device memory for model loading (ignored: trident does not account for it)."""

    kind: InstanceGroupKind
    device: uint
    fraction: float


@dataclass(slots=True)
class Options:
    """Server options, with the names and defaults of Triton's ``tritonserver.Options``.

    ``model_repository`` is required (a path or a list of paths). Validated by
    ``Server.start()``: TypeError for a value of the wrong type, InvalidArgumentError for a bad
    value. See the README ("In-process use") for what each option does in trident.
    """

    model_repository: str | list[str] = field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False

    rate_limiter_mode: RateLimitMode = RateLimitMode.OFF
    rate_limiter_resources: list[RateLimiterResource] = field(default_factory=list)

    pinned_memory_pool_size: uint = 1 << 28
    cuda_memory_pool_sizes: dict[int, uint] = field(default_factory=dict)

    cache_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_directory: str = "/opt/tritonserver/caches"

    min_supported_compute_capability: float = 6.0

    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: uint = 30
    buffer_manager_thread_count: uint = 0
    model_load_thread_count: uint = 4
    model_load_retry_count: uint = 0
    model_namespacing: bool = False
    enable_peer_access: bool = True

    log_file: str | None = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: uint = 0

    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: uint = 2000

    backend_directory: str = "/opt/tritonserver/backends"
    repo_agent_directory: str = "/opt/tritonserver/repoagents"
    model_load_device_limits: list[ModelLoadDeviceLimit] = field(default_factory=list)
    backend_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    metrics_configuration: dict[str, dict[str, str]] = field(default_factory=dict)


_CONTROL = {ModelControlMode.NONE: "none", ModelControlMode.POLL: "poll", ModelControlMode.EXPLICIT: "explicit"}
_RATE = {RateLimitMode.OFF: "off", RateLimitMode.EXEC_COUNT: "execution_count"}
_FORMAT = {LogFormat.DEFAULT: "default", LogFormat.ISO8601: "ISO8601"}

#: (option, Triton's default, the tritonserver flag): an option with no meaning in trident, ignored
#: (and logged at start) when set to anything but its default
_IGNORED: tuple[tuple[str, Any, str], ...] = (
    ("pinned_memory_pool_size", 1 << 28, "--pinned-memory-pool-byte-size"),
    ("cuda_memory_pool_sizes", {}, "--cuda-memory-pool-byte-size"),
    ("cache_directory", "/opt/tritonserver/caches", "--cache-directory"),
    ("min_supported_compute_capability", 6.0, "--min-supported-compute-capability"),
    ("buffer_manager_thread_count", 0, "--buffer-manager-thread-count"),
    ("model_load_retry_count", 0, "--model-load-retry-count"),
    ("model_namespacing", False, "--model-namespacing"),
    ("enable_peer_access", True, "--enable-peer-access"),
    ("backend_directory", "/opt/tritonserver/backends", "--backend-directory"),
    ("repo_agent_directory", "/opt/tritonserver/repoagents", "--repoagent-directory"),
    ("model_load_device_limits", [], "--model-load-gpu-limit"),
    ("host_policies", {}, "--host-policy"),
)


def _check(name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    """TypeError (as Triton's bindings raise) for an option of the wrong type."""
    if isinstance(value, bool) and kind in (int, float):
        raise TypeError(f"Options.{name}: expected {kind.__name__}, got bool")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise TypeError(f"Options.{name}: expected {names}, got {type(value).__name__}")


def _uint(name: str, value: Any) -> int:
    _check(name, value, int)
    if value < 0:
        raise InvalidArgumentError(f"Options.{name} must not be negative (got {value})")
    return int(value)


def server_options(opts: Options) -> ServerOptions:
    """trident's options for Triton's: the mapping described in the module docstring.

    Raises TypeError for a value of the wrong type, InvalidArgumentError for a missing model
    repository or a bad value.
    """
    repository = opts.model_repository
    if repository is None or repository == [] or repository == "":
        raise InvalidArgumentError("Model repository must be specified.")
    repositories = [repository] if isinstance(repository, str) else repository
    _check("model_repository", repositories, list)
    for path in repositories:
        _check("model_repository", path, str)
    _check("server_id", opts.server_id, str)
    try:
        control = _CONTROL[ModelControlMode(opts.model_control_mode)]
        rate = _RATE[RateLimitMode(opts.rate_limiter_mode)]
        log_format = _FORMAT[LogFormat(opts.log_format)]
    except ValueError as e:
        raise InvalidArgumentError(f"Options: {e}") from None
    _check("startup_models", opts.startup_models, list)
    resources = []
    for r in opts.rate_limiter_resources:
        _check("rate_limiter_resources", r, RateLimiterResource)
        resources.append(f"{r.name}:{_uint('rate_limiter_resources.count', r.count)}:"
                         f"{_uint('rate_limiter_resources.device', r.device)}")
    caches = []
    for cache, settings in opts.cache_config.items():
        _check("cache_config", settings, dict)
        caches.append(",".join([cache, *(f"{k}={v}" for k, v in settings.items())]))
    for flag in ("exit_on_error", "strict_readiness", "strict_model_config", "log_info", "log_warn", "log_error",
                 "metrics", "gpu_metrics", "cpu_metrics"):
        _check(flag, getattr(opts, flag), bool)
    if opts.log_file is not None:
        _check("log_file", opts.log_file, str)
    # Triton cascades the log levels: verbose implies info, info warnings, warnings errors
    log_info = opts.log_info or _uint("log_verbose", opts.log_verbose) > 0
    log_warn = opts.log_warn or log_info
    log_error = opts.log_error or log_warn
    ignored = [(f"Options.{name}", str(getattr(opts, name)), IGNORED_FLAGS[flag])
               for name, default, flag in _IGNORED if getattr(opts, name) != default]
    return ServerOptions(
        model_repositories=list(repositories),
        server_id=opts.server_id,
        model_control_mode=control,
        load_models=list(opts.startup_models),
        disable_auto_complete_config=opts.strict_model_config,
        rate_limit=rate,
        rate_limit_resources=resources,
        cache_config=caches,
        exit_on_error=opts.exit_on_error,
        strict_readiness=opts.strict_readiness,
        exit_timeout_secs=float(_uint("exit_timeout", opts.exit_timeout)),
        model_load_thread_count=max(1, _uint("model_load_thread_count", opts.model_load_thread_count)),
        log_file=opts.log_file or "",
        log_info=log_info,
        log_warning=log_warn,
        log_error=log_error,
        log_format=log_format,
        log_verbose=int(opts.log_verbose),
        allow_metrics=opts.metrics,
        allow_gpu_metrics=opts.gpu_metrics,
        allow_cpu_metrics=opts.cpu_metrics,
        metrics_interval_ms=float(_uint("metrics_interval", opts.metrics_interval)),
        metrics_config=[f"{k}={v}" for settings in opts.metrics_configuration.values() for k, v in settings.items()],
        backend_config={backend: dict(settings) for backend, settings in opts.backend_configuration.items()},
        ignored_flags=ignored,
        # the in-process server has no front ends of its own (trident.tritonfrontend starts them)
        # and spins no CPU waiting for requests
        busy_poll_us=0,
    )
