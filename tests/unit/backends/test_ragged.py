"""Ragged batching: flattened merge and every batch_input kind."""

import numpy as np
import pytest

from trident.backends.ragged import batch_input_array, batch_input_tensors, merge_ragged
from trident.errors import TritonError
from trident.protocol.generated.inference import BatchInput, BatchInputKind, DataType
from trident.types import InferenceRequest, Tensor


def reqs(*shapes):
    return [InferenceRequest("m", [Tensor.from_numpy("X", np.arange(int(np.prod(s)), dtype=np.float32).reshape(s))])
            for s in shapes]


def bi(kind, dtype=DataType.TYPE_INT32, targets=("T",)):
    return BatchInput(kind=kind, target_name=list(targets), data_type=dtype, source_input=["X"])


BATCH = reqs((1, 3), (1, 5), (2, 2))  # 3, 5 and 4 elements


@pytest.mark.parametrize("kind,expected", [
    (BatchInputKind.BATCH_ELEMENT_COUNT, [3, 5, 4]),
    (BatchInputKind.BATCH_ACCUMULATED_ELEMENT_COUNT, [3, 8, 12]),
    (BatchInputKind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, [0, 3, 8, 12]),
])
def test_element_counts(kind, expected):
    out = batch_input_array(bi(kind), BATCH)
    assert out.dtype == np.int32 and out.tolist() == expected
    assert batch_input_array(bi(kind, DataType.TYPE_FP32), BATCH).dtype == np.float32


def test_max_element_count_as_shape():
    out = batch_input_array(bi(BatchInputKind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE), BATCH)
    assert out.shape == (5,)


def test_item_shapes():
    shape = batch_input_array(bi(BatchInputKind.BATCH_ITEM_SHAPE), BATCH)
    assert shape.tolist() == [[3], [5], [2], [2]]  # the last request holds two items of shape [2]
    flat = batch_input_array(bi(BatchInputKind.BATCH_ITEM_SHAPE_FLATTEN), BATCH)
    assert flat.tolist() == [3, 5, 2, 2]
    no_batch_dim = batch_input_array(bi(BatchInputKind.BATCH_ITEM_SHAPE), reqs((2, 3)), batching=False)
    assert no_batch_dim.tolist() == [[2, 3]]


def test_tensors_per_target_and_merge():
    tensors = batch_input_tensors([bi(BatchInputKind.BATCH_ELEMENT_COUNT, targets=("A", "B"))], BATCH)
    assert [(t.name, t.datatype, t.shape) for t in tensors] == [("A", "INT32", (3,)), ("B", "INT32", (3,))]
    merged = merge_ragged(BATCH, "X")
    assert merged.shape == (12,) and merged[:3].tolist() == [0, 1, 2] and merged[3:8].tolist() == [0, 1, 2, 3, 4]
    assert merge_ragged(BATCH[:1], "X").shape == (3,)


def test_missing_source_is_an_error():
    with pytest.raises(TritonError, match="missing"):
        batch_input_array(BatchInput(kind=BatchInputKind.BATCH_ELEMENT_COUNT, source_input=["Y"]), BATCH)
    with pytest.raises(TritonError, match="missing"):
        merge_ragged(BATCH, "Y")
    with pytest.raises(TritonError, match="source input"):
        batch_input_array(BatchInput(kind=BatchInputKind.BATCH_ELEMENT_COUNT), BATCH)
