"""Hot-path protobuf codec: ModelInferRequest -> InferenceRequest, InferenceResponse -> ModelInferResponse.

ModelInfer and ModelStreamInfer carry every tensor, so they skip generated message classes
(betterproto2 costs ~100x google's upb per message, design.md §6) and go straight between the
protobuf wire format (field numbers of ``grpc_service.proto``) and trident's core types:

* :func:`decode_model_infer_request`: ``raw_input_contents`` become numpy arrays over the
  received buffer (``np.frombuffer``, no copy); ``InferTensorContents`` are converted to numpy
  (packed varints decoded vectorised); BYTES raw data is the 4-byte-length-prefixed form;
  FP16 and BF16 are accepted only as raw data (there is no contents field for them).
* :func:`encode_model_infer_response` / :func:`encode_model_stream_infer_response` return the
  message as a list of buffers and its size: tensor data appears in that list as views of the
  output arrays, so joining the parts (with the gRPC prefix, :func:`trident.protocol.grpc_framing.frame`)
  is the only copy of each output tensor's bytes.

Raises :class:`DecodeError` (a ValueError) for bytes that are not a valid message, that is
whatever upb rejects: lengths past the end of their message, field number 0, stray end-group
tags, wire types 6/7, tags over 5 bytes or 32 bits, varints over 10 bytes (unknown fields and
groups are skipped as upb skips them); and :class:`~trident.errors.TritonError` INVALID_ARG /
UNSUPPORTED for a valid message that is not a valid request, with Triton's wording. A tensor's
contents are decoded after the request's other checks, so a message that is both malformed
there and an invalid request may get the TritonError. Shapes of more than 64 dimensions are
INVALID_ARG without multiplying their dimensions.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from trident.errors import invalid_arg, unsupported
from trident.protocol import datatypes
from trident.protocol.datatypes import WireBytes
from trident.protocol.kserve import (
    InputCheck,
    ShmLookup,
    ShmOutputLookup,
    shm_array,
    shm_parameters,
    without_shm_parameters,
    write_shm_output,
)
from trident.types import (
    InferenceRequest,
    InferenceResponse,
    ParamValue,
    RequestedOutput,
    Tensor,
    WireBytesTensor,
    wire_of,
)

Buffer = bytes | bytearray | memoryview
_Bytes = bytes | bytearray
Parts = list[Any]  # bytes-like buffers and 1-D uint8 arrays: b"".join(parts) is the message


class DecodeError(ValueError):
    """The bytes are not a valid protobuf encoding of the expected message."""


# ---- wire primitives ------------------------------------------------------------------------

_U64 = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1
_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")


def _varint(buf: _Bytes, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; returns (value, next position). IndexError when truncated."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _U64, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")


def _long_tag(buf: _Bytes, pos: int) -> tuple[int, int]:
    """A tag of more than one byte at ``pos`` (upb's limits: at most 5 bytes, 32 bits)."""
    tag, end = _varint(buf, pos)
    if end - pos > 5 or tag > 0xFFFFFFFF:
        raise DecodeError("invalid tag: longer than 5 bytes or over 32 bits")
    return tag, end


def _length(buf: _Bytes, pos: int, stop: int) -> tuple[int, int]:
    """A length prefix at ``pos`` -> (start, end) of the bytes it delimits, which must end by ``stop``."""
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = _varint(buf, pos)
    end = pos + n
    if end > stop:
        raise DecodeError(f"length-delimited field of {n} bytes runs past the end of its message")
    return pos, end


_MAX_GROUP_DEPTH = 32


def _skip(buf: _Bytes, pos: int, tag: int, stop: int, depth: int = 0) -> int:
    """Skip the value of an unknown field (or a known field with another wire type)."""
    wire_type = tag & 7
    if tag < 8:
        raise DecodeError("invalid field number 0")
    if wire_type == 0:
        pos = _varint(buf, pos)[1]
    elif wire_type == 1:
        pos += 8
    elif wire_type == 2:
        pos = _length(buf, pos, stop)[1]
    elif wire_type == 5:
        pos += 4
    elif wire_type == 3:  # a group, as upb skips it: fields up to the matching end-group tag
        if depth >= _MAX_GROUP_DEPTH:
            raise DecodeError("groups nested too deeply")
        while True:
            if pos >= stop:
                raise DecodeError("group without its end-group tag")
            inner = buf[pos]
            if inner < 0x80:
                pos += 1
            else:
                inner, pos = _long_tag(buf, pos)
            if inner & 7 == 4:
                if inner >> 3 != tag >> 3:
                    raise DecodeError("end-group tag does not match its group")
                break
            pos = _skip(buf, pos, inner, stop, depth + 1)
    elif wire_type == 4:
        raise DecodeError("end-group tag outside a group")
    else:
        raise DecodeError(f"unsupported protobuf wire type {wire_type}")
    if pos > stop:
        raise DecodeError("field runs past the end of its message")
    return pos


def _signed(value: int) -> int:
    return value - (1 << 64) if value > _I64_MAX else value


def _text(buf: bytes | bytearray, start: int, stop: int) -> str:
    return buf[start:stop].decode("utf-8")


_PACKED_CHUNK = 1 << 20  # bytes of packed varints decoded at a time: bounds the temporaries


def _decode_packed_varints(view: memoryview) -> np.ndarray:
    """A packed run of varints -> uint64 array, vectorised (no per-element Python work).

    Long runs are decoded ~1 MiB at a time (cut after a varint's last byte), so the temporary
    arrays stay small next to the 8-byte-per-element result.
    """
    b = np.frombuffer(view, dtype=np.uint8)
    if b.size == 0:
        return np.empty(0, dtype=np.uint64)
    if b[-1] >= 0x80:
        raise DecodeError("truncated packed varint")
    if b.size <= _PACKED_CHUNK:
        return _decode_varint_run(b)
    out = np.empty(int(np.count_nonzero(b < 0x80)), dtype=np.uint64)
    start = filled = 0
    while start < b.size:
        stop = min(start + _PACKED_CHUNK, b.size)
        if stop < b.size:
            ends = np.flatnonzero(b[max(start, stop - 10) : stop] < 0x80)
            if not ends.size:
                raise DecodeError("varint longer than 10 bytes")
            stop = max(start, stop - 10) + int(ends[-1]) + 1
        values = _decode_varint_run(b[start:stop])
        out[filled : filled + values.size] = values
        filled += values.size
        start = stop
    return out


def _decode_varint_run(b: np.ndarray) -> np.ndarray:
    """Non-empty uint8 array ending with a varint's last byte -> uint64 values."""
    ends = b < 0x80
    if ends.all():
        return b.astype(np.uint64)
    last = np.flatnonzero(ends)
    first = np.empty_like(last)
    first[0] = 0
    first[1:] = last[:-1] + 1
    lengths = last - first + 1
    if int(lengths.max()) > 10:
        raise DecodeError("varint longer than 10 bytes")
    position = np.arange(b.size, dtype=np.uint64) - np.repeat(first, lengths).astype(np.uint64)
    groups = (b & 0x7F).astype(np.uint64) << (position * np.uint64(7))
    return np.add.reduceat(groups, first)


# ---- decoding ModelInferRequest ---------------------------------------------------------------
#
# Every length is checked against the end of the message that holds it (``_length``), every
# unknown field goes through ``_skip`` (field number 0, end-group tags outside a group, wire
# types 6 and 7 are DecodeError; groups are skipped as upb does), and a message that does not
# end exactly at its length is DecodeError: what upb rejects, this rejects.


def _parameter(buf: _Bytes, pos: int, stop: int) -> tuple[str, ParamValue | None]:
    """One map<string, InferParameter> entry -> (key, value); value None when no choice is set.

    A repeated InferParameter merges as protobuf does: the last choice set wins.
    """
    key = ""
    value: ParamValue | None = None
    while pos < stop:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _long_tag(buf, pos)
        if tag == 0x0A:
            pos, end = _length(buf, pos, stop)
            key = _text(buf, pos, end)
            pos = end
        elif tag == 0x12:
            pos, end = _length(buf, pos, stop)
            while pos < end:
                inner = buf[pos]
                if inner < 0x80:
                    pos += 1
                else:
                    inner, pos = _long_tag(buf, pos)
                if inner == 0x08:
                    v, pos = _varint(buf, pos)
                    value = v != 0
                elif inner == 0x10:
                    v, pos = _varint(buf, pos)
                    value = _signed(v)
                elif inner == 0x1A:
                    pos, text_end = _length(buf, pos, end)
                    value = _text(buf, pos, text_end)
                    pos = text_end
                elif inner == 0x21:
                    if pos + 8 > end:
                        raise DecodeError("truncated InferParameter")
                    value = _DOUBLE.unpack_from(buf, pos)[0]
                    pos += 8
                elif inner == 0x28:
                    value, pos = _varint(buf, pos)
                else:
                    pos = _skip(buf, pos, inner, end)
            if pos != end:
                raise DecodeError("truncated InferParameter")
        else:
            pos = _skip(buf, pos, tag, stop)
    if pos != stop:
        raise DecodeError("truncated parameter map entry")
    return key, value


_MAX_DIMS = 64  # numpy's limit; a longer shape is INVALID_ARG, and only its first dims are kept
_SHORT_SHAPE = 640  # packed shapes up to this many bytes are decoded element by element


class _Input:
    __slots__ = ("name", "datatype", "shape", "rank", "parameters", "contents", "plain")

    def __init__(self) -> None:
        self.name = ""
        self.datatype = ""
        self.shape: list[int] = []  # at most _MAX_DIMS + 1 dims
        self.rank = 0  # dims on the wire
        self.parameters: dict[str, ParamValue] = {}
        self.contents: list[tuple[int, int]] | None = None  # spans of InferTensorContents
        # a valid fixed-size tensor that takes raw contents: (dtype, shape, byte size), found once
        # per decoded message (and so once for a cached one); None: _tensors takes the long way
        self.plain: tuple[np.dtype, tuple[int, ...], int] | None = None


#: InferInputTensor messages without contents (name, datatype, shape, parameters), decoded once:
#: the same bytes always decode alike, so a repeat costs a lookup (decoded objects are shared,
#: read-only: each request gets its own parameters dict)
_INPUTS: dict[bytes, _Input] = {}
_CACHED_INPUTS = 256
_CACHED_INPUT_BYTES = 256


def _shape(buf: _Bytes, view: memoryview, tag: int, pos: int, stop: int, t: _Input) -> int:
    into = t.shape
    if tag & 7 == 2:
        pos, end = _length(buf, pos, stop)
        n = end - pos
        packed = buf[pos:end] if n <= _SHORT_SHAPE else b""
        if packed and max(packed) < 0x80:  # every dimension below 128
            t.rank += n
            into.extend(packed[: _MAX_DIMS + 1 - len(into)] if t.rank > _MAX_DIMS else packed)
            return end
        if n > _SHORT_SHAPE:
            dims = _decode_packed_varints(view[pos:end]).view(np.int64)
            t.rank += dims.size
            into.extend(int(d) for d in dims[: max(0, _MAX_DIMS + 1 - len(into))])
            return end
        while pos < end:
            v, pos = _varint(buf, pos)
            t.rank += 1
            if len(into) <= _MAX_DIMS:
                into.append(_signed(v))
        if pos != end:
            raise DecodeError("truncated shape")
        return pos
    v, pos = _varint(buf, pos)
    t.rank += 1
    if len(into) <= _MAX_DIMS:
        into.append(_signed(v))
    return pos


def _input(buf: _Bytes, view: memoryview, pos: int, stop: int, outputs: bool = False) -> _Input:
    """InferInputTensor (or, with ``outputs``, InferRequestedOutputTensor: name=1, parameters=2)."""
    t = _Input()
    params_tag = 0x12 if outputs else 0x22
    while pos < stop:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _long_tag(buf, pos)
        if tag == 0x0A:
            n = buf[pos]  # _length, inlined
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos)
            end = pos + n
            if end > stop:
                raise DecodeError(f"length-delimited field of {n} bytes runs past the end of its message")
            t.name = _text(buf, pos, end)
            pos = end
        elif tag == params_tag:
            pos, end = _length(buf, pos, stop)
            key, value = _parameter(buf, pos, end)
            if value is None:
                t.parameters.pop(key, None)
            else:
                t.parameters[key] = value
            pos = end
        elif outputs:
            pos = _skip(buf, pos, tag, stop)
        elif tag == 0x12:
            n = buf[pos]  # _length, inlined
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos)
            end = pos + n
            if end > stop:
                raise DecodeError(f"length-delimited field of {n} bytes runs past the end of its message")
            t.datatype = _text(buf, pos, end)
            pos = end
        elif tag == 0x1A or tag == 0x18:
            pos = _shape(buf, view, tag, pos, stop, t)
        elif tag == 0x2A:
            pos, end = _length(buf, pos, stop)
            if t.contents is None:
                t.contents = []
            t.contents.append((pos, end))
            pos = end
        else:
            pos = _skip(buf, pos, tag, stop)
    if pos != stop:
        raise DecodeError("truncated tensor message")
    if not outputs and t.contents is None and t.rank <= _MAX_DIMS and "shared_memory_region" not in t.parameters:
        dtype = _DTYPES.get(t.datatype)
        if dtype is not None and t.datatype != "BYTES" and (not t.shape or min(t.shape) >= 0):
            t.plain = (dtype, tuple(t.shape), datatypes.element_count(t.shape) * dtype.itemsize)
    return t


