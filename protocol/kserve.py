"""KServe v2 HTTP codec: JSON requests/responses, the binary tensor extension, compression (sans-IO).

Requests are decoded once into :class:`~trident.types.InferenceRequest` with numpy tensors:
binary blobs become ``np.frombuffer`` views over the body (no copy for fixed-size types; the
array is writable when the body is a ``bytearray``), JSON ``data`` lists go through one
``np.asarray``. Responses are encoded into a list of byte parts (the JSON header, then one blob
per binary output) so large outputs are not copied again before they reach the transport.

Choices where Triton is silent or inconsistent (documented in README "HTTP"):

* A JSON ``data`` value must match the datatype as Triton requires (integers for integer types,
  ``true``/``false`` for BOOL, strings for BYTES, numbers for floats); integers that do not fit
  the datatype are rejected instead of wrapping. Element-count mismatches are INVALID_ARG.
* FP16 and BF16 *inputs* must be binary (Triton's INVALID_ARG). FP16/BF16 *outputs* requested
  as JSON are written as JSON numbers, which is exact (Triton refuses them).
* NaN and infinities have no JSON form: they are written as ``null`` (request ``binary_data``
  for exact values). A BYTES output that is not valid UTF-8 cannot be a JSON string, so that
  output is sent binary (``binary_data_size``) even when JSON was requested; tritonclient reads
  either form.
* ``binary_data_output`` is the default for every output, and an output's own ``binary_data``
  overrides it (the extension's documented rule).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import orjson

from trident.errors import Code, TritonError, internal, invalid_arg, unsupported
from trident.protocol import datatypes, json_slices
from trident.protocol.compression import Inflater, choose_encoding, compress, decode_base64, decompress
from trident.types import (
    Duration,
    IndexEntry,
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    ModelStatistics,
    ParamValue,
    RequestedOutput,
    ServerMetadata,
    Tensor,
    TensorMetadata,
    WireBytesTensor,
    wire_of,
)

_OPT_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def dumps(obj: Any) -> bytes:
    """Serialize to compact UTF-8 JSON (numpy arrays allowed)."""
    return orjson.dumps(obj, option=_OPT_NUMPY)

__all__ = [
    "Inflater",
    "choose_encoding",
    "compress",
    "decode_base64",
    "decode_infer_request",
    "decode_raw_request",
    "decompress",
    "dumps",
    "encode_infer_response",
    "error_body",
    "is_heavy",
    "parse_json",
]

_EMPTY: dict[str, Any] = {}
_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
_SHM_UNSUPPORTED = "shared memory extension is not supported yet"
#: ``shm(region, offset, byte_size) -> memoryview``: the bytes of a shared-memory tensor, from
#: the server's registry (trident.server.shared_memory); None: shared memory is not available
ShmLookup = Callable[[str, int, int], memoryview]
#: ``shm(region, offset, byte_size) -> window``: where an output is written, ``window[:n] = blob``
#: (a writable memoryview of a system region, or the server's window onto a CUDA region)
ShmOutputLookup = Callable[[str, int, int], Any]
#: ``check(input_name, datatype, shape)``: raises the TritonError the model's admission would
#: for that input (a name it does not declare, another datatype, a shape its dims refuse); the
#: decoders call it before they read the input's data
InputCheck = Callable[[str, str, tuple[int, ...]], None]
# request parameters with a meaning of their own, and the JSON types they must have
_RESERVED_BOOL = ("sequence_start", "sequence_end", "binary_data_output")
_RESERVED_UINT = ("priority", "timeout")
MAX_DIMS = 64  # numpy's limit on the dimensions of an array
_MAX_DIM = (1 << 63) - 1  # a dimension is an int64 on the wire (and in numpy)
_CONVERT_CHUNK = 1 << 13  # JSON data longer than this is converted to numpy in slices of it
LARGE_JSON = 1 << 20  # JSON documents from this size are parsed in slices (parse_json)
_ENCODE_SLICE = 1 << 13  # elements of an output's JSON data encoded at once (~0.2 ms)
_SPLICE_PIECE = 1 << 20  # bytes of a long JSON response per part
_LIST_MARKER = "\u0000trident-list:"  # a placeholder no client string can be (outputs come from models)


def parse_json(body: bytes | bytearray | memoryview, convert: json_slices.Convert | None = None) -> Any:
    """Parse a JSON document; raises INVALID_ARG with Triton's message prefix on bad JSON.

    A document of ``LARGE_JSON`` bytes or more is parsed with its long ``"data"`` lists in
    slices (trident.protocol.json_slices), so the thread parsing it lets others run between
    slices; the result is the same, except that with ``convert`` each long list is a
    json_slices.SlicedList of ``convert``-ed slices.
    """
    try:
        if len(body) >= LARGE_JSON:
            return json_slices.loads(body, orjson.loads, json_slices.SLICE_SIZE, convert)
        return orjson.loads(body)
    except ValueError as exc:  # orjson.JSONDecodeError (invalid UTF-8 included)
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None


def error_body(message: str) -> bytes:
    """The HTTP error body ``{"error": "<message>"}``."""
    return dumps({"error": message})


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------


def decode_infer_request(
    body: bytes | bytearray | memoryview,
    header_length: int | None,
    model_name: str,
    model_version: str,
    shm: ShmLookup | None = None,
    check: InputCheck | None = None,
) -> InferenceRequest:
    """Decode a KServe v2 infer request body (JSON header, then binary blobs).

    ``header_length`` is the ``Inference-Header-Content-Length`` header (None when absent:
    the whole body is JSON). A value of 0 announces a raw binary body, which needs the model's
    input metadata: use :func:`decode_raw_request` for that. ``shm`` reads inputs that name a
    shared-memory region (as numpy views of it, no copy); without it they are UNSUPPORTED.

    Raises TritonError INVALID_ARG for malformed JSON, a bad header length, bad tensors
    (unknown datatype, bad shape, element count or blob size mismatches, undecodable BYTES,
    JSON FP16/BF16) and unconsumed trailing bytes; UNSUPPORTED for shared-memory tensors.

    ``check`` (:data:`InputCheck`) is called with each input's name, datatype and shape before
    its data is read and raises what the model's admission would, so a large body the model
    refuses anyway (15M BYTES elements for an FP32 input) costs no decoding; without it the
    server's admission makes the same checks after the decode.
    """
    view = memoryview(body).cast("B") if not isinstance(body, bytes) else memoryview(body)
    total = len(view)
    explicit_length = header_length is not None
    if header_length is None:
        header_length = total
    elif header_length == 0:
        raise invalid_arg(
            "a raw binary request (Inference-Header-Content-Length: 0) needs the model's input; "
            "decode it with decode_raw_request"
        )
    elif header_length < 0 or header_length > total:
        raise invalid_arg(f"inference header size should be in range (0, {total}), got: {header_length}")
    try:
        doc = parse_json(view[:header_length] if header_length < total else view, _convert_slice)
    except TritonError as e:
        if not explicit_length:
            raise
        raise invalid_arg(f"{e.message} (Inference-Header-Content-Length is {header_length}: the JSON "
                          f"header must be exactly the first {header_length} bytes of the body)") from None
    if not isinstance(doc, dict):
        raise invalid_arg("failed to parse the request JSON buffer: the request must be a JSON object")

    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_arg("Unable to parse 'id': expected a string")
    params = doc.get("parameters")
    parameters = _request_parameters(params) if params is not None else {}

    inputs_json = doc.get("inputs")
    if not isinstance(inputs_json, list):
        raise invalid_arg("Unable to parse 'inputs': the request must have an 'inputs' array")
    offset = header_length
    inputs: list[Tensor] = []
    seen: set[str] = set()
    try:
        for item in inputs_json:
            tensor, offset = _decode_input(item, view, offset, header_length < total, model_name, shm, check)
            if tensor.name in seen:
                raise invalid_arg(f"input '{tensor.name}' appears more than once in the request")
            seen.add(tensor.name)
            inputs.append(tensor)
    except BaseException:
        _release_slices(inputs_json)
        raise
    if offset != total:
        raise invalid_arg(
            f"unexpected additional input data for model '{model_name}': "
            f"{total - offset} bytes after the last binary input"
        )

    outputs_json = doc.get("outputs")
    outputs = _requested_outputs(outputs_json) if outputs_json is not None else []
    return InferenceRequest(
        model_name=model_name,
        inputs=inputs,
        model_version=model_version,
        id=request_id,
        outputs=outputs,
        parameters=parameters,
    )


def is_heavy(body: bytes | bytearray | memoryview, header_length: int | None, threshold: int) -> bool:
    """Whether decoding this infer request body may take long (a caller moves it off its loop).

    True when the JSON part reaches ``threshold`` bytes, or when the binary part does and the
    JSON part names a BYTES tensor (BYTES blobs are split element by element). Fixed-size
    binary tensors are views over the body: cheap whatever their size.
    """
    total = len(body)
    if total < threshold:
        return False
    if header_length is None or header_length <= 0 or header_length >= total:
        return True
    if header_length >= threshold:
        return True
    return b"BYTES" in memoryview(body)[:header_length].tobytes()


def decode_raw_request(
    body: bytes | bytearray | memoryview,
    model_name: str,
    model_version: str,
    input_name: str,
    datatype: str,
    shape: Sequence[int],
) -> InferenceRequest:
    """Decode a raw binary body (``Inference-Header-Content-Length: 0``) for a one-input model.

    ``shape`` is the input's full shape with the batch dimension (if any) already set to 1; at
    most one dimension may be -1 and is deduced from the body size. For BYTES the whole body is
    one element and the shape must hold exactly one element (Triton's rule).

    Raises TritonError INVALID_ARG when the shape cannot be deduced or the body size does not fit.
    """
    view = memoryview(body).cast("B") if not isinstance(body, bytes) else memoryview(body)
    dims = [int(d) for d in shape]
    variable = [i for i, d in enumerate(dims) if d == -1]
    if datatype == "BYTES":
        if variable or datatypes.element_count(dims) != 1:
            raise invalid_arg(
                f"For BYTE datatype raw input '{input_name}', the model must have input shape [1]"
            )
        data = np.empty(1, dtype=object)
        data[0] = bytes(view)
        return InferenceRequest(
            model_name, [Tensor(input_name, "BYTES", tuple(dims), data.reshape(dims))], model_version
        )
    if not datatypes.is_datatype(datatype):
        raise invalid_arg(f"invalid datatype '{datatype}' for input '{input_name}'")
    if len(variable) > 1:
        raise invalid_arg(
            f"The shape of the raw input '{input_name}' can not be deduced because there are more "
            "than one variable-sized dimension"
        )
    size = datatypes.element_size(datatype) or 1
    fixed = datatypes.element_count(d for d in dims if d != -1)
    if variable:
        unit = fixed * size
        if unit == 0 or len(view) % unit:
            raise invalid_arg(
                f"raw input '{input_name}' of {len(view)} bytes is not a whole number of "
                f"{datatype} elements of shape {_dims_str(dims)}"
            )
        dims[variable[0]] = len(view) // unit
    elif len(view) != fixed * size:
        raise invalid_arg(
            f"unexpected size for raw input '{input_name}': got {len(view)} bytes, its datatype "
            f"{datatype} and shape {_dims_str(dims)} need {fixed * size}"
        )
    array = np.frombuffer(view, dtype=datatypes.numpy_dtype(datatype)).reshape(dims)
    return InferenceRequest(model_name, [Tensor(input_name, datatype, tuple(dims), array)], model_version)


def _dims_str(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _request_parameters(params: Any) -> dict[str, ParamValue]:
    if not isinstance(params, dict):
        raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
    for key, value in params.items():
        if key.startswith("triton_"):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should "
                "not be specified."
            )
        if key in _RESERVED_BOOL:
            if not isinstance(value, bool):
                raise invalid_arg(f"Unable to parse '{key}': expected a boolean")
        elif key in _RESERVED_UINT:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid_arg(f"Unable to parse '{key}': expected an unsigned integer")
        elif key == "sequence_id":
            if isinstance(value, bool) or not (
                isinstance(value, str) or (isinstance(value, int) and value >= 0)
            ):
                raise invalid_arg("Unable to parse 'sequence_id': expected an unsigned integer or a string")
        elif not isinstance(value, (str, int, float)):
            raise invalid_arg(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
            )
    return params


def _tensor_parameters(params: dict[str, Any], where: str, skip: str) -> dict[str, ParamValue]:
    out: dict[str, ParamValue] = {}
    for key, value in params.items():
        if key == skip:
            continue
        if not isinstance(value, (str, int, float)):
            raise invalid_arg(
                f"parameter '{key}' of {where} has invalid type. It should be either 'int', 'bool', "
                "'float' or 'string'."
            )
        out[key] = value
    return out


def shm_parameters(params: Any, where: str) -> tuple[str, int, int]:
    """``(region, offset, byte_size)`` of a tensor's shared-memory parameters (a dict holding
    ``shared_memory_region``). Raises INVALID_ARG for a missing byte size or a bad type."""
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if not isinstance(region, str) or not region:
        raise invalid_arg(f"Unable to parse 'shared_memory_region' of {where}: expected a string")
    if size is None:
        raise invalid_arg(f"'shared_memory_byte_size' must be set with 'shared_memory_region' for {where}")
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid_arg(f"Unable to parse '{key}' of {where}: expected a non-negative integer")
    return region, int(offset), int(size)


def _decode_input(
    item: Any, view: memoryview, offset: int, has_blobs: bool, model_name: str, shm: ShmLookup | None = None,
    check: InputCheck | None = None,
) -> tuple[Tensor, int]:
    if not isinstance(item, dict):
        raise invalid_arg("Unable to parse 'inputs': each input must be a JSON object")
    name = item.get("name")
    if not isinstance(name, str):
        raise invalid_arg("Unable to parse 'name': each input needs a string 'name'")
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise invalid_arg(f"Unable to parse 'datatype' of input '{name}'")
    shape_json: Any = item.get("shape")
    count = 1  # the element count, -1 when the shape needs a closer look (one loop for the common case)
    if type(shape_json) is list and len(shape_json) <= MAX_DIMS:
        for d in shape_json:
            if type(d) is not int or d < 0 or d > _MAX_DIM:  # bool is not a dimension
                count = -1
                break
            count *= d
    else:
        count = -1
    if count < 0:
        if not isinstance(shape_json, list) or not all(type(d) is int and d >= 0 for d in shape_json):
            raise invalid_arg(f"Unable to parse 'shape' of input '{name}': expected non-negative integers")
        if len(shape_json) > MAX_DIMS:
            raise invalid_arg(
                f"invalid shape for input '{name}': {len(shape_json)} dimensions, at most {MAX_DIMS} are supported"
            )
        if any(d > _MAX_DIM for d in shape_json):
            raise invalid_arg(f"invalid shape for input '{name}': a dimension exceeds {_MAX_DIM}")
        count = datatypes.element_count(shape_json)
    shape = tuple(shape_json)
    params = item.get("parameters", _EMPTY)
    if not isinstance(params, dict):
        raise invalid_arg(f"Unable to parse 'parameters' of input '{name}': expected a JSON object")
    has_data = "data" in item
    has_binary = "binary_data_size" in params
    has_shm = "shared_memory_region" in params
    if has_data + has_binary + has_shm != 1:
        found = " ".join(
            f"'{k}'"
            for k, on in (
                ("data", has_data),
                ("binary_data_size", has_binary),
                ("shared_memory_region", has_shm),
            )
            if on
        )
        raise invalid_arg(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But "
            + (f"set {found}" if found else "no field is set")
            + f" for input '{name}'"
        )
    if has_shm and shm is None:
        raise unsupported(f"input '{name}': {_SHM_UNSUPPORTED}")
    if not datatypes.is_datatype(datatype):
        raise invalid_arg(f"invalid datatype '{datatype}' for input '{name}'")
    if check is not None:
        check(name, datatype, shape)
    if has_shm:
        assert shm is not None
        region, shm_offset, shm_size = shm_parameters(params, f"input '{name}'")
        blob = shm(region, shm_offset, shm_size)
        array = shm_array(name, datatype, shape, count, blob, model_name)
        kept = _tensor_parameters(without_shm_parameters(params), f"input '{name}'", "")
        return Tensor(name, datatype, shape, array, kept), offset
    tensor_params = _tensor_parameters(params, f"input '{name}'", "binary_data_size") if params else {}

    if has_binary:
        size = params["binary_data_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise invalid_arg(f"Unable to parse 'binary_data_size' of input '{name}'")
        end = offset + size
        if end > len(view):
            if not has_blobs:
                raise invalid_arg(
                    f"input '{name}' declares binary_data_size {size} but the request has no "
                    "binary data: send the Inference-Header-Content-Length header with the JSON size"
                )
            raise invalid_arg(
                f"unexpected size for input '{name}', expecting {end - len(view)} additional bytes "
                f"for model '{model_name}'"
            )
        if datatype == "BYTES" and count >= datatypes.WIRE_MIN:
            return WireBytesTensor(name, shape, parse_wire(name, count, view[offset:end]), tensor_params), end
        array = _blob_to_array(name, datatype, shape, count, view[offset:end])
        return Tensor(name, datatype, shape, array, tensor_params), end

    array = json_to_array(name, datatype, shape, count, item["data"])
    return Tensor(name, datatype, shape, array, tensor_params), offset


def without_shm_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """A tensor's parameters less the shared-memory ones (consumed when its data is read)."""
    return {k: v for k, v in params.items() if k not in _SHM_KEYS}


