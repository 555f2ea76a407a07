"""Type-check trident as Python imports it: ``python .ci/typecheck.py [mypy options]``.

The source tree is not the package's layout: pyproject's ``package-dir`` maps ``protocol/`` to
``trident.protocol`` (and ``backends/``, ``batching/``, ``agents/`` alike), which mypy does not
read. Checked folder by folder, an import of ``trident.protocol`` (or of the other three) from
``trident/`` finds nothing and, with ``ignore_missing_imports``, is typed ``Any``: every call
across those packages goes unchecked. This builds the installed layout as a tree of links under
``.typecheck/`` (git ignores it) and runs mypy on the package ``trident`` there, with pyproject's
settings; paths in its messages are the package's (``trident/protocol/kserve.py`` is
``protocol/kserve.py`` here). Exits with mypy's status.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.path.join(ROOT, ".typecheck")


def package_dirs(pyproject: str) -> dict[str, str]:
    """``{subpackage: folder}`` for the subpackages of trident that live in folders of their own
    (pyproject's ``[tool.setuptools] package-dir``), e.g. ``{"protocol": "protocol"}``."""
    with open(pyproject, "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name.split(".", 1)[1]: folder for name, folder in mapping.items() if name.startswith("trident.")}


def build_tree(root: str, tree: str) -> str:
    """The link tree of the package (made anew); returns the folder to run mypy in."""
    shutil.rmtree(tree, ignore_errors=True)
    package = os.path.join(tree, "trident")
    os.makedirs(package)
    mapped = package_dirs(os.path.join(root, "pyproject.toml"))
    for entry in sorted(os.listdir(os.path.join(root, "trident"))):
        if entry in mapped or entry == "__pycache__":
            continue
        os.symlink(os.path.join(root, "trident", entry), os.path.join(package, entry))
    for name, folder in mapped.items():
        os.symlink(os.path.join(root, folder), os.path.join(package, name))
    return tree


def main(argv: list[str]) -> int:
    cwd = build_tree(ROOT, TREE)
    command = [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
               "--cache-dir", os.path.join(TREE, ".mypy_cache"), *argv, "-p", "trident"]
    return subprocess.run(command, cwd=cwd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
