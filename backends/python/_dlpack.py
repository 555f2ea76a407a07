"""DLPack for ``pb_utils`` tensors outside CPU memory, in ctypes: reading a capsule another
framework made (and owning it from then on) and making capsules over memory trident holds.

CPU tensors go through numpy's own DLPack support (:mod:`._pb_tensor`); this module is what
numpy cannot do: a capsule over CUDA memory. Nothing here reads or writes the memory itself, so
all of it works (and is tested) on a host without CUDA; copies and synchronisation are
:mod:`._cuda`'s.

* :func:`consume` takes an unconsumed ``dltensor`` or ``dltensor_versioned`` capsule, renames
  it ``used_dltensor[_versioned]`` as the protocol requires, and returns an :class:`Imported`
  that calls the producer's deleter once nothing holds it any more.
* :func:`export` makes a legacy ``dltensor`` capsule over a :class:`DeviceBuffer`; the buffer
  stays alive until the consumer calls the capsule's deleter (or the capsule is destroyed
  unconsumed). Any number of capsules may be made over one buffer.
* :class:`DeviceView` is what a device tensor's data is in trident's core types while it
  travels between two Python models in this process (a BLS request's input, its response's
  output): an ndarray subclass with the tensor's shape and dtype over one element (all strides
  0), so the server's shape checks hold, carrying the :class:`DeviceBuffer`. Its elements are
  not the tensor's values: every consumer that reads values turns it into a host copy first
  (:mod:`._convert`, :mod:`.isolated.channel`).
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import numpy as np

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI",
                 10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI"}
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_BOOL = 0, 1, 2, 4, 6

# Triton datatype <-> (DLPack type code, bits) and the numpy dtype trident holds it as
_DATATYPES: dict[str, tuple[int, int, str]] = {
    "BOOL": (KDL_BOOL, 8, "bool"), "UINT8": (KDL_UINT, 8, "uint8"), "UINT16": (KDL_UINT, 16, "uint16"),
    "UINT32": (KDL_UINT, 32, "uint32"), "UINT64": (KDL_UINT, 64, "uint64"), "INT8": (KDL_INT, 8, "int8"),
    "INT16": (KDL_INT, 16, "int16"), "INT32": (KDL_INT, 32, "int32"), "INT64": (KDL_INT, 64, "int64"),
    "FP16": (KDL_FLOAT, 16, "float16"), "FP32": (KDL_FLOAT, 32, "float32"),
    "FP64": (KDL_FLOAT, 64, "float64"), "BF16": (KDL_BFLOAT, 16, "uint16"),
}  # fmt: skip
_BY_CODE = {(code, bits): name for name, (code, bits, _) in _DATATYPES.items()}
_BY_CODE[(KDL_UINT, 1)] = "BOOL"  # some producers say bool is an unsigned 1-bit integer


def device_name(device_type: int) -> str:
    return _DEVICE_NAMES.get(int(device_type), f"device type {int(device_type)}")


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):  # DLPack >= 1.0: the tensor follows a header
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _api(name: str, restype: Any, *argtypes: Any) -> Any:
    fn = ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))
    return fn


# PyCapsule calls on objects, and on raw PyObject* in the destructor (which runs with the GIL)
_get_name = _api("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
_get_pointer = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_set_name = _api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_is_valid_raw = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_get_pointer_raw = _api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_capsule_new = _api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)

# names a capsule keeps for its whole life (PyCapsule stores the pointer, not a copy)
_LEGACY = ctypes.c_char_p(b"dltensor")
_USED_LEGACY = ctypes.c_char_p(b"used_dltensor")
_USED_VERSIONED = ctypes.c_char_p(b"used_dltensor_versioned")


class DLPackError(ValueError):
    """A capsule that cannot be taken: not DLPack, consumed already, strided, or of a dtype
    Triton has no datatype for (the message says which)."""


# ---- what a capsule describes ----


class Described:
    """The fields of a DLPack tensor, as read from a capsule (nothing consumed yet)."""

    __slots__ = ("pointer", "device_type", "device_id", "shape", "datatype", "nbytes")

    def __init__(self, pointer: int, device_type: int, device_id: int, shape: tuple[int, ...],
                 datatype: str, nbytes: int) -> None:
        self.pointer = pointer
        self.device_type = device_type
        self.device_id = device_id
        self.shape = shape
        self.datatype = datatype
        self.nbytes = nbytes


def _describe(t: DLTensor) -> Described:
    """Raises DLPackError for lanes != 1, a dtype without a Triton datatype, or a tensor that is
    not C-contiguous (Triton's words)."""
    ndim = int(t.ndim)
    shape = tuple((ctypes.c_int64 * ndim).from_address(t.shape)) if ndim else ()
    dtype = t.dtype
    datatype = _BY_CODE.get((int(dtype.code), int(dtype.bits)))
    if datatype is None or int(dtype.lanes) != 1:
        raise DLPackError(f"DLPack data type (code {int(dtype.code)}, {int(dtype.bits)} bits, "
                          f"{int(dtype.lanes)} lanes) has no Triton datatype")
    count = 1
    for d in shape:
        count *= int(d)
    if t.strides and ndim and count:
        strides = tuple((ctypes.c_int64 * ndim).from_address(t.strides))
        expected = 1
        for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
            if dim != 1 and stride != expected:
                raise DLPackError("DLPack tensor is not contiguous. Only contiguous DLPack tensors that are "
                                  "stored in C-Order are supported.")
            expected *= dim
    itemsize = (int(dtype.bits) + 7) // 8
    pointer = (int(t.data or 0) + int(t.byte_offset))
    return Described(pointer, int(t.device_type), int(t.device_id), tuple(int(d) for d in shape), datatype,
                     count * itemsize)


def describe(capsule: object) -> tuple[Described, bool]:
    """(the tensor an unconsumed capsule holds, whether it is a versioned one). Raises
    DLPackError for anything else."""
    try:
        name = _get_name(capsule)
    except (ValueError, TypeError):
        raise DLPackError("not a DLPack capsule (nor an object with __dlpack__)") from None
    if name == b"dltensor":
        managed = DLManagedTensor.from_address(_get_pointer(capsule, name))
        return _describe(managed.dl_tensor), False
    if name == b"dltensor_versioned":
        versioned = DLManagedTensorVersioned.from_address(_get_pointer(capsule, name))
        if int(versioned.major) != 1:
            raise DLPackError(f"DLPack version {int(versioned.major)}.{int(versioned.minor)} is not supported")
        return _describe(versioned.dl_tensor), True
    if name in (b"used_dltensor", b"used_dltensor_versioned"):
        raise DLPackError("the DLPack capsule was consumed already (a capsule can be imported once)")
    raise DLPackError(f"not a DLPack capsule (its name is {name!r})")


# ---- consuming a capsule ----


class Imported:
    """Owns a consumed DLPack tensor: calls the producer's deleter once when released (or
    when collected). The memory stays valid while this object lives."""

    __slots__ = ("_finalizer", "__weakref__")

    def __init__(self, managed: int, deleter: int) -> None:
        # atexit=False: at interpreter exit a framework's deleter may run after its runtime is
        # gone (a CUDA context torn down); the process ends anyway
        self._finalizer = weakref.finalize(self, _call_deleter, managed, deleter)
        self._finalizer.atexit = False

    def release(self) -> None:
        self._finalizer()


def _call_deleter(managed: int, deleter: int) -> None:
    if deleter:
        _DELETER(deleter)(managed)


def consume(capsule: object) -> tuple[Described, Imported]:
    """Take ownership of an unconsumed capsule: (what it holds, its owner). The capsule is
    renamed ``used_dltensor[_versioned]``, so its destructor leaves the tensor alone. Raises
    DLPackError as :func:`describe` does (the capsule is then left as it was)."""
    described, versioned = describe(capsule)
    name = b"dltensor_versioned" if versioned else b"dltensor"
    pointer = _get_pointer(capsule, name)
    if versioned:
        deleter = DLManagedTensorVersioned.from_address(pointer).deleter
    else:
        deleter = DLManagedTensor.from_address(pointer).deleter
    if _set_name(capsule, _USED_VERSIONED if versioned else _USED_LEGACY) != 0:  # pragma: no cover
        raise DLPackError("cannot mark the DLPack capsule as consumed")
    return described, Imported(pointer, int(deleter or 0))


# ---- device buffers and the capsules trident makes over them ----


class DeviceBuffer:
    """A tensor's bytes outside CPU memory: where (``device_type``, ``device_id``,
    ``pointer``), what (``shape``, Triton ``datatype``, ``nbytes``) and ``owner``, the object
    keeping the memory alive (an :class:`Imported`, a client's CUDA shared-memory mapping, a
    framework tensor). Immutable; shared by every tensor and capsule over the same memory."""

    __slots__ = ("device_type", "device_id", "pointer", "shape", "datatype", "nbytes", "owner")

    def __init__(self, device_type: int, device_id: int, pointer: int, shape: tuple[int, ...], datatype: str,
                 nbytes: int, owner: Any) -> None:
        self.device_type = device_type
        self.device_id = device_id
        self.pointer = pointer
        self.shape = shape
        self.datatype = datatype
        self.nbytes = nbytes
        self.owner = owner

    @classmethod
    def imported(cls, described: Described, owner: Any) -> DeviceBuffer:
        return cls(described.device_type, described.device_id, described.pointer, described.shape,
                   described.datatype, described.nbytes, owner)

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype trident holds the datatype as (BF16: uint16 bit patterns)."""
        return np.dtype(_DATATYPES[self.datatype][2])

    def view(self) -> DeviceView:
        return DeviceView.over(self)

    def describe(self) -> str:
        return f"{device_name(self.device_type)} device {self.device_id}"


class _Export(ctypes.Structure):
    """One capsule's managed tensor and its shape array, allocated together by ctypes."""

    _fields_ = [("managed", DLManagedTensor), ("shape", ctypes.c_int64 * 32)]


_exports: dict[int, tuple[_Export, DeviceBuffer]] = {}  # address of the managed tensor -> what it holds
_exports_lock = threading.Lock()


@_DELETER
def _export_deleter(managed: int) -> None:
    """The deleter of a capsule trident made: lets go of its buffer (any thread; ctypes takes
    the GIL). Calling it twice is harmless."""
    with _exports_lock:
        entry = _exports.pop(int(managed or 0), None)
    del entry  # outside the lock: letting go of the buffer may run another capsule's deleter


@_DESTRUCTOR
def _capsule_destructor(capsule: int) -> None:
    """A capsule trident made is being destroyed: when nobody consumed it, call its deleter."""
    if _is_valid_raw(capsule, _LEGACY):
        _export_deleter(_get_pointer_raw(capsule, _LEGACY))


MAX_NDIM = 32


def export(buffer: DeviceBuffer, *, flat_bytes: bool = False) -> object:
    """A legacy ``dltensor`` capsule over ``buffer`` (``flat_bytes``: as a 1-D uint8 tensor of
    ``nbytes``, which is what :mod:`._cuda` copies). The buffer stays alive until the consumer
    calls the deleter, or the capsule is destroyed unconsumed. Raises DLPackError for more than
    32 dimensions."""
    shape = (buffer.nbytes,) if flat_bytes else buffer.shape
    if len(shape) > MAX_NDIM:
        raise DLPackError(f"a tensor of {len(shape)} dimensions cannot be exported (at most {MAX_NDIM})")
    block = _Export()
    for i, d in enumerate(shape):
        block.shape[i] = d
    t = block.managed.dl_tensor
    t.data = buffer.pointer or None
    t.device_type = buffer.device_type
    t.device_id = buffer.device_id
    t.ndim = len(shape)
    code, bits, _ = (KDL_UINT, 8, "uint8") if flat_bytes else _DATATYPES[buffer.datatype]
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
    t.shape = ctypes.addressof(block) + _Export.shape.offset
    t.strides = None  # C-contiguous
    t.byte_offset = 0
    address = ctypes.addressof(block.managed)
    block.managed.manager_ctx = address
    block.managed.deleter = ctypes.cast(_export_deleter, ctypes.c_void_p).value
    with _exports_lock:
        _exports[address] = (block, buffer)
    try:
        return _capsule_new(address, _LEGACY, ctypes.cast(_capsule_destructor, ctypes.c_void_p).value)
    except BaseException:
        _export_deleter(address)
        raise


def live_exports() -> int:
    """Capsules made by :func:`export` whose deleter has not run yet (for tests and leak checks)."""
    with _exports_lock:
        return len(_exports)


class CapsuleHolder:
    """The ``__dlpack__`` protocol over capsules made on demand: what a framework's
    ``from_dlpack(obj)`` takes (torch, cupy, numpy)."""

    __slots__ = ("_buffer", "_flat")

    def __init__(self, buffer: DeviceBuffer, flat_bytes: bool = False) -> None:
        self._buffer = buffer
        self._flat = flat_bytes

    def __dlpack__(self, stream: Any = None, **_kwargs: Any) -> object:
        return export(self._buffer, flat_bytes=self._flat)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self._buffer.device_type, self._buffer.device_id)


# ---- a device tensor inside trident's core types ----


class DeviceView(np.ndarray):
    """A device tensor as a core ``Tensor``'s data (see the module docstring): the tensor's
    shape and dtype, no bytes of its own (every stride 0 over one element), and
    ``device_buffer``, the :class:`DeviceBuffer`. Views of it keep ``device_buffer``."""

    device_buffer: DeviceBuffer | None

    @classmethod
    def over(cls, buffer: DeviceBuffer) -> DeviceView:
        dtype = buffer.dtype
        view = np.ndarray.__new__(cls, buffer.shape, dtype, buffer=np.zeros(1, dtype),
                                  strides=(0,) * len(buffer.shape))
        view.device_buffer = buffer
        view.flags.writeable = False
        return view

    def __array_finalize__(self, obj: Any) -> None:
        self.device_buffer = getattr(obj, "device_buffer", None)


def device_buffer_of(data: Any) -> DeviceBuffer | None:
    """The device buffer a core tensor's data stands for, or None for host data."""
    return data.device_buffer if type(data) is DeviceView else None
