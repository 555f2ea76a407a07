"""The one request/response type that flows from front end to backend and back.

Front ends decode the wire into :class:`InferenceRequest` (tensors as numpy arrays, decoded
once at the edge), schedulers and backends pass the same objects along, and responses come
back as :class:`InferenceResponse` through the request's response channel.
:class:`SharedRegionMapping` / :func:`shared_region_of` let a backend see that an input is a
view of a client's shared-memory region (the process-isolated Python backend passes such
inputs to the model process by reference).
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trident.errors import TritonError
from trident.protocol import datatypes

ParamValue = bool | int | float | str

log = logging.getLogger("trident")


@dataclass(eq=False, slots=True)
class Tensor:
    """A named tensor. ``data`` is a numpy array whose shape equals ``shape``.

    BYTES data is an object array of ``bytes``; BF16 data is a ``uint16`` array of bfloat16
    bit patterns (see :mod:`trident.protocol.datatypes`).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, ParamValue] = field(default_factory=dict)

    @classmethod
    def from_numpy(cls, name: str, array: np.ndarray, datatype: str | None = None) -> Tensor:
        """Wrap an array without copying (BYTES from str/bytes arrays are converted)."""
        dt = datatype or datatypes.datatype_of(array)
        if dt == "BF16" and array.dtype.name == "bfloat16":
            array = array.view(np.uint16)
        elif dt == "BYTES" and array.dtype != object:
            flat = datatypes.to_bytes_array(array.reshape(-1).tolist())
            array = flat.reshape(array.shape)
        return cls(name, dt, tuple(int(d) for d in array.shape), array)

    @property
    def nbytes(self) -> int:
        if self.datatype == "BYTES":
            return sum(len(x) for x in self.data.reshape(-1)) + 4 * self.data.size
        return int(self.data.nbytes)


_TENSOR_DATA = Tensor.__dict__["data"]  # the slot that holds a Tensor's array


class WireBytesTensor(Tensor):
    """A BYTES tensor held in its wire form (:class:`~trident.protocol.datatypes.WireBytes`):
    its object array is made the first time ``data`` is read (in the reader's thread; a model
    reading it in its instance thread keeps that work off the event loop) and kept. ``wire``
    stays the elements' exact wire form, so encoders send it as it came without reading
    ``data``; setting ``data`` drops it (``wire`` is None after).

    Large BYTES inputs (``WIRE_MIN`` elements and up) of the binary extension and of gRPC
    ``raw_input_contents`` are decoded to this; an output a Python model returns is this when it
    holds exactly the objects of such an input, in order (see backends/python/_convert).
    """

    __slots__ = ("wire",)

    def __init__(self, name: str, shape: tuple[int, ...], wire: datatypes.WireBytes,
                 parameters: dict[str, ParamValue] | None = None, data: np.ndarray | None = None) -> None:
        self.name = name
        self.datatype = "BYTES"
        self.shape = shape
        self.parameters = {} if parameters is None else parameters
        self.wire: datatypes.WireBytes | None = wire
        if data is not None:
            _TENSOR_DATA.__set__(self, data)

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        try:
            return _TENSOR_DATA.__get__(self, Tensor)  # type: ignore[no-any-return]
        except AttributeError:
            assert self.wire is not None
            array = self.wire.objects().reshape(self.shape)
            _TENSOR_DATA.__set__(self, array)
            return array

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self.wire = None
        _TENSOR_DATA.__set__(self, value)

    @property
    def nbytes(self) -> int:
        return self.wire.buffer.nbytes if self.wire is not None else Tensor.nbytes.__get__(self)  # type: ignore[attr-defined,no-any-return]


