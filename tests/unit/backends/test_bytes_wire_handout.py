"""backends/python/_wire and types.WireBytesTensor: a BYTES input in its wire form is made into
objects only when read; what a model gets from ``as_numpy()`` is its own copy; an array it
returns is answered with the input's wire form only when it holds exactly the input's element
objects in order (a change, a copy, a slice or an input whose own array is gone: serialized)."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

from trident.backends.python import _convert, _wire, pb_utils
from trident.protocol import datatypes
from trident.types import Tensor, WireBytesTensor, release_objects, wire_of

COUNT = datatypes.FILL_SLICE + 7


def wire_tensor(items: list[bytes]) -> WireBytesTensor:
    data = datatypes.serialize_bytes(np.array(items, dtype=object))
    return WireBytesTensor("INPUT0", (len(items),), datatypes.WireBytes.parse(data, len(items)))


def items_of(count: int = COUNT) -> list[bytes]:
    return [b"e%d" % i for i in range(count)]


def test_elements_are_made_once_and_only_when_read():
    tensor = wire_tensor(items_of())
    assert wire_of(tensor) is tensor.wire and tensor.nbytes == tensor.wire.buffer.nbytes
    with pytest.raises(AttributeError):
        Tensor.__dict__["data"].__get__(tensor, Tensor)  # nothing made yet
    first = tensor.data
    assert first.tolist() == items_of() and tensor.data is first
    tensor.data = np.array([b"other"], dtype=object)
    assert wire_of(tensor) is None and tensor.data.tolist() == [b"other"]


def test_the_model_gets_a_copy_and_an_unchanged_return_is_the_wire_form():
    source = wire_tensor(items_of())
    model_view = _convert.to_input_tensor(source, False)
    assert isinstance(model_view, pb_utils.Tensor) and model_view.shape() == [COUNT]
    assert model_view.unread() is source.wire  # shape() needed no element
    handed = model_view.as_numpy()
    assert handed is model_view.as_numpy() and handed is not source.data
    assert handed.tolist() == items_of()
    out = _convert.to_tensor(pb_utils.Tensor("OUTPUT0", handed))
    assert type(out) is WireBytesTensor and out.wire is source.wire and out.data is handed
    reshaped = _convert.to_tensor(pb_utils.Tensor("OUTPUT0", handed.reshape(1, -1)))
    assert wire_of(reshaped) is source.wire and reshaped.shape == (1, COUNT)


@pytest.mark.parametrize("change", ["replace one", "same bytes, new object", "copy", "slice", "str in place"])
def test_a_changed_return_is_serialized(change):
    source = wire_tensor(items_of())
    handed = _convert.to_input_tensor(source, False).as_numpy()
    if change == "replace one":
        handed[5] = b"changed"
        returned = handed
    elif change == "same bytes, new object":
        handed[-1] = bytes(bytearray(handed[-1]))  # equal bytes, another object: not proven equal
        returned = handed
    elif change == "copy":
        returned = handed.copy()
    elif change == "slice":
        returned = handed[1:]
    else:
        handed[0] = "text"
        returned = handed
    out = _convert.to_tensor(pb_utils.Tensor("OUTPUT0", returned))
    assert wire_of(out) is None
    expected = [x.encode() if isinstance(x, str) else x for x in returned.tolist()]
    assert out.data.tolist() == expected


def test_an_unread_input_passed_on_keeps_its_wire_form():
    source = wire_tensor(items_of())
    passed = _convert.to_tensor(_convert.to_input_tensor(source, False))
    assert type(passed) is WireBytesTensor and passed.wire is source.wire and passed.name == "INPUT0"


def test_the_memo_goes_with_the_handed_array_and_needs_the_input_alive():
    source = wire_tensor(items_of())
    handed = _convert.to_input_tensor(source, False).as_numpy()
    key = id(_wire._owner(handed))
    assert key in _wire._HANDED
    del source
    gc.collect()
    assert _wire.handed_wire(handed) is None  # the pristine array is gone: nothing proves equality
    del handed
    gc.collect()
    assert key not in _wire._HANDED


def test_release_objects_lets_go_of_arrays_only_the_tensor_holds():
    held = np.array(items_of(), dtype=object)
    alone = Tensor("a", "BYTES", (COUNT,), np.array(items_of(), dtype=object))
    shared = Tensor("b", "BYTES", (COUNT,), held)
    small = Tensor("c", "BYTES", (3,), np.array([b"x", b"y", b"z"], dtype=object))
    unread = wire_tensor(items_of())
    release_objects([alone, shared, small, unread])
    assert set(alone.data.tolist()) == {None}  # nothing else held it
    assert held.tolist() == items_of()  # another holder: untouched
    assert small.data.tolist() == [b"x", b"y", b"z"]  # small: freed whole when dropped
    with pytest.raises(AttributeError):
        Tensor.__dict__["data"].__get__(unread, Tensor)  # its elements were not made for this
    assert sys.getrefcount(held) == 3  # (held, shared's slot, the argument): nothing kept
