"""The event loop's thread first: what heavy work in other threads does while it runs.

While any such job runs (a worker thread's job, see trident.server.worker_threads, or a block
of :func:`in_background`), the interpreter's GIL switch interval is ``SWITCH_INTERVAL`` instead
of the default 5 ms: a job running Python code hands the GIL back to the event loop within it,
so other clients wait for it about as long, not 5 ms at every turn; and the job's thread runs
at ``LOW_PRIORITY`` (nice 19), so the event loop's thread, when runnable, gets the core first
(on a server pinned to one core the two otherwise share it in equal slices).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH_INTERVAL = 0.0002  # seconds: the GIL switch interval while a job runs
LOW_PRIORITY = 19  # the nice value of a thread while it runs a job

_running = 0  # jobs running
_saved_interval = 0.005
_lock = threading.Lock()


def enter() -> None:
    """A job starts: the short switch interval from the first one on."""
    global _running, _saved_interval
    with _lock:
        if _running == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL))
        _running += 1


def leave() -> None:
    """A job ends: the interval the process had, once none runs."""
    global _running
    with _lock:
        _running -= 1
        if _running == 0:
            sys.setswitchinterval(_saved_interval)


@contextmanager
def in_background() -> Iterator[None]:
    """Heavy work a thread does for one request outside a worker thread's job (a Python model's large
    BYTES input made into objects, in the model's own thread) run as such a job runs: the
    short GIL switch interval meanwhile, and the thread at ``LOW_PRIORITY`` where its priority
    can be raised again after (root or CAP_SYS_NICE; elsewhere it keeps its own, since a model's
    thread must not stay low for the rest of its life). Raises nothing of its own."""
    enter()
    before = lower() if _can_restore() else None
    try:
        yield
    finally:
        restore(before)
        leave()


def lower() -> int | None:
    """This thread at ``LOW_PRIORITY``: the priority it had (for :func:`restore`), or None where
    it cannot be changed (not Linux, not allowed)."""
    try:
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, LOW_PRIORITY)
    except (OSError, AttributeError):
        return None
    return before


def restore(before: int | None) -> None:
    """This thread back at ``before`` (what :func:`lower` returned), where the process may raise
    it again (root or CAP_SYS_NICE); elsewhere it stays low."""
    if before is not None and before != LOW_PRIORITY:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), before)


@functools.cache
def _can_restore() -> bool:
    """Whether a thread of this process may lower its priority and raise it back (tried once,
    on a thread of its own: nice values are per thread on Linux)."""
    result: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        try:
            before = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, LOW_PRIORITY)
            os.setpriority(os.PRIO_PROCESS, tid, before)
            result.append(os.getpriority(os.PRIO_PROCESS, tid) == before)
        except (OSError, AttributeError):
            result.append(False)

    thread = threading.Thread(target=probe, name="trident.priority-probe")
    thread.start()
    thread.join()
    return bool(result) and result[0]
