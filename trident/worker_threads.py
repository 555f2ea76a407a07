"""Heavy request work (large decodes, inflating, encoding) in worker threads, for both front ends.

:func:`run_sync` runs one job in a thread of the caller's limiter, awaited by the request's own
task: the thread has an owner, and a cancelled request still waits for it to return (nothing is
abandoned). While any such job runs, the interpreter's GIL switch interval is ``SWITCH_INTERVAL``
instead of the default 5 ms: a job running Python code then hands the GIL back to the event loop
within that, so other clients wait for it about as long, not 5 ms at every turn.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

SWITCH_INTERVAL = 0.0002  # seconds: the GIL switch interval while a job runs

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
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)
    finally:
        _running -= 1
        if _running == 0:
            sys.setswitchinterval(_saved_interval)
