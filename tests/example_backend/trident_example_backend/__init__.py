"""An example third-party trident backend: ``OUTPUT = INPUT * scale``.

Shows the custom backend API (:mod:`trident.backends.base`): auto-completing a config, loading
instances, executing batches, answering decoupled models through ``request.responder``, custom
metrics, readiness and unloading. Registered through the ``trident.backends`` entry point group
(see pyproject.toml); selected with ``backend: "example_scale"`` in config.pbtxt.

Parameters (config.pbtxt ``parameters``): ``scale`` (float, default 2), ``repeat`` (decoupled
models: responses per request, default 1).
"""

from __future__ import annotations

import threading
from pathlib import Path

from trident.backends.base import Backend, LoadContext, ModelInstance
from trident.backends.metrics import COUNTER, custom_metrics_for
from trident.errors import invalid_arg
from trident.protocol.generated.inference import DataType, ModelConfig, ModelInput, ModelOutput
from trident.types import InferenceRequest, InferenceResponse, Tensor


def _param(config: ModelConfig, key: str, default: str) -> str:
    param = config.parameters.get(key)
    return param.string_value if param is not None and param.string_value else default


class ScaleInstance(ModelInstance):
    def __init__(self, ctx: LoadContext) -> None:
        try:
            self.scale = float(_param(ctx.config, "scale", "2"))
            self.repeat = int(_param(ctx.config, "repeat", "1"))
        except ValueError as e:
            raise invalid_arg(f"model '{ctx.model_name}': bad parameter: {e}") from None
        policy = ctx.config.model_transaction_policy
        self.decoupled = bool(policy and policy.decoupled)
        self.input = ctx.config.input[0].name
        self.output = ctx.config.output[0].name
        metrics = custom_metrics_for(ctx.server)
        self._family = metrics.acquire_family("example_scale_requests", "Requests the example backend ran",
                                              COUNTER)
        self._series = self._family.acquire_series({"model": ctx.model_name, "instance": ctx.instance_name})
        self._metrics = metrics
        self.finalized = False

    def _scaled(self, request: InferenceRequest) -> Tensor:
        x = request.input(self.input)
        assert x is not None
        y = (x.data * self.scale).astype(x.data.dtype)
        return Tensor(self.output, x.datatype, tuple(y.shape), y)

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse] | None:
        self._series.increment(len(requests))
        if not self.decoupled:
            return [InferenceResponse(outputs=[self._scaled(r)]) for r in requests]
        for request in requests:  # answer from another thread, as decoupled backends may
            threading.Thread(target=self._stream, args=(request,), daemon=True).start()
        return None

    def _stream(self, request: InferenceRequest) -> None:
        responder = request.responder
        for i in range(self.repeat):
            if responder.is_cancelled():
                break
            responder.send(InferenceResponse(outputs=[self._scaled(request)], parameters={"index": i}), final=False)
        responder.send(None, final=True)

    def is_ready(self) -> bool:
        return not self.finalized

    def finalize(self) -> None:
        self.finalized = True
        self._family.release_series(self._series)
        self._metrics.release_family(self._family)


class ScaleBackend(Backend):
    name = "example_scale"

    def auto_complete_config(self, config: ModelConfig, model_dir: Path, version_dir: Path | None) -> ModelConfig:
        """A config with no inputs gets INPUT / OUTPUT, FP32 [-1]."""
        if not config.input:
            config.input = [ModelInput(name="INPUT", data_type=DataType.TYPE_FP32, dims=[-1])]
        if not config.output:
            config.output = [ModelOutput(name="OUTPUT", data_type=DataType.TYPE_FP32, dims=[-1])]
        return config

    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        return ScaleInstance(ctx)
