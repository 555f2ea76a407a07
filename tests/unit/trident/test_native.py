"""trident.native: the compiled protocol modules' bookkeeping (the build itself runs in CI:
.ci/run compiles the modules and runs the protocol and front-end suites against them)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from trident import native


def _tree(tmp_path, modules=("kserve", "http1")):
    for name in modules:
        (tmp_path / f"{name}.py").write_text(f"# {name}\n")
        (tmp_path / f"{name}.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
        (tmp_path / f"{name}__mypyc.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    digests = {name: hashlib.sha256((tmp_path / f"{name}.py").read_bytes()).hexdigest() for name in modules}
    (tmp_path / native.NATIVE_MANIFEST).write_text(json.dumps(digests))
    return tmp_path


def test_nothing_compiled_is_never_stale(tmp_path):
    (tmp_path / "kserve.py").write_text("x = 1\n")
    assert native.stale_native_modules(str(tmp_path)) == []
    assert native.compiled(str(tmp_path)) == []


def test_a_source_changed_or_removed_after_the_build_is_stale(tmp_path):
    tree = _tree(tmp_path)
    assert native.stale_native_modules(str(tree)) == []
    assert native.compiled(str(tree)) == ["kserve", "http1"]  # in MODULES order
    (tree / "http1.py").write_text("# edited\n")
    assert native.stale_native_modules(str(tree)) == ["http1"]
    (tree / "kserve.py").unlink()
    assert native.stale_native_modules(str(tree)) == ["http1", "kserve"]


def test_clean_removes_the_compiled_files_and_the_manifest_only(tmp_path):
    tree = _tree(tmp_path)
    (tree / "other.cpython-311-x86_64-linux-gnu.so").write_bytes(b"not ours")
    removed = native.clean(str(tree))
    assert len(removed) == 4  # each module's extension and its runtime library
    assert sorted(os.listdir(tree)) == ["http1.py", "kserve.py", "other.cpython-311-x86_64-linux-gnu.so"]
    assert native.stale_native_modules(str(tree)) == []


def test_an_unreadable_manifest_is_an_error_not_a_pass(tmp_path):
    (tmp_path / native.NATIVE_MANIFEST).write_text("{not json")
    with pytest.raises(ValueError):
        native.stale_native_modules(str(tmp_path))


def test_status_names_what_is_compiled_in_the_installed_package():
    out = subprocess.run([sys.executable, "-m", "trident.native", "status"], capture_output=True, text=True,
                         check=True).stdout
    assert f"of {len(native.MODULES)} modules compiled" in out
    assert native.protocol_dir() in out
