"""Input tensors for ``trident perf``: the model's inputs filled with random or zero data, or
read from a perf_analyzer ``--input-data`` JSON file.

Pure: the model description comes in as :class:`ModelInfo` (built from the metadata and config
the server returned), the result is one list of :class:`~trident.perf.wire.Tensor` per
request variant (a JSON file with several ``data`` entries gives one variant per entry, sent in
turn). Shapes exclude the batch dimension everywhere a user writes them (``--shape``, the JSON
``shape``), as in perf_analyzer; for a model with ``max_batch_size > 0`` the batch size ``-b``
is prepended and each element's data is repeated ``b`` times.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from trident.perf.wire import PerfError, Tensor
from trident.protocol.datatypes import element_size, is_datatype, numpy_dtype, serialize_bytes

__all__ = ["InputSpec", "ModelInfo", "parse_shapes", "build_requests", "MAX_INPUT_BYTES"]

#: largest single input tensor the tool builds (bytes); a larger one is refused
MAX_INPUT_BYTES = 1 << 30
#: largest --input-data file read
MAX_DATA_FILE = 256 << 20


@dataclass(frozen=True)
class InputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # without the batch dimension; -1 = variable


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    max_batch_size: int
    decoupled: bool = False


def parse_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """``--shape NAME:d1,d2,...`` values; raises :class:`PerfError` for a malformed one."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, dims = value.rpartition(":")
        if not sep or not name:
            raise PerfError(f"--shape expects NAME:d1,d2,..., got '{value}'")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        except ValueError:
            raise PerfError(f"--shape {value}: dimensions must be integers") from None
        if any(d < 0 for d in shape):
            raise PerfError(f"--shape {value}: dimensions must not be negative")
        shapes[name] = shape
    return shapes


def _resolve_shape(spec: InputSpec, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    if spec.name in shapes:
        given = shapes[spec.name]
        if len(given) != len(spec.shape) or any(m not in (-1, g) for m, g in zip(spec.shape, given, strict=True)):
            raise PerfError(f"--shape {spec.name}:{','.join(map(str, given))} does not match the model's "
                            f"shape {list(spec.shape)}")
        return given
    if any(d < 0 for d in spec.shape):
        raise PerfError(f"input '{spec.name}' has a variable shape {list(spec.shape)}: give it with "
                        f"--shape {spec.name}:dims")
    return spec.shape


def _fill(spec: InputSpec, shape: tuple[int, ...], kind: str, rng: np.random.Generator, string_length: int,
          string_data: str | None) -> np.ndarray:
    count = int(np.prod(shape)) if shape else 1
    size = element_size(spec.datatype)
    if (size or string_length) * count > MAX_INPUT_BYTES:
        raise PerfError(f"input '{spec.name}' of shape {list(shape)} is larger than 1 GiB")
    if spec.datatype == "BYTES":
        if string_data is not None:
            values = [string_data.encode()] * count
        elif kind == "zero":
            values = [b""] * count
        else:
            alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", np.uint8)
            values = [alphabet[rng.integers(0, len(alphabet), string_length)].tobytes() for _ in range(count)]
        arr = np.empty(count, dtype=object)
        arr[:] = values
        return arr.reshape(shape)
    dtype = numpy_dtype(spec.datatype)
    if kind == "zero":
        return np.zeros(shape, dtype)
    if spec.datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind == "f":
        return rng.random(shape, dtype=np.float64).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dtype)


def _to_bytes(spec: InputSpec, arr: np.ndarray) -> bytes:
    return serialize_bytes(arr) if spec.datatype == "BYTES" else np.ascontiguousarray(arr).tobytes()


def _batched(model: ModelInfo, shape: tuple[int, ...], data: bytes, batch: int) -> tuple[tuple[int, ...], bytes]:
    if model.max_batch_size > 0:
        return (batch, *shape), data * batch
    return shape, data


