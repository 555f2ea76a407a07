"""Conversions between trident's core types and the ``pb_utils`` objects model code sees.

Tensors are wrapped, never copied (BYTES arrays of ``str`` or numpy strings are the one
exception: they become object arrays of ``bytes``). Used by the in-process instances, the BLS
runtime and both sides of the process-isolated mode.

GPU tensors (``pb_utils.DeviceTensor``): in trident's core types a tensor's data is host memory
that anyone may read, so a device tensor leaving a model is copied to the host (:func:`to_tensor`)
except where its way is known to end in another Python model of this process that takes device
tensors (``keep_device``: a BLS request's inputs, and its callee's outputs, see
:mod:`._runtime`); there it travels as a :class:`~._dlpack.DeviceView` and arrives as the same
device memory. A DeviceView reaching a model that takes CPU tensors only is copied to the host
there (:func:`to_input_tensor`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from trident import priority
from trident.backends.python import _cuda, _wire, pb_utils
from trident.backends.python._dlpack import KDL_CUDA, DeviceBuffer, DeviceView
from trident.backends.python._pb_tensor import DeviceTensor
from trident.backends.python._wire import WireInput
from trident.errors import Code, TritonError, internal
from trident.protocol import datatypes
from trident.types import (
    InferenceRequest,
    InferenceResponse,
    ParamValue,
    RequestedOutput,
    Tensor,
    WireBytesTensor,
    device_source_of,
)

log = logging.getLogger("trident.backends.python")

#: request parameters Triton consumes itself; models see the others through parameters()
RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)


_BYTES_ONLY = {bytes}


def bytes_array(array: np.ndarray) -> np.ndarray:
    """``array`` as an object array of bytes (str is UTF-8 encoded, other objects via str()).
    A large one is checked and converted a slice at a time by C code (a Python loop over 15M
    elements took ~1 s; one ``tolist`` of them holds the GIL ~100 ms)."""
    flat = array.reshape(-1)
    size = flat.size
    if array.dtype == object and all(
            set(map(type, flat[start : start + datatypes.FILL_SLICE].tolist())) <= _BYTES_ONLY
            for start in range(0, size, datatypes.FILL_SLICE)):
        return array
    slices = (_encoded(flat[start : start + datatypes.FILL_SLICE].tolist())
              for start in range(0, size, datatypes.FILL_SLICE))
    return datatypes.object_array(slices, size).reshape(array.shape)


def _encoded(items: list[Any]) -> list[bytes]:
    return [x if isinstance(x, bytes) else x.encode("utf-8") if isinstance(x, str) else str(x).encode("utf-8")
            for x in items]


def to_tensor(t: pb_utils.Tensor, keep_device: bool = False) -> Tensor:
    """A model's ``pb_utils.Tensor`` as a trident Tensor (same array). A device tensor is
    copied to the host unless ``keep_device`` (then its data is its DeviceView). Raises
    TritonModelException when that copy is impossible (no CUDA library) or fails."""
    datatype = t._datatype
    if datatype == "BYTES":
        wire = t.unread() if type(t) is WireInput else None
        if wire is not None:  # a request input passed on unread (a BLS call's input, most often)
            return WireBytesTensor(t._name, tuple(t.shape()), wire)
        array = t._array
        if array.size <= datatypes.FILL_SLICE:
            return _bytes_tensor(t._name, array)
        with priority.in_background():  # the model's thread: the event loop's thread comes first
            return _bytes_tensor(t._name, array)
    array = t._array  # not as_numpy(): BF16 travels as its uint16 bit patterns
    if type(array) is DeviceView and not keep_device:
        array = t._host_copy()  # type: ignore[attr-defined]  # a DeviceTensor's
    return Tensor(t._name, datatype, array.shape, array)  # numpy shapes are tuples of ints


def _bytes_tensor(name: str, array: np.ndarray) -> Tensor:
    wire = _wire.handed_wire(array)
    if wire is not None:  # an input's array returned unchanged: its wire form is the answer's
        return WireBytesTensor(name, array.shape, wire, data=array)
    array = bytes_array(array)
    return Tensor(name, "BYTES", array.shape, array)


def to_pb_tensor(t: Tensor) -> pb_utils.Tensor:
    """A core tensor as the model sees it: a DeviceView becomes the DeviceTensor it stands for,
    a tensor in its wire form a :class:`~._wire.WireInput`."""
    if type(t) is WireBytesTensor:
        return WireInput(t)
    data = t.data
    if type(data) is DeviceView and data.device_buffer is not None:
        return DeviceTensor._over(t.name, data.device_buffer, data)
    return pb_utils.Tensor._wrap(t.name, data, t.datatype)


def to_input_tensor(t: Tensor, device_inputs: bool) -> pb_utils.Tensor:
    """A request input as a model's ``execute`` sees it. ``device_inputs``
    (FORCE_CPU_ONLY_INPUT_TENSORS "no"): a device tensor stays one, and an input read from a
    client's CUDA shared memory is a device tensor over that memory; otherwise both are CPU
    tensors (the former copied to the host here). Raises TritonModelException when that copy
    is impossible."""
    if type(t) is WireBytesTensor:
        return WireInput(t)
    data = t.data
    if type(data) is DeviceView:
        if device_inputs and data.device_buffer is not None:
            return DeviceTensor._over(t.name, data.device_buffer, data)
        return pb_utils.Tensor._wrap(t.name, host_copy(data, t.name), t.datatype)
    if device_inputs and t.datatype != "BYTES":
        source = device_source_of(data)
        if source is not None:
            device_id, pointer, owner = source
            buffer = DeviceBuffer(KDL_CUDA, device_id, pointer, tuple(int(d) for d in data.shape), t.datatype,
                                  int(data.nbytes), owner)
            return DeviceTensor._over(t.name, buffer)
    return pb_utils.Tensor._wrap(t.name, data, t.datatype)


def host_copy(view: DeviceView, name: str) -> np.ndarray:
    """The values a DeviceView stands for, copied to the host. Raises TritonModelException."""
    buffer = view.device_buffer
    assert buffer is not None
    return _cuda.to_host(buffer, f"tensor '{name}' in {buffer.describe()}: a copy to the host")


def host_tensors(tensors: list[Tensor]) -> list[Tensor]:
    """``tensors`` with every DeviceView replaced by a host copy (the same list when there is
    none). Raises TritonModelException when a copy is impossible."""
    if not any(type(t.data) is DeviceView for t in tensors):
        return tensors
    return [Tensor(t.name, t.datatype, t.shape, host_copy(t.data, t.name), t.parameters)  # type: ignore[arg-type]
            if type(t.data) is DeviceView else t for t in tensors]


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


def wrap_request(request: InferenceRequest, all_outputs: list[str],
                 device_inputs: bool = False) -> pb_utils.InferenceRequest:
    """The ``pb_utils.InferenceRequest`` a model's ``execute`` receives for ``request``
    (``device_inputs``: see :func:`to_input_tensor`; the inputs are then wrapped at once, and
    this raises TritonModelException as it does)."""
    correlation_id, flags, timeout, custom_json = request_view(request)
    requested = [o.name for o in request.outputs] if request.outputs else list(all_outputs)
    wrapped = pb_utils.InferenceRequest._wrap(request, requested, correlation_id, flags, timeout, custom_json)
    if device_inputs:
        wrapped._inputs = [to_input_tensor(t, True) for t in request.inputs]
    return wrapped


#: ids of BLS requests (trident InferenceRequests) whose callee may answer with device tensors
#: kept on the device (:mod:`._runtime` adds one for the time its call runs)
DEVICE_OUTPUT_REQUESTS: set[int] = set()


def to_response(response: pb_utils.InferenceResponse, failure: str = "",
                request: InferenceRequest | None = None) -> InferenceResponse:
    """A model's ``pb_utils.InferenceResponse`` as a trident response (error kept as error).

    ``failure`` prefixes a conversion error's message. A device output stays on the device
    when ``request`` is a BLS request in DEVICE_OUTPUT_REQUESTS, else it is copied to the host
    (an error response when that is impossible).
    """
    error = response._error
    if error is not None:
        return InferenceResponse(error=TritonError(Code[error.code().name], error.message()))
    try:
        outputs = [to_tensor(t) if t._datatype == "BYTES" or type(t._array) is not DeviceView
                   else to_tensor(t, request is not None and id(request) in DEVICE_OUTPUT_REQUESTS)
                   for t in response._outputs]
    except Exception as e:
        return InferenceResponse(error=internal(f"{failure}cannot convert outputs: {type(e).__name__}: {e}"))
    params: dict[str, ParamValue] = response._param_dict
    return InferenceResponse(outputs=outputs, parameters=dict(params)) if params else InferenceResponse(outputs=outputs)


def to_pb_response(response: InferenceResponse,
                   memory: pb_utils.PreferredMemory | None = None) -> pb_utils.InferenceResponse:
    """A trident response (a BLS callee's) as the ``pb_utils.InferenceResponse`` a model reads.

    ``memory`` is the BLS request's ``preferred_memory``: None leaves each output where it came
    (a callee's device output only stays on the device where :mod:`._runtime` allowed it);
    ``TRITONSERVER_MEMORY_CPU`` copies device outputs to the host; ``TRITONSERVER_MEMORY_GPU``
    copies host outputs (not BYTES) to that device, or leaves them on the host with a warning
    where no CUDA library can. A copy that fails makes the response an error response.
    """
    if response.error is not None:
        code = pb_utils.TritonError.ErrorCode[response.error.code.name]
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(response.error.message, code))
    params = dict(response.parameters)
    outputs = [to_pb_tensor(t) for t in response.outputs]
    if memory is not None:
        try:
            outputs = _place(outputs, memory)
        except pb_utils.TritonModelException as e:
            return error_response(Code.INTERNAL, f"BLS response outputs to {_memory_name(memory)} memory: {e}")
    return pb_utils.InferenceResponse(outputs, parameters=params or None)


def _memory_name(memory: pb_utils.PreferredMemory) -> str:
    return "CPU" if memory.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_CPU else "GPU"


_warned_no_gpu = False


def _place(outputs: list[pb_utils.Tensor], memory: pb_utils.PreferredMemory) -> list[pb_utils.Tensor]:
    """``outputs`` moved to the preferred memory (see :func:`to_pb_response`)."""
    global _warned_no_gpu
    if memory.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_CPU:
        return [pb_utils.Tensor._wrap(t._name, t._host_copy(), t._datatype) if isinstance(t, DeviceTensor) else t
                for t in outputs]
    placed = []
    for t in outputs:
        if isinstance(t, DeviceTensor) or t._datatype == "BYTES":
            placed.append(t)
            continue
        device_id = int(memory.preferred_device_id)
        try:
            buffer = _cuda.to_device(t._array, t._datatype, device_id,
                                     f"BLS output '{t._name}' to GPU {device_id} (PreferredMemory)")
        except _cuda.CudaUnavailable as e:
            if not _warned_no_gpu:
                _warned_no_gpu = True
                log.warning("%s; BLS outputs stay in CPU memory", e)
            return outputs
        placed.append(DeviceTensor._over(t._name, buffer))
    return placed


def error_response(code: Code, message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(message, pb_utils.TritonError.ErrorCode[code.name])
    )


def to_request(request: pb_utils.InferenceRequest, keep_device: bool = False) -> InferenceRequest:
    """A model-built (BLS) ``pb_utils.InferenceRequest`` as a trident request.

    Correlation id and sequence flags become the ``sequence_*`` parameters, the timeout (µs)
    the ``timeout`` parameter. Device inputs are copied to the host unless ``keep_device``.
    Raises TritonError: INVALID_ARG for bad parameters JSON, INTERNAL when a device input cannot
    be copied to the host.
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
    try:
        inputs = [to_tensor(t, keep_device) for t in request.inputs()]
    except pb_utils.TritonModelException as e:
        raise TritonError(Code.INTERNAL, f"BLS request to '{request._model_name}': {e}") from None
    return InferenceRequest(
        model_name=request._model_name,
        inputs=inputs,
        model_version="" if version is None or int(version) < 0 else str(int(version)),
        id=request.request_id(),
        outputs=[RequestedOutput(n) for n in request.requested_output_names()],
        parameters=params,
    )
