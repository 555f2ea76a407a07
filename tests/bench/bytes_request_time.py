"""Request time of one large binary infer body, BYTES against FP32 (not collected by pytest).

Runs against an already running server whose repository has ``identity_fp32`` (FP32 [-1]) and
``bytes_identity`` (a Python model returning its BYTES [-1] input, e.g. ``output_tensors =
[pb_utils.Tensor("OUTPUT0", in0.as_numpy())]``), each with INPUT0/OUTPUT0::

    python tests/bench/bytes_request_time.py --http 127.0.0.1:8000 --kind bytes --count 15000000
    python tests/bench/bytes_request_time.py --http 127.0.0.1:8000 --kind bytes --count 3000000 --width 16
    python tests/bench/bytes_request_time.py --http 127.0.0.1:8000 --kind varied --count 2000000
    python tests/bench/bytes_request_time.py --http 127.0.0.1:8000 --kind fp32 --count 15000000

``bytes``: ``count`` elements of ``width`` bytes (0: empty strings); ``varied``: element i has
i % 32 bytes; ``fp32``: ``count`` floats. The answer is asked for as binary data and checked to
end with the bytes sent (``--model M``: posted to M instead, a model with the same input, and
not checked: e.g. one that answers the input's shape without reading its elements). Prints one
line per request: kind, count, model, status, seconds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import struct
import time

import numpy as np


def body(kind: str, count: int, width: int) -> tuple[str, bytes, bytes]:
    if kind == "fp32":
        data = np.zeros(count, dtype=np.float32).tobytes()
        model, datatype = "identity_fp32", "FP32"
    else:
        if kind == "bytes":
            data = (struct.pack("<I", width) + b"x" * width) * count
        else:
            data = b"".join(struct.pack("<I", i % 32) + b"v" * (i % 32) for i in range(count))
        model, datatype = "bytes_identity", "BYTES"
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [count], "datatype": datatype,
                                     "parameters": {"binary_data_size": len(data)}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    return model, header, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http", required=True, help="host:port")
    parser.add_argument("--kind", choices=["bytes", "varied", "fp32"], required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--width", type=int, default=0)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--model", default="", help="post to this model instead (its answer is not checked)")
    args = parser.parse_args()
    host, port = args.http.rsplit(":", 1)
    model, header, data = body(args.kind, args.count, args.width)
    checked = not args.model
    model = args.model or model
    for _ in range(args.requests):
        conn = http.client.HTTPConnection(host, int(port), timeout=600)
        start = time.perf_counter()
        conn.request("POST", f"/v2/models/{model}/infer", header + data,
                     {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
        response = conn.getresponse()
        answer = response.read()
        took = time.perf_counter() - start
        same = response.status == 200 and answer.endswith(data)
        print(args.kind, args.count, args.width, model, response.status, f"{took:.3f} s",
              ("echoed" if same else "NOT ECHOED") if checked else "")
        conn.close()


if __name__ == "__main__":
    main()
