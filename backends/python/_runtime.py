"""The in-process ``pb_utils`` runtime: BLS, model management and metrics over the trident Server.

Model code runs in worker threads; every call here crosses into the server's trio loop with
``trio.from_thread`` and the server's trio token (so threads the model starts itself work too).
A BLS request goes through ``Server.infer`` / ``Server.infer_stream``, i.e. through the callee's
scheduler, exactly like a request from a front end.

Tracing: a BLS request continues the trace of the request it is made for (:func:`bls_trace`),
so it is traced as that request's child (an OpenTelemetry span under its span).

Cancellation: a BLS call runs under its own cancel scope. ``ResponseIterator.cancel()`` cancels
it, and so does the cancellation of every parent request (the batch ``execute`` was running
when the call was made), delivered by the parents' ``on_cancel``. Cancelling the scope cancels
the callee's request, as a client disconnect does.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio

from trident.backends.base import PlainThreads, Threads
from trident.backends.metrics import custom_metrics_for
from trident.backends.python import _convert, pb_utils
from trident.errors import Code, TritonError
from trident.types import InferenceRequest, InferenceResponse

_END = object()


def bls_trace(parents: Sequence[Any], explicit: Any = None) -> Any:
    """What a BLS request's ``trace`` is (see trident.observability.tracing): the trace of the
    request named with ``trace=request.trace()`` (``explicit``), else of the one traced request
    among ``parents`` (the batch ``execute`` runs; a request without a trace of its own gives
    the client's W3C context it came with). None when no request of the batch has one, or when
    several have different ones and the model named none."""
    if explicit is not None:
        return getattr(explicit, "trace", None)
    found = None
    for parent in parents:
        trace = getattr(parent, "trace", None)
        if trace is not None:
            if found is not None and trace is not found:
                return None
            found = trace
    return found


def current_token() -> trio.lowlevel.TrioToken | None:
    """The trio token of the run this worker thread belongs to (None outside trio's threads)."""
    try:
        return trio.from_thread.run_sync(trio.lowlevel.current_trio_token)
    except RuntimeError:
        return None


class BlsCall:
    """One BLS request in flight; iterate it for the callee's ``pb_utils`` responses.

    ``decoupled=False`` runs the request in the calling thread (blocking) and yields one
    response. ``decoupled=True`` runs it from a helper thread and yields responses as they
    arrive, ending after the final one. Failures (unknown model, bad request, the callee's
    error, cancellation) arrive as error responses, never as exceptions.
    """

    def __init__(self, server: Any, token: trio.lowlevel.TrioToken, request: InferenceRequest,
                 decoupled: bool, parents: Sequence[Any],
                 convert: Callable[[InferenceResponse], Any] = _convert.to_pb_response,
                 threads: Threads | None = None) -> None:
        self._server = server
        self._threads = threads if threads is not None else PlainThreads()  # owns a decoupled call's thread
        self._convert = convert
        self._token = token
        self._request = request
        self._decoupled = decoupled
        self._parents = [p for p in parents if hasattr(p, "on_cancel")]
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._scope: trio.CancelScope | None = None
        self._cancel_requested = False
        self._final_seen = False
        self._finished = False

    # ---- driving ----

    def start(self) -> BlsCall:
        if self._decoupled:
            try:
                self._threads.start(self._thread_main, name="trident-bls")
            except RuntimeError as e:  # the model version is unloading
                self._put_error(Code.UNAVAILABLE, str(e))
                self._queue.put(_END)
        else:
            self._thread_main()
        return self

    def _thread_main(self) -> None:
        try:
            trio.from_thread.run(self._run, trio_token=self._token)
        except trio.RunFinishedError:
            self._put_error(Code.UNAVAILABLE, "the server is shutting down")
        except BaseException as e:  # never leave the consumer waiting
            self._put_error(Code.INTERNAL, f"BLS request failed: {type(e).__name__}: {e}")
        finally:
            self._queue.put(_END)

    async def _run(self) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._cancel_requested:
                scope.cancel()
            token = self._token
            parents = self._parents

            def parent_cancelled() -> None:  # on the thread that cancels a parent
                if all(p.cancelled for p in parents):
                    with contextlib.suppress(trio.RunFinishedError):
                        token.run_sync_soon(scope.cancel)

            for parent in parents:
                parent.on_cancel(parent_cancelled)
            try:
                if self._decoupled:
                    await self._server.infer_stream(self._request, self._send)
                else:
                    response = await self._server.infer(
                        self._request, endpoint="BLS exec() (use exec(decoupled=True))"
                    )
                    self._send_nowait(response)
            except TritonError as e:
                self._put_error(e.code, e.message)
        if scope.cancelled_caught and not self._final_seen:
            self._put_error(Code.CANCELLED, f"BLS request to model '{self._request.model_name}' was cancelled")

    async def _send(self, response: InferenceResponse) -> None:
        self._send_nowait(response)

    def _send_nowait(self, response: InferenceResponse) -> None:
        if self._final_seen:
            return
        self._final_seen = response.final
        self._queue.put(response)

    def _put_error(self, code: Code, message: str) -> None:
        if not self._final_seen:
            self._final_seen = True
            self._queue.put(InferenceResponse(model_name=self._request.model_name, error=TritonError(code, message)))

    # ---- consuming ----

    def __iter__(self) -> BlsCall:
        return self

    def __next__(self) -> Any:
        """The next response (a ``pb_utils.InferenceResponse`` unless another ``convert`` was given)."""
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._finished = True
            raise StopIteration
        return self._convert(item)

    def cancel(self) -> None:
        """Cancel the request (no-op once it has finished)."""
        def cancel_in_trio() -> None:
            self._cancel_requested = True
            if self._scope is not None:
                self._scope.cancel()

        try:
            trio.from_thread.run_sync(cancel_in_trio, trio_token=self._token)
        except (trio.RunFinishedError, RuntimeError):
            pass


class InProcessRuntime(pb_utils._Runtime):
    """``pb_utils``' server side for models running in this process."""

    def __init__(self, server: Any, token: trio.lowlevel.TrioToken, threads: Threads | None = None) -> None:
        self.server = server
        self.token = token
        self.threads = threads

    def _crossing(self) -> str | None:
        """Count a call into the server; the reason it cannot run when made on the loop's thread."""
        self.server_calls += 1
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            return None  # a worker thread, as it should be
        return ("BLS and model control calls cannot be made while the model executes inline on the event "
                "loop; this instance runs on its thread from now on (parameter TRIDENT_INLINE_EXECUTION: "
                "never avoids this)")

    def bls(self, request: pb_utils.InferenceRequest, decoupled: bool,
            parents: Sequence[Any]) -> Iterator[pb_utils.InferenceResponse]:
        refused = self._crossing()
        if refused is not None:
            return iter([_convert.error_response(Code.UNAVAILABLE, refused)])
        try:
            converted = _convert.to_request(request)
        except TritonError as e:
            return iter([_convert.error_response(e.code, e.message)])
        converted.trace = bls_trace(parents, getattr(request.trace(), "_source", None))
        return BlsCall(self.server, self.token, converted, decoupled, parents, threads=self.threads).start()

    def _call(self, fn: Any, *args: Any) -> Any:
        refused = self._crossing()
        if refused is not None:
            raise pb_utils.TritonModelException(refused)
        try:
            return trio.from_thread.run(fn, *args, trio_token=self.token)
        except TritonError as e:
            raise pb_utils.TritonModelException(e.message) from None
        except trio.RunFinishedError:
            raise pb_utils.TritonModelException("the server is shutting down") from None

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        self._call(self.server.load_model, model_name, config or None, files)

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        self._call(self.server.unload_model, model_name, unload_dependents)

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        async def ready() -> bool:
            return bool(self.server.model_ready(model_name, model_version))

        return bool(self._call(ready))

    def metrics(self) -> Any:
        return custom_metrics_for(self.server)
