"""Sequence batching benchmark (run by hand; not collected by pytest).

One stateful Python accumulator (``sequence_batching`` direct, ``max_batch_size`` 64, START and
CORRID controls) whose execution costs ``A + B x batch`` seconds (``time.sleep``, which releases
the GIL like a framework kernel) is served by ``trident serve``. In the same run, tritonclient's
gRPC aio client plays 64 sequences of 100 steps each: first one sequence at a time, then all 64
concurrently. Every sequence's final sum is checked; the report gives requests/s, the mean batch
size (inference_count / execution_count from the statistics extension) and the speed-up.

    .venv/bin/python tests/bench/bench_sequence.py [--sequences 64] [--steps 100] [--a-ms 5] [--b-ms 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

MODEL_PY = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.a = float(params["A"]["string_value"])
        self.b = float(params["B"]["string_value"])
        self.sums = {}

    def execute(self, requests):
        time.sleep(self.a + self.b * len(requests))
        out = []
        for r in requests:
            cid = r.correlation_id()
            start = int(pb_utils.get_input_tensor_by_name(r, "START").as_numpy().reshape(-1)[0])
            x = int(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().reshape(-1)[0])
            total = x + (0 if start else self.sums.get(cid, 0))
            self.sums[cid] = total
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[total]], np.int32))]))
        return out
'''

CONFIG = '''
name: "seq_bench"
backend: "python"
max_batch_size: 64
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
parameters [ {{ key: "A" value: {{ string_value: "{a}" }} }}, {{ key: "B" value: {{ string_value: "{b}" }} }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
'''


async def play(client, sid: int, steps: int) -> int:
    import tritonclient.grpc.aio as grpcclient

    total = 0
    for k in range(steps):
        inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[k + 1]], dtype=np.int32))
        result = await client.infer("seq_bench", [inp], sequence_id=sid, sequence_start=k == 0,
                                    sequence_end=k == steps - 1)
        total = int(result.as_numpy("OUTPUT")[0, 0])
    return total


async def stats(client) -> tuple[int, int]:
    s = (await client.get_inference_statistics("seq_bench", as_json=True))["model_stats"][0]
    return int(s.get("inference_count", 0)), int(s.get("execution_count", 0))


async def measure(url: str, sequences: int, steps: int, concurrent: bool, first_id: int) -> dict:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        before = await stats(client)
        ids = list(range(first_id, first_id + sequences))
        start = time.perf_counter()
        if concurrent:
            totals = await asyncio.gather(*(play(client, sid, steps) for sid in ids))
        else:
            totals = [await play(client, sid, steps) for sid in ids]
        elapsed = time.perf_counter() - start
        after = await stats(client)
    finally:
        await client.close()
    expected = steps * (steps + 1) // 2
    assert all(t == expected for t in totals), totals
    inferences, executions = after[0] - before[0], after[1] - before[1]
    return {"mode": "64 concurrent" if concurrent else "1 at a time", "seconds": round(elapsed, 3),
            "requests_per_s": round(inferences / elapsed, 1), "mean_batch": round(inferences / max(executions, 1), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--a-ms", type=float, default=5.0)
    parser.add_argument("--b-ms", type=float, default=0.1)
    args = parser.parse_args()
    from e2e.conftest import start_server
    from e2e.models import write_model

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write_model(repo, "seq_bench", CONFIG.format(a=args.a_ms / 1000, b=args.b_ms / 1000), MODEL_PY)
        server = start_server(repo=repo)
        try:
            serial = asyncio.run(measure(server.grpc_url, args.sequences, args.steps, False, 1))
            concurrent = asyncio.run(measure(server.grpc_url, args.sequences, args.steps, True, 100_000))
        finally:
            server.stop()
    report = {"sequences": args.sequences, "steps": args.steps, "a_ms": args.a_ms, "b_ms": args.b_ms,
              "results": [serial, concurrent],
              "speedup": round(concurrent["requests_per_s"] / serial["requests_per_s"], 2)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
