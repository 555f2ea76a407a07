"""Classification extension: Triton's "<value>:<index>[:<label>]" top-k strings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trident.batching.outputs import classify
from trident.errors import Code, TritonError
from trident.protocol import datatypes
from trident.types import Tensor


def strings(tensor: Tensor) -> list[list[str]] | list[str]:
    return np.vectorize(lambda b: b.decode(), otypes=[object])(tensor.data).tolist()


def test_float_values_with_labels_batched() -> None:
    data = np.array([[0.1, 15.0, 3.0, 7.5], [9.0, 0.0, 0.0, 1.0]], dtype=np.float32)
    out = classify(Tensor("prob", "FP32", (2, 4), data), 2, ["cat", "", "dog", "emu"], batched=True)
    assert (out.name, out.datatype, out.shape) == ("prob", "BYTES", (2, 2))
    assert strings(out) == [["15.000000:1", "7.500000:3:emu"], ["9.000000:0:cat", "1.000000:3:emu"]]


def test_unbatched_uses_every_element_and_k_is_capped() -> None:
    data = np.array([[1, 5], [3, 2]], dtype=np.int32)
    out = classify(Tensor("o", "INT32", (2, 2), data), 10, None, batched=False)
    assert out.shape == (4,)
    assert strings(out) == ["5:1", "3:2", "2:3", "1:0"]  # integers print without decimals


def test_ties_keep_index_order_and_negative_values() -> None:
    data = np.array([-1.0, 2.0, 2.0, -1.0, 2.0], dtype=np.float64)
    out = classify(Tensor("o", "FP64", (5,), data), 4, None, batched=False)
    assert strings(out) == ["2.000000:1", "2.000000:2", "2.000000:4", "-1.000000:0"]


def test_unsigned_and_half_types() -> None:
    u = classify(Tensor("o", "UINT8", (1, 3), np.array([[200, 7, 255]], dtype=np.uint8)), 1, None, True)
    assert strings(u) == [["255:2"]]
    bf16 = datatypes.float32_to_bf16(np.array([0.5, 4.0], dtype=np.float32))
    assert strings(classify(Tensor("o", "BF16", (2,), bf16), 1, None, False)) == ["4.000000:1"]
    fp16 = np.array([0.25, -3.0], dtype=np.float16)
    assert strings(classify(Tensor("o", "FP16", (2,), fp16), 2, None, False)) == ["0.250000:0", "-3.000000:1"]


def test_empty_batch() -> None:
    out = classify(Tensor("o", "FP32", (0, 5), np.zeros((0, 5), dtype=np.float32)), 3, None, True)
    assert out.shape == (0, 3) and out.data.size == 0


@pytest.mark.parametrize(("datatype", "k"), [("BOOL", 1), ("BYTES", 1), ("FP32", 0)])
def test_rejected(datatype: str, k: int) -> None:
    data = np.zeros(2, dtype=datatypes.numpy_dtype(datatype))
    with pytest.raises(TritonError) as info:
        classify(Tensor("o", datatype, (2,), data), k, None, False)
    assert info.value.code is Code.INVALID_ARG and "'o'" in info.value.message


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        np.float32, st.tuples(st.integers(1, 4), st.integers(1, 12)), elements=st.floats(-1e6, 1e6, width=32)
    ),
    st.integers(1, 15),
)
def test_matches_a_reference_sort(data: np.ndarray, k: int) -> None:
    out = classify(Tensor("o", "FP32", data.shape, data), k, None, batched=True)
    kk = min(k, data.shape[1])
    assert out.shape == (data.shape[0], kk)
    for row, got in zip(data.tolist(), strings(out), strict=True):
        expected = sorted(range(len(row)), key=lambda i: (-row[i], i))[:kk]
        assert got == [f"{row[i]:f}:{i}" for i in expected]
