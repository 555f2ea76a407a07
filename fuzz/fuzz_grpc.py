"""atheris target for the gRPC decoders (trident.protocol.grpc_framing and grpc_codec).

Input layout: the first byte picks the target, the rest is its input.

* 0: a gRPC DATA stream, fed to a MessageDecoder (4 KiB limit) in chunks whose sizes come from
  the input; every complete message is then decoded as a ModelInferRequest (target 1);
* 1: a serialized ModelInferRequest; a decoded request's inputs are encoded back as a
  ModelInferResponse and a ModelStreamInferResponse, which must not fail;
* 2: header values: grpc-timeout, grpc-message and ``-bin`` metadata parsing.

Accepted outcomes are FramingError, DecodeError, TritonError and (target 2) ValueError;
any other exception is a bug.

Run: ``python fuzz/fuzz_grpc.py fuzz/corpus/grpc`` (needs ``pip install atheris``).
The normal test run replays the corpus through :func:`one_input` (fuzz/test_replay_grpc.py).
"""

from __future__ import annotations

import sys

from trident.errors import TritonError
from trident.protocol import grpc_codec, grpc_framing
from trident.types import InferenceResponse


def one_input(data: bytes) -> None:
    """Run one fuzz input; raises only for bugs."""
    if not data:
        return
    target, body = data[0] % 3, data[1:]
    if target == 0:
        _stream(body)
    elif target == 1:
        _request(body)
    else:
        _headers(body)


def _stream(body: bytes) -> None:
    decoder = grpc_framing.MessageDecoder(4096)
    pos, step = 0, 1
    try:
        while pos < len(body):
            size = 1 + (body[pos] % 64) * step
            for _, message in decoder.feed(body[pos : pos + size]):
                _request(bytes(message))
            pos += size
            step = step % 7 + 1
        decoder.close()
    except grpc_framing.FramingError as e:
        assert e.status in (13, 8), e.status


def _request(body: bytes) -> None:
    try:
        request = grpc_codec.decode_model_infer_request(bytearray(body))
    except (grpc_codec.DecodeError, TritonError):
        return
    for tensor in request.inputs:
        assert tensor.data.shape == tensor.shape
    response = InferenceResponse(request.model_name, request.model_version, request.id, request.inputs,
                                 request.parameters)
    parts, size = grpc_codec.encode_model_infer_response(response)
    assert len(grpc_codec.join(parts)) == size
    parts, size = grpc_codec.encode_model_stream_infer_response(response, "error", {"triton_final_response": True})
    assert len(grpc_codec.join(parts)) == size


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
