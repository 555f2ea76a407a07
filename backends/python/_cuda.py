"""The CUDA work behind ``pb_utils`` GPU tensors: waiting for a producer's kernels, copying a
device tensor to the host and a host tensor to a device. trident itself links no CUDA library:
it uses the first of these that works in this process, in this order:

* torch, when ``torch.cuda.is_available()``
* cupy, when it sees a device
* cuda-python (``cuda.bindings.runtime``, the ``cuda`` extra), when it sees a device

A model that holds a CUDA tensor has one of them (it made the tensor with it). Where none works,
the operation that needs one raises :class:`CudaUnavailable` naming why each is unusable; nothing
else in the Python backend needs CUDA (a device tensor passed from model to model in this
process is never copied: see :mod:`._dlpack`).

Every call waits until the work is done (copies return with the bytes in place), so the result
is safe to read from any stream or thread.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from trident.backends.python._dlpack import CapsuleHolder, DeviceBuffer
from trident.backends.python._pb_base import TritonModelException


class CudaUnavailable(TritonModelException):
    """A CUDA operation was needed and no CUDA library in this process can do it."""


class _Torch:
    name = "torch"

    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} has no CUDA device available")
        self.torch = torch

    def synchronize(self, device_id: int) -> None:
        self.torch.cuda.synchronize(device_id)

    def to_host(self, buffer: DeviceBuffer) -> np.ndarray:
        flat = self.torch.from_dlpack(CapsuleHolder(buffer, flat_bytes=True))
        return flat.cpu().numpy()

    def to_device(self, flat: np.ndarray, device_id: int) -> tuple[int, Any]:
        tensor = self.torch.from_numpy(flat).to(f"cuda:{device_id}")
        self.torch.cuda.synchronize(device_id)
        return int(tensor.data_ptr()), tensor


class _Cupy:
    name = "cupy"

    def __init__(self) -> None:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("cupy sees no CUDA device")
        self.cupy = cupy

    def synchronize(self, device_id: int) -> None:
        self.cupy.cuda.Device(device_id).synchronize()

    def to_host(self, buffer: DeviceBuffer) -> np.ndarray:
        with self.cupy.cuda.Device(buffer.device_id):
            return self.cupy.from_dlpack(CapsuleHolder(buffer, flat_bytes=True)).get()

    def to_device(self, flat: np.ndarray, device_id: int) -> tuple[int, Any]:
        with self.cupy.cuda.Device(device_id) as device:
            array = self.cupy.asarray(flat)
            device.synchronize()
        return int(array.data.ptr), array


class _DeviceMemory:
    """cudaMalloc'd memory, freed when this object goes."""

    def __init__(self, rt: Any, pointer: int, device_id: int) -> None:
        self._finalizer = weakref.finalize(self, _free, rt, pointer, device_id)
        self._finalizer.atexit = False


def _free(rt: Any, pointer: int, device_id: int) -> None:
    rt.cudaSetDevice(device_id)
    rt.cudaFree(pointer)


class _CudaPython:
    name = "cuda-python"

    def __init__(self) -> None:
        from cuda.bindings import runtime as rt

        err, count = rt.cudaGetDeviceCount()
        if int(err) != 0 or not count:
            raise RuntimeError(getattr(err, "name", str(err)) if int(err) else "no CUDA device")
        self.rt = rt

    def _check(self, result: Any, what: str) -> Any:
        if int(result[0]) != 0:
            raise TritonModelException(f"{what}: {getattr(result[0], 'name', result[0])}")
        return result[1] if len(result) > 1 else None

    def synchronize(self, device_id: int) -> None:
        self._check(self.rt.cudaSetDevice(device_id), f"cannot select CUDA device {device_id}")
        self._check(self.rt.cudaDeviceSynchronize(), f"cannot synchronize CUDA device {device_id}")

    def to_host(self, buffer: DeviceBuffer) -> np.ndarray:
        out = np.empty(buffer.nbytes, np.uint8)
        self._check(self.rt.cudaSetDevice(buffer.device_id), f"cannot select CUDA device {buffer.device_id}")
        if buffer.nbytes:
            self._check(self.rt.cudaMemcpy(out.ctypes.data, buffer.pointer, buffer.nbytes,
                                           self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost),
                        "cannot copy a CUDA tensor to the host")
        return out

    def to_device(self, flat: np.ndarray, device_id: int) -> tuple[int, Any]:
        self._check(self.rt.cudaSetDevice(device_id), f"cannot select CUDA device {device_id}")
        pointer = int(self._check(self.rt.cudaMalloc(max(flat.nbytes, 1)), "cannot allocate CUDA memory"))
        owner = _DeviceMemory(self.rt, pointer, device_id)
        if flat.nbytes:
            self._check(self.rt.cudaMemcpy(pointer, flat.ctypes.data, flat.nbytes,
                                           self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice),
                        "cannot copy a tensor to CUDA memory")
        return pointer, owner


#: the libraries tried, in order (tests may replace the list and call :func:`forget`)
CANDIDATES: list[Any] = [_Torch, _Cupy, _CudaPython]
_chosen: Any = None
_lock = threading.Lock()


def forget() -> None:
    """Choose again at the next call (after CANDIDATES changed)."""
    global _chosen
    with _lock:
        _chosen = None


def _library(what: str) -> Any:
    """The first usable library; raises CudaUnavailable saying ``what`` needed it and why none
    works. A failed choice is not remembered (a library may become usable)."""
    global _chosen
    with _lock:
        if _chosen is not None:
            return _chosen
        problems = []
        for candidate in CANDIDATES:
            try:
                _chosen = candidate()
                return _chosen
            except ImportError:
                problems.append(f"{candidate.name}: not installed")
            except Exception as e:  # a library that cannot reach a device says so in its own words
                problems.append(f"{candidate.name}: {e}")
    raise CudaUnavailable(f"{what} needs CUDA in this process through torch, cupy or cuda-python, and none is "
                          f"usable here ({'; '.join(problems) or 'none tried'})")


def library_name() -> str | None:
    """The library in use, or None when none is usable."""
    try:
        return str(_library("").name)
    except CudaUnavailable:
        return None


def synchronize(device_id: int, what: str) -> None:
    """Wait until all work queued on the CUDA device is done. Raises CudaUnavailable."""
    _library(what).synchronize(device_id)


def to_host(buffer: DeviceBuffer, what: str) -> np.ndarray:
    """A host copy of a device buffer, shaped and typed as the tensor (BF16: uint16 bit
    patterns). Raises CudaUnavailable, or TritonModelException when the copy fails."""
    flat = _library(what).to_host(buffer)
    return flat.view(buffer.dtype).reshape(buffer.shape)


def to_device(array: np.ndarray, datatype: str, device_id: int, what: str) -> DeviceBuffer:
    """A copy of a host array (not BYTES) in the memory of CUDA device ``device_id``. Raises
    CudaUnavailable, or TritonModelException when the copy fails."""
    from trident.backends.python._dlpack import KDL_CUDA

    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    pointer, owner = _library(what).to_device(flat, device_id)
    return DeviceBuffer(KDL_CUDA, device_id, pointer, tuple(int(d) for d in array.shape), datatype,
                        int(flat.nbytes), owner)
