"""Start ``trident serve`` for the example benchmarks: 127.0.0.1, free ports, optionally pinned
to CPU cores with ``taskset`` so "one core" figures mean one core."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_GRPC = re.compile(r"Started GRPCInferenceService at [\d.]+:(\d+)")


@dataclass
class LocalServer:
    proc: subprocess.Popen
    grpc_url: str
    log: Path

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def serve(repo: Path, *, cores: str | None = "0", timeout: float = 120.0,
          command: list[str] | None = None) -> Iterator[LocalServer]:
    """Run the server on ``repo`` (pinned to ``cores`` when taskset exists) until the block ends.

    Raises RuntimeError when it exits or does not load within ``timeout``."""
    cmd = [*(command or [sys.executable, "-m", "trident", "serve"]), "--model-repository", str(repo),
           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
           "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    if cores and shutil.which("taskset"):
        cmd = ["taskset", "-c", cores, *cmd]
    fd, name = tempfile.mkstemp(prefix="trident-example-", suffix=".log")
    proc = subprocess.Popen(cmd, stdout=fd, stderr=fd)
    os.close(fd)
    log = Path(name)
    try:
        deadline = time.monotonic() + timeout
        while True:
            text = log.read_text(errors="replace")
            m = _GRPC.search(text)
            if m and "model loading complete" in text:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"trident did not start:\n{text[-4000:]}")
            time.sleep(0.1)
        yield LocalServer(proc, f"127.0.0.1:{m.group(1)}", log)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)
