"""Ensemble models (``platform: "ensemble"``): a DAG of composing models run per request.

An ensemble is a :class:`~trident.server.model.ModelVersion` like any other model, whose scheduler is
:class:`EnsembleScheduler` instead of a queue: it owns no instance. Its load checks the steps
against the composing models, which the repository has loaded first
(:func:`~trident.batching.ensemble_plan.build_plan`); it is READY only while every composing
model is.

Each request runs in its own nursery (:class:`EnsembleRequest`). Ensemble tensors are kept by
iteration, as Triton keeps them: the request's inputs are iteration 0, and each response of a
step adds the next iteration of the tensors it writes. A step starts, as a task of the
request's nursery, as soon as every tensor it reads has a value of the same iteration, so
independent steps run concurrently and a decoupled step's every response flows on through
the steps downstream of it. Each step is an ordinary request to its model
(``ModelVersion.infer_stream``), so it goes through that model's scheduler and batches with
other traffic; tensors pass between steps as the same numpy arrays, without copies. Steps the
requested outputs do not depend on are not run.

A response is ready when every requested output has a value of one iteration. A decoupled
ensemble (any composing model decoupled) streams each such response as it is ready, then a
flag-only final one; a regular one sends its single response when every step is done.
``max_inflight_requests`` bounds each step's in-flight requests across the ensemble's requests;
while a step is full, the step feeding it stops consuming responses, and a decoupled model
sending them from its own thread blocks (``InferenceRequest.response_window``).

Cancelling the caller cancels the request's nursery: queued steps are dropped and running
ones discarded, by their models' own cancellation. The first step that fails cancels the others
and fails the request with its error, prefixed ``in ensemble '<name>', step <i> (model '<m>')``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trident.batching.batcher import Sequencer, Turn
from trident.batching.ensemble_plan import (
    EnsemblePlan,
    Step,
    build_plan,
    dependencies,
    reshape,
    version_string,
)
from trident.batching.outputs import classify
from trident.batching.policy import TIMEOUT_EXPIRED
from trident.errors import Code, TritonError, invalid_arg, unavailable
from trident.protocol.generated.inference import ModelConfig, ModelTransactionPolicy
from trident.types import (
    InferenceRequest,
    InferenceResponse,
    ParamValue,
    RequestedOutput,
    Tensor,
    TensorSpec,
)

log = logging.getLogger("trident.ensemble")

SendResponse = Callable[[InferenceResponse], Awaitable[None]]
#: (model name, version string: "" for the latest) -> the serving model; raises TritonError
Resolve = Callable[[str, str], Any]


class ComputeSums:
    """The compute durations of an ensemble request's steps (Triton adds them up the same way)."""

    __slots__ = ("input_ns", "infer_ns", "output_ns")

    def __init__(self) -> None:
        self.input_ns = self.infer_ns = self.output_ns = 0

    def add(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.input_ns += input_ns
        self.infer_ns += infer_ns
        self.output_ns += output_ns


class EnsembleScheduler:
    """The scheduler of an ensemble model version: a :class:`~trident.server.model.ModelVersion` made
    with ``ensemble=`` runs each request through :meth:`request` instead of a queue.

    It owns the plan (the steps checked against the composing models) and the steps' in-flight
    limits; the model version owns the rest (state, drain, cache, tracing, statistics) as it
    does for every model.
    """

    def __init__(self, name: str, version: int, config: ModelConfig, outputs: dict[str, TensorSpec], *,
                 resolve: Resolve) -> None:
        self.name = name
        self.version = version
        self.config = config  # the model version's own (use() updates its decoupled flag)
        policy = config.model_transaction_policy
        self.decoupled = bool(policy and policy.decoupled)
        self.outputs = outputs
        self.plan: EnsemblePlan | None = None
        self._resolve = resolve
        self._limiters: list[trio.Semaphore] = []

    def composing(self) -> list[tuple[str, str]]:
        """(model name, version string) of each composing model, in step order."""
        return [(name, version_string(version)) for name, version in dependencies(self.config)]

    def start(self) -> None:
        """Check the steps against the composing models (unless :meth:`use` was given a checked
        plan) and set up the steps' limits. Raises TritonError(INVALID_ARG) when they do not fit."""
        if self.plan is None:
            self.refresh()
        if self.plan is not None and self.plan.max_inflight_requests > 0:
            self._limiters = [trio.Semaphore(self.plan.max_inflight_requests) for _ in self.plan.steps]

    def refresh(self) -> bool:
        """Check the steps against the composing models now serving (after one was reloaded);
        returns :meth:`use`'s answer. Raises TritonError(INVALID_ARG) with the reason when they
        no longer fit; the plan in use is then unchanged."""
        return self.use(build_plan(self.config, lambda n, v: self._resolve(n, version_string(v))))

    def use(self, plan: EnsemblePlan) -> bool:
        """Run by ``plan`` (checked against the composing models). The config's decoupled flag
        follows the steps, as Triton derives it; returns True when that changed it."""
        changed = plan.decoupled != self.decoupled
        if changed:
            self.config.model_transaction_policy = ModelTransactionPolicy(decoupled=plan.decoupled)
            self.decoupled = plan.decoupled
        self.plan = plan
        return changed

    def ready(self) -> bool:
        """Every composing model is READY."""
        try:
            return all(self._resolve(n, v).is_ready() for n, v in self.composing())
        except TritonError:
            return False

    async def probe(self) -> bool:
        """Every composing model answers its own readiness probe. Never raises."""
        for name, version in self.composing():
            try:
                model = self._resolve(name, version)
            except TritonError:
                return False
            if not await model.probe_ready():
                return False
        return True

    def request(self, request: InferenceRequest, send: SendResponse, batch: int) -> EnsembleRequest:
        """The run of ``request`` (``await run.execute()`` runs it; ``batch`` 0: not batching).
        Raises TritonError(UNAVAILABLE) before :meth:`start`."""
        if self.plan is None:
            raise unavailable(f"model '{self.name}' version {self.version} is not ready (no checked plan)")
        return EnsembleRequest(self, self.plan, request, send, batch)

    def limiter(self, step: int) -> trio.Semaphore | None:
        return self._limiters[step] if self._limiters else None


class _Value:
    """One iteration of an ensemble tensor: the tensor (None: not provided) and its batch size
    (0: not batched), with how many more readers will take it."""

    __slots__ = ("tensor", "batch", "readers")

    def __init__(self, tensor: Tensor | None, batch: int, readers: int) -> None:
        self.tensor = tensor
        self.batch = batch
        self.readers = readers


class EnsembleRequest:
    """The state of one ensemble request: tensors by iteration, started steps, the response."""

    def __init__(self, ensemble: EnsembleScheduler, plan: EnsemblePlan, request: InferenceRequest, send: SendResponse,
                 batch: int) -> None:
        self.ensemble = ensemble
        self.plan = plan
        self.request = request
        self._send = send
        self._sending = trio.StrictFIFOLock()  # steps finish in several tasks; the consumer sees one send at a time
        self.batch = batch
        self.requested = [o.name for o in request.outputs] or list(plan.outputs)
        self.classification = {o.name: o.parameters.get("classification") for o in request.outputs}
        self.needed = plan.prune(self.requested)
        self.values: dict[str, dict[int, _Value]] = {}
        self.iterations: dict[str, int] = {}
        self.started: set[tuple[int, int]] = set()
        self.running = 0  # steps started whose final response has not arrived
        self.final_sent = False
        self.response: InferenceResponse | None = None
        self.first_response_ns: int | None = None
        self.sums = ComputeSums()
        self.started_ns = time.monotonic_ns()
        self.error: TritonError | None = None
        self.on_final: Callable[[InferenceResponse], None] | None = None  # the response cache's insert
        self.trace: Any = None  # the request's trace: its steps' requests are traced as its children
        self._nursery: trio.Nursery | None = None
        self._order: dict[int, Sequencer] = {}  # per step: its iterations' turns
        self._held: dict[int, list[Tensor]] = {}  # decoupled: outputs waiting for an earlier iteration's
        self._next_output = 0

    def _readers(self, tensor: str) -> int:
        readers = sum(1 for i in self.plan.consumers.get(tensor, ()) if i in self.needed)
        return readers + (1 if tensor in self.requested else 0)

    def _put(self, tensor: str, value: Tensor | None, batch: int, iteration: int | None = None) -> tuple[str, int]:
        """Store one iteration of ``tensor``: ``iteration`` when the producing step answers
        each of its iterations once (the step's own), else the next one in arrival order (the
        responses of a decoupled step, which arrive in order on one task)."""
        if iteration is None:
            iteration = self.iterations.get(tensor, 0)
            self.iterations[tensor] = iteration + 1
        readers = self._readers(tensor)
        if readers:
            self.values.setdefault(tensor, {})[iteration] = _Value(value, batch, readers)
        return tensor, iteration

    def _take(self, tensor: str, iteration: int) -> _Value:
        by_iteration = self.values[tensor]
        value = by_iteration[iteration]
        value.readers -= 1
        if value.readers <= 0:
            del by_iteration[iteration]
        return value

    async def execute(self) -> None:
        """Run the needed steps to completion; send the response(s). Raises TritonError."""
        request = self.request
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            updated = [self._put(name, request.input(name), self.batch) for name in self.plan.inputs]
            await self._advance(updated)
        if self.error is not None:
            raise self.error
        ensemble = self.ensemble
        if ensemble.decoupled:
            if not self.final_sent:  # the last response went out before the last step finished
                await self.send(InferenceResponse(model_name=ensemble.name, model_version=str(ensemble.version),
                                                  id=request.id, flag_only=True, final=True))
            return
        if self.response is None:
            raise invalid_arg(f"in ensemble '{ensemble.name}', unexpected deadlock, at least one output is not set "
                              "while no more ensemble steps can be made")
        await self.send(self.response)
        if self.on_final is not None:
            self.on_final(self.response)

    async def _advance(self, updated: list[tuple[str, int]]) -> None:
        """Start the steps and emit the responses that the ``updated`` tensor iterations complete.

        Waits for a place when a step is at its ``max_inflight_requests``.
        """
        plan = self.plan
        ready: list[tuple[int, int]] = []
        outputs: list[int] = []
        for tensor, iteration in updated:
            for index in plan.consumers.get(tensor, ()):
                if index not in self.needed or (index, iteration) in self.started:
                    continue
                step = plan.steps[index]
                if all(iteration in self.values.get(t, {}) for t in step.inputs.values()):
                    self.started.add((index, iteration))
                    ready.append((index, iteration))
            if (tensor in self.requested and iteration not in outputs
                    and all(iteration in self.values.get(t, {}) for t in self.requested)):
                outputs.append(iteration)
        self.running += len(ready)
        for iteration in outputs:
            await self._respond(iteration)
        assert self._nursery is not None
        for index, iteration in ready:
            limiter = self.ensemble.limiter(index)
            if limiter is not None:
                await limiter.acquire()
            turn = self._order.setdefault(index, Sequencer()).next()
            self._nursery.start_soon(self._run_step, plan.steps[index], iteration, limiter, turn)

    async def _respond(self, iteration: int) -> None:
        ensemble = self.ensemble
        outputs: list[Tensor] = []
        for name in self.requested:
            value = self._take(name, iteration)
            if value.tensor is None:
                continue
            source = value.tensor
            shape = reshape(self.plan.outputs[name], self.batch != 0, value.batch, source.shape)
            data = source.data if shape == source.shape else source.data.reshape(shape)
            tensor = Tensor(name, source.datatype, shape, data)
            k = self.classification.get(name)
            if k:
                spec = ensemble.outputs.get(name)
                tensor = classify(tensor, int(k), spec.labels if spec else None, self.batch != 0)
            outputs.append(tensor)
        if self.first_response_ns is None:
            self.first_response_ns = time.monotonic_ns()
        if not ensemble.decoupled:
            if self.response is None:
                self.response = self._response(outputs, True)
            return
        # a decoupled ensemble answers in the order of its output iterations, whichever of the
        # steps that produce them finishes first (several can finish in one scheduling round)
        self._held[iteration] = outputs
        while self._next_output in self._held:
            outputs = self._held.pop(self._next_output)
            self._next_output += 1
            # as Triton: the last response of a decoupled ensemble is final when no step is running
            final = self.running == 0 and not self._held
            self.final_sent = self.final_sent or final
            await self.send(self._response(outputs, final))

    def _response(self, outputs: list[Tensor], final: bool) -> InferenceResponse:
        ensemble = self.ensemble
        return InferenceResponse(model_name=ensemble.name, model_version=str(ensemble.version), id=self.request.id,
                                 outputs=outputs, parameters=self._sequence_parameters(), final=final)

    async def send(self, response: InferenceResponse) -> None:
        """Hand one response to the caller's ``send``, in order, never two at once."""
        async with self._sending:
            await self._send(response)

    def _sequence_parameters(self) -> dict[str, ParamValue]:
        """Triton puts the request's sequence fields on every ensemble response."""
        params = self.request.parameters
        return {"sequence_id": params.get("sequence_id", 0),
                "sequence_start": bool(params.get("sequence_start", False)),
                "sequence_end": bool(params.get("sequence_end", False))}

    async def _run_step(self, step: Step, iteration: int, limiter: trio.Semaphore | None, turn: Turn) -> None:
        """Run one step for one iteration; a failure cancels the request's other steps.

        ``turn`` keeps the iterations of a step in order: each calls its model only after the
        previous one did, so a model's queue sees them in the order their inputs were produced
        (as Triton enqueues them from the response callback), whatever order trio runs the
        step tasks in.
        """
        done = [False]
        try:
            await self._step(step, iteration, done, turn)
        except TritonError as e:
            if self.error is None:
                self.error = TritonError(e.code, f"in ensemble '{self.ensemble.name}', {step.describe()}: "
                                                 f"{e.message}")
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
        finally:
            turn.finish()
            if not done[0]:
                self.running -= 1
            if limiter is not None:
                limiter.release()

    async def _step(self, step: Step, iteration: int, done: list[bool], turn: Turn) -> None:
        request = self.request
        if request.cancelled:
            raise TritonError(Code.CANCELLED, "the ensemble request was cancelled")
        model = self.ensemble._resolve(step.model_name, step.version_string)
        inputs: list[Tensor] = []
        for model_input, tensor in step.inputs.items():
            value = self._take(tensor, iteration)
            if value.tensor is None:  # an optional ensemble input the client left out
                continue
            source = value.tensor
            shape = reshape(step.input_dims[model_input], step.batching, value.batch, source.shape)
            data = source.data if shape == source.shape else source.data.reshape(shape)
            inputs.append(Tensor(model_input, source.datatype, shape, data))
        sub = InferenceRequest(step.model_name, inputs, model_version=step.version_string, id=request.id,
                               outputs=[RequestedOutput(name) for name in step.outputs],
                               parameters=dict(request.parameters))
        sub.stats_sink = self.sums
        # the ensemble request's trace (its steps are traced as its children), or the client's
        # W3C context an untraced ensemble request came with (its steps continue that trace)
        sub.trace = self.trace if self.trace is not None else request.trace
        sub.response_window = self.plan.max_inflight_requests
        sub.deadline = request.deadline  # the step inherits the ensemble request's deadline
        batch = inputs[0].shape[0] if step.batching and inputs and inputs[0].shape else 0
        decoupled = bool(getattr(model, "decoupled", False))

        async def on_response(response: InferenceResponse) -> None:
            if response.error is not None:
                raise response.error
            if response.final and not done[0]:
                done[0] = True
                self.running -= 1
            if response.flag_only and not response.outputs:
                return
            produced = {t.name: t for t in response.outputs}
            # a regular model answers once per iteration: its outputs keep the iteration of its
            # inputs, whichever iteration finishes first (so joins pair values of one origin)
            own = None if decoupled else iteration
            updated = [self._put(tensor, produced.get(output), batch, own) for output, tensor in step.outputs.items()]
            await self._advance(updated)

        await turn.wait()
        turn.finish()  # the call below takes its place in the model's queue before it first waits
        if sub.deadline is not None and trio.current_time() >= sub.deadline:
            raise TritonError(Code.UNAVAILABLE, TIMEOUT_EXPIRED)  # no step starts after the deadline
        await model.infer_stream(sub, on_response)
