"""Where a model is served under ``--workers``: in every worker, or in one that the others
forward its requests to.

A model is loaded in every worker unless it must not be copied N times. Its config says so with
the parameter ``trident_placement``:

* ``all``: every worker loads it (the default for a model whose instances run on the CPU);
* ``one``: one worker loads it, chosen by the model's name (CRC-32 modulo the workers), so that
  several large models spread over the workers;
* ``worker:<k>``: worker ``k`` (modulo the workers) loads it.

Without the parameter, a model with a ``KIND_GPU`` instance group is placed on worker 0 (one
process holds the GPU memory and the CUDA context, as in Triton), and any other is ``all``.
Ensembles are always ``all`` (they hold no instance; their steps go where each step's model is).
The other workers load the model's config only (what the placed worker finally loaded, for
metadata and readiness) and forward its requests (:mod:`trident.cluster.forward`).
"""

from __future__ import annotations

import zlib

from trident.errors import invalid_arg
from trident.protocol.generated.inference import ModelConfig, ModelInstanceGroupKind

PLACEMENT_PARAMETER = "trident_placement"


def placement_of(name: str, config: ModelConfig | None, count: int) -> int | None:
    """The worker ``name`` is placed on (None: every worker). Raises INVALID_ARG for a value of
    ``trident_placement`` that is none of the above."""
    if config is None or count < 2:
        return None
    if config.platform == "ensemble" or config.ensemble_scheduling is not None:
        return None
    param = config.parameters.get(PLACEMENT_PARAMETER)
    value = param.string_value.strip().lower() if param is not None else ""
    if value in ("", "auto"):
        gpu = any(group.kind == ModelInstanceGroupKind.GPU for group in config.instance_group)
        return 0 if gpu else None
    if value == "all":
        return None
    if value == "one":
        return zlib.crc32(name.encode()) % count
    if value.startswith("worker:"):
        try:
            return int(value[len("worker:"):]) % count
        except ValueError:
            pass
    raise invalid_arg(f"model '{name}': unknown {PLACEMENT_PARAMETER} '{value}' "
                      "(expected 'all', 'one' or 'worker:<index>')")
