"""Scheduling end to end with tritonclient (HTTP and gRPC) against ``trident serve``: dynamic
batching, priorities, queue timeouts and a full queue, cancellation of queued requests,
preserved ordering, the response cache, warmup, instance-count changes and instance kinds."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import pending
from tritonclient.utils import InferenceServerException

MODEL_PY = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps max(X[0]) s (polling cancellation); Y = X, ORDER = execution number, SIZE = requests in it.
    Appends "<instance> start <request ids>" and "<instance> exec <n> <requests> <request ids>" to the
    log named by the 'log' parameter."""

    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.log = params.get("log", {}).get("string_value")
        self.name = args["model_instance_name"]
        self.executions = 0

    def _write(self, line):
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{self.name} {line}\\n")

    def execute(self, requests):
        ids = ",".join(r.request_id() or "-" for r in requests)
        self._write(f"start {ids}")
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        delay = max(float(x.reshape(-1)[0]) for x in xs)
        if delay < 0:
            raise pb_utils.TritonModelException("negative input")
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not all(r.is_cancelled() for r in requests):
            time.sleep(0.002)
        n = self.executions
        self.executions += 1
        self._write(f"exec {n} {len(requests)} {ids}")
        out = []
        for x in xs:
            shape = x.shape[:1] + (1,)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x),
                pb_utils.Tensor("ORDER", np.full(shape, n, np.int64)),
                pb_utils.Tensor("SIZE", np.full(shape, len(requests), np.int64)),
            ]))
        return out
