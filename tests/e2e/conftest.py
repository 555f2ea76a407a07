"""End-to-end harness: the real ``trident serve`` in a subprocess on free ports.

``start_server(*flags, repo=...)`` starts ``python -m trident serve`` with ports 0 on 127.0.0.1
and reads the bound ports from the "Started ... at host:port" log lines. The environment variable
``TRIDENT_E2E_HTTP_SERVER=hypercorn|trident`` adds ``--http-server`` to every server started
without one (run the HTTP suites against either serving layer); likewise
``TRIDENT_E2E_GRPC_HTTP2=trident|h2`` adds ``--grpc-http2``. Fixtures:
``example_server`` (session: the bundled example repository), ``server_factory`` (per test,
stopped afterwards), ``repo_factory`` (copies of test model folders in tmp_path),
``grpc_http2`` (module scope, parametrized: the gRPC suites run once per HTTP/2 implementation;
servers started while it is active get its ``--grpc-http2``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
MODELS = HERE / "models"
_GRPC_HTTP2_ENV = "TRIDENT_E2E_GRPC_HTTP2"
GRPC_HTTP2 = ("trident", "h2")  # --grpc-http2 values the gRPC suites run against
_LOADED = "model loading complete:"  # the front ends listen first, then the models load
_STARTED = re.compile(r"Started (GRPCInferenceService|HTTPService|Metrics Service) at ([\d.]+):(\d+)")


@dataclass
class RunningServer:
    proc: subprocess.Popen
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def http_port(self) -> int:
        return self.ports["HTTPService"]

    @property
    def grpc_port(self) -> int:
        return self.ports["GRPCInferenceService"]

    @property
    def metrics_port(self) -> int:
        return self.ports["Metrics Service"]

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def pending(server: RunningServer, model: str) -> int:
    """The model's queued requests (version 1), as its metrics report them."""
    text = httpx.get(server.metrics_url, timeout=10).text
    m = re.search(rf'nv_inference_pending_request_count{{model="{model}",version="1"}} (\d+)', text)
    return int(m.group(1)) if m else 0


def start_server(*flags: str, repo: Path | str | None = None, timeout: float = 60.0,
                 env: dict[str, str] | None = None, expect: tuple[str, ...] | None = None,
                 command: list[str] | None = None) -> RunningServer:
    """Start ``trident serve`` (or ``command``, e.g. the ``tritonserver`` script) and wait until
    every enabled front end has bound its port."""
    cmd = [*(command or [sys.executable, "-m", "trident", "serve"]),
           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
           "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    if repo is not None:
        cmd += ["--model-repository", str(repo)]
    cmd += list(flags)
    http_server = os.environ.get("TRIDENT_E2E_HTTP_SERVER")
    if http_server and not any(f.startswith("--http-server") for f in flags):
        cmd += ["--http-server", http_server]
    grpc_http2 = os.environ.get(_GRPC_HTTP2_ENV)
    if grpc_http2 and not any(f.startswith("--grpc-http2") for f in flags):
        cmd += ["--grpc-http2", grpc_http2]
    if expect is None:
        expect = tuple(
            name for name, flag in (("HTTPService", "--allow-http"), ("GRPCInferenceService", "--allow-grpc"),
                                    ("Metrics Service", "--allow-metrics"))
            if not any(f.startswith(flag + "=false") or f.startswith(flag + "=0") for f in flags)
        )
    log_fd, log_name = tempfile.mkstemp(prefix="trident-e2e-", suffix=".log", dir=_log_dir())
    proc = subprocess.Popen(cmd, stdout=log_fd, stderr=log_fd, env={**os.environ, **(env or {})})
    os.close(log_fd)
    server = RunningServer(proc, Path(log_name))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in _STARTED.finditer(server.log()):
            server.ports[m.group(1)] = int(m.group(3))
        if all(name in server.ports for name in expect) and _LOADED in server.log():
            return server
        if proc.poll() is not None:
            raise RuntimeError(f"trident exited with {proc.returncode}:\n{server.log()}")
        time.sleep(0.05)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"trident did not start within {timeout} s:\n{server.log()}")


_LOG_DIR: Path | None = None


def _log_dir() -> Path:
    """One folder for the servers' logs of this test session, removed at its end."""
    global _LOG_DIR
    if _LOG_DIR is None:
        _LOG_DIR = Path(tempfile.mkdtemp(prefix="trident-e2e-logs-"))
    return _LOG_DIR


@pytest.fixture(scope="session", autouse=True)
def _remove_server_logs() -> Iterator[None]:
    yield
    if _LOG_DIR is not None:
        shutil.rmtree(_LOG_DIR, ignore_errors=True)


@pytest.fixture(scope="module", params=GRPC_HTTP2)
def grpc_http2(request: pytest.FixtureRequest) -> Iterator[str]:
    """The HTTP/2 implementation under gRPC for the servers a module starts (``--grpc-http2``).

    A module's server fixtures take this fixture, and its tests use it
    (``pytestmark = pytest.mark.usefixtures("grpc_http2")``), so the module runs once per value."""
    old = os.environ.get(_GRPC_HTTP2_ENV)
    os.environ[_GRPC_HTTP2_ENV] = request.param
    try:
        yield request.param
    finally:
        if old is None:
            os.environ.pop(_GRPC_HTTP2_ENV, None)
        else:
            os.environ[_GRPC_HTTP2_ENV] = old


@pytest.fixture(scope="session")
def example_server() -> Iterator[RunningServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def server_factory() -> Iterator:
    started: list[RunningServer] = []

    def factory(*flags: str, **kwargs) -> RunningServer:
        s = start_server(*flags, **kwargs)
        started.append(s)
        return s

    yield factory
    for s in started:
        s.stop()


@pytest.fixture
def repo_factory(tmp_path: Path):
    """Build a repository in tmp_path from folders of tests/e2e/models (and the example repo)."""
    from trident.options import EXAMPLE_REPOSITORY

    def factory(*names: str) -> Path:
        root = tmp_path / "repo"
        root.mkdir(exist_ok=True)
        for name in names:
            src = MODELS / name if (MODELS / name).exists() else EXAMPLE_REPOSITORY / name
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        return root

    return factory
