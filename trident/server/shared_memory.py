"""Client shared memory: Triton's system and CUDA shared-memory extensions, for both front ends.

A client on the same host registers a region (a POSIX shared-memory object it created, e.g.
with ``tritonclient.utils.shared_memory``) under a name; inference inputs then name a region,
an offset and a byte size instead of carrying data, and outputs may ask to be written into a
region. :class:`SharedMemory` is the one registry both front ends call:

* ``register_system`` opens ``/dev/shm/<key>`` (a POSIX name: one leading ``/``, no other
  ``/``, so no path outside ``/dev/shm`` can be named), checks ``offset + byte_size`` against
  the object's size and maps it; :meth:`SharedMemory.input_view` and
  :meth:`SharedMemory.output_view` hand out bounds-checked memoryviews of a mapping, so inputs
  become numpy views without a copy and outputs are written once, in place;
* a mapping lives as long as something uses it: unregistering removes the name at once, and
  the pages are unmapped when the last request holding a view of them is done (a running
  request never loses its memory);
* a mapping is a :class:`trident.types.SharedRegionMapping`: it also keeps a read-only
  descriptor of the object while the region is registered (closed at unregistration), so a
  backend that runs models in another process (the process-isolated Python backend) can find
  that an input is a view of a region (:func:`trident.types.shared_region_of`) and pass the
  model process the file, offset and size instead of copying the bytes;
* ``register_cuda`` opens a client's cudaIpcMemHandle (:mod:`trident.server.cuda_ipc`, through
  the ``cuda-python`` package; UNSUPPORTED naming the missing piece on a host without it, a
  driver or a device) and checks ``byte_size`` against the allocation. An input read from a
  CUDA region is copied to the host once (:class:`trident.types.DeviceCopy`: every model and
  every part of the server can read it), and a model running on the same GPU reads the
  client's device memory itself instead (:func:`trident.types.device_source_of`); an output
  is copied to the device once, from the host bytes the model produced;
* system and CUDA regions share one namespace of names, as in Triton;
* every error has Triton's code and words (checked against tritonserver 2.51).

Client shared memory is off unless ``--allow-client-shm`` (as in Triton since 2.60: a client
that can name ``/dev/shm`` objects can make the server read and write them); the restricted-API
``shared-memory`` group can additionally require a header.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any

from trident.errors import Code, TritonError, internal, invalid_arg, not_found, unsupported
from trident.protocol.kserve import shm_parameters
from trident.server.cuda_ipc import (
    CUDA_IPC_HANDLE_SIZE,
    REGISTER_REFUSED,
    CudaMapping,
    DeviceWindow,
    open_runtime,
)
from trident.types import DeviceCopy, SharedRegionMapping

SHM_ROOT = "/dev/shm"
MAX_REGIONS = 4096  # registered regions per kind (a client controls the count)
DISABLED = ("client shared memory is disabled on this server; start it with --allow-client-shm=true "
            "to use the shared-memory extensions")


@dataclass(frozen=True)
class SystemRegion:
    """A registered system shared-memory region and its mapping (``offset`` .. ``offset+byte_size``
    of the object ``key``)."""

    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


@dataclass(frozen=True)
class CudaRegion:
    """A registered CUDA shared-memory region: ``byte_size`` bytes of the client allocation
    opened as ``mapping`` on ``device_id``."""

    name: str
    device_id: int
    byte_size: int
    mapping: CudaMapping

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


def check_key(key: str) -> str:
    """The ``/dev/shm`` path of a POSIX shared-memory name; raises INTERNAL (Triton's answer to a
    key it cannot open) for a name that is not one."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", "..") or "\0" in name or len(name) > 255:
        raise internal(f"Unable to open shared memory region: '{key}'")
    return os.path.join(SHM_ROOT, name)


