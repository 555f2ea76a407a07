"""``triton_python_backend_utils`` for trident: the API that Triton Python models import.

Model code does ``import triton_python_backend_utils as pb_utils``; the Python backend
registers this module under that name in ``sys.modules`` before it imports a ``model.py``
(see :func:`register`), so no top-level package is installed.

Parity notes (Triton's python_backend, ``pb_stub.cc`` and ``triton_python_backend_utils.py``):

* Datatypes are Triton's numeric ``TRITONSERVER_DataType`` values: :meth:`Tensor.triton_dtype`
  returns a plain ``int`` (``TYPE_FP32`` is 11, BYTES is 13, BF16 is 14), which is what
  :func:`triton_to_numpy_type` takes and :func:`numpy_to_triton_type` returns.
* Tensors live in CPU memory (``is_cpu()`` is always True). Input tensors wrap the request's
  numpy arrays without copying; such arrays may be read-only when the front end decoded them
  from an immutable buffer.
* ``TritonError.code()`` returns the numeric ``TRITONSERVER_Error_Code`` (an ``IntEnum``).
* ``serialize_byte_tensor`` returns ``b""`` (Triton: an empty tuple) for an empty tensor.
* Not available yet (each raises :class:`TritonModelException` naming the feature): BLS
  (``InferenceRequest.exec``/``async_exec``), the decoupled response sender, model
  management (``load_model``...) and custom metrics (``MetricFamily``).
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from trident.backends.python._model_config import ModelConfig as ModelConfig  # re-exported for models
from trident.protocol import datatypes

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


class TritonModelException(Exception):
    """The exception model code raises (and that pb_utils raises) to fail a call."""


# ---- datatypes: API name <-> TRITONSERVER_DataType number <-> numpy ----

_API_TO_NUM: dict[str, int] = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}  # fmt: skip
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


# ---- tensors ----

_KDL_CPU = 1


class _CapsuleHolder:
    """Adapts a bare DLPack capsule to the ``__dlpack__`` protocol ``np.from_dlpack`` expects."""

    def __init__(self, capsule: object) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_kwargs: Any) -> object:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CPU, 0)


class Tensor:
    """A named tensor in CPU memory, backed by a numpy array (never copied when wrapped)."""

    __slots__ = ("_name", "_array", "_datatype")

    def __init__(self, name: str, np_array: Any) -> None:
        """Raises TritonModelException for a name that is not a str or an unsupported dtype."""
        if not isinstance(name, str):
            raise TritonModelException(f"tensor name must be a str, got {type(name).__name__}")
        array = np_array if isinstance(np_array, np.ndarray) else np.asarray(np_array)
        try:
            datatype = datatypes.datatype_of(array)
        except ValueError:
            raise TritonModelException(f"tensor '{name}': unsupported numpy dtype {array.dtype}") from None
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if array.ndim and not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array = array
        self._datatype = datatype

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        """A tensor over ``array`` as is (used for request inputs: no checks, no copy)."""
        t = cls.__new__(cls)
        t._name = name
        t._array = array
        t._datatype = datatype
        return t

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The tensor's array (BYTES: object array of bytes; BF16: uint16 bit patterns)."""
        return self._array

    def triton_dtype(self) -> int:
        """The ``TRITONSERVER_DataType`` number (e.g. 11 for FP32, 13 for BYTES)."""
        return _API_TO_NUM[self._datatype]

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> object:
        """A DLPack capsule over the tensor's memory; raises TritonModelException for BYTES."""
        return self.__dlpack__()

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> object:
        """DLPack export; a read-only array is copied when the consumer cannot signal it."""
        if self._datatype == "BYTES":
            raise TritonModelException(
                f"tensor '{self._name}': BYTES tensors cannot be exported through DLPack"
            )
        array = self._array
        if not array.flags.writeable and kwargs.get("max_version") is None:
            array = array.copy()
        return array.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CPU, 0)

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor sharing memory with a DLPack capsule or an object with ``__dlpack__``.

        Raises TritonModelException for device (GPU) memory or a dtype numpy cannot hold.
        """
        source = capsule if hasattr(capsule, "__dlpack__") else _CapsuleHolder(capsule)
        if hasattr(source, "__dlpack_device__"):
            device_type, _ = source.__dlpack_device__()
            if int(device_type) != _KDL_CPU:
                raise TritonModelException(
                    f"tensor '{name}': DLPack device type {int(device_type)} is not supported; "
                    "trident's python backend holds tensors in CPU memory (move it to the CPU first)"
                )
        try:
            array = np.from_dlpack(source)  # type: ignore[arg-type]
        except (BufferError, TypeError, ValueError, RuntimeError) as e:
            raise TritonModelException(f"tensor '{name}': cannot import DLPack tensor: {e}") from e
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, shape={self.shape()})"


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
    """Where a BLS request would like its outputs (recorded; trident's tensors are on the CPU)."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace handle; trident has no trace context to hand to models yet."""

    def get_context(self) -> str | None:
        return None


_NO_SENDER = "the decoupled response sender (get_response_sender) is not available in trident yet"


class InferenceResponseSender:
    """The decoupled response sender's type; every method raises until trident provides one."""

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Raises TritonModelException: the decoupled response sender is not available yet."""
        raise TritonModelException(_NO_SENDER)

    def is_cancelled(self) -> bool:
        """Raises TritonModelException: the decoupled response sender is not available yet."""
        raise TritonModelException(_NO_SENDER)


class InferenceRequest:
    """A request: one the model receives in ``execute``, or one it builds (for BLS)."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        """Raises TritonModelException for a bad correlation id, input or parameter."""
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        for t in inputs:
            if not isinstance(t, Tensor):
                raise TritonModelException("InferenceRequest inputs must be pb_utils.Tensor objects")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs: list[Tensor] | None = list(inputs)
        self._requested_output_names = list(requested_output_names)
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory or PreferredMemory(TRITONSERVER_MEMORY_CPU)
        self._trace = trace or InferenceTrace()
        self._parameters = _params_json(parameters, "request")
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._source: Any = None  # the trident InferenceRequest this wraps, if any

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
        r._preferred_memory = PreferredMemory(TRITONSERVER_MEMORY_CPU)
        r._trace = InferenceTrace()
        r._parameters = parameters_json
        r._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        r._source = source
        return r

    def inputs(self) -> list[Tensor]:
        if self._inputs is None:  # wrapped lazily from the trident request
            self._inputs = [Tensor._wrap(t.name, t.data, t.datatype) for t in self._source.inputs]
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
        return self._trace

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def is_cancelled(self) -> bool:
        """True once the client has gone away or the request's deadline has passed."""
        return bool(self._source is not None and self._source.cancelled)

    def set_release_flags(self, flags: int) -> None:
        self._release_flags = int(flags)

    def get_response_sender(self) -> InferenceResponseSender:
        """Raises TritonModelException: the decoupled response sender is not available yet."""
        raise TritonModelException(_NO_SENDER)

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Raises TritonModelException: BLS is not available yet."""
        raise TritonModelException("BLS (InferenceRequest.exec) is not available in trident yet")

    def async_exec(self, decoupled: bool = False) -> Any:
        """Raises TritonModelException: BLS is not available yet."""
        raise TritonModelException("BLS (InferenceRequest.async_exec) is not available in trident yet")


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
        outputs = list(output_tensors or ())
        for t in outputs:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, got {type(t).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("InferenceResponse error must be a pb_utils.TritonError")
        self._outputs = outputs
        self._error = error
        self._parameters = _params_json(parameters, "response")
        self._param_dict = dict(parameters or {})

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
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for t in inference_response.output_tensors():
        if t.name() == name:
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


class Logger:
    """Model logging, through the Python logger ``trident.model`` (VERBOSE is DEBUG)."""

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
        _model_logger.log(Logger._LEVELS.get(int(level), logging.INFO), message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        _model_logger.info(message, stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        _model_logger.warning(message, stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        _model_logger.error(message, stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        _model_logger.debug(message, stacklevel=2)


# ---- features that need the server (later issues) ----


class MetricFamily:
    """Custom metrics; raises TritonModelException until trident exposes them to models."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        raise TritonModelException(f"custom metrics (MetricFamily '{name}') are not available in trident yet")


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Raises TritonModelException: model management from models is not available yet."""
    raise TritonModelException(f"load_model('{model_name}') from a model is not available in trident yet")


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Raises TritonModelException: model management from models is not available yet."""
    raise TritonModelException(f"unload_model('{model_name}') from a model is not available in trident yet")


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Raises TritonModelException: model management from models is not available yet."""
    raise TritonModelException(f"is_model_ready('{model_name}') from a model is not available in trident yet")
