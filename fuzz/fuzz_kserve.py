"""atheris target for the KServe v2 HTTP codec (trident.protocol.kserve).

Input layout: 4 bytes little-endian ``Inference-Header-Content-Length`` (0xFFFFFFFF = header
absent; 0 = raw binary body, decoded for a one-input FP32 [1, -1] model), then the body.
A decoded request is re-encoded as a response, which must not fail either. Any exception
other than TritonError is a bug.

Run: ``python fuzz/fuzz_kserve.py fuzz/corpus/kserve`` (needs ``pip install atheris``).
The normal test run replays the corpus through :func:`one_input` (fuzz/test_replay_kserve.py).
"""

from __future__ import annotations

import struct
import sys

from trident.errors import TritonError
from trident.protocol import kserve
from trident.types import InferenceResponse, RequestedOutput

NO_HEADER = 0xFFFFFFFF


def one_input(data: bytes) -> None:
    """Decode one fuzz input; raises only for bugs (TritonError is an accepted outcome)."""
    if len(data) < 4:
        return
    (field,) = struct.unpack_from("<I", data)
    body = bytearray(data[4:])
    header_length = None if field == NO_HEADER else field
    try:
        if header_length == 0:
            request = kserve.decode_raw_request(body, "m", "", "IN", "FP32", [1, -1])
        else:
            request = kserve.decode_infer_request(body, header_length, "m", "1")
    except TritonError:
        return
    requested = [RequestedOutput(o.name, o.parameters) for o in request.outputs]
    binary_default = bool(request.parameters.get("binary_data_output", False))
    response = InferenceResponse("m", "1", request.id, list(request.inputs))
    try:
        parts, length = kserve.encode_infer_response(response, requested, binary_default)
    except TritonError:
        return
    blob = b"".join(bytes(p) for p in parts)
    if length is not None:
        assert 0 < length <= len(blob)
    data_out, encoding = kserve.compress(blob, "gzip")
    assert encoding == "gzip"
    assert kserve.decompress(data_out, "gzip") == blob


def seed(body: bytes, header_length: int | None) -> bytes:
    """A corpus entry for ``body`` with the given header length (None = header absent)."""
    return struct.pack("<I", NO_HEADER if header_length is None else header_length) + body


def main() -> None:
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
