"""Direct sequence batching end to end: each sequence keeps its batch index, and idle slots
below a busy one carry null requests (READY false) that the Python model receives."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.models import write_model
from e2e.test_sequence import PROTOCOLS, stats

SLOTS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    """Per request: its batch index, the batch's READY values, and whether every null request
    (READY 0) looks like one: correlation id 0, no flags, CORRID 0, zero INPUT of a real shape."""

    def execute(self, requests):
        ready = [int(value(r, "READY").reshape(-1)[0]) for r in requests]
        shapes = {value(r, "INPUT").shape for r, k in zip(requests, ready) if k}
        nulls_ok = all(
            r.correlation_id() == 0 and r.flags() == 0 and int(value(r, "CORRID").reshape(-1)[0]) == 0
            and not value(r, "INPUT").any() and value(r, "INPUT").shape in shapes
            for r, k in zip(requests, ready) if not k)
        row = np.full((1, 4), -1, np.int32)
        row[0, :len(ready)] = ready
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("INDEX", np.array([[b]], np.int32)),
            pb_utils.Tensor("READY_ROW", row),
            pb_utils.Tensor("NULL_OK", np.array([[int(nulls_ok)]], np.int32)),
        ]) for b in range(len(requests))]
'''

SLOTS_CONFIG = '''
name: "slots_py"
backend: "python"
max_batch_size: 4
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "INDEX" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "READY_ROW" data_type: TYPE_INT32 dims: [ 4 ] },
  { name: "NULL_OK" data_type: TYPE_INT32 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 30000000
  direct { max_queue_delay_microseconds: 300000 minimum_slot_utilization: 0.5 }
  control_input [
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("seq_padding_repo")
    write_model(repo, "slots_py", SLOTS_CONFIG, SLOTS_PY)
    s = start_server(repo=repo)
    yield s
    s.stop()


def step(protocol: str, server, sid: int, *, start: bool = False, end: bool = False) -> tuple[int, list[int]]:
    """One request of sequence ``sid``: (its batch index, the batch's READY values)."""
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        inp = module.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[sid % 100 + 1]], dtype=np.int32))
        outputs = [module.InferRequestedOutput(n) for n in ("INDEX", "READY_ROW", "NULL_OK")]
        r = client.infer("slots_py", [inp], outputs=outputs, sequence_id=sid, sequence_start=start,
                         sequence_end=end)
        assert int(r.as_numpy("NULL_OK")[0, 0]) == 1, "a null request did not look like one"
        row = [int(v) for v in r.as_numpy("READY_ROW")[0] if v >= 0]
        return int(r.as_numpy("INDEX")[0, 0]), row
    finally:
        client.close()


@PROTOCOLS
def test_interleaved_sequences_keep_their_batch_index_and_null_rows_are_not_ready(server, protocol: str) -> None:
    a, b = (7001, 7002) if protocol == "http" else (8001, 8002)
    before = stats(server, "slots_py")
    assert step(protocol, server, a, start=True) == (0, [1])  # a takes slot 0
    assert step(protocol, server, b, start=True) == (1, [0, 1])  # b takes slot 1; slot 0 idle: a null row
    assert step(protocol, server, b) == (1, [0, 1])
    with ThreadPoolExecutor(2) as pool:  # 2 of 4 slots ready: usually one batch, always the same indexes
        got_a, got_b = pool.map(lambda sid: step(protocol, server, sid), (a, b))
    assert got_a[0] == 0 and got_a[1][0] == 1
    assert got_b[0] == 1 and got_b[1][1] == 1 and len(got_b[1]) == 2
    assert step(protocol, server, a) == (0, [1])  # slots above the highest busy one are not sent
    assert step(protocol, server, a, end=True) == (0, [1])  # a ends: slot 0 is free
    assert step(protocol, server, b, end=True) == (1, [0, 1])  # b keeps index 1
    inferences, executions = (x - y for x, y in zip(stats(server, "slots_py"), before, strict=True))
    assert inferences == 8  # null requests are not counted
    assert executions in (7, 8)
