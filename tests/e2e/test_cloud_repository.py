"""Model repositories in object storage, end to end against local servers that speak each
protocol: moto's S3 server (``moto[server]``), the ``gcp-storage-emulator`` for GCS, Azurite
for Azure Blob (npm; the README's test command installs it into tests/node). Each is started by
the test on 127.0.0.1 and stopped after; nothing reaches the network."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e.models import IDENTITY_PY
from e2e.test_backends_onnxruntime import BOTH, infer_grpc, infer_http
from unit.backends.test_onnxruntime import add_sub_graph

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")

IDENTITY = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
'''
DOUBLE_PY = IDENTITY_PY.replace('pb_utils.Tensor("OUTPUT0", x.as_numpy())', 'pb_utils.Tensor("OUTPUT0", x.as_numpy() * 2)')
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the storage server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the storage server did not start")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _moto(env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    _wait_port(port, proc)
    return proc, port


def repository_objects(tmp: Path) -> dict[str, bytes]:
    """Relative key -> bytes of a repository of two Python models and one ONNX model."""
    add_sub_graph(tmp / "add_sub.onnx")
    objects = {"add_sub/config.pbtxt": b'backend: "onnxruntime"\nmax_batch_size: 0\n',
               "add_sub/1/model.onnx": (tmp / "add_sub.onnx").read_bytes()}
    for name in ("py_a", "py_b"):
        objects[f"{name}/config.pbtxt"] = IDENTITY.format(name=name).encode()
        objects[f"{name}/1/model.py"] = IDENTITY_PY.encode()
    return objects


def _s3(port: int):  # type: ignore[no-untyped-def]
    return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[tuple[int, object]]:
    """A moto S3 server with bucket 'models' holding the repository under 'repo/'."""
    proc, port = _moto()
    client = _s3(port)
    client.create_bucket(Bucket="models")
    for key, data in repository_objects(tmp_path_factory.mktemp("objects")).items():
        client.put_object(Bucket="models", Key=f"repo/{key}", Body=data)
    yield port, client
    _stop(proc)


def _infer_identity(infer, server, model: str) -> list[float]:
    x = np.arange(3, dtype=np.float32)
    return infer(server, model, {"INPUT0": x})["OUTPUT0"].tolist()


def _add_sub(infer, server) -> None:
    a, b = np.ones((2, 4), np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)
    out = infer(server, "add_sub", {"INPUT0": a, "INPUT1": b})
    assert out["OUTPUT0"].tolist() == (a + b).tolist()


def _index(server) -> dict[str, dict]:
    return {row["name"]: row for row in httpx.post(f"http://{server.http_url}/v2/repository/index", json={}).json()}


def _until(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def polled(s3, tmp_path_factory):
    from e2e.conftest import start_server

    port, _ = s3
    cache = tmp_path_factory.mktemp("cache")
    server = start_server("--model-control-mode=poll", "--repository-poll-secs=1",
                          repo=f"s3://127.0.0.1:{port}/models/repo",
                          env={**AWS_ENV, "TRIDENT_CLOUD_CACHE_DIR": str(cache)})
    yield server, cache
    server.stop()
    assert not any(cache.iterdir()), "the local copies outlived the server"


@BOTH
def test_s3_repository_serves_python_and_onnx(polled, infer):
    server, _ = polled
    assert _infer_identity(infer, server, "py_a") == [0.0, 1.0, 2.0]
    _add_sub(infer, server)


def test_s3_poll_reloads_only_the_changed_model(polled, s3):
    server, cache = polled
    port, client = s3
    assert _infer_identity(infer_http, server, "py_b") == [0.0, 1.0, 2.0]
    client.put_object(Bucket="models", Key="repo/py_b/1/model.py", Body=DOUBLE_PY.encode())
    _until(lambda: _infer_identity(infer_http, server, "py_b") == [0.0, 2.0, 4.0])
    time.sleep(1.5)  # another poll passes: nothing else reloads
    log = server.log()
    assert log.count("successfully loaded 'py_b'") == 2
    assert log.count("successfully loaded 'py_a'") == 1 and log.count("successfully loaded 'add_sub'") == 1
    _until(lambda: len([p for p in cache.rglob("py_b-*") if p.is_dir()]) == 1)  # the old copy is gone


def test_s3_explicit_load_unload_and_bad_input(s3, server_factory, tmp_path):
    port, client = s3
    cache = tmp_path / "cache"
    server = server_factory("--model-control-mode=explicit", repo=f"s3://127.0.0.1:{port}/models/repo",
                            env={**AWS_ENV, "TRITON_AWS_MOUNT_DIRECTORY": str(cache)})  # Triton's variable
    base = f"http://{server.http_url}/v2/repository/models"
    assert httpx.post(f"{base}/py_a/load", json={}).status_code == 200
    assert _infer_identity(infer_grpc, server, "py_a") == [0.0, 1.0, 2.0]
    assert len(list(cache.rglob("py_a-*"))) == 1
    assert httpx.post(f"{base}/py_a/unload", json={}).status_code == 200
    _until(lambda: not list(cache.rglob("py_a-*")))
    # a model added to the bucket after start-up loads by name
    client.put_object(Bucket="models", Key="repo/py_new/config.pbtxt", Body=IDENTITY.format(name="py_new").encode())
    client.put_object(Bucket="models", Key="repo/py_new/1/model.py", Body=IDENTITY_PY.encode())
    assert httpx.post(f"{base}/py_new/load", json={}).status_code == 200
    assert _infer_identity(infer_http, server, "py_new") == [0.0, 1.0, 2.0]
    r = httpx.post(f"{base}/not_there/load", json={})
    assert r.status_code == 500 and "failed to poll from model repository" in r.json()["error"]
    r = httpx.post(f"{base}/..%2F..%2Fetc/load", json={})  # a name that would leave the bucket prefix
    assert r.status_code in (400, 404) and "etc" not in _index(server)
    server.stop()
    assert cache.is_dir() and not any(cache.iterdir())  # the server's folder in it is gone


def test_s3_missing_bucket_gives_the_reason(s3, server_factory):
    port, _ = s3
    server = server_factory("--model-control-mode=explicit", repo=f"s3://127.0.0.1:{port}/no-such-bucket/repo",
                            env=AWS_ENV)
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/py_a/load", json={})
    assert r.status_code == 500 and "the bucket or path does not exist" in r.json()["error"]
    assert "no-such-bucket" in r.json()["error"]
    assert httpx.get(f"http://{server.http_url}/v2/health/live").status_code == 200
    # with --exit-on-error the server stops at start-up instead, with the reason
    proc = subprocess.run([sys.executable, "-m", "trident", "serve", "--exit-on-error=true", "--http-port=0",
                           "--grpc-port=0", "--metrics-port=0", "--http-address=127.0.0.1",
                           "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                           f"--model-repository=s3://127.0.0.1:{port}/no-such-bucket/repo"],
                          env={**os.environ, **AWS_ENV}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "the bucket or path does not exist" in proc.stdout + proc.stderr
    assert "a model repository could not be read" in proc.stdout + proc.stderr


def test_s3_bad_credentials_give_access_denied(server_factory, tmp_path):
    # moto checks credentials after its first 3 requests (the set-up below): the server's are unknown
    proc, port = _moto({"INITIAL_NO_AUTH_ACTION_COUNT": "3"})
    try:
        client = _s3(port)
        client.create_bucket(Bucket="locked")
        client.put_object(Bucket="locked", Key="repo/py_a/config.pbtxt", Body=IDENTITY.format(name="py_a").encode())
        client.put_object(Bucket="locked", Key="repo/py_a/1/model.py", Body=IDENTITY_PY.encode())
        server = server_factory("--model-control-mode=explicit", repo=f"s3://127.0.0.1:{port}/locked/repo",
                                env={**AWS_ENV, "AWS_ACCESS_KEY_ID": "AKIAWRONG", "AWS_SECRET_ACCESS_KEY": "wrong"})
        r = httpx.post(f"http://{server.http_url}/v2/repository/models/py_a/load", json={})
        assert r.status_code == 500 and "access denied" in r.json()["error"], r.text
        assert "wrong" not in r.json()["error"].lower().replace("wrong key", "")
        # the server keeps answering
        assert httpx.get(f"http://{server.http_url}/v2/health/live").status_code == 200
    finally:
        _stop(proc)


def test_s3_agents_run_on_the_downloaded_copy(s3, server_factory, tmp_path):
    import hashlib

    port, client = s3
    model_py = IDENTITY_PY.encode()
    agents = (f'model_repository_agents {{ agents [ {{ name: "checksum" parameters '
              f'{{ key: "MD5:1/model.py" value: "{hashlib.md5(model_py).hexdigest()}" }} }} ] }}\n')
    for name, digest_ok in (("sum_ok", True), ("sum_bad", False)):
        config = IDENTITY.format(name=name) + (agents if digest_ok else agents.replace('value: "', 'value: "0'))
        client.put_object(Bucket="models", Key=f"agents/{name}/config.pbtxt", Body=config.encode())
        client.put_object(Bucket="models", Key=f"agents/{name}/1/model.py", Body=model_py)
    server = server_factory(repo=f"s3://127.0.0.1:{port}/models/agents", env=AWS_ENV)
    assert _infer_identity(infer_http, server, "sum_ok") == [0.0, 1.0, 2.0]
    assert "mismatched MD5 hash for file '1/model.py'" in _index(server)["sum_bad"]["reason"]


# ---------------------------------------------------------------- GCS and Azure: one check each

def check_store(server_factory, url: str, env: dict[str, str], put, cache: Path) -> None:
    """Serve ``url`` (the repository of :func:`repository_objects`, written with ``put(key,
    data)``): Python and ONNX over HTTP and gRPC in poll mode, a changed object reloads only
    its model; explicit load and unload (the local copy goes)."""
    env = {**env, "TRIDENT_CLOUD_CACHE_DIR": str(cache)}
    polled = server_factory("--model-control-mode=poll", "--repository-poll-secs=1", repo=url, env=env)
    for infer in (infer_http, infer_grpc):
        assert _infer_identity(infer, polled, "py_a") == [0.0, 1.0, 2.0]
        _add_sub(infer, polled)
    put("py_b/1/model.py", DOUBLE_PY.encode())
    _until(lambda: _infer_identity(infer_http, polled, "py_b") == [0.0, 2.0, 4.0])
    assert polled.log().count("successfully loaded 'py_a'") == 1
    explicit = server_factory("--model-control-mode=explicit", repo=url, env=env)
    base = f"http://{explicit.http_url}/v2/repository/models"
    assert httpx.post(f"{base}/py_a/load", json={}).status_code == 200
    assert _infer_identity(infer_grpc, explicit, "py_a") == [0.0, 1.0, 2.0]
    assert httpx.post(f"{base}/py_a/unload", json={}).status_code == 200
    assert _index(explicit)["py_a"]["state"] == "UNAVAILABLE"
    _until(lambda: len(list(cache.rglob("py_a-*"))) == 1)  # only the poll-mode server's copy is left


def test_gcs_repository(server_factory, tmp_path):
    """GCS against gcp-storage-emulator (which checks no credentials: a missing bucket instead)."""
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                             "--port", str(port), "--in-memory"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        host = f"http://127.0.0.1:{port}"
        from gcsfs.core import GCSFileSystem

        fs = GCSFileSystem(endpoint_url=host, token="anon", skip_instance_cache=True)
        fs.mkdir("models")

        def put(key: str, data: bytes) -> None:
            fs.pipe(f"models/repo/{key}", data)

        for key, data in repository_objects(tmp_path).items():
            put(key, data)
        check_store(server_factory, "gs://models/repo", {"STORAGE_EMULATOR_HOST": host}, put, tmp_path / "cache")
        missing = server_factory("--model-control-mode=explicit", repo="gs://no-such-bucket/repo",
                                 env={"STORAGE_EMULATOR_HOST": host})
        r = httpx.post(f"http://{missing.http_url}/v2/repository/models/py_a/load", json={})
        assert r.status_code == 500 and "gs://no-such-bucket/repo" in r.json()["error"], r.text
        assert "does not exist" in r.json()["error"], r.text
    finally:
        _stop(proc)


# Azurite's Blob server as the README's test command installs it (`npm ci --prefix tests/node`:
# tests/node/package-lock.json pins it); TRIDENT_AZURITE names another azurite-blob
AZURITE = Path(os.environ.get("TRIDENT_AZURITE") or Path(__file__).parents[1] / "node/node_modules/.bin/azurite-blob")
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture
def azurite_port() -> Iterator[int]:
    """Azurite's Blob server on a free port of 127.0.0.1, in memory; stopped after the test. Fails
    (does not skip) when Azurite is not installed."""
    if not AZURITE.is_file() or shutil.which("node") is None:
        pytest.fail(f"Azurite is not installed at {AZURITE} (or node is not on PATH): run "
                    "`npm ci --prefix tests/node` from the repository root (the README's test command does)")
    port = _free_port()
    proc = subprocess.Popen([str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                             "--skipApiVersionCheck", "--loose"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        yield port
    finally:
        _stop(proc)


def test_azure_repository(server_factory, tmp_path, azurite_port: int):
    """Azure Blob against Azurite (its well-known development account and key)."""
    port = azurite_port
    conn = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")
    import adlfs

    fs = adlfs.AzureBlobFileSystem(connection_string=conn, skip_instance_cache=True)
    fs.mkdir("models")

    def put(key: str, data: bytes) -> None:
        fs.pipe(f"models/repo/{key}", data)

    for key, data in repository_objects(tmp_path).items():
        put(key, data)
    url = "as://devstoreaccount1/models/repo"
    check_store(server_factory, url, {"AZURE_STORAGE_CONNECTION_STRING": conn}, put, tmp_path / "cache")
    bad = conn.replace(AZURITE_KEY, "d3Jvbmc=")
    denied = server_factory("--model-control-mode=explicit", repo=url, env={"AZURE_STORAGE_CONNECTION_STRING": bad})
    r = httpx.post(f"http://{denied.http_url}/v2/repository/models/py_a/load", json={})
    assert r.status_code == 500 and url in r.json()["error"] and "access denied" in r.json()["error"], r.text


def test_cloud_urls_parse_as_triton_writes_them():
    from trident.errors import TritonError
    from trident.server.cloud_repository import parse_cloud_url

    loc = parse_cloud_url("s3://bucket/a/b/", env={})
    assert (loc.protocol, loc.root, loc.options) == ("s3", "bucket/a/b", {})
    loc = parse_cloud_url("s3://minio.local:9000/bucket/models", env={"AWS_DEFAULT_REGION": "eu-west-1"})
    assert loc.root == "bucket/models" and loc.options["endpoint_url"] == "http://minio.local:9000"
    assert loc.options["client_kwargs"] == {"region_name": "eu-west-1"}
    assert parse_cloud_url("s3://https://s3.local:443/b", env={}).options["endpoint_url"] == "https://s3.local:443"
    loc = parse_cloud_url("as://acct/container/models", env={"AZURE_STORAGE_KEY": "k"})
    assert (loc.protocol, loc.root, loc.options) == ("abfs", "container/models", {"account_name": "acct", "account_key": "k"})
    assert parse_cloud_url("gs://b/p", env={}).root == "b/p"
    for bad in ("s3://", "as://acct", "gs:///", "ftp://x/y"):
        with pytest.raises(TritonError):
            parse_cloud_url(bad, env={})
