"""The GPU check script (tests/bench/bench_gpu_backends.py) on a CPU: its arguments, every check
either running or skipping with its reason (here a check that needs CUDA never runs: it skips
for the missing device, or for the time limit on a host that has one), the result files, and
the served-against-offline machinery on the CPU with a small net (its figures mean nothing)."""

from __future__ import annotations

import datetime
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_gpu_backends.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_backends", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu_backends"] = module
    spec.loader.exec_module(module)
    return module


def test_arguments(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    args = bench.parse_args([])
    assert (args.seconds, args.time_limit, args.only, args.device, args.model) == (6.0, 420.0, "", "cuda", "resnet50")
    assert args.out == bench.RESULTS
    assert bench.parse_args(["--only", "ort,resnet", "--time-limit", "30"]).only == "ort,resnet"
    for bad in (["--only", "ort,nope"], ["--time-limit", "0"], ["--seconds", "-1"], ["--device", "tpu"]):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(bad)
        assert e.value.code == 2
    assert "unknown check(s) ['nope']" in capsys.readouterr().err


def test_every_check_runs_or_skips_with_a_reason_and_the_results_are_written(bench: ModuleType, tmp_path: Path) -> None:
    gpu_checks = [c.key for c in bench.CHECKS if c.key != "env"]
    code = bench.main(["--out", str(tmp_path), "--time-limit", "0.5", "--card", "test-card"])
    assert code == 0
    (json_path,) = tmp_path.glob("*-test-card-gpu-backends.json")
    (md_path,) = tmp_path.glob("*-test-card-gpu-backends.md")
    assert json_path.stem == md_path.stem and json_path.name[:10] == f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}"
    doc = json.loads(json_path.read_text())
    assert doc["card"] == "test-card" and doc["args"]["time_limit"] == 0.5
    checks = {c["key"]: c for c in doc["checks"]}
    assert list(checks) == ["env", *gpu_checks]
    assert checks["env"]["status"] == "ran" and "torch" in checks["env"]["figures"]
    for key in gpu_checks:
        assert checks[key]["status"] == "skipped" and checks[key]["reason"], checks[key]
    md = md_path.read_text()
    assert md.startswith("# GPU checks: test-card, ")
    for key in gpu_checks:
        assert f"\n| {key} | skipped | " in md and f"[{key}]: skipped" in md


def test_result_files_format(bench: ModuleType, tmp_path: Path) -> None:
    outcomes = [bench.Outcome("resnet", "ResNet", "ran", "", 12.345, ["a line"], {"ratio": 0.93, "formed": [(64, 10)]}),
                bench.Outcome("trt", "TensorRT", "failed", "AssertionError: a | b", 1.0, ["Traceback ..."]),
                bench.Outcome("ort", "ORT", "skipped", "no CUDA device")]
    now = datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC)
    md, js = bench.write_results(outcomes, tmp_path / "results", "nvidia-h200", {"seconds": 6.0, "only": ""}, now)
    assert (md.name, js.name) == ("2026-01-02-nvidia-h200-gpu-backends.md", "2026-01-02-nvidia-h200-gpu-backends.json")
    doc = json.loads(js.read_text())
    assert doc["date"] == "2026-01-02T03:04:00+00:00" and doc["card"] == "nvidia-h200"
    assert doc["checks"][0]["figures"] == {"ratio": 0.93, "formed": [[64, 10]]}
    assert [c["status"] for c in doc["checks"]] == ["ran", "failed", "skipped"]
    text = md.read_text()
    assert "| resnet | ran | 12.3 s |  |" in text
    assert "| trt | failed | 1.0 s | AssertionError: a / b |" in text  # a table cell never breaks the row
    assert "## ResNet [resnet]: ran\n\na line" in text and "--seconds 6.0" in text


def test_served_against_offline_machinery_on_the_cpu(bench: ModuleType, tmp_path: Path) -> None:
    code = bench.main(["--out", str(tmp_path), "--only", "resnet", "--device", "cpu", "--model", "small",
                       "--seconds", "1.5", "--card", "cpu-test"])
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    (check,) = doc["checks"]
    assert code == 0 and check["status"] == "ran", check
    figures = check["figures"]
    assert figures["max_abs_diff"] == 0.0 and figures["model"] == "small" and figures["served_images_s"] > 0
    assert set(figures["offline_images_s"]) == {"1", "4", "8"} and figures["ratio"] > 0
    assert sum(count for _, count in figures["formed"]) > 0
