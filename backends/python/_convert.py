"""Conversions between trident's core types and the ``pb_utils`` objects model code sees.

Tensors are wrapped, never copied (BYTES arrays of ``str`` or numpy strings are the one
exception: they become object arrays of ``bytes``). Used by the in-process instances, the BLS
runtime and both sides of the process-isolated mode.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from trident.backends.python import pb_utils
from trident.errors import Code, TritonError, internal
from trident.types import InferenceRequest, InferenceResponse, ParamValue, RequestedOutput, Tensor

#: request parameters Triton consumes itself; models see the others through parameters()
RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)


def bytes_array(array: np.ndarray) -> np.ndarray:
    """``array`` as an object array of bytes (str is UTF-8 encoded, other objects via str())."""
    if array.dtype == object:
        flat = array.reshape(-1)
        if all(type(x) is bytes for x in flat):
            return array
        items = flat.tolist()
    else:  # 'S' or 'U'
        items = array.reshape(-1).tolist()
    out = np.empty(len(items), dtype=object)
    out[:] = [
        x if isinstance(x, bytes) else x.encode("utf-8") if isinstance(x, str) else str(x).encode("utf-8")
        for x in items
    ]
    return out.reshape(array.shape)


def to_tensor(t: pb_utils.Tensor) -> Tensor:
    """A model's ``pb_utils.Tensor`` as a trident Tensor (same array)."""
    array = t._array  # not as_numpy(): BF16 travels as its uint16 bit patterns
    datatype = t._datatype
    if datatype == "BYTES":
        array = bytes_array(array)
    return Tensor(t._name, datatype, array.shape, array)  # numpy shapes are tuples of ints


def to_pb_tensor(t: Tensor) -> pb_utils.Tensor:
    return pb_utils.Tensor._wrap(t.name, t.data, t.datatype)


def request_view(request: InferenceRequest) -> tuple[int | str, int, int, str]:
    """(correlation_id, flags, timeout, custom parameters JSON) of a request, as Triton shows them."""
    params = request.parameters
    correlation_id: int | str = 0
    flags = 0
    timeout = 0
    custom_json = "{}"
    if params:
        seq = params.get("sequence_id", 0)
        correlation_id = seq if isinstance(seq, (int, str)) and not isinstance(seq, bool) else 0
        if params.get("sequence_start"):
            flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        if params.get("sequence_end"):
            flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        t = params.get("timeout", 0)
        timeout = int(t) if isinstance(t, (int, float)) else 0
        custom = {k: v for k, v in params.items() if k not in RESERVED_PARAMETERS}
        if custom:
            custom_json = json.dumps(custom)
    return correlation_id, flags, timeout, custom_json


def wrap_request(request: InferenceRequest, all_outputs: list[str]) -> pb_utils.InferenceRequest:
    """The ``pb_utils.InferenceRequest`` a model's ``execute`` receives for ``request``."""
    correlation_id, flags, timeout, custom_json = request_view(request)
    requested = [o.name for o in request.outputs] if request.outputs else list(all_outputs)
    return pb_utils.InferenceRequest._wrap(request, requested, correlation_id, flags, timeout, custom_json)


def to_response(response: pb_utils.InferenceResponse, failure: str = "") -> InferenceResponse:
    """A model's ``pb_utils.InferenceResponse`` as a trident response (error kept as error).

    ``failure`` prefixes a conversion error's message.
    """
    error = response._error
    if error is not None:
        return InferenceResponse(error=TritonError(Code[error.code().name], error.message()))
    try:
        outputs = [to_tensor(t) for t in response._outputs]
    except Exception as e:
        return InferenceResponse(error=internal(f"{failure}cannot convert outputs: {type(e).__name__}: {e}"))
    params: dict[str, ParamValue] = response._param_dict
    return InferenceResponse(outputs=outputs, parameters=dict(params)) if params else InferenceResponse(outputs=outputs)


def to_pb_response(response: InferenceResponse) -> pb_utils.InferenceResponse:
    """A trident response (a BLS callee's) as the ``pb_utils.InferenceResponse`` a model reads."""
    if response.error is not None:
        code = pb_utils.TritonError.ErrorCode[response.error.code.name]
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(response.error.message, code))
    params = dict(response.parameters)
    return pb_utils.InferenceResponse([to_pb_tensor(t) for t in response.outputs], parameters=params or None)


def error_response(code: Code, message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, pb_utils.TritonError.ErrorCode[code.name])
    )


def to_request(request: pb_utils.InferenceRequest) -> InferenceRequest:
    """A model-built (BLS) ``pb_utils.InferenceRequest`` as a trident request.

    Correlation id and sequence flags become the ``sequence_*`` parameters, the timeout (µs)
    the ``timeout`` parameter. Raises TritonError(INVALID_ARG) for bad parameters JSON.
    """
    try:
        params: dict[str, Any] = json.loads(request.parameters() or "{}")
    except ValueError as e:
        raise TritonError(Code.INVALID_ARG, f"BLS request parameters are not JSON: {e}") from None
    correlation = request.correlation_id()
    if correlation:
        params["sequence_id"] = correlation
    flags = request.flags()
    if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        params["sequence_start"] = True
    if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        params["sequence_end"] = True
    if request.timeout():
        params["timeout"] = int(request.timeout())
    version = request._model_version
    return InferenceRequest(
        model_name=request._model_name,
        inputs=[to_tensor(t) for t in request.inputs()],
        model_version="" if version is None or int(version) < 0 else str(int(version)),
        id=request.request_id(),
        outputs=[RequestedOutput(n) for n in request.requested_output_names()],
        parameters=params,
    )
