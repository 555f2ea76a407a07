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
the length of trio's run queue, a private name (:func:`trident.trio_private.run_queue`). Where
that name is missing (another trio),
:func:`current` gives a round that is never alone, and every batching request takes the
batcher, as before. A front end that holds several requests from one read (HTTP/2 streams
multiplexed on one connection) calls :meth:`Round.crowd`: none of them is alone then.

The same hook's other end, ``before_io_wait`` (once per round, before the poll), runs what
front ends leave for the end of a round (:meth:`Round.at_end`: the HTTP server's write of the
responses the round made, together) and then, when the server asked for it
(:meth:`Round.busy_poll`), polls for a short while before letting the loop sleep. Where the
server waits for one client's next request, falling asleep and being woken is a large part of
each request's time (in a VM each wake-up is an interrupt across CPUs and back); a request
that arrives within the window is taken without either. The window is adaptive: it is
spent only while the loop's previous wait ended within it (a miss turns it off until a wait
is short again), so a server with sparse requests never spins, and one that spins wastes at
most one window per miss. It is not spent while a model call runs on an instance thread
(:attr:`Round.away`): that thread may need the GIL (or the CPU) the poll would hold. The poll
watches trio's own epoll descriptor (a private name; elsewhere there is no busy polling).
"""

from __future__ import annotations

import contextlib
import select
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from trident import trio_private

__all__ = ["Round", "current"]


class Round(trio.abc.Instrument):
    """This trio run's rounds (one per run: :func:`current`)."""

    def __init__(self, runq: deque[Any] | None) -> None:
        self._runq = runq
        self.size = 0  # tasks in the round's batch (0: not tracked)
        self.crowded = False
        self._ends: list[Callable[[], None]] = []  # the end-of-round work, in registration order
        # busy polling's poll of trio's epoll fd and the loop's wake-up (trio's token), once on
        self._poller: tuple[Callable[[int], list[Any]], Callable[[Callable[[], None]], None]] | None = None
        self.window = 0.0  # seconds of busy polling before the loop sleeps (0: off)
        self._spin = True  # the previous wait ended within the window: poll before this one
        self._waiting_since = 0.0
        self.away = 0  # calls running on threads of the server's: no busy polling meanwhile
        self.spins = 0  # windows spent polling (the ones that caught a request: ``caught``)
        self.caught = 0

    @property
    def tracking(self) -> bool:
        """Whether trio's run queue is reachable (else :meth:`alone` is always False)."""
        return self._runq is not None

    def before_io_wait(self, timeout: float) -> None:
        """trio's hook: the round is over and the loop is about to poll for up to ``timeout``
        seconds. Runs the end-of-round work, then busy-polls when that is on (see the module
        docstring). Never raises (trio would drop the instrument): an end-of-round callable
        must not raise."""
        for end in self._ends:
            end()
        if self.window and timeout > 0:
            self._waiting_since = now = time.perf_counter()
            if self._spin and self._poller is not None and not self.away:
                poll, wake = self._poller
                self.spins += 1
                until = now + min(self.window, timeout)
                while True:
                    if poll(0):
                        self.caught += 1
                        return
                    if time.perf_counter() >= until:
                        # trio then waits for the ``timeout`` it computed before this poll:
                        # a wake-up of its own makes it look again at once, so that no timer
                        # fires late by the time spent here (a window, or more when another
                        # thread took the GIL meanwhile)
                        with contextlib.suppress(trio.RunFinishedError):  # the run is ending
                            wake(_nothing)
                        return

    def after_io_wait(self, timeout: float) -> None:
        """trio's hook: a round starts, its batch is what the run queue holds now."""
        runq = self._runq
        self.size = len(runq) if runq is not None else 0
        self.crowded = False
        if self.window and timeout > 0:
            self._spin = time.perf_counter() - self._waiting_since <= self.window

    def at_end(self, end: Callable[[], None]) -> Callable[[], None]:
        """Call ``end`` at the end of every round (before the loop polls), after the ones
        registered before it, until the returned callable removes it. ``end`` must not raise."""
        self._ends.append(end)
        return lambda: self._ends.remove(end)

    def busy_poll(self, window: float) -> bool:
        """Poll up to ``window`` seconds for I/O before the loop sleeps (0: never); False when
        this trio's poller cannot be reached (nothing changes then)."""
        if window <= 0:
            self.window = 0.0
            return True
        if self._poller is None:
            fd = trio_private.epoll_fd()
            if fd is None:
                return False
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            self._poller = (poller.poll, trio.lowlevel.current_trio_token().run_sync_soon)
        self.window = window
        self._spin = True
        return True

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
    round_ = Round(trio_private.run_queue())
    trio.lowlevel.add_instrument(round_)
    _CURRENT.set(round_)
    return round_


def _nothing() -> None:
    """Run by the loop after a busy poll that caught nothing (see Round.before_io_wait)."""