def shm_array(name: str, datatype: str, shape: tuple[int, ...], count: int, blob: memoryview,
              model_name: str) -> np.ndarray:
    """A shared-memory input as an array (a view of the region: no copy; BYTES are parsed).
    Raises INVALID_ARG, in Triton's words, when its byte size does not fit the shape."""
    itemsize = datatypes.element_size(datatype)
    if datatype != "BYTES" and itemsize and blob.nbytes != count * itemsize:
        raise invalid_arg(f"input byte size mismatch for input '{name}' for model '{model_name}'. Expected "
                          f"{count * itemsize}, got {blob.nbytes}")
    return _blob_to_array(name, datatype, shape, count, blob)


def parse_wire(name: str, count: int, blob: memoryview) -> datatypes.WireBytes:
    """A BYTES input's binary data checked to hold ``count`` elements, kept in its wire form.
    Raises INVALID_ARG as an object array's decode would."""
    try:
        return datatypes.WireBytes.parse(blob, count)
    except ValueError as exc:
        raise invalid_arg(f"unable to deserialize BYTES input '{name}': {exc}") from None


def _blob_to_array(
    name: str, datatype: str, shape: tuple[int, ...], count: int, blob: memoryview
) -> np.ndarray:
    if datatype == "BYTES":
        try:
            flat = datatypes.deserialize_bytes(blob, count)
        except ValueError as exc:
            raise invalid_arg(f"unable to deserialize BYTES input '{name}': {exc}") from None
        return flat.reshape(shape)
    itemsize = datatypes.element_size(datatype) or 1
    if len(blob) != count * itemsize:
        raise invalid_arg(
            f"input '{name}' has binary_data_size {len(blob)} but its datatype {datatype} and shape "
            f"{_dims_str(shape)} need {count * itemsize} bytes"
        )
    return np.frombuffer(blob, dtype=datatypes.numpy_dtype(datatype)).reshape(shape)


