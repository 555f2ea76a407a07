"""Admitting a request: its check against the inputs and outputs a model declares, and load shedding.

A model version (trident.server.model.ModelVersion) and an ensemble (:mod:`.ensemble`) read their
declared tensors once (:func:`tensor_specs`) and check every request against them before it is
queued (:func:`validate_request`), with Triton's wording.

Load shedding (trident's own; :func:`queue_delay_target_us`, :class:`LoadShedder`): a model with a
queue-delay target refuses a new request at admission, UNAVAILABLE with a retry delay, when the
queue delay it would see is estimated above the target. The estimate is the requests ahead of
it (queued or executing) times the recent interval between the model's completions (an average of the gaps between
completions, each capped at its own execution time, so idle time between requests does not
count; several instances and batches shorten it, as they shorten the wait). Pure arithmetic on
numbers the model version hands in: no clock, no trio.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trident import config as cfg
from trident.errors import TritonError, invalid_arg, overloaded
from trident.protocol.generated.inference import ModelConfig
from trident.types import InferenceRequest, Tensor, TensorSpec, WireBytesTensor


def tensor_specs(config: ModelConfig, model_dir: Path) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """The specs of a config's inputs and outputs (output labels read from ``model_dir``)."""
    inputs = {i.name: TensorSpec(i.name, cfg.api_datatype(i.data_type), list(i.dims), bool(i.optional))
              for i in config.input}
    outputs: dict[str, TensorSpec] = {}
    for o in config.output:
        spec = TensorSpec(o.name, cfg.api_datatype(o.data_type), list(o.dims))
        if o.label_filename:
            spec.labels = (model_dir / o.label_filename).read_text().splitlines()
        outputs[o.name] = spec
    return inputs, outputs


SIGNATURES = 64  # input signatures a model remembers as valid (the table is emptied when full)


def validate_request(name: str, max_batch_size: int, inputs: dict[str, TensorSpec],
                     outputs: dict[str, TensorSpec], request: InferenceRequest,
                     known: dict[tuple[tuple[str, str, tuple[int, ...]], ...], int] | None = None) -> int:
    """Check ``request`` against a model's inputs and outputs; return its batch size.

    ``known``: the model's table of input signatures (each input's name, datatype and shape,
    in order) that passed, with their batch sizes; clients send the same signature again and
    again. A request without requested outputs whose signature is known skips the checks
    that depend on the signature alone (each tensor's data is still checked against its
    shape); one that passes is added (at most ``SIGNATURES``, then the table starts afresh).
    The caller owns the table and keeps ``inputs``, ``outputs`` and ``max_batch_size`` fixed
    for it.

    Raises TritonError(INVALID_ARG) with Triton's wording.
    """
    key = None
    if known is not None and not request.outputs:
        try:
            key = tuple([(t.name, t.datatype, t.shape) for t in request.inputs])
            batch = known.get(key)
        except TypeError:  # an unhashable shape (a list from an in-process caller)
            key = batch = None
        if batch is not None:
            for tensor in request.inputs:
                _check_data(tensor)
            return batch
    batch = _validate(name, max_batch_size, inputs, outputs, request)
    if key is not None and known is not None:
        if len(known) >= SIGNATURES:
            known.clear()
        known[key] = batch
    return batch


def _validate(name: str, max_batch_size: int, inputs: dict[str, TensorSpec],
              outputs: dict[str, TensorSpec], request: InferenceRequest) -> int:
    seen: set[str] = set()
    batch = 1 if max_batch_size <= 0 else -1
    for tensor in request.inputs:
        if tensor.name in seen and tensor.name in inputs:
            raise invalid_arg(f"input '{tensor.name}' is specified more than once for model '{name}'")
        seen.add(tensor.name)
        shape = list(tensor.shape)
        check_input(name, max_batch_size, inputs, tensor.name, tensor.datatype, shape, batch_limit=False)
        if max_batch_size > 0:
            if batch == -1:
                batch = shape[0]
            elif shape[0] != batch:
                raise invalid_arg(f"input '{tensor.name}' batch size does not match other inputs for '{name}'")
        _check_data(tensor)
    missing = [n for n, s in inputs.items() if n not in seen and not s.optional]
    if missing:
        got = sorted(seen)
        raise invalid_arg(
            f"expected {len(inputs)} inputs but got {len(seen)} inputs for model '{name}'. "
            f"Got input(s) {got}, but missing required input(s) {missing}. Please provide all required input(s)."
        )
    if max_batch_size > 0:
        if batch < 1 and request.inputs:
            raise invalid_arg(f"inference request batch-size must be >= 1 for '{name}'")
        if batch > max_batch_size:
            raise invalid_arg(f"inference request batch-size must be <= {max_batch_size} for '{name}'")
    for wanted in request.outputs:
        if wanted.name not in outputs:
            raise invalid_arg(f"unexpected inference output '{wanted.name}' for model '{name}'")
        k = wanted.parameters.get("classification")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise invalid_arg(f"classification parameter of output '{wanted.name}' must be a non-negative integer")
    return max(batch, 1)


