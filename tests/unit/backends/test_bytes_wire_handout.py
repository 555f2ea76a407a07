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


@pytest.mark.parametrize("compare_slice", [None, 1000])
def test_the_model_gets_a_copy_and_an_unchanged_return_is_the_wire_form(compare_slice, monkeypatch):
    if compare_slice is not None:
        monkeypatch.setattr(_wire, "_COMPARE_SLICE", compare_slice)
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


@pytest.mark.parametrize("compare_slice", [None, 1000])  # pointers compared whole, or a slice at a time
@pytest.mark.parametrize("change", ["replace one", "same bytes, new object", "copy", "slice", "str in place"])
def test_a_changed_return_is_serialized(change, compare_slice, monkeypatch):
    if compare_slice is not None:
        monkeypatch.setattr(_wire, "_COMPARE_SLICE", compare_slice)
    source = wire_tensor(items_of())
    view = _convert.to_input_tensor(source, False)  # held, as the model's request holds it
    handed = view.as_numpy()
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


def test_the_memo_goes_with_the_model_view_of_the_input():
    source = wire_tensor(items_of())
    view = _convert.to_input_tensor(source, False)
    handed = view.as_numpy()
    key = id(_wire._owner(handed))
    assert _wire._HANDED[key][1] is source.data  # the pristine array, held while the view lives
    del view
    gc.collect()
    assert key not in _wire._HANDED and _wire.handed_wire(handed) is None  # gone with the view
    assert handed.tolist() == items_of()  # the model's array is its own


def test_release_objects_lets_go_of_arrays_nothing_else_holds():
    """Only what nothing else can see is let go of (the list, the tensor, its array and the
    array owning the memory each held once); the rest stays whole."""
    held = np.array(items_of(), dtype=object)
    viewed = np.array(items_of(), dtype=object)
    kept_view = viewed[:10]  # a view a model kept: the owner is held by it
    gone = object()
    also: list[Tensor] = []
    tensors = [
        Tensor("alone", "BYTES", (1, COUNT), np.array([gone] * COUNT, dtype=object).reshape(1, COUNT)),
        Tensor("shared array", "BYTES", (COUNT,), held),
        Tensor("owner viewed", "BYTES", (COUNT,), viewed),
        Tensor("small", "BYTES", (3,), np.array([b"x", b"y", b"z"], dtype=object)),
        wire_tensor(items_of()),
        Tensor("shared tensor", "BYTES", (COUNT,), np.array(items_of(), dtype=object)),
        Tensor("owning", "BYTES", (COUNT,), np.array([gone] * COUNT, dtype=object)),  # no view between
    ]
    also.append(tensors[5])
    assert sys.getrefcount(gone) == 2 * COUNT + 2
    release_objects(tensors)
    assert sys.getrefcount(gone) == 2 and tensors[0].data.size == tensors[6].data.size == 0  # nothing else held them
    assert held.tolist() == items_of() and tensors[1].data is held
    assert viewed.tolist() == items_of() and kept_view.tolist() == items_of()[:10]
    assert tensors[3].data.tolist() == [b"x", b"y", b"z"]  # small: freed whole when dropped
    with pytest.raises(AttributeError):
        Tensor.__dict__["data"].__get__(tensors[4], Tensor)  # its elements were not made for this
    assert also[0].data.tolist() == items_of()  # the tensor is held elsewhere too
    twice = tensors
    twice[0] = Tensor("alone again", "BYTES", (COUNT,), np.array(items_of(), dtype=object))
    release_objects(tensors)  # a list held twice: nothing is touched
    assert twice[0].data.size == COUNT


IDENTITY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if r.parameters() != "{}":
                x[0] = b"changed"
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def test_a_python_model_returning_its_input_is_answered_with_the_input_wire_form(tmp_path):
    """Through the Python backend as the server runs it: the answer of a model returning its
    input unchanged carries the input's wire form (nothing serialized); one that changed an
    element does not, and holds the change."""
    from unit.backends.test_python_backend import _ctx, _write

    from trident.backends.python.backend import PythonBackend
    from trident.protocol.generated.inference import DataType, ModelConfig, ModelInput, ModelOutput
    from trident.types import InferenceRequest

    config = ModelConfig(name="ident", backend="python", max_batch_size=0,
                         input=[ModelInput(name="INPUT0", data_type=DataType.TYPE_STRING, dims=[-1])],
                         output=[ModelOutput(name="OUTPUT0", data_type=DataType.TYPE_STRING, dims=[-1])])
    instance = PythonBackend().load_instance(_ctx(_write(tmp_path, "ident", IDENTITY_PY), config))
    try:
        source = wire_tensor(items_of())
        plain, changed = instance.execute([InferenceRequest(model_name="ident", inputs=[source]),
                                           InferenceRequest(model_name="ident", inputs=[wire_tensor(items_of())],
                                                            parameters={"change": True})])
        out = plain.output("OUTPUT0")
        assert type(out) is WireBytesTensor and out.wire is source.wire and out.data.tolist() == items_of()
        out = changed.output("OUTPUT0")
        assert wire_of(out) is None and out.data.tolist() == [b"changed", *items_of()[1:]]
    finally:
        instance.finalize()


def test_let_go_empties_its_holder_and_never_raises(caplog):
    from trident.types import InferenceRequest, InferenceResponse, let_go

    request = InferenceRequest(model_name="m", inputs=[Tensor("a", "BYTES", (COUNT,), np.array(items_of(), dtype=object))])
    broken = InferenceResponse(outputs=[object()])  # type: ignore[list-item]  # not a tensor
    holder = [request, broken]
    del request, broken
    let_go(holder)
    assert holder == [] and "letting go of a request's objects" in caplog.text
    holder = [None, None]
    let_go(holder)
    assert holder == []


def test_let_go_releases_an_array_the_answer_shares_with_the_request():
    """A model that answers with its input's array (an identity): the request's tensor lets go
    of it, and the answer's tensor then lets go of its elements a slice at a time (both tensors
    are left with an empty array); an array something else still holds is left whole."""
    from trident.types import InferenceRequest, InferenceResponse, let_go

    gone = object()
    array = np.array([gone] * COUNT, dtype=object)
    request = InferenceRequest(model_name="m", inputs=[Tensor("INPUT0", "BYTES", (COUNT,), array)])
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", "BYTES", (COUNT,), array)])
    del array
    assert sys.getrefcount(gone) == COUNT + 2
    let_go([request, response])
    assert sys.getrefcount(gone) == 2  # while the request and the response are still here
    assert request.inputs[0].data.size == response.outputs[0].data.size == 0

    kept = np.array([gone] * COUNT, dtype=object)  # held by the caller as well: left whole
    request = InferenceRequest(model_name="m", inputs=[Tensor("INPUT0", "BYTES", (COUNT,), kept)])
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", "BYTES", (COUNT,), kept)])
    let_go([request, response])
    assert sys.getrefcount(gone) == COUNT + 2 and response.outputs[0].data is kept and kept.size == COUNT