def _flatten(data: Any, out: list[Any]) -> None:
    for item in data:
        if isinstance(item, list):
            _flatten(item, out)
        else:
            out.append(item)


def _bad_data(name: str, datatype: str, why: str) -> TritonError:
    return invalid_arg(f"Unable to parse 'data' of input '{name}': {why} for datatype {datatype}")


def json_to_array(name: str, datatype: str, shape: tuple[int, ...], count: int, data: Any) -> np.ndarray:
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}"
        )
    if isinstance(data, json_slices.SlicedList):
        return _sliced_to_array(name, datatype, shape, count, data)
    if not isinstance(data, list):
        raise invalid_arg(f"Unable to parse 'data' of input '{name}': expected a JSON array")
    np_dtype = datatypes.numpy_dtype(datatype)
    if count == 0:
        flat: list[Any] = []
        _flatten(data, flat)
        if flat:
            raise _count_mismatch(name, len(flat), count, shape)
        try:
            return np.empty(shape, dtype=np_dtype)
        except (ValueError, MemoryError):
            raise invalid_arg(f"invalid shape {_dims_str(shape)} for input '{name}'") from None
    if datatype == "BYTES":
        return _json_to_bytes(name, shape, count, data)
    if (datatype == "FP32" or datatype == "FP64") and len(data) == count <= _CONVERT_CHUNK and _all_floats(data):
        # the usual small float input, flat: converted straight to its type (no float64 pass)
        return np.array(data, dtype=np_dtype).reshape(shape)

    try:
        arr = _asarray(data)
    except (ValueError, TypeError, OverflowError):  # ragged nesting: flatten like Triton does
        arr = None
    if arr is None or arr.dtype.kind == "O":
        flat = []
        _flatten(data, flat)
        try:
            arr = np.asarray(flat)
        except (ValueError, TypeError, OverflowError):
            arr = None
        if arr is None or arr.dtype.kind == "O":
            raise _bad_data(name, datatype, "expected numbers (or values out of range)")
    if arr.size != count:
        raise _count_mismatch(name, arr.size, count, shape)
    return _typed(name, datatype, shape, arr, lambda: data)


