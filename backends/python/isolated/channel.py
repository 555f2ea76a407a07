"""The transport between the server and a model process: messages over a socket, tensors in
shared memory.

* Control messages are pickled Python values, one ``AF_UNIX`` ``SOCK_SEQPACKET`` packet each
  (message boundaries kept by the kernel). A header larger than :data:`MAX_PACKET` travels in a
  ``memfd`` of its own.
* Tensor bytes go into the sender's :class:`Ring`: a ``memfd`` mapped by both processes, used as a
  FIFO. The sender allocates a message's tensors contiguously, the receiver copies them out as
  soon as it reads the message and hands the space back by advancing the ring's tail counter
  (in the ring's first 8 bytes). A message that does not fit in the free space gets a one-off
  ``memfd`` passed with the packet (``SCM_RIGHTS``), so a sender never waits for the receiver.
* Client shared memory is passed by reference, not copied. An input the front end read from a
  registered system shared-memory region is a numpy view of the server's mapping of it (a
  :class:`~trident.types.SharedRegionMapping`; :func:`~trident.types.shared_region_of` finds
  the region and offset). Such an array (C-contiguous, not BYTES, not empty) travels as
  ``("R", dtype, shape, serial, offset, byte size)``: the first time a region goes to a
  process, the packet also carries a read-only descriptor of the region's object
  (``SCM_RIGHTS``; the server keeps one open while the region is registered, so a client that
  unlinks or re-creates the name cannot make the process map something else). The receiver
  checks the object is at least as large as the registered range, maps it read-only
  (``PROT_READ``), caches the mapping under the serial and gives the model a read-only numpy
  view, no copy. It checks each reference against its mapping (a bad one fails the message's
  requests with :class:`UnreadableTensors`, never a read out of bounds). Anything else (BYTES,
  non-contiguous, a region unregistered meanwhile, more than :data:`MAX_NEW_REGIONS` new
  regions in one message) is copied as before.
* Lifecycle of those mappings: a serial names one registration (registering the name again
  gives a new serial and a new file), so a mapping is never stale. The sender remembers which
  serials the receiver has mapped; at every packet, and every second when idle
  (:meth:`Channel.release_regions`), it tells the receiver to forget those unregistered since,
  and the least recently used beyond :data:`MAX_PEER_REGIONS`. The receiver then closes its
  mapping; while a model still holds a view (a running request, or an array it kept) Python's
  buffer rules keep the pages mapped until the last view is freed, so nothing can read
  unmapped memory and nothing stays mapped longer than that. A restarted process starts with
  no mappings. As in the server itself, a client that shrinks the object below the registered
  range after registration makes reads fault (here: the model process dies and is restarted).

Both ends are trusted (the server and the model process it started); nothing here is a
security boundary. :func:`request_to_wire` and friends turn trident's core types into
``(message, arrays)`` and back.
"""

from __future__ import annotations

import array as _array
import gc
import mmap
import os
import pickle
import socket
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from trident.backends.python._cuda import to_host
from trident.backends.python._dlpack import DeviceView
from trident.backends.python._pb_base import TritonModelException
from trident.errors import Code, TritonError
from trident.protocol import datatypes
from trident.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    SharedRegionMapping,
    Tensor,
    shared_region_of,
)

RING_HEADER = 64
ALIGN = 64
MAX_PACKET = 60_000
RECV_BUFFER = 65_536
_BIG = "__big__"
_REGIONS = "__regions__"  # a packet that only maps/unmaps regions (recv reads on)
MAX_NEW_REGIONS = 16  # regions first mapped by one message (more are copied this time)
MAX_PEER_REGIONS = 256  # regions a model process keeps mapped (least recently used go first)
_MAX_FDS = MAX_NEW_REGIONS + 2  # + a one-off tensor memfd and a large header's


