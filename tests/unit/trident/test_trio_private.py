"""trio's private names that trident reaches into (trident.trio_private) are where they were.

This is the alarm for a trio release that moves them: the server would go on without the
gains (requests alone in their round, busy polling, first-come-first-served batches), so this
test fails instead, naming what is gone, and pyproject.toml pins trio to the releases on
which it passes. It checks what each name does, not only that it exists.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from collections import deque

import pytest
import trio
import trio.testing

from trident import trio_private


async def test_nothing_trident_reaches_into_is_missing():
    trio_private.require()  # raises TrioChanged, naming what this trio lacks
    assert trio_private.missing() == []


async def test_the_run_queue_holds_the_tasks_woken_for_the_next_batch():
    runq = trio_private.run_queue()
    assert isinstance(runq, deque)
    event = trio.Event()
    woken: list[int] = []

    async def waiter() -> None:
        await event.wait()
        woken.append(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        before = len(runq)
        event.set()  # the waiter is runnable: it is in the queue until the next batch runs
        assert len(runq) == before + 1
    assert woken == [1]


@pytest.mark.skipif(not hasattr(select, "epoll"), reason="trio polls with epoll on Linux only")
async def test_the_epoll_descriptor_is_the_runs_poller():
    fd = trio_private.epoll_fd()
    assert isinstance(fd, int) and fd >= 0
    target = os.readlink(f"/proc/self/fd/{fd}")
    assert target == "anon_inode:[eventpoll]"
    a, b = socket.socketpair()
    with a, b:
        poller = select.poll()
        poller.register(fd, select.POLLIN)

        async def wait() -> None:
            await trio.lowlevel.wait_readable(a)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not poller.poll(0)  # nothing trio waits for is ready
            b.send(b"x")  # no checkpoint: trio's loop has not polled since
            assert poller.poll(1000)  # trio's epoll has an event: busy polling would see it
            nursery.cancel_scope.cancel()


def test_fifo_task_order_replaces_the_schedulers_random_source():
    script = ("from trident import trio_private\n"
              "from trio._core import _run\n"
              "print(trio_private.fifo_task_order(), type(_run._r).__name__, _run._r.random())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "_FirstComeFirstServed", "0.0"]


def test_a_changed_trio_is_named_loudly(monkeypatch):
    async def main() -> None:
        monkeypatch.setattr(trio_private, "run_queue", lambda: None)
        with pytest.raises(trio_private.TrioChanged, match=r"trio .* lacks .*runq") as caught:
            trio_private.require()
        assert "pyproject.toml" in str(caught.value)

    trio.run(main)
