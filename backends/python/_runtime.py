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

GPU tensors: a BLS request with GPU inputs, or one that prefers GPU memory for its outputs,
asks first whether its callee takes device tensors (:func:`device_refusal`: a Python model of
this process with ``FORCE_CPU_ONLY_INPUT_TENSORS`` "no", and nothing on the way that reads the
values: no response cache, batch inputs, TENSORS traces or other workers). If it does, the GPU
inputs reach it as the same device memory and its GPU outputs come back the same way (no host
copy either way); if not, the GPU inputs are copied to the host first (in a worker thread).
"""

from __future__ import annotations

import contextlib
import functools
import math
import queue
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import trio

from trident.backends.base import ModelHost, PlainThreads, Threads
from trident.backends.metrics import custom_metrics_for
from trident.backends.python import _convert, pb_utils
from trident.backends.python._dlpack import DeviceView
from trident.backends.python._execution import FORCE_CPU_ONLY, execution_options
from trident.backends.python._pb_tensor import DeviceTensor
from trident.errors import Code, TritonError
from trident.types import InferenceRequest, InferenceResponse

_END = object()


#: the status of a BLS request whose inherited deadline passes: Triton's queue timeout's, as the
#: server answers a request whose own ``timeout`` runs out (trident.server.deadlines)
TIMEOUT_EXPIRED = "Request timeout expired"


def inherited_deadline(parents: Sequence[Any]) -> float | None:
    """The deadline a BLS request inherits from ``parents`` (the requests of the running batch):
    the latest of theirs, as it serves each of them; None when one of them has none (README
    "Deadlines")."""
    latest = None
    for parent in parents:
        deadline = parent.deadline
        if deadline is None:
            return None
        if latest is None or deadline > latest:
            latest = deadline
    return latest


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


def device_refusal(server: ModelHost, request: InferenceRequest, python_defaults: dict[str, str] | None) -> str | None:
    """Why the callee of BLS ``request`` cannot take device tensors as they are, or None when it
    can: a Python model loaded in this process (thread mode) with FORCE_CPU_ONLY_INPUT_TENSORS
    "no", without a response cache or batch inputs (they read the values), not traced with
    TENSORS, in a server of one process. Anything unknown (a facade without these calls, an
    unknown model: its request fails on its own) is a refusal, so the tensors go to the host.
    Runs on the server's trio loop (reads its state)."""
    if getattr(server, "cluster", None) is not None:  # a facade without it: one process
        return "the server runs several workers"
    try:
        config = server.model_config(request.model_name, request.model_version)
    except (TritonError, AttributeError):
        return f"model '{request.model_name}' is unknown here"
    if config.backend != "python":
        return f"model '{request.model_name}' is not a Python model"
    param = config.parameters.get(FORCE_CPU_ONLY)
    if param is None or param.string_value.strip() != "no":
        return f"model '{request.model_name}' takes CPU tensors only ({FORCE_CPU_ONLY} is not \"no\")"
    try:
        mode = execution_options(config, python_defaults).mode
    except TritonError:
        mode = "unknown"
    if mode != "thread":
        return f"model '{request.model_name}' runs in a process of its own"
    if config.response_cache is not None and config.response_cache.enable:
        return f"model '{request.model_name}' has a response cache"
    if config.batch_input:
        return f"model '{request.model_name}' has batch inputs"
    if getattr(request.trace, "tensors", False):
        return "the request is traced with TENSORS"
    try:
        levels = server.trace_settings(request.model_name).get("trace_level", ())
    except (TritonError, AttributeError):
        levels = ()
    if "TENSORS" in levels:
        return f"model '{request.model_name}' is traced with TENSORS"
    return None