def _all_floats(data: list[Any]) -> bool:
    """Whether every element of ``data`` is a Python float (what JSON numbers with a fraction
    or an exponent parse to: no int beyond float's range, no bool, no nesting)."""
    for x in data:
        if type(x) is not float:
            return False
    return True


def _typed(name: str, datatype: str, shape: tuple[int, ...], arr: np.ndarray,
           elements: Callable[[], list[Any]]) -> np.ndarray:
    """``arr`` (numpy's reading of the JSON numbers, ``elements()`` the JSON values themselves)
    checked against ``datatype`` and cast to it, in ``shape``."""
    np_dtype = datatypes.numpy_dtype(datatype)
    kind = arr.dtype.kind
    target = np_dtype.kind
    if target == "b":
        if kind != "b":
            raise _bad_data(name, datatype, "expected true/false")
    elif target in "iu":
        info = np.iinfo(np_dtype)
        if kind == "f":  # numpy infers float64 when ints beyond int64 are mixed in: check exactly
            return _exact_ints(name, datatype, elements(), info, np_dtype).reshape(shape)
        if kind not in "iu":
            raise _bad_data(name, datatype, "expected integers")
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise _bad_data(name, datatype, f"integer out of range [{info.min}, {info.max}]")
    elif kind not in "iuf":
        raise _bad_data(name, datatype, "expected numbers")
    arr = arr.astype(np_dtype, copy=False)
    return arr if arr.shape == shape else arr.reshape(shape)


