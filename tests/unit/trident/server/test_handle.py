"""A request in flight as the server hands it to its caller (trident.server.handle.RequestHandle).

A queued request answered through a callback is what a unary gRPC call (or an HTTP request)
waiting in a model's queue has instead of a task: the callbacks run once, what the request
holds is given back first, late responses are refused, and a failing callback never reaches
the task that delivers (a model's worker). A task may wait for it instead, and its
cancellation cancels the request. A driven handle runs its request in the awaiting task.
"""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
import trio
import trio.testing

from trident.errors import TritonError, internal
from trident.server.execution import Pending
from trident.server.handle import RequestHandle
from trident.types import InferenceRequest, InferenceResponse


def _finish(request: InferenceRequest, response: InferenceResponse) -> InferenceResponse:
    return response


class Log:
    def __init__(self) -> None:
        self.events: list[object] = []

    def handle(self) -> RequestHandle:
        """A queued request's handle: its model's end records a cancellation, its caller the answer."""
        def final(response: InferenceResponse | None) -> None:
            if response is None:
                self.events.append("cancelled")

        handle = RequestHandle(final=final)
        handle.on_close(lambda: self.events.append("closed"))
        return handle

    def called_back(self) -> RequestHandle:
        handle = self.handle()
        assert handle.on_final(lambda response: self.events.append(("final", response)))
        return handle


async def test_the_final_response_goes_to_the_callback_after_the_closers():
    log = Log()
    handle = log.called_back()
    pending = Pending(InferenceRequest(model_name="m", inputs=[]), 1, _finish, handle)
    assert pending.send is handle and pending.receive is handle
    pending.responder.send(InferenceResponse(id="partial"), final=False)  # a unary caller keeps the last
    assert log.events == []
    final = InferenceResponse(id="last")
    pending.responder.send(final, final=True)
    assert log.events == ["closed", ("final", final)] and not handle.on_final(print)
    handle.cancel()  # too late: nothing happens
    with pytest.raises(trio.BrokenResourceError):
        handle.send_nowait(InferenceResponse())
    assert log.events == ["closed", ("final", final)]


async def test_a_cancelled_handle_runs_its_closers_once_and_refuses_responses():
    log = Log()
    handle = log.called_back()
    pending = Pending(InferenceRequest(model_name="m", inputs=[]), 1, _finish, handle)
    handle.cancel()
    handle.cancel()
    assert log.events == ["closed", "cancelled"]
    pending.responder.send(InferenceResponse(), final=True)  # the model answers after all: dropped
    assert pending.responder.undelivered == 1
    assert log.events == ["closed", "cancelled"]


async def test_an_error_response_is_a_final_response():
    log = Log()
    handle = log.called_back()
    pending = Pending(InferenceRequest(model_name="m", inputs=[]), 1, _finish, handle)
    pending.responder.send(InferenceResponse(error=internal("boom")), final=True)
    assert log.events[0] == "closed"
    kind, response = log.events[1]
    assert kind == "final" and response.error is not None and response.error.message == "boom"


async def test_a_failing_callback_is_logged_not_raised_into_the_deliverer(caplog):
    def broken(response: InferenceResponse) -> None:
        raise RuntimeError("a bug in the front end")

    closed: list[int] = []
    handle = RequestHandle(final=lambda response: None)
    handle.on_close(lambda: closed.append(1))
    assert handle.on_final(broken)
    with caplog.at_level(logging.ERROR, logger="trident.execution"):
        handle.send_nowait(InferenceResponse(final=True))
    assert closed == [1]
    with pytest.raises(trio.BrokenResourceError):
        handle.send_nowait(InferenceResponse(final=True))
    assert "completing a request failed" in caplog.text and "a bug in the front end" in caplog.text


def _entry(held: object) -> tuple[RequestHandle, Pending]:
    """A queued entry whose callbacks hold it (through their closure) and ``held``, as
    ModelVersion's do: pending -> handle -> callbacks -> pending, a cycle."""
    pending: Pending

    def final(response: InferenceResponse | None) -> None:
        if response is None:
            pending.request.cancel()
        pending.request.responder = None
        assert held is not None

    handle = RequestHandle(final=final)
    pending = Pending(InferenceRequest(model_name="m", inputs=[]), 1, _finish, handle)
    handle.on_final(lambda response: None if held is None else pending)
    return handle, pending


async def test_an_ended_handle_leaves_no_cycle_for_the_garbage_collector():
    """Once the request ends its callbacks are dropped: the entry and what the callbacks held
    are freed by reference counting alone, at once."""

    class Held:
        """Something only the callbacks hold (weakly referenceable)."""

    gc.disable()
    try:
        for end in ("answer", "cancel"):
            held = Held()
            gone = weakref.ref(held)
            handle, pending = _entry(held)
            if end == "answer":
                pending.responder.send(InferenceResponse(), final=True)
            else:
                handle.cancel()
            del held, pending, handle
            assert gone() is None, end
    finally:
        gc.enable()


async def test_a_waiting_task_gets_the_answer_and_its_cancellation_cancels_the_request():
    log = Log()
    handle = log.handle()
    final = InferenceResponse(id="r", final=True)
    async with trio.open_nursery() as nursery:
        got: list[InferenceResponse] = []

        async def wait() -> None:
            got.append(await handle.wait())

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        handle.send_nowait(final)
    assert got == [final] and log.events == ["closed"]
    assert handle.response is final

    log = Log()
    handle = log.handle()
    with trio.move_on_after(0.01) as scope:
        await handle.wait()
    assert scope.cancelled_caught and log.events == ["closed", "cancelled"]
    with pytest.raises(trio.BrokenResourceError):  # the model's answer, later: dropped
        handle.send_nowait(final)


async def test_a_waiting_task_gets_the_error_raised():
    handle = RequestHandle(final=lambda response: None)
    handle.send_nowait(InferenceResponse(error=internal("refused"), final=True))
    with pytest.raises(TritonError, match="refused"):
        await handle.wait()


async def test_a_driven_handle_runs_in_the_awaiting_task():
    """``wait`` keeps the last response of a driven request (raising an error response's
    error); ``stream`` hands each on; ``on_final`` refuses it; the closers run at its end."""
    sent = [InferenceResponse(id="a"), InferenceResponse(id="b", final=True)]

    async def drive(handle: RequestHandle, send) -> None:
        for response in sent:
            await send(response)

    closed: list[int] = []
    handle = RequestHandle(drive)
    handle.on_close(lambda: closed.append(1))
    assert not handle.on_final(print) and handle.response is None
    assert await handle.wait() is sent[-1] and closed == [1]

    streamed: list[InferenceResponse] = []

    async def keep(response: InferenceResponse) -> None:
        streamed.append(response)

    await RequestHandle(drive).stream(keep)
    assert streamed == sent

    async def fails(handle: RequestHandle, send) -> None:
        await send(InferenceResponse(error=internal("late"), final=True))

    with pytest.raises(TritonError, match="late"):
        await RequestHandle(fails).wait()
