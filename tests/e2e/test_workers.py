"""``trident serve --workers N``: N processes that behave as one Triton server, end to end.

The real server with two workers, driven by tritonclient (HTTP and gRPC), httpx and raw
processes. Which worker answers is read from the answer itself: the ``whoami`` model returns
the process id of the worker that ran it, and a client connection is served by one worker
from start to end, so :func:`client_on` opens connections until one lands on the worker
wanted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from e2e.conftest import RunningServer, start_server
from e2e.python_models import MODELS, write_model
from tritonclient.utils import InferenceServerException

WHOAMI = ('''
name: "whoami"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
''', '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers the process id of the worker that runs it."""

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                for _ in requests]
''')

SLOW = ('''
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
''', '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps IN[0] seconds, then answers IN."""

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            time.sleep(float(x[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
''')

# loads in the first worker that gets to it and fails in every other: a load that fails in one
# worker only (the claim file is in the model's folder, named by the test)
ONE_WORKER_ONLY = '''
import os
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        claim = os.path.join(args["model_repository"], "claim")
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)

    def execute(self, requests):
        return []
'''


def _repo(root: Path, *names: str) -> Path:
    repo = root / "repo"
    repo.mkdir(exist_ok=True)
    extra = {"whoami": WHOAMI, "slow": SLOW}
    for name in names:
        config, code = extra.get(name) or MODELS[name]
        folder = repo / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(config)
        (folder / "1" / "model.py").write_text(code)
    return repo


def worker_pids(server: RunningServer) -> list[int]:
    """The worker processes of a supervisor (its children)."""
    out = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True)
    return sorted(int(p) for p in out.stdout.split())


def _whoami_http(client: httpclient.InferenceServerClient) -> int:
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], np.int32))
    return int(client.infer("whoami", [inp]).as_numpy("PID")[0])


def _whoami_grpc(client: grpcclient.InferenceServerClient) -> int:
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], np.int32))
    return int(client.infer("whoami", [inp], client_timeout=30).as_numpy("PID")[0])


def client_on(server: RunningServer, pid: int, protocol: str = "http"):
    """A tritonclient client whose connection is served by worker ``pid``."""
    for _ in range(200):
        if protocol == "http":
            client = httpclient.InferenceServerClient(server.http_url, connection_timeout=30, network_timeout=60)
            got = _whoami_http(client)
        else:  # a connection of its own (grpcio shares one between channels to a target otherwise)
            client = grpcclient.InferenceServerClient(server.grpc_url,
                                                      channel_args=[("grpc.use_local_subchannel_pool", 1)])
            got = _whoami_grpc(client)
        if got == pid:
            return client
        client.close()
    raise AssertionError(f"no {protocol} connection landed on worker {pid} in 200 tries")


def _add_sub_inputs(mod, value: float = 1.0):
    a = mod.InferInput("INPUT0", [1, 16], "FP32")
    a.set_data_from_numpy(np.full((1, 16), value, np.float32))
    b = mod.InferInput("INPUT1", [1, 16], "FP32")
    b.set_data_from_numpy(np.ones((1, 16), np.float32))
    return [a, b]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    repo = _repo(tmp_path_factory.mktemp("workers"), "whoami", "add_sub", "slow", "repeater")
    server = start_server("--workers", "2", "--model-control-mode", "explicit", "--load-model", "whoami",
                          "--load-model", "add_sub", "--load-model", "repeater", "--allow-client-shm=true",
                          repo=repo, timeout=120)
    server.repo = repo  # type: ignore[attr-defined]
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def pids(cluster) -> list[int]:
    found = worker_pids(cluster)
    assert len(found) == 2, found
    return found


# ---- one server to the outside ---------------------------------------------------------------


