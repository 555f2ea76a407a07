"""Model warmup: the ``model_warmup`` samples of a config, run on every instance before READY.

As in Triton (core ``backend_model_instance.cc``): each sample becomes ``batch_size`` requests
of batch 1 (inputs shaped ``[1] + dims`` when the model batches, ``dims`` otherwise), executed
together as one batch, ``count`` times (0 counts as once), on each instance, in config order.
Data is ``zero_data`` (zeros; empty strings for BYTES), ``random_data`` (random bytes; empty
strings for BYTES) or ``input_data_file`` (raw little-endian data, or length-prefixed elements
for BYTES, read from ``<model>/warmup/<file>``). A sample with ``batch_size: 0`` is skipped.

Unlike Triton, which logs a failing warmup execution and serves anyway, trident fails the
load: a model is READY only after every sample ran without error on every instance. Warmup
executions are not counted in the model's statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

from trident import config as cfg
from trident.errors import Code, TritonError, invalid_arg
from trident.protocol import datatypes
from trident.protocol.generated.inference import ModelConfig, ModelWarmupInput
from trident.types import InferenceRequest, InferenceResponse, Tensor

WARMUP_FOLDER = "warmup"


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One ``model_warmup`` entry, its input data ready."""

    name: str
    batch_size: int
    count: int
    inputs: tuple[Tensor, ...]

    def requests(self, model_name: str) -> list[InferenceRequest]:
        """``batch_size`` requests sharing the sample's (read-only) arrays."""
        return [
            InferenceRequest(model_name, [Tensor(t.name, t.datatype, t.shape, t.data) for t in self.inputs],
                             id=f"warmup:{self.name}")
            for _ in range(self.batch_size)
        ]


def _array(name: str, spec: ModelWarmupInput, model_dir: Path, rng: np.random.Generator) -> tuple[str, np.ndarray]:
    datatype = cfg.api_datatype(spec.data_type)
    dims = [int(d) for d in spec.dims]
    if any(d < 0 for d in dims):
        raise invalid_arg(f"warmup setting expects all variable-size dimensions are specified for input '{name}'")
    count = datatypes.element_count(dims)
    dtype = datatypes.numpy_dtype(datatype)
    if spec.input_data_file is not None:
        folder = (model_dir / WARMUP_FOLDER).resolve()
        path = (folder / spec.input_data_file).resolve()
        if not path.is_relative_to(folder):
            raise invalid_arg(f"warmup data file '{spec.input_data_file}' must be inside the model's warmup folder")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise invalid_arg(f"failed to read warmup data file '{spec.input_data_file}': {e.strerror}") from None
        if datatype == "BYTES":
            try:
                return datatype, datatypes.deserialize_bytes(data, count).reshape(dims)
            except ValueError as e:
                raise invalid_arg(f"warmup data file '{spec.input_data_file}' for input '{name}': {e}") from None
        need = count * dtype.itemsize
        if len(data) < need:
            raise invalid_arg(
                f"warmup setting expects {need} bytes, but the data provided from {spec.input_data_file} "
                f"only has {len(data)} bytes"
            )
        return datatype, np.frombuffer(data[:need], dtype=dtype).reshape(dims)
    if datatype == "BYTES":
        empty = np.empty(count, dtype=object)
        empty[:] = [b""] * count
        return datatype, empty.reshape(dims)
    if spec.random_data:
        if datatype == "BOOL":
            return datatype, rng.integers(0, 2, size=dims).astype(np.bool_)
        return datatype, np.frombuffer(rng.bytes(count * dtype.itemsize), dtype=dtype).reshape(dims).copy()
    if spec.zero_data:
        return datatype, np.zeros(dims, dtype=dtype)
    raise invalid_arg(f"warmup setting expects input '{name}' to have input_data_type set")


def warmup_samples(config: ModelConfig, model_dir: Path, seed: int | None = None) -> list[WarmupSample]:
    """The samples of ``config.model_warmup`` (blocking: reads data files).

    Raises INVALID_ARG with Triton's wording for unset data, unspecified variable dimensions,
    short or unreadable data files, and a batch size above ``max_batch_size``.
    """
    rng = np.random.default_rng(seed)
    batching = config.max_batch_size > 0
    samples = []
    for warmup in config.model_warmup:
        if warmup.batch_size == 0:
            continue
        limit = max(1, int(config.max_batch_size))
        if warmup.batch_size > limit:
            raise invalid_arg(
                f"warmup setting '{warmup.name}' has batch_size {warmup.batch_size}, "
                f"more than the model's max batch size {limit}"
            )
        tensors = []
        for name in sorted(warmup.inputs):
            datatype, array = _array(name, warmup.inputs[name], model_dir, rng)
            if batching:
                array = array.reshape((1, *array.shape))
            tensors.append(Tensor(name, datatype, tuple(int(d) for d in array.shape), array))
        samples.append(WarmupSample(warmup.name, int(warmup.batch_size), max(1, int(warmup.count)), tuple(tensors)))
    return samples


def _failure(sample: WarmupSample, model_name: str, error: TritonError) -> TritonError:
    return TritonError(error.code, f"warmup sample '{sample.name}' of model '{model_name}' failed: {error.message}")


async def warm_up(instance: Any, samples: Sequence[WarmupSample], *, model_name: str, decoupled: bool,
                  validate: Callable[[InferenceRequest], int],
                  make_pending: Callable[[InferenceRequest], Any], thread: Any) -> None:
    """Run every sample on ``instance``, on its thread (``thread.run(fn, *args)``, a
    :class:`trident.server.execution.InstanceThread`).

    ``validate`` checks a request against the config, ``make_pending`` gives it a response
    channel (a :class:`trident.server.execution.Pending`). Raises TritonError for the first sample
    that fails (invalid data, an exception, an error response). Cancellation: a running
    execution is awaited (shielded) before the cancellation is delivered.
    """
    for sample in samples:
        for _ in range(sample.count):
            requests = sample.requests(model_name)
            try:
                for r in requests:
                    validate(r)
            except TritonError as e:
                raise _failure(sample, model_name, e) from None
            pendings = [make_pending(r) for r in requests]
            try:
                with trio.CancelScope(shield=True):
                    responses = await thread.run(instance.execute, requests)
            except TritonError as e:
                raise _failure(sample, model_name, e) from None
            except Exception as e:
                raise _failure(sample, model_name, TritonError(Code.INTERNAL, f"{type(e).__name__}: {e}")) from None
            if decoupled:
                responses = [await _final(p) for p in pendings]
            if responses is None or len(responses) != len(requests):
                got = "no responses" if responses is None else f"{len(responses)} responses"
                raise _failure(sample, model_name, TritonError(Code.INTERNAL, f"{got} for {len(requests)} requests"))
            for response in responses:
                if response.error is not None:
                    raise _failure(sample, model_name, response.error)


async def _final(pending: Any) -> InferenceResponse:
    """The first error response of a decoupled request, else its final one."""
    last = InferenceResponse()
    async with pending.receive:
        async for response in pending.receive:
            last = response
            if response.error is not None or response.final:
                break
    return last
