"""trio's private internals, in one place, behind a small interface.

Three measured gains need names trio does not export (see the README's "Throughput" figures):

* :func:`run_queue`: the run queue of the current trio run, whose length after each poll says
  whether a request is alone in its round (:mod:`trident.batching.rounds`: the dynamic batcher
  runs a request that no other could join without the hops to its tasks);
* :func:`epoll_fd`: the descriptor of the run's epoll, which busy polling watches
  (``--busy-poll-us``);
* :func:`fifo_task_order`: each batch of runnable tasks run first come, first served (trio
  reverses a batch half the time; p99 at 64 connections 17.0 ms -> 12.5 ms).

Each is reached here only. Where a trio release moves or renames one, the server keeps
working without the gain (the callers get None or False, and ``trident serve`` logs
:func:`missing` at start-up), while ``tests/unit/trident/test_trio_private.py`` fails, naming
what is gone: that test is why ``pyproject.toml`` pins trio to the releases it passes on.
"""

from __future__ import annotations

import random
import select
from collections import deque
from typing import Any

__all__ = ["TrioChanged", "epoll_fd", "fifo_task_order", "missing", "require", "run_queue"]


class TrioChanged(RuntimeError):
    """A private name trident relies on is not where it was (another trio release)."""


def _runner() -> Any:
    """The current run's runner. Raises ImportError or AttributeError where trio changed, and
    AttributeError outside a run (the context then has no runner)."""
    from trio._core._run import GLOBAL_RUN_CONTEXT

    return GLOBAL_RUN_CONTEXT.runner


def run_queue() -> deque[Any] | None:
    """The current trio run's run queue (the tasks to run in the next batch), or None where
    this trio has none there. Call inside a trio run."""
    try:
        runq = _runner().runq
    except (ImportError, AttributeError):
        return None
    return runq if isinstance(runq, deque) else None


def epoll_fd() -> int | None:
    """The descriptor of the current trio run's epoll, or None where it has none there (another
    platform's I/O manager, or another trio). Call inside a trio run."""
    try:
        fd = _runner().io_manager._epoll.fileno()
    except (ImportError, AttributeError):
        return None
    return fd if isinstance(fd, int) else None


class _FirstComeFirstServed(random.Random):
    """trio's scheduler reverses each batch of runnable tasks when ``random() < 0.5`` and then
    takes tasks from the end of the batch: a ``random()`` of 0 always reverses, so each batch
    runs in the order its tasks became runnable. Anything else drawn from it (the clock's
    start offset) gets the low end of its range."""

    def random(self) -> float:
        return 0.0


def fifo_task_order() -> bool:
    """Run each batch of runnable trio tasks first come, first served, for the whole process.

    trio runs a batch of ready tasks (those woken by one poll of the sockets, say) in arrival
    order half the time and in reverse order otherwise, so that code cannot rely on an order.
    Under load that doubles the tail: a connection whose request came first in one batch and
    was served first can be served last in the next one, after a whole round of the others
    (measured with wrk at 64 connections: p99 17.0 ms with trio's order, 12.5 ms first come
    first served, at the same p50). Both orders are allowed by trio's contract; this picks
    the fair one through trio's scheduler's random source, a private name: when it is not
    there (another trio) or trio runs deterministically for tests, nothing changes and this
    returns False. Call before ``trio.run``. Raises nothing.
    """
    try:
        from trio._core import _run
    except ImportError:
        return False
    current = getattr(_run, "_r", None)
    if isinstance(current, _FirstComeFirstServed):
        return True  # applied already
    if type(current) is not random.Random or getattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True):
        return False
    _run._r = _FirstComeFirstServed()
    return True


def missing() -> list[str]:
    """The private names of this list that this trio lacks (empty: every gain is on). Call
    inside a trio run (the run queue and the epoll belong to a run)."""
    gone = []
    try:
        from trio._core import _run
    except ImportError:
        return ["trio._core._run"]
    if type(getattr(_run, "_r", None)) not in (random.Random, _FirstComeFirstServed):
        gone.append("trio._core._run._r (the scheduler's random source)")
    if not isinstance(getattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING", None), bool):
        gone.append("trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING (a bool)")
    if run_queue() is None:
        gone.append("trio._core._run.GLOBAL_RUN_CONTEXT.runner.runq (a deque)")
    if hasattr(select, "epoll") and epoll_fd() is None:  # Linux: trio's I/O manager is an epoll
        gone.append("trio._core._run.GLOBAL_RUN_CONTEXT.runner.io_manager._epoll")
    return gone


def require() -> None:
    """Raise :class:`TrioChanged` naming every private name of :func:`missing` (the test's
    check; the server itself goes on without them). Call inside a trio run."""
    gone = missing()
    if gone:
        import trio

        raise TrioChanged(f"trio {trio.__version__} lacks what trident reaches into: {'; '.join(gone)}; "
                          "trident's pin on trio in pyproject.toml excludes this release until "
                          "trident.trio_private is brought up to date")
