"""Triton's in-process Python API (the ``tritonserver`` package) over a trident server.

``import trident.tritonserver as tritonserver`` and Triton's documented examples run::

    server = tritonserver.Server(model_repository="/models").start(wait_until_ready=True)
    for response in server.model("identity").infer(inputs={"string_input": [["hello world!"]]}):
        print(response.outputs["string_output"].to_string_array())
    server.stop()

The server runs :func:`trident.open_server` on a trio event loop in a thread the
:class:`Server` owns (``start()`` starts it, ``stop()`` and interpreter exit stop it and join
it). Every call is safe from any thread: plain calls block the calling thread until the server
answers; ``Model.async_infer`` returns an async iterator whose responses reach the caller's
asyncio (or trio) loop without blocking it. Decoupled models stream their responses through the
same iterators, and cancelling an iterator cancels its request in the server. Tensors come in
and go out through DLPack: numpy arrays, and torch tensors on the CPU. Trio programs that want
no thread can keep using ``trident.open_server`` directly (the same server, in their own loop).
Where trident cannot do what Triton does, the call raises :class:`UnsupportedError` naming it.
"""

from __future__ import annotations

import trident
from trident.tritonserver._enums import (
    DataType,
    DLDeviceType,
    InstanceGroupKind,
    LogFormat,
    LogLevel,
    MemoryType,
    MetricFormat,
    MetricKind,
    ModelBatchFlag,
    ModelControlMode,
    ModelTxnPropertyFlag,
    RateLimitMode,
    RequestFlag,
)
from trident.tritonserver._errors import (
    AlreadyExistsError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnknownError,
    UnsupportedError,
)
from trident.tritonserver._model import Model
from trident.tritonserver._options import ModelLoadDeviceLimit, Options, RateLimiterResource
from trident.tritonserver._request import InferenceRequest
from trident.tritonserver._response import AsyncResponseIterator, InferenceResponse, ResponseIterator
from trident.tritonserver._server import Metric, MetricFamily, ModelDictionary, Server
from trident.tritonserver._tensor import MemoryBuffer, Tensor

__version__ = trident.__version__

__all__ = [
    "AlreadyExistsError",
    "AsyncResponseIterator",
    "DLDeviceType",
    "DataType",
    "InferenceRequest",
    "InferenceResponse",
    "InstanceGroupKind",
    "InternalError",
    "InvalidArgumentError",
    "LogFormat",
    "LogLevel",
    "MemoryBuffer",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "MetricFormat",
    "MetricKind",
    "Model",
    "ModelBatchFlag",
    "ModelControlMode",
    "ModelDictionary",
    "ModelLoadDeviceLimit",
    "ModelTxnPropertyFlag",
    "NotFoundError",
    "Options",
    "RateLimitMode",
    "RateLimiterResource",
    "RequestFlag",
    "ResponseIterator",
    "Server",
    "Tensor",
    "TritonError",
    "UnavailableError",
    "UnknownError",
    "UnsupportedError",
]
