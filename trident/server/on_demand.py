"""Models loaded on demand, within a budget, least recently used first out (explicit mode).

``--model-load-on-demand=true`` (with ``--model-control-mode=explicit``): a request for a model
the repository holds but has not loaded starts its load (requests that arrive meanwhile share
it) and waits for it, at most ``--model-load-on-demand-timeout-secs``. ``--model-budget-count``
and ``--model-budget-memory`` bound what the models loaded on demand hold: before such a load,
the least recently used of them with no request in flight are unloaded until the new one fits.
Models the user loaded (``--load-model``, the load API) are pinned: never evicted, outside the
budget.

This module holds the decisions (:func:`choose_evictions`, :func:`options_problem`) and the
bookkeeping (:class:`OnDemand`); :class:`trident.server.repository.ModelRepository` runs the
loads and unloads through its own load path (agents, cloud downloads, ensembles alike).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from trident.options import ServerOptions

#: seconds a model whose load on demand failed answers that failure before a request tries again
RETRY_AFTER_FAILURE_S = 5.0
#: the largest count budget accepted (a larger one is a typo, not a budget)
MAX_BUDGET_COUNT = 100_000
#: the smallest memory budget accepted (bytes): less holds no model
MIN_BUDGET_MEMORY = 1 << 20
#: the longest wait for a load on demand accepted (seconds)
MAX_TIMEOUT_S = 24 * 3600.0


def physical_memory() -> int | None:
    """The machine's memory in bytes (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def resident_bytes() -> int:
    """This process's resident set size in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def give_back_memory() -> None:
    """Return the free memory at the top of the heap and in free pages to the system
    (glibc's ``malloc_trim``; nothing elsewhere). Blocking: a worker thread calls it, after
    evictions, so that the unloaded models' memory leaves the resident set (``trident serve``
    keeps up to 128 MiB of freed memory otherwise) and the next load's RSS delta measures it."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def options_problem(options: ServerOptions) -> str | None:
    """What is wrong with the on-demand options (None: nothing): they need explicit mode and one
    process; budgets need on-demand loading and must be sensible."""
    on = options.model_load_on_demand
    budgets = [(flag, value) for flag, value in (("--model-budget-count", options.model_budget_count),
                                                 ("--model-budget-memory", options.model_budget_memory))
               if value is not None]
    if not on:
        if budgets:
            return f"{budgets[0][0]} needs --model-load-on-demand=true (the budget bounds the models loaded on demand)"
        return None
    if options.model_control_mode != "explicit":
        return (f"--model-load-on-demand=true needs --model-control-mode=explicit (in {options.model_control_mode} "
                "mode every model of the repository is loaded at start-up)")
    if options.workers != 1:
        return "--model-load-on-demand=true is not supported with --workers yet (one process only)"
    count, memory = options.model_budget_count, options.model_budget_memory
    if count is not None and not 1 <= count <= MAX_BUDGET_COUNT:
        return f"--model-budget-count must be from 1 to {MAX_BUDGET_COUNT} models, got {count}"
    if memory is not None:
        total = physical_memory()
        if memory < MIN_BUDGET_MEMORY:
            return f"--model-budget-memory must be at least {MIN_BUDGET_MEMORY} bytes (1 MiB), got {memory}"
        if total is not None and memory > total:
            return f"--model-budget-memory {memory} is more than this machine's memory ({total} bytes)"
    timeout = options.model_load_on_demand_timeout_secs
    if not 0 < timeout <= MAX_TIMEOUT_S:
        return f"--model-load-on-demand-timeout-secs must be more than 0 and at most {MAX_TIMEOUT_S:g}, got {timeout:g}"
    return None


@dataclass(frozen=True)
class Resident:
    """A model loaded on demand, as the eviction decision sees it."""

    name: str
    used: int  # the tick of its last request (higher: more recent)
    idle: bool  # no request in flight, and no serving ensemble uses it
    size: int  # resident bytes its load added (approximate; 0: not measured)


def choose_evictions(resident: list[Resident], count_budget: int | None, memory_budget: int | None,
                     incoming: int) -> tuple[list[str], bool]:
    """The models to unload, least recently used first, so that one more model of ``incoming``
    bytes fits the budgets, and whether that is enough (False: too many of them are busy; wait
    for one to go idle and decide again). Pure."""
    over_count = len(resident) + 1 - count_budget if count_budget is not None else 0
    over_bytes = sum(r.size for r in resident) + incoming - memory_budget if memory_budget is not None else 0
    victims: list[str] = []
    for r in sorted(resident, key=lambda r: r.used):
        if over_count <= 0 and over_bytes <= 0:
            break
        if not r.idle:
            continue
        victims.append(r.name)
        over_count -= 1
        over_bytes -= r.size
    # memory: a budget smaller than one model still loads it once nothing else is left to unload
    enough = over_count <= 0 and (over_bytes <= 0 or len(victims) == len(resident))
    return victims, enough


@dataclass
class DemandLoad:
    """One load on demand, shared by the requests that wait for it."""

    done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None
    unknown: bool = False  # the repository does not hold the model (404, not a failed load)


class OnDemand:
    """The bookkeeping of loads on demand: loads under way, recent failures, sizes, counters."""

    def __init__(self, options: ServerOptions) -> None:
        self.count_budget = options.model_budget_count
        self.memory_budget = options.model_budget_memory
        self.timeout_s = options.model_load_on_demand_timeout_secs
        #: model -> the load under way (requests for it wait on it)
        self.pending: dict[str, DemandLoad] = {}
        #: model -> (monotonic time, reason) of its last failed load on demand
        self.failures: dict[str, tuple[float, str]] = {}
        #: model -> resident bytes its last load on demand added
        self.sizes: dict[str, int] = {}
        #: one load (with the evictions that make room for it) at a time: budgets hold, sizes are measurable
        self.lock = trio.Lock()
        self.tick = 0
        # counters (trident_model_on_demand_* families)
        self.loads = 0
        self.load_failures = 0
        self.evictions = 0

    def recent_failure(self, name: str) -> str | None:
        """The reason of ``name``'s last load on demand if it failed less than
        :data:`RETRY_AFTER_FAILURE_S` ago."""
        failed = self.failures.get(name)
        if failed is None:
            return None
        if time.monotonic() - failed[0] >= RETRY_AFTER_FAILURE_S:
            del self.failures[name]
            return None
        return failed[1]

    def measured(self, name: str, delta: int) -> None:
        """Record what ``name``'s load added to the resident set. The delta alone undercounts
        when the load reuses memory an unload freed but the process kept (an evicted model's
        memory can be freed a little after its unload ends): the size is never taken below the
        model's last size, or, for a model not measured yet, the mean of the others. Conservative:
        the budget errs towards unloading one model too many."""
        self.sizes[name] = max(delta, self.estimate(name), 0)

    def estimate(self, name: str) -> int:
        """Bytes ``name`` is expected to take: its last measured size, else the mean of those known."""
        if name in self.sizes:
            return self.sizes[name]
        return sum(self.sizes.values()) // len(self.sizes) if self.sizes else 0
