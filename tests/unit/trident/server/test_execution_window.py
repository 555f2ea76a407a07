"""The response window (``InferenceRequest.response_window``): a model thread sending responses
blocks while the window is full, until the consumer takes one, and never after ``close``."""

from __future__ import annotations

import threading
import time

import numpy as np
import trio

from trident.server.execution import Pending, Window
from trident.types import InferenceRequest, InferenceResponse, Tensor


def test_a_thread_waits_until_the_consumer_leaves():
    window = Window(2)
    window.enter(wait=True)
    window.enter(wait=True)
    entered = threading.Event()

    def producer() -> None:
        window.enter(wait=True)
        entered.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert not entered.wait(0.2)  # full: the third response waits
    window.leave()
    assert entered.wait(5)
    thread.join()
    assert window.unconsumed == 2


def test_close_lets_every_waiting_thread_through():
    window = Window(1)
    window.enter(wait=True)
    done: list[int] = []
    threads = [threading.Thread(target=lambda i=i: (window.enter(wait=True), done.append(i))) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    assert done == []
    window.close()
    for t in threads:
        t.join(5)
    assert sorted(done) == [0, 1, 2]


def test_a_stuck_consumer_cannot_hang_the_producer_forever():
    window = Window(1, timeout=0.05)
    window.enter(wait=True)
    started = time.monotonic()
    window.enter(wait=True)  # proceeds after the timeout, as Triton's step limiter does
    assert time.monotonic() - started >= 0.04
    assert window.unconsumed == 2


def test_entering_without_waiting_never_blocks():
    window = Window(1)
    for _ in range(5):
        window.enter(wait=False)
    assert window.unconsumed == 5
    for _ in range(7):
        window.leave()
    assert window.unconsumed == 0


async def test_a_decoupled_sender_thread_is_held_back_by_the_window():
    """Through a real Pending/Responder: the sender thread gets 2 responses ahead, no more."""
    request = InferenceRequest("m", [Tensor.from_numpy("X", np.zeros(1, np.float32))])
    request.response_window = 2
    pending = Pending(request, 1, lambda _request, response: response)
    window = pending.responder.window
    assert window is not None
    sent: list[int] = []

    def model_thread() -> None:
        for i in range(6):
            pending.responder.send(InferenceResponse(parameters={"i": i}), final=False)
            sent.append(i)
        pending.responder.send(None, final=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, model_thread)
        await trio.sleep(0.3)
        assert len(sent) == 2  # two unconsumed responses fill the window
        got = []
        async with pending.receive:
            async for response in pending.receive:
                got.append(response)
                window.leave()
                if response.final:
                    break
    assert [r.parameters.get("i") for r in got[:-1]] == list(range(6))
    assert got[-1].final and sent == list(range(6))
