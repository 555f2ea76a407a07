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

Both ends are trusted (the server and the model process it started); nothing here is a
security boundary. :func:`request_to_wire` and friends turn trident's core types into
``(message, arrays)`` and back.
"""

from __future__ import annotations

import array as _array
import mmap
import os
import pickle
import socket
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from trident.errors import Code, TritonError
from trident.protocol import datatypes
from trident.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

RING_HEADER = 64
ALIGN = 64
MAX_PACKET = 60_000
RECV_BUFFER = 65_536
_MAX_FDS = 4
_BIG = "__big__"


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


class Channel:
    """One end of a model-process connection. ``send`` is thread-safe; ``recv`` is called by
    one reader thread."""

    def __init__(self, sock: socket.socket, out_ring: Ring, in_ring: Ring) -> None:
        self.sock = sock
        self.out_ring = out_ring
        self.in_ring = in_ring
        self._send_lock = threading.Lock()
        self.closed = False

    def send(self, message: Any, arrays: Sequence[np.ndarray] = ()) -> None:
        """Send ``message`` with ``arrays`` (numpy arrays; object arrays hold BYTES elements).

        Raises ChannelClosed when the other end is gone.
        """
        encoded = [_encode(a) for a in arrays]
        sizes = [_align(raw.nbytes) for _, raw in encoded]
        total = sum(sizes)
        fds: list[int] = []
        with self._send_lock:
            if self.closed:
                raise ChannelClosed("the channel is closed")
            try:
                where: tuple[Any, ...] = ()
                descs: list[tuple[Any, ...]] = []
                if arrays and not total:  # only empty tensors: nothing to copy
                    descs = [(*desc, 0, 0) for desc, _ in encoded]
                    where = ("empty",)
                elif total:
                    slot = self.out_ring.alloc(total)
                    if slot is not None:
                        base, end = slot
                        where = ("ring", base, end)
                        target = self.out_ring.buffer(base, total)
                    else:
                        fd = create_memfd("trident-tensors", total)
                        fds.append(fd)
                        mm = mmap.mmap(fd, total)
                        target = np.ndarray((total,), np.uint8, buffer=mm)
                        where = ("fd", 0)
                    offset = 0
                    for (desc, raw), size in zip(encoded, sizes, strict=True):
                        target[offset:offset + raw.nbytes] = raw
                        descs.append((*desc, offset, raw.nbytes))
                        offset += size
                    del target
                    if where[0] == "fd":
                        mm.close()
                packet = pickle.dumps((message, descs, where), protocol=pickle.HIGHEST_PROTOCOL)
                if len(packet) > MAX_PACKET:
                    fd = create_memfd("trident-message", len(packet))
                    os.pwrite(fd, packet, 0)
                    fds.append(fd)
                    packet = pickle.dumps((_BIG, len(packet)))
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _array.array("i", fds))] if fds else []
                self.sock.sendmsg([packet], ancillary)
            except (BrokenPipeError, ConnectionResetError, OSError) as e:
                raise ChannelClosed(str(e)) from None
            finally:
                for fd in fds:
                    os.close(fd)

    def recv(self) -> tuple[Any, list[np.ndarray]] | None:
        """The next ``(message, arrays)``; None when the other end closed the connection."""
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
                obj = pickle.loads(os.pread(fds.pop(), obj[1], 0))
            message, descs, where = obj
            arrays: list[np.ndarray] = []
            if where and where[0] == "empty":
                arrays = [_decode(tuple(desc), np.empty(0, np.uint8)) for *desc, _, _ in descs]
            elif where and where[0] == "ring":
                base = where[1]
                for *desc, offset, n in descs:
                    arrays.append(_decode(tuple(desc), self.in_ring.buffer(base + offset, n)))
                self.in_ring.free(where[2])
            elif where:
                total = max(offset + n for *_, offset, n in descs) if descs else 1
                mm = mmap.mmap(fds[0], total)
                try:
                    raw = np.ndarray((total,), np.uint8, buffer=mm)
                    for *desc, offset, n in descs:
                        arrays.append(_decode(tuple(desc), raw[offset:offset + n]))
                    del raw
                finally:
                    mm.close()
            return message, arrays
        finally:
            for fd in fds:
                os.close(fd)

    def close(self) -> None:
        """Shut the socket down (a blocked ``recv`` returns None) and release it."""
        with self._send_lock:
            self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# ---- trident's core types on the wire ----


def tensors_to_wire(tensors: Sequence[Tensor], arrays: list[np.ndarray]) -> list[tuple[str, str]]:
    out = []
    for t in tensors:
        arrays.append(t.data)
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
