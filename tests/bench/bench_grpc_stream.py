"""Messages per second on one ModelStreamInfer stream (any Triton-compatible server).

Not collected by pytest. grpcio sends ``--count`` pre-serialized ModelInferRequests on one
bidirectional stream as fast as flow control lets it and counts the responses.

  python tests/bench/bench_grpc_stream.py --url 127.0.0.1:8001 --model identity_fp32 --n 16 --count 20000
"""

from __future__ import annotations

import argparse
import time

import grpc
import numpy as np
import tritonclient.grpc.service_pb2 as pb


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="127.0.0.1:8001")
    p.add_argument("--model", default="identity_fp32")
    p.add_argument("--n", type=int, default=16, help="FP32 elements per request")
    p.add_argument("--count", type=int, default=20000)
    a = p.parse_args()
    message = pb.ModelInferRequest(model_name=a.model)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[a.n])
    message.raw_input_contents.append(np.arange(a.n, dtype=np.float32).tobytes())
    request = message.SerializeToString()
    options = [("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)]
    with grpc.insecure_channel(a.url, options=options) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        for _ in stream(iter([request] * 100)):  # warm-up
            pass
        errors = received = 0
        start = time.perf_counter()
        for reply in stream(iter([request] * a.count)):
            received += 1
            errors += pb.ModelStreamInferResponse.FromString(reply).error_message != ""
        elapsed = time.perf_counter() - start
    print(f"{received} responses ({errors} errors) in {elapsed:.2f} s: {received / elapsed:.0f} messages/s, "
          f"{received * a.n * 4 / elapsed / 1e6:.1f} MB/s of tensor data each way")


if __name__ == "__main__":
    main()