def is_heavy(data: Buffer, threshold: int) -> bool:
    """Whether decoding this ``ModelInferRequest`` may take long (a caller moves it off its loop).

    True when the message outside ``raw_input_contents`` reaches ``threshold`` bytes (typed
    ``contents`` are converted element by element), or the raw contents do and an input is
    BYTES (split element by element), or the message is malformed (the decode raises, wherever
    it runs). Fixed-size raw tensors become views of the message: cheap whatever their size.
    Walks the top-level fields only: O(fields), not O(bytes).
    """
    end = len(data)
    if end < threshold:
        return False
    buf = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    raw = 0
    named_bytes = False
    try:
        for tag, start, stop in _top_fields(buf, _HEAVY_FIELDS):
            if tag == 0x3A:
                raw += stop - start
            elif not named_bytes:
                named_bytes = b"BYTES" in buf[start:stop]
    except (IndexError, DecodeError):
        return True
    return end - raw >= threshold or (raw >= threshold and named_bytes)


_HEAVY_FIELDS = (0x3A, 0x2A)  # the tags of raw_input_contents (7) and of an input tensor (5)
_MODEL_FIELDS = (0x0A, 0x12)  # the tags of model_name (1) and model_version (2)


def _top_fields(buf: bytes | bytearray, tags: tuple[int, int]) -> Iterator[tuple[int, int, int]]:
    """``(tag, start, stop)`` of each top-level length-delimited field of a message whose tag is
    one of ``tags``, in order; other fields are skipped. Raises IndexError or DecodeError for a
    malformed message."""
    end = len(buf)
    pos = 0
    while pos < end:
        tag, pos = (buf[pos], pos + 1) if buf[pos] < 0x80 else _long_tag(buf, pos)
        if tag in tags:
            start, pos = _length(buf, pos, end)
            yield tag, start, pos
        else:
            pos = _skip(buf, pos, tag, end)


