"""Scheduling through the in-process server: batching, priorities, queue policies, cache, warmup,
failure reasons, instance-count changes without reload, ordering and the rate limiter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio

from trident.errors import Code, TritonError
from trident.options import ServerOptions
from trident.server import Server, open_server
from trident.types import InferenceRequest, Tensor

MODEL_PY = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Sleeps max(X[0]) seconds; Y = X, ORDER = this instance's execution number, SIZE = requests in it."""

    def initialize(self, args):
        self.executions = 0
        params = json.loads(args["model_config"]).get("parameters", {})
        self.log = params.get("log", {}).get("string_value")
        self.name = args["model_instance_name"]
        if params.get("fail_instance", {}).get("string_value") == self.name:
            raise RuntimeError(f"instance {self.name} refuses to load")
        self._write("init")

    def _write(self, what):
        if self.log:
            with open(self.log, "a") as f:
                f.write(f"{self.name} {what}\\n")

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        delay = max(float(x.reshape(-1)[0]) for x in xs)
        if delay < 0:
            raise pb_utils.TritonModelException("negative input")
        start = time.monotonic()
        time.sleep(delay)
        n = self.executions
        self.executions += 1
        self._write(f"exec {n} {len(requests)} {start:.6f} {time.monotonic():.6f}")
        out = []
        for x in xs:
            shape = x.shape[:1] + (1,) if x.ndim > 1 else (1,)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x),
                pb_utils.Tensor("ORDER", np.full(shape, n, np.int64)),
                pb_utils.Tensor("SIZE", np.full(shape, len(requests), np.int64)),
            ]))
        return out

    def finalize(self):
        self._write("fini")