def build_requests(model: ModelInfo, batch: int, shapes: Mapping[str, tuple[int, ...]], input_data: str,
                   string_length: int = 128, string_data: str | None = None) -> list[list[Tensor]]:
    """The request variants: ``input_data`` is ``random``, ``zero`` or a JSON file's path.
    Raises :class:`PerfError` for a bad batch size, shape, or file."""
    if batch < 1:
        raise PerfError(f"batch size must be at least 1, got {batch}")
    if model.max_batch_size == 0 and batch > 1:
        raise PerfError(f"model '{model.name}' does not support batching (max_batch_size 0): -b must be 1")
    if model.max_batch_size > 0 and batch > model.max_batch_size:
        raise PerfError(f"batch size {batch} is larger than model '{model.name}''s max_batch_size "
                        f"{model.max_batch_size}")
    unknown = set(shapes) - {i.name for i in model.inputs}
    if unknown:
        raise PerfError(f"--shape names an input the model does not have: {', '.join(sorted(unknown))}")
    if input_data in ("random", "zero"):
        rng = np.random.default_rng(0)
        tensors = []
        for spec in model.inputs:
            shape = _resolve_shape(spec, shapes)
            arr = _fill(spec, shape, input_data, rng, string_length, string_data)
            full_shape, data = _batched(model, shape, _to_bytes(spec, arr), batch)
            tensors.append(Tensor(spec.name, spec.datatype, full_shape, data))
        return [tensors]
    return _from_file(model, batch, shapes, input_data)


def _from_file(model: ModelInfo, batch: int, shapes: Mapping[str, tuple[int, ...]], path: str) -> list[list[Tensor]]:
    try:
        if os.path.getsize(path) > MAX_DATA_FILE:
            raise PerfError(f"--input-data file {path} is larger than 256 MiB")
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except OSError as e:
        raise PerfError(f"cannot read --input-data file {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise PerfError(f"--input-data file {path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list) or not doc["data"]:
        raise PerfError(f"--input-data file {path}: expected {{\"data\": [ {{input: values, ...}}, ... ]}}")
    if "validation_data" in doc:
        raise PerfError("--input-data: 'validation_data' is not supported (outputs are not validated)")
    variants = []
    for i, entry in enumerate(doc["data"]):
        if not isinstance(entry, dict):
            raise PerfError(f"--input-data file {path}: data[{i}] is not an object")
        missing = [s.name for s in model.inputs if s.name not in entry]
        if missing:
            raise PerfError(f"--input-data file {path}: data[{i}] lacks input(s) {', '.join(missing)}")
        tensors = []
        for spec in model.inputs:
            shape, data = _entry(spec, entry[spec.name], shapes, f"data[{i}].{spec.name}")
            full_shape, data = _batched(model, shape, data, batch)
            tensors.append(Tensor(spec.name, spec.datatype, full_shape, data))
        variants.append(tensors)
    return variants


def _entry(spec: InputSpec, value: object, shapes: Mapping[str, tuple[int, ...]], where: str
           ) -> tuple[tuple[int, ...], bytes]:
    shape: tuple[int, ...] | None = None
    if isinstance(value, dict):
        if "shape" in value:
            try:
                shape = tuple(int(d) for d in value["shape"])
            except (TypeError, ValueError):
                raise PerfError(f"--input-data {where}: 'shape' must be a list of integers") from None
        if "b64" in value:
            try:
                raw = base64.b64decode(value["b64"], validate=True)
            except (ValueError, TypeError):
                raise PerfError(f"--input-data {where}: 'b64' is not valid base64") from None
            if shape is None:
                shape = _resolve_shape(spec, shapes)
            size = element_size(spec.datatype)
            count = int(np.prod(shape)) if shape else 1
            if size is not None and len(raw) != size * count:
                raise PerfError(f"--input-data {where}: {len(raw)} bytes, shape {list(shape)} needs {size * count}")
            return shape, raw
        if "content" not in value:
            raise PerfError(f"--input-data {where}: an object needs 'content' or 'b64'")
        value = value["content"]
    if not is_datatype(spec.datatype):
        raise PerfError(f"input '{spec.name}': unknown datatype {spec.datatype}")
    try:
        if spec.datatype == "BYTES":
            flat = np.asarray(value, dtype=object).reshape(-1)
            arr = np.empty(len(flat), dtype=object)
            arr[:] = [v.encode() if isinstance(v, str) else str(v).encode() for v in flat]
        else:
            arr = np.asarray(value, dtype=numpy_dtype(spec.datatype)).reshape(-1)
    except (TypeError, ValueError) as e:
        raise PerfError(f"--input-data {where}: values do not fit {spec.datatype}: {e}") from None
    if shape is None:
        shape = shapes.get(spec.name) or (spec.shape if all(d >= 0 for d in spec.shape) else (len(arr),))
    count = int(np.prod(shape)) if shape else 1
    if len(arr) != count:
        raise PerfError(f"--input-data {where}: {len(arr)} values, shape {list(shape)} needs {count}")
    if len(shape) != len(spec.shape) or any(m not in (-1, g) for m, g in zip(spec.shape, shape, strict=True)):
        raise PerfError(f"--input-data {where}: shape {list(shape)} does not match the model's {list(spec.shape)}")
    return shape, _to_bytes(spec, arr.reshape(shape))
