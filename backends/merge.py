"""Merging requests into one batch along the batch dimension, and splitting the results back.

Framework backends (ONNX Runtime, PyTorch, ...) run one call per batch: the inputs of the
batch's requests are concatenated along axis 0 (one ``np.concatenate`` per input, no
per-element Python loop; a single request is passed through without a copy) and each output
is split back into zero-copy views, one per request, by the requests' batch sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trident.errors import internal, invalid_arg
from trident.types import InferenceRequest


def batch_sizes(requests: Sequence[InferenceRequest]) -> list[int]:
    """Each request's batch size: the first dimension of its first input (1 when it has none)."""
    out = []
    for r in requests:
        first = r.inputs[0] if r.inputs else None
        out.append(int(first.shape[0]) if first is not None and first.shape else 1)
    return out


def merge_inputs(requests: Sequence[InferenceRequest], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Concatenate each named input of ``requests`` along axis 0.

    A request without an (optional) input contributes nothing for it; the result then holds
    only the inputs every request has. Raises INVALID_ARG when the non-batch dimensions of an
    input differ between requests (allow_ragged_batch inputs need a ragged-aware backend).
    """
    merged: dict[str, np.ndarray] = {}
    for name in names:
        arrays = []
        for r in requests:
            t = r.input(name)
            if t is None:
                break
            arrays.append(t.data)
        else:
            if len(arrays) == 1:
                merged[name] = arrays[0]
                continue
            tail = arrays[0].shape[1:]
            if any(a.shape[1:] != tail for a in arrays):
                raise invalid_arg(f"input '{name}' has different shapes across the requests of a batch")
            merged[name] = np.concatenate(arrays, axis=0)
    return merged


def split_outputs(outputs: dict[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Split batched outputs into one dict of views per request (by ``sizes``).

    Raises INTERNAL when an output's first dimension is not the total batch size.
    """
    total = sum(sizes)
    if len(sizes) == 1:
        return [dict(outputs)]
    bounds = np.cumsum(sizes)[:-1]
    per_request: list[dict[str, np.ndarray]] = [{} for _ in sizes]
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise internal(f"output '{name}' has batch dimension {array.shape[:1]}, expected {total}")
        for i, part in enumerate(np.split(array, bounds, axis=0)):
            per_request[i][name] = part
    return per_request