class ChannelClosed(Exception):
    """The other process has gone away (or the channel was closed)."""


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def create_memfd(name: str, size: int) -> int:
    """An anonymous shared-memory file of ``size`` bytes (close-on-exec)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(size, 1))
    except BaseException:
        os.close(fd)
        raise
    return fd


class Ring:
    """One direction's shared ring (see the module docstring). The producer side calls
    :meth:`alloc` under the channel's send lock; the consumer calls :meth:`free` in order."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.mm = mmap.mmap(fd, RING_HEADER + size)
        self._tail = np.ndarray((1,), np.uint64, buffer=self.mm, offset=0)  # bytes freed so far
        self._data = np.ndarray((size,), np.uint8, buffer=self.mm, offset=RING_HEADER)
        self.head = 0  # producer only: bytes allocated so far (including skipped ends)

    def alloc(self, n: int) -> tuple[int, int] | None:
        """(offset, end counter) of ``n`` contiguous free bytes, or None when they do not fit."""
        n = _align(n)
        if n > self.size:
            return None
        tail = int(self._tail[0])
        pos = self.head % self.size
        skip = self.size - pos if pos + n > self.size else 0
        if self.head + skip + n - tail > self.size:
            return None
        self.head += skip + n
        return (0 if skip else pos), self.head

    def free(self, end: int) -> None:
        self._tail[0] = end

    def buffer(self, offset: int, n: int) -> np.ndarray:
        return self._data[offset:offset + n]

    def close(self) -> None:
        del self._tail, self._data
        try:
            self.mm.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with the process
            pass


def _encode(array: np.ndarray) -> tuple[tuple[Any, ...], np.ndarray]:
    if array.dtype == object:
        flat = np.frombuffer(datatypes.serialize_bytes(array), np.uint8)
        return ("B", "", tuple(array.shape)), flat
    arr = np.ascontiguousarray(array).reshape(-1)
    return ("N", arr.dtype.str, tuple(array.shape)), arr.view(np.uint8)


def _decode(desc: tuple[Any, ...], raw: np.ndarray) -> np.ndarray:
    kind, dtype, shape = desc
    if kind == "B":
        return datatypes.deserialize_bytes(raw.tobytes()).reshape(shape)
    return raw.view(np.dtype(dtype)).reshape(shape).copy()


class UnreadableTensors(Exception):
    """A message arrived whose tensors cannot be read (a shared-memory reference this process
    cannot resolve, or out of its mapping's bounds). The packet was consumed; ``message`` is
    its control message, so the receiver can fail the request(s) it carried."""

    def __init__(self, message: Any, reason: str) -> None:
        super().__init__(reason)
        self.message = message
        self.reason = reason


def _close_mapping(mapping: mmap.mmap) -> bool:
    """Unmap now; False when a tensor still views it (then it is unmapped when the last view
    is freed: the caller drops its reference)."""
    try:
        mapping.close()
    except BufferError:
        return False
    return True