def model_of(data: Buffer) -> tuple[str, str] | None:
    """The ``(model_name, model_version)`` a ``ModelInferRequest`` names (the last of each
    field, as the decode takes them), or None when the message is malformed. Walks the
    top-level fields only: O(fields), not O(bytes)."""
    buf = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    name = version = ""
    try:
        for tag, start, stop in _top_fields(buf, _MODEL_FIELDS):
            if tag == 0x0A:
                name = _text(buf, start, stop)
            else:
                version = _text(buf, start, stop)
    except (IndexError, DecodeError, UnicodeDecodeError):
        return None
    return name, version


def decode_model_infer_request(data: Buffer, shm: ShmLookup | None = None,
                               check: InputCheck | None = None) -> InferenceRequest:
    """Decode a serialized ``inference.ModelInferRequest`` into an :class:`InferenceRequest`.

    Raw tensor data is not copied: the arrays view ``data`` (pass a ``bytearray`` for writable
    arrays; any other buffer than bytes or bytearray is copied first). Raises DecodeError for
    malformed bytes (whatever upb would reject), TritonError INVALID_ARG for an invalid request (data missing, sizes that do not match shapes, contents of the wrong type),
    TritonError UNSUPPORTED for shared-memory inputs without ``shm`` (with it they are views of
    their region, and its errors are raised: NOT_FOUND, INVALID_ARG).

    ``check`` (:data:`~trident.protocol.kserve.InputCheck`, for the model the message names:
    :func:`model_of`) is called with each input's name, datatype and shape before any tensor's
    data is read, and raises what the model's admission would.
    """
    buf = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    view = memoryview(buf)
    try:
        model_name = model_version = request_id = ""
        parameters: dict[str, ParamValue] = {}
        inputs: list[_Input] = []
        outputs: list[_Input] = []
        raw: list[memoryview] = []
        pos = 0
        end = len(view)
        while pos < end:
            tag = buf[pos]
            if tag < 0x80:
                pos += 1
            else:
                tag, pos = _long_tag(buf, pos)
            if tag & 7 != 2 or tag < 8:
                pos = _skip(buf, pos, tag, end)
                continue
            n = buf[pos]  # _length, inlined
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos)
            stop = pos + n
            if stop > end:
                raise DecodeError(f"length-delimited field of {n} bytes runs past the end of its message")
            field = tag >> 3
            if field == 7:
                raw.append(view[pos:stop])
            elif field == 5:
                if n <= _CACHED_INPUT_BYTES:  # a client sends the same tensor metadata again and again
                    encoded = bytes(buf[pos:stop])
                    tensor = _INPUTS.get(encoded)
                    if tensor is None:
                        tensor = _input(buf, view, pos, stop)
                        if tensor.contents is None:  # spans of this message: never cached
                            if len(_INPUTS) >= _CACHED_INPUTS:
                                _INPUTS.clear()
                            _INPUTS[encoded] = tensor
                    inputs.append(tensor)
                else:
                    inputs.append(_input(buf, view, pos, stop))
            elif field == 1:
                model_name = _text(buf, pos, stop)
            elif field == 2:
                model_version = _text(buf, pos, stop)
            elif field == 3:
                request_id = _text(buf, pos, stop)
            elif field == 4:
                key, value = _parameter(buf, pos, stop)
                if value is None:
                    parameters.pop(key, None)
                else:
                    parameters[key] = value
            elif field == 6:
                outputs.append(_input(buf, view, pos, stop, outputs=True))
            pos = stop
        if pos != end:
            raise DecodeError("truncated ModelInferRequest")
        if check is not None:
            for t in inputs:
                # an unknown datatype or a bad shape is refused as such below
                if t.datatype in _DTYPES and t.rank <= _MAX_DIMS and (not t.shape or min(t.shape) >= 0):
                    check(t.name, t.datatype, tuple(t.shape))
        tensors = _tensors(buf, view, model_name, inputs, raw, shm)
    except (IndexError, struct.error) as e:
        raise DecodeError(f"truncated ModelInferRequest: {e}") from None
    except UnicodeDecodeError as e:
        raise DecodeError(f"string field is not valid UTF-8: {e}") from None
    return InferenceRequest(
        model_name=model_name,
        inputs=tensors,
        model_version=model_version,
        id=request_id,
        outputs=[RequestedOutput(o.name, o.parameters) for o in outputs],
        parameters=parameters,
    )