def _json_to_bytes(name: str, shape: tuple[int, ...], count: int, data: list[Any]) -> np.ndarray:
    if len(data) == count:  # flat (the usual form): no flattening pass
        try:
            items = [s.encode("utf-8") for s in data]
        except AttributeError:
            items = None  # nested lists, or not strings
    else:
        items = None
    if items is None:
        flat: list[Any] = []
        _flatten(data, flat)
        if len(flat) != count:
            raise _count_mismatch(name, len(flat), count, shape)
        try:
            items = [s.encode("utf-8") for s in flat]
        except AttributeError:
            raise _bad_data(name, "BYTES", "expected JSON strings") from None
    # in slices: the GIL can be handed over between them (datatypes.object_array)
    out = datatypes.object_array((items[i : i + _CONVERT_CHUNK] for i in range(0, count, _CONVERT_CHUNK)), count)
    return out.reshape(shape)


def _convert_slice(items: list[Any]) -> tuple[bool, np.ndarray]:
    """One parsed slice of a long JSON list (json_slices), kept as a small array so no long
    list of Python values is built: ``(True, bytes objects)`` for a slice of strings (UTF-8
    encoded, as BYTES wants them), else ``(False, numpy's reading of the values)``."""
    if items and type(items[0]) is str:
        try:
            encoded = [s.encode("utf-8") for s in items]
        except AttributeError:  # a non-string further on
            encoded = None
        out = np.empty(len(items), dtype=object)
        out[:] = items if encoded is None else encoded
        return encoded is not None, out
    try:
        return False, np.asarray(items)
    except (ValueError, TypeError, OverflowError):
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return False, out


_COPIED = (False, np.empty(0))  # where a part of a SlicedList was, once copied


def _release_slices(inputs_json: list[Any]) -> None:
    """Free the long JSON lists of a request that failed, a slice at a time (SlicedList.release)."""
    for item in inputs_json:
        data = item.get("data") if isinstance(item, dict) else None
        if isinstance(data, json_slices.SlicedList):
            data.release()


def _sliced_to_array(name: str, datatype: str, shape: tuple[int, ...], count: int,
                     data: json_slices.SlicedList) -> np.ndarray:
    """A long flat JSON list parsed slice by slice (its parts from :func:`_convert_slice`) as
    the input's array, filled slice by slice; equal to what the list would give."""
    if data.length != count:
        raise _count_mismatch(name, data.length, count, shape)
    parts: list[tuple[bool, np.ndarray]] = data.parts
    if datatype == "BYTES":
        if not all(encoded for encoded, _ in parts):
            raise _bad_data(name, "BYTES", "expected JSON strings")

        def taken() -> Iterator[np.ndarray]:  # each part freed once it is in the array
            for index in range(len(parts)):
                part = parts[index][1]
                parts[index] = _COPIED
                yield part

        return datatypes.object_array(taken(), count).reshape(shape)
    dtype = parts[0][1].dtype
    if any(encoded or part.dtype != dtype for encoded, part in parts) or dtype.kind == "O":
        # the slices disagree (ints, then floats) or hold what numpy cannot type: the
        # list as one parse gives it, then the usual path (rare, and slow for a long list)
        return json_to_array(name, datatype, shape, count, data.whole())
    out = np.empty(count, dtype=dtype)
    pos = 0
    for index in range(len(parts)):
        part = parts[index][1]
        out[pos:pos + part.size] = part
        pos += part.size
        parts[index] = _COPIED  # freed as it goes (SlicedList.release)
    return _typed(name, datatype, shape, out, data.whole)


def _asarray(data: list[Any]) -> np.ndarray:
    """``np.asarray(data)``; a long flat list is converted in slices (the GIL is released between them)."""
    n = len(data)
    if n <= _CONVERT_CHUNK:
        return np.asarray(data)
    out: np.ndarray | None = None
    for i in range(0, n, _CONVERT_CHUNK):
        part = np.asarray(data[i : i + _CONVERT_CHUNK])
        if part.ndim != 1 or part.dtype.kind == "O":  # nested or mixed: convert it whole
            return np.asarray(data)
        if out is None:
            out = np.empty(n, dtype=part.dtype)  # filled slice by slice: no whole-list copy at the end
        elif part.dtype != out.dtype:  # the slices disagree (ints, then floats): what numpy makes of all
            return np.asarray(data)
        out[i : i + part.size] = part
    assert out is not None
    return out


