"""``tritonserver.InferenceResponse`` and the iterators ``Model.infer`` / ``Model.async_infer``
return.

An iterator yields a request's responses in order, the last with ``final`` set. Errors the
model or the server report end the iteration: raised (``raise_on_error=True``, the default)
or in the final response's ``error``; a request the server refuses outright (an unknown model,
one not ready) is raised either way, as Triton raises it from ``infer()``. Cancelling the
request — ``cancel()``, ``close()`` / ``aclose()``, leaving a ``with`` block, breaking out of a
``for`` loop over a temporary iterator (it is then garbage collected), or cancelling the task
that awaits the next response — cancels it in the server: a queued request is dropped, a running
model sees ``is_cancelled()``, a decoupled model's sender is told; a further ``next()`` gives
the final response, an UnknownError "Request was cancelled" (Triton's CANCELLED).

One iterator is for one consumer at a time; different iterators may be used from different
threads at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trident.tritonserver._enums import DataType
from trident.tritonserver._errors import TritonError, from_core
from trident.tritonserver._stream import AsyncioExchange, Failure, Item, ThreadExchange, TrioExchange
from trident.tritonserver._tensor import Tensor
from trident.types import InferenceResponse as CoreResponse

if TYPE_CHECKING:
    from trident.tritonserver._loop import Call, ServerLoop
    from trident.tritonserver._model import Model


@dataclass
class InferenceResponse:
    """One response of a request (Triton's ``tritonserver.InferenceResponse``): ``outputs`` by
    name, ``parameters``, the ``error`` if it carries one, and ``final`` for the last one.
    ``classification_label`` is always None (Triton's package does not fill it either)."""

    model: Model
    request_id: str | None = None
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: TritonError | None = None
    classification_label: str | None = None
    final: bool = False


def convert(model: Model, request_id: str | None, item: Item) -> InferenceResponse:
    """The API's response for what the loop delivered (a Failure: a final response carrying
    its error)."""
    if isinstance(item, Failure):
        return InferenceResponse(model, request_id, error=item.error, final=True)
    return _response(model, item)


def _response(model: Model, core: CoreResponse) -> InferenceResponse:
    version = int(core.model_version) if core.model_version.isdigit() else model.version
    owner = model if version == model.version and core.model_name == model.name else \
        model._sibling(core.model_name or model.name, version)
    outputs = {t.name: Tensor._wrap(DataType[t.datatype], t.data) for t in core.outputs}
    error = None if core.error is None else from_core(core.error)
    return InferenceResponse(owner, core.id or None, dict(core.parameters), outputs, error, None, core.final)


class _Iterator:
    """What both iterators share: the request's call on the loop and the turning of delivered
    items into responses."""

    def __init__(self, model: Model, request_id: str | None, raise_on_error: bool) -> None:
        self._model = model
        self._request_id = request_id
        self._raise_on_error = raise_on_error
        self._complete = False
        self._call: Call | None = None

    def _started(self, call: Call) -> None:
        self._call = call

    def _take(self, item: Item) -> Any:
        self._complete = self._complete or isinstance(item, Failure) or item.final
        if isinstance(item, Failure):
            if item.rejected or self._raise_on_error:
                raise item.error
            return InferenceResponse(self._model, self._request_id, error=item.error, final=True)
        response = _response(self._model, item)
        if response.error is not None and self._raise_on_error:
            raise response.error
        return response

    def cancel(self) -> None:
        """Cancel the request in the server, best effort (it may have finished). Iterating on
        gives what is left: the final response, with the cancellation's error unless the
        request ended first."""
        if self._call is not None and not self._complete:
            self._exchange.cancelled = True
            self._call.cancel()

    _exchange: Any

    def __del__(self) -> None:
        # dropped before its final response (a `break` out of a loop over it): cancel it
        try:
            if not self._complete and self._call is not None:
                self.cancel()
        except Exception:  # never raise from a finalizer
            pass


class ResponseIterator(_Iterator):
    """The responses of ``Model.infer``: ``for response in responses`` blocks the thread until
    each arrives. ``close()`` (or leaving ``with responses:``) cancels what is still running."""

    def __init__(self, model: Model, request_id: str | None, raise_on_error: bool, loop: ServerLoop,
                 user_queue: Any) -> None:
        super().__init__(model, request_id, raise_on_error)
        self._loop = loop
        self._exchange = ThreadExchange(user_queue, lambda item: convert(model, request_id, item))

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        """The next response. Raises StopIteration after the final one, its error (see the
        module docstring), InvalidArgumentError on the server's own thread."""
        if self._complete:
            raise StopIteration
        self._loop.check_blocking()
        response: InferenceResponse = self._take(self._exchange.get())
        return response

    def close(self) -> None:
        """Cancel the request if it has not finished, and end the iteration."""
        self.cancel()
        self._complete = True

    def __enter__(self) -> ResponseIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncResponseIterator(_Iterator):
    """The responses of ``Model.async_infer``: ``async for response in responses`` awaits each
    without blocking the caller's event loop (asyncio, or trio). Cancelling the awaiting task
    cancels the request; so do ``aclose()`` and leaving ``async with responses:``."""

    def __init__(self, model: Model, request_id: str | None, raise_on_error: bool,
                 exchange: AsyncioExchange | TrioExchange) -> None:
        super().__init__(model, request_id, raise_on_error)
        self._exchange = exchange

    def __aiter__(self) -> AsyncResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        """The next response. Raises StopAsyncIteration after the final one, its error (see the
        module docstring); cancellation of the awaiting task cancels the request."""
        if self._complete:
            raise StopAsyncIteration
        try:
            item = await self._exchange.get()
        except BaseException:  # the awaiting task was cancelled (asyncio or trio)
            self.cancel()
            raise
        response: InferenceResponse = self._take(item)
        return response

    async def aclose(self) -> None:
        """Cancel the request if it has not finished, and end the iteration."""
        self.cancel()
        self._complete = True

    async def __aenter__(self) -> AsyncResponseIterator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
