"""In-container smoke tests: the built image run with podman, driven from the host with real
clients on published ports (127.0.0.1, free ports).

Not part of the default ``pytest`` run (testpaths leaves this folder out): ``containers/smoke.sh``
runs it after ``containers/build.sh``. ``TRIDENT_IMAGE`` names the image under test (default
``localhost/trident:cpu``); ``TRIDENT_GPU_CHECK_IMAGE`` the GPU Dockerfile built on the CPU base
(test_gpu_install.py). Without podman, or without the image, the tests fail: they never skip.

``TRIDENT_ARCH`` is the Debian architecture the image must have (default the host's;
``containers/arm64.sh`` sets ``arm64`` and runs it under qemu emulation), and
``TRIDENT_SMOKE_TIME_SCALE`` multiplies every wait, the image's health-check timeout included
(emulation runs the server ~10-20x slower).
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

IMAGE = os.environ.get("TRIDENT_IMAGE", "localhost/trident:cpu")
_MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}  # Debian architecture -> uname -m
ARCH = os.environ.get("TRIDENT_ARCH") or {v: k for k, v in _MACHINES.items()}.get(platform.machine(), platform.machine())
MACHINE = _MACHINES.get(ARCH, ARCH)  # what uname -m answers inside the image
TIME_SCALE = float(os.environ.get("TRIDENT_SMOKE_TIME_SCALE", "1"))
PORTS = (8000, 8001, 8002)  # the image's HTTP, gRPC, metrics ports
_LOADED = "model loading complete:"
_names = itertools.count()


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``podman ARGS``; podman's own noise about systemd (no timers for health checks on a host
    without systemd) stays in stderr. ``timeout`` is scaled by TIME_SCALE."""
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout * TIME_SCALE)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Container:
    name: str
    ports: dict[int, int]  # container port -> host port on 127.0.0.1
    started: float
    ready_after: float | None = None
    removed: bool = field(default=False)

    def url(self, container_port: int) -> str:
        return f"127.0.0.1:{self.ports[container_port]}"

    def logs(self) -> str:
        p = podman("logs", self.name, check=False)
        return p.stdout + p.stderr

    def running(self) -> bool:
        p = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return p.stdout.strip() == "true"

    def exec(self, *cmd: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *cmd, check=check)

    def wait_for_log(self, text: str, timeout: float = 60) -> None:
        """Until ``text`` is in the container's log; fails if the container stops first."""
        deadline = time.monotonic() + timeout * TIME_SCALE
        while text not in self.logs():
            assert time.monotonic() < deadline and self.running(), f"no {text!r} in the log:\n{self.logs()}"
            time.sleep(0.05)

    def wait(self, timeout: float = 60) -> int:
        """The exit code once the container has stopped."""
        p = podman("wait", self.name, timeout=timeout)  # scaled by podman()
        return int(p.stdout.strip().splitlines()[-1])

    def remove(self) -> None:
        if not self.removed:
            podman("rm", "--force", "--time", "0", self.name, check=False)
            self.removed = True


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def run_container(*command: str, image: str | None = None, ports: tuple[int, ...] = PORTS,
                  options: tuple[str, ...] = (), ready_port: int | None = 8000, timeout: float = 120) -> Container:
    """``podman run -d`` the image (its CMD unless ``command``), each of ``ports`` published on a
    free host port; waits until GET /v2/health/ready on ``ready_port`` answers 200 and the log
    says the start-up models are loaded (None: no wait). (Ready alone is not enough: for a moment
    after the front ends listen and before the repository is scanned, ready answers 200.)
    ``timeout`` is scaled by TIME_SCALE."""
    name = f"trident-smoke-{os.getpid()}-{next(_names)}"
    mapping = {p: free_port() for p in ports}
    publish = [f"--publish=127.0.0.1:{host}:{inside}" for inside, host in mapping.items()]
    started = time.monotonic()
    label = f"--label=trident-smoke={os.environ.get('TRIDENT_SMOKE_SESSION', os.getpid())}"
    # the image's HEALTHCHECK timeout (3 s), scaled like every wait (the check's Python start-up
    # alone takes longer under emulation)
    scaled = (f"--health-timeout={3 * TIME_SCALE:g}s",) if TIME_SCALE != 1 else ()
    podman("run", "--detach", "--name", name, label, *publish, *scaled, *options, image or IMAGE, *command)
    c = Container(name, mapping, started)
    if ready_port is None:
        return c
    url = f"http://{c.url(ready_port)}/v2/health/ready"
    deadline = started + timeout * TIME_SCALE
    while time.monotonic() < deadline:
        if _http_status(url) == 200 and _LOADED in c.logs():
            c.ready_after = time.monotonic() - started
            return c
        if not c.running():
            log = c.logs()
            c.remove()
            raise AssertionError(f"the container exited before it was ready:\n{log}")
        time.sleep(0.05)
    log = c.logs()
    c.remove()
    raise AssertionError(f"not ready within {timeout * TIME_SCALE:g} s:\n{log}")


@pytest.fixture(scope="session")
def image() -> dict:
    """The image's configuration (podman image inspect); fails when podman or the image is missing."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: the container smoke tests cannot run (not skipped)")
    p = podman("image", "inspect", IMAGE, check=False)
    if p.returncode != 0:
        pytest.fail(f"image {IMAGE} not found: build it first (containers/build.sh)\n{p.stderr}")
    return json.loads(p.stdout)[0]


@pytest.fixture
def containers(image: dict) -> Iterator:
    """``run_container`` for one test; every container it started is removed afterwards."""
    started: list[Container] = []

    def factory(*command: str, **kwargs) -> Container:
        c = run_container(*command, **kwargs)
        started.append(c)
        return c

    yield factory
    for c in started:
        c.remove()


@pytest.fixture(scope="module")
def example(image: dict) -> Iterator[Container]:
    """The image run as shipped (its CMD, the bundled example repository in /models)."""
    c = run_container()
    print(f"\n{IMAGE}: ready {c.ready_after:.2f} s after podman run")
    yield c
    c.remove()