def _exact_ints(name: str, datatype: str, data: list[Any], info: Any, np_dtype: np.dtype) -> np.ndarray:
    flat: list[Any] = []
    _flatten(data, flat)
    if not all(type(x) is int for x in flat):
        raise _bad_data(name, datatype, "expected integers")
    if min(flat) < info.min or max(flat) > info.max:
        raise _bad_data(name, datatype, f"integer out of range [{info.min}, {info.max}]")
    return np.array(flat, dtype=np_dtype)


def _count_mismatch(name: str, got: int, count: int, shape: tuple[int, ...]) -> TritonError:
    return invalid_arg(
        f"Unable to parse 'data' of input '{name}': Shape does not match true shape of 'data' field "
        f"(shape {_dims_str(shape)} needs {count} elements, 'data' holds {got})"
    )


def _requested_outputs(outputs_json: Any) -> list[RequestedOutput]:
    if not isinstance(outputs_json, list):
        raise invalid_arg("Unable to parse 'outputs': expected a JSON array")
    outputs: list[RequestedOutput] = []
    names: set[str] = set()
    for item in outputs_json:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise invalid_arg("Unable to parse 'name': each requested output needs a string 'name'")
        name = item["name"]
        params = item.get("parameters", _EMPTY)
        if not isinstance(params, dict):
            raise invalid_arg(f"Unable to parse 'parameters' of output '{name}': expected a JSON object")
        if "shared_memory_region" in params:
            shm_parameters(params, f"output '{name}'")  # checked here; resolved when written
        elif any(k in params for k in _SHM_KEYS):
            raise invalid_arg(f"'shared_memory_region' must be set with the shared-memory parameters of "
                              f"output '{name}'")
        if "binary_data" in params and not isinstance(params["binary_data"], bool):
            raise invalid_arg(f"Unable to parse 'binary_data' of output '{name}': expected a boolean")
        cls = params.get("classification")
        if cls is not None and (isinstance(cls, bool) or not isinstance(cls, int) or cls < 0):
            raise invalid_arg(
                f"Unable to set 'classification' of output '{name}': expected an unsigned integer"
            )
        if name in names:
            continue
        names.add(name)
        outputs.append(
            RequestedOutput(name, _tensor_parameters(params, f"output '{name}'", "") if params else {})
        )
    return outputs


# ---------------------------------------------------------------------------------------------
# responses
# ---------------------------------------------------------------------------------------------


def encode_infer_response(
    response: InferenceResponse,
    requested: Sequence[RequestedOutput],
    binary_default: bool,
    shm: ShmOutputLookup | None = None,
) -> tuple[list[bytes | memoryview], int | None]:
    """Encode a response as KServe v2 JSON plus binary blobs.

    Returns ``(parts, header_length)``: the body is ``b"".join(parts)``; ``header_length`` is
    the JSON size for the ``Inference-Header-Content-Length`` header, or None when no blob
    follows (then the body is plain JSON). The JSON is one part, or for an output with a long
    JSON ``data`` list, several (encoded slice by slice and never joined: a caller writes them
    in turn or joins them). An output is binary when its requested parameters say
    ``binary_data: true``, or when they say nothing and ``binary_default`` (the request's
    ``binary_data_output``) is true.

    An output requested with ``shared_memory_region`` is written into that region through
    ``shm`` (the same lookup as for inputs) and appears with its name, datatype and shape only.

    Raises the response's own ``error`` if it carries one, TritonError INVALID_ARG for an
    FP16 or BF16 output asked for as JSON (Triton's refusal), and INTERNAL when an output's
    data does not match its shape or does not fit its shared-memory region (as the lookup's
    errors: NOT_FOUND, INVALID_ARG, UNSUPPORTED without ``shm``).
    """
    if response.error is not None:
        raise response.error
    per_output: dict[str, Any] | None = None
    to_shm: dict[str, dict[str, ParamValue]] | None = None
    if requested:
        per_output = {o.name: o.parameters.get("binary_data") for o in requested}
        to_shm = {o.name: o.parameters for o in requested if "shared_memory_region" in o.parameters} or None
    blobs: list[bytes | memoryview] = []
    outputs_json: list[dict[str, Any]] = []
    for tensor in response.outputs:
        if to_shm is not None and tensor.name in to_shm:
            outputs_json.append(_shm_output(tensor, to_shm[tensor.name], shm))
            continue
        binary = binary_default
        if per_output is not None:
            flag = per_output.get(tensor.name)
            if flag is not None:
                binary = bool(flag)
        outputs_json.append(_encode_output(tensor, binary, blobs))
    doc: dict[str, Any] = {}
    if response.id:
        doc["id"] = response.id
    doc["model_name"] = response.model_name
    doc["model_version"] = response.model_version
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs_json
    long_lists: list[np.ndarray] = []
    for out in outputs_json:
        data = out.get("data")
        if isinstance(data, np.ndarray) and data.size > _ENCODE_SLICE:
            out["data"] = f"{_LIST_MARKER}{len(long_lists)}"
            long_lists.append(data)
    data = None  # long_lists holds them alone: _splice_lists lets go of each once it is written
    header = dumps(doc)
    pieces = _splice_lists(header, long_lists) if long_lists else [header]
    if not blobs:
        return pieces, None  # type: ignore[return-value]  # list[bytes] is a list of parts
    return [*pieces, *blobs], sum(len(p) for p in pieces)


SHM_COPY_LARGE = 4 << 20  # output bytes written into shared-memory regions from which a caller offloads


