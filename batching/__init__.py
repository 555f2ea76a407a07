"""Schedulers: how queued requests become batches for a model version's instances."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trident.batching.scheduler import GreedyScheduler, Scheduler
from trident.protocol.generated.inference import ModelConfig

__all__ = ["Scheduler", "GreedyScheduler", "make_scheduler"]


def make_scheduler(config: ModelConfig, on_drop: Callable[[Any], None]) -> Scheduler:
    """The scheduler a model's config asks for.

    With ``dynamic_batching`` (and ``max_batch_size > 0``) queued requests are combined
    greedily up to ``max_batch_size``; otherwise each request runs alone, as Triton's default
    scheduler does.
    """
    batching = int(config.max_batch_size) if config.dynamic_batching is not None else 0
    return GreedyScheduler(batching, on_drop)
