"""Schedulers: how queued requests become batches for a model version's instances.

Modules: :mod:`.policy` (priority levels, queue policies), :mod:`.dynamic` (batch-forming
decisions), :mod:`.batcher` (the trio scheduler), :mod:`.rate_limiter`, :mod:`.cache`
(response cache), :mod:`.warmup`, :mod:`.sequence` (the sequence batcher) with :mod:`.state`
(implicit state), :mod:`.ensemble` (ensemble steps), :mod:`.scheduler` (the seam).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trident.batching.batcher import DynamicScheduler
from trident.batching.dynamic import BatchRules, shape_key
from trident.batching.policy import Priorities
from trident.batching.scheduler import Scheduler
from trident.batching.sequence import SequenceScheduler
from trident.protocol.generated.inference import ModelConfig

__all__ = ["Scheduler", "DynamicScheduler", "SequenceScheduler", "make_scheduler"]


def make_scheduler(config: ModelConfig, on_drop: Callable[[Any], None], *, rate_limiter: Any = None,
                   model_dir: Path | None = None) -> Scheduler:
    """The scheduler a model's config asks for.

    With ``dynamic_batching`` Triton's dynamic batcher (preferred sizes, queue delay, priority
    levels, queue policies, ordering); otherwise Triton's default scheduler: each request runs
    alone, in arrival order, on the next free instance. ``rate_limiter`` (``--rate-limit``)
    gates every execution on its instance's resources. With ``sequence_batching`` the sequence
    batcher (:mod:`.sequence`; ``model_dir`` holds ``initial_state/`` files). Raises
    TritonError(INVALID_ARG) for a bad sequence_batching config.
    """
    if config.sequence_batching is not None:
        return SequenceScheduler(config, on_drop, model_dir=model_dir)
    batching = config.dynamic_batching
    return DynamicScheduler(
        BatchRules.from_config(config),
        Priorities.from_config(batching),
        on_drop,
        key=shape_key(config),
        preserve_ordering=bool(batching and batching.preserve_ordering),
        rate_limiter=rate_limiter,
    )
