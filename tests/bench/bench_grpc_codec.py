"""ModelInfer codec benchmark: trident.protocol.grpc_codec vs google protobuf (upb) vs betterproto2.

Not collected by pytest. Run: ``python tests/bench/bench_grpc_codec.py``

Each row is the median of 7 runs, in µs per message:

* decode: serialized ModelInferRequest -> tensors as numpy arrays. trident builds a full
  InferenceRequest; upb parses into its message and wraps each raw input with np.frombuffer;
  betterproto2 parses into its dataclasses (and np.frombuffer).
* encode: an identity model's response -> serialized ModelInferResponse (with the gRPC prefix
  for trident, which is what goes on the wire). upb and betterproto2 build their message from
  the numpy outputs (one tobytes() copy) and serialize it.

Sizes: "small" is tritonclient's request for identity_fp32 with FP32[1,16]; "1MiB" the same with
FP32[1,262144]. Large-buffer timings depend on the allocator (design.md §6): run once plain and
once with MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TOP_PAD_=67108864 MALLOC_TRIM_THRESHOLD_=536870912.
"""

from __future__ import annotations

import statistics
import timeit

import numpy as np
import tritonclient.grpc.service_pb2 as upb

from trident.protocol import grpc_codec, grpc_framing
from trident.protocol.generated import inference as bp2
from trident.types import InferenceResponse, Tensor


def request_bytes(n: int) -> bytes:
    message = upb.ModelInferRequest(model_name="identity_fp32", id="42")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, n])
    message.outputs.add(name="OUTPUT0")
    message.raw_input_contents.append(np.arange(n, dtype=np.float32).tobytes())
    return message.SerializeToString()


def per_call(fn, number: int) -> float:
    runs = timeit.repeat(fn, number=number, repeat=7)
    return statistics.median(runs) / number * 1e6


def bench(label: str, n: int, number: int) -> list[tuple[str, str, float]]:
    data = request_bytes(n)
    received = bytearray(data)
    array = np.arange(n, dtype=np.float32).reshape(1, n)
    response = InferenceResponse("identity_fp32", "1", "42", [Tensor("OUTPUT0", "FP32", (1, n), array)])

    def trident_decode():
        return grpc_codec.decode_model_infer_request(received)

    def upb_decode():
        m = upb.ModelInferRequest.FromString(data)
        return [np.frombuffer(raw, dtype=np.float32) for raw in m.raw_input_contents]

    def bp2_decode():
        m = bp2.ModelInferRequest.parse(data)
        return [np.frombuffer(raw, dtype=np.float32) for raw in m.raw_input_contents]

    def trident_encode():
        parts, size = grpc_codec.encode_model_infer_response(response)
        return grpc_framing.frame(parts, size)

    def upb_encode():
        m = upb.ModelInferResponse(model_name="identity_fp32", model_version="1", id="42")
        m.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, n])
        m.raw_output_contents.append(array.tobytes())
        return m.SerializeToString()

    def bp2_encode():
        m = bp2.ModelInferResponse(
            model_name="identity_fp32", model_version="1", id="42",
            outputs=[bp2.ModelInferResponseInferOutputTensor(name="OUTPUT0", datatype="FP32", shape=[1, n])],
            raw_output_contents=[array.tobytes()],
        )
        return bytes(m)

    # the codecs agree before they are timed
    assert trident_decode().inputs[0].data.tobytes() == upb_decode()[0].tobytes()
    assert upb.ModelInferResponse.FromString(trident_encode()[5:]) == upb.ModelInferResponse.FromString(upb_encode())
    rows = []
    for name, fn in (("trident", trident_decode), ("upb", upb_decode), ("betterproto2", bp2_decode)):
        rows.append((f"decode {label}", name, per_call(fn, number)))
    for name, fn in (("trident", trident_encode), ("upb", upb_encode), ("betterproto2", bp2_encode)):
        rows.append((f"encode {label}", name, per_call(fn, number)))
    return rows


def main() -> None:
    from google.protobuf.internal import api_implementation

    print(f"google protobuf backend: {api_implementation.Type()}")
    rows = bench("small", 16, 2000) + bench("1MiB", 1 << 18, 50)
    print(f"| {'case':<14} | {'codec':<12} | {'µs/message':>10} |")
    print(f"|{'-' * 16}|{'-' * 14}|{'-' * 12}|")
    for case, name, us in rows:
        print(f"| {case:<14} | {name:<12} | {us:>10.1f} |")


if __name__ == "__main__":
    main()
