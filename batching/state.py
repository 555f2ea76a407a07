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

The control inputs themselves and the inputs and outputs a framework backend runs with are
:mod:`trident.backends.sequence_io` (the backend's side of the contract).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trident import config as cfg
from trident.backends.sequence_io import CORRID, Control
from trident.errors import invalid_arg
from trident.protocol.datatypes import numpy_dtype
from trident.protocol.generated.inference import (
    ModelConfig,
)
from trident.types import Tensor


@dataclass(frozen=True, slots=True)
class StateSpec:
    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    initial: np.ndarray


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
