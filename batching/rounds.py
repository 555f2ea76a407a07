"""Who shares this round of the trio loop: whether a request could have company in a batch.

trio runs its loop in rounds: one poll of the sockets, then one step of every task made
runnable (by that poll, or by the tasks of the round before), in a batch. A request decoded
in a round where its task is the only one runnable, and whose front end holds no other
request from the same read, can have no company in the queue before the batcher's own turn:
every other request is still in a socket, and the batcher would form a batch of that one
request. Triton's dynamic batcher with no queue delay and an idle instance executes it
alone at once, and so does trident then, in the caller's task, without the queue entry and
the hops to the batcher task and the worker task (:meth:`DynamicScheduler.claim`).

:class:`Round` learns the batch's size when the round starts, through a trio instrument hook
(``after_io_wait``, which runs once per round, after the poll has woken its tasks) reading
the length of trio's run queue, a private name. Where that name is missing (another trio),
:func:`current` gives a round that is never alone, and every batching request takes the
batcher, as before. A front end that holds several requests from one read (HTTP/2 streams
multiplexed on one connection) calls :meth:`Round.crowd`: none of them is alone then.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import trio

__all__ = ["Round", "current"]


class Round(trio.abc.Instrument):
    """This trio run's rounds (one per run: :func:`current`)."""

    def __init__(self, runq: deque[Any] | None) -> None:
        self._runq = runq
        self.size = 0  # tasks in the round's batch (0: not tracked)
        self.crowded = False

    @property
    def tracking(self) -> bool:
        """Whether trio's run queue is reachable (else :meth:`alone` is always False)."""
        return self._runq is not None

    def after_io_wait(self, timeout: float) -> None:
        """trio's hook: a round starts, its batch is what the run queue holds now."""
        runq = self._runq
        self.size = len(runq) if runq is not None else 0
        self.crowded = False

    def alone(self) -> bool:
        """Whether the calling task is the only one of this round, no task has been woken for
        the next round yet and no front end holds further requests from this round's reads."""
        return self.size == 1 and not self._runq and not self.crowded

    def shared(self) -> bool:
        """Whether another task runs in this round besides the caller (before or after it), or
        has been woken for the next one: what the caller leaves for the end of the round is
        then done together with theirs. False where the round is not tracked."""
        return self.size > 1 or bool(self._runq) or self.crowded

    def crowd(self) -> None:
        """A front end holds more than one request from a read of this round: none is alone."""
        self.crowded = True


_CURRENT: trio.lowlevel.RunVar[Round | None] = trio.lowlevel.RunVar("trident_round", default=None)


def current() -> Round:
    """This trio run's :class:`Round`, its instrument added on first use (it stays for the
    run). Must be called from the trio thread; raises RuntimeError outside a trio run."""
    round_ = _CURRENT.get()
    if round_ is not None:
        return round_
    round_ = Round(_run_queue())
    if round_.tracking:
        trio.lowlevel.add_instrument(round_)
    _CURRENT.set(round_)
    return round_


def _run_queue() -> deque[Any] | None:
    """trio's run queue (a private name), or None where this trio has no such thing."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT

        runq = GLOBAL_RUN_CONTEXT.runner.runq
    except (ImportError, AttributeError):
        return None
    return runq if isinstance(runq, deque) else None
