"""The backend interface: how a model version becomes executable instances.

A backend is selected by ``backend:`` (or ``platform:``) in config.pbtxt. trident calls, for
each model version:

1. :meth:`Backend.auto_complete_config` (in a worker thread, unless auto-complete is
   disabled) to fill in what the model files know (inputs, outputs, max_batch_size...);
2. :meth:`Backend.load_instance` once per instance (in that instance's worker thread), which
   returns a :class:`ModelInstance`;
3. :meth:`ModelInstance.execute` with batches of requests (in the instance's worker thread);
4. :meth:`ModelInstance.finalize` when the version unloads (in a worker thread).

Execution contract: ``execute(requests)`` returns one :class:`InferenceResponse` per request in
the same order, or ``None`` when the model is decoupled and answers through
``request.responder`` (see :class:`Responder`) from any thread. An exception raised by
``execute`` fails every request of the batch with its message; a response with ``error`` set
fails only its request.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trident.protocol.generated.inference import ModelConfig
    from trident.types import InferenceRequest, InferenceResponse


@dataclass
class LoadContext:
    """Everything a backend needs to load one instance of one model version."""

    model_name: str
    version: int
    model_dir: Path  # <repository>/<model>
    version_dir: Path  # <repository>/<model>/<version>
    config: ModelConfig  # final (auto-completed, validated) config
    config_json: dict[str, Any]  # the same config in Triton's JSON shape
    instance_name: str = ""  # e.g. "add_sub_0"
    instance_kind: str = "KIND_CPU"  # KIND_CPU | KIND_GPU | KIND_MODEL
    device_id: int = 0
    backend_config: dict[str, str] = field(default_factory=dict)  # --backend-config=<backend>,k=v
    server: Any = None  # the trident Server (for BLS and model management from model code)

    @property
    def repository_path(self) -> Path:
        return self.model_dir.parent


class ModelInstance(abc.ABC):
    """One loaded instance of a model version; used from one worker thread at a time."""

    @abc.abstractmethod
    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse] | None:
        """Run a batch. See the module docstring for the contract. Blocking; runs in a thread."""

    def finalize(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the instance's resources. Blocking; runs in a worker thread."""

    def is_ready(self) -> bool:
        """Readiness probe for /v2/models/<m>/ready (default: ready once loaded)."""
        return True


class Backend(abc.ABC):
    """A backend implementation, registered by name (see :mod:`trident.backends`)."""

    #: the name used in ``backend:`` of config.pbtxt
    name: str = ""
    #: ``platform:`` values that select this backend
    platforms: tuple[str, ...] = ()
    #: the file or folder a version folder holds by default (``default_model_filename``)
    default_model_filename: str = ""

    def auto_complete_config(self, config: ModelConfig, model_dir: Path, version_dir: Path | None) -> ModelConfig:
        """Return ``config`` completed from the model files (default: unchanged). Blocking."""
        return config

    @abc.abstractmethod
    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        """Load one instance. Blocking; runs in a worker thread. Raise TritonError on failure."""

    def model_file(self, ctx: LoadContext) -> Path:
        """The version's model file: ``default_model_filename`` from config, else the backend's."""
        name = ctx.config.default_model_filename or self.default_model_filename
        return ctx.version_dir / name
