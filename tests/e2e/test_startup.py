"""Start-up as an operator expects (issue [11] parts 2-3): the real ``trident serve`` and
``tritonserver`` commands, one-line errors with exit status 1, ignored tritonserver flags."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import start_server

LOOP = "127.0.0.1"
ADDRESSES = ["--http-address", LOOP, "--grpc-address", LOOP, "--metrics-address", LOOP]


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trident", "serve", *ADDRESSES, *argv], capture_output=True,
                          text=True, timeout=timeout)


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    """The warning and error lines of the log, and any line of a traceback."""
    return [line for line in (proc.stdout + proc.stderr).splitlines()
            if line[:1] in ("E", "W") or "Traceback" in line or line.startswith("  File ")]


@pytest.mark.parametrize("kind", ["missing", "file", "s3"])
def test_a_repository_that_cannot_be_served_exits_1_with_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nowhere"
    if kind == "file":
        path.write_text("not a folder")
    where = "as://account-only" if kind == "s3" else str(path)  # a cloud URL that names no container
    proc = _run("--model-repository", where, "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")
    assert proc.returncode == 1
    lines = _errors(proc)
    assert len(lines) == 1 and "error: creating server: model repository" in lines[0] and where in lines[0]
    if kind == "s3":
        assert "no bucket (or container) named" in lines[0]


def test_a_backend_trident_lacks_says_so(tmp_path: Path) -> None:
    from tests.e2e.models import write_model

    write_model(tmp_path, "tf", 'name: "tf"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 0\n', "")
    server = start_server(repo=tmp_path)
    try:
        index = httpx.post(f"http://{server.http_url}/v2/repository/index").json()
        row = next(r for r in index if r["name"] == "tf")
        assert row["state"] == "UNAVAILABLE"
        assert "backend 'tensorflow' is not supported by trident yet" in row["reason"]
        r = httpx.post(f"http://{server.http_url}/v2/models/tf/infer", json={"inputs": []})
        assert r.status_code == 503 and "not supported by trident yet" in r.json()["error"]
    finally:
        server.stop()


@pytest.mark.parametrize(("front_end", "http_server"), [("http", "trident"), ("http", "hypercorn"),
                                                        ("grpc", "trident"), ("metrics", "trident")])
def test_a_port_in_use_exits_1_naming_the_address(front_end: str, http_server: str) -> None:
    with socket.socket() as taken:
        taken.bind((LOOP, 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"http": "0", "grpc": "0", "metrics": "0", front_end: str(port)}
        proc = _run("--http-server", http_server, "--http-port", ports["http"], "--grpc-port", ports["grpc"],
                    "--metrics-port", ports["metrics"])
    assert proc.returncode == 1
    lines = _errors(proc)
    service = {"http": "HTTP service", "grpc": "GRPC service", "metrics": "Metrics service"}[front_end]
    assert len(lines) == 1, lines  # no traceback
    assert f"failed to start {service}: address {LOOP}:{port} already in use" in lines[0]


def test_tritonserver_command_serves_and_logs_ignored_flags_once() -> None:
    script = Path(sys.executable).parent / "tritonserver"
    assert script.exists(), "pip install installs the tritonserver command next to python"
    server = start_server("--backend-directory=/opt/tritonserver/backends", "--pinned-memory-pool-byte-size=268435456",
                          "--trace-level=TIMESTAMPS", "--trace-rate=1", "--response-cache-byte-size=1048576",
                          command=[str(script)])
    try:
        assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200
        settings = httpx.get(f"http://{server.http_url}/v2/trace/setting").json()
        assert settings["trace_level"] == ["TIMESTAMPS"] and settings["trace_rate"] == "1"
        log = server.log()
        assert log.count("ignoring --backend-directory=/opt/tritonserver/backends: backends are Python modules") == 1
        assert log.count("ignoring --pinned-memory-pool-byte-size=268435456") == 1
        assert "ignoring --trace" not in log and "ignoring --response-cache" not in log
        # tritonserver's start-up tables: models with their status, then the options
        import re

        assert re.search(r"\| Model +\| Version \| Status +\|", log)
        assert re.search(r"\| identity_fp32 +\| 1 +\| READY +\|", log)
        assert re.search(r"\| model_control_mode +\| MODE_NONE +\|", log)
        assert re.search(r"\| cache_enabled +\| 1 +\|", log)  # --response-cache-byte-size enables it
    finally:
        assert server.stop() == 0


def test_during_the_drain_http_keeps_answering(tmp_path: Path) -> None:
    """SIGTERM with a request in flight: until it ends, live stays true, ready is false and new
    inferences get 503 on a keep-alive connection opened before the signal; then the process
    exits 0 and the in-flight request gets its answer."""
    import signal
    import threading
    import time

    import numpy as np
    import tritonclient.http as httpclient

    from tests.e2e.models import SLOW_CONFIG, SLOW_PY, write_model

    repo = tmp_path / "repo"
    write_model(repo, "slow", SLOW_CONFIG, SLOW_PY)
    server = start_server(repo=repo)
    marker = tmp_path / "started"
    result: dict[str, object] = {}

    def call(seconds: float) -> None:
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as c:
            inp = httpclient.InferInput("X", [1], "FP32")
            inp.set_data_from_numpy(np.array([seconds], np.float32))
            result["y"] = c.infer("slow", [inp], parameters={"marker": str(marker)}).as_numpy("Y").tolist()

    with httpx.Client(base_url=f"http://{server.http_url}") as keep_alive:
        assert keep_alive.get("/v2/health/ready").status_code == 200
        thread = threading.Thread(target=call, args=(3.0,))
        thread.start()
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        server.proc.send_signal(signal.SIGTERM)
        drain_seen = time.monotonic() + 10
        while keep_alive.get("/v2/health/ready").status_code != 400 and time.monotonic() < drain_seen:
            time.sleep(0.01)  # until the signal is handled
        assert server.proc.poll() is None  # draining
        assert keep_alive.get("/v2/health/live").status_code == 200
        assert keep_alive.get("/v2/health/ready").status_code == 400
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [0.0]}]}
        refused = keep_alive.post("/v2/models/slow/infer", json=body)
        assert refused.status_code == 503 and "stopping" in refused.json()["error"]
        with httpx.Client(base_url=f"http://{server.http_url}") as fresh:  # a new connection is still served
            assert fresh.get("/v2/health/live").status_code == 200
    thread.join(30)
    assert result.get("y") == [3.0]
    assert server.proc.wait(30) == 0


SLOW_INIT_PY = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''


def test_the_front_ends_listen_while_models_load(tmp_path: Path) -> None:
    """Better than Triton (silent while it loads): live answers true and ready false until the
    start-up models are loaded."""
    import re
    import time

    from tests.e2e.models import write_model

    repo = tmp_path / "repo"
    write_model(repo, "slow_init", '''
name: "slow_init"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
''', SLOW_INIT_PY)
    proc = subprocess.Popen([sys.executable, "-m", "trident", "serve", *ADDRESSES, "--model-repository", str(repo),
                             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--log-verbose=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        port = None
        lines = []
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            m = re.search(r"Started HTTPService at [\d.]+:(\d+)", line)
            port = int(m.group(1)) if m else None
        assert port is not None, "".join(lines)
        assert not any("model loading complete" in line for line in lines)  # still loading
        assert httpx.get(f"http://{LOOP}:{port}/v2/health/live").status_code == 200
        assert httpx.get(f"http://{LOOP}:{port}/v2/health/ready").status_code == 400
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "model loading complete: 1 ready, 0 unavailable" in line:
                break
        assert httpx.get(f"http://{LOOP}:{port}/v2/health/ready").status_code == 200
        body = {"id": "req-7", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
        assert httpx.post(f"http://{LOOP}:{port}/v2/models/slow_init/infer", json=body).status_code == 200
        bad = {"id": "req-8", "inputs": [{"name": "NOPE", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
        assert httpx.post(f"http://{LOOP}:{port}/v2/models/slow_init/infer", json=bad).status_code == 400
    finally:
        proc.send_signal(__import__("signal").SIGTERM)
        out, _ = proc.communicate(timeout=30)
    log = "".join(lines) + out
    # --log-verbose=1: the final config on load, each request's id, model and outcome
    assert "model 'slow_init' version 1 config: {" in log
    assert "infer request req-7 to model 'slow_init': OK" in log
    assert re.search(r"infer request req-8 to model 'slow_init' failed: INVALID_ARG", log)


def test_ready_is_never_true_before_the_start_up_models_loaded() -> None:
    """The front ends listen before the start-up load begins: from the first answer on, ready
    stays false until every model of the index is READY (a probe in that gap used to get 200)."""
    import re
    import time

    proc = subprocess.Popen([sys.executable, "-m", "trident", "serve", *ADDRESSES, "--http-port", "0",
                             "--grpc-port", "0", "--metrics-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            m = re.search(r"Started HTTPService at [\d.]+:(\d+)", proc.stdout.readline())
            port = int(m.group(1)) if m else None
        assert port is not None
        with httpx.Client(base_url=f"http://{LOOP}:{port}") as client:
            answers = []
            while time.monotonic() < deadline:
                status = client.get("/v2/health/ready").status_code
                answers.append(status)
                if status == 200:
                    break
                time.sleep(0.002)
            assert answers[-1] == 200, answers[-5:]
            index = client.post("/v2/repository/index").json()
            assert index and all(entry["state"] == "READY" for entry in index), index
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
