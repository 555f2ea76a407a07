"""Request tracing: sampling by the trace settings and Triton's trace JSON file (or OpenTelemetry).

:class:`Tracer` reads the live :class:`~trident.observability.trace.TraceSettings` (global and per model).
``trace_rate`` N traces every N-th request of a model (models without their own settings share
the global counter), ``trace_count`` limits how many traces are collected (-1: no limit),
``trace_level`` TIMESTAMPS records REQUEST_START, QUEUE_START, COMPUTE_START,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END and REQUEST_END (monotonic ns), TENSORS
adds the input (TENSOR_QUEUE_INPUT) and output (TENSOR_BACKEND_OUTPUT) tensors.

Triton mode writes Triton's trace JSON to ``trace_file``: a JSON array holding, per trace,
``{"id", "model_name", "model_version", "request_id", "parent_id"}``, then
``{"id", "timestamps": [{"name", "ns"}, ...]}``, then one ``{"id", "activity", "tensor"}`` per
tensor. With ``log_frequency`` N > 0 every N traces go to ``<trace_file>.<k>`` (k = 0, 1, ...);
with 0 the traces are written to ``trace_file`` when the settings change, when ``trace_count``
runs out and when the server stops (:meth:`Tracer.close`).

OpenTelemetry mode (``--trace-config mode=opentelemetry``, ``opentelemetry,url=...``) exports
one span per traced request (timestamps as span events) through OTLP/HTTP and a batch span
processor (``opentelemetry,bsp_max_queue_size`` / ``bsp_schedule_delay`` /
``bsp_max_export_batch_size``); it needs the ``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http`` packages, checked at startup.

Trace context. ``request.trace`` holds, before sampling, what the request's trace continues:
the :class:`~.trace.TraceParent` a client sent (``traceparent`` header or metadata), or the
:class:`RequestTrace` of the request it was made for (an ensemble step's ensemble request, a
BLS call's caller); :meth:`Tracer.sample` puts the request's own :class:`RequestTrace` there
when it is traced (so its steps and BLS calls become its children). In OpenTelemetry mode a
request with a client's context is always traced (as Triton, whatever the rate and count),
its span a child of the client's span in the client's trace; the children's spans are
children of its span. In Triton mode the client's context does not change sampling; a traced
request records it in its trace JSON (``"traceparent"``, ``"tracestate"``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trident.observability.trace import BSP_ARGUMENTS, TraceParent, TraceSettings
from trident.observability.trace import parse_trace_config as parse_trace_config  # re-exported

if TYPE_CHECKING:
    from trident.types import InferenceRequest, InferenceResponse, Tensor


class Traced(Protocol):
    """What a trace needs of a finished request (trident.server.execution.Pending)."""

    request: InferenceRequest
    enqueued_ns: int
    exec_ns: tuple[int, int, int, int] | None


log = logging.getLogger("trident.tracing")

@dataclass
class RequestTrace:
    """One sampled request."""

    id: int
    model_name: str
    model_version: int
    request_id: str
    tensors: bool
    state: _State
    inputs: list[dict[str, Any]] = field(default_factory=list)
    parent_id: int = 0  # the ensemble request's trace, for a request of one of its steps
    #: the client's W3C context the request came with (not a child's: it has a parent_id)
    context: TraceParent | None = None
    #: the W3C trace id (32 hex digits) the request is part of, "" when it has none (Triton
    #: mode without a client context): what its log lines name
    trace_id: str = ""
    span: Any = None  # OpenTelemetry mode: the request's span, ended by Tracer.record

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` of this request's span (OpenTelemetry mode), else of the
        client's context it continues, else None."""
        if self.span is not None:
            ctx = self.span.get_span_context()
            return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
        return self.context.traceparent() if self.context is not None else None


