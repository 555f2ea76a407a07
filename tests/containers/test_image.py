"""The CPU image, run with podman: its configuration, the example repository over HTTP and gRPC
with tritonclient, the metrics scrape, bad input, a mounted repository on a read-only root file
system with tritonserver's flags and custom ports, and the SIGTERM drain."""

from __future__ import annotations

import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from e2e.models import SLOW_CONFIG, SLOW_PY, write_model
from tritonclient.utils import InferenceServerException

from tests.containers.conftest import ARCH, IMAGE, MACHINE, TIME_SCALE, Container, podman
from trident.options import EXAMPLE_REPOSITORY


def _add_sub_inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"), module.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _metric(text: str, name: str, model: str) -> float:
    m = re.search(rf'^{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M)
    assert m, f"{name} for {model} not in the scrape"
    return float(m.group(1))


def test_image_configuration(image: dict) -> None:
    config = image["Config"]
    assert config["User"] == "10001:10001"
    assert image["Healthcheck"]["Test"] == ["CMD", "trident-healthcheck"]  # exec form (podman: top level)
    assert set(config["ExposedPorts"]) == {"8000/tcp", "8001/tcp", "8002/tcp"}
    assert config["Cmd"] == ["trident", "serve", "--model-repository", "/models"]
    assert config["StopSignal"] in ("SIGTERM", "15")
    assert (image["Os"], image["Architecture"]) == ("linux", ARCH)
    print(f"\n{IMAGE}: {image['Size'] / 1e6:.0f} MB, linux/{ARCH}")


def test_non_root_commands_on_path_and_the_example_repository(example: Container) -> None:
    assert example.exec("id", "-u").stdout.strip() == "10001"
    # the image's own architecture runs (under qemu emulation on another host: containers/arm64.sh)
    assert example.exec("uname", "-m").stdout.strip() == MACHINE
    for command in ("trident", "tritonserver", "trident-healthcheck"):
        assert example.exec("sh", "-c", f"command -v {command}").returncode == 0, command
    version = example.exec("tritonserver", "--version")
    assert version.returncode == 0 and version.stdout.startswith("trident ")
    assert example.exec("ls", "/models").stdout.split() == ["add_sub", "bytes_echo", "identity_fp32"]
    # the repository and the installation belong to root: the server's user cannot change them
    assert example.exec("touch", "/models/add_sub/x").returncode != 0
    assert example.exec("touch", "/opt/trident/venv/x").returncode != 0
    check = example.exec("trident-healthcheck")
    assert check.returncode == 0 and "healthy: http://127.0.0.1:8000/v2/health/ready answered 200" in check.stdout
    # the image's HEALTHCHECK as the engine runs it
    assert podman("healthcheck", "run", example.name, check=False).returncode == 0
    health = podman("inspect", "--format", "{{.State.Health.Status}}", example.name).stdout.strip()
    assert health == "healthy"
    # the figure for the README: resident memory of the container's processes at idle
    status = example.exec("sh", "-c", "cat /proc/[0-9]*/status").stdout
    rss_kb = sum(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    assert rss_kb > 0
    print(f"\n{IMAGE}: {rss_kb / 1024:.0f} MiB resident at idle (example repository)")


def test_the_protocol_modules_are_compiled_and_their_compiler_is_gone(example: Container) -> None:
    status = example.exec("python", "-m", "trident.native", "status")
    assert status.returncode == 0 and "9 of 9 modules compiled" in status.stdout, status.stdout + status.stderr
    # the server imports the compiled forms (not the .py beside them)
    loaded = example.exec("python", "-c", "import trident.protocol.kserve as k, trident.protocol.http2 as h; "
                                          "print(k.__file__); print(h.__file__)")
    assert loaded.returncode == 0, loaded.stderr
    assert all(line.endswith(".so") for line in loaded.stdout.split()), loaded.stdout
    # mypy (the compiler) was removed after the build; the modules' runtime library stays
    left = example.exec("python", "-c", "import importlib.util as u; print(u.find_spec('mypy') is None, "
                                        "u.find_spec('librt') is not None)")
    assert left.stdout.split() == ["True", "True"], left.stdout + left.stderr


def test_http_infer_with_tritonclient(example: Container) -> None:
    with httpclient.InferenceServerClient(example.url(8000)) as c:
        assert c.is_server_live() and c.is_server_ready()
        assert {m["name"] for m in c.get_model_repository_index()} == {"add_sub", "bytes_echo", "identity_fp32"}
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        b = np.full((1, 16), 2, np.float32)
        result = c.infer("add_sub", _add_sub_inputs(httpclient, a, b))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        text = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
        text.set_data_from_numpy(np.array([[b"ab", b"xyz"]], dtype=np.object_), binary_data=True)
        out = c.infer("bytes_echo", [text])
        assert out.as_numpy("OUTPUT0").tolist() == [[b"AB", b"XYZ"]]
        assert out.as_numpy("OUTPUT1").tolist() == [[2, 3]]


def test_grpc_infer_with_tritonclient(example: Container) -> None:
    with grpcclient.InferenceServerClient(example.url(8001)) as c:
        assert c.is_server_ready()
        assert c.get_server_metadata().name == "triton"
        assert c.get_model_metadata("add_sub").inputs[0].name == "INPUT0"
        a = np.random.default_rng(1).random((3, 16), dtype=np.float32)
        b = np.ones((3, 16), np.float32)
        result = c.infer("add_sub", _add_sub_inputs(grpcclient, a, b))
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        x = grpcclient.InferInput("INPUT0", [5], "FP32")
        x.set_data_from_numpy(np.arange(5, dtype=np.float32))
        assert c.infer("identity_fp32", [x]).as_numpy("OUTPUT0").tolist() == [0, 1, 2, 3, 4]


def test_metrics_scrape_counts_the_inferences(example: Container) -> None:
    scrape = f"http://{example.url(8002)}/metrics"
    before = _metric(httpx.get(scrape).text, "nv_inference_request_success", "identity_fp32")
    with httpclient.InferenceServerClient(example.url(8000)) as c:
        x = httpclient.InferInput("INPUT0", [2], "FP32")
        x.set_data_from_numpy(np.zeros(2, np.float32))
        for _ in range(3):
            c.infer("identity_fp32", [x])
    response = httpx.get(scrape)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert _metric(response.text, "nv_inference_request_success", "identity_fp32") == before + 3
    assert _metric(response.text, "nv_inference_pending_request_count", "identity_fp32") == 0


def test_bad_input_gets_tritons_errors_and_the_server_keeps_serving(example: Container) -> None:
    base = f"http://{example.url(8000)}"
    wrong_shape = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
                              {"name": "INPUT1", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    r = httpx.post(f"{base}/v2/models/add_sub/infer", json=wrong_shape)
    assert r.status_code == 400 and "INPUT0" in r.json()["error"]
    r = httpx.post(f"{base}/v2/models/no_such_model/infer", json=wrong_shape)
    assert r.status_code == 404 and "no_such_model" in r.json()["error"]
    r = httpx.post(f"{base}/v2/models/add_sub/infer", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]
    with grpcclient.InferenceServerClient(example.url(8001)) as c:
        x = grpcclient.InferInput("INPUT0", [4], "INT32")
        x.set_data_from_numpy(np.zeros(4, np.int32))
        with pytest.raises(InferenceServerException) as e:
            c.infer("identity_fp32", [x])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert c.is_server_ready()
    assert httpx.get(f"{base}/v2/health/ready").status_code == 200


# the manifests' securityContext: read-only root file system (emptyDirs for /tmp and $HOME), no
# capabilities, no privilege escalation
POD_SECURITY = ("--read-only", "--tmpfs=/tmp", "--tmpfs=/home/trident", "--cap-drop=ALL",
                "--security-opt=no-new-privileges")


def _readable_repo(root: Path) -> Path:
    """A repository the container's user (uid 10001) can read through a bind mount."""
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root


def test_mounted_repository_read_only_root_and_tritonserver_flags(tmp_path: Path, containers) -> None:
    """As in the Kubernetes manifests (POD_SECURITY): the root file system read-only, /tmp a
    tmpfs, no capabilities, a repository mounted read-only at /models; tritonserver's flags and
    other ports: the health check follows the configured HTTP port."""
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "identity_fp32", repo / "mounted_identity",
                    ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / "mounted_identity" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "identity_fp32"', 'name: "mounted_identity"'))
    _readable_repo(repo)
    c = containers("tritonserver", "--model-repository=/models", "--http-port=9000", "--grpc-port=9001",
                   "--metrics-port=9002", ports=(9000, 9001, 9002), ready_port=9000,
                   options=(*POD_SECURITY, f"--volume={repo}:/models:ro"))
    with httpclient.InferenceServerClient(c.url(9000)) as client:
        assert [m["name"] for m in client.get_model_repository_index()] == ["mounted_identity"], c.logs()
        x = httpclient.InferInput("INPUT0", [3], "FP32")
        x.set_data_from_numpy(np.array([1, 2, 3], np.float32))
        assert client.infer("mounted_identity", [x]).as_numpy("OUTPUT0").tolist() == [1, 2, 3]
    with grpcclient.InferenceServerClient(c.url(9001)) as client:
        assert client.is_model_ready("mounted_identity")
    check = c.exec("trident-healthcheck")
    assert check.returncode == 0 and "127.0.0.1:9000/v2/health/ready answered 200" in check.stdout
    assert not list(repo.rglob("__pycache__"))  # nothing written into the mounted repository


def test_the_health_check_fails_while_not_ready_and_follows_grpc_without_http(tmp_path: Path, containers) -> None:
    """A model that fails to load keeps readiness false (the server stays up with
    --exit-on-error=false): the health check exits 1 with the status. With HTTP off it checks
    the gRPC port."""
    repo = tmp_path / "repo"
    write_model(repo, "broken", 'name: "broken"\nbackend: "no_such_backend"\n', "")
    _readable_repo(repo)
    c = containers("trident", "serve", "--model-repository=/models", "--exit-on-error=false",
                   ready_port=None, options=(f"--volume={repo}:/models:ro",))
    c.wait_for_log("model loading complete:")
    check = c.exec("trident-healthcheck")
    assert check.returncode == 1 and "unhealthy: http://127.0.0.1:8000/v2/health/ready answered 400" in check.stdout
    assert podman("healthcheck", "run", c.name, check=False).returncode == 1
    grpc_only = containers("trident", "serve", "--allow-http=false", "--grpc-port=9001", ports=(9001,),
                           ready_port=None)
    grpc_only.wait_for_log("model loading complete:")
    check = grpc_only.exec("trident-healthcheck")
    assert check.returncode == 0 and "healthy: gRPC 127.0.0.1:9001 accepts connections" in check.stdout
    with grpcclient.InferenceServerClient(grpc_only.url(9001)) as client:
        assert client.is_server_ready()


def test_a_missing_repository_exits_1_with_the_reason(containers) -> None:
    c = containers("trident", "serve", "--model-repository", "/nowhere", ready_port=None)
    assert c.wait(60) == 1
    assert "/nowhere" in c.logs()


def test_sigterm_drains_the_request_in_flight(tmp_path: Path, containers) -> None:
    """SIGTERM (podman stop's signal) with a request executing: readiness turns false, new
    inferences get 503, the request in flight gets its answer, the container exits 0."""
    repo = tmp_path / "repo"
    write_model(repo, "slow", SLOW_CONFIG, SLOW_PY)
    _readable_repo(repo)
    markers = tmp_path / "markers"
    markers.mkdir()
    markers.chmod(0o777)
    c = containers("trident", "serve", "--model-repository=/models", "--exit-timeout-secs=30",
                   options=(f"--volume={repo}:/models:ro", f"--volume={markers}:/markers"))
    result: dict[str, object] = {}

    def call() -> None:
        try:
            with httpclient.InferenceServerClient(c.url(8000), network_timeout=60 * TIME_SCALE) as client:
                x = httpclient.InferInput("X", [1], "FP32")
                x.set_data_from_numpy(np.array([3.0], np.float32))
                result["y"] = client.infer("slow", [x], parameters={"marker": "/markers/started"}).as_numpy("Y").tolist()
        except Exception as e:  # reported by the assert below
            result["error"] = repr(e)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30 * TIME_SCALE
    while not (markers / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (markers / "started").exists(), c.logs()
    podman("kill", "--signal", "TERM", c.name)
    ready = f"http://{c.url(8000)}/v2/health/ready"
    seen_draining = False
    while time.monotonic() < deadline and not seen_draining:
        try:
            with urllib.request.urlopen(ready, timeout=2):
                pass
        except urllib.error.HTTPError as e:
            seen_draining = e.code == 400
        except OSError:
            break  # the drain ended already
        time.sleep(0.01)
    assert seen_draining
    # a new inference during the drain is refused (UNAVAILABLE), the one in flight completes
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [0.0]}]}
    refused = httpx.post(f"http://{c.url(8000)}/v2/models/slow/infer", json=body)
    assert refused.status_code == 503 and "stopping" in refused.json()["error"]
    thread.join(60 * TIME_SCALE)
    assert result == {"y": [3.0]}
    assert c.wait(60) == 0


def _kserve_runtime_container() -> dict:
    """The container of containers/kubernetes/kserve/clusterservingruntime.yaml (the gRPC twin
    runs the same args: tests/unit/containers/test_kserve_runtime.py)."""
    path = Path(__file__).parents[2] / "containers/kubernetes/kserve/clusterservingruntime.yaml"
    (runtime,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (container,) = runtime["spec"]["containers"]
    return container


def test_the_kserve_runtime_command_serves_v2_on_kserves_ports(tmp_path: Path, containers) -> None:
    """The ClusterServingRuntime's command as KServe runs it: the repository in /mnt/models (the
    storage initializer's), REST on 8080, gRPC on 9000, a read-only root file system."""
    container = _kserve_runtime_container()
    args = container["args"]
    env = [f"--env={e['name']}={e['value']}" for e in container["env"]]
    assert args[0] == "tritonserver" and "--model-store=/mnt/models" in args
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub", ignore=shutil.ignore_patterns("__pycache__"))
    _readable_repo(repo)
    c = containers(*args, ports=(8080, 9000, 8002), ready_port=8080,
                   options=(*POD_SECURITY, *env, f"--volume={repo}:/mnt/models:ro"))
    a = np.ones((1, 16), np.float32)
    with httpclient.InferenceServerClient(c.url(8080)) as client:
        assert client.is_model_ready("add_sub")
        np.testing.assert_array_equal(client.infer("add_sub", _add_sub_inputs(httpclient, a, a)).as_numpy("OUTPUT0"), a + a)
    with grpcclient.InferenceServerClient(c.url(9000)) as client:
        np.testing.assert_array_equal(client.infer("add_sub", _add_sub_inputs(grpcclient, a, a)).as_numpy("OUTPUT1"), a - a)
    assert "nv_inference_request_success" in httpx.get(f"http://{c.url(8002)}/metrics").text
