"""trident.priority: heavy work outside the event loop's thread runs with the short GIL switch
interval and, where the thread's priority can be raised back, at nice 19; both are restored
after, also when the work raises, and nested blocks restore once the last ends."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from trident import priority


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_in_background_sets_and_restores_interval_and_priority():
    interval, nice = sys.getswitchinterval(), _nice()
    seen: list[tuple[float, int]] = []
    with priority.in_background():
        seen.append((sys.getswitchinterval(), _nice()))
        with priority.in_background():
            seen.append((sys.getswitchinterval(), _nice()))
        seen.append((sys.getswitchinterval(), _nice()))
    assert all(abs(i - min(interval, priority.SWITCH_INTERVAL)) < 1e-9 for i, _ in seen)
    if priority._can_restore():
        assert all(n == priority.LOW_PRIORITY for _, n in seen[:2])
    assert sys.getswitchinterval() == interval and _nice() == nice


def test_in_background_restores_when_the_work_raises():
    interval, nice = sys.getswitchinterval(), _nice()
    with pytest.raises(ZeroDivisionError), priority.in_background():
        1 / 0  # noqa: B018
    assert sys.getswitchinterval() == interval and _nice() == nice


def test_can_restore_is_what_this_process_may_do():
    may = priority._can_restore()
    assert isinstance(may, bool)
    if os.geteuid() == 0 and may:  # root with CAP_SYS_NICE: a thread goes back to its priority
        done: list[int] = []
        thread = threading.Thread(target=lambda: (os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19),
                                                  os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 0),
                                                  done.append(_nice())))
        thread.start()
        thread.join()
        assert done == [0]
