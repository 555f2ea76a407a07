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
"""

from __future__ import annotations

import gc


def settle(*, unloaded: bool = False) -> None:
    """Collect the garbage there is now, then freeze the rest of the heap (``unloaded``: a model
    went away: unfreeze first, so that its cycles among the frozen objects are collected too)."""
    if unloaded:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
