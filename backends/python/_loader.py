"""Import a ``model.py`` so that many models (and many loads of one model) live side by side.

Each import gets a unique synthetic package whose ``__path__`` is the version folder, and
the model file is imported as a submodule of it (Triton imports ``<version>/model.py`` as
``<version>.model``). So:

* two models' ``model.py`` never share a module, and a reload executes the file afresh;
* relative imports (``from .utils import f``) resolve inside the version folder;
* absolute imports of sibling files (``import utils``) work because the version folder is at
  the front of ``sys.path`` while the file executes; sibling modules imported that way are
  then taken out of ``sys.modules`` (the model keeps its references), so another model's
  ``utils.py`` is not shadowed by this one;
* while a model is loaded its version folder stays at the end of ``sys.path``, as in
  Triton's stub, so an ``import`` inside ``initialize``/``execute`` still finds its siblings.

Instances load in parallel worker threads: every change to ``sys.path`` and ``sys.modules``
happens under one lock. ``sys.path`` is never changed in place but replaced by a new list: an
import in another thread (a framework backend importing its package while a model file
executes) walks the list it started with, and an entry removed under it would make it skip
one (a ``No module named ...`` for an installed package).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from trident.backends.python import pb_utils

_lock = threading.RLock()
_path_refs: dict[str, int] = {}  # folder -> loaded modules using it
_appended: set[str] = set()  # folders this module put on sys.path (and so may remove)
_counter = itertools.count(1)
_PREFIX = "_trident_python_model_"


@dataclass
class LoadedModule:
    """A model file imported under a unique package; give it back with :func:`release`."""

    package: str
    module: ModuleType
    path_entry: str | None  # the folder kept on sys.path while loaded (None: not kept)
    released: bool = False


def _identifier(text: str) -> str:
    ident = re.sub(r"\W", "_", text)
    return ident if ident and not ident[0].isdigit() else f"_{ident}"


def _inside(module: ModuleType, folder: str) -> bool:
    origins: list[str] = []
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
        origins.append(file)
    else:  # namespace packages have only a __path__
        try:
            origins.extend(str(p) for p in getattr(module, "__path__", ()))
        except TypeError:
            return False
    prefix = folder + os.sep
    return any(os.path.realpath(o).startswith(prefix) for o in origins)


def _drop_package(package: str) -> None:
    for name in [n for n in list(sys.modules) if n == package or n.startswith(package + ".")]:
        del sys.modules[name]


def import_model_file(model_file: Path, label: str, *, keep_path: bool) -> LoadedModule:
    """Import ``model_file`` under a fresh package name.

    ``label`` names the package (for readable tracebacks), ``keep_path`` keeps the folder on
    ``sys.path`` until :func:`release`. Raises whatever executing the file raises (after
    undoing its changes to ``sys.modules`` and ``sys.path``).
    """
    pb_utils.register()
    folder = os.path.realpath(model_file.parent)
    with _lock:
        package = f"{_PREFIX}{_identifier(label)}_{next(_counter)}"
        before = set(sys.modules)
        pkg_spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        pkg = importlib.util.module_from_spec(pkg_spec)
        pkg.__path__ = [folder]
        sys.modules[package] = pkg
        name = f"{package}.{_identifier(model_file.stem)}"
        spec = importlib.util.spec_from_file_location(name, model_file)
        if spec is None or spec.loader is None:
            del sys.modules[package]
            raise ImportError(f"cannot import '{model_file}' as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path = [folder, *sys.path]
        try:
            spec.loader.exec_module(module)
        except BaseException:
            _drop_package(package)
            raise
        finally:
            _remove_path(folder)  # unless the model took it out itself
            for added in set(sys.modules) - before:
                mod = sys.modules.get(added)
                ours = added == package or added.startswith(package + ".")
                if not ours and mod is not None and _inside(mod, folder):
                    del sys.modules[added]
        setattr(pkg, model_file.stem, module)
        path_entry: str | None = None
        if keep_path:
            path_entry = folder
            if _path_refs.get(folder, 0) == 0 and folder not in sys.path:
                sys.path = [*sys.path, folder]
                _appended.add(folder)
            _path_refs[folder] = _path_refs.get(folder, 0) + 1
        return LoadedModule(package, module, path_entry)


def release(loaded: LoadedModule) -> None:
    """Forget an imported model: its package leaves ``sys.modules``, its folder ``sys.path``
    once no other loaded module uses it (idempotent)."""
    with _lock:
        if loaded.released:
            return
        loaded.released = True
        _drop_package(loaded.package)
        folder = loaded.path_entry
        if folder is not None:
            count = _path_refs.get(folder, 0) - 1
            if count > 0:
                _path_refs[folder] = count
            else:
                _path_refs.pop(folder, None)
                if folder in _appended:
                    _appended.discard(folder)
                    _remove_path(folder)


def _remove_path(folder: str) -> None:
    """Take the first ``folder`` entry out of ``sys.path`` (a new list; none there: nothing)."""
    path = sys.path
    if folder in path:
        i = path.index(folder)
        sys.path = path[:i] + path[i + 1:]
