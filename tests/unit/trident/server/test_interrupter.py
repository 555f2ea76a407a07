"""Stopping a running call: CallGuard (a backend's side) and Interrupter (the executor's side).

The e2e tests (tests/e2e/test_cancel_running.py) drive a real server and onnxruntime; these pin the
orderings a server rarely shows: an interrupt before the call begins, after it ended, twice, one
live request left, a cancel from another thread, and a BatchExecutor that runs a real call on its
instance thread and interrupts it.
"""

from __future__ import annotations

import threading

import pytest
import trio

from trident.backends.base import CallGuard, ModelInstance
from trident.errors import Code, cancelled
from trident.server.execution import Interrupter
from trident.types import InferenceRequest, InferenceResponse


def requests(n: int) -> list[InferenceRequest]:
    return [InferenceRequest("m", []) for _ in range(n)]


class Stops:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_guard_stops_the_running_call_once():
    guard, stop = CallGuard(), Stops()
    assert guard.begin(requests(2), stop)
    guard.interrupt()
    guard.interrupt()
    assert stop.count == 1 and guard.stopped
    guard.end()
    assert guard.begin(requests(1), stop) and not guard.stopped  # the next call starts afresh
    guard.end()


def test_guard_interrupt_after_the_call_ended_changes_nothing():
    guard, stop = CallGuard(), Stops()
    assert guard.begin(requests(1), stop)
    guard.end()
    guard.interrupt()
    assert stop.count == 0
    assert guard.begin(requests(1), stop) and not guard.stopped


def test_guard_a_call_whose_requests_are_all_cancelled_before_it_begins_does_not_run():
    guard, stop = CallGuard(), Stops()
    batch = requests(2)
    for r in batch:
        r.cancel()
    guard.interrupt()  # came first: nothing was running
    assert not guard.begin(batch, stop)
    assert guard.stopped and stop.count == 0
    batch[0].cancelled = False  # one live request: it runs
    assert guard.begin(batch, stop)


class Instance(ModelInstance):
    interruptible = True

    def __init__(self) -> None:
        self.interrupts = 0
        self.guard = CallGuard()
        self.release = threading.Event()

    def interrupt(self) -> None:
        self.interrupts += 1
        self.guard.interrupt()

    def execute(self, batch: list[InferenceRequest]) -> list[InferenceResponse]:
        if not self.guard.begin(batch, self.release.set):
            return [InferenceResponse(error=cancelled("stopped")) for _ in batch]
        try:
            self.release.wait(30)  # a long kernel that stop() ends
            if self.guard.stopped:
                return [InferenceResponse(error=cancelled("stopped")) for _ in batch]
            return [InferenceResponse() for _ in batch]
        finally:
            self.guard.end()


def watch(instance: ModelInstance, batch: list[InferenceRequest]) -> Interrupter:
    return Interrupter(instance, batch, trio.lowlevel.current_trio_token(), threading.get_ident())


async def test_interrupter_waits_for_the_last_request():
    instance, batch = Instance(), requests(3)
    interrupter = watch(instance, batch)
    batch[0].cancel()
    batch[1].cancel()
    assert instance.interrupts == 0  # one live request: the call runs on for it
    batch[2].cancel()
    assert instance.interrupts == 1 and interrupter.fired
    batch[2].cancel()  # twice: nothing more
    assert instance.interrupts == 1


async def test_interrupter_after_the_call_returned_changes_nothing():
    instance, batch = Instance(), requests(1)
    interrupter = watch(instance, batch)
    interrupter.finish()
    batch[0].cancel()
    assert instance.interrupts == 0 and not interrupter.fired
    assert interrupter.requests == []  # the requests are let go


async def test_a_cancel_from_another_thread_interrupts_on_trios_thread():
    instance, batch = Instance(), requests(1)
    seen: list[int] = []
    instance.interrupt = lambda: seen.append(threading.get_ident())  # type: ignore[method-assign]
    watch(instance, batch)
    await trio.to_thread.run_sync(batch[0].cancel)
    await trio.testing.wait_all_tasks_blocked()
    assert seen == [threading.get_ident()]


async def test_a_backend_whose_interrupt_raises_does_not_break_the_cancel(caplog):
    instance, batch = Instance(), requests(1)

    def broken() -> None:
        raise RuntimeError("boom")

    instance.interrupt = broken  # type: ignore[method-assign]
    watch(instance, batch)
    batch[0].cancel()
    assert batch[0].cancelled
    assert "interrupting a running call" in caplog.text


@pytest.mark.parametrize("direct", [False, True])
async def test_the_executor_interrupts_a_call_on_the_instance_thread(direct):
    from trident.server.execution import BatchExecutor, Pending

    finished: list[InferenceResponse] = []

    class Model:
        name, version, decoupled, max_batch_size, outputs, discarded = "m", 1, False, 0, {}, 0

        class stats:  # noqa: N801 - the recorder's interface
            executions = 0

            @classmethod
            def record_execution(cls, *args: object) -> None:
                cls.executions += 1

        def on_drop(self, pending: Pending) -> None:
            raise AssertionError("nothing is dropped")

    instance = Instance()
    model = Model()
    async with trio.open_nursery() as nursery:
        from trident.backends.base import PlainThreads

        model.threads = PlainThreads()  # type: ignore[attr-defined]
        executor = BatchExecutor(model, inline_mode="never")  # type: ignore[arg-type]
        batch = [Pending(r, 1, lambda request, response: finished.append(response) or response)
                 for r in requests(2)]
        if direct:
            with trio.move_on_after(0.2):
                await executor(instance, batch[:1], direct=True)
            batch = batch[:1]
        else:
            nursery.start_soon(executor, instance, batch)
            await trio.sleep(0.2)
            batch[0].request.cancel()
            assert instance.interrupts == 0  # one live request left
            batch[1].request.cancel()
        with trio.fail_after(10):
            while not finished:
                await trio.sleep(0.01)
        executor.release(instance)
    assert instance.interrupts == 1
    assert all(r.error is not None and r.error.code == Code.CANCELLED for r in finished)
    assert Model.stats.executions == 0  # a stopped call is no execution
