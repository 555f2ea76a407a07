"""atheris target for the gRPC decoders (trident.protocol.grpc_framing and grpc_codec).

Input layout: the first byte picks the target, the rest is its input.

* 0: a gRPC DATA stream, fed to a MessageDecoder (4 KiB limit) in chunks whose sizes come from
  the input (some as a list of two, as the engine hands on a run of DATA frames);
  every complete message is then decoded as a ModelInferRequest (target 1);
* 1: a serialized ModelInferRequest; a decoded request's inputs are encoded back as a
  ModelInferResponse and a ModelStreamInferResponse, which must not fail;
* 2: header values: grpc-timeout, grpc-message and ``-bin`` metadata parsing;
* 3: a program that writes a ModelInferRequest (:func:`build`): nested messages at the fields
  that hold them (inputs, contents, parameters, outputs), and the protobuf edge cases a random
  byte string rarely reaches: field number 0, wire types 3/4/6/7, groups, overlong and
  10-byte varints, tags over 5 bytes or 32 bits, lengths past the end, huge or negative int64
  shapes, oneofs and fields repeated. The message is then decoded as in target 1.

Every decoded message (targets 0, 1, 3) is also parsed by google protobuf (upb, tritonclient's
``service_pb2``) as the reference: what upb parses must not be DecodeError (groups nested
deeper than the codec's limit excepted), what the codec decodes upb must parse too, with the
same names, shapes and parameters.

Accepted outcomes are FramingError, DecodeError, TritonError and (target 2) ValueError;
any other exception, or a disagreement with upb, is a bug.

Run: ``python fuzz/fuzz_grpc.py fuzz/corpus/grpc`` (needs ``pip install atheris``).
The normal test run replays the corpus through :func:`one_input` (fuzz/test_replay_grpc.py).
"""

from __future__ import annotations

import struct
import sys

import tritonclient.grpc.service_pb2 as pb
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError as UpbDecodeError

from trident.errors import TritonError
from trident.protocol import grpc_codec, grpc_framing
from trident.types import InferenceResponse


def one_input(data: bytes) -> None:
    """Run one fuzz input; raises only for bugs."""
    if not data:
        return
    target, body = data[0] % 4, data[1:]
    if target == 0:
        _stream(body)
    elif target == 1:
        _request(body)
    elif target == 2:
        _headers(body)
    else:
        _request(build(body))


def _stream(body: bytes) -> None:
    decoder = grpc_framing.MessageDecoder(4096)
    pos, step = 0, 1
    try:
        while pos < len(body):
            size = 1 + (body[pos] % 64) * step
            chunk = body[pos : pos + size]
            half = len(chunk) // 2
            # odd steps: a list of views of the chunk (the engine's event for a run of DATA
            # frames of one read), which the decoder may keep instead of copying
            view = memoryview(chunk)
            for _, message in decoder.feed([view[:half], view[half:]] if step % 2 else chunk):
                _request(bytes(message))
            del view
            pos += size
            assert decoder.buffered <= pos
            assert decoder.held <= 2 * decoder.buffered + grpc_framing.PREFIX_SIZE
            step = step % 7 + 1
        decoder.close()
    except grpc_framing.FramingError as e:
        assert e.status in (13, 8), e.status


def _request(body: bytes) -> None:
    try:
        reference: pb.ModelInferRequest | None = pb.ModelInferRequest.FromString(body)
    except UpbDecodeError:
        reference = None
    try:
        request = grpc_codec.decode_model_infer_request(bytearray(body))
    except grpc_codec.DecodeError as e:
        assert reference is None or "nested too deeply" in str(e), f"upb parses what the codec rejects: {e}"
        return
    except TritonError:
        return
    assert reference is not None, "the codec decodes what upb rejects"
    _same(request, reference)
    for tensor in request.inputs:
        assert tensor.data.shape == tensor.shape
    response = InferenceResponse(request.model_name, request.model_version, request.id, request.inputs,
                                 request.parameters)
    parts, size = grpc_codec.encode_model_infer_response(response)
    assert len(grpc_codec.join(parts)) == size
    parts, size = grpc_codec.encode_model_stream_infer_response(response, "error", {"triton_final_response": True})
    assert len(grpc_codec.join(parts)) == size


def _params(message) -> dict:
    """upb's parameter map as the codec gives it: entries without a value left out, NaN as a string."""
    out = {}
    for key, value in message.items():
        choice = value.WhichOneof("parameter_choice")
        if choice:
            out[key] = _comparable(getattr(value, choice))
    return out


def _comparable(value):
    return "nan" if isinstance(value, float) and value != value else value


def _ours(parameters: dict) -> dict:
    return {key: _comparable(value) for key, value in parameters.items()}


def _params_unknown(message, field: int) -> bool:
    """Whether upb kept a parameter map entry as an unknown field: it does so for an entry that
    holds an unknown field (protobuf C++, Triton's parser, and the codec keep the entry)."""
    return any(f.field_number == field for f in unknown_fields.UnknownFieldSet(message))


