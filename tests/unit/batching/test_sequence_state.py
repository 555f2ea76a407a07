"""Control tensors, implicit state storage and the framework-backend config of sequence models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trident.backends.sequence_io import CORRID, END, READY, START, controls_of, with_sequence_io
from trident.batching.state import SequenceState, control_tensor, states_of
from trident.errors import TritonError
from trident.protocol.pbtxt import parse_pbtxt
from trident.types import Tensor

CONFIG = '''
name: "m" max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
sequence_batching {
  control_input [
    { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ -1, 1 ] } ] },
    { name: "E" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "R" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 5, 7 ] } ] },
    { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [ { input_name: "H_IN" output_name: "H_OUT" data_type: TYPE_FP32 dims: [ -1 ]
            initial_state { data_type: TYPE_FP32 dims: [ 3 ] data_file: "h0" name: "h0" } } ]
}
'''


def test_controls_take_their_configured_values_and_types() -> None:
    controls = {c.kind: c for c in controls_of(parse_pbtxt(CONFIG))}
    assert {k: (c.name, c.datatype) for k, c in controls.items()} == {
        START: ("S", "FP32"), END: ("E", "BOOL"), READY: ("R", "INT32"), CORRID: ("C", "BYTES")}
    start = control_tensor(controls[START], True, batching=True)
    assert start.shape == (1, 1) and start.data.dtype == np.float32 and start.data[0, 0] == 1.0
    assert control_tensor(controls[START], False, batching=True).data[0, 0] == -1.0
    assert control_tensor(controls[READY], True, batching=False).data.tolist() == [7]
    assert control_tensor(controls[END], False, batching=False).data.tolist() == [False]
    assert control_tensor(controls[CORRID], "abc", batching=True).data[0, 0] == b"abc"


def test_a_control_without_two_values_is_invalid() -> None:
    bad = parse_pbtxt('name: "m" sequence_batching { control_input [ { name: "S" control [ '
                      '{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ] }')
    with pytest.raises(TritonError, match="exactly one of"):
        controls_of(bad)


def test_initial_state_from_a_data_file_and_state_carried_between_requests(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "h0").write_bytes(np.array([1, 2, 3], np.float32).tobytes())
    state = SequenceState(states_of(parse_pbtxt(CONFIG), tmp_path), batching=True)
    first = state.tensors("a", start=True)
    assert [t.name for t in first] == ["H_IN"] and first[0].data.tolist() == [[1, 2, 3]]
    kept = state.capture("a", [Tensor("Y", "FP32", (1, 2), np.zeros((1, 2), np.float32)),
                               Tensor("H_OUT", "FP32", (1, 3), np.array([[4, 5, 6]], np.float32))])
    assert [t.name for t in kept] == ["Y"]
    assert state.tensors("a", start=False)[0].data.tolist() == [[4, 5, 6]]
    assert state.tensors("b", start=False)[0].data.tolist() == [[1, 2, 3]]  # other sequences start fresh
    assert state.tensors("a", start=True)[0].data.tolist() == [[1, 2, 3]]  # START resets
    state.capture("a", [Tensor("H_OUT", "FP32", (1, 3), np.ones((1, 3), np.float32))])
    state.drop("a")
    assert state.tensors("a", start=False)[0].data.tolist() == [[1, 2, 3]]


def test_missing_initial_state_file_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(TritonError, match="cannot read initial state"):
        states_of(parse_pbtxt(CONFIG), tmp_path)


def test_framework_config_gets_control_and_state_tensors() -> None:
    config = parse_pbtxt(CONFIG)
    full = with_sequence_io(config)
    assert [i.name for i in full.input] == ["X", "S", "E", "R", "C", "H_IN"]
    assert [list(i.dims) for i in full.input][1:] == [[1], [1], [1], [1], [-1]]
    assert [o.name for o in full.output] == ["Y", "H_OUT"]
    assert [i.name for i in config.input] == ["X"]  # the model's own config is unchanged
    plain = parse_pbtxt('name: "p" max_batch_size: 1')
    assert with_sequence_io(plain) is plain