def release_objects(tensors: list[Tensor]) -> None:
    """Let go of the tensors' large object arrays (BYTES) a slice of ``FILL_SLICE`` elements at
    a time, where nothing else can see them: freeing such an array decrefs every element in one
    call that holds the GIL (15M elements: ~25 ms even when all are one object; ~0.5 s when each
    is its own), a stall for every other client; numpy's ``resize`` of the array that owns the
    memory lets go of the elements it drops, so shrinking it a slice at a time frees the same
    in calls of a few ms. For a worker thread, once a request is answered.

    Only where ``tensors`` (a list held by one object, the caller's request or response), the
    tensor, its array and the array that owns the memory are each held once (reference counts:
    the one holder, plus this call's own): a tensor whose array is shared (a cached answer, a
    view a model kept) is left whole. Such a tensor's data is an empty array after. A
    WireBytesTensor's elements are not made for this."""
    if sys.getrefcount(tensors) > 3:  # its holder, the caller's argument, ours
        return
    for tensor in _held_once(tensors):
        data = _made(tensor)
        if type(data) is not np.ndarray or data.dtype != object or data.size <= datatypes.FILL_SLICE \
                or sys.getrefcount(data) > 3:  # the slot, the local, ours
            continue
        owner = data if data.base is None else data.base
        if type(owner) is not np.ndarray or not owner.flags.owndata or not owner.flags.c_contiguous \
                or (owner is not data and sys.getrefcount(owner) > 3):  # the view's base, the local, ours
            continue
        _TENSOR_DATA.__set__(tensor, _NO_OBJECTS)
        del data
        if sys.getrefcount(owner) <= 2:  # the local, ours (this module is never compiled: counts hold)
            datatypes.shrink(owner)


_NO_OBJECTS = np.empty(0, dtype=object)


def _held_once(tensors: list[Tensor]) -> Iterator[Tensor]:
    """The tensors of ``tensors`` that nothing but the list holds."""
    for tensor in tensors:
        if sys.getrefcount(tensor) <= 3:  # the list, the loop, ours
            yield tensor


def _made(tensor: Tensor) -> Any:
    """A tensor's data, or None when it was never made (a WireBytesTensor's elements)."""
    try:
        return _TENSOR_DATA.__get__(tensor, Tensor)
    except AttributeError:
        return None


def let_go(holder: list[Any]) -> None:
    """Let go of a request and its response (``holder`` holds them, or None for either, and is
    emptied), their large object arrays a slice at a time (:func:`release_objects`). For a
    worker thread, once the request is answered. Never raises (a fault is logged: the request
    is answered, and its objects go whole)."""
    request, response = holder
    holder.clear()
    try:
        if response is not None and request is not None:
            _unshare(request.inputs, response.outputs)
        if response is not None:
            release_objects(response.outputs)
        if request is not None:
            release_objects(request.inputs)
    except Exception:
        log.exception("letting go of a request's objects")


def _unshare(inputs: list[Tensor], outputs: list[Tensor]) -> None:
    """Inputs whose large object array is also an output's (a model that answers with its
    input's array) let go of it, where nothing else can see them (counted as in
    :func:`release_objects`), so that the output's tensor holds it alone and
    :func:`release_objects` can let go of its elements a slice at a time."""
    if sys.getrefcount(inputs) > 3:  # its holder, the caller's argument, ours
        return
    answered: set[int] = set()
    for tensor in outputs:
        data = _made(tensor)
        if type(data) is np.ndarray and data.dtype == object and data.size > datatypes.FILL_SLICE:
            answered.add(id(data))
    if not answered:
        return
    for tensor in _held_once(inputs):
        if id(_made(tensor)) in answered:
            _TENSOR_DATA.__set__(tensor, _NO_OBJECTS)


def wire_of(tensor: Tensor) -> datatypes.WireBytes | None:
    """A BYTES tensor's exact wire form when it holds one (no element object is made)."""
    return tensor.wire if type(tensor) is WireBytesTensor else None


@dataclass(eq=False, slots=True)
class RequestedOutput:
    """An output the client asked for, with its parameters (binary_data, classification...)."""

    name: str
    parameters: dict[str, ParamValue] = field(default_factory=dict)


#: guards every request's cancel flag against its on_cancel callbacks: one lock for all requests
#: (held for a few instructions, and only by cancel() and on_cancel(): no allocation per request)
_CANCEL_LOCK = threading.Lock()


