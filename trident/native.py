"""Compiled protocol modules: trident's sans-IO codecs built into C extensions with mypyc.

``python -m trident.native build`` compiles :data:`MODULES` of :mod:`trident.protocol` (the
HTTP/1.1 parser, the KServe JSON codec, the HTTP/2 framer and frame guard, gRPC framing and
the protobuf codec) and places the extension modules beside their sources, where Python
imports them instead of the ``.py`` files; ``clean`` removes them; ``status`` says what is
compiled. It needs the ``native`` extra (mypy, whose mypyc does the compiling) and a C
compiler with Python's headers; nothing changes at run time otherwise (same API, same
behaviour: the test suite runs against both forms in CI). The build records a hash of each
source (:data:`NATIVE_MANIFEST`): a source changed after the build makes
``import trident.protocol`` fail, naming it, until the next build or clean.

Each module is its own compilation unit (mypyc's ``separate`` mode), so that its runtime
library sits in the package beside it (``<module>__mypyc``) whatever the installation layout.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

#: the modules compiled, in :mod:`trident.protocol`
MODULES = ("datatypes", "json_slices", "kserve", "http1", "http2_headers", "http2", "h2_guard",
           "grpc_framing", "grpc_codec")

#: what :func:`build` writes beside the modules it compiled: their sources' hashes
NATIVE_MANIFEST = "_native.json"

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
modules = [f"trident/protocol/{name}.py" for name in sys.argv[1:]]
setup(name="trident-native", ext_modules=mypycify(["--ignore-missing-imports", *modules], separate=True,
      opt_level="3"), script_args=["build_ext", "--inplace", "--parallel", "2"])
"""


def stale_native_modules(directory: str) -> list[str]:
    """The modules of ``directory`` compiled from a source that has changed (or gone) since:
    the names in its build manifest whose ``.py`` no longer hashes as recorded. Empty when
    nothing is compiled there. Raises OSError or ValueError for an unreadable manifest."""
    path = os.path.join(directory, NATIVE_MANIFEST)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        recorded: dict[str, str] = json.load(f)
    stale = []
    for name, digest in sorted(recorded.items()):
        try:
            with open(os.path.join(directory, f"{name}.py"), "rb") as src:
                current = hashlib.sha256(src.read()).hexdigest()
        except FileNotFoundError:
            current = ""
        if current != digest:
            stale.append(name)
    return stale


def protocol_dir() -> str:
    """Where trident.protocol's sources are (an editable install's checkout, or site-packages)."""
    spec = importlib.util.find_spec("trident.protocol")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("trident.protocol is not importable from here: in a source checkout that is not "
                           "installed in editable mode (pip install -e), run this from another directory")
    return list(spec.submodule_search_locations)[0]


def compiled(directory: str) -> list[str]:
    """The modules of :data:`MODULES` that have an extension module in ``directory``."""
    return [name for name in MODULES if glob.glob(os.path.join(directory, f"{name}.*.so"))]


def build(directory: str | None = None) -> list[str]:
    """Compile :data:`MODULES` from the sources in ``directory`` (trident.protocol's, by default)
    and install the extension modules there; returns their names. The sources are copied into
    a scratch tree first, so that the modules compile under their own names
    (``trident.protocol.<name>``). Raises RuntimeError with the compiler's output when the
    build fails (nothing is installed then)."""
    directory = directory or protocol_dir()
    digests = {}
    with tempfile.TemporaryDirectory(prefix="trident-native-") as scratch:
        stage = os.path.join(scratch, "trident", "protocol")
        os.makedirs(stage)
        for init in (os.path.join(scratch, "trident", "__init__.py"), os.path.join(stage, "__init__.py")):
            open(init, "w").close()
        for name in MODULES:
            with open(os.path.join(directory, f"{name}.py"), "rb") as f:
                source = f.read()
            digests[name] = hashlib.sha256(source).hexdigest()
            with open(os.path.join(stage, f"{name}.py"), "wb") as f:
                f.write(source)
        done = subprocess.run([sys.executable, "-c", _SETUP, *MODULES], cwd=scratch, capture_output=True,
                              text=True, check=False)
        built = sorted(glob.glob(os.path.join(stage, "*.so")))
        if done.returncode != 0 or len(built) != 2 * len(MODULES):
            raise RuntimeError(f"mypyc build failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
        clean(directory)
        for path in built:
            shutil.copy2(path, os.path.join(directory, os.path.basename(path)))
    with open(os.path.join(directory, NATIVE_MANIFEST), "w", encoding="utf-8") as f:
        json.dump(digests, f, indent=1, sort_keys=True)
    return list(MODULES)


def clean(directory: str | None = None) -> list[str]:
    """Remove the compiled modules (and the manifest) from ``directory``; returns what was removed."""
    directory = directory or protocol_dir()
    removed = []
    for name in MODULES:
        for path in glob.glob(os.path.join(directory, f"{name}.*.so")) + glob.glob(
                os.path.join(directory, f"{name}__mypyc.*.so")):
            os.remove(path)
            removed.append(os.path.basename(path))
    manifest = os.path.join(directory, NATIVE_MANIFEST)
    if os.path.exists(manifest):
        os.remove(manifest)
    return removed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trident.native", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("build", "clean", "status"))
    args = ap.parse_args(argv)
    directory = protocol_dir()
    if args.action == "build":
        print(f"compiled into {directory}: {', '.join(build(directory))}")
    elif args.action == "clean":
        removed = clean(directory)
        print(f"removed {len(removed)} compiled file(s) from {directory}")
    else:
        names = compiled(directory)
        stale = stale_native_modules(directory)
        print(f"{directory}: {len(names)} of {len(MODULES)} modules compiled"
              + (f" ({', '.join(names)})" if names else "")
              + (f"; stale: {', '.join(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
