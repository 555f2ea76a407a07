"""``trident perf`` end to end: the real command against a real trident (and the real Triton
when ../shared/bench and its venv are there), over HTTP, gRPC, gRPC streaming, system shared
memory and in-process, with short windows; the report, CSV columns and bad input.

Figures are not asserted beyond being measured (no timing asserts): a level's throughput is
positive, its request count matches what the server counted, the columns are perf_analyzer's.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import RunningServer, start_server
from tests.e2e.python_models import write_model
from trident.perf.report import CSV_COLUMNS

FAST = ["-p", "200", "-r", "3", "-s", "1000"]  # three 200 ms windows, stable by construction
SHARED = Path(__file__).resolve().parents[3] / "shared" / "bench"
TRITON_VENV = Path(os.environ.get("ANCHORS", "/tmp/anchors")) / "venv-triton"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trident.options import EXAMPLE_REPOSITORY

    root = tmp_path_factory.mktemp("perf-repo")
    for name in ("add_sub", "identity_fp32", "bytes_echo"):
        shutil.copytree(EXAMPLE_REPOSITORY / name, root / name)
    write_model(root, "repeater")
    return root


@pytest.fixture(scope="module")
def server(repo: Path):
    s = start_server("--allow-client-shm=true", repo=repo)
    yield s
    s.stop()


def perf(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trident", "perf", *args], capture_output=True, text=True,
                          timeout=timeout)


def ok(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_http_concurrency_sweep_with_csv_and_server_breakdown(server: RunningServer, tmp_path: Path):
    out = tmp_path / "r.csv"
    text = ok(perf("-m", "add_sub", "-u", server.http_url, "--concurrency-range", "1:3:2", "-f", str(out),
                   "--json-file", str(tmp_path / "r.json"), *FAST))
    assert "*** Measurement Settings ***" in text and "Using synchronous calls for inference" in text
    assert "Request concurrency: 1" in text and "Request concurrency: 3" in text
    assert "Avg HTTP time:" in text and "Avg request latency:" in text and "compute infer" in text
    assert "Inferences/Second vs. Client Average Batch Latency" in text
    header = out.read_text().split("\n")[0].split(",")
    assert header == ["Concurrency", *CSV_COLUMNS]
    table = rows(out)
    assert [r["Concurrency"] for r in table] == ["1", "3"]
    for r in table:
        assert float(r["Inferences/Second"]) > 0 and int(r["p99 latency"]) >= int(r["p50 latency"]) > 0
        assert int(r["Server Compute Infer"]) > 0
    levels = json.loads((tmp_path / "r.json").read_text())
    # the server saw the requests of the reported windows (it counts a few in flight at the edges)
    for level in levels:
        assert level["server"]["request"] > 0 and level["count"] > 0


def test_grpc_async_request_rate_poisson_count_windows(server: RunningServer, tmp_path: Path):
    out = tmp_path / "r.csv"
    text = ok(perf("-m", "identity_fp32", "--shape", "INPUT0:8", "-i", "grpc", "-a", "-u", server.grpc_url,
                   "--request-rate-range", "40:80:40", "--request-distribution", "poisson",
                   "--measurement-mode", "count_windows", "--measurement-request-count", "20", "-r", "3",
                   "-s", "1000", "-f", str(out)))
    assert 'Using "count_windows" mode' in text and "poisson distribution" in text
    assert "Request Rate: 40" in text and "Request Rate: 80" in text and "Avg gRPC time:" in text
    table = rows(out)
    assert list(table[0])[0] == "Request Rate" and [r["Request Rate"] for r in table] == ["40", "80"]
    assert all(float(r["Inferences/Second"]) > 0 for r in table)


def test_streaming_a_decoupled_model_with_an_input_data_file(server: RunningServer, tmp_path: Path):
    data = tmp_path / "d.json"
    data.write_text(json.dumps({"data": [{"IN": [3], "DELAY": [0.0]},
                                         {"IN": {"content": [2], "shape": [1]}, "DELAY": [0.0]}]}))
    text = ok(perf("-m", "repeater", "-i", "grpc", "--streaming", "-u", server.grpc_url, "--input-data", str(data),
                   "--concurrency-range", "2", *FAST))
    assert "(streaming)" in text and "Request concurrency: 2" in text
    count = int(text.split("Successful request count: ")[1].split()[0])
    assert count > 0
    p = perf("-m", "repeater", "-i", "grpc", "-u", server.grpc_url, "--input-data", str(data), *FAST)
    assert p.returncode == 1 and "is decoupled" in p.stderr


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_system_shared_memory(server: RunningServer, protocol: str):
    url = server.http_url if protocol == "http" else server.grpc_url
    text = ok(perf("-m", "add_sub", "-i", protocol, "-u", url, "--shared-memory", "system", "-b", "2", *FAST))
    assert "Using system shared memory" in text and "Batch size: 2" in text
    assert float(text.split("Throughput: ")[1].split()[0]) > 0
    status = json.loads(urllib.request.urlopen(f"http://{server.http_url}/v2/systemsharedmemory/status").read())
    assert status == []  # unregistered afterwards
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("trident_perf_")]


def test_bytes_inputs_and_workers(server: RunningServer):
    text = ok(perf("-m", "bytes_echo", "--shape", "INPUT0:3", "--string-length", "7", "-u", server.http_url,
                   "--workers", "2", "--concurrency-range", "4", *FAST))
    assert "Load generator: 2 processes" in text


def test_in_process(repo: Path, tmp_path: Path):
    out = tmp_path / "r.csv"
    text = ok(perf("--in-process", str(repo), "-m", "add_sub", "--concurrency-range", "1:2", "-f", str(out), *FAST))
    assert "Service Kind: trident in-process" in text and "Request concurrency: 2" in text
    assert "Process CPU (server and load together)" in text
    assert [r["Concurrency"] for r in rows(out)] == ["1", "2"]
    p = perf("--in-process", str(repo), "-m", "nope", *FAST)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "nope" in p.stderr


def test_collect_metrics(server: RunningServer, tmp_path: Path):
    out = tmp_path / "r.csv"
    text = ok(perf("-m", "add_sub", "-u", server.http_url, "--collect-metrics", "--metrics-url", server.metrics_url,
                   "--metrics-interval", "100", "-f", str(out), *FAST))
    assert "Server Prometheus Metrics:" in text and "Avg CPU Utilization:" in text
    assert "Avg GPU Utilization: none" in text
    header = out.read_text().split("\n")[0].split(",")
    assert header[-4:] == ["Avg GPU Utilization", "Avg GPU Power Usage", "Max GPU Memory Usage", "Total GPU Memory"]


def test_latency_threshold_percentile_and_stability(server: RunningServer):
    text = ok(perf("-m", "add_sub", "-u", server.http_url, "--concurrency-range", "1:4", "-l", "0.001",
                   "--percentile", "95", "-p", "150", "-r", "3", "-s", "0.0001"))
    assert "Stabilizing using p95 latency" in text and "Latency limit: 0.001 msec" in text
    assert "Request concurrency: 1" in text and "Request concurrency: 2" not in text
    assert "Measured latency went over the set limit of 0.001 msec." in text
    assert "WARNING: no stable measurement within 3 windows" in text
    assert "Client p95 Batch Latency" in text


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("case", ["unknown model", "bad shape", "unreachable", "unreachable grpc", "unsupported",
                                  "cuda", "bad data file", "batch too large"])
def test_bad_input_is_a_one_line_error(server: RunningServer, tmp_path: Path, case: str):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"data\": [}")
    args = {
        "unknown model": ["-m", "nope", "-u", server.http_url],
        "bad shape": ["-m", "add_sub", "-u", server.http_url, "--shape", "INPUT0:3"],
        "unreachable": ["-m", "add_sub", "-u", f"127.0.0.1:{_closed_port()}"],
        "unreachable grpc": ["-m", "add_sub", "-i", "grpc", "-u", f"127.0.0.1:{_closed_port()}"],
        "unsupported": ["-m", "add_sub", "-u", server.http_url, "--binary-search"],
        "cuda": ["-m", "add_sub", "-u", server.http_url, "--shared-memory", "cuda"],
        "bad data file": ["-m", "add_sub", "-u", server.http_url, "--input-data", str(bad)],
        "batch too large": ["-m", "add_sub", "-i", "grpc", "-u", server.grpc_url, "-b", "9"],
    }[case]
    p = perf(*args, *FAST, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.startswith("trident perf: error: ") and p.stderr.count("\n") == 1, p.stderr
    expected = {"unknown model": "nope", "bad shape": "does not match", "unreachable": "cannot reach",
                "unreachable grpc": "cannot reach", "unsupported": "UNSUPPORTED: --binary-search",
                "cuda": "UNSUPPORTED", "bad data file": "not valid JSON", "batch too large": "max_batch_size"}[case]
    assert expected in p.stderr


def test_the_server_survives_and_counts(server: RunningServer):
    """After every run above the server still answers, and its statistics add up."""
    stats = json.loads(urllib.request.urlopen(f"http://{server.http_url}/v2/models/add_sub/stats").read())
    assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == 0
    assert server.proc.poll() is None


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory):
    script = SHARED / "run_triton.sh"
    if not script.exists() or not (TRITON_VENV / "bin" / "python").exists():
        pytest.skip("the real Triton is not installed here (../shared/bench/run_triton.sh and its venv)")
    repo = tmp_path_factory.mktemp("triton-repo")
    subprocess.run(["bash", str(SHARED / "make_triton_repo.sh"), str(repo)], check=True, capture_output=True)
    ports = [_closed_port() for _ in range(3)]
    env = {**os.environ, "HTTP_PORT": str(ports[0]), "GRPC_PORT": str(ports[1]), "METRICS_PORT": str(ports[2]),
           "TRITON_WORK": str(tmp_path_factory.mktemp("triton-work"))}
    log = open(tmp_path_factory.mktemp("triton-log") / "log", "w")
    proc = subprocess.Popen(["bash", str(script), str(TRITON_VENV), str(repo)], stdout=log, stderr=log, env=env)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/health/ready", timeout=1)
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"Triton exited: {proc.returncode}")
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("Triton did not become ready")
    yield ports
    proc.terminate()
    proc.wait(30)
    log.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_against_the_real_triton(triton, protocol: str, tmp_path: Path):
    port = triton[0] if protocol == "http" else triton[1]
    out = tmp_path / "r.csv"
    text = ok(perf("-m", "add_sub", "-i", protocol, "-u", f"127.0.0.1:{port}", "--concurrency-range", "1:2",
                   "-f", str(out), *FAST))
    assert "Avg request latency:" in text and len(rows(out)) == 2
    text = ok(perf("-m", "identity_fp32", "--shape", "INPUT0:16", "-i", protocol, "-u", f"127.0.0.1:{port}",
                   "--shared-memory", "system", *FAST))
    assert float(text.split("Throughput: ")[1].split()[0]) > 0