class Channel:
    """One end of a model-process connection. ``send`` is thread-safe; ``recv`` is called by
    one reader thread."""

    def __init__(self, sock: socket.socket, out_ring: Ring, in_ring: Ring) -> None:
        self.sock = sock
        self.out_ring = out_ring
        self.in_ring = in_ring
        self._send_lock = threading.Lock()
        self.closed = False
        # sender side: the client regions the other end has mapped (serial -> the server's
        # mapping), least recently used first; guarded by the send lock
        self._peer_regions: OrderedDict[int, SharedRegionMapping] = OrderedDict()
        self._forget: list[int] = []  # serials the other end is to unmap, sent with the next packet
        # receiver side: the regions this end has mapped (serial -> read-only mapping); reader only
        self.regions: dict[int, mmap.mmap] = {}

    def _released_regions(self) -> None:
        """Forget (send lock held) the regions unregistered since; the next packet tells the peer."""
        released = [serial for serial, mapping in self._peer_regions.items() if mapping.file_released]
        for serial in released:
            del self._peer_regions[serial]
        self._forget += released

    def _evict_regions(self, keep: set[int]) -> None:
        """Forget (send lock held) the least recently used regions beyond
        :data:`MAX_PEER_REGIONS`, never one in ``keep``; the next packet tells the peer."""
        for serial in list(self._peer_regions):
            if len(self._peer_regions) <= MAX_PEER_REGIONS:
                break
            if serial not in keep:
                del self._peer_regions[serial]
                self._forget.append(serial)

    def send(self, message: Any, arrays: Sequence[np.ndarray] = ()) -> None:
        """Send ``message`` with ``arrays`` (numpy arrays; object arrays hold BYTES elements).

        An array that views a registered client shared-memory region (see the module
        docstring) travels as a reference to the region; the others are copied.

        Raises ChannelClosed when the other end is gone.
        """
        found = [shared_region_of(a) for a in arrays]
        encoded = [None if f is not None else _encode(a) for a, f in zip(arrays, found, strict=True)]
        fds: list[int] = []
        # the references: regions the other end has mapped, or maps with this packet
        refs: list[tuple[int, int] | None] = [None] * len(arrays)
        new: list[tuple[int, int, int]] = []  # (serial, index in fds, length)
        used: set[int] = set()
        with self._send_lock:
            if self.closed:
                raise ChannelClosed("the channel is closed")
            try:
                if self._peer_regions:
                    self._released_regions()
                for i, f in enumerate(found):
                    if f is None:
                        continue
                    mapping, offset = f
                    serial = mapping.serial
                    if serial in self._peer_regions:
                        self._peer_regions.move_to_end(serial)
                    else:
                        fd = mapping.dup_file() if len(new) < MAX_NEW_REGIONS else None
                        if fd is None:  # unregistered meanwhile (or too many at once): copy it
                            encoded[i] = _encode(arrays[i])
                            continue
                        new.append((serial, len(fds), mapping.length))
                        fds.append(fd)
                        self._peer_regions[serial] = mapping
                    used.add(serial)
                    refs[i] = (serial, offset)
                if len(self._peer_regions) > MAX_PEER_REGIONS:
                    self._evict_regions(used)
                regions = (list(self._forget), new) if self._forget or new else None

                sizes = [0 if e is None else _align(e[1].nbytes) for e in encoded]
                total = sum(sizes)
                where: tuple[Any, ...] = ()
                target: np.ndarray | None = None
                if total:
                    slot = self.out_ring.alloc(total)
                    if slot is not None:
                        base, end = slot
                        where = ("ring", base, end, total)
                        target = self.out_ring.buffer(base, total)
                    else:
                        fd = create_memfd("trident-tensors", total)
                        where = ("fd", len(fds), total)
                        fds.append(fd)
                        mm = mmap.mmap(fd, total)
                        target = np.ndarray((total,), np.uint8, buffer=mm)
                descs: list[tuple[Any, ...]] = []
                offset = 0
                for array, e, ref, size in zip(arrays, encoded, refs, sizes, strict=True):
                    if ref is not None:  # (kind, dtype, shape, serial, offset in the region, bytes)
                        descs.append(("R", array.dtype.str, tuple(array.shape), ref[0], ref[1], array.nbytes))
                        continue
                    assert e is not None
                    desc, raw = e
                    if raw.nbytes:
                        assert target is not None
                        target[offset:offset + raw.nbytes] = raw
                    descs.append((*desc, 0, offset, raw.nbytes))
                    offset += size
                del target
                if where and where[0] == "fd":
                    mm.close()
                packet = pickle.dumps((message, descs, where, regions), protocol=pickle.HIGHEST_PROTOCOL)
                if len(packet) > MAX_PACKET:
                    fd = create_memfd("trident-message", len(packet))
                    os.pwrite(fd, packet, 0)
                    fds.append(fd)  # always the last descriptor
                    packet = pickle.dumps((_BIG, len(packet)))
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _array.array("i", fds))] if fds else []
                self.sock.sendmsg([packet], ancillary)
                if regions:
                    self._forget.clear()
            except BaseException as e:
                # the other end never saw the regions this packet would have mapped
                for serial, _, _ in new:
                    self._peer_regions.pop(serial, None)
                if isinstance(e, (BrokenPipeError, ConnectionResetError, OSError)):
                    raise ChannelClosed(str(e)) from None
                raise
            finally:
                for fd in fds:
                    os.close(fd)

    def release_regions(self) -> None:
        """Tell the other end to unmap the regions unregistered since the last message (the
        server calls this now and then, so an idle model process does not keep them mapped).

        Raises ChannelClosed when the other end is gone.
        """
        with self._send_lock:
            if self.closed or not (self._forget or any(m.file_released for m in self._peer_regions.values())):
                return
            self._released_regions()
            try:
                self.sock.sendmsg([pickle.dumps((_REGIONS, [], (), (self._forget, [])))])
            except (BrokenPipeError, ConnectionResetError, OSError) as e:
                raise ChannelClosed(str(e)) from None
            self._forget.clear()

    def recv(self) -> tuple[Any, list[np.ndarray]] | None:
        """The next ``(message, arrays)``; None when the other end closed the connection.

        Raises UnreadableTensors (the packet consumed) when a shared-memory reference cannot
        be resolved or lies outside its region's mapping.
        """
        while True:
            got = self._recv_one()
            if got is None or not (isinstance(got[0], str) and got[0] == _REGIONS):
                return got

    def _recv_one(self) -> tuple[Any, list[np.ndarray]] | None:
        try:
            data, ancdata, _flags, _addr = self.sock.recvmsg(RECV_BUFFER, socket.CMSG_SPACE(_MAX_FDS * 4))
        except OSError:
            return None
        if not data:
            return None
        fds: list[int] = []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(_array.array("i", payload[: len(payload) - len(payload) % 4]))
        try:
            obj = pickle.loads(data)
            if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == _BIG:
                obj = pickle.loads(os.pread(fds[-1], obj[1], 0))
            message, descs, where, regions = obj
            failed = self._update_regions(regions, fds) if regions else {}
            raw: np.ndarray | None = None
            mm: mmap.mmap | None = None
            if where and where[0] == "ring":
                raw = self.in_ring.buffer(where[1], where[3])
            elif where:
                mm = mmap.mmap(fds[where[1]], where[2])
                raw = np.ndarray((where[2],), np.uint8, buffer=mm)
            arrays: list[np.ndarray] = []
            error = ""
            try:
                for kind, dtype, shape, serial, offset, n in descs:
                    if kind == "R":
                        array, why = self._region_array(dtype, shape, serial, offset, n, failed)
                        error = error or why
                        arrays.append(array)
                    elif n:
                        assert raw is not None
                        arrays.append(_decode((kind, dtype, shape), raw[offset:offset + n]))
                    else:
                        arrays.append(_decode((kind, dtype, shape), np.empty(0, np.uint8)))
            finally:
                del raw
                if mm is not None:
                    mm.close()
                if where and where[0] == "ring":
                    self.in_ring.free(where[2])
            if error:
                raise UnreadableTensors(message, error)
            return message, arrays
        finally:
            for fd in fds:
                os.close(fd)

    def _update_regions(self, regions: tuple[list[int], list[tuple[int, int, int]]],
                        fds: list[int]) -> dict[int, str]:
        """Unmap the regions the sender forgot, map the new ones read-only; the serials that
        could not be mapped, with why."""
        forget, new = regions
        lingering = False
        for serial in forget:
            mapping = self.regions.pop(serial, None)
            if mapping is not None and not _close_mapping(mapping):
                lingering = True
            mapping = None
        if lingering:  # a view may be held only by a reference cycle: let it go now, not some day
            gc.collect()
        failed: dict[int, str] = {}
        for serial, index, length in new:
            old = self.regions.pop(serial, None)
            if old is not None:
                _close_mapping(old)
            try:
                size = os.fstat(fds[index]).st_size
                if size < length:  # mapping past the end of the file would fault when read
                    raise ValueError(f"the object has {size} bytes, fewer than the {length} registered")
                self.regions[serial] = mmap.mmap(fds[index], length, mmap.MAP_SHARED, mmap.PROT_READ)
            except (OSError, ValueError, IndexError) as e:
                failed[serial] = f"shared-memory region #{serial} could not be mapped in the model process: {e}"
        return failed

    def _region_array(self, dtype: str, shape: tuple[int, ...], serial: int, offset: int, n: int,
                      failed: dict[int, str]) -> tuple[np.ndarray, str]:
        """A read-only view of ``n`` bytes at ``offset`` of region ``serial``'s mapping, or an
        empty array and why not."""
        nothing = np.empty(0, np.uint8)
        mapping = self.regions.get(serial)
        if mapping is None:
            return nothing, failed.get(serial) or (
                f"an input refers to shared-memory region #{serial}, which the model process has not mapped")
        size = len(mapping)
        if offset < 0 or n <= 0 or offset + n > size:
            return nothing, (f"an input refers to bytes {offset}..{offset + n} of shared-memory region #{serial}, "
                             f"outside the {size} bytes the model process has mapped")
        try:
            dt = np.dtype(dtype)
            count = 1
            for d in shape:
                count *= int(d)
            if count * dt.itemsize != n or dt.hasobject:
                raise ValueError(f"{n} bytes do not hold {shape} {dt} elements")
            # through a memoryview: it holds the mapping's buffer export, so closing the mapping
            # fails (BufferError) while the array lives (np.ndarray(buffer=...) would not hold it)
            view = memoryview(mapping)[offset:offset + n]
            return np.frombuffer(view, dt).reshape(tuple(shape)), ""
        except (TypeError, ValueError) as e:
            return nothing, f"an input in shared-memory region #{serial} cannot be read: {e}"

    def close(self) -> None:
        """Shut the socket down (a blocked ``recv`` returns None) and release it."""
        with self._send_lock:
            self.closed = True
            self._peer_regions.clear()
            self._forget.clear()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        regions, self.regions = self.regions, {}
        for mapping in regions.values():
            _close_mapping(mapping)


