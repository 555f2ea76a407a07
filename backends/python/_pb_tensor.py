"""``pb_utils.Tensor``: a named tensor over a numpy array, with DLPack import and export.

BF16 tensors hold their values as uint16 bit patterns (numpy has no bfloat16): ``as_numpy``
refuses them, as Triton does, while DLPack carries them as ``kDLBfloat`` 16 both ways (the
dtype field of the capsule is rewritten between ``kDLUInt`` 16 and ``kDLBfloat`` 16).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from trident.backends.python._pb_base import TritonModelException
from trident.protocol import datatypes

# API datatype name -> TRITONSERVER_DataType number
_API_TO_NUM: dict[str, int] = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}  # fmt: skip

_KDL_CPU = 1
_KDL_UINT = 1
_KDL_BFLOAT = 4


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", _DLDataType), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensorVersioned(ctypes.Structure):  # DLPack >= 1.0: the tensor follows a header
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _capsule_dtype(capsule: object) -> _DLDataType | None:
    """The dtype field of an unconsumed DLPack capsule (None for anything else)."""
    try:
        name = _capsule_name(capsule)
        if name == b"dltensor":
            return _DLTensor.from_address(_capsule_pointer(capsule, name)).dtype
        if name == b"dltensor_versioned":
            return _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, name)).dl_tensor.dtype
    except (ValueError, TypeError):  # not a capsule, or one already consumed
        pass
    return None


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
        """The tensor's array (BYTES: an object array of bytes).

        Raises TritonModelException for a BF16 tensor (numpy has no bfloat16; use DLPack), as
        Triton does.
        """
        if self._datatype == "BF16":
            raise TritonModelException("tensor dtype is bf16 and cannot be converted to numpy")
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
        """DLPack export; a read-only array is copied when the consumer cannot signal it.
        BF16 leaves as ``kDLBfloat`` 16. Raises TritonModelException for BYTES."""
        if self._datatype == "BYTES":
            raise TritonModelException(
                f"tensor '{self._name}': BYTES tensors cannot be exported through DLPack"
            )
        array = self._array
        if not array.flags.writeable and kwargs.get("max_version") is None:
            array = array.copy()
        capsule = array.__dlpack__(stream=stream, **kwargs)
        if self._datatype == "BF16":
            dtype = _capsule_dtype(capsule)
            if dtype is not None and dtype.code == _KDL_UINT and dtype.bits == 16:
                dtype.code = _KDL_BFLOAT
        return capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDL_CPU, 0)

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor sharing memory with a DLPack capsule or an object with ``__dlpack__``.

        A ``kDLBfloat`` 16 tensor becomes a BF16 tensor (uint16 bit patterns, memory shared).
        Raises TritonModelException for device (GPU) memory or a dtype numpy cannot hold.
        """
        if hasattr(capsule, "__dlpack_device__"):
            device_type, _ = capsule.__dlpack_device__()
            if int(device_type) != _KDL_CPU:
                raise TritonModelException(
                    f"tensor '{name}': DLPack device type {int(device_type)} is not supported; "
                    "trident's python backend holds tensors in CPU memory (move it to the CPU first)"
                )
        bf16 = False
        try:
            if hasattr(capsule, "__dlpack__"):  # take the capsule itself: its dtype may be bf16
                try:
                    capsule = capsule.__dlpack__(max_version=(1, 0))
                except TypeError:  # a producer older than DLPack 1.0
                    capsule = capsule.__dlpack__()
            dtype = _capsule_dtype(capsule)
            if dtype is not None and dtype.code == _KDL_BFLOAT and dtype.bits == 16 and dtype.lanes == 1:
                dtype.code = _KDL_UINT  # the same bits, as numpy can hold them
                bf16 = True
            array = np.from_dlpack(_CapsuleHolder(capsule))  # type: ignore[arg-type]
        except (BufferError, TypeError, ValueError, RuntimeError) as e:
            raise TritonModelException(f"tensor '{name}': cannot import DLPack tensor: {e}") from e
        if bf16:
            return Tensor._wrap(name, array, "BF16")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, shape={self.shape()})"