_DTYPES = {name: datatypes.numpy_dtype(name) for name in datatypes.DATATYPES}


def _tensors(buf: _Bytes, view: memoryview, model: str, inputs: list[_Input], raw: list[memoryview],
             shm: ShmLookup | None = None) -> list[Tensor]:
    in_shm = sum("shared_memory_region" in t.parameters for t in inputs)  # they have no raw contents
    if raw and len(raw) != len(inputs) - in_shm:
        raise invalid_arg(
            f"expected {len(inputs) - in_shm} inputs but got {len(raw)} raw input contents for model '{model}'"
        )
    out: list[Tensor] = []
    index = -1
    for t in inputs:
        plain = t.plain
        if plain is not None and raw:  # the common case, checked once when its message was decoded
            index += 1
            plain_dtype, shape, size = plain
            data = raw[index]
            if len(data) != size:
                raise _byte_size_mismatch(t, model, size, len(data))
            out.append(_shaped(t, np.frombuffer(data, dtype=plain_dtype), shape, model))
            continue
        dtype = _DTYPES.get(t.datatype)
        if dtype is None:
            raise invalid_arg(f"invalid datatype '{t.datatype}' for input '{t.name}' for model '{model}'")
        if t.rank > _MAX_DIMS:
            raise invalid_arg(
                f"invalid shape for input '{t.name}' for model '{model}': {t.rank} dimensions, "
                f"at most {_MAX_DIMS} are supported"
            )
        if t.shape and min(t.shape) < 0:
            raise invalid_arg(f"invalid shape {t.shape} for input '{t.name}' for model '{model}'")
        count = datatypes.element_count(t.shape)
        if "shared_memory_region" in t.parameters:
            if shm is None:
                raise unsupported(
                    f"input '{t.name}' for model '{model}' uses shared memory, which is not enabled on this server"
                )
            if t.contents is not None:
                raise invalid_arg(f"contents field must not be specified with shared memory for input '{t.name}' "
                                  f"for model '{model}'")
            region, offset, size = shm_parameters(t.parameters, f"input '{t.name}'")
            shape = tuple(t.shape)
            array = shm_array(t.name, t.datatype, shape, count, shm(region, offset, size), model)  # in shape
            out.append(Tensor(t.name, t.datatype, shape, array, without_shm_parameters(t.parameters)))
            continue
        index += 1
        if raw:
            if t.contents is not None:
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents for '{t.name}' "
                    f"for model '{model}'"
                )
            out.append(_shaped(t, _from_raw(raw[index], t, dtype, count, model), tuple(t.shape), model))
            continue
        if t.contents is not None:
            array = _from_contents(buf, view, t, dtype, count, model)
        elif count == 0:
            array = np.empty(0, dtype=dtype)
        else:
            raise invalid_arg(f"expected tensor data for input tensor '{t.name}' for model '{model}'")
        out.append(_shaped(t, array, tuple(t.shape), model))
    return out


