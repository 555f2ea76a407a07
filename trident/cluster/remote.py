"""The stand-in for a model placed on another worker (:mod:`trident.cluster.placement`).

A worker that does not serve a placed model still has it in its repository, with the config the
placed worker loaded, so that metadata, config, readiness and the repository index answer alike
everywhere; its model versions are loaded with a :class:`RemoteBackend`, whose instances hold
nothing, and route every request to the placed worker (trident.cluster.link.WorkerLink.route_for).
An instance that is asked to execute anyway (it never should be) fails the batch with UNAVAILABLE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trident.backends.base import Backend, LoadContext, ModelInstance
from trident.errors import unavailable

if TYPE_CHECKING:
    from trident.types import InferenceRequest, InferenceResponse


class RemoteInstance(ModelInstance):
    def __init__(self, model: str, owner: int) -> None:
        self.model = model
        self.owner = owner

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse] | None:
        raise unavailable(f"model '{self.model}' is served by worker {self.owner}: its requests go there")


class RemoteBackend(Backend):
    """Loads a model placed on worker ``owner`` (its ``name`` is the real backend's)."""

    #: no warm-up, no files: the placed worker does that (ModelVersion reads it)
    remote = True

    def __init__(self, name: str, owner: int) -> None:
        self.name = name
        self.owner = owner

    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        return RemoteInstance(ctx.model_name, self.owner)
