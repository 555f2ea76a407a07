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
import signal
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
    # a model answered here and now (no batching, run inline): the closed loop still lets the
    # loop and the measuring thread run (it once held the loop for good)
    text = ok(perf("--in-process", str(repo), "-m", "identity_fp32", "--shape", "INPUT0:16", "--concurrency-range",
                   "1:2", *FAST, timeout=40))
    assert "Concurrency: 1, throughput:" in text and "Concurrency: 2, throughput:" in text
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
    if case == "cuda":
        from tests.e2e.test_cuda_shared_memory import NO_GPU

        if NO_GPU is None:
            pytest.skip("this host has a GPU: test_cuda_shared_memory.py runs perf with CUDA shared memory")
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
                "cuda": "UNSUPPORTED: --shared-memory=cuda: CUDA shared memory needs ", "bad data file": "not valid JSON", "batch too large": "max_batch_size"}[case]
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
    proc = subprocess.Popen(["bash", str(script), str(TRITON_VENV), str(repo), "--model-control-mode=explicit",
                             "--load-model=*"], stdout=log, stderr=log, env=env)
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


# ---------------------------------------------------------------------------- trident analyze

ANALYZE_FAST = ["-p", "200", "-r", "3", "-s", "1000", "--concurrency", "1,2"]


def analyze(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trident", "analyze", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_analyze_starts_a_trident_and_writes_a_loadable_choice(repo: Path, tmp_path: Path):
    out = tmp_path / "report"
    p = analyze("--model-repository", str(repo), "-m", "add_sub", "--instance-count", "1,2", "--dynamic-batching",
                "on", "--max-queue-delay-us", "0,100", "--latency-budget-ms", "1000", "--output-dir", str(out),
                *ANALYZE_FAST)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "4/4 instances=2,max_batch=8,dynamic(delay=100us)" in p.stdout
    results = json.loads((out / "results.json").read_text())["models"]["add_sub"]
    assert len(results["points"]) == 8 and results["best"] is not None and results["front"]
    best = results["best"]
    assert best["throughput"] == max(pt["throughput"] for pt in results["points"])  # the budget is generous
    for png in ("throughput_vs_concurrency.png", "latency_vs_throughput.png"):
        assert (out / "add_sub" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"add_sub/{png}" in (out / "index.html").read_text()
    report = (out / "report.md").read_text()
    assert "| config | concurrency | infer/sec | p50 us | p99 us | Pareto |" in report and "Chosen:" in report
    # the chosen config.pbtxt serves as it is
    from trident.options import EXAMPLE_REPOSITORY

    served = tmp_path / "served"
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", served / "add_sub")
    shutil.copy(out / "add_sub" / "config.pbtxt", served / "add_sub" / "config.pbtxt")
    s = start_server(repo=served)
    try:
        config = json.loads(urllib.request.urlopen(f"http://{s.http_url}/v2/models/add_sub/config").read())
        count = int(best["candidate"].split(",")[0].split("=")[1])
        assert config["instance_group"][0]["count"] == count and "dynamic_batching" in config
    finally:
        s.stop()


def test_analyze_against_a_running_server_restores_the_config(repo: Path, tmp_path: Path):
    s = start_server("--model-control-mode=explicit", "--load-model=add_sub", repo=repo)
    try:
        url = f"http://{s.http_url}/v2/models/add_sub/config"
        before = json.loads(urllib.request.urlopen(url).read())
        p = analyze("-u", s.http_url, "-m", "add_sub", "--instance-count", "2", "--dynamic-batching", "off",
                    "--latency-budget-ms", "0.000001", "--output-dir", str(tmp_path / "r"), *ANALYZE_FAST)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "No config met the latency budget." in (tmp_path / "r" / "report.md").read_text()
        assert not (tmp_path / "r" / "add_sub" / "config.pbtxt").exists()
        assert json.loads(urllib.request.urlopen(url).read()) == before
        # Ctrl-C in the middle: the model's own config comes back
        proc = subprocess.Popen([sys.executable, "-m", "trident", "analyze", "-u", s.http_url, "-m", "add_sub",
                                 "--instance-count", "2,3,4", "--output-dir", str(tmp_path / "r2"),
                                 "-p", "300", "-r", "50", "-s", "0.0001", "--concurrency", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                # a test run started in the background of a non-interactive shell
                                # inherits SIGINT ignored; Ctrl-C is what is tested, so restore it
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert proc.stdout is not None
        assert "loading" in proc.stdout.readline()
        time.sleep(1.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "restored" in err
        assert json.loads(urllib.request.urlopen(url).read()) == before
    finally:
        s.stop()


def test_analyze_an_onnx_model_sweeps_threads(tmp_path: Path):
    pytest.importorskip("onnxruntime")
    from tests.unit.backends.test_onnxruntime import mlp_graph, write_onnx_model

    root = tmp_path / "onnx"
    write_onnx_model(root, "mlp", mlp_graph, "max_batch_size: 8\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n")
    out = tmp_path / "report"
    p = analyze("--model-repository", str(root), "-m", "mlp", "--instance-count", "1", "--dynamic-batching", "on",
                "--threads", "1,2", "--output-dir", str(out), *ANALYZE_FAST)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "threads=1" in p.stdout and "threads=2" in p.stdout
    best = (out / "mlp" / "config.pbtxt").read_text()
    assert "intra_op_thread_count" in best


@pytest.mark.parametrize("args, message", [
    ([], "either --model-repository"),
    (["--model-repository", "/nonexistent", "-u", "127.0.0.1:1"], "either --model-repository"),
    (["--model-repository", "/nonexistent"], "not a folder"),
    (["-u", "127.0.0.1:1", "--instance-count", "0"], "at least 1"),
    (["-u", "127.0.0.1:1", "--dynamic-batching", "maybe"], "on, off"),
])
def test_analyze_bad_input(args, message):
    p = analyze("-m", "add_sub", *args, timeout=60)
    assert p.returncode == 1 and p.stderr.startswith("trident analyze: error: ") and p.stderr.count("\n") == 1
    assert message in p.stderr


def test_analyze_unknown_model_and_unreachable(server: RunningServer, tmp_path: Path):
    p = analyze("-u", server.http_url, "-m", "nope", "--output-dir", str(tmp_path), *ANALYZE_FAST, timeout=60)
    assert p.returncode == 1 and "nope" in p.stderr and p.stderr.count("\n") == 1
    p = analyze("-u", f"127.0.0.1:{_closed_port()}", "-m", "add_sub", "--output-dir", str(tmp_path), timeout=60)
    assert p.returncode == 1 and "cannot reach" in p.stderr


def test_analyze_against_the_real_triton(triton, tmp_path: Path):
    url = f"127.0.0.1:{triton[0]}"
    before = json.loads(urllib.request.urlopen(f"http://{url}/v2/models/add_sub/config").read())
    p = analyze("-u", url, "-m", "add_sub", "--instance-count", "1,2", "--dynamic-batching", "on",
                "--output-dir", str(tmp_path / "r"), *ANALYZE_FAST)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "r" / "add_sub" / "config.pbtxt").exists()
    assert json.loads(urllib.request.urlopen(f"http://{url}/v2/models/add_sub/config").read()) == before


def test_progress_is_live_on_a_terminal_and_plain_lines_otherwise(repo: Path):
    """On a terminal, stderr carries a status line rewritten as a window goes (its elapsed time,
    requests and rate, the load generator's CPU); without one, plain lines and no escapes."""
    import os
    import pty
    import threading

    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    args = [sys.executable, "-m", "trident", "perf", "--in-process", str(repo), "-m", "add_sub",
            "-p", "1000", "-r", "3", "-s", "1000"]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=slave, timeout=120)
    os.close(slave)
    reader.join(5)
    os.close(master)
    assert p.returncode == 0
    tty = b"".join(chunks).decode(errors="replace")
    assert "\r\x1b[2K" in tty and "concurrency 1, window 1:" in tty and "requests (" in tty
    assert "load generator" in tty
    plain = perf("--in-process", str(repo), "-m", "add_sub", *FAST)
    assert plain.returncode == 0 and "\x1b" not in plain.stderr and "window 1:" not in plain.stderr
