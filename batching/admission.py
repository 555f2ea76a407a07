"""Admitting a request: its check against the inputs and outputs a model declares.

A model version (trident.server.model.ModelVersion) and an ensemble (:mod:`.ensemble`) read their
declared tensors once (:func:`tensor_specs`) and check every request against them before it is
queued (:func:`validate_request`), with Triton's wording.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trident import config as cfg
from trident.errors import invalid_arg
from trident.protocol.generated.inference import ModelConfig
from trident.types import InferenceRequest, Tensor, TensorSpec


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
        spec = inputs.get(tensor.name)
        if spec is None:
            raise invalid_arg(f"unexpected inference input '{tensor.name}' for model '{name}'")
        if tensor.name in seen:
            raise invalid_arg(f"input '{tensor.name}' is specified more than once for model '{name}'")
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype:
            raise invalid_arg(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{name}' expects '{spec.datatype}'"
            )
        shape = list(tensor.shape)
        dims = shape
        if max_batch_size > 0:
            if not shape:
                raise invalid_arg(
                    f"input '{tensor.name}' for model '{name}' has no batch dimension (max_batch_size "
                    f"{max_batch_size}); expected shape {[-1, *spec.dims]}"
                )
            if batch == -1:
                batch = shape[0]
            elif shape[0] != batch:
                raise invalid_arg(f"input '{tensor.name}' batch size does not match other inputs for '{name}'")
            dims = shape[1:]
        if not _dims_match(dims, spec.dims):
            expected = [-1, *spec.dims] if max_batch_size > 0 else spec.dims
            raise invalid_arg(
                f"unexpected shape for input '{tensor.name}' for model '{name}'. "
                f"Expected {_fmt(expected)}, got {_fmt(shape)}"
            )
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


def _check_data(tensor: Tensor) -> None:
    """Raises INVALID_ARG when the tensor's data does not hold its declared shape."""
    if tensor.data.shape != tuple(tensor.shape) and tensor.data.size != int(np.prod(tensor.shape)):
        raise invalid_arg(f"input '{tensor.name}' data does not match its shape {_fmt(list(tensor.shape))}")


def _dims_match(shape: list[int], dims: list[int]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _fmt(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
