"""``triton_python_backend_utils`` for trident: the API that Triton Python models import.

Model code does ``import triton_python_backend_utils as pb_utils``; the Python backend
registers this module under that name in ``sys.modules`` before it imports a ``model.py``
(see :func:`register`), so no top-level package is installed.

Parity notes (Triton's python_backend, ``pb_stub.cc`` and ``triton_python_backend_utils.py``):

* Datatypes are Triton's numeric ``TRITONSERVER_DataType`` values: :meth:`Tensor.triton_dtype`
  returns a plain ``int`` (``TYPE_FP32`` is 11, BYTES is 13, BF16 is 14), which is what
  :func:`triton_to_numpy_type` takes and :func:`numpy_to_triton_type` returns.
* Tensors live in CPU memory unless the model makes or receives GPU ones: ``Tensor.from_dlpack``
  of a CUDA tensor keeps it on its device (``is_cpu()`` False; see ``_pb_tensor``), a model with
  ``FORCE_CPU_ONLY_INPUT_TENSORS`` "no" receives inputs that are on a GPU as GPU tensors, and BLS
  passes GPU tensors between Python models of this process without a host copy (``_convert``,
  ``_runtime``). Input tensors wrap the request's numpy arrays without copying; such arrays may
  be read-only when the front end decoded them from an immutable buffer.
* ``TritonError.code()`` returns the numeric ``TRITONSERVER_Error_Code`` (an ``IntEnum``).
* ``serialize_byte_tensor`` returns ``b""`` (Triton: an empty tuple) for an empty tensor.
* The server side of the API (BLS, the decoupled response sender, model management, custom
  metrics) is provided by a :class:`_Runtime`: the in-process one for models run in worker
  threads (:mod:`trident.backends.python._runtime`), the process-isolated one inside a model
  process (:mod:`trident.backends.python.isolated.child`). The runtime is found through the
  calling thread (set while ``initialize``/``execute``/``finalize`` run), then through the
  model module on the call stack (threads the model starts itself), then the process default.
* BLS requests made while ``execute`` runs are cancelled when every request of that batch is
  cancelled. ``async_exec`` runs ``exec`` in the asyncio loop's default executor.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from trident.backends.python._dlpack import DeviceView as _DeviceView
from trident.backends.python._model_config import ModelConfig as ModelConfig  # re-exported for models
from trident.backends.python._pb_base import MODEL_PACKAGE_PREFIX as MODEL_PACKAGE_PREFIX
from trident.backends.python._pb_base import TritonModelException as TritonModelException
from trident.backends.python._pb_base import _bind_package as _bind_package
from trident.backends.python._pb_base import _Context as _Context
from trident.backends.python._pb_base import (
    _current_call,
    _current_parents,
    _current_runtime,
    _require_runtime,
)
from trident.backends.python._pb_base import _Runtime as _Runtime
from trident.backends.python._pb_base import _set_default_runtime as _set_default_runtime
from trident.backends.python._pb_metrics import Metric as Metric
from trident.backends.python._pb_metrics import MetricFamily as MetricFamily
from trident.backends.python._pb_tensor import _API_TO_NUM, _host_input
from trident.backends.python._pb_tensor import Tensor as Tensor
from trident.backends.python._wire import WireInput as _WireInput
from trident.observability.logs import SERVING_KEY as _SERVING_KEY
from trident.observability.logs import ModelCall as _ModelCall
from trident.protocol import datatypes
from trident.types import WireBytesTensor as _WireBytesTensor

_log = logging.getLogger("trident.backends.python")

# no __all__: as with Triton's module, ``from triton_python_backend_utils import *`` takes every
# public name

#: the name model code imports this module under
MODULE_NAME = "triton_python_backend_utils"

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


def register() -> None:
    """Make this module importable as ``triton_python_backend_utils`` (idempotent)."""
    me = sys.modules[__name__]
    if sys.modules.get(MODULE_NAME) is not me:
        sys.modules[MODULE_NAME] = me


# ---- datatypes: API name <-> TRITONSERVER_DataType number <-> numpy ----

_NUM_TO_API = {v: k for k, v in _API_TO_NUM.items()}

_NUM_TO_NUMPY: dict[int, type] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
    8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}  # fmt: skip

TRITON_STRING_TO_NUMPY: dict[str, type] = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64, "TYPE_STRING": np.object_,
}  # fmt: skip


def triton_to_numpy_type(data_type: int) -> type | None:
    """numpy type for a ``TRITONSERVER_DataType`` number (13 -> ``np.object_``); None if none."""
    return _NUM_TO_NUMPY.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """``TRITONSERVER_DataType`` number for a numpy dtype or type; None when unsupported."""
    try:
        dt = np.dtype(data_type)
    except TypeError:
        return None
    if dt.kind in ("O", "S", "U"):
        return 13
    try:
        return _API_TO_NUM[datatypes.datatype_of(np.empty(0, dtype=dt))]
    except ValueError:
        return None


def triton_string_to_numpy(triton_type_string: str) -> type:
    """numpy type for a config type name (``"TYPE_FP32"`` -> ``np.float32``); raises KeyError."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """BYTES elements as 4-byte little-endian lengths followed by the bytes, in C order.

    str elements are UTF-8 encoded and other objects go through ``str()``. Returns None when
    the array is not an object, bytes or unicode array (as Triton does).
    """
    if input_tensor.size == 0:
        return b""
    if input_tensor.dtype.kind not in ("O", "S", "U"):
        return None
    return datatypes.serialize_bytes(np.ascontiguousarray(input_tensor))


def deserialize_bytes_tensor(encoded_tensor: bytes | bytearray | memoryview) -> np.ndarray:
    """A 1-D object array of bytes from length-prefixed data; raises ValueError if truncated."""
    return datatypes.deserialize_bytes(encoded_tensor)


# ---- errors ----


class TritonError:
    """An error a model attaches to a response: ``TritonError(message, code=TritonError.INTERNAL)``."""

    class ErrorCode(enum.IntEnum):
        """``TRITONSERVER_Error_Code`` numbers."""

        UNKNOWN = 0
        INTERNAL = 1
        NOT_FOUND = 2
        INVALID_ARG = 3
        UNAVAILABLE = 4
        UNSUPPORTED = 5
        ALREADY_EXISTS = 6
        CANCELLED = 7

    UNKNOWN = ErrorCode.UNKNOWN
    INTERNAL = ErrorCode.INTERNAL
    NOT_FOUND = ErrorCode.NOT_FOUND
    INVALID_ARG = ErrorCode.INVALID_ARG
    UNAVAILABLE = ErrorCode.UNAVAILABLE
    UNSUPPORTED = ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
    CANCELLED = ErrorCode.CANCELLED

    __slots__ = ("_message", "_code")

    def __init__(self, message: str, code: int = ErrorCode.INTERNAL) -> None:
        """Raises TypeError when ``message`` is None, ValueError for an unknown ``code``."""
        if message is None:
            raise TypeError("TritonError message must be a str")
        self._message = str(message)
        self._code = TritonError.ErrorCode(int(code))

    def code(self) -> TritonError.ErrorCode:
        return self._code

    def message(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code=TritonError.{self._code.name})"


# ---- requests, responses ----


def _params_json(parameters: dict[str, Any] | None, what: str) -> str:
    if not parameters:
        return "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(f"{what} parameters must be a dict")
    for key, value in parameters.items():
        if not isinstance(key, str) or not isinstance(value, (bool, int, float, str)):
            raise TritonModelException(
                f"{what} parameter '{key}': keys must be str and values bool, int, float or str"
            )
    return json.dumps(parameters)


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """Where a BLS request would like its outputs: ``TRITONSERVER_MEMORY_CPU`` (device outputs
    are copied to the host) or ``TRITONSERVER_MEMORY_GPU`` with a device id (host outputs are
    copied there, BYTES excepted). A request made without one gets each output where its model
    put it."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        """Raises TritonModelException for a memory type other than the two, or a device id
        that is not a non-negative int."""
        try:
            kind = MemoryType(int(preferred_memory_type))
        except (TypeError, ValueError):
            raise TritonModelException(
                f"preferred_memory_type must be TRITONSERVER_MEMORY_CPU or TRITONSERVER_MEMORY_GPU, "
                f"got {preferred_memory_type!r}"
            ) from None
        if isinstance(preferred_device_id, bool) or not isinstance(preferred_device_id, int) or preferred_device_id < 0:
            raise TritonModelException(f"preferred_device_id must be a non-negative int, got {preferred_device_id!r}")
        self.preferred_memory_type = kind
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace (``request.trace()``). Given as ``trace=`` to a BLS
    ``InferenceRequest``, it makes that call a child of this request's trace (as in Triton;
    trident also links a BLS call made while ``execute`` runs exactly one traced request)."""

    __slots__ = ("_source",)

    def __init__(self, source: Any = None) -> None:
        self._source = source  # the request whose trace this is (None: no trace)

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The request's W3C trace context as a JSON object string, ``{"traceparent": ...}``
        (with ``"tracestate"`` when there is one): its span's in OpenTelemetry mode, else the
        context the client sent; None when it has neither."""
        trace = getattr(self._source, "trace", None)
        header = getattr(trace, "traceparent", None)
        value = header() if callable(header) else None
        if not value:
            return None
        state = getattr(trace, "tracestate", "") or getattr(getattr(trace, "context", None), "tracestate", "")
        return json.dumps({"traceparent": value, "tracestate": state} if state else {"traceparent": value})


_NO_TRACE = InferenceTrace()
_NO_PARAMETERS: dict[str, Any] = {}  # the parameters of a response made without any (never written to)


class InferenceResponseSender:
    """Sends a request's responses (decoupled models; non-decoupled models send exactly one).

    Obtained from :meth:`InferenceRequest.get_response_sender`; callable from any thread, also
    after ``execute`` has returned. A non-decoupled model's one response reaches the client as
    soon as it is sent (with or without the final flag), as in Triton.
    """

    def __init__(
        self,
        deliver: Callable[[InferenceResponse | None, bool], None],
        is_cancelled: Callable[[], bool],
        decoupled: bool,
    ) -> None:
        self._deliver = deliver
        self._is_cancelled = is_cancelled
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send ``response``; ``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` marks the last one.

        A flag-only final (``response=None``) is allowed. Raises TritonModelException after the
        final response, for other flags, a missing response without the final flag, a response
        that is not a ``pb_utils.InferenceResponse``, and (non-decoupled models) a second
        response or a final flag before any response; a refused second response is also
        logged as an error (the client keeps the first one).
        """
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}"
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if not self._decoupled:  # Triton checks these before the closed state
                if response is not None and self._sent:
                    _log.error("a non-decoupled model sent a second response for a request; it was dropped "
                               "(the client got the first one)")
                    raise TritonModelException("Non-decoupled model cannot send more than one response.")
                if response is None and not self._sent:
                    raise TritonModelException(
                        "Non-decoupled model cannot send complete final before sending a response."
                    )
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            if self._decoupled:
                self._sent += 1
                self._deliver(response, final)
            elif response is not None:  # the one response: it completes the request at once
                self._sent += 1
                self._deliver(response, True)

    def is_cancelled(self) -> bool:
        """True once the request was cancelled (client gone, stream closed, deadline passed)."""
        return bool(self._is_cancelled())


