"""GPUs visible to this server, for instance-group defaults and KIND_GPU validation.

Counted through NVML (``pynvml``, the ``gpu`` extra) without importing any framework, and
limited by ``CUDA_VISIBLE_DEVICES`` as CUDA would limit them. No NVML, no driver or no GPU: 0.
"""

from __future__ import annotations

import functools
import os


@functools.cache
def gpu_count() -> int:
    """How many GPUs instances may be placed on (cached for the life of the process)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:  # no pynvml, no driver, no device
        return 0
    return visible(count, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible(count: int, cuda_visible_devices: str | None) -> int:
    """Devices CUDA exposes given ``CUDA_VISIBLE_DEVICES`` (unset: all ``count``)."""
    if cuda_visible_devices is None:
        return count
    n = 0
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if not entry or entry == "-1":
            break  # CUDA stops at the first invalid entry
        n += 1
    return min(n, count)
