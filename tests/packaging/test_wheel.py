"""Build the wheel and check it: every subpackage, the example repository, lazy framework imports."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"trident": "trident", "protocol": "trident/protocol", "backends": "trident/backends",
           "batching": "trident/batching", "agents": "trident/agents"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(ROOT)], check=True, timeout=300)
    (path,) = out.glob("trident_inference-*.whl")  # the distribution name (the import name is trident)
    return zipfile.ZipFile(path)


def _source_packages() -> set[str]:
    found = set()
    for folder, prefix in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "example_repository" in rel.parts or "__pycache__" in rel.parts:
                continue
            found.add("/".join([prefix, *rel.parts]))
    return found


def test_every_subpackage_is_in_the_wheel(wheel):
    names = set(wheel.namelist())
    missing = [p for p in sorted(_source_packages()) if f"{p}/__init__.py" not in names]
    assert not missing, f"subpackages missing from the wheel (add them to pyproject packages): {missing}"
    assert not any(n.startswith(("protocol/", "backends/", "batching/", "agents/")) for n in names)


def test_example_repository_and_data_files_are_in_the_wheel(wheel):
    names = set(wheel.namelist())
    for model in ("identity_fp32", "add_sub", "bytes_echo"):
        assert f"trident/example_repository/{model}/config.pbtxt" in names
        assert f"trident/example_repository/{model}/1/model.py" in names
    assert "trident/protocol/model_config.proto" in names
    entry = [n for n in names if n.endswith("entry_points.txt")]
    scripts = wheel.read(entry[0]).decode() if entry else ""
    assert "trident = trident.cli:main" in scripts and "tritonserver = trident.cli:tritonserver_main" in scripts
    metadata = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert metadata and "Name: trident-inference" in wheel.read(metadata[0]).decode()


def test_import_backends_imports_no_framework():
    code = ("import sys, trident.backends, trident.server\n"
            "bad = [m for m in ('torch', 'onnxruntime', 'openvino', 'tensorrt', 'xgboost', 'lightgbm', 'sklearn')"
            " if m in sys.modules]\n"
            "assert not bad, bad\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_python_m_trident_is_the_cli():
    out = subprocess.run([sys.executable, "-m", "trident", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("trident ")
