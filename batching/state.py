"""Sequence control tensors and implicit state (``sequence_batching { control_input, state }``).

The sequence batcher delivers control and state tensors as extra inputs of each request: a
request of a batching model (``max_batch_size > 0``) gets each control tensor with shape
``[1, 1]`` and each state tensor with shape ``[1, *dims]``, so that the framework backends'
merge along the batch dimension gives the model ``[batch, 1]`` control tensors (as Triton's
sequence batcher, which creates control tensors of shape ``[1]`` plus the batch dimension)
and ``[batch, *dims]`` state. A non-batching model gets ``[1]`` and ``dims``.

Implicit state: the output named ``output_name`` of request *i* of a sequence becomes the
input ``input_name`` of request *i + 1*; the server keeps it (:class:`SequenceState`) and strips
the state output from the client's response. The first request of a sequence gets the
``initial_state`` (``zero_data``, or ``data_file`` under ``<model>/initial_state/``) or zeros
(Triton leaves it uninitialized; variable dimensions become 1).

:func:`null_inputs` gives the inputs of a null request (the padding of an idle slot of a
direct batch, see :mod:`.sequence_rules`): the client inputs of a real request of the batch
zero-filled (BYTES: empty strings), START, END and READY false, CORRID 0 (empty for a string
CORRID: a null request belongs to no sequence, as in Triton, where the model cannot assume that
any input of a not-ready slot is meaningful) and the initial state.

:func:`with_sequence_io` gives framework backends the config they run with: the model's
inputs plus the control and state inputs, its outputs plus the state outputs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trident import config as cfg
from trident.errors import invalid_arg
from trident.protocol.datatypes import api_to_config, numpy_dtype
from trident.protocol.generated.inference import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelSequenceBatchingControlKind,
)
from trident.types import Tensor

START = "START"
END = "END"
READY = "READY"
CORRID = "CORRID"
_KINDS = {
    ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_START: START,
    ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_END: END,
    ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_READY: READY,
    ModelSequenceBatchingControlKind.CONTROL_SEQUENCE_CORRID: CORRID,
}


@dataclass(frozen=True, slots=True)
class Control:
    """One control input: its tensor name, kind, datatype and (false, true) values."""

    name: str
    kind: str  # START | END | READY | CORRID
    datatype: str
    values: tuple[object, object] = (0, 1)


@dataclass(frozen=True, slots=True)
class StateSpec:
    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    initial: np.ndarray


def controls_of(config: ModelConfig) -> list[Control]:
    """The control inputs of ``config.sequence_batching``. Raises INVALID_ARG for a bad one."""
    sb = config.sequence_batching
    out: list[Control] = []
    for ci in sb.control_input if sb else []:
        for c in ci.control:
            kind = _KINDS[ModelSequenceBatchingControlKind(c.kind)]
            if kind == CORRID:
                dtype = cfg.api_datatype(c.data_type)
                if dtype not in ("UINT64", "INT64", "UINT32", "INT32", "BYTES"):
                    raise invalid_arg(f"CORRID control '{ci.name}' of model '{config.name}' has data type "
                                      f"{dtype}; expected UINT64, INT64, UINT32, INT32 or STRING")
                out.append(Control(ci.name, kind, dtype))
            elif len(c.int32_false_true) == 2:
                out.append(Control(ci.name, kind, "INT32", (c.int32_false_true[0], c.int32_false_true[1])))
            elif len(c.fp32_false_true) == 2:
                out.append(Control(ci.name, kind, "FP32", (c.fp32_false_true[0], c.fp32_false_true[1])))
            elif len(c.bool_false_true) == 2:
                out.append(Control(ci.name, kind, "BOOL", (c.bool_false_true[0], c.bool_false_true[1])))
            else:
                raise invalid_arg(f"control '{ci.name}' of model '{config.name}' must specify exactly one of "
                                  "int32_false_true, fp32_false_true or bool_false_true with 2 values")
    return out


def states_of(config: ModelConfig, model_dir: Path | None) -> list[StateSpec]:
    """The implicit states of ``config``, initial values loaded. Raises INVALID_ARG."""
    sb = config.sequence_batching
    out: list[StateSpec] = []
    for s in sb.state if sb else []:
        datatype = cfg.api_datatype(s.data_type)
        dims = tuple(1 if d < 0 else int(d) for d in s.dims)
        dtype = np.dtype(object) if datatype == "BYTES" else numpy_dtype(datatype)
        initial = np.zeros(dims, dtype=dtype)
        if datatype == "BYTES":
            initial[...] = b""
        for init in s.initial_state:
            idims = tuple(1 if d < 0 else int(d) for d in init.dims) or dims
            if init.data_file:
                if model_dir is None:
                    raise invalid_arg(f"state '{s.input_name}': initial_state data_file needs a model directory")
                path = model_dir / "initial_state" / init.data_file
                try:
                    raw = path.read_bytes()
                except OSError as e:
                    raise invalid_arg(f"state '{s.input_name}': cannot read initial state '{path}': {e}") from e
                initial = np.frombuffer(raw, dtype=dtype, count=int(np.prod(idims))).reshape(idims).copy()
            else:
                initial = np.zeros(idims, dtype=dtype)
        out.append(StateSpec(s.input_name, s.output_name, datatype, dims, initial))
    return out


def control_tensor(control: Control, value: object, batching: bool) -> Tensor:
    """``control`` for one request: ``value`` is a bool (START/END/READY) or the correlation id."""
    shape = (1, 1) if batching else (1,)
    if control.kind == CORRID:
        if control.datatype == "BYTES":
            data = np.array([str(value).encode()], dtype=object).reshape(shape)
        else:
            data = np.array([value], dtype=numpy_dtype(control.datatype)).reshape(shape)
    else:
        chosen = control.values[1] if value else control.values[0]
        data = np.array([chosen], dtype=numpy_dtype(control.datatype)).reshape(shape)
    return Tensor(control.name, control.datatype, shape, data)


def null_inputs(client_inputs: list[Tensor], controls: list[Control], state: SequenceState,
                batching: bool) -> list[Tensor]:
    """The inputs of a null request shaped like a request whose own inputs are ``client_inputs``."""
    out = []
    for t in client_inputs:
        if t.datatype == "BYTES":
            data = np.empty(t.shape, dtype=object)
            data[...] = b""
        else:
            data = np.zeros(t.shape, dtype=t.data.dtype)
        out.append(Tensor(t.name, t.datatype, tuple(t.shape), data))
    for c in controls:
        value: object = ("" if c.datatype == "BYTES" else 0) if c.kind == CORRID else False
        out.append(control_tensor(c, value, batching))
    out.extend(state.initial_tensors())
    return out


def with_sequence_io(config: ModelConfig) -> ModelConfig:
    """``config`` plus its control and state inputs and state outputs (for framework backends).

    Returns ``config`` itself when it has no sequence batching.
    """
    sb = config.sequence_batching
    if sb is None or (not sb.control_input and not sb.state):
        return config
    out = copy.deepcopy(config)
    inputs = {i.name for i in out.input}
    outputs = {o.name for o in out.output}
    for control in controls_of(config):
        if control.name not in inputs:
            out.input.append(ModelInput(name=control.name, data_type=_config_type(control.datatype), dims=[1]))
            inputs.add(control.name)
    for s in sb.state:
        if s.input_name not in inputs:
            out.input.append(ModelInput(name=s.input_name, data_type=s.data_type, dims=list(s.dims)))
        if s.output_name not in outputs:
            out.output.append(ModelOutput(name=s.output_name, data_type=s.data_type, dims=list(s.dims)))
    return out


def _config_type(datatype: str) -> DataType:
    return DataType[api_to_config(datatype)]


class SequenceState:
    """The implicit state of live sequences: input name -> array (batch dim kept when batching)."""

    def __init__(self, specs: list[StateSpec], batching: bool) -> None:
        self.specs = specs
        self.batching = batching
        self._values: dict[object, dict[str, np.ndarray]] = {}

    def tensors(self, sequence_id: object, start: bool) -> list[Tensor]:
        """The state inputs of the next request of ``sequence_id`` (initial ones on ``start``)."""
        if start:
            self._values.pop(sequence_id, None)
        values = self._values.get(sequence_id, {})
        out = []
        for spec in self.specs:
            array = values.get(spec.input_name)
            if array is None:
                array = spec.initial[None, ...] if self.batching else spec.initial
            out.append(Tensor(spec.input_name, spec.datatype, tuple(int(d) for d in array.shape), array))
        return out

    def initial_tensors(self) -> list[Tensor]:
        """The initial state inputs (what a null request gets; nothing is kept)."""
        out = []
        for spec in self.specs:
            array = spec.initial[None, ...] if self.batching else spec.initial
            out.append(Tensor(spec.input_name, spec.datatype, tuple(int(d) for d in array.shape), array))
        return out

    def capture(self, sequence_id: object, outputs: list[Tensor]) -> list[Tensor]:
        """Keep the state outputs of ``outputs`` for ``sequence_id``; return the others."""
        by_output = {s.output_name: s for s in self.specs}
        kept: list[Tensor] = []
        values = self._values.setdefault(sequence_id, {})
        for tensor in outputs:
            spec = by_output.get(tensor.name)
            if spec is None:
                kept.append(tensor)
            else:
                values[spec.input_name] = np.array(tensor.data, copy=True).reshape(tensor.shape)
        return kept

    def drop(self, sequence_id: object) -> None:
        """Forget ``sequence_id``'s state (its sequence ended or timed out)."""
        self._values.pop(sequence_id, None)

    @property
    def output_names(self) -> list[str]:
        return [s.output_name for s in self.specs]