def response_is_large(response: InferenceResponse, requested: Sequence[RequestedOutput] = (),
                      binary_default: bool = False, compressed: bool = False) -> bool:
    """Whether encoding ``response`` (as :func:`encode_infer_response` would, for ``requested``
    and ``binary_default``) may take long, so a caller moves it off its loop: outputs encoded
    as JSON from ``LARGE_JSON`` bytes, outputs copied into shared-memory regions from
    ``SHM_COPY_LARGE``, a compressed body from ``LARGE_JSON``, or BYTES elements to serialize
    (:func:`serializes_many`). Other binary outputs cost nothing (the body refers to their
    bytes, a BYTES input returned unchanged its wire form)."""
    total = sum(_output_nbytes(t) for t in response.outputs)
    if total < _WEIGHED:  # the common case: nothing to weigh (SHM_COPY_LARGE is larger)
        return False
    if serializes_many(response):
        return True
    flags = {o.name: o.parameters for o in requested} if requested else None
    as_json = to_shm = 0
    for t in response.outputs:
        nbytes = _output_nbytes(t)
        if not nbytes:
            continue
        params = flags.get(t.name) if flags is not None else None
        if params is not None and "shared_memory_region" in params:
            to_shm += nbytes
            continue
        flag = params.get("binary_data") if params is not None else None
        if not (binary_default if flag is None else bool(flag)):
            as_json += nbytes
    return compressed or as_json >= LARGE_JSON or to_shm >= SHM_COPY_LARGE


def serializes_many(response: InferenceResponse) -> bool:
    """Whether ``response`` has a BYTES output of ``SERIALIZE_MANY`` elements or more to
    serialize (not one sent in its wire form): ~5 ms and up of C code, in parts."""
    for t in response.outputs:
        if t.datatype == "BYTES" and wire_of(t) is None and isinstance(t.data, np.ndarray) \
                and t.data.size >= datatypes.SERIALIZE_MANY:
            return True
    return False


#: the output bytes under which no encode is large (an object array weighs 8 bytes an element,
#: so a BYTES output of SERIALIZE_MANY elements is weighed)
_WEIGHED = min(LARGE_JSON, 8 * datatypes.SERIALIZE_MANY)


def _output_nbytes(tensor: Tensor) -> int:
    """What ``tensor`` weighs for :func:`response_is_large` (its wire form when it has one: no
    element object is made to weigh it; 0 for data that is not an array)."""
    wire = wire_of(tensor)
    if wire is not None:
        return wire.buffer.nbytes
    return tensor.data.nbytes if isinstance(tensor.data, np.ndarray) else 0


_WRITTEN = np.empty(0)  # an array of _splice_lists's once written


def _splice_lists(header: bytes, lists: list[np.ndarray]) -> list[bytes]:
    """The pieces of ``header`` with each list marker replaced by its array's JSON, encoded
    slice by slice (no single encode call holds the GIL long) and gathered into pieces of about
    ``_SPLICE_PIECE`` bytes (never the whole body: one copy of it in one call would hold the
    GIL as long); joined, they equal encoding the arrays in one go."""
    pieces: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    pos = 0
    for i in range(len(lists)):
        array = lists[i]
        marker = b'"\\u0000trident-list:%d"' % i  # how dumps writes _LIST_MARKER
        at = header.index(marker, pos)
        batch.append(header[pos:at])
        for start in range(0, array.size, _ENCODE_SLICE):
            part = array[start:start + _ENCODE_SLICE]
            piece = dumps(part.tolist() if part.dtype == object else part)  # b"[...]" (str of BYTES: a list)
            del part
            batch.append(piece[:-1] if start == 0 else b"," + piece[1:-1])
            size += len(piece)
            if size >= _SPLICE_PIECE:
                pieces.append(b"".join(batch))
                batch.clear()
                size = 0
        batch.append(b"]")
        pos = at + len(marker)
        if array.dtype == object:  # the str of a BYTES output json_data made for this encode: ours alone
            lists[i] = _WRITTEN
            datatypes.shrink(array)
        del array
    batch.append(header[pos:])
    pieces.append(b"".join(batch))
    return pieces


def write_shm_output(tensor: Tensor, params: dict[str, ParamValue], shm: ShmOutputLookup | None) -> None:
    """Write ``tensor``'s bytes (BYTES serialized) into the shared-memory region its requested
    output names. Raises UNSUPPORTED without ``shm``, the lookup's errors, and INTERNAL (Triton's
    words) when the region's byte size cannot hold the output; nothing is written then."""
    region, offset, size = shm_parameters(params, f"output '{tensor.name}'")
    if shm is None:
        raise unsupported(f"output '{tensor.name}': {_SHM_UNSUPPORTED}")
    view = shm(region, offset, size)
    wire = wire_of(tensor)
    blob = wire.buffer if wire is not None else _binary_data(tensor.datatype, tensor.data)
    nbytes = blob.nbytes if isinstance(blob, memoryview) else len(blob)
    if nbytes > view.nbytes:
        raise internal(f"shared memory size specified with the request for output '{tensor.name}' "
                       f"({view.nbytes} bytes) should be at least {nbytes} bytes to hold the results")
    view[:nbytes] = blob


def _shm_output(tensor: Tensor, params: dict[str, ParamValue], shm: ShmOutputLookup | None) -> dict[str, Any]:
    write_shm_output(tensor, params, shm)
    out: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": [int(d) for d in tensor.shape]}
    if tensor.parameters:
        out["parameters"] = dict(tensor.parameters)
    return out


