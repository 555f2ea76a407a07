"""trident.server.heap: what settle() leaves the garbage collector with."""

from __future__ import annotations

import gc
import weakref

from trident.server import heap


def test_settle_raises_the_young_generations_threshold_and_keeps_the_older_ones() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        heap.settle()
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 11, 12)
        assert gc.get_freeze_count() > 0  # what was alive is frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_reference_cycle_made_after_settle_is_still_collected() -> None:
    before = gc.get_threshold()
    try:
        heap.settle()

        class Node:
            other: object = None

        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
        assert ref() is not None  # only the cycle holds it now
        gc.collect(0)
        assert ref() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
