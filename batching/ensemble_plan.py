"""An ensemble's dataflow, checked against its composing models: no I/O, no trio.

:func:`build_plan` turns a config's ``ensemble_scheduling`` steps into an :class:`EnsemblePlan`
once the composing models are loaded, refusing what cannot run with a load-failure reason
(unknown model or version, a mapped tensor the model does not have, a required model input
left unmapped, a datatype or shape that differs between the producer and the
consumer of an ensemble tensor, a batch size a composing model cannot take). The plan then
answers, per request, which steps are needed for the requested outputs (:meth:`prune`) and
how a tensor's shape converts between batching and non-batching models (:func:`reshape`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from trident import config as cfg
from trident.errors import TritonError, invalid_arg
from trident.protocol.generated.inference import ModelConfig, ModelInput, ModelOutput

LATEST = -1  # a step's model_version that means "the latest ready version"


class Signature(Protocol):
    """What the plan needs to know of a composing model (a loaded model version)."""

    name: str
    version: int
    config: ModelConfig
    max_batch_size: int
    decoupled: bool


@dataclass(frozen=True, slots=True)
class TensorType:
    """An ensemble tensor's datatype and full shape (``-1`` first when it carries a batch)."""

    datatype: str
    shape: tuple[int, ...]
    batching: bool


