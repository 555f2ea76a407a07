import numpy as np
import pytest

from trident.backends.merge import batch_sizes, merge_inputs, split_outputs
from trident.errors import TritonError
from trident.types import InferenceRequest, Tensor


def req(*arrays, names=("A",)):
    return InferenceRequest("m", [Tensor.from_numpy(n, a) for n, a in zip(names, arrays, strict=True)])


def test_merge_and_split_round_trip():
    r1 = req(np.arange(6, dtype=np.float32).reshape(2, 3))
    r2 = req(np.arange(3, dtype=np.float32).reshape(1, 3) + 100)
    merged = merge_inputs([r1, r2], ["A"])
    assert merged["A"].shape == (3, 3)
    sizes = batch_sizes([r1, r2])
    assert sizes == [2, 1]
    parts = split_outputs({"Y": merged["A"] * 2}, sizes)
    np.testing.assert_array_equal(parts[0]["Y"], r1.inputs[0].data * 2)
    np.testing.assert_array_equal(parts[1]["Y"], r2.inputs[0].data * 2)
    assert parts[0]["Y"].base is not None  # views, not copies


def test_single_request_is_not_copied():
    a = np.ones((2, 2), np.float32)
    merged = merge_inputs([req(a)], ["A"])
    assert merged["A"] is a
    out = split_outputs({"Y": a}, [2])
    assert out[0]["Y"] is a


def test_shape_mismatch_and_bad_output():
    with pytest.raises(TritonError):
        merge_inputs([req(np.ones((1, 2))), req(np.ones((1, 3)))], ["A"])
    with pytest.raises(TritonError):
        split_outputs({"Y": np.ones(4)}, [1, 2])


def test_missing_optional_input_is_left_out():
    r1 = req(np.ones((1, 2)), np.ones((1, 2)), names=("A", "B"))
    r2 = req(np.ones((1, 2)), names=("A",))
    assert set(merge_inputs([r1, r2], ["A", "B"])) == {"A"}
