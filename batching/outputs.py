"""What a response's outputs become before they leave the server: the outputs the request
asked for, in its order, each classified where it asked (Triton's classification extension).

Used by the executor for every model's responses and by the ensemble for its own.

Classification: the top-k of an output as "<value>:<index>[:<label>]" strings. Triton formats
each entry with C++ ``std::to_string``: floating-point values print with six decimals ("15.000000:3"), integer values as integers ("15:3"), and a non-empty label for the
class index is appended after a second colon. Entries are ordered by value, highest first;
equal values keep index order (Triton's sort leaves ties unspecified). Triton refuses FP16 and
BF16 outputs; trident classifies them as floats. BOOL and BYTES outputs cannot be classified.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trident.errors import internal, invalid_arg
from trident.protocol import datatypes
from trident.types import InferenceRequest, InferenceResponse, Tensor, TensorSpec

__all__ = ["classify", "finish_outputs"]


def finish_outputs(response: InferenceResponse, request: InferenceRequest, specs: dict[str, TensorSpec],
                   model_name: str, batching: bool) -> InferenceResponse:
    """``response`` with BF16 outputs named as such, then only the outputs ``request`` asked
    for, in its order, classified where asked (all of them, unclassified, when it named none).
    An output the model did not produce fails the response (INTERNAL), except in a flag-only or
    empty response. Raises TritonError(INVALID_ARG) for an output that cannot be classified."""
    for tensor in response.outputs:
        spec = specs.get(tensor.name)
        if spec is not None and spec.datatype == "BF16" and tensor.datatype == "UINT16":
            tensor.datatype = "BF16"  # trident's BF16 representation is uint16 bit patterns
    if request.outputs:
        produced = {t.name: t for t in response.outputs}
        selected: list[Tensor] = []
        for wanted in request.outputs:
            found = produced.get(wanted.name)
            if found is None:
                if response.flag_only or not response.outputs:
                    continue
                response.error = internal(f"model '{model_name}' did not produce output '{wanted.name}'")
                response.outputs = []
                return response
            tensor = found
            k = wanted.parameters.get("classification")
            if k:
                spec = specs.get(wanted.name)
                tensor = classify(tensor, int(k), spec.labels if spec else None, batching)
            selected.append(tensor)
        response.outputs = selected
    return response


def classify(tensor: Tensor, k: int, labels: Sequence[str] | None, batched: bool) -> Tensor:
    """Replace ``tensor`` by its top-``k`` classes, as Triton's classification extension does.

    With ``batched`` (the model's first dimension is the batch) the result is a BYTES tensor of
    shape ``[batch, min(k, classes)]``, one row per batch entry; otherwise ``[min(k, classes)]``
    over all elements. ``labels[i]`` (from the output's ``label_filename``) names class ``i``.

    Raises TritonError INVALID_ARG for ``k < 1`` and for BOOL/BYTES outputs.
    """
    if k < 1:
        raise invalid_arg(f"classification count for output '{tensor.name}' must be at least 1, got {k}")
    datatype = tensor.datatype
    if datatype in ("BOOL", "BYTES") or not datatypes.is_datatype(datatype):
        raise invalid_arg(
            f"class result not available for output '{tensor.name}' due to unsupported type '{datatype}'"
        )
    values = tensor.data
    if datatype == "BF16":
        values = datatypes.bf16_to_float32(values)
    shape = tensor.shape
    batch = shape[0] if batched and len(shape) > 0 else None
    if batch is None:
        rows = values.reshape(1, -1)
    else:
        per_row = datatypes.element_count(shape[1:])
        rows = values.reshape(batch, per_row)
    n = rows.shape[1]
    kk = min(k, n)
    # stable descending order: sort the reversed rows ascending, then map indices back
    order = np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :kk]
    order = (n - 1) - order
    top = np.take_along_axis(rows, order, axis=1)

    is_float = rows.dtype.kind == "f"
    strings: list[bytes] = []
    append = strings.append
    for value_row, index_row in zip(top.tolist(), order.tolist(), strict=True):
        for value, index in zip(value_row, index_row, strict=True):
            text = f"{value:f}:{index}" if is_float else f"{value}:{index}"
            if labels is not None and index < len(labels) and labels[index]:
                text = f"{text}:{labels[index]}"
            append(text.encode("utf-8"))
    out_shape = (rows.shape[0], kk) if batch is not None else (kk,)
    data = np.empty(len(strings), dtype=object)
    data[:] = strings
    return Tensor(tensor.name, "BYTES", out_shape, data.reshape(out_shape), dict(tensor.parameters))
