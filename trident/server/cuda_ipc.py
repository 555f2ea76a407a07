"""CUDA IPC for client CUDA shared memory: open a client's cudaIpcMemHandle and copy bytes
between it and host memory, through the CUDA runtime of the ``cuda-python`` package
(``cuda.bindings``, the package tritonclient's own CUDA shared-memory utilities use).

:func:`open_runtime` loads the runtime once per process and raises UNSUPPORTED naming what is
missing (the package, a driver, a device). A :class:`CudaMapping` is one opened handle: the
server's registry holds it while the region is registered, and so does every input copied from
it and every tensor a GPU model reads from it; the handle is closed
(``cudaIpcCloseMemHandle``) when the last holder lets go, so a running request never loses its
memory. All calls are synchronous: a copy returns when the bytes have arrived.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from typing import Any

import numpy as np

from trident.errors import TritonError, internal, invalid_arg, unsupported

log = logging.getLogger("trident.shared_memory")
CUDA_IPC_HANDLE_SIZE = 64  # bytes of a cudaIpcMemHandle_t
REGISTER_REFUSED = "failed to register shared memory region: invalid args"  # Triton's words


class CudaRuntime:
    """The process's CUDA runtime (``cuda.bindings.runtime`` and ``.driver``); safe from any
    thread (each call selects the region's device first: the current device is per thread)."""

    def __init__(self, rt: Any, drv: Any) -> None:
        self.rt = rt
        self.drv = drv
        err, count = rt.cudaGetDeviceCount()
        if int(err) != 0:
            raise unsupported(f"CUDA shared memory needs a CUDA device: the CUDA runtime reports "
                              f"{self.error_text(err)}")
        if count == 0:
            raise unsupported("CUDA shared memory needs a CUDA device: the CUDA runtime sees none")
        self.device_count = int(count)
        self._lock = threading.Lock()
        self._streams: dict[int, Any] = {}  # one non-blocking stream per device, for the copies

    def error_text(self, err: Any) -> str:
        text = self.rt.cudaGetErrorString(err)[1]
        return text.decode() if isinstance(text, bytes) else str(err)

    def _check(self, result: Any, what: str) -> Any:
        err = result[0]
        if int(err) != 0:
            raise internal(f"{what}: {self.error_text(err)}")
        return result[1] if len(result) > 1 else None

    def select(self, device_id: int) -> None:
        self._check(self.rt.cudaSetDevice(device_id), f"unable to select CUDA device {device_id}")

    def open(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> CudaMapping:
        """Open ``raw_handle`` on ``device_id`` for the region ``name`` and check that its
        allocation holds ``byte_size`` bytes. Raises INVALID_ARG in Triton's words for a device
        that does not exist, a handle the driver refuses, or an allocation smaller than
        ``byte_size``."""
        if not 0 <= device_id < self.device_count or len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise invalid_arg(REGISTER_REFUSED)
        self.select(device_id)
        handle = self.rt.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw_handle, CUDA_IPC_HANDLE_SIZE)
        err, pointer = self.rt.cudaIpcOpenMemHandle(handle, self.rt.cudaIpcMemLazyEnablePeerAccess)
        if int(err) != 0:
            log.warning("failed to open CUDA IPC handle for region '%s': %s", name, self.error_text(err))
            raise invalid_arg(REGISTER_REFUSED)
        pointer = int(pointer)
        mapping = CudaMapping(self, pointer, device_id)
        result = self.drv.cuMemGetAddressRange(self.drv.CUdeviceptr(pointer))
        if int(result[0]) != 0 or int(result[2]) < byte_size:
            mapping.close()
            raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        return mapping

    def close(self, pointer: int, device_id: int) -> None:
        try:
            self.select(device_id)
            self.rt.cudaIpcCloseMemHandle(pointer)
        except TritonError:  # closing at exit with the driver gone: nothing left to release
            pass

    def allocate(self, nbytes: int, device_id: int) -> tuple[int, bytes]:
        """Device memory for a client (``trident perf --shared-memory cuda``): its address and
        the cudaIpcMemHandle that lets a server open it. Free it with :meth:`free`. Raises
        INTERNAL when CUDA refuses."""
        self.select(device_id)
        pointer = int(self._check(self.rt.cudaMalloc(nbytes), f"unable to allocate {nbytes} bytes on CUDA device "
                                                               f"{device_id}"))
        try:
            handle = self._check(self.rt.cudaIpcGetMemHandle(pointer), "unable to export CUDA memory")
        except TritonError:
            self.free(pointer, device_id)
            raise
        return pointer, bytes((ctypes.c_char * CUDA_IPC_HANDLE_SIZE).from_address(handle.getPtr()))

    def free(self, pointer: int, device_id: int) -> None:
        self.select(device_id)
        self.rt.cudaFree(pointer)

    def _stream(self, device_id: int) -> Any:
        with self._lock:
            stream = self._streams.get(device_id)
            if stream is None:
                stream = self._check(self.rt.cudaStreamCreateWithFlags(self.rt.cudaStreamNonBlocking),
                                     f"unable to create a CUDA stream on device {device_id}")
                self._streams[device_id] = stream
            return stream

    def copy(self, dst: int, src: int, nbytes: int, device_id: int) -> None:
        """Copy ``nbytes`` from address ``src`` to ``dst`` (either on the host or the device:
        unified addressing tells them apart) and wait until the bytes have arrived: a plain
        ``cudaMemcpy`` from pageable host memory may return before its DMA to the device is
        done, and another process (the client) reads the destination next. Raises INTERNAL
        when the runtime refuses."""
        if nbytes <= 0:
            return
        self.select(device_id)
        stream = self._stream(device_id)
        self._check(self.rt.cudaMemcpyAsync(dst, src, nbytes, self.rt.cudaMemcpyKind.cudaMemcpyDefault, stream),
                    "unable to copy to or from CUDA shared memory")
        self._check(self.rt.cudaStreamSynchronize(stream), "unable to copy to or from CUDA shared memory")


_runtime: CudaRuntime | None = None
_runtime_lock = threading.Lock()


def open_runtime() -> CudaRuntime:
    """The process's :class:`CudaRuntime`, loaded on first use (which initialises CUDA: call it
    from a worker thread). Raises UNSUPPORTED naming what is missing: the ``cuda-python``
    package, a driver, or a device."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            try:
                from cuda.bindings import driver, runtime
            except ImportError:
                raise unsupported("CUDA shared memory needs the cuda-python package (pip install "
                                  "'trident-inference[cuda]'): it is not installed") from None
            _runtime = CudaRuntime(runtime, driver)
        return _runtime


class CudaMapping:
    """One opened cudaIpcMemHandle: ``pointer`` (the device address of the allocation's first
    byte) on ``device_id``. Closed when the last reference goes (or by :meth:`close`, for a
    registration that failed)."""

    __slots__ = ("pointer", "device_id", "_finalizer", "__weakref__")

    def __init__(self, runtime: CudaRuntime, pointer: int, device_id: int) -> None:
        self.pointer = pointer
        self.device_id = device_id
        self._finalizer = weakref.finalize(self, runtime.close, pointer, device_id)

    def close(self) -> None:
        self._finalizer()


class DeviceWindow:
    """A writable range of a CUDA region, for an output: ``window[:n] = blob`` copies ``blob``'s
    bytes (any contiguous buffer) to the device, as a memoryview of a system region takes
    them. It holds the mapping open while it lives."""

    __slots__ = ("runtime", "mapping", "address", "nbytes")

    def __init__(self, runtime: CudaRuntime, mapping: CudaMapping, offset: int, nbytes: int) -> None:
        self.runtime = runtime
        self.mapping = mapping
        self.address = mapping.pointer + offset
        self.nbytes = nbytes

    def __setitem__(self, where: slice, blob: Any) -> None:
        start, stop, step = where.indices(self.nbytes)
        source = memoryview(blob).cast("B")
        if step != 1 or stop - start != source.nbytes:
            raise ValueError("a device window takes one contiguous run of bytes")
        if source.nbytes:
            address = int(np.frombuffer(source, np.uint8).ctypes.data)
            self.runtime.copy(self.address + start, address, source.nbytes, self.mapping.device_id)
