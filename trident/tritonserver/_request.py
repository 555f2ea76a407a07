"""``tritonserver.InferenceRequest``: a request as Triton's package builds it, and the server's
:class:`trident.types.InferenceRequest` it becomes."""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trident.tritonserver._enums import RequestFlag
from trident.tritonserver._errors import InvalidArgumentError
from trident.tritonserver._tensor import DeviceOrMemoryType, Tensor, _from_object, check_host
from trident.types import InferenceRequest as CoreRequest

if TYPE_CHECKING:
    from trident.tritonserver._model import Model

_START, _END = int(RequestFlag.SEQUENCE_START), int(RequestFlag.SEQUENCE_END)  # ints: enum operators cost


@dataclass
class InferenceRequest:
    """An inference request (Triton's ``tritonserver.InferenceRequest``).

    ``inputs`` maps input names to a :class:`Tensor`, a numpy array or scalar, a (nested) list,
    or any DLPack object in CPU memory. ``flags`` takes ``SEQUENCE_START`` (1) and
    ``SEQUENCE_END`` (2) for sequence models, with ``correlation_id``; ``priority`` and
    ``timeout`` (microseconds) are the scheduler's, as Triton's. ``parameters`` values are str,
    int, float or bool. ``output_memory_type`` may name CPU memory only. ``response_queue``
    receives every response too, as it arrives (its ``put_nowait`` is called: a
    ``queue.SimpleQueue`` for ``infer``, an ``asyncio.Queue`` for ``async_infer``).
    """

    model: Model
    request_id: str | None = None
    flags: int = 0
    correlation_id: int | str | None = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Tensor | Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: DeviceOrMemoryType | None = None
    response_queue: queue.SimpleQueue[Any] | asyncio.Queue[Any] | None = None

    def _core(self) -> CoreRequest:
        """The server's request. Raises InvalidArgumentError for a field of the wrong type or
        value and for an input that cannot become a tensor, UnsupportedError for device memory."""
        version = self.model.version
        if isinstance(version, bool) or not isinstance(version, int) or version < -1:
            raise InvalidArgumentError(f"model version must be an integer, -1 for the server's choice (got {version!r})")
        if self.request_id is not None and not isinstance(self.request_id, str):
            raise InvalidArgumentError(f"request_id must be a str (got {type(self.request_id).__name__})")
        if not isinstance(self.inputs, dict):
            raise InvalidArgumentError(f"inputs must be a dict of input names to tensors (got {type(self.inputs).__name__})")
        if self.output_memory_type is not None:
            check_host(self.output_memory_type)
        inputs = []
        for name, value in self.inputs.items():
            if not isinstance(name, str):
                raise InvalidArgumentError(f"input names must be str (got {name!r})")
            inputs.append(_from_object(value)._core(name))
        return CoreRequest(self.model.name, inputs, "" if version == -1 else str(version), self.request_id or "",
                           parameters=self._parameters())

    def _parameters(self) -> dict[str, str | int | bool | float]:
        if not isinstance(self.parameters, dict):
            raise InvalidArgumentError(f"parameters must be a dict (got {type(self.parameters).__name__})")
        params: dict[str, str | int | bool | float] = {}
        for key, value in self.parameters.items():
            if not isinstance(key, str) or not isinstance(value, str | int | float | bool):
                raise InvalidArgumentError(f"Unsupported Value. Can't convert {type(value)} to Request Parameter "
                                           f"('{key}'): use str, int, float or bool")
            params[key] = value
        for name in ("flags", "priority", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"{name} must be a non-negative integer (got {value!r})")
        if self.flags & ~(_START | _END):
            raise InvalidArgumentError(f"flags {self.flags:#x}: only SEQUENCE_START (1) and SEQUENCE_END (2) exist")
        correlation = self.correlation_id
        if correlation is not None:
            if isinstance(correlation, bool) or not isinstance(correlation, int | str):
                raise InvalidArgumentError(f"correlation_id must be an int or a str (got {correlation!r})")
            params["sequence_id"] = correlation
        if self.flags & _START:
            params["sequence_start"] = True
        if self.flags & _END:
            params["sequence_end"] = True
        if self.priority:
            params["priority"] = self.priority
        if self.timeout:
            params["timeout"] = self.timeout
        return params
