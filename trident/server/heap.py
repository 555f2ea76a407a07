"""The server's long-lived Python heap is kept out of the cyclic garbage collector's way.

After start-up, trident's process holds some 60,000 objects that live as long as it does
(modules, models, configs). Every full collection walked all of them: about 30 ms with the
event loop stopped, every couple of thousand requests under load (a batching model at 64
connections: p99 37.9 ms, against 11.2 ms once they are frozen). :func:`settle` freezes them
(``gc.freeze``): collections then walk only what was allocated since.

Frozen objects are never collected, so what a repository change leaves behind must be found
first: after start-up and after a load, :func:`settle` collects the objects not frozen yet
(cheap) before freezing the new model's; once unloaded versions have stopped (an unload, or the
old versions of a reload) it unfreezes everything and runs one full collection, so that
reference cycles of the unloaded model are freed, then freezes again. Each call blocks the loop
for one collection; repository changes only (never per request; not during shutdown).

The youngest generation is collected after :data:`YOUNG_THRESHOLD` net container allocations
instead of CPython's 700. Under load, the requests in flight hold a few thousand young objects
at any moment, so 700 was crossed every couple of dozen requests and each collection walked all
of them (``add_sub`` over gRPC and HTTP at 8 and 64 connections: 8,015 collections of 97 us in
48 s of load, about 2% of the CPU with the older generations they fed). Requests free their
objects by reference counting, so a higher threshold leaves little garbage waiting: at most that
many container objects.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
"""Net container allocations that start a collection of the youngest generation."""


def settle(*, unloaded: bool = False) -> None:
    """Collect the garbage there is now, then freeze the rest of the heap (``unloaded``: a model
    went away: unfreeze first, so that its cycles among the frozen objects are collected too)."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    if unloaded:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