class SharedMemory:
    """The shared-memory regions of one server. Calls are cheap and safe from any thread (the
    registry is guarded by a lock: model threads may read views while the loop registers)."""

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed
        self._system: dict[str, SystemRegion] = {}
        self._cuda: dict[str, CudaRegion] = {}
        self._lock = threading.Lock()

    def _taken(self, name: str) -> TritonError | None:
        """ALREADY_EXISTS, in Triton's words, for a name either kind holds (call under the lock)."""
        if name in self._system or name in self._cuda:
            return TritonError(Code.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        return None

    def _add(self, regions: dict[str, Any], region: SystemRegion | CudaRegion) -> TritonError | None:
        """Register ``region`` in ``regions`` (its kind's), or the refusal, in Triton's words: a
        name in use by either kind, or ``MAX_REGIONS`` reached."""
        name = region.name
        with self._lock:
            refusal = self._taken(name)
            if refusal is None and len(regions) >= MAX_REGIONS:
                kind = "system" if regions is self._system else "CUDA"
                refusal = invalid_arg(f"failed to register shared memory region '{name}': at most {MAX_REGIONS} "
                                      f"{kind} shared memory regions can be registered")
            if refusal is None:
                regions[name] = region
        return refusal

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise unsupported(DISABLED)

    def check_allowed(self) -> None:
        """Raises TritonError UNSUPPORTED when client shared memory is off."""
        self._check_allowed()

    def check_register(self, name: str) -> None:
        """What a registration of ``name`` would be refused for before any object is opened:
        UNSUPPORTED when client shared memory is off, ALREADY_EXISTS for a name in use (the
        checks every worker would make alike; the rest are each worker's own)."""
        self._check_allowed()
        with self._lock:
            refusal = self._taken(name)
        if refusal is not None:
            raise refusal

    # ---- system regions --------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes from ``offset`` of the shared-memory object ``key`` as ``name``.

        Raises TritonError: UNSUPPORTED when client shared memory is off; ALREADY_EXISTS for a
        name in use; INTERNAL for a key that cannot be opened; INVALID_ARG for an empty name, a
        negative value, or a range beyond the object; INVALID_ARG past ``MAX_REGIONS``.
        """
        self._check_allowed()
        if not name:
            raise invalid_arg("failed to register shared memory region: the region needs a name")
        if offset < 0 or byte_size <= 0:
            raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        path = check_key(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise internal(f"Unable to open shared memory region: '{key}'") from None
        try:
            if offset + byte_size > os.fstat(fd).st_size:
                raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
            try:
                mapping = SharedRegionMapping(fd, offset + byte_size, mmap.MAP_SHARED,
                                              mmap.PROT_READ | mmap.PROT_WRITE)
            except (OSError, ValueError):
                raise internal(f"Unable to map shared memory region: '{key}'") from None
            try:
                mapping.attach_file(_read_only(fd))
            except OSError as e:  # out of descriptors (each region holds two: the mapping's and this one)
                mapping.close()
                raise internal(f"Unable to open shared memory region: '{key}': {e.strerror or e}") from None
        finally:
            os.close(fd)
        refusal = self._add(self._system, SystemRegion(name, key, offset, byte_size, mapping))
        if refusal is not None:
            mapping.release_file()
            mapping.close()
            raise refusal

    def unregister_system(self, name: str = "") -> None:
        """Forget ``name`` (every region when empty; an unknown name is not an error, as in
        Triton). The pages stay mapped while a request still holds a view of them."""
        self._check_allowed()
        with self._lock:
            regions = list(self._system.values()) if not name else [r for r in (self._system.get(name),) if r]
            for region in regions:
                del self._system[region.name]
        for region in regions:
            _close_when_unused(region.mapping)

    def system_status(self, name: str = "") -> list[dict[str, Any]]:
        """Every region's (or one region's) name, key, offset and byte size. Raises NOT_FOUND
        for an unknown ``name`` or a CUDA region's."""
        return self._status(name, self._system, self._cuda)

    def _status(self, name: str, regions: dict[str, Any], others: dict[str, Any]) -> list[dict[str, Any]]:
        """Status of ``regions`` (one kind's), in Triton's words: "system" / "CUDA" in prose,
        "cuda" in the not-found message."""
        self._check_allowed()
        kind, other = ("system", "CUDA") if regions is self._system else ("CUDA", "system")
        with self._lock:
            if not name:
                return [r.status() for r in sorted(regions.values(), key=lambda r: r.name)]
            region = regions.get(name)
            elsewhere = name in others
        if elsewhere:
            raise not_found(f"The region named '{name}' is registered as {other} shared memory, not {kind} "
                            "shared memory")
        if region is None:
            raise not_found(f"Unable to find {kind.lower()} shared memory region: '{name}'")
        return [region.status()]

    # ---- CUDA regions ----------------------------------------------------------------------

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open the cudaIpcMemHandle ``raw_handle`` (device ``device_id``) as ``name``; blocks
        while CUDA starts on first use, so front ends call it from a worker thread.

        Raises TritonError: UNSUPPORTED when client shared memory is off or this host cannot
        open CUDA memory (the message names the missing package, driver or device);
        ALREADY_EXISTS for a name in use (system or CUDA); INVALID_ARG, in Triton's words, for
        a malformed handle or values, a device that does not exist, a handle the driver
        refuses, or a ``byte_size`` beyond the allocation; INVALID_ARG past ``MAX_REGIONS``.
        """
        self._check_allowed()
        if not name or len(raw_handle) != CUDA_IPC_HANDLE_SIZE or device_id < 0 or byte_size <= 0:
            raise invalid_arg(REGISTER_REFUSED)
        with self._lock:
            taken = self._taken(name)
        if taken is not None:  # before the handle is opened, as Triton does
            raise taken
        mapping = open_runtime().open(name, raw_handle, device_id, byte_size)
        refusal = self._add(self._cuda, CudaRegion(name, device_id, byte_size, mapping))
        if refusal is not None:
            mapping.close()
            raise refusal

    def unregister_cuda(self, name: str = "") -> None:
        """Forget the CUDA region ``name`` (every one when empty; an unknown name is not an
        error). The client's memory stays open while a request still holds a copy or a view
        of it, and is closed when the last one is done."""
        self._check_allowed()
        with self._lock:
            if not name:
                self._cuda.clear()
            else:
                self._cuda.pop(name, None)

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        """Every CUDA region's (or one region's) name, device id and byte size. Raises
        NOT_FOUND for an unknown ``name`` or a system region's."""
        return self._status(name, self._cuda, self._system)

    # ---- tensors ---------------------------------------------------------------------------

    def _region(self, region_name: str, offset: int, byte_size: int) -> SystemRegion | CudaRegion:
        with self._lock:
            region: SystemRegion | CudaRegion | None = self._system.get(region_name) or self._cuda.get(region_name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{region_name}'")
        if offset < 0 or byte_size < 0 or offset + byte_size > region.byte_size:
            raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{region_name}'")
        return region

    def input_view(self, region: str, offset: int, byte_size: int) -> memoryview:
        """A read view of ``byte_size`` bytes at ``offset`` of ``region``: of a system region's
        mapping (no copy; it keeps the mapping alive), or of a :class:`DeviceCopy` of a CUDA
        region's bytes (one copy to the host; it keeps the client's memory open). Raises
        UNSUPPORTED when off, NOT_FOUND for an unknown region, INVALID_ARG for a range beyond
        it, INTERNAL when CUDA refuses the copy."""
        self._check_allowed()
        found = self._region(region, offset, byte_size)
        if isinstance(found, SystemRegion):
            start = found.offset + offset
            return memoryview(found.mapping)[start:start + byte_size].toreadonly()
        mapping = found.mapping
        copy = DeviceCopy.allocate(byte_size, mapping.device_id, mapping.pointer + offset, mapping)
        open_runtime().copy(copy.address, copy.pointer, byte_size, mapping.device_id)
        return copy.data.toreadonly()

    def output_view(self, region: str, offset: int, byte_size: int) -> memoryview | DeviceWindow:
        """Where an output is written (same checks as :meth:`input_view`): a writable view of
        a system region, or a :class:`DeviceWindow` of a CUDA region (``window[:n] = blob``
        copies to the device)."""
        self._check_allowed()
        found = self._region(region, offset, byte_size)
        if isinstance(found, SystemRegion):
            start = found.offset + offset
            return memoryview(found.mapping)[start:start + byte_size]
        return DeviceWindow(open_runtime(), found.mapping, offset, byte_size)

    def check_outputs(self, outputs: dict[str, dict[str, Any]]) -> None:
        """Check the regions of outputs to be written (their requested parameters) before the
        model runs. Raises what :meth:`output_view` raises, and INVALID_ARG for bad parameters."""
        for name, params in outputs.items():
            self.output_view(*shm_parameters(params, f"output '{name}'"))

    def close(self) -> None:
        """Forget every region (at shutdown); mappings still in use are unmapped when freed."""
        with self._lock:
            regions = list(self._system.values())
            self._system.clear()
            self._cuda.clear()  # each handle closes when the last request holding it is done
        for region in regions:
            _close_when_unused(region.mapping)


def _read_only(fd: int) -> int:
    """A read-only descriptor of the object open as ``fd`` (the same object even if its name is
    unlinked or re-created meanwhile); a duplicate of ``fd`` where /proc is not available."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return os.dup(fd)


def _close_when_unused(mapping: mmap.mmap) -> None:
    if isinstance(mapping, SharedRegionMapping):
        mapping.release_file()  # no new reference to the region leaves the server from now on
    try:
        mapping.close()
    except BufferError:  # a request still holds a view: unmapped when the last view is freed
        pass
