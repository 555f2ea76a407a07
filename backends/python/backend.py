"""The Python backend: Triton ``model.py`` files (``class TritonPythonModel``).

Two execution modes, chosen per model (see :func:`execution_options`):

* **thread** (default): each instance imports its own copy of ``model.py`` (see
  :mod:`._loader`), so module-level state is per instance as with Triton's one stub process
  per instance, and runs ``initialize`` / ``execute`` / ``finalize`` in the instance's worker
  thread. Requests and responses are wrapped, never copied: a ``pb_utils.Tensor`` holds the
  request's numpy array and an output's array becomes the response tensor's data.
* **process** (``parameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }``):
  each instance runs in its own Python process, tensors cross in shared memory; see
  :mod:`trident.backends.python.isolated`.

``async def`` methods (``execute``, ``initialize``, ``finalize``) run on the instance's asyncio
event loop (:mod:`._aio`): one loop per instance, running in a thread of its own from first use
until finalize, so tasks the model schedules keep running between calls. As in Triton, a
decoupled model's ``async def execute`` runs in the background (the instance takes its next
batch at once); other calls are waited for.

Decoupled models (``model_transaction_policy { decoupled: true }``) return None from
``execute`` and answer through ``request.get_response_sender()`` from any thread, at any time.
A non-decoupled model may do the same with its one response: a request of a batch whose
``execute`` returned None stays open until the model sends it. BLS, model management and
custom metrics go through :mod:`._runtime`.

GPU tensors: ``FORCE_CPU_ONLY_INPUT_TENSORS`` "no" lets a thread-mode model receive inputs that
are on a GPU as GPU tensors (a BLS caller's device tensors, a client's CUDA shared memory); see
:mod:`._convert` and :mod:`._runtime`. A model's GPU outputs are copied to the host for the
client (or stay on the device for a BLS caller of this process that takes them).

Not supported (each fails with a clear UNSUPPORTED error): request rescheduling and
``EXECUTION_ENV_PATH`` environments.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import json
import logging
import re
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trident.backends.base import Backend, LoadContext, ModelInstance, Threads
from trident.backends.python import _aio, _convert, _loader, pb_utils
from trident.backends.python._aio import InstanceLoop
from trident.backends.python._execution import FORCE_CPU_ONLY, InstanceIdentity, execution_options
from trident.errors import TritonError, internal, invalid_arg, unsupported
from trident.types import InferenceRequest, InferenceResponse

if TYPE_CHECKING:  # the model process imports this module: keep trio and the config stack out
    from trident.protocol.generated.inference import ModelConfig

log = logging.getLogger(__name__)

_UNSUPPORTED_PARAMETERS = {"EXECUTION_ENV_PATH": "custom execution environments (conda-pack tarballs)"}

#: config.pbtxt parameters of the Python backend (``--backend-config=python,<key>=<v>`` in
#: lower case with dashes sets a server-wide default, e.g. ``execution-mode=process``)
_OWN_FILES = frozenset({__file__, _loader.__file__, _aio.__file__})
_PLUMBING = ("<frozen", str(Path(asyncio.__file__).parent), str(Path(concurrent.futures.__file__).parent))


def _describe(e: BaseException) -> str:
    """Triton's rendering of a model exception: ``Type: message`` and the model-side frames."""
    text = f"{type(e).__name__}: {e}"
    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if f.filename not in _OWN_FILES and not f.filename.startswith(_PLUMBING)
    ]
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return text


_SERVER_CALLS = re.compile(rb"\b(?:exec|async_exec|stream_exec|load_model|unload_model|is_model_ready)\s*\(")


def _calls_the_server(module: Any) -> bool:
    """Whether a model module's source names a pb_utils call that crosses into the server."""
    try:
        source = Path(inspect.getfile(module)).read_bytes()
    except (OSError, TypeError):
        return True
    return _SERVER_CALLS.search(source) is not None


def _model_file(config: ModelConfig, folder: Path) -> Path:
    return folder / (config.default_model_filename or PythonBackend.default_model_filename)


