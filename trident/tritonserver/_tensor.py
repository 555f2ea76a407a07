"""Tensors of the in-process API: Triton's ``Tensor`` and ``MemoryBuffer``, DLPack in and out.

A :class:`Tensor` wraps a numpy array in host memory: the server's own tensors are numpy
arrays (:class:`trident.types.Tensor`), so an input given as a numpy array, or as any DLPack
object on the CPU (a torch tensor, for one), reaches the model without a copy when it is
C-contiguous, and an output is handed to ``numpy.from_dlpack`` / ``torch.from_dlpack`` without
one. BYTES tensors hold an object array of ``bytes`` (their length-prefixed buffer, which
``memory_buffer`` describes, is made only when asked for). BF16 tensors hold the bfloat16 bit
patterns as ``uint16``; DLPack exports them as bfloat16 through torch (numpy has no bfloat16).

Device memory is not supported: a DLPack object on a GPU, ``to_device("gpu")`` and GPU output
memory raise :class:`UnsupportedError` naming it.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from trident.protocol import datatypes
from trident.tritonserver._enums import DataType, DLDeviceType, MemoryType
from trident.tritonserver._errors import InvalidArgumentError, UnsupportedError
from trident.types import Tensor as CoreTensor

#: where a tensor is, as Triton's API lets it be named: a string ("cpu", "gpu:0"), a MemoryType,
#: (MemoryType, id) or (DLDeviceType, id)
DeviceOrMemoryType = tuple[MemoryType, int] | MemoryType | tuple[DLDeviceType, int] | str

_HOST_DEVICES = (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost)
_NAMES = {"CPU": MemoryType.CPU, "CPU_PINNED": MemoryType.CPU_PINNED, "GPU": MemoryType.GPU}
_LENGTH = struct.Struct("<I")


def parse_device_or_memory_type(device: DeviceOrMemoryType) -> tuple[MemoryType, int]:
    """``(memory type, id)`` for a device named as :data:`DeviceOrMemoryType` allows. Raises
    InvalidArgumentError for anything else."""
    if isinstance(device, tuple) and len(device) == 2 and isinstance(device[1], int):
        kind, index = device
        if isinstance(kind, DLDeviceType):
            if kind in _HOST_DEVICES:
                return MemoryType.CPU, index
            if kind == DLDeviceType.kDLCUDA:
                return MemoryType.GPU, index
        elif isinstance(kind, MemoryType):
            return kind, index
    elif isinstance(device, MemoryType):
        return device, 0
    elif isinstance(device, str):
        name, _, number = device.partition(":")
        memory_type = _NAMES.get(name.upper())
        if memory_type is not None and (not number or number.isdigit()):
            return memory_type, int(number or 0)
    raise InvalidArgumentError(f"Invalid memory type {device!r}: use 'cpu', 'gpu[:<id>]', a MemoryType, "
                               "(MemoryType, id) or (DLDeviceType, id)")


def check_host(device: DeviceOrMemoryType) -> None:
    """Raise UnsupportedError unless ``device`` is host memory (the only memory this API has)."""
    memory_type, index = parse_device_or_memory_type(device)
    if memory_type != MemoryType.CPU:
        raise UnsupportedError(f"memory type {memory_type.name}:{index}: trident's in-process API holds tensors "
                               "in CPU memory only (copy device tensors to the host first)")


@dataclass(slots=True)
class MemoryBuffer:
    """Memory holding a tensor's data (Triton's ``MemoryBuffer``). It does not own the memory:
    ``owner`` does, and must not be freed while the buffer is in use."""

    data_ptr: int
    memory_type: MemoryType
    memory_type_id: int
    size: int
    owner: Any

    @staticmethod
    def from_dlpack(owner: Any) -> MemoryBuffer:
        """The buffer of a DLPack object in host memory. Raises InvalidArgumentError for an
        object without DLPack, UnsupportedError for device memory."""
        return Tensor.from_dlpack(owner).memory_buffer


class Tensor:
    """A tensor in host memory (Triton's ``Tensor``): ``data_type``, ``shape`` and its memory.

    Exports itself through DLPack (``numpy.from_dlpack(tensor)``, ``torch.from_dlpack(tensor)``;
    not BYTES, which has no DLPack type: use :meth:`to_bytes_array` / :meth:`to_string_array`).
    """

    __slots__ = ("data_type", "shape", "_array", "_buffer")

    def __init__(self, data_type: DataType, shape: Any, memory_buffer: MemoryBuffer) -> None:
        """A tensor over ``memory_buffer`` (host memory; BYTES as Triton's length-prefixed
        elements). Raises UnsupportedError for device memory, InvalidArgumentError when the
        buffer does not hold ``shape`` elements of ``data_type``."""
        if memory_buffer.memory_type not in (MemoryType.CPU, MemoryType.CPU_PINNED):
            raise UnsupportedError(f"a tensor in {MemoryType(memory_buffer.memory_type).name} memory: trident's "
                                   "in-process API holds tensors in CPU memory only")
        data_type = DataType(data_type)
        dims = tuple(int(d) for d in shape)
        raw = _host_bytes(memory_buffer)
        if data_type == DataType.BYTES:
            array = _deserialize(raw).reshape(dims)
        else:
            try:
                array = raw.view(datatypes.numpy_dtype(data_type.name)).reshape(dims)
            except (KeyError, ValueError) as e:
                raise InvalidArgumentError(f"a {data_type.name} tensor of shape {list(dims)} does not fit a buffer of "
                                           f"{memory_buffer.size} bytes: {e}") from None
        self.data_type = data_type
        self.shape = list(dims)
        self._array = array
        self._buffer: MemoryBuffer | None = memory_buffer

    @classmethod
    def _wrap(cls, data_type: DataType, array: np.ndarray) -> Tensor:
        """A tensor over ``array`` (no copy): a numpy array in trident's representation."""
        tensor = cls.__new__(cls)
        tensor.data_type = data_type
        tensor.shape = list(array.shape)
        tensor._array = array
        tensor._buffer = None
        return tensor

    # ---- memory ---------------------------------------------------------------------------

    @property
    def memory_buffer(self) -> MemoryBuffer:
        """Where the data is (a BYTES tensor's length-prefixed buffer is made on first use)."""
        if self._buffer is None:
            owner = self._array
            if self.data_type == DataType.BYTES:
                owner = np.frombuffer(datatypes.serialize_bytes(self._array), np.uint8)
            owner = _contiguous(owner)
            self._buffer = MemoryBuffer(int(owner.ctypes.data), MemoryType.CPU, 0, int(owner.nbytes), owner)
        return self._buffer

    @property
    def data_ptr(self) -> int:
        return self.memory_buffer.data_ptr

    @property
    def memory_type(self) -> MemoryType:
        return MemoryType.CPU

    @property
    def memory_type_id(self) -> int:
        return 0

    @property
    def size(self) -> int:
        """Bytes of data (a BYTES tensor: of its length-prefixed elements)."""
        if self.data_type == DataType.BYTES:
            return self.memory_buffer.size
        return int(self._array.nbytes)

    def _shaped(self) -> np.ndarray:
        """The array with the tensor's current ``shape`` (which callers may assign, as Triton's)."""
        dims = tuple(int(d) for d in self.shape)
        if dims == self._array.shape:
            return self._array
        try:
            return self._array.reshape(dims)
        except ValueError:
            raise InvalidArgumentError(f"shape {list(dims)} does not fit the tensor's "
                                       f"{self._array.size} elements") from None

    # ---- DLPack ---------------------------------------------------------------------------

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of the data (host memory: ``stream`` must be None or 0). Raises
        InvalidArgumentError for BYTES, UnsupportedError for a stream or for BF16 without torch."""
        if stream not in (None, 0):
            raise UnsupportedError(f"DLPack stream synchronization on memory type CPU and stream {stream} "
                                   "not supported")
        if self.data_type == DataType.BYTES:
            raise InvalidArgumentError("BYTES tensors have no DLPack data type: use to_bytes_array() or "
                                       "to_string_array()")
        array = self._shaped()
        if self.data_type == DataType.BF16:
            return _bf16_capsule(array, max_version=max_version, dl_device=dl_device, copy=copy)
        kwargs: dict[str, Any] = {k: v for k, v in (("max_version", max_version), ("dl_device", dl_device), ("copy", copy))
                  if v is not None}
        return array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        return DLDeviceType.kDLCPU, 0

    @staticmethod
    def from_dlpack(obj: Any) -> Tensor:
        """A tensor over a DLPack object in host memory (a numpy array, a CPU torch tensor...),
        without a copy when it is C-contiguous (a strided one is copied: Triton refuses those).
        Raises InvalidArgumentError for an object without DLPack or of an unsupported data type,
        UnsupportedError for device memory."""
        if not hasattr(obj, "__dlpack__"):
            raise InvalidArgumentError(f"Object of type {type(obj).__name__} does not support the DLPack protocol")
        device = getattr(obj, "__dlpack_device__", None)
        if device is not None:
            kind, index = device()
            if kind not in _HOST_DEVICES:
                name = DLDeviceType(kind).name if kind in DLDeviceType._value2member_map_ else str(kind)
                raise UnsupportedError(f"a DLPack tensor on device ({name}, {index}): trident's in-process API "
                                       "takes tensors in CPU memory only (copy it to the host first)")
        try:
            array = np.from_dlpack(obj)
        except (TypeError, BufferError, RuntimeError, ValueError) as e:
            bf16 = _torch_bf16_bits(obj)
            if bf16 is None:
                raise InvalidArgumentError(f"Object does not support DLPack protocol: {e}") from None
            return Tensor._wrap(DataType.BF16, _contiguous(bf16))
        return _from_numpy(array)

    # ---- conversions ----------------------------------------------------------------------

    def to_bytes_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy object array of ``bytes``. Raises InvalidArgumentError for
        any other data type."""
        if self.data_type != DataType.BYTES:
            raise InvalidArgumentError(f"Tensor has data type {self.data_type!r} not {DataType.BYTES!r}")
        return self._shaped().copy()

    def to_string_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy array of ``str`` (UTF-8). Raises InvalidArgumentError for
        any other data type or for elements that are not UTF-8."""
        items = self.to_bytes_array()
        try:
            decoded = [b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in items.reshape(-1)]
        except UnicodeDecodeError as e:
            raise InvalidArgumentError(f"BYTES element is not UTF-8 text: {e}") from None
        return np.array(decoded, dtype=str).reshape(items.shape)

    @staticmethod
    def from_string_array(string_array: list[str] | np.ndarray) -> Tensor:
        """A BYTES tensor from strings (UTF-8 encoded). Raises InvalidArgumentError."""
        return Tensor.from_bytes_array(string_array)

    @staticmethod
    def from_bytes_array(bytes_array: list[str] | list[bytes] | np.ndarray) -> Tensor:
        """A BYTES tensor from bytes or strings (a list or a numpy array of object, bytes_ or
        str_). Raises InvalidArgumentError for anything that is not text or bytes."""
        result = _from_object(bytes_array)
        if result.data_type != DataType.BYTES:
            raise InvalidArgumentError(f"Unsupported conversion from {bytes_array!r} to Triton BYTES Tensor. "
                                       f"Got {result.data_type!r}")
        return result

    def to_host(self) -> Tensor:
        """The tensor in CPU memory: itself."""
        return self

    def to_device(self, device: DeviceOrMemoryType) -> Tensor:
        """The tensor on ``device``: itself for the CPU. Raises UnsupportedError for any other
        device, InvalidArgumentError for a name that is none."""
        memory_type, index = parse_device_or_memory_type(device)
        if memory_type in (MemoryType.CPU, MemoryType.CPU_PINNED) and index == 0:
            return self
        raise UnsupportedError(f"Conversion from {(MemoryType.CPU, 0)} to {(memory_type, index)} not supported: "
                               "trident's in-process API holds tensors in CPU memory only")

    def _core(self, name: str) -> CoreTensor:
        """The server's tensor named ``name`` over the same array."""
        array = self._shaped()
        return CoreTensor(name, self.data_type.name, tuple(array.shape), array)

    def __repr__(self) -> str:
        return f"Tensor(data_type={self.data_type!r}, shape={self.shape}, memory_type={MemoryType.CPU!r})"


# ---- from Python objects ------------------------------------------------------------------


def _from_object(obj: Any) -> Tensor:
    """An input given as Triton's API allows: a Tensor, a numpy array or scalar, a (nested)
    list, or any DLPack object. Raises InvalidArgumentError, UnsupportedError (device memory)."""
    if isinstance(obj, Tensor):
        return obj
    if isinstance(obj, np.ndarray | np.generic):
        return _from_numpy(np.asarray(obj))
    if isinstance(obj, list | tuple):
        try:
            array = np.array(obj)
        except ValueError as e:
            raise InvalidArgumentError(f"Conversion from {obj!r} to tensor not supported: {e}") from None
        return _from_numpy(array)
    if hasattr(obj, "__dlpack__"):
        return Tensor.from_dlpack(obj)
    raise InvalidArgumentError(f"Input type {type(obj)} not supported. Must be one of numpy.ndarray, numpy.generic, "
                               "list, tritonserver.Tensor or the type must support __dlpack__")


def _from_numpy(array: np.ndarray) -> Tensor:
    """A tensor over ``array`` (copied only when it is not C-contiguous, not little-endian, or
    text to encode)."""
    if array.dtype.kind in "USO":
        return Tensor._wrap(DataType.BYTES, _bytes_elements(array))
    try:
        datatype = datatypes.datatype_of(array)  # bfloat16 (ml_dtypes, as tritonclient uses) is BF16
    except ValueError:
        raise InvalidArgumentError(f"Unsupported numpy data type {array.dtype}: use a bool, integer, float or "
                                   "text type") from None
    if datatype == "BF16":
        array = _contiguous(array).view(np.uint16)
    elif array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return Tensor._wrap(DataType[datatype], _contiguous(array))


def _contiguous(array: np.ndarray) -> np.ndarray:
    """``array``, copied only when it is not C-contiguous (0-d arrays stay 0-d)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def _bytes_elements(array: np.ndarray) -> np.ndarray:
    """An object array of ``bytes``: str elements UTF-8 encoded, anything else as its str()."""
    flat = array.reshape(-1)
    if array.dtype.kind == "O" and all(type(x) is bytes for x in flat):
        return _contiguous(array)
    out = np.empty(flat.size, dtype=object)
    for i, item in enumerate(flat):
        item = item.item() if isinstance(item, np.generic) else item
        out[i] = item if isinstance(item, bytes) else str(item).encode("utf-8")
    return out.reshape(array.shape)


def _deserialize(raw: np.ndarray) -> np.ndarray:
    """Length-prefixed BYTES elements as an object array of bytes. Raises InvalidArgumentError."""
    data = raw.tobytes()
    out: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise InvalidArgumentError("malformed BYTES buffer: a length prefix is cut short")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += 4
        if offset + length > len(data):
            raise InvalidArgumentError("malformed BYTES buffer: an element runs past the end")
        out.append(data[offset:offset + length])
        offset += length
    result = np.empty(len(out), dtype=object)
    result[:] = out
    return result


def _host_bytes(buffer: MemoryBuffer) -> np.ndarray:
    """The buffer's bytes as a uint8 array that keeps ``buffer.owner`` alive."""
    owner = buffer.owner
    if isinstance(owner, np.ndarray) and owner.flags.c_contiguous:
        start = int(owner.ctypes.data)
        flat = owner.reshape(-1).view(np.uint8)
        offset = buffer.data_ptr - start
        if 0 <= offset and offset + buffer.size <= flat.size:
            return flat[offset:offset + buffer.size]
    if buffer.size == 0:
        return np.empty(0, np.uint8)
    raw = (ctypes.c_uint8 * buffer.size).from_address(buffer.data_ptr)
    raw._owner = owner  # type: ignore[attr-defined]  # the memory lives as long as the view
    return np.ctypeslib.as_array(raw)


# ---- BF16 through torch (numpy has no bfloat16) -----------------------------------------------


def _torch_bf16_bits(obj: Any) -> np.ndarray | None:
    """The uint16 bit patterns of a CPU torch bfloat16 tensor (a view), else None."""
    dtype = getattr(obj, "dtype", None)
    if type(obj).__module__.split(".")[0] != "torch" or str(dtype) != "torch.bfloat16":
        return None
    import torch

    return np.from_dlpack(obj.contiguous().view(torch.int16)).view(np.uint16)


def _bf16_capsule(bits: np.ndarray, **kwargs: Any) -> Any:
    """A DLPack capsule of bfloat16 data (uint16 bit patterns), made by torch over the same
    memory. Raises UnsupportedError without torch."""
    try:
        import torch
    except ImportError:
        raise UnsupportedError("BF16 tensors are exported through DLPack with torch, which is not installed "
                               "(numpy has no bfloat16)") from None
    view = torch.from_numpy(_contiguous(bits).view(np.int16)).view(torch.bfloat16)
    return view.__dlpack__(**{k: v for k, v in kwargs.items() if v is not None})
