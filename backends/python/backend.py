"""The Python backend: Triton ``model.py`` files (``class TritonPythonModel``) run in-process.

Each instance imports its own copy of ``model.py`` (see :mod:`._loader`), so module-level
state is per instance as with Triton's one stub process per instance, and runs
``initialize`` / ``execute`` / ``finalize`` in the instance's worker thread. Requests and
responses are wrapped, never copied: a ``pb_utils.Tensor`` holds the request's numpy array
and an output's array becomes the response tensor's data.

``async def`` methods (``execute``, ``initialize``, ``finalize``) run on a private asyncio
event loop owned by the instance, created on first use and closed at finalize; asyncio is used
nowhere else in trident.

Not yet (issue 4): decoupled models and the response sender, BLS, request rescheduling,
``EXECUTION_ENV_PATH`` environments and process isolation. Each fails with a clear
UNSUPPORTED error.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from trident import config as model_config
from trident.backends.base import Backend, LoadContext, ModelInstance
from trident.backends.python import _loader, pb_utils
from trident.errors import Code, TritonError, internal, invalid_arg, unsupported
from trident.protocol.generated.inference import ModelConfig
from trident.types import InferenceRequest, InferenceResponse, ParamValue, Tensor

log = logging.getLogger(__name__)

#: request parameters Triton consumes itself; models see the others through parameters()
_RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)
_UNSUPPORTED_PARAMETERS = {"EXECUTION_ENV_PATH": "custom execution environments (conda-pack tarballs)"}


def _describe(e: BaseException) -> str:
    """Triton's rendering of a model exception: ``Type: message`` and the model-side frames."""
    text = f"{type(e).__name__}: {e}"
    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if f.filename != __file__ and f.filename != _loader.__file__ and not f.filename.startswith("<frozen")
    ]
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return text


def _bytes_array(array: np.ndarray) -> np.ndarray:
    """``array`` as an object array of bytes (str is UTF-8 encoded, other objects via str())."""
    if array.dtype == object:
        flat = array.reshape(-1)
        if all(type(x) is bytes for x in flat):
            return array
        items = flat.tolist()
    else:  # 'S' or 'U'
        items = array.reshape(-1).tolist()
    out = np.empty(len(items), dtype=object)
    out[:] = [
        x if isinstance(x, bytes) else x.encode("utf-8") if isinstance(x, str) else str(x).encode("utf-8")
        for x in items
    ]
    return out.reshape(array.shape)


def _to_trident_tensor(t: pb_utils.Tensor) -> Tensor:
    array = t.as_numpy()
    datatype = t._datatype
    if datatype == "BYTES":
        array = _bytes_array(array)
    return Tensor(t.name(), datatype, tuple(int(d) for d in array.shape), array)


def _model_file(config: ModelConfig, folder: Path) -> Path:
    return folder / (config.default_model_filename or PythonBackend.default_model_filename)