class PythonInstance(ModelInstance):
    """One ``TritonPythonModel`` object and the module it came from."""

    def __init__(self, identity: InstanceIdentity, loaded: _loader.LoadedModule, model: Any,
                 runtime: pb_utils._Runtime | None = None, threads: Threads | None = None,
                 device_inputs: bool = False) -> None:
        self.model_name = identity.model_name
        self._device_inputs = device_inputs  # FORCE_CPU_ONLY_INPUT_TENSORS "no"
        self.version = identity.version
        self.instance_name = identity.instance_name
        self._failure_prefix = self._failure("")  # what a response that fails to convert says first
        self._version_name = str(self.version)
        self._identity = (self.model_name, self._version_name)  # what its log lines name (pb_utils.Logger)
        self.decoupled = identity.decoupled
        self._loaded = loaded
        self._model = model
        self._runtime = runtime
        self._aio = InstanceLoop(identity.instance_name, threads)
        self._all_outputs = list(identity.outputs)
        self._finalized = False
        pb_utils._bind_package(loaded.package, runtime)
        # inline on the event loop only for plain synchronous models: never one that calls the
        # server (BLS, model control: they cross into the loop and would wait on themselves)
        execute = getattr(model, "execute", None)
        self._inline_candidate = not (inspect.iscoroutinefunction(execute) or _calls_the_server(loaded.module))

    @property
    def inline_safe(self) -> bool:  # type: ignore[override]
        """True for a synchronous model whose code names no BLS or model-control call and that
        has made no such call so far (ModelInstance.inline_safe)."""
        return self._inline_candidate and (self._runtime is None or not self._runtime.server_calls)

    # ---- running model code ----

    def _resolve(self, value: Any, parents: list[InferenceRequest] | None = None) -> Any:
        """``value``, or its result when it is awaitable (run on this instance's loop, waited for)."""
        if type(value) is list or not inspect.isawaitable(value):
            return value
        return self._aio.run(value, functools.partial(pb_utils._Context, self._runtime, parents or (), self._identity))

    def _close_loop(self) -> None:
        self._aio.close()

    def _execute_in_background(self, coroutine: Any, requests: list[InferenceRequest]) -> None:
        """A decoupled ``async def execute``: run it on the loop without waiting (as Triton
        does). When it raises, or returns something other than None, the requests it has not
        completed fail with that error."""
        responders = [r.responder for r in requests]

        def done(error: BaseException | None, result: Any) -> None:
            if error is None and result is None:
                return
            if error is not None:
                message = self._failure(_describe(error))
            else:
                message = self._failure(f"Python model '{self.instance_name}' is using the decoupled mode and "
                                        "the execute function must return None.")
            log.error("%s", message)
            for responder in responders:
                if responder is not None and not responder.complete:
                    with contextlib.suppress(TritonError):
                        responder.send(InferenceResponse(error=internal(message)), True)

        self._aio.submit(coroutine, done, functools.partial(pb_utils._Context, self._runtime, requests, self._identity))

    def initialize(self, args: dict[str, str]) -> None:
        """Call the model's ``initialize(args)`` if it has one. Raises TritonError(INTERNAL)."""
        init = getattr(self._model, "initialize", None)
        if init is None:
            return
        try:
            with pb_utils._Context(self._runtime, (), self._identity):
                self._resolve(init(args))
        except (Exception, SystemExit, asyncio.CancelledError) as e:
            raise internal(
                f"failed to initialize model '{self.model_name}' instance '{self.instance_name}': {_describe(e)}"
            ) from e

    # ---- ModelInstance ----

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse] | None:
        """Run the model's ``execute`` on a batch.

        Raises TritonError(INTERNAL) with Triton's message when ``execute`` raises or returns
        something other than one ``pb_utils.InferenceResponse`` per request (None for
        decoupled models, and for models that answered through the response sender),
        UNSUPPORTED when the model asks to reschedule a request. A response carrying a
        ``pb_utils.TritonError`` fails only its own request. Decoupled: returns None.
        """
        pb_requests = [_convert.wrap_request(r, self._all_outputs, self._device_inputs) for r in requests]
        responders = [r.responder for r in requests]  # as the batch starts: a finished request drops it
        for r, pb, responder in zip(requests, pb_requests, responders, strict=True):
            pb._sender_factory = functools.partial(self._make_sender, r, responder)
        try:
            with pb_utils._Context(self._runtime, requests, self._identity):
                result = self._model.execute(pb_requests)
                if self.decoupled and inspect.isawaitable(result):
                    self._execute_in_background(result, requests)
                    return None
                result = self._resolve(result, requests)
        except (Exception, SystemExit, asyncio.CancelledError) as e:
            log.debug("model '%s' execute raised", self.model_name, exc_info=True)
            failure = self._failure(_describe(e))
            if any(pb._sender is not None and pb._sender._sent for pb in pb_requests):
                log.error("%s (after answering request(s) of the batch through the response sender)", failure)
            raise internal(failure) from e
        for pb_request in pb_requests:
            if pb_request._release_flags & pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                raise unsupported(
                    f"model '{self.model_name}': request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) "
                    "is not supported by trident yet"
                )
        if self.decoupled:
            if result is not None:
                raise internal(self._failure(
                    f"Python model '{self.instance_name}' is using the decoupled mode and the execute "
                    "function must return None."
                ))
            return None
        if result is None:  # answered through the response sender, now or later (one response each)
            return [self._answered_later(responder, r.id) for r, responder in zip(requests, responders, strict=True)]
        return self.check_responses(requests, result, responders)

    def check_responses(self, requests: list[InferenceRequest], result: Any,
                        responders: list[Any]) -> list[InferenceResponse]:
        """``execute``'s return value as one trident response per request; a None entry is a
        request the model answers through its response sender (as in Triton). Raises TritonError."""
        if not isinstance(result, (list, tuple)):
            raise internal(
                self._failure(f"Expected a list in the execute return, got {type(result).__name__}")
            )
        if len(result) != len(requests):
            raise internal(
                self._failure(
                    "Number of InferenceResponse objects do not match the number of InferenceRequest "
                    f"objects. InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) "
                    f"size is:{len(result)}"
                )
            )
        for item in result:
            if item is not None and not isinstance(item, pb_utils.InferenceResponse):
                raise internal(
                    self._failure(
                        f"execute must return pb_utils.InferenceResponse objects, got {type(item).__name__}"
                    )
                )
        return [self._answered_later(responder, req.id) if resp is None else self._convert_response(resp, req)
                for req, resp, responder in zip(requests, result, responders, strict=True)]

    def _answered_later(self, responder: Any, request_id: str) -> InferenceResponse:
        """The placeholder for a request that the model answers through its sender: its
        responder is marked ``deferred`` (the executor sends nothing for it). A request without
        a responder can never be answered: an error response."""
        if responder is None:
            return InferenceResponse(error=internal(self._failure(
                f"execute returned None but no final response was sent for request '{request_id}'"
            )))
        responder.deferred = True
        return InferenceResponse()  # not sent: the executor skips deferred and completed requests

    def _make_sender(self, request: InferenceRequest, responder: Any) -> pb_utils.InferenceResponseSender:
        """The sender of ``request``, over the responder it had when the batch started (the
        request drops it once finished)."""
        if responder is None:
            raise pb_utils.TritonModelException(
                "this request has no response channel (it was not queued by a trident server)"
            )

        def deliver(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            converted = None if response is None else self._convert_response(response, request)
            try:
                responder.send(converted, final)
            except TritonError as e:
                raise pb_utils.TritonModelException(e.message) from None

        return pb_utils.InferenceResponseSender(deliver, responder.is_cancelled, self.decoupled)

    def finalize(self) -> None:
        """Call the model's ``finalize()`` if it has one, then release the module (idempotent).

        Raises TritonError(INTERNAL) when ``finalize`` raises (resources are released anyway).
        """
        if self._finalized:
            return
        self._finalized = True
        try:
            fin = getattr(self._model, "finalize", None)
            if fin is not None:
                with pb_utils._Context(self._runtime, (), self._identity):
                    self._resolve(fin())
        except (Exception, SystemExit, asyncio.CancelledError) as e:
            raise internal(f"finalize of model '{self.model_name}' failed: {_describe(e)}") from e
        finally:
            try:
                self._close_loop()
            finally:
                self._model = None
                pb_utils._bind_package(self._loaded.package, None)
                _loader.release(self._loaded)

    def sequence_idle_timeout(self, correlation_id: int | str) -> None:
        """Tell the model that sequence ``correlation_id`` timed out (trident's addition).

        Calls ``TritonPythonModel.sequence_idle_timeout(correlation_id)`` (sync or async) when
        the model defines it; the sequence batcher calls this on the instance's thread after
        freeing the slot of a sequence idle for ``max_sequence_idle_microseconds``. Raises
        TritonError(INTERNAL) when the model's method raises.
        """
        hook = getattr(self._model, "sequence_idle_timeout", None) if not self._finalized else None
        if hook is None:
            return
        try:
            with pb_utils._Context(self._runtime, (), self._identity):
                self._resolve(hook(correlation_id))
        except (Exception, SystemExit, asyncio.CancelledError) as e:
            raise internal(f"sequence_idle_timeout of model '{self.model_name}' failed: {_describe(e)}") from e

    def is_ready(self) -> bool:
        """The model's ``is_ready()`` (sync or async) if it has one, else True; False after
        finalize or when ``is_ready`` raises. Runs model code: call it from a worker thread."""
        if self._finalized:
            return False
        check = getattr(self._model, "is_ready", None)
        if check is None:
            return True
        try:
            with pb_utils._Context(self._runtime, (), self._identity):
                value = check()
            if inspect.isawaitable(value):  # a loop of its own: execute may be running
                loop = asyncio.new_event_loop()
                try:
                    value = loop.run_until_complete(value)
                finally:
                    loop.close()
            return bool(value)
        except Exception:
            log.warning("is_ready of model '%s' raised", self.model_name, exc_info=True)
            return False

    # ---- conversions ----

    def _failure(self, message: str) -> str:
        return (
            f"Failed to process the request(s) for model instance '{self.instance_name}', message: {message}"
        )

    def _convert_response(self, response: pb_utils.InferenceResponse, request: InferenceRequest) -> InferenceResponse:
        out = _convert.to_response(response, self._failure_prefix, request)
        out.model_name = self.model_name
        out.model_version = self._version_name
        out.id = request.id
        return out


class PythonBackend(Backend):
    """Runs Triton Python-backend models (``backend: "python"``, ``model.py``)."""

    name = "python"
    default_model_filename = "model.py"

    def auto_complete_config(
        self, config: ModelConfig, model_dir: Path, version_dir: Path | None
    ) -> ModelConfig:
        """Let the model's ``TritonPythonModel.auto_complete_config`` complete ``config``.

        The model file is imported under a throwaway name and forgotten afterwards. Returns
        ``config`` unchanged when there is no version folder, no model file or no
        ``auto_complete_config``. Raises TritonError(INTERNAL) when importing or the
        method fails or returns something other than a ``pb_utils.ModelConfig``, and
        INVALID_ARG when the completed config is not a valid model configuration.
        """
        from trident import config as model_config

        if version_dir is None:
            return config
        model_file = _model_file(config, version_dir)
        if not model_file.is_file():
            return config
        name = config.name or model_dir.name
        current = model_config.config_to_json(config)
        if execution_options(config).mode == "process":  # a throwaway interpreter, as Triton does
            from trident.backends.python.isolated.parent import auto_complete_in_process

            result = auto_complete_in_process(model_file, name, current)
        else:
            result = complete_config(model_file, name, current)
        if result is None:
            return config
        try:
            text = json.dumps(result)
        except (TypeError, ValueError) as e:
            raise invalid_arg(f"auto_complete_config of model '{name}' produced a config that is not JSON: {e}") from e
        return model_config.config_from_json(text)

    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        """Import ``model.py``, build a ``TritonPythonModel`` and call its ``initialize(args)``
        (in this process, or in a model process of its own in process mode).

        Raises TritonError: UNSUPPORTED for ``EXECUTION_ENV_PATH``, INVALID_ARG for bad
        execution parameters, INTERNAL when the file is missing, fails to import, has no
        ``TritonPythonModel``, or construction or ``initialize`` raises.
        """
        config = ctx.config
        for key, what in _UNSUPPORTED_PARAMETERS.items():
            if key in config.parameters:
                raise unsupported(
                    f"model '{ctx.model_name}': parameter {key} ({what}) is not supported by trident"
                )
        options = execution_options(config, ctx.backend_config)
        if not options.force_cpu_only_inputs:
            if options.mode == "process":
                log.info("model '%s': %s \"no\" has no effect in process mode: inputs reach a model process "
                         "in shared memory, as CPU tensors", ctx.model_name, FORCE_CPU_ONLY)
            else:
                log.info("model '%s': input tensors can be both in CPU and GPU (%s is \"no\")",
                         ctx.model_name, FORCE_CPU_ONLY)
        if options.mode == "process":
            from trident.backends.python.isolated.parent import IsolatedInstance

            model_file = self.model_file(ctx)
            if not model_file.is_file():
                raise internal(f"Python model file not found in '{model_file}'")
            return IsolatedInstance(ctx, InstanceIdentity.of(ctx), model_file, self.initialize_args(ctx), options)
        model_file = self.model_file(ctx)
        if not model_file.is_file():
            raise internal(f"Python model file not found in '{model_file}'")
        from trident.backends.python._runtime import InProcessRuntime, current_token

        token = current_token() if ctx.server is not None else None
        runtime = (InProcessRuntime(ctx.server, token, ctx.threads, ctx.backend_config)
                   if ctx.server is not None and token is not None else None)
        return load_in_this_process(model_file, InstanceIdentity.of(ctx), self.initialize_args(ctx), runtime,
                                    ctx.threads, device_inputs=not options.force_cpu_only_inputs)

    @staticmethod
    def initialize_args(ctx: LoadContext) -> dict[str, str]:
        """The ``args`` dict Triton passes to ``initialize`` (every value a str)."""
        kind = ctx.instance_kind.removeprefix("KIND_")
        return {
            "model_config": json.dumps(ctx.config_json),
            "model_instance_kind": kind,
            "model_instance_name": ctx.instance_name or f"{ctx.model_name}_0",
            "model_instance_device_id": str(ctx.device_id),
            "model_repository": str(ctx.model_dir),
            "model_version": str(ctx.version),
            "model_name": ctx.model_name,
        }


def load_in_this_process(model_file: Path, identity: InstanceIdentity, args: dict[str, str],
                         runtime: pb_utils._Runtime | None, threads: Threads | None = None,
                         device_inputs: bool = False) -> PythonInstance:
    """Import ``model_file``, build its ``TritonPythonModel`` and run ``initialize(args)``
    (``device_inputs``: FORCE_CPU_ONLY_INPUT_TENSORS "no").

    Raises TritonError(INTERNAL) when the file fails to import, has no ``TritonPythonModel``,
    or construction or ``initialize`` raises (everything imported is released again).
    """
    label = f"{identity.model_name}_{identity.version}_{identity.instance_name}"
    try:
        loaded = _loader.import_model_file(model_file, label, keep_path=True)
    except (Exception, SystemExit) as e:
        raise internal(f"failed to load model '{identity.model_name}' from '{model_file}': {_describe(e)}") from e
    try:
        cls = getattr(loaded.module, "TritonPythonModel", None)
        if not isinstance(cls, type):
            raise internal(f"'{model_file}' does not define class TritonPythonModel")
        try:
            model = cls()
        except (Exception, SystemExit) as e:
            raise internal(f"TritonPythonModel() of model '{identity.model_name}' failed: {_describe(e)}") from e
    except BaseException:
        _loader.release(loaded)
        raise
    instance = PythonInstance(identity, loaded, model, runtime, threads, device_inputs)
    try:
        instance.initialize(args)
    except BaseException:
        instance._finalized = True
        try:
            instance._close_loop()
        finally:
            pb_utils._bind_package(loaded.package, None)
            _loader.release(loaded)
        raise
    return instance


def complete_config(model_file: Path, name: str, current: dict[str, Any]) -> dict[str, Any] | None:
    """Run ``TritonPythonModel.auto_complete_config`` of ``model_file`` on ``current`` (Triton's
    JSON shape); None when the model has no such method.

    The file is imported under a throwaway name and forgotten afterwards. Raises
    TritonError(INTERNAL) when importing or the method fails or returns something other than
    a ``pb_utils.ModelConfig``.
    """
    try:
        loaded = _loader.import_model_file(model_file, f"{name}_autocomplete", keep_path=False)
    except (Exception, SystemExit) as e:
        raise internal(f"failed to import '{model_file}' for auto-complete: {_describe(e)}") from e
    try:
        cls = getattr(loaded.module, "TritonPythonModel", None)
        complete = getattr(cls, "auto_complete_config", None)
        if complete is None:
            return None
        try:
            result = complete(pb_utils.ModelConfig(current))
        except (Exception, SystemExit) as e:
            raise internal(f"auto_complete_config of model '{name}' failed: {_describe(e)}") from e
        if not isinstance(result, pb_utils.ModelConfig):
            raise internal(
                f"auto_complete_config function in model '{name}' must return a valid pb.ModelConfig object."
            )
        return result.as_dict()
    finally:
        _loader.release(loaded)
