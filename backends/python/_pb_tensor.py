"""``pb_utils.Tensor``: a named tensor over a numpy array, with DLPack import and export."""

from __future__ import annotations

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