@dataclass
class _State:
    """Counters and buffered traces of one trace-settings owner (a model, or the global ones)."""

    mode: str
    levels: frozenset[str]
    rate: int
    remaining: int
    log_frequency: int
    file: str
    seen: int = 0
    outstanding: int = 0
    index: int = 0
    retired: bool = False
    buffer: list[str] = field(default_factory=list)  # one item per trace: its entries as JSON text, comma-joined


def _tensor_entry(trace_id: int, activity: str, tensor: Tensor) -> dict[str, Any]:
    data = np.asarray(tensor.data).reshape(-1)
    if data.dtype == object:
        items = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in data]
    else:
        items = [str(x) for x in data.tolist()]
    return {"id": trace_id, "activity": activity,
            "tensor": {"name": tensor.name, "data": ",".join(items),
                       "shape": ",".join(str(d) for d in tensor.shape), "dtype": tensor.datatype}}


class Tracer:
    """Samples requests by the live trace settings and writes or exports the traces."""

    def __init__(self, settings: TraceSettings, otel: dict[str, str] | None = None) -> None:
        self.settings = settings
        self._otel_settings = otel or {}
        self._otel: Any = None
        self._generation = -1
        self._quiet = -2  # a settings generation under which no request is sampled (no model settings, global off)
        self._states: dict[str, _State] = {}  # owner ("" = global) -> state
        self._retired: list[_State] = []
        self._next_id = 1
        self._files: dict[str, list[str]] = {}  # trace_file (log_frequency 0) -> the traces written (JSON text)
        self.written = 0  # traces written or exported

    # ---- sampling ------------------------------------------------------------------------

    def _state(self, model: str) -> _State:
        if self._generation != self.settings.generation:
            self._retire_all()
            self._generation = self.settings.generation
        owner = model if model in self.settings.model_settings else ""
        state = self._states.get(owner)
        if state is None:
            s = self.settings.get(owner)
            state = self._states[owner] = _State(
                mode=s["trace_mode"], levels=frozenset(s["trace_level"]) - {"OFF"}, rate=int(s["trace_rate"]),
                remaining=int(s["trace_count"]), log_frequency=int(s["log_frequency"]), file=s["trace_file"])
        return state

    def sample(self, model: str, version: int, request: Any) -> RequestTrace | None:
        """A RequestTrace when this request is to be traced, else None; a traced request gets
        it as ``request.trace``.

        A request of an ensemble step whose ensemble request is traced (``request.trace`` a
        RequestTrace), or a BLS call of a traced request, is always traced, as a child of that
        trace (Triton's child traces), under the parent's settings. A request with a client's
        W3C context (``request.trace`` a TraceParent) is always traced in OpenTelemetry mode
        (unless the level is OFF) and sampled as any other in Triton mode.
        """
        parent = getattr(request, "trace", None)
        if parent is not None:
            return self._sample_with(model, version, request, parent)
        generation = self.settings.generation
        if generation == self._quiet:
            return None
        state = self._state(model)
        if not state.levels or state.remaining == 0 or (state.mode == "triton" and not state.file):
            if not self.settings.model_settings:  # every model has the global state: none samples until a change
                self._quiet = generation
            return None
        return self._sample_by_rate(model, version, request, state, None)

    def _sample_by_rate(self, model: str, version: int, request: Any, state: _State,
                        context: TraceParent | None) -> RequestTrace | None:
        state.seen += 1
        if state.rate <= 0 or state.seen % state.rate:
            return None
        if state.remaining > 0:
            state.remaining -= 1
        return self._new(model, version, request, state, "TENSORS" in state.levels, context=context)

    def _sample_with(self, model: str, version: int, request: Any, parent: Any) -> RequestTrace | None:
        if isinstance(parent, RequestTrace):
            return self._new(model, version, request, parent.state, parent.tensors, parent=parent)
        if not isinstance(parent, TraceParent):
            return None
        state = self._state(model)
        if not state.levels:
            return None
        if state.mode == "opentelemetry":  # a propagated context is always traced (Triton)
            return self._new(model, version, request, state, "TENSORS" in state.levels, context=parent)
        if state.remaining == 0 or not state.file:
            return None
        return self._sample_by_rate(model, version, request, state, parent)

    def _new(self, model: str, version: int, request: Any, state: _State, tensors: bool, *,
             parent: RequestTrace | None = None, context: TraceParent | None = None) -> RequestTrace:
        trace = RequestTrace(self._next_id, model, version, str(getattr(request, "id", "") or ""), tensors, state)
        self._next_id += 1
        if parent is not None:
            trace.parent_id = parent.id
            trace.trace_id = parent.trace_id
        elif context is not None:
            trace.context = context
            trace.trace_id = context.trace_id
        state.outstanding += 1
        if trace.tensors:
            trace.inputs = [_tensor_entry(trace.id, "TENSOR_QUEUE_INPUT", t) for t in request.inputs]
        if state.mode == "opentelemetry":
            if self._otel is None:
                self._otel = _OtelExporter(self._otel_settings)
            self._otel.start(trace, parent, context, getattr(request, "arrival_ns", 0) or time.monotonic_ns())
        request.trace = trace
        return trace

    # ---- completion ----------------------------------------------------------------------

    def complete(self, trace: RequestTrace, pending: Traced, response: InferenceResponse | None) -> None:
        """The traced request ended (answered, failed or cancelled): record its timestamps."""
        end = time.monotonic_ns()
        stamps = [("REQUEST_START", pending.request.arrival_ns), ("QUEUE_START", pending.enqueued_ns)]
        if pending.exec_ns is not None:
            start, infer_start, infer_end, done = pending.exec_ns
            stamps += [("COMPUTE_START", start), ("COMPUTE_INPUT_END", infer_start),
                       ("COMPUTE_OUTPUT_START", infer_end), ("COMPUTE_END", done)]
        stamps.append(("REQUEST_END", end))
        self.record(trace, stamps, response)

    def record(self, trace: RequestTrace, stamps: list[tuple[str, int]], response: InferenceResponse | None) -> None:
        """Write (or export) ``trace`` with its (activity, monotonic ns) timestamps."""
        head: dict[str, Any] = {"id": trace.id, "model_name": trace.model_name, "model_version": trace.model_version,
                                "request_id": trace.request_id, "parent_id": trace.parent_id}
        if trace.context is not None:  # the client's W3C context, as it continues it
            head["traceparent"] = trace.context.traceparent()
            if trace.context.tracestate:
                head["tracestate"] = trace.context.tracestate
        entries: list[dict[str, Any]] = [
            head, {"id": trace.id, "timestamps": [{"name": n, "ns": ns} for n, ns in stamps]}]
        if trace.tensors:
            entries += trace.inputs
            if response is not None and response.error is None:
                entries += [_tensor_entry(trace.id, "TENSOR_BACKEND_OUTPUT", t) for t in response.outputs]
        state = trace.state
        state.outstanding -= 1
        if state.mode == "opentelemetry":
            self._export_span(trace, stamps)
            return
        # kept as JSON text, not as dicts: a long buffer of containers would be walked by every
        # full garbage collection (tracing every request: p99 28 ms at 8 connections)
        state.buffer.append(json.dumps(entries, separators=(",", ":"))[1:-1])
        if state.log_frequency > 0 and len(state.buffer) >= state.log_frequency:
            self._flush(state)
        elif state.outstanding == 0 and (state.retired or state.remaining == 0):
            self._flush(state)

    def _retire_all(self) -> None:
        for state in self._states.values():
            state.retired = True
            if state.outstanding == 0:
                self._flush(state)
            else:
                self._retired.append(state)
        self._states = {}

    def close(self) -> None:
        """Write every buffered trace (server shutdown)."""
        self._retire_all()
        for state in self._retired:
            self._flush(state)
        self._retired = []
        if self._otel is not None:
            self._otel.shutdown()

    def _flush(self, state: _State) -> None:
        if not state.buffer or not state.file:
            return
        if state.log_frequency > 0:
            path = f"{state.file}.{state.index}"
            state.index += 1
            entries = state.buffer
        else:
            path = state.file
            entries = self._files.setdefault(path, [])
            entries += state.buffer
        try:
            with open(path, "w") as f:
                f.write("[" + ",".join(entries) + "]")  # the traces' entries, one JSON array
        except OSError as e:
            log.error("failed to write trace file '%s': %s", path, e)
        self.written += len(state.buffer)
        state.buffer = []

    # ---- OpenTelemetry ---------------------------------------------------------------------

    def _export_span(self, trace: RequestTrace, stamps: list[tuple[str, int]]) -> None:
        if self._otel is None or trace.span is None:  # the span started with the trace (sample)
            return
        self._otel.finish(trace, stamps)
        self.written += 1