# ---- trident's core types on the wire ----


def tensors_to_wire(tensors: Sequence[Tensor], arrays: list[np.ndarray]) -> list[tuple[str, str]]:
    """``(name, datatype)`` of each tensor; their arrays are appended to ``arrays``. A tensor in
    GPU memory (a DeviceView: a model process gets CPU tensors) is copied to the host. Raises
    TritonError(INTERNAL) when that copy is impossible."""
    out = []
    for t in tensors:
        data = t.data
        if type(data) is DeviceView:
            try:
                buffer = data.device_buffer
                if buffer is None:
                    raise TritonError(Code.INTERNAL, f"tensor '{t.name}': a device view without its device buffer")
                data = to_host(buffer, f"tensor '{t.name}' in {buffer.describe()}: a copy to the host")
            except TritonModelException as e:
                raise TritonError(Code.INTERNAL, str(e)) from None
        arrays.append(data)
        out.append((t.name, t.datatype))
    return out


def tensors_from_wire(specs: list[tuple[str, str]], arrays: list[np.ndarray], start: int) -> list[Tensor]:
    return [Tensor(name, dt, tuple(int(d) for d in arrays[start + i].shape), arrays[start + i])
            for i, (name, dt) in enumerate(specs)]


def request_to_wire(request: InferenceRequest, arrays: list[np.ndarray]) -> dict[str, Any]:
    """A request as a picklable dict; its tensors are appended to ``arrays``."""
    start = len(arrays)
    return {
        "model": request.model_name, "version": request.model_version, "id": request.id,
        "outputs": [o.name for o in request.outputs], "parameters": dict(request.parameters),
        "inputs": tensors_to_wire(request.inputs, arrays), "start": start,
    }


