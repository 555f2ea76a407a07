"""trident.worker_threads: heavy jobs in worker threads, at low CPU priority, with a short GIL switch interval."""

from __future__ import annotations

import os
import sys
import threading

import trio

from trident import worker_threads


async def test_a_job_runs_at_the_lowest_priority_and_a_short_switch_interval() -> None:
    def probe() -> tuple[int, float, int]:
        tid = threading.get_native_id()
        return os.getpriority(os.PRIO_PROCESS, tid), sys.getswitchinterval(), tid

    before = sys.getswitchinterval()
    nice, interval, tid = await worker_threads.run_sync(probe, limiter=trio.CapacityLimiter(1))
    assert nice == worker_threads.LOW_PRIORITY
    assert abs(interval - min(before, worker_threads.SWITCH_INTERVAL)) < 1e-9
    assert sys.getswitchinterval() == before  # restored once no job runs
    assert tid != threading.get_native_id()  # not the loop's thread


async def test_a_job_returns_and_raises_what_it_does() -> None:
    limiter = trio.CapacityLimiter(2)
    assert await worker_threads.run_sync(sum, [1, 2, 3], limiter=limiter) == 6
    try:
        await worker_threads.run_sync(int, "x", limiter=limiter)
    except ValueError as e:
        assert "invalid literal" in str(e)
    else:
        raise AssertionError("the job's error was not raised")
