"""Ragged batching: ``allow_ragged_batch`` inputs and the ``batch_input`` tensors of a batch.

In Triton the core only *forms* ragged batches (requests whose ``allow_ragged_batch`` inputs
differ in shape may share a batch, see :func:`trident.batching.dynamic.shape_key`); the
backend concatenates the ragged inputs flattened into one 1-D tensor and adds the
``batch_input`` tensors that describe the batch (``BackendInputCollector::ProcessBatchInput``
of the backend repository). The Python backend does neither: a Python model receives its
requests one by one, each with its own shape, and no batch-input tensors. trident does the
same: framework backends that batch into one call use :func:`merge_ragged` and
:func:`batch_input_tensors`; the Python backend sees the requests as sent.

Kinds, for a batch of requests whose source input has ``n_i`` elements (batch dimension
included) and shape ``s_i``:

* ``BATCH_ELEMENT_COUNT``: ``[n_1, ..., n_k]``;
* ``BATCH_ACCUMULATED_ELEMENT_COUNT``: the running sums ``[n_1, n_1+n_2, ...]``;
* ``BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO``: ``[0, n_1, n_1+n_2, ...]``;
* ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``: a tensor of shape ``[max n_i]`` (only its shape matters);
* ``BATCH_ITEM_SHAPE``: one row ``s_i[1:]`` per batch item, shape ``[items, rank]``;
* ``BATCH_ITEM_SHAPE_FLATTEN``: the same rows flattened to ``[items * rank]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trident.errors import invalid_arg
from trident.protocol.generated.inference import BatchInput, BatchInputKind, DataType
from trident.types import InferenceRequest, Tensor


def merge_ragged(requests: Sequence[InferenceRequest], name: str) -> np.ndarray:
    """The ``name`` inputs of ``requests`` flattened and concatenated into one 1-D array.

    Raises INVALID_ARG when a request lacks the input.
    """
    arrays = []
    for r in requests:
        t = r.input(name)
        if t is None:
            raise invalid_arg(f"input '{name}' is missing from a request of the batch")
        arrays.append(t.data.reshape(-1))
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _source_shapes(requests: Sequence[InferenceRequest], source: str) -> list[tuple[int, ...]]:
    shapes = []
    for r in requests:
        t = r.input(source)
        if t is None:
            raise invalid_arg(f"batch input source '{source}' is missing from a request of the batch")
        shapes.append(tuple(int(d) for d in t.shape))
    return shapes


def batch_input_array(batch_input: BatchInput, requests: Sequence[InferenceRequest],
                      batching: bool = True) -> np.ndarray:
    """The tensor one ``batch_input`` entry describes for ``requests`` (see module docstring).

    ``batching`` is ``max_batch_size > 0`` (whether the first dimension is the batch).
    Raises INVALID_ARG for a missing source input or an unknown kind.
    """
    if not batch_input.source_input:
        raise invalid_arg("batch input must name a source input")
    dtype = np.float32 if batch_input.data_type == DataType.TYPE_FP32 else np.int32
    shapes = _source_shapes(requests, batch_input.source_input[0])
    counts = np.array([int(np.prod(s)) for s in shapes], dtype=np.int64)
    kind = batch_input.kind
    if kind == BatchInputKind.BATCH_ELEMENT_COUNT:
        return counts.astype(dtype)
    if kind == BatchInputKind.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return np.cumsum(counts).astype(dtype)
    if kind == BatchInputKind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind == BatchInputKind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        return np.zeros(int(counts.max()) if len(counts) else 0, dtype=dtype)
    if kind in (BatchInputKind.BATCH_ITEM_SHAPE, BatchInputKind.BATCH_ITEM_SHAPE_FLATTEN):
        rows = []
        for s in shapes:
            items, item_shape = (s[0], s[1:]) if batching and s else (1, s)
            rows.extend([item_shape] * items)
        rank = len(rows[0]) if rows else 0
        if any(len(r) != rank for r in rows):
            raise invalid_arg(f"batch input '{batch_input.source_input[0]}' items have different ranks")
        table = np.array(rows, dtype=dtype).reshape(len(rows), rank)
        return table if kind == BatchInputKind.BATCH_ITEM_SHAPE else table.reshape(-1)
    raise invalid_arg(f"unknown batch input kind {int(kind)}")


def batch_input_tensors(batch_inputs: Sequence[BatchInput], requests: Sequence[InferenceRequest],
                        batching: bool = True) -> list[Tensor]:
    """One tensor per ``target_name`` of each configured ``batch_input`` for this batch."""
    out: list[Tensor] = []
    for bi in batch_inputs:
        array = batch_input_array(bi, requests, batching)
        datatype = "FP32" if array.dtype == np.float32 else "INT32"
        for target in bi.target_name:
            out.append(Tensor(target, datatype, tuple(int(d) for d in array.shape), array))
    return out