'''

IO = '''
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "ORDER" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "SIZE" data_type: TYPE_INT64 dims: [ 1 ] } ]
'''


def read_log(folder: Path) -> list[list[str]]:
    path = folder.parent / f"{folder.name}.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def write_model(repo: Path, name: str, extra: str, max_batch_size: int = 8) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(MODEL_PY)
    log = repo / f"{name}.log"  # outside the model folder: writing it changes no model file
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: {max_batch_size}\n{IO}\n'
        f'parameters {{ key: "log" value {{ string_value: "{log}" }} }}\n{extra}\n'
    )
    return folder


def request(model: str, x: float, batch: int = 1, **parameters) -> InferenceRequest:
    data = np.full((batch, 1), x, np.float32)
    return InferenceRequest(model, [Tensor.from_numpy("X", data)], parameters=dict(parameters))


def options(repo: Path, **kw) -> ServerOptions:
    return ServerOptions(model_repositories=[str(repo)], **kw)


async def wait_queued(server: Server, model: str, n: int) -> None:
    mv = server.repository.get(model)
    with trio.fail_after(10):
        while mv.queued() < n:
            await trio.sleep(0.005)


async def wait_started(server: Server, model: str) -> None:
    """Wait until something is in flight and nothing is queued (it left the queue: it runs)."""
    mv = server.repository.get(model)
    with trio.fail_after(10):
        while mv.queued() or mv.inflight.count == 0:
            await trio.sleep(0.005)


async def start_blocker(server: Server, nursery: trio.Nursery, model: str, seconds: float = 0.5) -> None:
    """Occupy the model's one instance; returns once the blocker is executing."""
    nursery.start_soon(server.infer, request(model, seconds))
    await wait_started(server, model)


async def test_concurrent_requests_form_batches(tmp_path):
    write_model(tmp_path, "batched", "dynamic_batching { max_queue_delay_microseconds: 20000 }")
    async with open_server(options(tmp_path)) as server:
        results = []

        async def one(i):
            results.append(await server.infer(request("batched", 0.02)))

        async with trio.open_nursery() as nursery:
            for i in range(32):
                nursery.start_soon(one, i)
        stats = server.model_statistics("batched")[0]
    assert stats.inference_count == 32 and stats.success.count == 32
    assert stats.execution_count < stats.inference_count
    assert max(b.batch_size for b in stats.batch_stats) > 1
    assert sum(b.batch_size * b.compute_infer.count for b in stats.batch_stats) == 32
    assert all(int(r.output("SIZE").data[0, 0]) >= 1 for r in results)
    assert stats.queue.count == 32 and stats.compute_infer.count == 32 and stats.compute_infer.ns > 0


async def test_priorities_reorder_the_queue(tmp_path):
    write_model(tmp_path, "prio", "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
                max_batch_size=1)
    async with open_server(options(tmp_path)) as server:
        order: dict[str, int] = {}

        async def one(tag, **params):
            r = await server.infer(request("prio", 0.0, **params))
            order[tag] = int(r.output("ORDER").data[0, 0])

        async with trio.open_nursery() as nursery:
            await start_blocker(server, nursery, "prio")
            for queued, (tag, params) in enumerate((("low1", {}), ("low2", {"priority": 2}),
                                                    ("high", {"priority": 1})), 1):
                nursery.start_soon(lambda t=tag, p=params: one(t, **p))
                await wait_queued(server, "prio", queued)
    assert order["high"] < order["low1"] < order["low2"]


async def test_queue_timeout_and_full_queue_answer_unavailable(tmp_path):
    write_model(tmp_path, "policy", "dynamic_batching { default_queue_policy { default_timeout_microseconds: 100000 "
                                    "allow_timeout_override: true max_queue_size: 2 } }", max_batch_size=1)
    async with open_server(options(tmp_path)) as server:
        errors: list[TritonError] = []

        async def one(**params):
            try:
                await server.infer(request("policy", 0.0, **params))
            except TritonError as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            await start_blocker(server, nursery, "policy", 1.0)
            nursery.start_soon(one)
            nursery.start_soon(one)
            await wait_queued(server, "policy", 2)
            with pytest.raises(TritonError) as full:
                await server.infer(request("policy", 0.0))
            while len(errors) < 2:  # both time out after 100 ms, long before the blocker ends
                await trio.sleep(0.01)
            await one(timeout=1000)  # a shorter timeout of its own
        stats = server.model_statistics("policy")[0]
    assert full.value.code == Code.UNAVAILABLE and full.value.message == "Exceeds maximum queue size"
    assert [(e.code, e.message) for e in errors] == [(Code.UNAVAILABLE, "Request timeout expired")] * 3
    assert stats.failure_count("REJECTED") == 4 and stats.fail.count == 4 and stats.execution_count == 1


async def test_failure_reasons(tmp_path):
    write_model(tmp_path, "m", "")
    async with open_server(options(tmp_path)) as server:
        with pytest.raises(TritonError, match="negative input"):
            await server.infer(request("m", -1.0))
        with trio.move_on_after(0.05):
            await server.infer(request("m", 0.3))
        await trio.sleep(0.4)
        stats = server.model_statistics("m")[0]
    assert dict(stats.failures) == {"REJECTED": 0, "CANCELED": 1, "BACKEND": 1, "OTHER": 0}
    assert stats.cancelled == 1 and stats.fail.count == 2


async def test_cache_hit_skips_execution(tmp_path):
    write_model(tmp_path, "cached", "response_cache { enable: true }")
    async with open_server(options(tmp_path, cache_config=["local,size=1048576"])) as server:
        first = await server.infer(request("cached", 0.0))
        again = request("cached", 0.0)
        again.id = "second"
        second = await server.infer(again)
        third = await server.infer(request("cached", 0.0, batch=2))  # different shape: a miss
        stats = server.model_statistics("cached")[0]
        cache = server.repository.response_cache
        assert cache is not None and len(cache) == 2
    assert second.id == "second" and second.model_name == "cached" and second.model_version == "1"
    np.testing.assert_array_equal(second.output("ORDER").data, first.output("ORDER").data)
    assert int(third.output("ORDER").data[0, 0]) == 1
    assert stats.execution_count == 2 and stats.inference_count == 3 and stats.success.count == 3
    assert stats.cache_hit.count == 1 and stats.cache_miss.count == 2
    assert stats.compute_infer.count == 2 and stats.queue.count == 3


async def test_cache_needs_the_server_cache(tmp_path):
    write_model(tmp_path, "cached", "response_cache { enable: true }")
    async with open_server(options(tmp_path)) as server:
        await server.infer(request("cached", 0.0))
        await server.infer(request("cached", 0.0))
        stats = server.model_statistics("cached")[0]
    assert stats.execution_count == 2 and stats.cache_hit.count == 0


WARMUP = ('model_warmup [ {{ name: "w" batch_size: 2 count: 2 inputs {{ key: "X" value {{ data_type: TYPE_FP32 '
          'dims: [ 1 ] {data} }} }} }} ]')


async def test_warmup_runs_before_ready_and_is_not_counted(tmp_path):
    folder = write_model(tmp_path, "warm", WARMUP.format(data="zero_data: true") +
                         " instance_group [ { count: 2 kind: KIND_CPU } ]")
    async with open_server(options(tmp_path)) as server:
        assert server.model_ready("warm")
        stats = server.model_statistics("warm")[0]
        assert stats.execution_count == 0 and stats.inference_count == 0
    execs = sorted((e[0], e[2], e[3]) for e in read_log(folder) if e[1] == "exec")
    assert execs == [("warm_0_0", "0", "2"), ("warm_0_0", "1", "2"), ("warm_0_1", "0", "2"), ("warm_0_1", "1", "2")]


async def test_failed_warmup_fails_the_load_with_the_reason(tmp_path):
    folder = write_model(tmp_path, "cold", WARMUP.format(data='input_data_file: "neg.raw"'))
    (folder / "warmup").mkdir()
    (folder / "warmup" / "neg.raw").write_bytes(np.array([-1.0], np.float32).tobytes())
    async with open_server(options(tmp_path, model_control_mode="explicit")) as server:
        with pytest.raises(TritonError) as e:
            await server.load_model("cold")
        assert "warmup sample 'w' of model 'cold' failed" in e.value.message and "negative input" in e.value.message
        assert not server.model_ready("cold")
        (entry,) = server.repository_index()
        assert entry.state == "UNAVAILABLE" and "negative input" in entry.reason
    assert [e[:2] for e in read_log(folder)] == [["cold_0", "init"], ["cold_0", "fini"]]  # finalized


def events(folder: Path, what: str) -> list[str]:
    return [e[0] for e in read_log(folder) if e[1] == what]


async def test_instance_count_change_applies_without_reload(tmp_path):
    folder = write_model(tmp_path, "scaled", "dynamic_batching {} instance_group [ { count: 1 kind: KIND_CPU } ]")
    config = (folder / "config.pbtxt").read_text()
    async with open_server(options(tmp_path, model_control_mode="explicit", load_models=["scaled"])) as server:
        mv = server.repository.get("scaled")
        (folder / "config.pbtxt").write_text(config.replace("count: 1", "count: 3"))
        await server.load_model("scaled")
        assert server.repository.get("scaled") is mv and len(mv.instances) == 3
        assert [g.count for g in server.model_config("scaled").instance_group] == [3]
        assert sorted(events(folder, "init")) == ["scaled_0_0", "scaled_0_1", "scaled_0_2"]
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(server.infer, request("scaled", 0.05))
        (folder / "config.pbtxt").write_text(config.replace("count: 1", "count: 2"))
        async with trio.open_nursery() as nursery:
            for _ in range(3):  # running while an instance retires: it finishes its batch first
                nursery.start_soon(server.infer, request("scaled", 0.2))
            await wait_started(server, "scaled")
            await server.load_model("scaled")
        assert server.repository.get("scaled") is mv and len(mv.instances) == 2
        assert events(folder, "fini") == ["scaled_0_2"] and len(events(folder, "init")) == 3
        assert server.model_statistics("scaled")[0].success.count == 9
        (folder / "config.pbtxt").write_text(config.replace("count: 1", "count: 2").replace("dynamic_batching {}", ""))
        await server.load_model("scaled")  # something else changed too: a real reload
        assert server.repository.get("scaled") is not mv
        assert len(events(folder, "init")) == 5


async def test_failed_instance_addition_keeps_the_model_serving(tmp_path):
    folder = write_model(tmp_path, "scaled", 'parameters { key: "fail_instance" value { string_value: "scaled_0_1" } } '
                                             "instance_group [ { count: 1 kind: KIND_CPU } ]")
    config = (folder / "config.pbtxt").read_text()
    async with open_server(options(tmp_path, model_control_mode="explicit", load_models=["scaled"])) as server:
        mv = server.repository.get("scaled")
        (folder / "config.pbtxt").write_text(config.replace("count: 1", "count: 3"))
        with pytest.raises(TritonError, match="instance scaled_0_1 refuses to load"):
            await server.load_model("scaled")
        assert server.repository.get("scaled") is mv and len(mv.instances) == 1 and server.model_ready("scaled")
        assert [g.count for g in server.model_config("scaled").instance_group] == [1]
        assert (await server.infer(request("scaled", 0.0))).output("Y") is not None
    assert sorted(events(folder, "fini")) == ["scaled_0_0", "scaled_0_2"]  # the added one that loaded, then ours


async def test_changed_model_files_mean_a_full_reload(tmp_path):
    folder = write_model(tmp_path, "scaled", "instance_group [ { count: 1 kind: KIND_CPU } ]")
    config = (folder / "config.pbtxt").read_text()
    async with open_server(options(tmp_path, model_control_mode="explicit", load_models=["scaled"])) as server:
        mv = server.repository.get("scaled")
        (folder / "1" / "model.py").write_text(MODEL_PY + "\n# changed\n")
        (folder / "config.pbtxt").write_text(config.replace("count: 1", "count: 2"))
        await server.load_model("scaled")
        assert server.repository.get("scaled") is not mv
        assert len(server.repository.get("scaled").instances) == 2


async def test_preserve_ordering_across_instances(tmp_path):
    write_model(tmp_path, "ordered", "dynamic_batching { preserve_ordering: true } "
                                     "instance_group [ { count: 2 kind: KIND_CPU } ]", max_batch_size=1)
    async with open_server(options(tmp_path)) as server:
        finished: list[str] = []

        async def one(tag, seconds):
            await server.infer(request("ordered", seconds))
            finished.append(tag)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "slow", 0.4)
            await wait_started(server, "ordered")
            nursery.start_soon(one, "fast", 0.0)
    assert finished == ["slow", "fast"]


async def test_without_ordering_fast_request_finishes_first(tmp_path):
    write_model(tmp_path, "unordered", "dynamic_batching { } instance_group [ { count: 2 kind: KIND_CPU } ]",
                max_batch_size=1)
    async with open_server(options(tmp_path)) as server:
        finished: list[str] = []

        async def one(tag, seconds):
            await server.infer(request("unordered", seconds))
            finished.append(tag)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "slow", 0.4)
            await wait_started(server, "unordered")
            nursery.start_soon(one, "fast", 0.0)
    assert finished == ["fast", "slow"]


async def test_rate_limiter_serializes_instances_sharing_a_resource(tmp_path):
    limited = ('instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] } } ]')
    folder = write_model(tmp_path, "limited", limited, max_batch_size=1)
    async with open_server(options(tmp_path, rate_limit="execution_count")) as server:
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(server.infer, request("limited", 0.05))
        limiter = server.repository.rate_limiter
        assert limiter is not None and limiter.capacity() == {("R", 0): 1}
    spans = sorted((float(e[4]), float(e[5])) for e in read_log(folder) if e[1] == "exec")
    assert len(spans) == 4 and {e[0] for e in read_log(folder) if e[1] == "exec"} <= {"limited_0_0", "limited_0_1"}
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))


async def test_rate_limit_resource_too_small_fails_the_load(tmp_path):
    write_model(tmp_path, "greedy", 'instance_group [ { rate_limiter { resources [ { name: "R" count: 4 } ] } } ]')
    async with open_server(options(tmp_path, rate_limit="execution_count", rate_limit_resources=["R:2"])) as server:
        (entry,) = server.repository_index()
    assert entry.state == "UNAVAILABLE" and "resource 'R' has 2 copies on device 0, an instance needs 4" in entry.reason


async def test_kind_gpu_fails_the_load_without_gpus(tmp_path):
    write_model(tmp_path, "gpu", "instance_group [ { kind: KIND_GPU } ]")
    async with open_server(options(tmp_path)) as server:
        (entry,) = server.repository_index()
    assert entry.state == "UNAVAILABLE" and "has kind KIND_GPU but no GPUs are available" in entry.reason


async def test_poll_mode_applies_a_count_change_in_place(tmp_path):
    folder = write_model(tmp_path, "polled", "instance_group [ { count: 1 kind: KIND_CPU } ]")
    opts = options(tmp_path, model_control_mode="poll", repository_poll_secs=3600)
    async with open_server(opts) as server:
        mv = server.repository.get("polled")
        text = (folder / "config.pbtxt").read_text()
        (folder / "config.pbtxt").write_text(text.replace("count: 1", "count: 2"))
        await server.repository.poll_once()
        assert server.repository.get("polled") is mv and len(mv.instances) == 2
        await server.repository.poll_once()  # nothing changed since: nothing happens
        assert len(mv.instances) == 2 and sorted(events(folder, "init")) == ["polled_0_0", "polled_0_1"]


async def test_expired_deadline_is_never_executed(tmp_path):
    """A queued request whose deadline passed is dropped when its turn comes, even where no cancel
    scope has fired for it yet (the executor's check, README "Deadlines"): it never executes,
    its caller gets Triton's timed-out status, and the next request runs."""
    write_model(tmp_path, "dl", "dynamic_batching { }", max_batch_size=1)
    async with open_server(options(tmp_path)) as server:
        async with trio.open_nursery() as nursery:
            await start_blocker(server, nursery, "dl", 0.3)
            late = request("dl", 0.0)
            late.deadline = trio.current_time() + 0.05  # as an ensemble step or BLS call carries it
            with trio.fail_after(10), pytest.raises(TritonError) as e:
                await server.infer(late)
        after = await server.infer(request("dl", 0.0))
        stats = server.model_statistics("dl")[0]
    assert (e.value.code, e.value.message) == (Code.UNAVAILABLE, "Request timeout expired")
    assert int(after.output("ORDER").data[0, 0]) == 1  # the blocker ran, then this one: not the late one
    assert stats.execution_count == 2
    assert [row[1] for row in read_log(tmp_path / "dl") if row[1] == "exec"] == ["exec", "exec"]
