"""What a framework backend sees of sequence batching: the control inputs and implicit state.

The sequence batcher (:mod:`trident.batching.sequence`) adds control tensors (START, END,
READY, CORRID: ``sequence_batching { control_input }``) and implicit-state tensors
(``sequence_batching { state }``) to each request it delivers. A framework backend checks and
runs the model with those as ordinary inputs and outputs: :func:`with_sequence_io` gives it the
config to do so. :func:`controls_of` reads the control inputs from a config (the batcher makes
the tensors from them, :mod:`trident.batching.state`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from trident import config as cfg
from trident.errors import invalid_arg
from trident.protocol.datatypes import api_to_config
from trident.protocol.generated.inference import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelSequenceBatchingControlKind,
)

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