def test_every_worker_serves_both_protocols_and_says_it_is_one_server(cluster, pids):
    assert "serving from 2 worker processes" in cluster.log()
    assert cluster.log().count("model loading complete:") == 1
    for pid in pids:
        for protocol in ("http", "grpc"):
            client = client_on(cluster, pid, protocol)
            try:
                mod = httpclient if protocol == "http" else grpcclient
                result = client.infer("add_sub", _add_sub_inputs(mod, 2.0))
                assert result.as_numpy("OUTPUT0").tolist() == [[3.0] * 16]
                assert client.is_server_ready() and client.is_model_ready("add_sub")
                meta = client.get_server_metadata()
                assert (meta["name"] if protocol == "http" else meta.name) == "triton"
            finally:
                client.close()


def test_the_explicit_load_and_unload_apply_to_every_worker(cluster, pids):
    a, b = client_on(cluster, pids[0]), client_on(cluster, pids[1], "grpc")
    try:
        assert not a.is_model_ready("slow") and not b.is_model_ready("slow")
        a.load_model("slow")  # answers once every worker has it
        assert a.is_model_ready("slow") and b.is_model_ready("slow")
        index_a = {(m["name"], m.get("state")) for m in a.get_model_repository_index()}
        index_b = {(m.name, m.state) for m in b.get_model_repository_index().models}
        assert ("slow", "READY") in index_a and index_a == index_b
        b.unload_model("slow")
        assert not a.is_model_ready("slow") and not b.is_model_ready("slow")
        # a config override reaches every worker too
        config = json.dumps({"backend": "python", "max_batch_size": 0,
                             "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
                             "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
                             "parameters": {"tag": {"string_value": "override"}}})
        b.load_model("slow", config=config)
        assert a.get_model_config("slow")["parameters"]["tag"]["string_value"] == "override"
        assert b.get_model_config("slow").config.parameters["tag"].string_value == "override"
    finally:
        a.close()
        b.close()


def test_a_load_that_fails_in_one_worker_leaves_none_half_loaded(cluster, pids):
    folder = cluster.repo / "claims"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(SLOW[0].replace('name: "slow"', 'name: "claims"'))
    (folder / "1" / "model.py").write_text(ONE_WORKER_ONLY)
    a, b = client_on(cluster, pids[0]), client_on(cluster, pids[1])
    try:
        with pytest.raises(InferenceServerException) as e:
            a.load_model("claims")
        assert "claims" in e.value.message() and "File exists" in e.value.message()
        for client in (a, b):  # the worker where it loaded dropped it again
            assert not client.is_model_ready("claims")
            entries = [m for m in client.get_model_repository_index() if m["name"] == "claims"]
            assert entries and all(m.get("state") == "UNAVAILABLE" for m in entries), entries
            assert "File exists" in entries[0]["reason"]
            assert not client.is_server_ready()  # strict readiness, as a single server: a model failed
        assert a.is_server_live() and a.is_model_ready("add_sub") and b.is_model_ready("add_sub")
        b.unload_model("claims")
        assert a.is_server_ready() and b.is_server_ready()
    finally:
        a.close()
        b.close()


def test_a_bad_load_is_one_clear_error(cluster, pids):
    client = client_on(cluster, pids[1])
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("no_such_model")
        assert "failed to poll from model repository" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            client.load_model("slow", config="[not an object]")
        assert e.value.status() == "500"
        with pytest.raises(InferenceServerException) as e:
            client.load_model("m" * 300)
        assert e.value.status() == "400"
        assert client.is_server_ready()
    finally:
        client.close()


