"""trident serve keeps freed tensor-sized blocks for reuse (trident.serve.tune_malloc)."""

from __future__ import annotations

import os
import subprocess
import sys

_SCRIPT = """
import resource, sys
from trident.serve import tune_malloc
tuned = tune_malloc(keep_freed=sys.argv[1] != "give-back") if sys.argv[1] != "plain" else []
def churn():
    for _ in range(50):
        a = bytearray(3 << 20)   # a request-sized block, touched, then freed
        b = bytes(a)
        del a, b
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, ",".join(tuned))
"""


def _run(mode: str, **env: str) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=120,
                         env={**environ, **env}, check=True)
    faults, _, tuned = out.stdout.strip().partition(" ")
    return int(faults), tuned


def test_freed_blocks_are_reused_without_page_faults():
    untuned, _ = _run("plain")
    tuned, settings = _run("tuned")
    assert settings == "MALLOC_MMAP_THRESHOLD=33554432,MALLOC_TRIM_THRESHOLD=134217728"
    assert untuned > 50 * 2 * 700  # glibc's defaults: every block is faulted in again (768 pages each)
    assert tuned < untuned / 20


def test_the_glibc_environment_variables_win():
    _, settings = _run("tuned", MALLOC_TRIM_THRESHOLD_="1000000")
    assert settings == "MALLOC_MMAP_THRESHOLD=33554432"


def test_models_on_demand_leave_the_trim_threshold_to_glibc():
    """With --model-load-on-demand an evicted model's memory must go back: only the mmap
    threshold is set."""
    _, settings = _run("give-back")
    assert settings == "MALLOC_MMAP_THRESHOLD=33554432"