class _OtelExporter:
    """One span per traced request, exported with OTLP/HTTP through a batch span processor
    (``bsp_*`` settings, Triton's names; the SDK's defaults and ``OTEL_BSP_*`` variables for
    those not given). Every span is recorded (the client's sampled flag does not drop one:
    Triton records every request with a propagated context)."""

    def __init__(self, settings: dict[str, str]) -> None:
        from opentelemetry import trace as otel_trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource  # type: ignore[import-not-found]
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # type: ignore[import-not-found]
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON  # type: ignore[import-not-found]

        attrs = {"service.name": "triton-inference-server"}
        for item in filter(None, settings.get("resource", "").split(",")):
            k, _, v = item.partition("=")
            attrs[k] = v
        self.provider = TracerProvider(resource=Resource.create(attrs), sampler=ALWAYS_ON)
        bsp = {arg: int(settings[key]) for key, arg in BSP_ARGUMENTS.items() if key in settings}
        self.processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.get("url", "http://localhost:4318/v1/traces")),
            max_queue_size=bsp.get("max_queue_size"), schedule_delay_millis=bsp.get("schedule_delay_millis"),
            max_export_batch_size=bsp.get("max_export_batch_size"))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("trident")
        self.api = otel_trace
        self.offset = time.time_ns() - time.monotonic_ns()  # monotonic -> epoch ns

    def _remote(self, context: TraceParent) -> Any:
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

        state = TraceState.from_header([context.tracestate]) if context.tracestate else None
        span = NonRecordingSpan(SpanContext(int(context.trace_id, 16), int(context.span_id, 16), is_remote=True,
                                            trace_flags=TraceFlags(context.flags & 0xFF), trace_state=state))
        return self.api.set_span_in_context(span)

    def start(self, trace: RequestTrace, parent: RequestTrace | None, context: TraceParent | None,
              start_ns: int) -> None:
        """Start ``trace``'s span at ``start_ns`` (monotonic): a child of ``parent``'s span, of
        the client's ``context``, or a new trace's root; sets ``trace.span`` and ``trace.trace_id``."""
        if parent is not None and parent.span is not None:
            ctx = self.api.set_span_in_context(parent.span)
        elif context is not None:
            ctx = self._remote(context)
        else:
            ctx = None
        trace.span = self.tracer.start_span("InferRequest", context=ctx, start_time=start_ns + self.offset,
                                            attributes={
            "triton.model_name": trace.model_name, "triton.model_version": trace.model_version,
            "triton.trace_id": trace.id, "triton.request_id": trace.request_id,
            "triton.parent_id": trace.parent_id})
        trace.trace_id = f"{trace.span.get_span_context().trace_id:032x}"

    def finish(self, trace: RequestTrace, stamps: list[tuple[str, int]]) -> None:
        """End ``trace``'s span with its timestamps as events (the processor exports it)."""
        span = trace.span
        for name, ns in stamps:
            span.add_event(name, timestamp=ns + self.offset)
        span.end(end_time=stamps[-1][1] + self.offset)

    def shutdown(self) -> None:
        self.provider.shutdown()