def _encode_output(tensor: Tensor, binary: bool, blobs: list[bytes | memoryview]) -> dict[str, Any]:
    wire = wire_of(tensor)
    shape = [int(d) for d in tensor.shape]
    if (wire.count if wire is not None else tensor.data.size) != datatypes.element_count(shape):
        raise TritonError(
            Code.INTERNAL, f"output tensor shape does not match size of output for '{tensor.name}'"
        )
    out: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": shape}
    params: dict[str, Any] | None = dict(tensor.parameters) if tensor.parameters else None
    datatype = tensor.datatype
    if not binary:
        if datatype in ("FP16", "BF16"):  # as for inputs: only the binary extension carries them
            raise invalid_arg(f"sending {datatype} data via JSON is not supported. Please use the binary "
                              "data format for output")
        values = json_data(datatype, tensor.data)
        if values is not None:
            if params:
                out["parameters"] = params
            out["data"] = values
            return out
    if params is None:
        params = {}
    out["parameters"] = params
    if wire is not None:  # an input's elements returned as they came: sent as they came
        params["binary_data_size"] = wire.buffer.nbytes
        if wire.buffer.nbytes:
            blobs.append(wire.buffer)
        return out
    data = tensor.data
    if datatype == "BYTES":  # in parts, never joined here (see datatypes.serialize_bytes_parts)
        pieces = datatypes.serialize_bytes_parts(data)
        params["binary_data_size"] = sum(map(len, pieces))
        blobs.extend(pieces)
        return out
    blob = _binary_data(datatype, data)
    params["binary_data_size"] = len(blob)
    if len(blob):
        blobs.append(blob)
    return out


def _binary_data(datatype: str, data: np.ndarray) -> bytes | memoryview:
    if datatype == "BYTES":
        return datatypes.serialize_bytes(data)
    array = np.ascontiguousarray(data)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.reshape(-1).data.cast("B")


def _json_strings(flat: np.ndarray) -> list[str]:
    """BYTES elements as JSON strings (UTF-8 decoded; raises UnicodeDecodeError). Elements
    that are all ``bytes`` (the usual) are decoded by C code (``map``)."""
    items = flat.tolist()
    if set(map(type, items)) <= _BYTES_TYPE:
        return list(map(bytes.decode, items))  # UTF-8, strict
    return [x.decode("utf-8") if isinstance(x, (bytes, bytearray)) else str(x) for x in items]


_BYTES_TYPE = {bytes}


def json_data(datatype: str, data: np.ndarray) -> Any:
    """JSON value for an output's ``data``; None when it has no exact JSON form."""
    flat = data.reshape(-1)
    if datatype == "BYTES":
        try:
            if flat.size <= _ENCODE_SLICE:
                return _json_strings(flat)
            # a long one as an object array of str made a slice at a time, encoded the same way
            # by encode_infer_response (one list of millions of str, made and dumped in single
            # calls, held the GIL ~100 ms for 15M elements)
            return datatypes.object_array(
                (_json_strings(flat[start:start + _ENCODE_SLICE]) for start in range(0, flat.size, _ENCODE_SLICE)),
                flat.size)
        except UnicodeDecodeError:
            return None
    if datatype == "BF16":
        flat = datatypes.bf16_to_float32(flat)
    if flat.dtype.byteorder == ">":
        flat = flat.astype(flat.dtype.newbyteorder("<"))
    return np.ascontiguousarray(flat)


# ---- typed snapshots of the server's state as JSON (the HTTP API's shapes) -------------------


def server_metadata_json(meta: ServerMetadata) -> dict[str, Any]:
    """``GET /v2``."""
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def model_metadata_json(meta: ModelMetadata) -> dict[str, Any]:
    """``GET /v2/models/<m>[/versions/<v>]``."""
    def tensors(items: Sequence[TensorMetadata]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

    return {"name": meta.name, "versions": list(meta.versions), "platform": meta.platform,
            "inputs": tensors(meta.inputs), "outputs": tensors(meta.outputs)}


def _duration_json(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def statistics_entry_json(s: ModelStatistics) -> dict[str, Any]:
    """One entry of ``model_stats`` (Triton's statistics extension)."""
    return {
        "name": s.name,
        "version": s.version,
        "last_inference": s.last_inference,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": _duration_json(s.success),
            "fail": _duration_json(s.fail),
            "queue": _duration_json(s.queue),
            "compute_input": _duration_json(s.compute_input),
            "compute_infer": _duration_json(s.compute_infer),
            "compute_output": _duration_json(s.compute_output),
            "cache_hit": _duration_json(s.cache_hit),
            "cache_miss": _duration_json(s.cache_miss),
        },
        "response_stats": {},
        "batch_stats": [{"batch_size": b.batch_size, "compute_input": _duration_json(b.compute_input),
                         "compute_infer": _duration_json(b.compute_infer),
                         "compute_output": _duration_json(b.compute_output)} for b in s.batch_stats],
        "memory_usage": [],
    }


def statistics_json(entries: Sequence[ModelStatistics]) -> dict[str, Any]:
    """``GET /v2/models[/<m>[/versions/<v>]]/stats``."""
    return {"model_stats": [statistics_entry_json(s) for s in entries]}


def repository_index_json(entries: Sequence[IndexEntry]) -> list[dict[str, str]]:
    """``POST /v2/repository/index``: empty fields are left out, as Triton does."""
    out = []
    for entry in entries:
        row = {"name": entry.name}
        if entry.version:
            row["version"] = entry.version
        if entry.state:
            row["state"] = entry.state
        if entry.reason:
            row["reason"] = entry.reason
        out.append(row)
    return out
