"""A batching model (``dynamic_batching {}``, no queue delay) end to end: a request alone in its
loop round runs at once, alone (as Triton's batcher runs it with an idle instance), and requests
that arrive together still share batches, bad ones among them answered on their own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.http as httpclient
from e2e.grpc_raw import open_raw

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X + 1, SIZE = the requests in this execution."""

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x + 1),
                pb_utils.Tensor("SIZE", np.full(x.shape[:1] + (1,), len(requests), np.int64)),
            ]))
        return out
'''

CONFIG = '''backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "SIZE" data_type: TYPE_INT64 dims: [ 1 ] } ]
dynamic_batching { }
'''

PATH = "/inference.GRPCInferenceService/ModelInfer"

pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation


@pytest.fixture(scope="module")
def server(tmp_path_factory, grpc_http2):
    from e2e.conftest import start_server

    repo: Path = tmp_path_factory.mktemp("rounds-repo")
    (repo / "greedy" / "1").mkdir(parents=True)
    (repo / "greedy" / "1" / "model.py").write_text(MODEL_PY)
    (repo / "greedy" / "config.pbtxt").write_text(CONFIG)
    s = start_server(repo=repo)
    yield s
    s.stop()


def stats(server) -> tuple[int, int]:
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        s = c.get_inference_statistics("greedy").model_stats[0]
        return s.inference_count, s.execution_count


def message(x: np.ndarray, name: str = "X") -> bytes:
    m = pb.ModelInferRequest(model_name="greedy")
    m.inputs.add(name=name, datatype="FP32", shape=list(x.shape))
    m.raw_input_contents.append(x.astype(np.float32).tobytes())
    return m.SerializeToString()


def outputs(raw: bytes) -> tuple[np.ndarray, np.ndarray]:
    r = pb.ModelInferResponse.FromString(raw)
    names = [o.name for o in r.outputs]
    y = np.frombuffer(r.raw_output_contents[names.index("Y")], np.float32)
    size = np.frombuffer(r.raw_output_contents[names.index("SIZE")], np.int64)
    return y, size


def test_requests_one_at_a_time_run_alone_and_right(server):
    before = stats(server)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    with httpclient.InferenceServerClient(server.http_url) as h, grpcclient.InferenceServerClient(server.grpc_url) as g:
        for i in range(5):
            inp = httpclient.InferInput("X", [1, 4], "FP32")
            inp.set_data_from_numpy(x + i)
            r = h.infer("greedy", [inp])
            assert r.as_numpy("Y").tolist() == (x + i + 1).tolist() and r.as_numpy("SIZE").tolist() == [[1]]
            ginp = grpcclient.InferInput("X", [1, 4], "FP32")
            ginp.set_data_from_numpy(x - i)
            gr = g.infer("greedy", [ginp])
            assert gr.as_numpy("Y").tolist() == (x - i + 1).tolist() and gr.as_numpy("SIZE").tolist() == [[1]]
    after = stats(server)
    assert (after[0] - before[0], after[1] - before[1]) == (10, 10)


async def test_calls_read_together_share_a_batch_and_a_bad_one_is_answered_alone(server):
    before = stats(server)
    xs = [np.full((1, 4), i, np.float32) for i in range(8)]
    async with open_raw(server.grpc_port) as c:
        streams = await c.burst(PATH, [message(x) for x in xs])
    assert all(s.status == 0 for s in streams)
    results = [outputs(s.messages()[0]) for s in streams]
    assert [y.tolist() for y, _ in results] == [(x + 1).reshape(-1).tolist() for x in xs]
    assert [int(size[0]) for _, size in results] == [8] * 8  # one execution of all eight
    after = stats(server)
    assert (after[0] - before[0], after[1] - before[1]) == (8, 1)

    bodies = [message(x) for x in xs[:3]] + [message(xs[3], name="NOPE"), b"\xff\xff garbage"] + \
        [message(x) for x in xs[5:]]
    async with open_raw(server.grpc_port) as c:
        streams = await c.burst(PATH, bodies)
    assert [s.status for s in streams] == [0, 0, 0, 3, 3, 0, 0, 0]  # INVALID_ARGUMENT for the bad two
    assert "NOPE" in streams[3].message and streams[4].message
    good = [outputs(s.messages()[0]) for i, s in enumerate(streams) if i not in (3, 4)]
    assert [int(size[0]) for _, size in good] == [6] * 6
    assert [y.tolist() for y, _ in good] == [(x + 1).reshape(-1).tolist() for x in xs[:3] + xs[5:]]
