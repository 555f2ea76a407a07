"""trident.backends.settings: the one table of the ``--backend-config`` settings the built-in
backends read, held to its rule by reading the backends' source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trident.backends import _BUILTIN, settings
from trident.backends.settings import ALIASES, SETTINGS, reads, setting, unread

BACKENDS = Path(settings.__file__).parent


def _sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(BACKENDS.rglob("*.py")) if path.name != "settings.py"}


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _keys_read(node: ast.AST) -> set[str]:
    """The keys of the setting(...) calls under ``node`` (each must be a literal)."""
    keys = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and _name(call.func) == "setting":
            key = call.args[1] if len(call.args) > 1 else None
            assert isinstance(key, ast.Constant) and isinstance(key.value, str), \
                f"setting() with a key that is not a literal at line {call.lineno}"
            keys.add(key.value)
    return keys


def _module_files(module: str) -> list[Path]:
    """A built-in backend's source: its module, and the whole subpackage it lives in."""
    rel = Path(*module.split(".")[2:])
    if len(rel.parts) > 1:
        return sorted((BACKENDS / rel.parts[0]).rglob("*.py"))
    return [BACKENDS / rel.with_suffix(".py")]


def test_backends_read_their_settings_only_through_the_table():
    """No ``backend_config[...]`` / ``backend_config.get(...)``: every read is a setting() call."""
    found = []
    for path, tree in _sources().items():
        for node in ast.walk(tree):
            target = node.value if isinstance(node, ast.Subscript) else (
                node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "items", "keys", "values", "pop") else None)
            if target is not None and "backend_config" in _name(target):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, f"--backend-config settings read beside trident.backends.settings.setting: {found}"


def test_every_key_a_backend_reads_is_in_the_table_for_that_backend():
    trees = _sources()
    helpers: dict[str, set[str]] = {}  # function name -> keys it reads itself (any module)
    for tree in trees.values():
        for name, fn in _functions(tree).items():
            keys = _keys_read(fn)
            if keys:
                helpers[name] = helpers.get(name, set()) | keys
    for key in set().union(*helpers.values()):
        assert key in SETTINGS, f"setting '{key}' is read but not in SETTINGS"
    for backend, (module, _, _) in _BUILTIN.items():
        read: set[str] = set()
        for path in _module_files(module):
            tree = trees[path]
            read |= _keys_read(tree)
            for call in ast.walk(tree):  # the shared helpers it calls (backends._common)
                if isinstance(call, ast.Call) and _name(call.func) in helpers:
                    read |= helpers[_name(call.func)]
        assert read == set(reads(backend)), f"{backend}: reads {sorted(read)}, the table says {reads(backend)}"


def test_the_table_names_only_built_in_backends():
    named = {backend for backends in SETTINGS.values() for backend in backends}
    assert named <= set(_BUILTIN) and set(ALIASES) <= set(_BUILTIN)
    assert all(ALIASES.get(b, b) in named or not reads(b) for b in _BUILTIN)


def test_setting_refuses_a_key_not_in_the_table():
    assert setting({"default-max-batch-size": "8"}, "default-max-batch-size") == "8"
    assert setting(None, "execution-mode") is None
    with pytest.raises(KeyError, match="not in trident.backends.settings.SETTINGS"):
        setting({"version": "2"}, "version")


BUILTIN = ["fil", "onnxruntime", "openvino", "python", "pytorch", "tensorrt", "tree"]


@pytest.mark.parametrize(("config", "expected"), [
    ({"python": {"shm-default-byte-size": "1048576", "execution-mode": "process"}}, []),
    ({"": {"default-max-batch-size": "8", "execution-mode": "process"}}, []),  # each read by some backend
    ({"fil": {"default-max-batch-size": "2"}, "onnxruntime": {"enable-global-threadpool": "0"}}, []),
    ({"python": {"shm-growth-byte-size": "1"}}, [("python,shm-growth-byte-size=1", "the python backend reads no "
                                                 "setting 'shm-growth-byte-size' (it reads: execute-timeout-secs, "
                                                 "execution-mode, shm-bytes, shm-default-byte-size)")]),
    ({"pytorch": {"enable-global-threadpool": "1"}}, [("pytorch,enable-global-threadpool=1", "the pytorch "
                                                       "backend reads no setting 'enable-global-threadpool' (it "
                                                       "reads: default-max-batch-size)")]),
    ({"tensorflow": {"version": "2"}}, [("tensorflow,version=2", "trident has no 'tensorflow' backend (its "
                                         "backends: fil, onnxruntime, openvino, python, pytorch, scale, tensorrt, "
                                         "tree)")]),
    ({"scale": {"factor": "2"}}, []),  # another package's backend: what it reads is its own business
    ({"": {"backend-directory": "/opt"}}, [("backend-directory=/opt", "no backend reads a global setting "
                                            "'backend-directory' (the settings trident's backends read: "
                                            "default-max-batch-size, enable-global-threadpool, "
                                            "execute-timeout-secs, execution-mode, shm-bytes, "
                                            "shm-default-byte-size)")]),
])
def test_unread_names_each_setting_nothing_reads(config, expected):
    assert unread(config, BUILTIN, ["scale"]) == expected