'''

IO = '''
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "ORDER" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "SIZE" data_type: TYPE_INT64 dims: [ 1 ] } ]
'''

MODELS = {
    "batched": (8, "dynamic_batching { max_queue_delay_microseconds: 20000 }"),
    "prio": (1, "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"),
    "policy": (1, "dynamic_batching { default_queue_policy { default_timeout_microseconds: 2000000 "
                  "allow_timeout_override: true max_queue_size: 2 } }"),
    "queued": (1, "dynamic_batching { }"),
    "ordered": (1, "dynamic_batching { preserve_ordering: true } instance_group [ { count: 2 kind: KIND_CPU } ]"),
    "unordered": (1, "dynamic_batching { } instance_group [ { count: 2 kind: KIND_CPU } ]"),
    "cached": (8, "response_cache { enable: true }"),
    "limited": (1, 'instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] '
                   "priority: 1 } } ]"),
    "auto": (1, "instance_group [ { count: 1 kind: KIND_AUTO }, { name: \"cpus\" count: 2 kind: KIND_CPU } ]"),
}


def write_model(repo: Path, name: str, max_batch_size: int, extra: str, io: str = IO) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: {max_batch_size}\n{io}\n'
        f'parameters {{ key: "log" value {{ string_value: "{repo / (name + ".log")}" }} }}\n{extra}\n'
    )
    return folder


def log_lines(repo: Path, name: str) -> list[list[str]]:
    path = repo / f"{name}.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def executions(repo: Path, name: str) -> list[list[str]]:
    """[instance, "exec", n, requests, ids] of each finished execution."""
    return [e for e in log_lines(repo, name) if e[1] == "exec"]


def started(repo: Path, name: str, request_id: str) -> bool:
    return any(e[1] == "start" and request_id in e[2].split(",") for e in log_lines(repo, name))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scheduling-repo")
    for name, (mbs, extra) in MODELS.items():
        write_model(root, name, mbs, extra)
    return root


@pytest.fixture(scope="module")
def server(repo):
    from e2e.conftest import start_server

    s = start_server("--cache-config", "local,size=1048576", "--rate-limit", "execution_count", repo=repo)
    yield s
    s.stop()


def http_input(x: float, batch: int = 1):
    inp = httpclient.InferInput("X", [batch, 1], "FP32")
    inp.set_data_from_numpy(np.full((batch, 1), x, np.float32))
    return [inp]


def grpc_input(x: float, batch: int = 1):
    inp = grpcclient.InferInput("X", [batch, 1], "FP32")
    inp.set_data_from_numpy(np.full((batch, 1), x, np.float32))
    return [inp]


class Call:
    """One blocking HTTP inference in its own thread and client (gevent clients stay per thread)."""

    def __init__(self, server, model: str, x: float, **kwargs) -> None:
        self.result = None
        self.error: InferenceServerException | None = None
        self._thread = threading.Thread(target=self._run, args=(server.http_url, model, x, kwargs), daemon=True)
        self._thread.start()

    def _run(self, url: str, model: str, x: float, kwargs) -> None:
        client = httpclient.InferenceServerClient(url)
        try:
            self.result = client.infer(model, http_input(x), **kwargs)
        except InferenceServerException as e:
            self.error = e
        finally:
            client.close()

    def get(self, timeout: float = 30.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the inference did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def test_64_concurrent_requests_form_batches(server):
    client = httpclient.InferenceServerClient(server.http_url, concurrency=64)
    try:
        futures = [client.async_infer("batched", http_input(0.05), request_id=str(i)) for i in range(64)]
        results = [f.get_result() for f in futures]
        stats = client.get_inference_statistics("batched")["model_stats"][0]
    finally:
        client.close()
    assert all(r.as_numpy("Y")[0, 0] == np.float32(0.05) for r in results)
    assert int(stats["inference_count"]) == 64 and int(stats["execution_count"]) < 64
    sizes = {int(b["batch_size"]) for b in stats["batch_stats"]}
    assert max(sizes) > 1 and max(sizes) <= 8
    assert sum(int(b["batch_size"]) * int(b["compute_infer"]["count"]) for b in stats["batch_stats"]) == 64
    assert int(stats["inference_stats"]["success"]["count"]) == 64
    assert int(stats["inference_stats"]["queue"]["count"]) == 64 and int(stats["last_inference"]) > 0
    with grpcclient.InferenceServerClient(server.grpc_url) as g:  # the same figures over gRPC
        gstats = g.get_inference_statistics("batched", as_json=True)["model_stats"][0]
    assert int(gstats["execution_count"]) == int(stats["execution_count"])
    assert [int(b["batch_size"]) for b in gstats["batch_stats"]] == [int(b["batch_size"]) for b in stats["batch_stats"]]


def test_priorities_reorder_queued_requests(server, repo):
    blocker = Call(server, "prio", 3.0, request_id="blocker")
    wait_for(lambda: started(repo, "prio", "blocker"))
    low = Call(server, "prio", 0.0, request_id="low")
    wait_for(lambda: pending(server, "prio") == 1)
    low2 = Call(server, "prio", 0.0, request_id="low2", priority=2)
    wait_for(lambda: pending(server, "prio") == 2)
    high = Call(server, "prio", 0.0, request_id="high", priority=1)
    order = {name: int(c.get().as_numpy("ORDER")[0, 0])
             for name, c in (("blocker", blocker), ("low", low), ("low2", low2), ("high", high))}
    assert order == {"blocker": 0, "high": 1, "low": 2, "low2": 3}


def test_queue_timeout_and_full_queue_are_unavailable(server, repo):
    blocker = Call(server, "policy", 5.0, request_id="blocker")
    wait_for(lambda: started(repo, "policy", "blocker"))
    queued = [Call(server, "policy", 0.0, request_id=f"q{i}") for i in range(2)]
    wait_for(lambda: pending(server, "policy") == 2)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as full:
            client.infer("policy", http_input(0.0), request_id="full")
        assert full.value.status() == "503" and "Exceeds maximum queue size" in full.value.message()
        for call in queued:  # the default timeout (2 s) passes while the blocker runs
            with pytest.raises(InferenceServerException) as e:
                call.get()
            assert e.value.status() == "503" and "Request timeout expired" in e.value.message()
        with pytest.raises(InferenceServerException) as e:  # a shorter timeout of the request's own
            client.infer("policy", http_input(0.0), request_id="short", timeout=100_000)
        assert e.value.status() == "503" and "Request timeout expired" in e.value.message()
        with grpcclient.InferenceServerClient(server.grpc_url) as g, pytest.raises(InferenceServerException) as ge:
            g.infer("policy", grpc_input(0.0), request_id="short-grpc", timeout=100_000)
        assert ge.value.status() == "StatusCode.UNAVAILABLE" and "Request timeout expired" in ge.value.message()
        assert blocker.get().as_numpy("ORDER")[0, 0] == 0
        stats = client.get_inference_statistics("policy")["model_stats"][0]
    finally:
        client.close()
    assert [e[4] for e in executions(repo, "policy")] == ["blocker"]
    assert int(stats["inference_stats"]["fail"]["count"]) == 5


def test_cancelled_queued_requests_never_execute(server, repo):
    with grpcclient.InferenceServerClient(server.grpc_url) as g:
        done = threading.Event()

        def blocker():
            g.infer("queued", grpc_input(3.0), request_id="blocker")
            done.set()

        threading.Thread(target=blocker, daemon=True).start()
        wait_for(lambda: started(repo, "queued", "blocker"))
        with pytest.raises(InferenceServerException) as e:
            g.infer("queued", grpc_input(0.0), request_id="gone-grpc", client_timeout=0.2)
        assert "Deadline" in str(e.value.status()) or "DEADLINE" in str(e.value.status())
        with pytest.raises(httpx.TimeoutException):  # an HTTP client that goes away
            httpx.post(f"http://{server.http_url}/v2/models/queued/infer", timeout=0.2,
                       json={"id": "gone-http", "inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32",
                                                            "data": [0.0]}]})
        assert done.wait(10)
        after = g.infer("queued", grpc_input(0.0), request_id="after")
        assert after.as_numpy("Y") is not None
    ids = [e[4] for e in executions(repo, "queued")]
    assert ids == ["blocker", "after"]


def _complete_order(server, repo: Path, model: str) -> list[str]:
    finished: list[str] = []
    lock = threading.Lock()
    all_done = threading.Event()

    def callback(tag):
        def cb(result, error):
            with lock:
                finished.append(tag if error is None else f"{tag}:{error}")
                if len(finished) == 2:
                    all_done.set()
        return cb

    with grpcclient.InferenceServerClient(server.grpc_url) as g:
        g.async_infer(model, grpc_input(1.0), callback=callback("slow"), request_id="slow")
        wait_for(lambda: started(repo, model, "slow"))  # running on one instance; fast gets the other
        g.async_infer(model, grpc_input(0.0), callback=callback("fast"), request_id="fast")
        assert all_done.wait(15)
    return finished


def test_preserve_ordering_returns_responses_in_request_order(server, repo):
    assert _complete_order(server, repo, "ordered") == ["slow", "fast"]
    assert _complete_order(server, repo, "unordered") == ["fast", "slow"]


def test_cache_hits_skip_execution(server, repo):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        first = client.infer("cached", http_input(0.01, batch=2), request_id="a")
        second = client.infer("cached", http_input(0.01, batch=2), request_id="b")
        stats = client.get_inference_statistics("cached")["model_stats"][0]
    finally:
        client.close()
    assert second.get_response()["id"] == "b"
    np.testing.assert_array_equal(first.as_numpy("ORDER"), second.as_numpy("ORDER"))
    assert int(stats["execution_count"]) == 1 and int(stats["inference_count"]) == 2
    inference = stats["inference_stats"]
    assert int(inference["success"]["count"]) == 2
    assert int(inference["cache_hit"]["count"]) == 1 and int(inference["cache_miss"]["count"]) == 1
    assert [e[4] for e in executions(repo, "cached")] == ["a"]


def test_rate_limited_instances_and_kinds_load(server):
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    try:
        futures = [client.async_infer("limited", http_input(0.05)) for _ in range(4)]
        assert all(f.get_result().as_numpy("Y") is not None for f in futures)
        config = client.get_model_config("auto")
        assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 1), ("KIND_CPU", 2)]
        assert client.is_model_ready("auto")
    finally:
        client.close()


WARMUP = ('model_warmup [ {{ name: "sample" batch_size: 2 inputs {{ key: "X" value {{ data_type: TYPE_FP32 '
          'dims: [ 1 ] {data} }} }} }} ]')


def test_warmup_before_ready_and_failed_warmup_fails_the_load(server_factory, tmp_path):
    write_model(tmp_path, "warm", 4, WARMUP.format(data="zero_data: true"))
    cold = write_model(tmp_path, "cold", 4, WARMUP.format(data='input_data_file: "neg.raw"'))
    (cold / "warmup").mkdir()
    (cold / "warmup" / "neg.raw").write_bytes(np.array([-1.0], np.float32).tobytes())
    s = server_factory("--model-control-mode=explicit", "--load-model=warm", repo=tmp_path)
    client = httpclient.InferenceServerClient(s.http_url)
    try:
        assert client.is_model_ready("warm")
        assert executions(tmp_path, "warm")[0][2:4] == ["0", "2"]  # the warmup batch of 2
        assert int(client.get_inference_statistics("warm")["model_stats"][0]["execution_count"]) == 0
        with pytest.raises(InferenceServerException) as e:
            client.load_model("cold")
        assert "warmup sample 'sample' of model 'cold' failed" in e.value.message()
        assert "negative input" in e.value.message()
        assert not client.is_model_ready("cold")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["cold"]["state"] == "UNAVAILABLE" and "negative input" in index["cold"]["reason"]
    finally:
        client.close()


def test_instance_count_change_without_reload(server_factory, tmp_path):
    folder = write_model(tmp_path, "scaled", 1, "instance_group [ { count: 1 kind: KIND_CPU } ]")
    s = server_factory("--model-control-mode=explicit", "--load-model=scaled", repo=tmp_path)
    client = httpclient.InferenceServerClient(s.http_url, concurrency=4)
    try:
        client.infer("scaled", http_input(0.0))
        text = (folder / "config.pbtxt").read_text()
        (folder / "config.pbtxt").write_text(text.replace("count: 1", "count: 3"))
        client.load_model("scaled")
        assert client.get_model_config("scaled")["instance_group"][0]["count"] == 3
        futures = [client.async_infer("scaled", http_input(0.2)) for _ in range(3)]
        assert all(f.get_result() is not None for f in futures)
        stats = client.get_inference_statistics("scaled")["model_stats"][0]
        assert int(stats["inference_count"]) == 4  # the statistics survived: not reloaded
        instances = {e[0] for e in executions(tmp_path, "scaled")}
        assert instances == {"scaled_0_0", "scaled_0_1", "scaled_0_2"}
    finally:
        client.close()
    assert "without reloading" in s.log()


def test_kind_gpu_without_gpus_is_a_clear_load_error(server_factory, tmp_path):
    write_model(tmp_path, "gpu", 1, "instance_group [ { kind: KIND_GPU } ]")
    s = server_factory(repo=tmp_path)
    client = httpclient.InferenceServerClient(s.http_url)
    try:
        (entry,) = client.get_model_repository_index()
        assert entry["state"] == "UNAVAILABLE"
        assert "has kind KIND_GPU but no GPUs are available" in entry["reason"]
    finally:
        client.close()


def test_bad_scheduling_flags_are_refused(tmp_path):
    from e2e.conftest import start_server

    for flags, message in ((("--cache-config", "redis,host=x"), "not supported"),
                           (("--rate-limit-resource", "R"), "--rate-limit-resource expects"),
                           (("--rate-limit", "sometimes"), "invalid choice")):
        with pytest.raises(RuntimeError, match=message):
            start_server(*flags, repo=tmp_path, timeout=30)
