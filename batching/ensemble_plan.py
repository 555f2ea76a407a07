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
from trident.protocol.generated.inference import ModelConfig, ModelEnsemblingStep, ModelInput, ModelOutput

LATEST = -1  # a step's model_version that means "the latest ready version"


def version_string(version: int) -> str:
    """A step's version as the repository takes it ("" for the latest)."""
    return "" if version == LATEST else str(version)


def _step_version(spec: ModelEnsemblingStep) -> int:
    """A step's ``model_version`` (unset or -1: the latest)."""
    return int(spec.model_version) if spec.model_version else LATEST


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
        return version_string(self.model_version)

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
        seen.setdefault((step.model_name, _step_version(step)), None)
    return list(seen)


def _full(dims: Iterable[int], batching: bool) -> tuple[int, ...]:
    shape = tuple(int(d) for d in dims)
    return (-1, *shape) if batching else shape


def _compatible(a: TensorType, b: TensorType) -> bool:
    """Same datatype and shapes that agree (``-1`` matches any size). Between a batching and a
    non-batching model a tensor may also pass as one batch, or with its batch dimension dropped
    (see :func:`reshape`)."""
    if a.datatype != b.datatype:
        return False
    if _agree(a.shape, b.shape):
        return True
    if a.batching != b.batching:
        batched, plain = (a, b) if a.batching else (b, a)
        return _agree(batched.shape[1:], plain.shape)
    return False


def _agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def build_plan(config: ModelConfig, resolve: Callable[[str, int], Signature]) -> EnsemblePlan:
    """Check ``config``'s steps against the composing models ``resolve`` returns.

    ``resolve(model_name, version)`` returns the loaded model (``version`` -1: the latest) or
    raises TritonError. Raises INVALID_ARG with Triton's wording for the first problem found.
    """
    name = config.name
    assert config.ensemble_scheduling is not None
    scheduling = config.ensemble_scheduling
    batching = config.max_batch_size > 0
    types: dict[str, tuple[TensorType, str]] = {}  # ensemble tensor -> (type, the model it comes from)

    def agree(tensor: str, found: TensorType, source: str) -> None:
        known = types.get(tensor)
        if known is None:
            types[tensor] = (found, source)
            return
        expected, origin = known
        if expected.datatype != found.datatype:
            raise invalid_arg(
                f"in ensemble {name}, ensemble tensor {tensor}: inconsistent data type: "
                f"{_config_type(expected.datatype)} is inferred from model {origin} while "
                f"{_config_type(found.datatype)} is inferred from model {source}"
            )
        if not _compatible(expected, found):
            raise invalid_arg(
                f"in ensemble {name}, ensemble tensor {tensor}: inconsistent shape: "
                f"{_fmt(expected.shape)} is inferred from model {origin} while {_fmt(found.shape)} is inferred "
                f"from model {source}"
            )

    tensors: list[ModelInput | ModelOutput] = [*config.input, *config.output]
    for io in tensors:
        agree(io.name, TensorType(cfg.api_datatype(io.data_type), _full(io.dims, batching), batching), name)
    models: list[Signature] = []
    missing: list[str] = []
    for spec in scheduling.step:
        version = _step_version(spec)
        try:
            models.append(resolve(spec.model_name, version))
        except TritonError as e:
            if version != LATEST and _serving(resolve, spec.model_name):
                raise invalid_arg(f"ensemble '{name}' depends on '{spec.model_name}' whose required version "
                                  f"{version} is not loaded.") from e
            missing.append(spec.model_name)
    if missing:
        raise invalid_arg(f"ensemble {name} contains models that are not available or ambiguous: "
                          f"{', '.join(dict.fromkeys(missing))}")
    steps: list[Step] = []
    origin: dict[str, int | None] = {i.name: None for i in config.input}  # tensor -> decoupled step it fans out of
    for index, (spec, model) in enumerate(zip(scheduling.step, models, strict=True)):
        mconfig = model.config
        step_batching = model.max_batch_size > 0
        if batching and step_batching and model.max_batch_size < config.max_batch_size:
            raise invalid_arg(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it contains model "
                f"{model.name} which only allows maximum batch size to be {model.max_batch_size}"
            )
        model_inputs = {i.name: i for i in mconfig.input}
        model_outputs = {o.name: o for o in mconfig.output}
        for model_input, tensor in spec.input_map.items():
            found = model_inputs.get(model_input)
            if found is None:
                raise invalid_arg(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input "
                    f"{model_input} in model {model.name}"
                )
            agree(tensor, TensorType(cfg.api_datatype(found.data_type),
                                     _full(_dims(found), step_batching), step_batching), model.name)
        for model_output, tensor in spec.output_map.items():
            found_out = model_outputs.get(model_output)
            if found_out is None:
                raise invalid_arg(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                    f"{model_output} in model {model.name}"
                )
            agree(tensor, TensorType(cfg.api_datatype(found_out.data_type),
                                     _full(_dims(found_out), step_batching), step_batching), model.name)
        for model_input, io in model_inputs.items():
            if model_input not in spec.input_map and not io.optional:
                raise invalid_arg(
                    f"in ensemble {name}, input {model_input} in model {model.name} is not mapped to any "
                    "ensemble tensors"
                )
        steps.append(Step(index, spec.model_name, _step_version(spec),
                          dict(spec.input_map), dict(spec.output_map), step_batching, model.decoupled,
                          {i: _dims(io) for i, io in model_inputs.items()}))
    # every step's inputs must fan out of the same decoupled step (or of none): the responses of
    # a decoupled step are matched with other tensors by iteration, which only lines up then
    for step in _in_dependency_order(steps):
        sources = {origin.get(t) for t in step.inputs.values()}
        if len(sources) > 1:
            raise invalid_arg(
                f"in ensemble {name}, step of model '{step.model_name}' receives inputs originated from different "
                "decoupled models"
            )
        fanned = step.index if step.decoupled else next(iter(sources), None)
        for tensor in step.outputs.values():
            origin[tensor] = fanned
    if len({origin.get(o.name) for o in config.output}) > 1:  # the response pairs outputs by iteration too
        raise invalid_arg(
            f"in ensemble {name}, step of model '{name}' receives inputs originated from different decoupled models"
        )
    consumers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for step in steps:
        for tensor in step.inputs.values():
            consumers.setdefault(tensor, []).append(step.index)
        for tensor in step.outputs.values():
            producer[tensor] = step.index
    return EnsemblePlan(
        name=name,
        max_batch_size=int(config.max_batch_size),
        steps=steps,
        inputs=[i.name for i in config.input],
        outputs={o.name: [int(d) for d in o.dims] for o in config.output},
        consumers=consumers,
        producer=producer,
        decoupled=any(step.decoupled for step in steps),
        max_inflight_requests=int(scheduling.max_inflight_requests),
    )


def _serving(resolve: Callable[[str, int], Signature], model: str) -> bool:
    try:
        resolve(model, LATEST)
    except TritonError:
        return False
    return True


def _in_dependency_order(steps: list[Step]) -> list[Step]:
    """Producers before consumers (the steps form a DAG: config validation refused cycles)."""
    produced_by = {t: s.index for s in steps for t in s.outputs.values()}
    done: set[int] = set()
    order: list[Step] = []

    def visit(step: Step) -> None:
        if step.index in done:
            return
        done.add(step.index)
        for tensor in step.inputs.values():
            if tensor in produced_by:
                visit(steps[produced_by[tensor]])
        order.append(step)

    for step in steps:
        visit(step)
    return order


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


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
