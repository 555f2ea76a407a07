"""Heavy request work (large decodes, inflating, encoding) in worker threads, for both front ends.

:func:`run_sync` runs one job in a thread of the caller's limiter, awaited by the request's own
task: the thread has an owner, and a cancelled request still waits for it to return (nothing is
abandoned). While any such job runs, the interpreter's GIL switch interval is ``SWITCH_INTERVAL``
instead of the default 5 ms: a job running Python code then hands the GIL back to the event loop
within that, so other clients wait for it about as long, not 5 ms at every turn.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

SWITCH_INTERVAL = 0.0002  # seconds: the GIL switch interval while a job runs
LOW_PRIORITY = 19  # the nice value of a thread while it runs a job

_running = 0  # jobs running (counted on the event loop's thread, so no lock)
_saved_interval = 0.005


async def run_sync(fn: Callable[..., T], *args: object, limiter: trio.CapacityLimiter) -> T:
    """``fn(*args)`` in a worker thread of ``limiter``; returns or raises what it does.

    Waiting for a free thread can be cancelled; once the thread runs, cancellation takes effect
    when it returns.
    """
    global _running, _saved_interval
    if _running == 0:
        _saved_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL))
    _running += 1
    try:
        return await trio.to_thread.run_sync(_low_priority, fn, args, limiter=limiter)
    finally:
        _running -= 1
        if _running == 0:
            sys.setswitchinterval(_saved_interval)


def _low_priority(fn: Callable[..., T], args: tuple[object, ...]) -> T:
    """``fn(*args)`` at the lowest CPU priority (nice 19) for this thread while it runs, so
    the event loop's thread, when runnable, gets the core first (on a server pinned to one core
    the two otherwise share it in equal slices). The priority is restored afterwards where
    the process may raise it again (root or CAP_SYS_NICE); elsewhere the cached thread stays
    low, which suits the background work trio's threads do."""
    tid = threading.get_native_id()
    try:
        before = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, LOW_PRIORITY)
    except (OSError, AttributeError):  # not Linux, or not allowed
        before = None
    try:
        return fn(*args)
    finally:
        if before is not None and before != LOW_PRIORITY:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, before)
            except OSError:
                pass