def check_input(name: str, max_batch_size: int, inputs: dict[str, TensorSpec], input_name: str,
                datatype: str, shape: list[int] | tuple[int, ...], *, batch_limit: bool = True) -> None:
    """One input's name, datatype and shape against the inputs model ``name`` declares (the
    checks of :func:`validate_request` that need no data and no other input; ``batch_limit``:
    its batch size too, which :func:`validate_request` checks once every input agrees on it):
    a decoder makes them before it reads the input's data, so a large tensor the model would
    refuse costs no decoding. Raises TritonError(INVALID_ARG) with Triton's wording."""
    spec = inputs.get(input_name)
    if spec is None:
        raise invalid_arg(f"unexpected inference input '{input_name}' for model '{name}'")
    if datatype != spec.datatype:
        raise invalid_arg(
            f"inference input '{input_name}' data-type is '{datatype}', but model '{name}' expects '{spec.datatype}'"
        )
    dims = list(shape)
    if max_batch_size > 0:
        if not dims:
            raise invalid_arg(
                f"input '{input_name}' for model '{name}' has no batch dimension (max_batch_size "
                f"{max_batch_size}); expected shape {[-1, *spec.dims]}"
            )
        if batch_limit and dims[0] > max_batch_size:
            raise invalid_arg(f"inference request batch-size must be <= {max_batch_size} for '{name}'")
        dims = dims[1:]
    if not _dims_match(dims, spec.dims):
        expected = [-1, *spec.dims] if max_batch_size > 0 else spec.dims
        raise invalid_arg(
            f"unexpected shape for input '{input_name}' for model '{name}'. "
            f"Expected {_fmt(expected)}, got {_fmt(list(shape))}"
        )


def _check_data(tensor: Tensor) -> None:
    """Raises INVALID_ARG when the tensor's data does not hold its declared shape (a tensor in
    its wire form was checked against its shape when decoded: its elements are not made here)."""
    if type(tensor) is WireBytesTensor:
        return
    if tensor.data.shape != tuple(tensor.shape) and tensor.data.size != int(np.prod(tensor.shape)):
        raise invalid_arg(f"input '{tensor.name}' data does not match its shape {_fmt(list(tensor.shape))}")


def _dims_match(shape: list[int], dims: list[int]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _fmt(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


#: the config.pbtxt parameter of a model's queue-delay target in microseconds (0: no shedding,
#: whatever ``--queue-delay-target-ms`` says)
QUEUE_DELAY_PARAMETER = "TRIDENT_QUEUE_DELAY_TARGET_US"
MAX_QUEUE_DELAY_TARGET_US = 3_600_000_000  # an hour: a target beyond it is a mistake
QUEUE_DELAY_REFUSED = "Exceeds queue delay target"


def queue_delay_target_us(config: ModelConfig, default_us: int) -> int:
    """The model's queue-delay target in µs: its :data:`QUEUE_DELAY_PARAMETER`, else
    ``default_us`` (the server's ``--queue-delay-target-ms``); 0 is off.

    Raises TritonError(INVALID_ARG) naming the parameter when it is not a whole number of
    microseconds in 0 .. :data:`MAX_QUEUE_DELAY_TARGET_US`.
    """
    param = config.parameters.get(QUEUE_DELAY_PARAMETER)
    if param is None:
        return default_us
    text = param.string_value.strip()
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_QUEUE_DELAY_TARGET_US:
        raise invalid_arg(f"parameter {QUEUE_DELAY_PARAMETER} of model '{config.name}' must be a whole number of "
                          f"microseconds from 0 (off) to {MAX_QUEUE_DELAY_TARGET_US}, got '{param.string_value}'")
    return value


class LoadShedder:
    """One model version's queue-delay target: :meth:`admit` refuses a request whose estimated
    queue delay is above it, :meth:`served` learns the interval between completions.

    The estimate needs a completion to start from: until the model has answered a request it
    admits everything. It follows the queue: once the queue is short again (empty: at once)
    requests are admitted, there is no hold-off.
    """

    __slots__ = ("name", "target_ns", "interval_ns", "last_end_ns", "refused")

    def __init__(self, name: str, target_us: int) -> None:
        self.name = name
        self.target_ns = target_us * 1000
        #: the recent interval between completions (ns; an average with weight 1/8 on the latest)
        self.interval_ns = 0
        self.last_end_ns = 0
        self.refused = 0  # requests refused (trident_inference_shed_count)

    def estimate_ns(self, ahead: int) -> int:
        """The queue delay a request arriving behind ``ahead`` requests is estimated to see."""
        return ahead * self.interval_ns

    def admit(self, ahead: int) -> None:
        """Admit a request arriving behind ``ahead`` requests (queued or executing), or raise
        TritonError(UNAVAILABLE) "Exceeds queue delay target" with the seconds to wait
        (``retry_after_s``)."""
        estimate = ahead * self.interval_ns
        if estimate > self.target_ns:
            raise self._refuse(estimate)

    def _refuse(self, estimate_ns: int) -> TritonError:
        self.refused += 1
        return overloaded(f"{QUEUE_DELAY_REFUSED} for model '{self.name}': estimated queue delay "
                          f"{estimate_ns // 1000} us, target {self.target_ns // 1000} us",
                          -(-estimate_ns // 1_000_000_000))

    def served(self, start_ns: int, end_ns: int) -> None:
        """A request whose execution ran from ``start_ns`` to ``end_ns`` (monotonic ns) is done."""
        gap = end_ns - self.last_end_ns
        busy = end_ns - start_ns
        sample = gap if gap < busy else busy
        if sample < 0:
            sample = 0
        if end_ns > self.last_end_ns:
            self.last_end_ns = end_ns
        if self.interval_ns == 0:
            self.interval_ns = sample
        else:
            self.interval_ns += (sample - self.interval_ns) >> 3