class ResponseIterator:
    """The responses of a decoupled BLS request (``exec(decoupled=True)``), in order.

    The last one carries the final flag; it may be empty (a flag-only final response).
    """

    def __init__(self, stream: Iterator[InferenceResponse]) -> None:
        self._stream = stream

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        return next(self._stream)

    def cancel(self) -> None:
        """Cancel the BLS request: the callee sees is_cancelled(); the iteration then ends."""
        cancel = getattr(self._stream, "cancel", None)
        if cancel is not None:
            cancel()


class InferenceRequest:
    """A request: one the model receives in ``execute``, or one it builds (for BLS)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        model_name: str | bytes = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        """``model_name`` may be bytes (as read from a BYTES tensor): it is UTF-8 decoded.

        Raises TritonModelException for a bad model name, correlation id, input or parameter.
        """
        if isinstance(model_name, (bytes, bytearray, memoryview)):
            try:
                model_name = bytes(model_name).decode("utf-8")
            except UnicodeDecodeError:
                raise TritonModelException("model_name is not valid UTF-8") from None
        if not isinstance(model_name, str):
            raise TritonModelException(f"model_name must be a str, got {type(model_name).__name__}")
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        for t in inputs:
            if not isinstance(t, Tensor):
                raise TritonModelException("InferenceRequest inputs must be pb_utils.Tensor objects")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs: list[Tensor] | None = list(inputs)
        self._requested_output_names = list(requested_output_names)
        self._model_name = str(model_name)
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        if preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory):
            raise TritonModelException("preferred_memory must be a pb_utils.PreferredMemory")
        self._preferred_memory = preferred_memory  # None: each output where its model put it
        self._trace = trace or InferenceTrace()
        self._parameters = _params_json(parameters, "request")
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._source: Any = None  # the trident InferenceRequest this wraps, if any
        self._sender: InferenceResponseSender | None = None
        self._sender_factory: Callable[[], InferenceResponseSender] | None = None

    @classmethod
    def _wrap(
        cls,
        source: Any,
        requested_output_names: list[str],
        correlation_id: int | str,
        flags: int,
        timeout: int,
        parameters_json: str,
    ) -> InferenceRequest:
        """A request over a trident ``InferenceRequest`` (inputs wrapped lazily, never copied)."""
        r = cls.__new__(cls)
        r._request_id = source.id
        r._correlation_id = correlation_id
        r._inputs = None
        r._requested_output_names = requested_output_names
        r._model_name = source.model_name
        r._model_version = -1
        r._flags = flags
        r._timeout = timeout
        r._preferred_memory = None
        r._trace = _NO_TRACE
        r._parameters = parameters_json
        r._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        r._source = source
        r._sender = None
        r._sender_factory = None
        return r

    def inputs(self) -> list[Tensor]:
        """The input tensors. Raises TritonModelException when an input in GPU memory must be
        copied to the host for this model and cannot be (no CUDA library in this process)."""
        if self._inputs is None:  # wrapped lazily from the trident request (GPU tensors: to the host)
            self._inputs = [_WireInput(t) if type(t) is _WireBytesTensor  # elements made when asked for
                            else Tensor._wrap(t.name, t.data, t.datatype) if type(t.data) is not _DeviceView
                            else _host_input(t) for t in self._source.inputs]
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        """The request timeout in microseconds (0 = none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request's custom parameters as a JSON object string."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        if self._trace is _NO_TRACE and self._source is not None:  # made on first use: no cost per request
            self._trace = InferenceTrace(self._source)
        return self._trace

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def is_cancelled(self) -> bool:
        """True once the client has gone away or the request's deadline has passed."""
        return bool(self._source is not None and self._source.cancelled)

    def set_release_flags(self, flags: int) -> None:
        self._release_flags = int(flags)

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's response sender (the same object on every call).

        Raises TritonModelException for a request the model built itself (a BLS request).
        """
        if self._sender is None:
            if self._sender_factory is None:
                raise TritonModelException(
                    "get_response_sender() is only available on requests passed to execute()"
                )
            self._sender = self._sender_factory()
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` through the server (BLS) and wait.

        Returns the callee's InferenceResponse (its failure as ``has_error()``), or with
        ``decoupled=True`` a :class:`ResponseIterator` over its responses. Raises
        TritonModelException outside a model loaded by trident or without a model name.
        """
        return self._exec_with(_require_runtime("BLS (InferenceRequest.exec)"), self._parents(), decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` as an awaitable for ``async def execute`` (runs in the loop's executor).

        Raises TritonModelException (when awaited) as :meth:`exec` does.
        """
        runtime = _current_runtime()
        parents = self._parents()

        async def run() -> Any:
            if runtime is None:
                raise TritonModelException(
                    "BLS (InferenceRequest.async_exec) is only available to models loaded by a trident server"
                )
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self._exec_with, runtime, parents, decoupled)

        return run()

    @staticmethod
    def _parents() -> list[Any]:
        return _current_parents()

    def _exec_with(self, runtime: _Runtime, parents: list[Any], decoupled: bool) -> Any:
        if not self._model_name:
            raise TritonModelException("BLS request must specify a model_name")
        stream = runtime.bls(self, bool(decoupled), parents)
        if decoupled:
            return ResponseIterator(stream)
        try:
            return next(stream)
        except StopIteration:  # pragma: no cover - a runtime always yields one response
            raise TritonModelException(f"BLS request to '{self._model_name}' produced no response") from None


class InferenceResponse:
    """``InferenceResponse(output_tensors=[], error=None, parameters=None)``."""

    __slots__ = ("_outputs", "_error", "_parameters", "_param_dict")

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        """Raises TritonModelException for outputs that are not Tensors or a bad error/parameter."""
        outputs = list(output_tensors) if output_tensors else []
        for t in outputs:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, got {type(t).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("InferenceResponse error must be a pb_utils.TritonError")
        self._outputs = outputs
        self._error = error
        if parameters:
            self._parameters = _params_json(parameters, "response")
            self._param_dict = dict(parameters)
        else:  # the usual response: no parameters (none to check or copy)
            self._parameters = "{}"
            self._param_dict = _NO_PARAMETERS

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON object string."""
        return self._parameters


# ---- helpers on requests, responses and model_config dicts ----


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for t in inference_request.inputs():
        if t._name == name:  # inputs are Tensors (checked when the request was made)
            return t
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for t in inference_response.output_tensors():
        if t._name == name:  # outputs are Tensors (checked when the response was made)
            return t
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in model_config.get("input", ()):
        if item["name"] == name:
            return item
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for item in model_config.get("output", ()):
        if item["name"] == name:
            return item
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


# ---- logging ----

_model_logger = logging.getLogger("trident.model")


def _log_extra() -> dict[str, Any] | None:
    """What a model's log line names: the model and the requests of the call running here."""
    model, requests = _current_call()
    if model is None:
        return None
    return {_SERVING_KEY: _ModelCall(model[0], model[1], requests)}


class Logger:
    """Model logging, through the Python logger ``trident.model`` (VERBOSE is DEBUG). A line
    logged while the model executes names the model and the requests of the batch (see
    trident.observability.logs); its source is the model's file and line."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        _model_logger.log(Logger._LEVELS.get(int(level), logging.INFO), message, stacklevel=2, extra=_log_extra())

    @staticmethod
    def log_info(message: str) -> None:
        _model_logger.info(message, stacklevel=2, extra=_log_extra())

    @staticmethod
    def log_warn(message: str) -> None:
        _model_logger.warning(message, stacklevel=2, extra=_log_extra())

    @staticmethod
    def log_error(message: str) -> None:
        _model_logger.error(message, stacklevel=2, extra=_log_extra())

    @staticmethod
    def log_verbose(message: str) -> None:
        _model_logger.debug(message, stacklevel=2, extra=_log_extra())


# ---- model management (explicit model control mode) ----


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload ``model_name`` (explicit mode); ``config`` is a JSON model config and
    ``files`` maps ``<version>/<name>`` to file contents (needs ``config``).

    Raises TritonModelException with the server's reason when the load fails or the server is
    not in explicit mode. Never call it for the calling model itself (that deadlocks).
    """
    _require_runtime("load_model").load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (explicit mode) and wait until it is unloaded.

    Raises TritonModelException with the server's reason.
    """
    _require_runtime("unload_model").unload_model(model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (a version of it when ``model_version`` is given) is ready."""
    return _require_runtime("is_model_ready").is_model_ready(model_name, str(model_version))