def _shaped(t: _Input, array: np.ndarray | WireBytes, shape: tuple[int, ...], model: str) -> Tensor:
    """The request's tensor of input ``t``: ``array`` (its elements, flat) in ``shape``."""
    if isinstance(array, WireBytes):  # its count is the shape's
        return WireBytesTensor(t.name, shape, array, dict(t.parameters) if t.parameters else {})
    try:
        array = array.reshape(shape)
    except ValueError as e:  # dimensions numpy cannot hold (too many, or a zero among huge ones)
        raise invalid_arg(f"invalid shape {t.shape} for input '{t.name}' for model '{model}': {e}") from None
    return Tensor(t.name, t.datatype, shape, array, dict(t.parameters) if t.parameters else {})


def _byte_size_mismatch(t: _Input, model: str, expected: int, got: int) -> Exception:
    return invalid_arg(
        f"input byte size mismatch for input '{t.name}' for model '{model}'. Expected {expected}, got {got}"
    )


def _from_raw(data: memoryview, t: _Input, dtype: np.dtype, count: int, model: str) -> np.ndarray | WireBytes:
    """An input's raw contents as its flat array; BYTES of ``WIRE_MIN`` elements and up kept in
    their wire form (checked here). Raises INVALID_ARG for data that does not fit."""
    if t.datatype == "BYTES":
        try:
            if count >= datatypes.WIRE_MIN:
                return WireBytes.parse(data, count)
            return datatypes.deserialize_bytes(data, count)
        except ValueError as e:
            raise invalid_arg(f"invalid BYTES data for input '{t.name}' for model '{model}': {e}") from None
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise _byte_size_mismatch(t, model, expected, len(data))
    return np.frombuffer(data, dtype=dtype)


