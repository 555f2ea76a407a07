"""Requests forwarded between workers, and their responses, on the wire (sans-IO).

A frame is ``<u32 header length><u32 payload length><header JSON><payload>``. The header names
the frame's kind (``k``) and describes each tensor: name, datatype, shape, parameters, and where
its bytes are: in the frame's payload (``"i"``, at an offset into it) or in the sender's
shared-memory arena (``"s"``, at an offset into that; see :mod:`trident.cluster.arena`), for
tensors of :data:`SHARED_MIN` bytes or more when the arena has room. So a large tensor crosses
once, by one copy into memory both processes map, instead of through a socket.

Kinds: ``req`` (a request: ``rid``, model, version, id, parameters, requested outputs, inputs,
the client's W3C trace context, ``stream``: every response is wanted, not only the one of a
unary call), ``res`` (a response:
``rid``, outputs, parameters, ``error``, ``final``, ``flag_only``; ``done``: the request is
over in the worker that ran it, so the arena space of its inputs may be reused), ``cancel``
(``rid``: the client went away) and ``rel`` (``offs``: arena allocations the receiver of a
response has copied out and gives back).

Decoding never trusts a length: every offset and size is checked against the payload or the
arena, every shape against its byte size. Raises :class:`ForwardWireError`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from trident.errors import Code, TritonError
from trident.observability.trace import TraceParent, parse_traceparent
from trident.protocol import datatypes
from trident.types import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

SHARED_MIN = 64 * 1024  # bytes: a tensor this large goes through the arena when it has room
MAX_HEADER = 16 * 1024 * 1024
MAX_PAYLOAD = 2 * 1024 * 1024 * 1024
_HEAD = struct.Struct(">II")

#: ``allocate(nbytes) -> offset or None`` and the arena's memoryview, for a sender that has one
Allocate = Callable[[int], int | None]


class ForwardWireError(Exception):
    """A frame that is not a forwarded request or response."""


def _tensor_bytes(tensor: Tensor) -> bytes | memoryview:
    if tensor.datatype == "BYTES":
        return datatypes.serialize_bytes(tensor.data)
    return memoryview(np.ascontiguousarray(tensor.data)).cast("B")  # type: ignore[arg-type]


def _place(tensors: list[Tensor], allocate: Allocate | None, arena: memoryview | None,
           parts: list[bytes | memoryview], used: list[int]) -> tuple[list[list[Any]], int]:
    """Describe ``tensors`` for a header, their bytes copied into the arena (large ones, when
    it has room) or appended to ``parts``; arena offsets taken are appended to ``used``.
    Returns (descriptions, payload size)."""
    described: list[list[Any]] = []
    size = 0
    for t in tensors:
        data = _tensor_bytes(t)
        n = len(data) if isinstance(data, bytes) else data.nbytes
        offset = allocate(n) if allocate is not None and arena is not None and n >= SHARED_MIN else None
        if offset is not None:
            assert arena is not None
            arena[offset:offset + n] = data
            used.append(offset)
            where, at = "s", offset
        else:
            where, at = "i", size
            parts.append(data)
            size += n
        described.append([t.name, t.datatype, list(t.shape), where, at, n, t.parameters or None])
    return described, size


def _frame(header: dict[str, Any], parts: list[bytes | memoryview], payload: int) -> list[bytes | memoryview]:
    head = orjson.dumps(header)
    return [_HEAD.pack(len(head), payload), head, *parts]


def encode_request(rid: int, request: InferenceRequest, *, stream: bool, allocate: Allocate | None = None,
                   arena: memoryview | None = None) -> tuple[list[bytes | memoryview], list[int]]:
    """A request frame (its parts, to be written in order) and the arena offsets its inputs took."""
    used: list[int] = []
    parts: list[bytes | memoryview] = []
    inputs, size = _place(request.inputs, allocate, arena, parts, used)
    trace = request.trace
    header = {"k": "req", "rid": rid, "stream": stream, "model": request.model_name,
              "version": request.model_version, "id": request.id, "params": request.parameters,
              "outputs": [[o.name, o.parameters or None] for o in request.outputs], "inputs": inputs,
              # the client's W3C trace context goes along (trident.observability.trace.TraceParent)
              "trace": [trace.traceparent(), trace.tracestate] if isinstance(trace, TraceParent) else None}
    return _frame(header, parts, size), used


def encode_response(rid: int, response: InferenceResponse, *, done: bool, allocate: Allocate | None = None,
                    arena: memoryview | None = None) -> tuple[list[bytes | memoryview], list[int]]:
    """A response frame and the arena offsets its outputs took."""
    used: list[int] = []
    parts: list[bytes | memoryview] = []
    outputs, size = _place(response.outputs, allocate, arena, parts, used)
    error = None if response.error is None else [response.error.code.value, response.error.message]
    header = {"k": "res", "rid": rid, "model": response.model_name, "version": response.model_version,
              "id": response.id, "params": response.parameters, "outputs": outputs, "error": error,
              "final": response.final, "flag_only": response.flag_only, "done": done}
    return _frame(header, parts, size), used


def encode_control(kind: str, **fields: Any) -> bytes:
    """A ``cancel`` or ``rel`` frame."""
    head = orjson.dumps({"k": kind, **fields})
    return _HEAD.pack(len(head), 0) + head


class FrameReader:
    """Whole frames out of a byte stream: ``(header, payload)`` pairs."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray) -> list[tuple[dict[str, Any], bytearray]]:
        """Raises ForwardWireError for a frame over the limits or a header that is not JSON."""
        self._buffer += data
        out: list[tuple[dict[str, Any], bytearray]] = []
        while len(self._buffer) >= _HEAD.size:
            head_len, payload_len = _HEAD.unpack_from(self._buffer)
            if head_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
                raise ForwardWireError(f"forwarded frame too large ({head_len} + {payload_len} bytes)")
            end = _HEAD.size + head_len + payload_len
            if len(self._buffer) < end:
                break
            try:
                header = orjson.loads(bytes(self._buffer[_HEAD.size:_HEAD.size + head_len]))
            except orjson.JSONDecodeError as e:
                raise ForwardWireError(f"forwarded frame header is not JSON: {e}") from None
            if not isinstance(header, dict):
                raise ForwardWireError("forwarded frame header is not an object")
            payload = self._buffer[_HEAD.size + head_len:end]  # a copy of its own: tensors may write to it
            del self._buffer[:end]
            out.append((header, payload))
        return out


