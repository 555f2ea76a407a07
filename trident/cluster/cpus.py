"""How many CPUs this process may use, as a container sees it: ``--workers auto``.

Two limits apply, and the smaller wins:

* the affinity mask (``sched_getaffinity``: ``taskset``, cpusets, Kubernetes' static CPU manager);
* the cgroup CPU quota (Kubernetes ``resources.limits.cpu``, ``docker run --cpus``): cgroup v2's
  ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``), cgroup v1's ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us`` (quota -1: none), the smallest along the path from the process's cgroup
  up to the root of the mounted hierarchy.

A fractional quota is rounded down (at least one): a worker more than the quota pays for itself
in throttling, not in throughput (1.5 CPUs gives one worker). :func:`quota_cpus` and
:func:`cpus_from` are pure; :func:`available_cpus` reads the machine and raises nothing.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def quota_cpus(quota_us: int | None, period_us: int | None) -> float | None:
    """CPUs a CFS quota allows (None: no quota). ``quota_us`` None or negative means none."""
    if quota_us is None or period_us is None or quota_us < 0 or period_us <= 0:
        return None
    return quota_us / period_us


def cpus_from(affinity: int, quotas: list[float]) -> int:
    """Workers for ``affinity`` usable CPUs and the quotas found (CPUs each): the smallest of
    them, a fractional quota rounded down, never less than one."""
    best = max(1, affinity)
    for quota in quotas:
        best = min(best, max(1, math.floor(quota + 1e-9)))
    return best


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"150000 100000"``) as CPUs; None for no limit
    or text that is not of that form."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        return quota_cpus(int(parts[0]), int(parts[1]) if len(parts) > 1 else 100_000)
    except ValueError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(v2 path, v1 cpu controller path) of this process from /proc/self/cgroup's text."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(root: Path, path: str) -> list[Path]:
    """``root/path`` and each folder above it up to ``root`` (those that exist)."""
    here = root / path.lstrip("/")
    out = []
    while True:
        if here.is_dir():
            out.append(here)
        if here == root or root not in here.parents:
            break
        here = here.parent
    return out


def cgroup_quotas(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> list[float]:
    """The CPU quotas (CPUs each) that bound this process, from the cgroup file systems under
    ``root``. Empty when there is none or nothing can be read."""
    text = proc_cgroup if proc_cgroup is not None else _read(Path("/proc/self/cgroup"))
    if text is None:
        return []
    v2, v1 = _cgroup_paths(text)
    quotas: list[float] = []
    if v2 is not None and (root / "cgroup.controllers").exists():
        for folder in _ancestors(root, v2):
            raw = _read(folder / "cpu.max")
            found = parse_cpu_max(raw) if raw is not None else None
            if found is not None:
                quotas.append(found)
    if v1 is not None:
        for mount in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
            if not mount.is_dir():
                continue
            for folder in _ancestors(mount, v1):
                quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
                try:
                    found = quota_cpus(int(quota or ""), int(period or ""))
                except ValueError:
                    found = None
                if found is not None:
                    quotas.append(found)
            break
    return quotas


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (os.cpu_count() where there is no such call)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_cpus() -> int:
    """The CPUs this process may use: its affinity mask bounded by its cgroup quota. At least 1."""
    return cpus_from(affinity_cpus(), cgroup_quotas())
