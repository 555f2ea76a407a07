"""Third-party backends through the ``trident.backends`` entry-point group (a dist-info on sys.path,
which is what an installed package is)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from trident import backends
from trident.backends import Backend, get_backend
from trident.errors import Code, TritonError


@pytest.fixture
def site(tmp_path: Path):
    root = tmp_path / "site"
    (root / "demo_backend_pkg").mkdir(parents=True)
    (root / "demo_backend_pkg" / "__init__.py").write_text(textwrap.dedent('''
        from trident.backends.base import Backend

        class DemoBackend(Backend):
            name = "demo"

            def load_instance(self, ctx):
                raise RuntimeError("the demo backend only exercises entry-point discovery")

        NOT_A_BACKEND = object()
        '''))
    info = root / "demo_backend_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-backend-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[trident.backends]\ndemo = demo_backend_pkg:DemoBackend\nbroken = demo_backend_pkg:NOT_A_BACKEND\n"
        "missing = demo_backend_pkg.nope:Backend\n")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in ("demo", "broken", "missing"):
        backends._cache.pop(name, None)
    sys.modules.pop("demo_backend_pkg", None)


def test_entry_point_backends_load_by_name(site: Path) -> None:
    demo = get_backend("demo")
    assert isinstance(demo, Backend) and type(demo).__name__ == "DemoBackend"
    assert get_backend("demo") is demo  # resolved once


def test_bad_entry_points_are_clear_errors(site: Path) -> None:
    with pytest.raises(TritonError, match="backend 'broken' failed to load: .*is not a trident.backends.Backend") as info:
        get_backend("broken")
    assert info.value.code == Code.UNSUPPORTED
    with pytest.raises(TritonError, match="backend 'missing' failed to load: No module named") as info:
        get_backend("missing")
    assert info.value.code == Code.UNSUPPORTED
    with pytest.raises(TritonError, match="unknown backend 'absent'"):
        get_backend("absent")