# contents field number -> (name of its element type, datatypes it may carry)
_CONTENTS_FIELDS = {
    1: ("BOOL", ("BOOL",)),
    2: ("INT32", ("INT8", "INT16", "INT32")),
    3: ("INT64", ("INT64",)),
    4: ("UINT32", ("UINT8", "UINT16", "UINT32")),
    5: ("UINT64", ("UINT64",)),
    6: ("FP32", ("FP32",)),
    7: ("FP64", ("FP64",)),
    8: ("BYTES", ("BYTES",)),
}


def _from_contents(buf: _Bytes, view: memoryview, t: _Input, dtype: np.dtype, count: int, model: str) -> np.ndarray:
    """InferTensorContents (possibly split over several occurrences) -> a flat array of ``dtype``."""
    chunks: dict[int, list[np.ndarray]] = {}
    strings: list[bytes] = []
    scalars: dict[int, list[int | float]] = {}
    assert t.contents is not None
    for start, stop in t.contents:
        pos = start
        while pos < stop:
            tag = buf[pos]
            if tag < 0x80:
                pos += 1
            else:
                tag, pos = _long_tag(buf, pos)
            field, wire = tag >> 3, tag & 7
            if field == 8 and wire == 2:
                pos, end = _length(buf, pos, stop)
                strings.append(bytes(view[pos:end]))
                pos = end
            elif 1 <= field <= 7 and wire == 2:
                pos, end = _length(buf, pos, stop)
                chunk = view[pos:end]
                if field == 6:
                    arr = np.frombuffer(chunk, dtype="<f4") if len(chunk) % 4 == 0 else None
                elif field == 7:
                    arr = np.frombuffer(chunk, dtype="<f8") if len(chunk) % 8 == 0 else None
                else:
                    arr = _decode_packed_varints(chunk)
                if arr is None:
                    raise DecodeError("packed fixed-width field has a partial element")
                chunks.setdefault(field, []).append(arr)
                pos = end
            elif 1 <= field <= 5 and wire == 0:
                v, pos = _varint(buf, pos)
                scalars.setdefault(field, []).append(v)
            elif field == 6 and wire == 5:
                if pos + 4 > stop:
                    raise DecodeError("truncated InferTensorContents")
                scalars.setdefault(6, []).append(_FLOAT.unpack_from(buf, pos)[0])
                pos += 4
            elif field == 7 and wire == 1:
                if pos + 8 > stop:
                    raise DecodeError("truncated InferTensorContents")
                scalars.setdefault(7, []).append(_DOUBLE.unpack_from(buf, pos)[0])
                pos += 8
            else:
                pos = _skip(buf, pos, tag, stop)
        if pos != stop:
            raise DecodeError("truncated InferTensorContents")
    for field, items in scalars.items():
        kind = np.float32 if field == 6 else np.float64 if field == 7 else np.uint64
        chunks.setdefault(field, []).append(np.array(items, dtype=kind))
    if strings:
        chunks[8] = []
    present = [f for f in sorted(chunks) if f == 8 or any(a.size for a in chunks[f])]
    if not present:
        if count == 0:
            return np.empty(0, dtype=dtype)
        raise invalid_arg(f"expected tensor data for input tensor '{t.name}' for model '{model}'")
    for i, field in enumerate(present):
        type_name, allowed = _CONTENTS_FIELDS[field]
        if i > 0:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{t.name}' for model '{model}', "
                "binary data was already supplied."
            )
        if t.datatype not in allowed:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{t.name}' for model '{model}' of type "
                f"'{type_name}', expected datatype '{t.datatype}'"
            )
    field = present[0]
    if field == 8:
        if len(strings) != count:
            raise invalid_arg(
                f"expected {count} string elements for input '{t.name}' for model '{model}', got {len(strings)}"
            )
        return datatypes.object_array(
            (strings[start : start + datatypes.FILL_SLICE] for start in range(0, count, datatypes.FILL_SLICE)), count)
    values = np.concatenate(chunks[field]) if len(chunks[field]) > 1 else chunks[field][0]
    if values.size != count:
        raise _byte_size_mismatch(t, model, count * dtype.itemsize, values.size * dtype.itemsize)
    if field == 1:
        return np.not_equal(values, 0)
    if field in (2, 3):
        values = values.view(np.int64)
    return values.astype(dtype, copy=False)


