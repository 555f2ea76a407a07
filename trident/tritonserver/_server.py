"""``tritonserver.Server``: an in-process trident server, as Triton's package drives one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from trident.observability.logs import LogSettings
from trident.observability.metrics import (
    host_collectors,
    host_exposition,
    poll_host_metrics,
    worker_exposition,
)
from trident.protocol import kserve
from trident.server import Server as CoreServer
from trident.startup import log_startup_notes, startup_problem
from trident.tritonserver._enums import MetricFormat, MetricKind
from trident.tritonserver._errors import (
    InternalError,
    InvalidArgumentError,
    UnavailableError,
    UnsupportedError,
    to_api,
)
from trident.tritonserver._loop import NOT_STARTED, Serve, ServerLoop, Service
from trident.tritonserver._model import Model
from trident.tritonserver._options import Options, server_options


class ModelDictionary(dict[tuple[str, int], Model]):
    """The models of ``Server.models()`` by ``(name, version)``; indexing by a name alone gives
    that model with version -1 (the server's choice). Raises KeyError for an unknown model."""

    def __init__(self, server: Server, models: list[Model]) -> None:
        super().__init__()
        for model in models:
            self[(model.name, model.version)] = model
        self._server = server
        self._names = {name for name, _ in self.keys()}

    def __getitem__(self, key: Any) -> Model:
        if isinstance(key, tuple):
            try:
                return dict.__getitem__(self, key)
            except KeyError:
                raise KeyError(f"Unknown Model: {key}") from None
        if key in self._names:
            return Model(self._server, key, -1)
        raise KeyError(f"Unknown Model: {key}")


class Server:
    """An in-process trident server with the interface of Triton's ``tritonserver.Server``.

    ``start()`` runs it on a trio event loop in a thread of its own (the models the control
    mode asks for are loaded before it returns); ``stop()`` drains in-flight requests, unloads
    the models and joins that thread, as does interpreter exit. Every method is safe to call
    from any thread, and blocks the calling thread until the server answered (from asyncio,
    ``Model.async_infer`` is the call that does not block; the others answer fast, except
    ``start``, ``load``, ``unload`` and ``stop``, which wait for model loads). See the README
    ("In-process use") for how it relates to ``trident.open_server``.
    """

    def __init__(self, options: Options | None = None, **kwargs: Any) -> None:
        """The options as an :class:`Options` or as its fields (``model_repository=...``);
        validated by :meth:`start`. Raises TypeError for an unknown field, InvalidArgumentError
        for both an Options and fields."""
        if options is None:
            options = Options(**kwargs)
        elif kwargs:
            raise InvalidArgumentError(f"give either an Options or its fields, not both (got {', '.join(sorted(kwargs))} "
                                       "with an Options)")
        self.options: Options = options
        self._loop: ServerLoop | None = None
        self._log_settings: LogSettings | None = None
        self._collectors: list[Any] = []
        self._lock = threading.Lock()

    # ---- life cycle ------------------------------------------------------------------------

    def start(self, wait_until_ready: bool = False, polling_interval: float = 0.1,
              timeout: float | None = None) -> Server:
        """Start the server and load the models the control mode asks for; returns ``self``.

        Raises InvalidArgumentError when it is started already or for a bad option, TypeError
        for an option of the wrong type, InternalError when the repository cannot be served or
        (``exit_on_error``, the default) a model failed to load, UnavailableError when
        ``wait_until_ready`` waited ``timeout`` seconds for readiness in vain (the server is
        stopped then, where Triton leaves it running). Whatever fails, nothing is left running.
        """
        with self._lock:
            if self._loop is not None:
                raise InvalidArgumentError("Server already started")
            core = server_options(self.options)
            problem = startup_problem(core)
            if problem is not None:
                raise InternalError(f"failed to start the server: {problem}")
            settings = LogSettings.from_options(core)
            try:
                settings.install()
            except OSError as e:
                raise InvalidArgumentError(f"cannot open log_file '{core.log_file}': {e.strerror or e}") from None
            log_startup_notes(core)
            collectors = host_collectors(core) if core.allow_metrics else []
            interval = max(core.metrics_interval_ms, 1.0) / 1000.0

            async def poll(server: CoreServer) -> None:
                await poll_host_metrics(collectors, interval)

            loop = ServerLoop(core, settings, (poll,) if collectors else ())
            try:
                loop.start()
            except BaseException as e:
                settings.uninstall()
                raise to_api(e) from None
            self._loop, self._log_settings, self._collectors = loop, settings, collectors
        if core.exit_on_error:
            failed = [e for e in self._call(lambda s: s.repository_index())
                      if e.state == "UNAVAILABLE" and e.reason and e.reason != "unloaded"]
            if failed:
                self.stop()
                raise InternalError("failed to load all models: " + "; ".join(
                    f"'{e.name}' version {e.version or '-'}: {e.reason}" for e in failed))
        if wait_until_ready:
            started = time.monotonic()
            while not self.ready() and (timeout is None or time.monotonic() - started < timeout):
                time.sleep(polling_interval)
            if not self.ready():
                self.stop()  # Triton leaves it running; a `Server(...).start(...)` chain could not stop it
                raise UnavailableError("Timeout before ready")
        return self

    def stop(self) -> None:
        """Stop the server: its front ends stop, in-flight requests get ``exit_timeout``
        seconds to finish (then are cancelled: their iterators end with UnavailableError), the
        models are unloaded and the server's thread is joined. It can be started again.

        Raises InvalidArgumentError when it is not started, or from a model's code (the
        server's own thread).
        """
        with self._lock:
            loop = self._loop
            if loop is None:
                raise InvalidArgumentError(NOT_STARTED)
            loop.stop()
            self._loop = None
            if self._log_settings is not None:
                self._log_settings.uninstall()
                self._log_settings = None

    def _loop_or_raise(self) -> ServerLoop:
        """The running loop. Raises InvalidArgumentError when not started (or in a forked
        child), UnavailableError while stopping."""
        loop = self._loop
        if loop is None:
            raise InvalidArgumentError(NOT_STARTED)
        loop.check_usable()
        return loop

    def _call(self, fn: Callable[[CoreServer], Any]) -> Any:
        """``fn(server)`` on the server's loop, its errors as the API's."""
        loop = self._loop_or_raise()
        try:
            return loop.call(fn)
        except Exception as e:
            raise to_api(e) from None

    def _start_service(self, name: str, serve: Serve, *, graceful: bool) -> Service:
        """Start a front end on the server's loop (trident.tritonfrontend)."""
        loop = self._loop_or_raise()
        service: Service = loop.start_service(name, serve, graceful=graceful)
        return service

    def _stop_service(self, service: Service) -> None:
        loop = self._loop
        if loop is not None:
            loop.stop_service(service)

    # ---- health and metadata ---------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """The server's KServe metadata: name (``server_id``), version, extensions."""
        meta: dict[str, Any] = self._call(lambda s: kserve.server_metadata_json(s.metadata()))
        return meta

    def live(self) -> bool:
        live: bool = self._call(lambda s: s.is_live())
        return live

    def ready(self) -> bool:
        """Ready: started, not stopping, and (``strict_readiness``) every model ready."""
        ready: bool = self._call(lambda s: s.is_ready())
        return ready

    def metrics(self, metric_format: MetricFormat = MetricFormat.PROMETHEUS) -> str:
        """Prometheus text: Triton's per-model ``nv_*`` families, the models' custom metrics
        and the CPU/GPU gauges the options allow. Raises UnsupportedError when the options
        turned metrics off."""
        if MetricFormat(metric_format) != MetricFormat.PROMETHEUS:
            raise InvalidArgumentError(f"unknown metric format {metric_format!r}")
        if not self.options.metrics:
            raise UnsupportedError("metrics are off (Options.metrics=False)")
        collectors = self._collectors
        text: bytes = self._call(lambda s: worker_exposition(s) + host_exposition(collectors))
        return text.decode()

    # ---- models ----------------------------------------------------------------------------

    def model(self, model_name: str, model_version: int = -1) -> Model:
        """The model ``model_name`` (checked when used). Raises InvalidArgumentError when the
        server is not started."""
        return Model(self, model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        """The models of the repository by ``(name, version)``, with their state (version -1
        and state None for one never loaded)."""
        entries = self._call(lambda s: s.repository_index(exclude_not_ready))
        return ModelDictionary(self, [Model(self, e.name, int(e.version) if e.version.isdigit() else -1,
                                            e.state or None, e.reason or None) for e in entries])

    def load(self, model_name: str, parameters: dict[str, str | int | bool | bytes] | None = None) -> Model:
        """Load (or reload) a model and wait until it is ready (EXPLICIT mode). ``parameters``:
        ``"config"`` (a JSON config overriding the repository's) and ``"file:<version>/<name>"``
        (bytes: the model's files). Raises UnsupportedError outside EXPLICIT mode,
        InvalidArgumentError for other parameters, the load's error when it fails."""
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, value in (parameters or {}).items():
            if key == "config" and isinstance(value, str):
                config = value
            elif isinstance(key, str) and key.startswith("file:") and isinstance(value, bytes | bytearray):
                files[key[len("file:"):]] = bytes(value)
            else:
                raise InvalidArgumentError(f"unexpected load parameter '{key}' ({type(value).__name__}): expected "
                                           "'config' (str) or 'file:<version>/<name>' (bytes)")
        self._call(lambda s: s.load_model(model_name, config, files or None))
        return self.model(model_name)

    def unload(self, model: str | Model, unload_dependents: bool = False, wait_until_unloaded: bool = False,
               polling_interval: float = 0.1, timeout: float | None = None) -> None:
        """Unload every version of a model (EXPLICIT mode), and its dependents when asked. It
        returns once the model is unloaded (in-flight requests drained), whatever
        ``wait_until_unloaded`` says. Raises UnsupportedError outside EXPLICIT mode."""
        name = model.name if isinstance(model, Model) else model
        self._call(lambda s: s.unload_model(name, unload_dependents))

    def register_model_repository(self, repository_path: str, name_mapping: dict[str, str] | None = None) -> None:
        """Not supported: raises UnsupportedError."""
        raise UnsupportedError("register_model_repository: trident serves the repositories given at start "
                               "(Options.model_repository); it cannot add one while running")

    def unregister_model_repository(self, repository_path: str) -> None:
        """Not supported: raises UnsupportedError."""
        raise UnsupportedError("unregister_model_repository: trident serves the repositories given at start "
                               "(Options.model_repository); it cannot remove one while running")

    def poll_model_repository(self) -> None:
        """Not supported: raises UnsupportedError (POLL mode polls every 15 s by itself)."""
        raise UnsupportedError("poll_model_repository: trident polls the repository by itself in POLL mode "
                               "(every 15 s); there is no poll on demand")


class MetricFamily:
    """Triton's application-defined metric family: not supported (raises UnsupportedError).
    Models define custom metrics with ``pb_utils.MetricFamily``, which trident serves."""

    def __init__(self, kind: MetricKind, name: str, description: str) -> None:
        raise UnsupportedError("tritonserver.MetricFamily: application-defined metrics are not supported by "
                               "trident's in-process API (a model can define them with pb_utils.MetricFamily)")


class Metric:
    """A metric of a :class:`MetricFamily`: not supported (raises UnsupportedError)."""

    def __init__(self, family: MetricFamily, labels: dict[str, str] | None = None) -> None:
        raise UnsupportedError("tritonserver.Metric: application-defined metrics are not supported by "
                               "trident's in-process API (a model can define them with pb_utils.MetricFamily)")
