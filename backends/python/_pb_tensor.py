"""``pb_utils.Tensor``: a named tensor over a numpy array, or over CUDA memory, with DLPack
import and export.

BF16 tensors hold their values as uint16 bit patterns (numpy has no bfloat16): ``as_numpy``
refuses them, as Triton does, while DLPack carries them as ``kDLBfloat`` 16 both ways (the
dtype field of the capsule is rewritten between ``kDLUInt`` 16 and ``kDLBfloat`` 16).

GPU tensors (Triton's contract): ``Tensor.from_dlpack`` of a CUDA tensor (``kDLCUDA``) keeps it
where it is, as a :class:`DeviceTensor` over the same memory: ``is_cpu()`` is False,
``as_numpy()`` raises (Triton's message), ``to_dlpack()`` / ``__dlpack__`` hand the device memory
out again (any number of times; the memory stays alive while a capsule or the tensor holds it).
An object with ``__dlpack__`` is asked for its capsule and the device is then synchronised, so
the producer's pending kernels are done when ``from_dlpack`` returns; a bare capsule is taken as
is (as in Triton: ``torch.utils.dlpack.to_dlpack`` does not wait for the producer's stream). A
strided tensor is refused with Triton's message; other device types (ROCm, ...) too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trident.backends.python import _cuda, _dlpack
from trident.backends.python._pb_base import TritonModelException
from trident.protocol import datatypes

# API datatype name -> TRITONSERVER_DataType number
_API_TO_NUM: dict[str, int] = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}  # fmt: skip

_KDL_UINT = _dlpack.KDL_UINT
_HOST_DEVICES = (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST)  # CPU memory to numpy (as Triton: pinned is CPU)
_KDL_BFLOAT = _dlpack.KDL_BFLOAT


def _capsule_dtype(capsule: object) -> _dlpack.DLDataType | None:
    """The dtype field of an unconsumed DLPack capsule (None for anything else)."""
    try:
        name = _dlpack._get_name(capsule)
        if name == b"dltensor":
            return _dlpack.DLTensor.from_address(_dlpack._get_pointer(capsule, name)).dtype
        if name == b"dltensor_versioned":
            managed = _dlpack.DLManagedTensorVersioned.from_address(_dlpack._get_pointer(capsule, name))
            return managed.dl_tensor.dtype
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
        return (_dlpack.KDL_CPU, 0)


class Tensor:
    """A named tensor in CPU memory, backed by a numpy array (never copied when wrapped); a
    tensor in CUDA memory is a :class:`DeviceTensor`."""

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
        """Whether the tensor is in CPU memory (a :class:`DeviceTensor` is not)."""
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
        return (_dlpack.KDL_CPU, 0)

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """A tensor sharing memory with a DLPack capsule or an object with ``__dlpack__``.

        CPU memory becomes a numpy-backed tensor; CUDA memory a :class:`DeviceTensor` (see the
        module docstring). A ``kDLBfloat`` 16 tensor becomes a BF16 tensor (memory shared).
        Raises TritonModelException for another device type, a strided tensor, a consumed
        capsule, a dtype Triton has no datatype for, or (an object with ``__dlpack__`` in CUDA
        memory) no CUDA library in this process to wait for its producer with.
        """
        if hasattr(capsule, "__dlpack_device__"):
            device_type, device_id = capsule.__dlpack_device__()
            if int(device_type) == _dlpack.KDL_CUDA:
                return DeviceTensor._import(name, capsule, int(device_id))
            if int(device_type) not in _HOST_DEVICES:
                raise TritonModelException(
                    f"tensor '{name}': DLDevice type {int(device_type)} "
                    f"({_dlpack.device_name(int(device_type))}) is not supported by the Python backend"
                )
        elif not hasattr(capsule, "__dlpack__"):  # a bare capsule: where is its memory?
            try:
                described, _ = _dlpack.describe(capsule)
            except _dlpack.DLPackError as e:
                raise TritonModelException(f"tensor '{name}': cannot import DLPack tensor: {e}") from None
            if described.device_type == _dlpack.KDL_CUDA:
                return DeviceTensor._import(name, capsule, described.device_id)
            if described.device_type not in _HOST_DEVICES:
                raise TritonModelException(
                    f"tensor '{name}': DLDevice type {described.device_type} "
                    f"({_dlpack.device_name(described.device_type)}) is not supported by the Python backend"
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


class DeviceTensor(Tensor):
    """A tensor in CUDA memory (``is_cpu()`` False): a :class:`~._dlpack.DeviceBuffer` and, as
    ``_array``, the :class:`~._dlpack.DeviceView` that stands for it in trident's core types."""

    __slots__ = ("_buffer",)
    _buffer: _dlpack.DeviceBuffer

    @classmethod
    def _over(cls, name: str, buffer: _dlpack.DeviceBuffer, view: _dlpack.DeviceView | None = None) -> DeviceTensor:
        t = cls.__new__(cls)
        t._name = name
        t._buffer = buffer
        t._array = view if view is not None else buffer.view()
        t._datatype = buffer.datatype
        return t

    @classmethod
    def _import(cls, name: str, source: Any, device_id: int) -> DeviceTensor:
        """Take a CUDA tensor from a capsule, or from an object with ``__dlpack__`` (then wait
        for the device: the producer's kernels writing it are done). Raises TritonModelException."""
        waits = hasattr(source, "__dlpack__")
        try:
            if waits:
                try:
                    capsule = source.__dlpack__(stream=None, max_version=(1, 0))
                except TypeError:  # a producer older than DLPack 1.0
                    capsule = source.__dlpack__(stream=None)
            else:
                capsule = source
            described, owner = _dlpack.consume(capsule)
        except (_dlpack.DLPackError, BufferError, TypeError, RuntimeError) as e:
            raise TritonModelException(f"tensor '{name}': cannot import DLPack tensor: {e}") from e
        if described.device_type != _dlpack.KDL_CUDA or described.device_id != device_id:
            owner.release()
            raise TritonModelException(
                f"tensor '{name}': the DLPack capsule is on {_dlpack.device_name(described.device_type)} device "
                f"{described.device_id}, not the CUDA device {device_id} its producer named"
            )
        if waits:
            _cuda.synchronize(described.device_id, f"tensor '{name}': importing a CUDA tensor")
        return cls._over(name, _dlpack.DeviceBuffer.imported(described, owner))

    def is_cpu(self) -> bool:
        return False

    def as_numpy(self) -> np.ndarray:
        """Raises TritonModelException (Triton's words): the tensor is in GPU memory (use
        ``to_dlpack()``, or ``torch.from_dlpack(tensor).cpu()``)."""
        raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> object:
        """A legacy ``dltensor`` capsule over the device memory (no copy, no wait: no work of
        trident's is pending on it)."""
        return _dlpack.export(self._buffer)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self._buffer.device_type, self._buffer.device_id)

    def _host_copy(self) -> np.ndarray:
        """The tensor's values in host memory. Raises CudaUnavailable (a TritonModelException)."""
        return _cuda.to_host(self._buffer, f"tensor '{self._name}' in {self._buffer.describe()}: a copy to the host")

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, shape={self.shape()}, {self._buffer.describe()})"


def _host_input(t: Any) -> Tensor:
    """A core tensor whose data is a DeviceView, as a CPU tensor (a host copy) for a model that
    takes CPU inputs only. Raises TritonModelException when the copy is impossible."""
    buffer = t.data.device_buffer
    return Tensor._wrap(t.name, _cuda.to_host(buffer, f"input '{t.name}' in {buffer.describe()}: a copy to the host"),
                        t.datatype)