def _tensors(described: Any, payload: bytes | bytearray, arena: memoryview | None) -> list[Tensor]:
    if not isinstance(described, list):
        raise ForwardWireError("tensors are not a list")
    out: list[Tensor] = []
    for item in described:
        try:
            name, datatype, shape, where, at, n, params = item
            shape = tuple(int(d) for d in shape)
            at, n = int(at), int(n)
        except (TypeError, ValueError) as e:
            raise ForwardWireError(f"bad tensor description: {e}") from None
        if not datatypes.is_datatype(datatype) or any(d < 0 for d in shape) or at < 0 or n < 0:
            raise ForwardWireError(f"bad tensor description for '{name}'")
        source: memoryview
        if where == "i":
            source = memoryview(payload)
        elif where == "s" and arena is not None:
            source = arena
        else:
            raise ForwardWireError(f"tensor '{name}' is in an arena this side does not have")
        if at + n > len(source):
            raise ForwardWireError(f"tensor '{name}' lies outside its buffer")
        view = source[at:at + n]
        count = datatypes.element_count(shape)
        if datatype == "BYTES":
            try:
                data = datatypes.deserialize_bytes(view, count)
            except (ValueError, TritonError) as e:
                raise ForwardWireError(f"tensor '{name}': {e}") from None
        else:
            dtype = datatypes.numpy_dtype(datatype)
            if count * dtype.itemsize != n:
                raise ForwardWireError(f"tensor '{name}': {n} bytes for shape {list(shape)}")
            data = np.frombuffer(view, dtype=dtype)
        out.append(Tensor(str(name), str(datatype), shape, data.reshape(shape), dict(params or {})))
    return out


def decode_request(header: dict[str, Any], payload: bytes | bytearray, arena: memoryview | None) -> InferenceRequest:
    """The request of a ``req`` frame; input tensors are views of the payload or of ``arena``
    (the sender's, mapped here). Raises ForwardWireError."""
    try:
        outputs = [RequestedOutput(str(name), dict(params or {})) for name, params in header["outputs"]]
        request = InferenceRequest(
            model_name=str(header["model"]), model_version=str(header["version"]), id=str(header["id"]),
            inputs=_tensors(header["inputs"], payload, arena), outputs=outputs, parameters=dict(header["params"]))
        trace = header.get("trace")
        if trace:
            request.trace = parse_traceparent(str(trace[0]), str(trace[1] or ""))
        return request
    except (KeyError, TypeError, ValueError) as e:
        raise ForwardWireError(f"bad forwarded request: {e}") from None


def decode_response(header: dict[str, Any], payload: bytes | bytearray, arena: memoryview | None) -> InferenceResponse:
    """The response of a ``res`` frame; output tensors are copied out of ``arena`` (the caller
    gives the space back) and views of ``payload`` otherwise. Raises ForwardWireError."""
    try:
        outputs = _tensors(header["outputs"], payload, arena)
        for t, described in zip(outputs, header["outputs"], strict=True):
            if described[3] == "s" and t.datatype != "BYTES":
                t.data = t.data.copy()  # its arena space is given back (BYTES were copied already)
        error = header.get("error")
        return InferenceResponse(
            model_name=str(header["model"]), model_version=str(header["version"]), id=str(header["id"]),
            outputs=outputs, parameters=dict(header["params"]),
            error=None if error is None else TritonError(Code(error[0]), str(error[1])),
            final=bool(header["final"]), flag_only=bool(header["flag_only"]))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ForwardWireError(f"bad forwarded response: {e}") from None