@dataclass(eq=False, slots=True)
class InferenceRequest:
    """One inference request as every layer of trident sees it.

    ``model_version`` is the version string from the wire ("" = chosen by the version policy).
    ``outputs`` empty means "every output". ``cancelled`` is set (never cleared) when the
    client goes away or the request's deadline passes; schedulers drop such requests before
    batch assembly, backends may read it, and code that must act on it registers
    :meth:`on_cancel` (called once, when it is set) instead of polling.
    """

    model_name: str
    inputs: list[Tensor]
    model_version: str = ""
    id: str = ""
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    # runtime state, owned by the server
    cancelled: bool = False
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    trace: Any = None
    #: where the request's responses go (trident.server.execution.Responder), set when it is queued
    responder: Any = None
    #: also receives the compute durations of this request when it succeeds (an ensemble step
    #: reports into its ensemble request; ``add(input_ns, infer_ns, output_ns)``)
    stats_sink: Any = None
    #: > 0: a decoupled model sending from its own thread blocks while this many of the
    #: request's responses are waiting to be consumed (ensemble ``max_inflight_requests``)
    response_window: int = 0
    #: when the request must be answered by, on trio's clock (``trio.current_time()``); None: no
    #: deadline. Set by the gRPC front end (``grpc-timeout``), by the server from the ``timeout``
    #: parameter, and inherited by ensemble steps and BLS children (the earlier of the two).
    #: No work of the request starts after it (README "Deadlines").
    deadline: float | None = None
    _on_cancel: list[Callable[[], None]] | None = field(default=None, repr=False)

    def input(self, name: str) -> Tensor | None:
        for t in self.inputs:
            if t.name == name:
                return t
        return None

    def cancel(self) -> None:
        """Mark the request cancelled and call the :meth:`on_cancel` callbacks, once
        (idempotent, callable from any thread; the callbacks run on the caller's thread)."""
        if self.cancelled:
            return
        with _CANCEL_LOCK:
            if self.cancelled:
                return
            self.cancelled = True
            callbacks, self._on_cancel = self._on_cancel, None
        for callback in callbacks or ():
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when the request is cancelled (now, on this thread, if it already
        is). It must not block: it runs on the thread that cancels (often the event loop)."""
        with _CANCEL_LOCK:
            if not self.cancelled:
                if self._on_cancel is None:
                    self._on_cancel = []
                self._on_cancel.append(callback)
                return
        callback()




@dataclass(eq=False, slots=True)
class InferenceResponse:
    """A response (or one of the 0..N responses of a decoupled model).

    ``error`` set means the response carries only that error. ``final`` marks the last
    response of a request (Triton's COMPLETE_FINAL flag / ``triton_final_response``).
    """

    model_name: str = ""
    model_version: str = ""
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    error: TritonError | None = None
    final: bool = True
    #: a flag-only final response (Triton's COMPLETE_FINAL without a response): no outputs; the
    #: front ends send nothing for it unless the client asked for empty final responses
    flag_only: bool = False

    def output(self, name: str) -> Tensor | None:
        for t in self.outputs:
            if t.name == name:
                return t
        return None


class TensorSpec:
    """A model input or output as its config declares it (``labels``: its classification labels)."""

    __slots__ = ("name", "datatype", "dims", "optional", "labels")

    def __init__(self, name: str, datatype: str, dims: list[int], optional: bool = False) -> None:
        self.name = name
        self.datatype = datatype
        self.dims = dims  # without the batch dimension
        self.optional = optional
        self.labels: list[str] | None = None


# ---- typed snapshots of the server's state (trident.protocol encodes them for each wire) ----


@dataclass(frozen=True, slots=True)
class Duration:
    count: int = 0
    ns: int = 0


@dataclass(frozen=True, slots=True)
class BatchStats:
    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """Triton's ModelStatistics for one model version (last_inference in ms since the epoch)."""

    name: str
    version: str
    last_inference: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    cache_hit: Duration = Duration()
    cache_miss: Duration = Duration()
    batch_stats: tuple[BatchStats, ...] = ()
    cancelled: int = 0
    #: (reason, failed requests) for each of FAILURE_REASONS, in that order
    failures: tuple[tuple[str, int], ...] = ()

    def failure_count(self, reason: str) -> int:
        """Failed requests with ``reason`` (one of FAILURE_REASONS)."""
        return dict(self.failures).get(reason, 0)


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """One input or output of a model's metadata (``shape`` with -1 for a batch dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """A model's KServe metadata: the versions asked about, its platform and tensors."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """The server's KServe metadata."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index (Triton's RepositoryIndex)."""

    name: str
    version: str = ""
    state: str = ""
    reason: str = ""


# ---- client shared memory, as data a backend can read ----------------------------------------

_REGION_SERIALS = itertools.count(1)
_REGION_LOCK = threading.Lock()  # guards every SharedRegionMapping's file descriptor


class SharedRegionMapping(mmap.mmap):
    """The server's mapping of one registered system shared-memory region (from byte 0 of the
    object to the end of the registered range), made by :mod:`trident.server.shared_memory`.

    Inputs read from a region are numpy views of this mapping (through a memoryview), so a
    backend that runs models in another process can find out, with :func:`shared_region_of`,
    that a tensor already lies in shared memory and hand that process the file instead of the
    bytes. ``serial`` is unique to one registration in this server process (a region registered
    again under the same name gets a new one), ``length`` is the mapped size and ``address``
    where the mapping starts. The mapping keeps a read-only descriptor of the object while the
    region is registered: :meth:`dup_file` gives a copy of it, :meth:`release_file` (at
    unregistration) closes it, after which :attr:`file_released` is True.
    """

    serial = 0
    length = 0
    address = 0
    _fd = -1

    def attach_file(self, fd: int) -> None:
        """Take ownership of ``fd`` (the object, opened read-only) and number this mapping."""
        self.serial = next(_REGION_SERIALS)
        self.length = len(self)
        self.address = int(np.frombuffer(self, np.uint8, count=1).ctypes.data)  # the view is freed at once
        self._fd = fd

    def dup_file(self) -> int | None:
        """A new descriptor of the object (the caller closes it); None once released."""
        with _REGION_LOCK:
            return None if self._fd < 0 else os.dup(self._fd)

    def release_file(self) -> None:
        """Close the descriptor (idempotent); views of the mapping stay valid."""
        with _REGION_LOCK:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    @property
    def file_released(self) -> bool:
        return self._fd < 0


def _buffer_under(array: np.ndarray) -> Any:
    """The buffer object under a C-contiguous, non-empty, non-object array (through views and
    memoryviews), or None."""
    if array.dtype.hasobject or not array.flags.c_contiguous or array.nbytes == 0:
        return None
    base: Any = array.base
    while isinstance(base, np.ndarray) and not isinstance(base, DeviceCopy):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base


def shared_region_of(array: np.ndarray) -> tuple[SharedRegionMapping, int] | None:
    """The registered region ``array`` is a view of and the byte offset of its first element in
    the region's mapping, or None: it views no region, is not one C-contiguous run of bytes, is
    empty, or holds objects (BYTES)."""
    base = _buffer_under(array)
    if not isinstance(base, SharedRegionMapping) or not base.serial:
        return None
    offset = int(array.__array_interface__["data"][0]) - base.address
    if offset < 0 or offset + array.nbytes > base.length:
        return None
    return base, offset


class DeviceCopy(np.ndarray):
    """The host copy of a range of a client's CUDA shared-memory region (bytes, uint8), made by
    :mod:`trident.server.shared_memory` for an input: every part of the server reads it as
    bytes, and a backend whose model runs on the same GPU can find, with
    :func:`device_source_of`, the device memory it came from and read that instead (no copy
    back to the device). ``device_id`` and ``pointer`` (the device address of byte 0) say where
    it came from, and ``owner`` keeps the client's memory open while anything holds this copy.
    Made by :meth:`allocate` (not zero-filled: the caller fills it).
    """

    device_id: int
    pointer: int
    owner: Any

    @classmethod
    def allocate(cls, nbytes: int, device_id: int, pointer: int, owner: Any) -> DeviceCopy:
        copy = np.empty(nbytes, np.uint8).view(cls)
        copy.device_id, copy.pointer, copy.owner = device_id, pointer, owner
        return copy

    @property
    def address(self) -> int:
        """Where the copy starts in host memory."""
        return int(self.__array_interface__["data"][0])


def device_source_of(array: np.ndarray) -> tuple[int, int, Any] | None:
    """``(device_id, device address of the first element, owner)`` when ``array`` is a view of
    a :class:`DeviceCopy` (an input read from CUDA shared memory), else None (also for BYTES,
    strided or empty arrays). Keep ``owner`` referenced while the device memory is in use."""
    base = _buffer_under(array)
    if not isinstance(base, DeviceCopy) or getattr(base, "owner", None) is None:
        return None
    offset = int(array.__array_interface__["data"][0]) - base.address
    if offset < 0 or offset + array.nbytes > base.nbytes:
        return None
    return base.device_id, base.pointer + offset, base.owner