# ---- encoding ModelInferResponse -------------------------------------------------------------

_SMALL_VARINTS = [bytes([i]) for i in range(0x80)]


def _uvarint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_varint(n: int) -> bytes:
    """``n`` (0 <= n < 2**64) as a protobuf base-128 varint."""
    return _uvarint(n)


def _ivarint(n: int) -> bytes:
    return _uvarint(n & _U64) if n < 0 else _uvarint(n)


def _string(tag: bytes, value: str) -> bytes:
    raw = value.encode("utf-8")
    return tag + _uvarint(len(raw)) + raw


def _parameter_value(value: object) -> bytes:
    if isinstance(value, (bool, np.bool_)):
        return b"\x08\x01" if value else b"\x08\x00"
    if isinstance(value, (int, np.integer)):
        v = int(value)
        return b"\x28" + _uvarint(v) if v > _I64_MAX else b"\x10" + _ivarint(v)
    if isinstance(value, (float, np.floating)):
        return b"\x21" + _DOUBLE.pack(float(value))
    return _string(b"\x1a", value if isinstance(value, str) else str(value))


def _parameters(tag: bytes, parameters: dict[str, ParamValue]) -> bytes:
    out = []
    for key, value in parameters.items():
        v = _parameter_value(value)
        entry = _string(b"\x0a", key) + b"\x12" + _uvarint(len(v)) + v
        out.append(tag + _uvarint(len(entry)) + entry)
    return b"".join(out)