class PythonInstance(ModelInstance):
    """One ``TritonPythonModel`` object and the module it came from."""

    def __init__(self, ctx: LoadContext, loaded: _loader.LoadedModule, model: Any) -> None:
        self.model_name = ctx.model_name
        self.version = ctx.version
        self.instance_name = ctx.instance_name or f"{ctx.model_name}_0"
        self._loaded = loaded
        self._model = model
        self._loop: asyncio.AbstractEventLoop | None = None
        self._all_outputs = [o.name for o in ctx.config.output]
        self._finalized = False

    # ---- running model code ----

    def _resolve(self, value: Any) -> Any:
        """``value``, or its result when it is awaitable (run on this instance's loop)."""
        if not inspect.isawaitable(value):
            return value
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(value)

    def _close_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    def initialize(self, args: dict[str, str]) -> None:
        """Call the model's ``initialize(args)`` if it has one. Raises TritonError(INTERNAL)."""
        init = getattr(self._model, "initialize", None)
        if init is None:
            return
        try:
            self._resolve(init(args))
        except (Exception, SystemExit, asyncio.CancelledError) as e:
            raise internal(
                f"failed to initialize model '{self.model_name}' instance '{self.instance_name}': {_describe(e)}"
            ) from e

    # ---- ModelInstance ----

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        """Run the model's ``execute`` on a batch.

        Raises TritonError(INTERNAL) with Triton's message when ``execute`` raises or returns
        something other than one ``pb_utils.InferenceResponse`` per request, UNSUPPORTED when
        the model asks to reschedule a request. A response carrying a ``pb_utils.TritonError``
        fails only its own request.
        """
        pb_requests = [self._wrap_request(r) for r in requests]
        try:
            result = self._resolve(self._model.execute(pb_requests))
        except (Exception, SystemExit, asyncio.CancelledError) as e:
            log.debug("model '%s' execute raised", self.model_name, exc_info=True)
            raise internal(self._failure(_describe(e))) from e
        if any(r._release_flags & pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE for r in pb_requests):
            raise unsupported(
                f"model '{self.model_name}': request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) "
                "is not supported by trident yet"
            )
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
            if not isinstance(item, pb_utils.InferenceResponse):
                raise internal(
                    self._failure(
                        f"execute must return pb_utils.InferenceResponse objects, got {type(item).__name__}"
                    )
                )
        return [self._convert_response(req, resp) for req, resp in zip(requests, result, strict=True)]

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
                self._resolve(fin())
        except (Exception, SystemExit, asyncio.CancelledError) as e:
            raise internal(f"finalize of model '{self.model_name}' failed: {_describe(e)}") from e
        finally:
            try:
                self._close_loop()
            finally:
                self._model = None
                _loader.release(self._loaded)

    def is_ready(self) -> bool:
        """The model's ``is_ready()`` (sync or async) if it has one, else True; False after
        finalize or when ``is_ready`` raises. Runs model code: call it from a worker thread."""
        if self._finalized:
            return False
        check = getattr(self._model, "is_ready", None)
        if check is None:
            return True
        try:
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

    def _wrap_request(self, request: InferenceRequest) -> pb_utils.InferenceRequest:
        params = request.parameters
        correlation_id: int | str = 0
        flags = 0
        timeout = 0
        custom_json = "{}"
        if params:
            seq = params.get("sequence_id", 0)
            correlation_id = seq if isinstance(seq, (int, str)) and not isinstance(seq, bool) else 0
            if params.get("sequence_start"):
                flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            if params.get("sequence_end"):
                flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
            t = params.get("timeout", 0)
            timeout = int(t) if isinstance(t, (int, float)) else 0
            custom = {k: v for k, v in params.items() if k not in _RESERVED_PARAMETERS}
            if custom:
                custom_json = json.dumps(custom)
        requested = [o.name for o in request.outputs] if request.outputs else list(self._all_outputs)
        return pb_utils.InferenceRequest._wrap(
            request, requested, correlation_id, flags, timeout, custom_json
        )

    def _convert_response(
        self, request: InferenceRequest, response: pb_utils.InferenceResponse
    ) -> InferenceResponse:
        out = InferenceResponse(model_name=self.model_name, model_version=str(self.version), id=request.id)
        error = response.error()
        if error is not None:
            out.error = TritonError(Code[error.code().name], error.message())
            return out
        try:
            out.outputs = [_to_trident_tensor(t) for t in response.output_tensors()]
        except Exception as e:
            out.error = internal(self._failure(f"cannot convert outputs: {type(e).__name__}: {e}"))
            return out
        params: dict[str, ParamValue] = response._param_dict
        if params:
            out.parameters = dict(params)
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
        if version_dir is None:
            return config
        model_file = _model_file(config, version_dir)
        if not model_file.is_file():
            return config
        label = f"{config.name or model_dir.name}_autocomplete"
        try:
            loaded = _loader.import_model_file(model_file, label, keep_path=False)
        except (Exception, SystemExit) as e:
            raise internal(f"failed to import '{model_file}' for auto-complete: {_describe(e)}") from e
        try:
            cls = getattr(loaded.module, "TritonPythonModel", None)
            complete = getattr(cls, "auto_complete_config", None)
            if complete is None:
                return config
            name = config.name or model_dir.name
            try:
                result = complete(pb_utils.ModelConfig(model_config.config_to_json(config)))
            except (Exception, SystemExit) as e:
                raise internal(f"auto_complete_config of model '{name}' failed: {_describe(e)}") from e
            if not isinstance(result, pb_utils.ModelConfig):
                raise internal(
                    f"auto_complete_config function in model '{name}' must return a valid pb.ModelConfig object."
                )
            try:
                text = json.dumps(result.as_dict())
            except (TypeError, ValueError) as e:
                raise invalid_arg(
                    f"auto_complete_config of model '{name}' produced a config that is not JSON: {e}"
                ) from e
            return model_config.config_from_json(text)
        finally:
            _loader.release(loaded)

    def load_instance(self, ctx: LoadContext) -> PythonInstance:
        """Import ``model.py``, build a ``TritonPythonModel`` and call its ``initialize(args)``.

        Raises TritonError: UNSUPPORTED for decoupled models and ``EXECUTION_ENV_PATH``,
        INTERNAL when the file is missing, fails to import, has no ``TritonPythonModel``, or
        construction or ``initialize`` raises.
        """
        config = ctx.config
        policy = config.model_transaction_policy
        if policy is not None and policy.decoupled:
            raise unsupported(
                f"model '{ctx.model_name}': decoupled Python models are not supported by trident yet"
            )
        for key, what in _UNSUPPORTED_PARAMETERS.items():
            if key in config.parameters:
                raise unsupported(
                    f"model '{ctx.model_name}': parameter {key} ({what}) is not supported by trident"
                )
        model_file = self.model_file(ctx)
        if not model_file.is_file():
            raise internal(f"Python model file not found in '{model_file}'")
        label = f"{ctx.model_name}_{ctx.version}_{ctx.instance_name}"
        try:
            loaded = _loader.import_model_file(model_file, label, keep_path=True)
        except (Exception, SystemExit) as e:
            raise internal(
                f"failed to load model '{ctx.model_name}' from '{model_file}': {_describe(e)}"
            ) from e
        try:
            cls = getattr(loaded.module, "TritonPythonModel", None)
            if not isinstance(cls, type):
                raise internal(f"'{model_file}' does not define class TritonPythonModel")
            try:
                model = cls()
            except (Exception, SystemExit) as e:
                raise internal(
                    f"TritonPythonModel() of model '{ctx.model_name}' failed: {_describe(e)}"
                ) from e
        except BaseException:
            _loader.release(loaded)
            raise
        instance = PythonInstance(ctx, loaded, model)
        try:
            instance.initialize(self.initialize_args(ctx))
        except BaseException:
            instance._finalized = True
            try:
                instance._close_loop()
            finally:
                _loader.release(loaded)
            raise
        return instance

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