def request_from_wire(meta: dict[str, Any], arrays: list[np.ndarray],
                      cls: type[InferenceRequest] = InferenceRequest) -> InferenceRequest:
    return cls(
        model_name=meta["model"], inputs=tensors_from_wire(meta["inputs"], arrays, meta["start"]),
        model_version=meta["version"], id=meta["id"],
        outputs=[RequestedOutput(n) for n in meta["outputs"]], parameters=meta["parameters"],
    )


def response_to_wire(response: InferenceResponse, arrays: list[np.ndarray]) -> dict[str, Any]:
    """A response as a picklable dict; its tensors are appended to ``arrays``."""
    error = response.error
    start = len(arrays)
    return {
        "outputs": tensors_to_wire(response.outputs, arrays), "start": start,
        "parameters": dict(response.parameters), "final": response.final, "flag_only": response.flag_only,
        "error": None if error is None else (error.code.name, error.message),
    }


def response_from_wire(meta: dict[str, Any], arrays: list[np.ndarray]) -> InferenceResponse:
    error = meta["error"]
    return InferenceResponse(
        outputs=tensors_from_wire(meta["outputs"], arrays, meta["start"]),
        parameters=meta["parameters"], final=meta["final"], flag_only=meta.get("flag_only", False),
        error=None if error is None else TritonError(Code[error[0]], error[1]),
    )