def test_statistics_and_metrics_are_summed_over_the_workers(cluster, pids):
    clients = [client_on(cluster, pid) for pid in pids]
    try:
        before = clients[0].get_inference_statistics("add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
        for i in range(10):
            clients[i % 2].infer("add_sub", _add_sub_inputs(httpclient))
        for client in clients:  # either worker answers with the sum
            stats = client.get_inference_statistics("add_sub")["model_stats"][0]
            assert stats["inference_stats"]["success"]["count"] == before + 10
        with grpcclient.InferenceServerClient(cluster.grpc_url) as g:
            assert g.get_inference_statistics("add_sub").model_stats[0].inference_stats.success.count == before + 10
        text = httpx.get(cluster.metrics_url, timeout=30).text
        m = re.search(r'nv_inference_request_success\{model="add_sub",version="1"\} (\S+)', text)
        assert m and float(m.group(1)) == before + 10, text[:2000]
        assert text.count('nv_inference_request_success{model="add_sub",version="1"}') == 1
        assert "nv_cpu_utilization" in text  # the host's, once
        with pytest.raises(InferenceServerException) as e:
            clients[1].get_inference_statistics("no_such_model")
        assert "requested model 'no_such_model' is not available" in e.value.message()
    finally:
        for client in clients:
            client.close()


def test_settings_changed_through_one_worker_apply_everywhere(cluster, pids):
    url = f"http://{cluster.http_url}"
    a, b = client_on(cluster, pids[0]), client_on(cluster, pids[1])
    try:
        a.update_log_settings({"log_verbose_level": 1})
        assert b.get_log_settings()["log_verbose_level"] == 1
        b.update_trace_settings(model_name="add_sub", settings={"trace_rate": "7"})
        assert a.get_trace_settings(model_name="add_sub")["trace_rate"] == "7"
        a.update_log_settings({"log_verbose_level": 0})
        with pytest.raises(InferenceServerException):
            b.update_log_settings({"log_verbose_level": -1})
        assert a.get_log_settings()["log_verbose_level"] == 0
        r = httpx.post(f"{url}/v2/trace/setting", json={"trace_file": "/tmp/x"})
        assert r.status_code == 501
    finally:
        a.close()
        b.close()


def test_a_shared_memory_region_registered_through_one_worker_serves_on_every_worker(cluster, pids):
    key = f"/trident-workers-{os.getpid()}"
    handle = shm.create_shared_memory_region("wk", key, 64)
    try:
        shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
        a, b = client_on(cluster, pids[0], "grpc"), client_on(cluster, pids[1], "grpc")
        try:
            a.register_system_shared_memory("wk", key, 64)
            assert "wk" in b.get_system_shared_memory_status().regions
            inputs = _add_sub_inputs(grpcclient)
            inputs[0].set_shared_memory("wk", 64)
            assert b.infer("add_sub", inputs).as_numpy("OUTPUT0").reshape(-1).tolist() == list(range(1, 17))
            with pytest.raises(InferenceServerException) as e:
                b.register_system_shared_memory("wk", key, 64)
            assert "already in manager" in e.value.message()
            b.unregister_system_shared_memory("wk")
            assert "wk" not in a.get_system_shared_memory_status().regions
            with pytest.raises(InferenceServerException):  # a region that cannot be mapped: refused everywhere
                a.register_system_shared_memory("wk2", "/no-such-region", 64)
            assert "wk2" not in b.get_system_shared_memory_status().regions
        finally:
            a.close()
            b.close()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_decoupled_stream_on_each_worker(cluster, pids):
    for pid in pids:
        client = client_on(cluster, pid, "grpc")
        got: list[int] = []
        done = threading.Event()

        def callback(result, error, got=got, done=done):
            if error is not None:
                got.append(-1)
            elif result.get_response().parameters.get("triton_final_response") and not result.get_response().outputs:
                done.set()
            else:
                got.append(int(result.as_numpy("OUT")[0]))

        try:
            client.start_stream(callback)
            inputs = [grpcclient.InferInput("IN", [1], "INT32"), grpcclient.InferInput("DELAY", [1], "FP32")]
            inputs[0].set_data_from_numpy(np.array([4], np.int32))
            inputs[1].set_data_from_numpy(np.array([0.0], np.float32))
            client.async_stream_infer("repeater", inputs, enable_empty_final_response=True)
            assert done.wait(30)
            assert got == [0, 1, 2, 3]
        finally:
            client.stop_stream()
            client.close()


# ---- a worker that dies, and the drain -------------------------------------------------------


def test_a_killed_worker_comes_back_and_the_others_lose_nothing(cluster, pids):
    victim, survivor = pids
    errors: list[str] = []
    answered = 0
    stop = threading.Event()
    connected = threading.Event()

    def keep_asking() -> None:  # a client on the worker that stays (tritonclient HTTP: one thread each)
        nonlocal answered
        steady = client_on(cluster, survivor)
        connected.set()
        try:
            while not stop.is_set():
                try:
                    result = steady.infer("add_sub", _add_sub_inputs(httpclient, 5.0))
                    assert result.as_numpy("OUTPUT0").tolist() == [[6.0] * 16]
                    answered += 1
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    errors.append(repr(e))
        finally:
            steady.close()

    thread = threading.Thread(target=keep_asking)
    thread.start()
    try:
        assert connected.wait(60)
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = worker_pids(cluster)
            if len(now) == 2 and victim not in now and httpx.get(f"http://{cluster.http_url}/v2/health/ready").status_code == 200:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the worker did not come back: {worker_pids(cluster)}\n{cluster.log()[-3000:]}")
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors[:3]
    assert answered > 10
    assert "killed by signal SIGKILL" in cluster.log()
    newcomer = next(p for p in worker_pids(cluster) if p != survivor)
    # the newcomer has what the others have: the models loaded at start-up and through the API
    client = client_on(cluster, newcomer)
    try:
        assert client.is_model_ready("add_sub") and client.is_model_ready("repeater")
        assert client.infer("add_sub", _add_sub_inputs(httpclient)).as_numpy("OUTPUT1").tolist() == [[0.0] * 16]
    finally:
        client.close()
    # the fixture's later tests see the new worker
    pids[:] = sorted(worker_pids(cluster))


def test_sigterm_drains_every_worker(tmp_path):
    server = start_server("--workers", "2", repo=_repo(tmp_path, "whoami", "slow"), timeout=120)
    results: dict[int, object] = {}

    def slow_call(i: int) -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        try:
            inp = httpclient.InferInput("IN", [1], "FP32")
            inp.set_data_from_numpy(np.array([2.0], np.float32))
            results[i] = client.infer("slow", [inp]).as_numpy("OUT").tolist()
        except Exception as e:  # noqa: BLE001
            results[i] = repr(e)
        finally:
            client.close()

    threads = [threading.Thread(target=slow_call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # in flight in both workers (six connections over two)
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert server.proc.wait(60) == 0
    assert all(r == [2.0] for r in results.values()), results
    assert "server stopped" in server.log()


# ---- start-up and bad input ------------------------------------------------------------------


def _run(*flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trident", "serve", "--http-port=0", "--grpc-port=0",
                           "--metrics-port=0", *flags], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("value", ["0", "-1", "two", "257", "1.5"])
def test_bad_worker_counts_are_one_line(value):
    proc = _run(f"--workers={value}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--workers" in lines[0], proc.stderr


def test_a_port_in_use_is_one_message_not_one_per_worker():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _run("--workers=2", "--http-address=127.0.0.1", f"--http-port={port}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("E")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    assert f"127.0.0.1:{port} already in use" in errors[0]
    assert "worker" not in proc.stderr.split("already in use")[0].split("\n")[-1]


def test_a_missing_repository_is_one_message(tmp_path):
    proc = _run("--workers=2", f"--model-repository={tmp_path / 'nothing'}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("E")]
    assert proc.returncode == 1 and len(errors) == 1 and "does not exist" in errors[0], proc.stderr


def test_more_workers_than_cpus_is_allowed_with_a_warning(tmp_path):
    count = len(os.sched_getaffinity(0)) + 1
    server = start_server("--workers", str(count), repo=_repo(tmp_path, "whoami"), timeout=120)
    try:
        assert f"--workers {count} is more than the" in server.log()
        assert len(worker_pids(server)) == count
        assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200
    finally:
        assert server.stop() == 0


def test_a_worker_that_dies_during_start_up_stops_the_start_with_one_message(tmp_path):
    repo = _repo(tmp_path, "whoami")
    (repo / "whoami" / "1" / "model.py").write_text(WHOAMI[1].replace(
        "class TritonPythonModel:", "class TritonPythonModel:\n    def initialize(self, args):\n"
        "        import time\n        time.sleep(30)\n"))
    proc = subprocess.Popen([sys.executable, "-m", "trident", "serve", "--workers=2", "--http-port=0",
                             "--grpc-port=0", "--metrics-port=0", f"--model-repository={repo}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    children: list[int] = []
    while time.monotonic() < deadline and len(children) < 2:
        out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
        children = [int(p) for p in out.split()]
        time.sleep(0.2)
    time.sleep(2)
    os.kill(children[0], signal.SIGKILL)
    output, _ = proc.communicate(timeout=120)
    errors = [line for line in output.splitlines() if line.startswith("E")]
    assert proc.returncode == 1, output
    assert len(errors) == 1 and "exited during start-up (killed by signal SIGKILL)" in errors[0], output


def test_poll_mode_applies_repository_changes_to_every_worker(tmp_path):
    repo = _repo(tmp_path, "whoami")
    server = start_server("--workers", "2", "--model-control-mode", "poll", "--repository-poll-secs", "1",
                          repo=repo, timeout=120)
    try:
        pids = worker_pids(server)
        write_model(repo, "add_sub")
        deadline = time.monotonic() + 30
        clients = [client_on(server, pid) for pid in pids]
        try:
            while time.monotonic() < deadline and not all(c.is_model_ready("add_sub") for c in clients):
                time.sleep(0.2)
            assert all(c.is_model_ready("add_sub") for c in clients)
            import shutil

            shutil.rmtree(repo / "add_sub")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(c.is_model_ready("add_sub") for c in clients):
                time.sleep(0.2)
            assert not any(c.is_model_ready("add_sub") for c in clients)
        finally:
            for c in clients:
                c.close()
    finally:
        server.stop()


# ---- --reuse-http-port / --reuse-grpc-port (one process each) -------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reuse_port_lets_two_servers_share_the_ports(tmp_path):
    http, grpc = _free_port(), _free_port()
    flags = ("--http-port", str(http), "--grpc-port", str(grpc), "--allow-metrics=false")
    cmd = [sys.executable, "-m", "trident", "serve", "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--model-repository", str(_repo(tmp_path, "whoami"))]
    first = start_server(*flags, "--reuse-http-port=true", "--reuse-grpc-port=true", command=cmd)
    try:
        second = start_server(*flags, "--reuse-http-port=true", "--reuse-grpc-port=true", command=cmd)
        try:
            seen = set()
            for _ in range(100):
                seen.add(_whoami_http(c := httpclient.InferenceServerClient(f"127.0.0.1:{http}")))
                c.close()
                seen.add(_whoami_grpc(g := grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")))
                g.close()
                if seen == {first.proc.pid, second.proc.pid}:
                    break
            assert seen == {first.proc.pid, second.proc.pid}
        finally:
            second.stop()
        # without the flag, the port is refused as in use
        proc = subprocess.run([*cmd, "--http-port", str(http), "--grpc-port", "0", "--allow-metrics=false"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and "already in use" in proc.stderr
    finally:
        first.stop()


# ---- sequences: every request of a correlation id reaches one worker's sequence slot -----------


@pytest.fixture(scope="module")
def sequences(tmp_path_factory):
    from e2e.test_sequence import (
        ACC_PY,
        DECOUPLED_CONFIG,
        DECOUPLED_PY,
        STATE_CONFIG,
        STATE_PY,
        acc_config,
        write_onnx_accumulator,
    )

    repo = _repo(tmp_path_factory.mktemp("workers-seq"), "whoami")
    models = {"acc_py": (acc_config("acc_py", "TYPE_UINT64"), ACC_PY),
              "acc_str": (acc_config("acc_str", "TYPE_STRING"), ACC_PY),
              "acc_oldest": (acc_config("acc_oldest", "TYPE_UINT64").replace(
                  "sequence_batching {", "sequence_batching {\n  oldest { max_candidate_sequences: 4 }"), ACC_PY),
              "state_py": (STATE_CONFIG, STATE_PY), "acc_decoupled": (DECOUPLED_CONFIG, DECOUPLED_PY)}
    for name, (config, code) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(code)
    write_onnx_accumulator(repo)
    server = start_server("--workers", "2", repo=repo, timeout=180)
    yield server
    assert server.stop() == 0


def _new_client(server: RunningServer, protocol: str):
    """A client on a connection of its own: it lands on either worker."""
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])


def _step(server, protocol: str, model: str, sid, value, start: bool, end: bool, dtype="INT32"):
    mod = httpclient if protocol == "http" else grpcclient
    client = _new_client(server, protocol)
    try:
        inp = mod.InferInput("INPUT", [1, 1], dtype)
        inp.set_data_from_numpy(np.array([[value]], np.int32 if dtype == "INT32" else np.float32))
        result = client.infer(model, [inp], outputs=[mod.InferRequestedOutput("OUTPUT")], sequence_id=sid,
                              sequence_start=start, sequence_end=end)
        return result.as_numpy("OUTPUT").reshape(-1)[0].item()
    finally:
        client.close()


@pytest.mark.parametrize("model", ["acc_py", "acc_oldest", "state_py", "acc_onnx"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_keeps_its_state_whichever_worker_each_request_reaches(sequences, model, protocol):
    dtype = "FP32" if model == "acc_onnx" else "INT32"
    ids = [1000 + 7 * k for k in range(6)] if model != "acc_str" else [f"s-{k}" for k in range(6)]
    totals = {sid: 0 for sid in ids}
    for step in range(5):  # interleaved sequences, each request on a new connection
        for sid in ids:
            value = (ids.index(sid) + 1) * (step + 1)
            totals[sid] += value
            got = _step(sequences, protocol, model, sid, value, step == 0, step == 4, dtype)
            assert got == totals[sid], (model, sid, step, got, totals[sid])


def test_string_correlation_ids_across_workers(sequences):
    totals: dict[str, int] = {}
    for step in range(4):
        for k in range(5):
            sid = f"string-{k}"
            totals[sid] = totals.get(sid, 0) + k + step
            protocol = "http" if (k + step) % 2 else "grpc"
            assert _step(sequences, protocol, "acc_str", sid, k + step, step == 0, step == 3) == totals[sid]


def test_a_decoupled_sequence_over_streams_on_both_workers(sequences):
    for sid in ("stream-a", "stream-b", "stream-c"):
        answers: list[int] = []
        for k in range(3):  # each request on a stream of a new connection
            client = _new_client(sequences, "grpc")
            got: list[int] = []
            done = threading.Event()

            def callback(result, error, got=got, done=done):
                if error is not None:
                    got.append(-1)
                    done.set()
                elif result.get_response().parameters.get("triton_final_response") and not result.get_response().outputs:
                    done.set()
                else:
                    got.append(int(result.as_numpy("OUTPUT").reshape(-1)[0]))

            try:
                client.start_stream(callback)
                inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                inp.set_data_from_numpy(np.array([[k + 1]], np.int32))
                client.async_stream_infer("acc_decoupled", [inp], sequence_id=sid, sequence_start=k == 0,
                                          sequence_end=k == 2, enable_empty_final_response=True)
                assert done.wait(30)
            finally:
                client.stop_stream()
                client.close()
            answers += got
        assert answers == [1, 10, 3, 30, 6, 60], (sid, answers)


def test_a_sequence_request_without_a_start_is_refused_alike_on_every_worker(sequences):
    for _ in range(6):
        with pytest.raises(InferenceServerException) as e:
            _step(sequences, "http", "acc_py", 987654, 1, False, False)
        assert "START" in e.value.message() or "start" in e.value.message()


# ---- a model placed on one worker: the others forward to it ---------------------------------

PLACED = ('''
name: "placed"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
parameters { key: "trident_placement" value: { string_value: "worker:1" } }
''', '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUT = IN * 2, and the process id of the worker that ran it."""

    def initialize(self, args):
        open(os.path.join(args["model_repository"], f"loaded-{os.getpid()}"), "w").close()

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2),
                                                   pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
        return out
''')


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    repo = _repo(tmp_path_factory.mktemp("workers-placed"), "whoami", "repeater")
    (repo / "placed" / "1").mkdir(parents=True)
    (repo / "placed" / "config.pbtxt").write_text(PLACED[0])
    (repo / "placed" / "1" / "model.py").write_text(PLACED[1])
    config = (repo / "repeater" / "config.pbtxt").read_text()
    (repo / "repeater" / "config.pbtxt").write_text(
        config + '\nparameters { key: "trident_placement" value: { string_value: "one" } }\n')
    server = start_server("--workers", "2", "--model-control-mode", "explicit", "--load-model", "*",
                          repo=repo, timeout=180)
    server.repo = repo  # type: ignore[attr-defined]
    yield server
    assert server.stop() == 0


def _placed_infer(client, mod, x: np.ndarray) -> tuple[np.ndarray, int]:
    inp = mod.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, **({"binary_data": True} if mod is httpclient else {}))
    result = client.infer("placed", [inp])
    return result.as_numpy("OUT"), int(result.as_numpy("PID")[0])


def test_a_placed_model_is_loaded_once_and_served_from_every_worker(placed):
    pids = worker_pids(placed)
    loaded = sorted(int(p.name.split("-")[1]) for p in (placed.repo / "placed").glob("loaded-*"))
    assert len(loaded) == 1 and loaded[0] in pids  # one worker ran initialize
    owner = loaded[0]
    big = np.random.default_rng(0).random(262_144, dtype=np.float32)  # 1 MiB: through the arenas
    for pid in pids:
        for protocol, mod in (("http", httpclient), ("grpc", grpcclient)):
            client = client_on(placed, pid, protocol)
            try:
                assert client.is_model_ready("placed")
                for x in (np.arange(4, dtype=np.float32), big):
                    out, served_by = _placed_infer(client, mod, x)
                    assert served_by == owner and np.array_equal(out, x * 2)
                meta = client.get_model_metadata("placed")
                assert (meta["name"] if protocol == "http" else meta.name) == "placed"
            finally:
                client.close()
    stats = httpclient.InferenceServerClient(placed.http_url).get_inference_statistics("placed")
    assert stats["model_stats"][0]["inference_stats"]["success"]["count"] == 8  # each counted once


def test_a_placed_decoupled_model_streams_from_every_worker(placed):
    for pid in worker_pids(placed):
        client = client_on(placed, pid, "grpc")
        got: list[int] = []
        done = threading.Event()

        def callback(result, error, got=got, done=done):
            if error is not None:
                got.append(-1)
                done.set()
            elif result.get_response().parameters.get("triton_final_response") and not result.get_response().outputs:
                done.set()
            else:
                got.append(int(result.as_numpy("OUT")[0]))

        try:
            client.start_stream(callback)
            inputs = [grpcclient.InferInput("IN", [1], "INT32"), grpcclient.InferInput("DELAY", [1], "FP32")]
            inputs[0].set_data_from_numpy(np.array([3], np.int32))
            inputs[1].set_data_from_numpy(np.array([0.0], np.float32))
            client.async_stream_infer("repeater", inputs, enable_empty_final_response=True)
            assert done.wait(30)
            assert got == [0, 1, 2]
        finally:
            client.stop_stream()
            client.close()


def test_a_bad_placement_is_refused_with_its_value(placed):
    folder = placed.repo / "misplaced"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(PLACED[0].replace('"placed"', '"misplaced"').replace("worker:1", "everywhere"))
    (folder / "1" / "model.py").write_text(PLACED[1])
    client = httpclient.InferenceServerClient(placed.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("misplaced")
        assert "unknown trident_placement 'everywhere'" in e.value.message()
    finally:
        client.close()


def test_while_the_placed_worker_restarts_its_model_is_unavailable_elsewhere(placed):
    owner = sorted(int(p.name.split("-")[1]) for p in (placed.repo / "placed").glob("loaded-*"))[-1]
    other = next(p for p in worker_pids(placed) if p != owner)
    client = client_on(placed, other)
    try:
        os.kill(owner, signal.SIGKILL)
        time.sleep(0.3)
        with pytest.raises(InferenceServerException) as e:
            _placed_infer(client, httpclient, np.ones(4, np.float32))
        assert e.value.status() == "503" and "worker 1" in e.value.message(), e.value.message()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                out, served_by = _placed_infer(client, httpclient, np.ones(4, np.float32))
                break
            except InferenceServerException:
                time.sleep(0.3)
        else:
            raise AssertionError("the placed model did not come back")
        assert served_by not in (owner, other) and out.tolist() == [2.0] * 4
    finally:
        client.close()


def test_a_worker_killed_during_a_load_fails_that_load_alone(cluster, pids):
    """The load call gets UNAVAILABLE naming the worker; no worker keeps the model; the worker
    comes back in step; the same load then succeeds everywhere."""
    folder = cluster.repo / "sleepy"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(SLOW[0].replace('name: "slow"', 'name: "sleepy"'))
    (folder / "1" / "model.py").write_text(SLOW[1].replace(
        "class TritonPythonModel:", "class TritonPythonModel:\n    def initialize(self, args):\n"
        "        time.sleep(3)\n"))
    victim, survivor = worker_pids(cluster)
    outcome: list[str] = []
    in_step = cluster.log().count("is in step with the others")

    def load() -> None:  # through the worker that stays (the victim's own connections end with it)
        client = client_on(cluster, survivor)
        try:
            client.load_model("sleepy")
            outcome.append("loaded")
        except InferenceServerException as e:
            outcome.append(e.message())
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            outcome.append(repr(e))
        finally:
            client.close()

    thread = threading.Thread(target=load)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cluster.log().count("loading 'sleepy'") < 2:
        time.sleep(0.05)  # until both workers are in the model's initialize
    os.kill(victim, signal.SIGKILL)
    thread.join(60)
    assert len(outcome) == 1 and "exited during the load" in outcome[0], outcome
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and cluster.log().count("is in step with the others") == in_step:
        time.sleep(0.2)
    now = worker_pids(cluster)
    assert len(now) == 2 and victim not in now
    clients = [client_on(cluster, pid) for pid in now]
    try:
        for client in clients:  # the failed load is the same failure everywhere, the new worker included
            assert not client.is_model_ready("sleepy")
            assert client.is_model_ready("add_sub")
            row = next(m for m in client.get_model_repository_index() if m["name"] == "sleepy")
            assert row["state"] == "UNAVAILABLE" and "exited during the load" in row["reason"]
            assert not client.is_server_ready()  # strict readiness: a model failed to load
        clients[0].load_model("sleepy")
        assert all(client.is_model_ready("sleepy") for client in clients)
        assert all(client.is_server_ready() for client in clients)
        clients[1].unload_model("sleepy")
    finally:
        for client in clients:
            client.close()
    pids[:] = sorted(now)
