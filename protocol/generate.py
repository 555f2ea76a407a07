"""The JSON mapping of Triton's (provisional) generate extension (sans-IO).

Triton's (provisional) generate extension: ``POST .../generate`` and ``.../generate_stream``.

Request JSON (Triton's "exact mapping"): every top-level key, and every key of the optional
``"parameters"`` object, that names a model input becomes that input tensor; any other key
becomes a request parameter (string, number or boolean). A top-level string ``"id"`` is the
request id. A tensor value is a scalar or a 1-D array; its shape is the input's shape with the
fixed dimensions taken from the config, the innermost variable dimension holding the rest of
the elements and any other variable dimension (the batch dimension) set to 1. So
``{"text_input": "hi", "max_tokens": 8}`` feeds ``text_input`` BYTES [1] and ``max_tokens``.

Response JSON: ``id`` (when set), ``model_name``, ``model_version``, each response parameter,
and each output tensor by name (its data as a JSON array, a lone element unwrapped), so a
``text_output`` BYTES output becomes ``"text_output": "..."``.

Served by :mod:`trident.http.generate` (``/generate``, ``/generate_stream``) and reused by the
OpenAI-compatible front end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trident.errors import internal, invalid_arg
from trident.protocol import kserve
from trident.types import InferenceRequest, InferenceResponse, ModelMetadata, ParamValue, Tensor

# ---- request mapping ---------------------------------------------------------------------------


def _shape_for(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """Triton's two-pass shape fill: fixed dims divide ``count``, the innermost -1 takes the rest."""
    shape = list(dims)
    remaining = count
    for d in reversed(shape):
        if d != -1:
            if d == 0 or remaining % d:
                raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
            remaining //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = remaining
            remaining = 1
    if remaining != 1:
        raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def _tensor(name: str, datatype: str, dims: list[int], value: Any) -> Tensor:
    data = value if isinstance(value, list) else [value]
    shape = _shape_for(name, dims, len(data))
    count = int(np.prod(shape)) if shape else 1
    array = kserve.json_to_array(name, datatype, shape, count, data)
    return Tensor(name, datatype, shape, array)


def _parameter(key: str, value: Any) -> ParamValue:
    if isinstance(value, (bool, int, float, str)):
        return value
    raise invalid_arg(
        f"Unsupported parameter type for parameter '{key}': expected a string, number or boolean"
    )


def build_request(metadata: ModelMetadata, doc: Any, name: str, version: str) -> InferenceRequest:
    """The InferenceRequest for a generate request body (see the module docstring), for the
    model whose metadata is ``metadata``.

    Raises TritonError(INVALID_ARG) for a body that is not a JSON object, a bad tensor value or
    parameter.
    """
    if not isinstance(doc, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected a JSON object")
    specs = {t.name: t for t in metadata.inputs}
    inputs: list[Tensor] = []
    params: dict[str, ParamValue] = {}
    request_id = ""

    def place(key: str, value: Any) -> None:
        spec = specs.get(key)
        if spec is None:
            params[key] = _parameter(key, value)
        else:
            inputs.append(_tensor(key, spec.datatype, list(spec.shape), value))

    for key, value in doc.items():
        if key == "id" and isinstance(value, str) and "id" not in specs:
            request_id = value
        elif key == "parameters":
            if key in specs:
                raise invalid_arg("Keyword 'parameters' for nested schema also given as input tensor name")
            if not isinstance(value, dict):
                raise invalid_arg("Expected JSON object for keyword: 'parameters'")
            for inner, item in value.items():
                place(inner, item)
        else:
            place(key, value)
    return InferenceRequest(model_name=name, inputs=inputs, model_version=version, id=request_id,
                            parameters=params)


# ---- response mapping --------------------------------------------------------------------------


def flag_only(response: InferenceResponse) -> bool:
    """A flag-only final response (no event, no answer of its own)."""
    return response.error is None and not response.outputs and response.flag_only


def response_json(response: InferenceResponse) -> dict[str, Any]:
    """The generate response object for one response. Raises TritonError(INTERNAL) for an
    output with no JSON form (BYTES that are not UTF-8, FP16)."""
    out: dict[str, Any] = {}
    if response.id:
        out["id"] = response.id
    out["model_name"] = response.model_name
    out["model_version"] = response.model_version
    out.update(response.parameters)
    for tensor in response.outputs:
        if tensor.datatype == "FP16":
            values: Any = tensor.data.astype(np.float32).reshape(-1).tolist()
        else:
            values = kserve.json_data(tensor.datatype, tensor.data)
            if values is None:
                raise internal(f"output '{tensor.name}' holds bytes that are not UTF-8 text")
            if isinstance(values, np.ndarray):
                values = values.tolist()
        out[tensor.name] = values[0] if len(values) == 1 else values
    return out
