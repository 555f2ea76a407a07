"""The Python backend's model-file loader and ``sys.path`` (backends/python/_loader.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from trident.backends.python import _loader


def test_sys_path_is_replaced_never_changed_in_place(tmp_path: Path):
    # an import running in another thread walks the list it started with: an entry inserted
    # or removed under it shifts the rest, and it can skip an installed package's folder
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    model = tmp_path / "model.py"
    model.write_text("import helper\nimport sys\nFOLDER_FIRST = sys.path[0]\n")
    walked = sys.path
    before = list(walked)
    loaded = _loader.import_model_file(model, "loader_test", keep_path=True)
    try:
        assert loaded.module.helper.VALUE == 7
        assert loaded.module.FOLDER_FIRST == str(tmp_path.resolve())
        assert sys.path[-1] == str(tmp_path.resolve())  # kept while loaded
        assert walked == before  # the list an import started with did not change under it
    finally:
        walked = sys.path
        kept = list(walked)
        _loader.release(loaded)
    assert walked == kept and str(tmp_path.resolve()) not in sys.path and sys.path == before
