"""Run ``python -m trident ...`` from another checkout of trident (a git worktree of an older
commit, say) with this environment's packages, for before/after comparisons. Not collected by
pytest::

    git worktree add /tmp/before <commit>
    python tests/bench/serve_checkout.py /tmp/before serve --model-repository R --http-port 9340 ...

An editable install maps ``trident`` and its subpackages (``trident.protocol`` is ``protocol/``,
``trident.backends`` is ``backends/``, ...) to its own checkout, so ``PYTHONPATH=<checkout>``
is not enough: it swaps ``trident/`` only, and the other packages still come from the installed
checkout. This points the install's mapping at the other checkout before anything is imported.
Needs trident installed in editable mode (``pip install -e .``).
"""

from __future__ import annotations

import glob
import importlib
import os
import runpy
import site
import sys


def _finder() -> object:
    for directory in site.getsitepackages():
        for path in glob.glob(os.path.join(directory, "__editable___trident_inference_*_finder.py")):
            return importlib.import_module(os.path.basename(path)[:-3])
    raise SystemExit("trident is not installed in editable mode (pip install -e .)")


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    checkout = os.path.abspath(sys.argv[1])
    finder = _finder()
    mapping: dict[str, str] = finder.MAPPING  # type: ignore[attr-defined]
    installed = os.path.dirname(mapping["trident"])
    for name, path in list(mapping.items()):
        mapping[name] = os.path.join(checkout, os.path.relpath(path, installed))
    sys.argv = ["trident", *sys.argv[2:]]
    runpy.run_module("trident", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
