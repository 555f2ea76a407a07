"""A queued request answered through a callback (trident.server.execution.Completion): what a
unary gRPC call waiting in a model's queue has instead of a task. The callbacks run once, what
the request holds is given back first, late responses are refused as by a closed Mailbox, and
a failing callback never reaches the task that delivers (a model's worker)."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import trio
import trio.testing

from trident.server.execution import Answer, Completion, Pending
from trident.types import InferenceRequest, InferenceResponse


def _finish(request: InferenceRequest, response: InferenceResponse) -> InferenceResponse:
    return response


class Log:
    def __init__(self) -> None:
        self.events: list[object] = []

    def completion(self) -> Completion:
        completion = Completion(lambda response: self.events.append(("final", response)),
                                lambda: self.events.append("cancelled"))
        completion.on_close(lambda: self.events.append("closed"))
        return completion


async def test_the_final_response_goes_to_the_callback_after_the_closers():
    log = Log()
    completion = log.completion()
    pending = Pending(InferenceRequest(model_name="m", inputs=[]), 1, _finish, completion)
    assert pending.send is completion and pending.receive is None
    pending.responder.send(InferenceResponse(id="partial"), final=False)  # a unary caller keeps the last
    assert log.events == []
    final = InferenceResponse(id="last")
    pending.responder.send(final, final=True)
    assert log.events == ["closed", ("final", final)] and completion.closed
    completion.cancel()  # too late: nothing happens
    with pytest.raises(trio.BrokenResourceError):
        completion.send_nowait(InferenceResponse())
    assert log.events == ["closed", ("final", final)]


async def test_a_cancelled_completion_runs_its_closers_once_and_refuses_responses():
    log = Log()
    completion = log.completion()
    pending = Pending(InferenceRequest(model_name="m", inputs=[]), 1, _finish, completion)
    completion.cancel()
    completion.cancel()
    assert log.events == ["closed", "cancelled"]
    pending.responder.send(InferenceResponse(), final=True)  # the model answers after all: dropped
    assert pending.responder.undelivered == 1
    assert log.events == ["closed", "cancelled"]


async def test_an_error_response_is_a_final_response():
    log = Log()
    completion = log.completion()
    pending = Pending(InferenceRequest(model_name="m", inputs=[]), 1, _finish, completion)
    from trident.errors import internal

    pending.responder.send(InferenceResponse(error=internal("boom")), final=True)
    assert log.events[0] == "closed"
    kind, response = log.events[1]
    assert kind == "final" and response.error is not None and response.error.message == "boom"


async def test_a_failing_callback_is_logged_not_raised_into_the_deliverer(caplog):
    def broken(response: InferenceResponse) -> None:
        raise RuntimeError("a bug in the front end")

    closed: list[int] = []
    completion = Completion(broken, lambda: None)
    completion.on_close(lambda: closed.append(1))
    with caplog.at_level(logging.ERROR, logger="trident.execution"):
        completion.send_nowait(InferenceResponse(final=True))
    assert closed == [1] and completion.closed
    assert "completing a request failed" in caplog.text and "a bug in the front end" in caplog.text


def _entry(held: object) -> tuple[Completion, Pending]:
    """A queued entry whose callbacks hold it (through their closure) and ``held``, as
    ModelVersion's do: pending -> completion -> callbacks -> pending, a cycle."""
    pending: Pending

    def final(response: InferenceResponse) -> None:
        pending.request.responder = None
        assert held is not None

    def cancelled() -> None:
        pending.request.cancel()
        pending.request.responder = None
        assert held is not None

    completion = Completion(final, cancelled)
    pending = Pending(InferenceRequest(model_name="m", inputs=[]), 1, _finish, completion)
    return completion, pending


async def test_an_ended_completion_leaves_no_cycle_for_the_garbage_collector():
    """Once the completion ends its callbacks are dropped: the entry and what the callbacks
    held are freed by reference counting alone, at once."""

    class Held:
        """Something only the callbacks hold (weakly referenceable)."""

    gc.disable()
    try:
        for end in ("answer", "cancel"):
            held = Held()
            gone = weakref.ref(held)
            completion, pending = _entry(held)
            if end == "answer":
                pending.responder.send(InferenceResponse(), final=True)
            else:
                completion.cancel()
            del held, pending, completion
            assert gone() is None, end
    finally:
        gc.enable()


async def test_an_answer_wakes_its_task_and_its_cancellation_cancels_the_request():
    answer = Answer()
    log = Log()
    completion = Completion(answer.done, lambda: log.events.append("cancelled"))
    final = InferenceResponse(id="r", final=True)
    async with trio.open_nursery() as nursery:
        got: list[InferenceResponse] = []

        async def wait() -> None:
            got.append(await answer.wait(completion))

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        completion.send_nowait(final)
    assert got == [final] and log.events == []
    assert answer.response is None  # handed over: the Answer keeps no response alive

    answer = Answer()
    completion = Completion(answer.done, lambda: log.events.append("cancelled"))
    with trio.move_on_after(0.01) as scope:
        await answer.wait(completion)
    assert scope.cancelled_caught and log.events == ["cancelled"] and completion.closed
    with pytest.raises(trio.BrokenResourceError):  # the model's answer, later: dropped
        completion.send_nowait(final)
