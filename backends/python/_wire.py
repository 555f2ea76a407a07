"""BYTES inputs held in their wire form on their way through a Python model.

A large BYTES input arrives as a :class:`~trident.types.WireBytesTensor` (its elements' wire
form, no Python object per element). The model sees it as a :class:`WireInput`: a
``pb_utils.Tensor`` whose object array (what Triton gives ``as_numpy()``) is made the first
time the model asks for it, in the model's thread. A model that never asks (it forwards the
tensor to a BLS call, or ignores it) costs no element object.

What ``as_numpy()`` hands out is the model's to change, so it is a copy of the input's own
array (the *pristine* one, never handed out), remembered in :data:`_HANDED`. When the model
returns an array holding exactly the pristine array's element objects, in the same order
(:func:`handed_wire`: the two arrays' element pointers compared, by numpy), its wire form is
the input's, and the answer sends the input's bytes instead of serializing every element. The
comparison is sound because the pristine array holds a reference to every original element
(and the registry holds the pristine array): none of them can be freed and its address reused
meanwhile, and bytes objects do not change.
"""

from __future__ import annotations

import ctypes

import numpy as np

from trident import priority
from trident.backends.python._pb_tensor import Tensor
from trident.protocol.datatypes import FILL_SLICE, WireBytes, object_array
from trident.types import WireBytesTensor

#: id of (the array owning the memory of) an array handed to a model -> that owner, the pristine
#: array it copies and their wire form; the entry goes with the WireInput that handed the array
#: out (its request), so it holds both arrays no longer than the model's request does (no weak
#: references: numpy cannot shrink an array that has one, see types.release_objects)
_HANDED: dict[int, tuple[np.ndarray, np.ndarray, WireBytes]] = {}

_ARRAY_SLOT = Tensor.__dict__["_array"]  # pb_utils.Tensor's slot for its array


class WireInput(Tensor):
    """A model's view of a :class:`~trident.types.WireBytesTensor` input: ``as_numpy()`` makes
    (once) a new object array of its elements; ``shape()`` and the name need none."""

    __slots__ = ("_source",)

    def __init__(self, source: WireBytesTensor) -> None:  # noqa: D107 (no checks: a request input)
        self._name = source.name
        self._datatype = "BYTES"
        self._source = source

    @property  # type: ignore[override]
    def _array(self) -> np.ndarray:
        try:
            return _ARRAY_SLOT.__get__(self, Tensor)  # type: ignore[no-any-return]
        except AttributeError:
            handed = hand_out(self._source)
            _ARRAY_SLOT.__set__(self, handed)
            return handed

    @_array.setter
    def _array(self, value: np.ndarray) -> None:
        _ARRAY_SLOT.__set__(self, value)

    def __del__(self) -> None:
        try:
            handed = _ARRAY_SLOT.__get__(self, Tensor)
        except AttributeError:
            return
        _HANDED.pop(id(_owner(handed)), None)

    def shape(self) -> list[int]:
        return [int(d) for d in self._source.shape]

    def unread(self) -> WireBytes | None:
        """The input's wire form while the model has not asked for its array (None after)."""
        try:
            _ARRAY_SLOT.__get__(self, Tensor)
        except AttributeError:
            return self._source.wire
        return None


def hand_out(source: WireBytesTensor) -> np.ndarray:
    """A new object array of ``source``'s elements for model code, remembered (until the
    WireInput that asks for it goes) as a copy of ``source``'s own array."""
    with priority.in_background():  # the event loop's thread gets the core and the GIL first
        pristine = source.data  # made once, in this thread, and kept by the tensor
        handed = _copy(pristine)
    wire = source.wire
    if wire is not None and handed.size:
        owner = _owner(handed)
        _HANDED[id(owner)] = (owner, pristine, wire)
    return handed


def _owner(array: np.ndarray) -> np.ndarray:
    """The array that owns ``array``'s memory (numpy points every view at it)."""
    base = array.base
    return base if isinstance(base, np.ndarray) else array


def _copy(array: np.ndarray) -> np.ndarray:
    """A new object array of ``array``'s elements, made a slice at a time (``copy()`` is one call
    that holds the GIL: ~100 ms for 15M elements, a stall for every other client)."""
    flat = array.reshape(-1)
    size = flat.size
    if size <= FILL_SLICE:
        return array.copy()
    slices = (flat[start : start + FILL_SLICE].tolist() for start in range(0, size, FILL_SLICE))
    return object_array(slices, size).reshape(array.shape)


def handed_wire(array: np.ndarray) -> WireBytes | None:
    """The wire form of ``array`` when it holds exactly the element objects of an array
    :func:`hand_out` made, in the same order (the array itself, or a view of all of it in
    order, unchanged); None otherwise. C code only (a pointer comparison)."""
    owner = _owner(array)
    entry = _HANDED.get(id(owner))
    if entry is None:
        return None
    held, pristine, wire = entry
    if held is not owner or array.dtype != object or not array.flags.c_contiguous or array.size != pristine.size:
        return None
    mine, theirs = _pointers(array), _pointers(pristine)
    # a slice at a time: one comparison of 15M pointers holds the GIL ~25 ms
    same = all(np.array_equal(mine[start : start + _COMPARE_SLICE], theirs[start : start + _COMPARE_SLICE])
               for start in range(0, mine.size, _COMPARE_SLICE))
    return wire if same else None


_COMPARE_SLICE = 1 << 18  # pointers compared at once by :func:`handed_wire` (2 MiB a side)


def _pointers(array: np.ndarray) -> np.ndarray:
    """The element pointers of a C-contiguous, non-empty object array (a view: keep ``array``)."""
    memory = (ctypes.c_char * array.nbytes).from_address(array.ctypes.data)
    return np.frombuffer(memoryview(memory).cast("B"), dtype=np.uintp)