def _raw(tensor: Tensor) -> tuple[Parts, int]:
    """An output tensor's raw bytes as parts that view the array (BYTES: length-prefixed)."""
    wire = wire_of(tensor)
    if wire is not None:  # an input's elements returned as they came
        return [wire.buffer], wire.buffer.nbytes
    if tensor.datatype == "BYTES":  # in parts of datatypes.FILL_SLICE elements, each made by C code
        pieces: Parts = datatypes.serialize_bytes_parts(tensor.data)
        return pieces, sum(map(len, pieces))
    array = np.ascontiguousarray(tensor.data)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    flat = array.reshape(-1).view(np.uint8)
    return [flat], flat.size


# a server answers with the same model names and output metadata again and again: their
# encodings, by value (bounded: cleared when full)
_NAMES: dict[tuple[str, str], bytes] = {}
_OUTPUTS: dict[tuple[str, str, Any], bytes] = {}
_CACHED_ENCODINGS = 1024


def _cache(cache: dict[Any, bytes], key: Any, value: bytes) -> bytes:
    if len(cache) >= _CACHED_ENCODINGS:
        cache.clear()
    cache[key] = value
    return value


def _output_metadata(tensor: Tensor, parameters: bytes = b"") -> bytes:
    """An output's ``InferOutputTensor`` field (name, datatype, shape, then ``parameters``)."""
    shape = b"".join(_ivarint(int(d)) for d in tensor.shape)
    body = _string(b"\x0a", tensor.name) + _string(b"\x12", tensor.datatype)
    if shape:
        body += b"\x1a" + _uvarint(len(shape)) + shape
    body += parameters
    return b"\x2a" + _uvarint(len(body)) + body


def encode_model_infer_response(
    response: InferenceResponse, parameters: dict[str, ParamValue] | None = None,
    shm_outputs: dict[str, dict[str, ParamValue]] | None = None, shm: ShmOutputLookup | None = None,
) -> tuple[Parts, int]:
    """``inference.ModelInferResponse`` for ``response`` as (parts, total size).

    ``parameters`` replaces ``response.parameters`` on the wire when given. Outputs travel in
    ``raw_output_contents`` as Triton sends them, except those named in ``shm_outputs`` (their
    requested parameters), which are written into their shared-memory region through ``shm``
    and sent with empty contents, as Triton does. The parts view the output arrays: keep the
    response alive until they are joined. Raises what writing a shared-memory output raises
    (trident.protocol.kserve.write_shm_output).
    """
    model = (response.model_name, response.model_version)
    names = _NAMES.get(model)
    if names is None:
        names = _cache(_NAMES, model, (_string(b"\x0a", model[0]) if model[0] else b"")
                       + (_string(b"\x12", model[1]) if model[1] else b""))
    head = [names]
    if response.id:
        head.append(_string(b"\x1a", response.id))
    params = response.parameters if parameters is None else parameters
    if params:
        head.append(_parameters(b"\x22", params))
    raws: list[tuple[Parts, int]] = []
    for tensor in response.outputs:
        if tensor.parameters:
            head.append(_output_metadata(tensor, _parameters(b"\x22", tensor.parameters)))
        else:
            key = (tensor.name, tensor.datatype, tuple(tensor.shape))
            metadata = _OUTPUTS.get(key)
            if metadata is None:
                metadata = _cache(_OUTPUTS, key, _output_metadata(tensor))
            head.append(metadata)
        if shm_outputs is not None and tensor.name in shm_outputs:
            write_shm_output(tensor, shm_outputs[tensor.name], shm)
            raws.append(([], 0))
        else:
            raws.append(_raw(tensor))
    first = b"".join(head)
    parts: Parts = [first]
    size = len(first)
    for raw_parts, raw_size in raws:
        prefix = b"\x32" + _uvarint(raw_size)
        parts.append(prefix)
        parts.extend(raw_parts)
        size += len(prefix) + raw_size
    return parts, size


def encode_model_stream_infer_response(
    response: InferenceResponse | None,
    error_message: str = "",
    parameters: dict[str, ParamValue] | None = None,
) -> tuple[Parts, int]:
    """``inference.ModelStreamInferResponse`` (error_message=1, infer_response=2) as (parts, size)."""
    head = _string(b"\x0a", error_message) if error_message else b""
    if response is None:
        return [head], len(head)
    inner, inner_size = encode_model_infer_response(response, parameters)
    head += b"\x12" + _uvarint(inner_size)
    return [head, *inner], len(head) + inner_size


def join(parts: Parts) -> bytes:
    """The serialized message from :func:`encode_model_infer_response`'s parts."""
    return b"".join(parts)