def _same(request, reference: pb.ModelInferRequest) -> None:
    """The codec's request says what upb's message says."""
    assert (request.model_name, request.model_version, request.id) == (
        reference.model_name, reference.model_version, reference.id)
    if not _params_unknown(reference, 4):
        assert _ours(request.parameters) == _params(reference.parameters)
    assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [
        (t.name, t.datatype, tuple(t.shape)) for t in reference.inputs]
    for tensor, upb_tensor in zip(request.inputs, reference.inputs, strict=True):
        if not _params_unknown(upb_tensor, 4):
            assert _ours(tensor.parameters) == _params(upb_tensor.parameters)
    for tensor, raw in zip(request.inputs, reference.raw_input_contents, strict=False):
        if tensor.datatype != "BYTES":
            assert tensor.data.tobytes() == raw
    assert [o.name for o in request.outputs] == [o.name for o in reference.outputs]
    for output, upb_output in zip(request.outputs, reference.outputs, strict=True):
        if not _params_unknown(upb_output, 2):
            assert _ours(output.parameters) == _params(upb_output.parameters)


# ---- target 3: a small program writes the message --------------------------------------------

# interesting field numbers: 0, the known ones, the first two-byte tag, upb's largest
FIELDS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 5, 7, 15, 16, (1 << 29) - 1)
# where each message's sub-messages live: (field, the sub-message's kind)
NESTED = {"request": {4: "param_entry", 5: "input", 6: "output"},
          "input": {4: "param_entry", 5: "contents"}, "output": {2: "param_entry"},
          "param_entry": {2: "param"}, "contents": {}, "param": {}, "group": {}}
VALUES = (0, 1, 0x7F, 0x80, 300, (1 << 31) - 1, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 2**62)


_uvarint = grpc_codec.encode_varint


def _overlong(n: int, size: int) -> bytes:
    """``n`` as a varint padded to ``size`` bytes (upb takes up to 10; 11 is malformed)."""
    raw = bytearray(_uvarint(n))
    while len(raw) < size:
        raw[-1] |= 0x80
        raw.append(0)
    return bytes(raw)


def build(program: bytes) -> bytes:
    """Write a ModelInferRequest from ``program``, two bytes an instruction.

    The first byte's low 3 bits pick the action, the rest (and the second byte) its field and
    value. Actions: 0 varint, 1 fixed64, 2 bytes taken from the program, 3 open the sub-message
    this field holds (any other field: a group), 4 close the innermost message (its length
    exact, one short, one over, or huge), 5 fixed32, 6 a raw oddity (field 0, end-group,
    wire type 6/7, a long tag), 7 a packed run or an overlong varint.
    """
    stack: list[tuple[str, int, bytearray]] = [("request", 0, bytearray())]
    i = 0
    while i + 1 < len(program) and i < 4096:
        op, arg = program[i], program[i + 1]
        i += 2
        kind, out = stack[-1][0], stack[-1][2]
        action = op & 7
        field = FIELDS[(op >> 3) % len(FIELDS)]
        value = VALUES[arg % len(VALUES)]
        if action == 0:
            out += _uvarint(field << 3) + _uvarint(value if arg & 0x80 else arg & 0x7F)
        elif action == 1:
            out += _uvarint(field << 3 | 1) + struct.pack("<Q", value)
        elif action == 2:
            n = arg & 0x3F
            out += _uvarint(field << 3 | 2) + _uvarint(n) + program[i : i + n]
            i += n
        elif action == 3 and len(stack) < 8:
            sub = NESTED[kind].get(field)
            if sub is None:
                out += _uvarint(field << 3 | 3)
                stack.append(("group", field, bytearray()))
            else:
                stack.append((sub, field, bytearray()))
        elif action == 4 and len(stack) > 1:
            sub, sub_field, body = stack.pop()
            parent = stack[-1][2]
            if sub == "group":
                parent += body + _uvarint(sub_field << 3 | 4)
            else:
                n = len(body) + (0, 0, 0, 0, -1, 1, 1 << 20, (1 << 31) - 1)[arg & 7]
                parent += _uvarint(sub_field << 3 | 2) + _uvarint(max(n, 0)) + body
        elif action == 5:
            out += _uvarint(field << 3 | 5) + struct.pack("<I", value & 0xFFFFFFFF)
        elif action == 6:
            out += (b"\x00", b"\x02\x00", b"\x04", b"\x0c", b"\x0e", b"\x0f", b"\x88\x80\x80\x80\x00",
                    b"\x88\x80\x80\x80\x80\x00", b"\xf8\xff\xff\xff\x1f", b"\x80" * 11 + b"\x01")[arg % 10] + b"\x00"
        elif action == 7:
            if arg & 1:
                out += _uvarint(field << 3) + _overlong(value, 10 + (arg >> 7))
            else:
                run = b"".join(_uvarint(VALUES[(arg >> 1) % len(VALUES)]) for _ in range(1 + (arg >> 4)))
                out += _uvarint(field << 3 | 2) + _uvarint(len(run)) + run
    while len(stack) > 1:  # close what is still open, exactly
        sub, sub_field, body = stack.pop()
        parent = stack[-1][2]
        if sub == "group":
            parent += body + _uvarint(sub_field << 3 | 4)
        else:
            parent += _uvarint(sub_field << 3 | 2) + _uvarint(len(body)) + body
    return bytes(stack[0][2])


def _headers(body: bytes) -> None:
    try:
        grpc_framing.parse_timeout(body)
    except (ValueError, UnicodeDecodeError):
        pass
    text = grpc_framing.decode_grpc_message(body)
    assert grpc_framing.decode_grpc_message(grpc_framing.encode_grpc_message(text)) == text
    try:
        raw = grpc_framing.decode_binary_header(body)
    except (ValueError, UnicodeDecodeError):
        return
    assert grpc_framing.decode_binary_header(grpc_framing.encode_binary_header(raw)) == raw


def main() -> None:
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