@dataclass(slots=True)
class Step:
    """One step: ``inputs`` maps model input -> ensemble tensor, ``outputs`` model output -> tensor."""

    index: int
    model_name: str
    model_version: int
    inputs: dict[str, str]
    outputs: dict[str, str]
    batching: bool = False
    decoupled: bool = False
    #: the composing model's input dims (without batch), for batch / non-batch conversion
    input_dims: dict[str, list[int]] = field(default_factory=dict)

    @property
    def version_string(self) -> str:
        return "" if self.model_version == LATEST else str(self.model_version)

    def describe(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


@dataclass
class EnsemblePlan:
    """The checked dataflow of one ensemble."""

    name: str
    max_batch_size: int
    steps: list[Step]
    inputs: list[str]
    outputs: dict[str, list[int]]  # ensemble output -> config dims (without batch)
    consumers: dict[str, list[int]]  # ensemble tensor -> indices of the steps that read it
    producer: dict[str, int]  # ensemble tensor -> index of the step that writes it
    decoupled: bool
    max_inflight_requests: int = 0

    def prune(self, requested: Iterable[str]) -> frozenset[int]:
        """The steps the ``requested`` outputs depend on (all steps when nothing is requested)."""
        wanted = list(requested) or list(self.outputs)
        needed: set[int] = set()
        todo = [self.producer[t] for t in wanted if t in self.producer]
        while todo:
            index = todo.pop()
            if index in needed:
                continue
            needed.add(index)
            todo.extend(self.producer[t] for t in self.steps[index].inputs.values() if t in self.producer)
        return frozenset(needed)


def dependencies(config: ModelConfig) -> list[tuple[str, int]]:
    """(model name, version) of every step, in step order, without repeats."""
    assert config.ensemble_scheduling is not None
    seen: dict[tuple[str, int], None] = {}
    for step in config.ensemble_scheduling.step:
        seen.setdefault((step.model_name, int(step.model_version) if step.model_version else LATEST), None)
    return list(seen)


def _full(dims: Iterable[int], batching: bool) -> tuple[int, ...]:
    shape = tuple(int(d) for d in dims)
    return (-1, *shape) if batching else shape


def _compatible(a: TensorType, b: TensorType) -> bool:
    if a.datatype != b.datatype or len(a.shape) != len(b.shape):
        return False
    return all(x == y or x == -1 or y == -1 for x, y in zip(a.shape, b.shape, strict=True))


def build_plan(config: ModelConfig, resolve: Callable[[str, int], Signature]) -> EnsemblePlan:
    """Check ``config``'s steps against the composing models ``resolve`` returns.

    ``resolve(model_name, version)`` returns the loaded model (``version`` -1: the latest) or
    raises TritonError. Raises INVALID_ARG naming the ensemble and the first problem found.
    """
    name = config.name
    assert config.ensemble_scheduling is not None
    scheduling = config.ensemble_scheduling
    batching = config.max_batch_size > 0
    types: dict[str, tuple[TensorType, str]] = {}  # ensemble tensor -> (type, who says so)

    def agree(tensor: str, found: TensorType, source: str) -> None:
        known = types.get(tensor)
        if known is None:
            types[tensor] = (found, source)
            return
        expected, origin = known
        if expected.datatype != found.datatype:
            raise invalid_arg(
                f"in ensemble '{name}', ensemble tensor '{tensor}': inconsistent data type: "
                f"{expected.datatype} is inferred from {origin} while {found.datatype} is inferred from {source}"
            )
        if not _compatible(expected, found):
            raise invalid_arg(
                f"in ensemble '{name}', ensemble tensor '{tensor}': inconsistent shape: "
                f"{list(expected.shape)} is inferred from {origin} while {list(found.shape)} is inferred from {source}"
            )

    for io in config.input:
        agree(io.name, TensorType(cfg.api_datatype(io.data_type), _full(io.dims, batching), batching),
              f"ensemble input of '{name}'")
    steps: list[Step] = []
    decoupled = False
    for index, spec in enumerate(scheduling.step):
        version = int(spec.model_version) if spec.model_version else LATEST
        try:
            model = resolve(spec.model_name, version)
        except TritonError as e:
            which = "" if version == LATEST else f" version {version}"
            raise invalid_arg(
                f"in ensemble '{name}', step {index} needs model '{spec.model_name}'{which}, which is not "
                f"available: {e.message}"
            ) from e
        mconfig = model.config
        step_batching = model.max_batch_size > 0
        if batching and (not step_batching or model.max_batch_size < config.max_batch_size):
            raise invalid_arg(
                f"ensemble '{name}' allows maximum batch size {config.max_batch_size}, but it contains model "
                f"'{model.name}' which only allows maximum batch size to be {max(model.max_batch_size, 0)}"
            )
        model_inputs = {i.name: i for i in mconfig.input}
        model_outputs = {o.name: o for o in mconfig.output}
        source = f"model '{model.name}'"
        for model_input, tensor in spec.input_map.items():
            found = model_inputs.get(model_input)
            if found is None:
                raise invalid_arg(
                    f"in ensemble '{name}', ensemble tensor '{tensor}' is mapping to non-existing input "
                    f"'{model_input}' in model '{model.name}'"
                )
            agree(tensor, TensorType(cfg.api_datatype(found.data_type),
                                     _full(_dims(found), step_batching), step_batching), source)
        for model_output, tensor in spec.output_map.items():
            found_out = model_outputs.get(model_output)
            if found_out is None:
                raise invalid_arg(
                    f"in ensemble '{name}', ensemble tensor '{tensor}' is mapped from non-existing output "
                    f"'{model_output}' in model '{model.name}'"
                )
            agree(tensor, TensorType(cfg.api_datatype(found_out.data_type),
                                     _full(_dims(found_out), step_batching), step_batching), source)
        unmapped = [i for i, io in model_inputs.items() if i not in spec.input_map and not io.optional]
        if unmapped:
            raise invalid_arg(
                f"in ensemble '{name}', step {index} does not map required input(s) {unmapped} of model "
                f"'{model.name}'"
            )
        decoupled = decoupled or model.decoupled
        steps.append(Step(index, spec.model_name, version, dict(spec.input_map), dict(spec.output_map),
                          step_batching, model.decoupled,
                          {i: _dims(io) for i, io in model_inputs.items()}))
    for io in config.output:
        agree(io.name, TensorType(cfg.api_datatype(io.data_type), _full(io.dims, batching), batching),
              f"ensemble output of '{name}'")
    consumers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for step in steps:
        for tensor in step.inputs.values():
            consumers.setdefault(tensor, []).append(step.index)
        for tensor in step.outputs.values():
            producer[tensor] = step.index
    policy = config.model_transaction_policy
    return EnsemblePlan(
        name=name,
        max_batch_size=int(config.max_batch_size),
        steps=steps,
        inputs=[i.name for i in config.input],
        outputs={o.name: [int(d) for d in o.dims] for o in config.output},
        consumers=consumers,
        producer=producer,
        decoupled=decoupled or bool(policy and policy.decoupled),
        max_inflight_requests=int(scheduling.max_inflight_requests),
    )


def _dims(io: ModelInput | ModelOutput) -> list[int]:
    """A config input/output's dims as clients of the model see them."""
    return [int(d) for d in io.dims]


def reshape(config_dims: list[int], config_batching: bool, tensor_batch: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape to give a consumer whose batching differs from the tensor's producer.

    ``tensor_batch`` is the batch size of the request that produced the tensor (0: it was not
    batched). A tensor from a non-batching producer gets a batch of 1 prepended when it
    matches the consumer's dims; a batched tensor of batch 1 loses its batch dimension when
    that is what makes it match a non-batching consumer. Otherwise the shape is unchanged.
    """
    if config_batching == (tensor_batch != 0):
        return shape
    if config_batching:
        return (1, *shape) if _matches(config_dims, shape) else shape
    if not _matches(config_dims, shape) and tensor_batch == 1:
        return shape[1:]
    return shape


def _matches(dims: list[int], shape: tuple[int, ...]) -> bool:
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape, strict=True))