class BlsCall:
    """One BLS request in flight; iterate it for the callee's ``pb_utils`` responses.

    ``decoupled=False`` runs the request in the calling thread (blocking) and yields one
    response. ``decoupled=True`` runs it from a helper thread and yields responses as they
    arrive, ending after the final one. Failures (unknown model, bad request, the callee's
    error, cancellation) arrive as error responses, never as exceptions.

    ``device``: the request carries device tensors (DeviceViews) or may take device outputs
    back (``device_outputs``); see the module docstring. ``python_defaults`` is the Python
    backend's ``--backend-config`` (the callee's execution mode).
    """

    def __init__(self, server: ModelHost, token: trio.lowlevel.TrioToken, request: InferenceRequest,
                 decoupled: bool, parents: Sequence[Any],
                 convert: Callable[[InferenceResponse], Any] = _convert.to_pb_response,
                 threads: Threads | None = None, *, device: bool = False, device_outputs: bool = False,
                 python_defaults: dict[str, str] | None = None) -> None:
        self._device = device
        self._device_outputs = device_outputs
        self._python_defaults = python_defaults
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
        # the deadline it inherited from its parents: nothing of it starts after, and it is
        # answered "Request timeout expired" then (its own timeout parameter: the server's doing)
        deadline = self._request.deadline
        if deadline is not None and trio.current_time() >= deadline:
            self._put_error(Code.UNAVAILABLE, TIMEOUT_EXPIRED)
            return
        with trio.CancelScope(deadline=math.inf if deadline is None else deadline) as scope:
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
                if self._device:
                    await self._place_device_tensors()
                if self._decoupled:
                    await self._server.infer_stream(self._request, self._send)
                else:
                    response = await self._server.infer(
                        self._request, endpoint="BLS exec() (use exec(decoupled=True))"
                    )
                    self._send_nowait(response)
            except TritonError as e:
                self._put_error(e.code, e.message)
            finally:
                _convert.DEVICE_OUTPUT_REQUESTS.discard(id(self._request))
        if scope.cancelled_caught and not self._final_seen:
            if deadline is not None and trio.current_time() >= deadline:
                self._put_error(Code.UNAVAILABLE, TIMEOUT_EXPIRED)
            else:
                self._put_error(Code.CANCELLED, f"BLS request to model '{self._request.model_name}' was cancelled")

    async def _place_device_tensors(self) -> None:
        """Where the callee takes device tensors: let its device outputs come back on the device
        (when asked). Where it does not: copy the request's device inputs to the host, in a
        worker thread. Raises TritonError(INTERNAL) when a copy is impossible."""
        request = self._request
        refusal = device_refusal(self._server, request, self._python_defaults)
        if refusal is None:
            if self._device_outputs:
                _convert.DEVICE_OUTPUT_REQUESTS.add(id(request))
            return
        if any(type(t.data) is DeviceView for t in request.inputs):
            try:
                request.inputs = await trio.to_thread.run_sync(_convert.host_tensors, request.inputs)
            except pb_utils.TritonModelException as e:
                raise TritonError(Code.INTERNAL, f"BLS request to '{request.model_name}' ({refusal}): {e}") from None

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

    def __init__(self, server: ModelHost, token: trio.lowlevel.TrioToken, threads: Threads | None = None,
                 python_defaults: dict[str, str] | None = None) -> None:
        self.server = server
        self.token = token
        self.threads = threads
        self.python_defaults = python_defaults  # the Python backend's --backend-config

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
        memory = request._preferred_memory
        device_inputs = any(type(t) is DeviceTensor for t in request.inputs())
        try:
            converted = _convert.to_request(request, keep_device=device_inputs)
        except TritonError as e:
            return iter([_convert.error_response(e.code, e.message)])
        converted.trace = bls_trace(parents, getattr(request.trace(), "_source", None))
        converted.deadline = inherited_deadline(parents)  # the server takes the earlier of it and its timeout
        if not device_inputs and memory is None:  # the usual call: CPU tensors, outputs as produced
            return BlsCall(self.server, self.token, converted, decoupled, parents, threads=self.threads).start()
        gpu_outputs = memory is None or memory.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_GPU
        return BlsCall(self.server, self.token, converted, decoupled, parents,
                       functools.partial(_convert.to_pb_response, memory=memory), self.threads,
                       device=True, device_outputs=gpu_outputs, python_defaults=self.python_defaults).start()

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
