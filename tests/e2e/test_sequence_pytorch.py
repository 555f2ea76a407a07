"""Sequence batching with implicit state on the PyTorch backend (TorchScript), HTTP and gRPC."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from e2e.test_sequence import EXPECTED, PROTOCOLS, run_sequences, stats
from unit.backends.test_pytorch import write_torchscript

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


class Accumulator(torch.nn.Module):
    """OUTPUT = INPUT + STATE_IN (STATE_IN is 0 on the START request); STATE_OUT = OUTPUT."""

    def forward(self, INPUT: torch.Tensor, START: torch.Tensor, STATE_IN: torch.Tensor):  # noqa: N803
        y = INPUT + STATE_IN * (1.0 - START)
        return y, y


CONFIG = '''
backend: "pytorch"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 200000 preferred_batch_size: [ 4 ] }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "STATE_IN" output_name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] } ]
}
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("seq_torch")
    write_torchscript(repo, "acc_torch", Accumulator(), CONFIG)
    s = start_server(repo=repo)
    yield s
    s.stop()


@PROTOCOLS
def test_torchscript_implicit_state_oldest_strategy(server, protocol: str) -> None:
    before = stats(server, "acc_torch")
    ids = [(7000 if protocol == "http" else 8000) + k for k in range(4)]
    results = run_sequences(protocol, server, "acc_torch", ids, 5, dtype=np.float32, output="OUTPUT__0")
    assert results == {sid: EXPECTED for sid in ids}
    inferences, executions = (a - b for a, b in zip(stats(server, "acc_torch"), before, strict=True))
    assert inferences == 20 and executions < inferences
