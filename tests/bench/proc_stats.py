"""What the benchmark scripts read about a server process from /proc (Linux). Not collected by pytest."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (its threads included, children not)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def tree_pids(root: int) -> list[int]:
    """``root`` and its live descendants (Triton's python backend stubs), from /proc/PID/task/TID/children."""
    pids, frontier = [root], [root]
    while frontier:
        pid = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in pids:
                    pids.append(kid)
                    frontier.append(kid)
    return pids


def memory_kib(pid: int) -> dict[str, int]:
    """The memory lines of /proc/PID/status in KiB (``VmRSS``, ``RssAnon``, ``RssShmem``, ...); {} once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return {line.split(":", 1)[0]: int(line.split()[1]) for line in f
                    if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:", "VmHWM:"))}
    except (OSError, ValueError, IndexError):
        return {}
