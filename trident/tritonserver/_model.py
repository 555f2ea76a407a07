"""``tritonserver.Model``: one model (and version) of an in-process server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from trident.config import config_to_json
from trident.protocol import kserve
from trident.server import Server as CoreServer
from trident.tritonserver._enums import ModelBatchFlag, ModelTxnPropertyFlag
from trident.tritonserver._errors import InternalError, InvalidArgumentError, TritonError
from trident.tritonserver._request import InferenceRequest
from trident.tritonserver._response import AsyncResponseIterator, ResponseIterator, convert
from trident.tritonserver._stream import AsyncioExchange, Exchange, Failure, TrioExchange, request_job

if TYPE_CHECKING:
    from trident.tritonserver._server import Server


class Model:
    """A model of a started server (Triton's ``tritonserver.Model``): its metadata, config,
    readiness and statistics, and inference. ``version`` -1 lets the server choose (the
    highest ready version). Obtained from ``Server.model()`` / ``Server.models()``; the name is
    checked when the model is used. Safe to use from any thread."""

    def __init__(self, server: Server, name: str, version: int = -1, state: str | None = None,
                 reason: str | None = None) -> None:
        """Raises InvalidArgumentError when ``server`` is not started."""
        server._loop_or_raise()
        self._server = server
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def _sibling(self, name: str, version: int) -> Model:
        """The model ``name``/``version`` of the same server (a response's, without a check)."""
        model = Model.__new__(Model)
        model._server, model.name, model.version, model.state, model.reason = self._server, name, version, None, None
        return model

    @property
    def _version(self) -> str:
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < -1:
            raise InvalidArgumentError(f"model version must be an integer, -1 for the server's choice "
                                       f"(got {self.version!r})")
        return "" if self.version == -1 else str(self.version)

    def _call(self, fn: Callable[[CoreServer], Any]) -> Any:
        return self._server._call(fn)

    # ---- inference -------------------------------------------------------------------------

    def create_request(self, **kwargs: Any) -> InferenceRequest:
        """An :class:`InferenceRequest` for this model, with ``kwargs`` as its fields."""
        kwargs.pop("model", None)
        return InferenceRequest(model=self, **kwargs)

    def _request(self, inference_request: InferenceRequest | None, kwargs: dict[str, Any]) -> InferenceRequest:
        if inference_request is None:
            return InferenceRequest(model=self, **kwargs)
        if kwargs:
            raise InvalidArgumentError(f"give either an InferenceRequest or its fields, not both (got "
                                       f"{', '.join(sorted(kwargs))} with a request)")
        if not isinstance(inference_request, InferenceRequest):
            raise InvalidArgumentError(f"expected a tritonserver.InferenceRequest, got {type(inference_request).__name__}")
        return inference_request

    def infer(self, inference_request: InferenceRequest | None = None, raise_on_error: bool = True,
              **kwargs: Any) -> ResponseIterator:
        """Send a request (``inference_request``, or one made of ``kwargs``: ``inputs=...``) and
        return at once an iterator of its responses (see :class:`ResponseIterator`).

        Raises InvalidArgumentError for a request that cannot be built (a field of the wrong
        type, an input that is not a tensor) or a server that is not started, UnsupportedError
        for device memory. Errors the server finds (an unknown model, wrong input names, types or
        shapes) are raised by the iterator.
        """
        request = self._request(inference_request, kwargs)
        loop = self._server._loop_or_raise()
        core = request._core()
        iterator = ResponseIterator(request.model, request.request_id, raise_on_error, loop, request.response_queue)
        iterator._started(loop.submit(request_job(core, iterator._exchange), _failer(iterator._exchange)))
        return iterator

    def async_infer(self, inference_request: InferenceRequest | None = None, raise_on_error: bool = True,
                    **kwargs: Any) -> AsyncResponseIterator:
        """:meth:`infer` for a coroutine: returns at once an async iterator of the responses
        (``async for``), delivered to the calling asyncio (or trio) loop without blocking it.

        Raises what :meth:`infer` raises, and InvalidArgumentError outside a running event loop.
        """
        request = self._request(inference_request, kwargs)
        loop = self._server._loop_or_raise()
        core = request._core()
        model, request_id = request.model, request.request_id

        def to_response(item: Any) -> Any:
            return convert(model, request_id, item)

        exchange: AsyncioExchange | TrioExchange
        try:
            exchange = AsyncioExchange(asyncio.get_running_loop(), request.response_queue, to_response)
        except RuntimeError:
            try:
                token = trio.lowlevel.current_trio_token()
            except RuntimeError:
                raise InvalidArgumentError("async_infer() needs a running asyncio (or trio) event loop; "
                                           "from synchronous code use infer()") from None
            exchange = TrioExchange(token, request.response_queue, to_response)
        iterator = AsyncResponseIterator(model, request_id, raise_on_error, exchange)
        iterator._started(loop.submit(request_job(core, exchange), _failer(exchange)))
        return iterator

    # ---- metadata --------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """The model's KServe metadata: name, versions, platform, inputs, outputs. Raises
        NotFoundError / UnavailableError for a model that is not serving."""
        version = self._version
        meta: dict[str, Any] = self._call(lambda s: kserve.model_metadata_json(s.model_metadata(self.name, version)))
        return meta

    def ready(self) -> bool:
        """Whether the model (version) is ready for requests (False for an unknown one)."""
        version = self._version
        ready: bool = self._call(lambda s: s.model_ready(self.name, version))
        return ready

    def batch_properties(self) -> ModelBatchFlag:
        """FIRST_DIM when the model batches along its first dimension, else UNKNOWN."""
        version = self._version
        batches: bool = self._call(lambda s: s.model_config(self.name, version).max_batch_size > 0)
        return ModelBatchFlag.FIRST_DIM if batches else ModelBatchFlag.UNKNOWN

    def transaction_properties(self) -> ModelTxnPropertyFlag:
        """DECOUPLED for a decoupled model, else ONE_TO_ONE."""
        version = self._version

        def decoupled(s: CoreServer) -> bool:
            policy = s.model_config(self.name, version).model_transaction_policy
            return bool(policy is not None and policy.decoupled)

        return ModelTxnPropertyFlag.DECOUPLED if self._call(decoupled) else ModelTxnPropertyFlag.ONE_TO_ONE

    def statistics(self) -> dict[str, Any]:
        """The statistics extension's ``{"model_stats": [...]}`` for the model (version).
        Raises InvalidArgumentError for a model that is not serving."""
        version = self._version
        stats: dict[str, Any] = self._call(lambda s: kserve.statistics_json(s.model_statistics(self.name, version)))
        return stats

    def config(self, config_version: int = 1) -> dict[str, Any]:
        """The model's final configuration as JSON (Triton's form). Raises InvalidArgumentError
        for a ``config_version`` other than 1 (the only one), NotFoundError / UnavailableError
        for a model that is not serving."""
        if config_version != 1:
            raise InvalidArgumentError(f"model configuration version {config_version} is not supported: only 1")
        version = self._version
        config: dict[str, Any] = self._call(lambda s: config_to_json(s.model_config(self.name, version)))
        return config

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return str({"name": self.name, "version": self.version, "state": self.state})


def _failer(exchange: Exchange) -> Callable[[BaseException], None]:
    """What the loop calls when the request cannot run: the iterator ends with the error."""
    def fail(error: BaseException) -> None:
        exchange.put(Failure(error if isinstance(error, TritonError) else InternalError(str(error))))

    return fail
