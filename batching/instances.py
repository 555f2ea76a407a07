"""Instance groups: which instances a config asks for, and whether a config change is only counts.

``instance_group [ { name, kind, count, gpus, rate_limiter } ... ]`` (completed by
:func:`trident.config.complete_defaults`: named, ``KIND_AUTO`` resolved, ``count`` defaulted)
becomes one :class:`InstanceSpec` per instance: ``count`` instances per device of a
``KIND_GPU`` group (its ``gpus``), ``count`` instances of a ``KIND_CPU`` / ``KIND_MODEL``
group on device 0. Instances are named ``<group>_<k>``, ``k`` counting within the group, so
the names of the surviving instances stay the same when a count changes.

A config whose only difference is instance counts (:func:`counts_only_change`) is applied
to a serving model without reloading it: new instances are loaded and warmed up, removed ones
finish their current batch first.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from trident.batching.rate_limiter import Needs
from trident.protocol.generated.inference import ModelConfig, ModelInstanceGroupKind


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One instance a config asks for."""

    name: str
    group: str
    kind: str  # KIND_CPU | KIND_GPU | KIND_MODEL
    device: int
    needs: Needs


def instance_specs(config: ModelConfig) -> list[InstanceSpec]:
    """The instances of ``config``, group by group (one CPU instance when it lists none)."""
    specs: list[InstanceSpec] = []
    for index, group in enumerate(config.instance_group):
        kind = "KIND_" + ModelInstanceGroupKind(group.kind).name  # betterproto2 strips the prefix
        if kind == "KIND_AUTO":
            kind = "KIND_CPU"
        devices = list(group.gpus) if kind == "KIND_GPU" and group.gpus else [0]
        name = group.name or f"{config.name}_{index}"
        k = 0
        for device in devices:
            for _ in range(max(1, group.count)):
                specs.append(InstanceSpec(f"{name}_{k}", name, kind, int(device), Needs.of_group(group, int(device))))
                k += 1
    if not specs:
        specs.append(InstanceSpec(f"{config.name}_0", config.name, "KIND_CPU", 0, Needs()))
    return specs


def counts_only_change(old: ModelConfig, new: ModelConfig) -> bool:
    """True when ``new`` differs from ``old`` in instance-group counts and nothing else."""
    if len(old.instance_group) != len(new.instance_group):
        return False
    a, b = copy.deepcopy(old), copy.deepcopy(new)
    for group in (*a.instance_group, *b.instance_group):
        group.count = 0
    return bool(a == b) and old != new
