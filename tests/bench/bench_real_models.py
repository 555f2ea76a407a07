"""Real models served by trident against the same framework called offline, and against Triton.

Not collected by pytest. Needs torchvision, which the test extra does not install: the PyPI
wheel matching the pinned CPU torch, without its dependencies (it would replace torch)::

    .venv/bin/pip install --no-deps torchvision==0.28.0      # torch 2.13.0

and, for the Triton comparison, the anchors of ``/work/shared/bench`` (``setup.sh``) with
onnxruntime in Triton's venv: ``/tmp/anchors/venv-triton/bin/pip install onnxruntime``. Run::

    .venv/bin/python tests/bench/bench_real_models.py --quick      # ~3 min: does it work
    .venv/bin/python tests/bench/bench_real_models.py              # full: 2 rounds of 10 s runs, ~10-15 min
    .venv/bin/python tests/bench/bench_real_models.py --no-triton --models silero_vad
    .venv/bin/python tests/bench/bench_real_models.py --trident-flags "--busy-poll-us 0"

Tables go to stdout, progress to stderr. Before each run it waits (``--quiet-wait``, 10 s at
most) for the machine to be idle, and every row says how many CPUs other processes used
meanwhile ("others' CPU"): on a shared 2-core machine the figures mean little above ~0.2.

Models (repositories written to a temp dir at run time; nothing is downloaded):

* ``ppocr_det``: the PP-OCRv4 text detector shipped in ``rapidocr-onnxruntime``, FP32
  [N,3,160,160] (160 rather than 320 keeps a batch of 8 near 50 ms on this CPU).
* ``silero_vad``: Silero VAD v5 from the ``silero-vad`` package, wrapped by
  ``examples/streaming/vad_model.build_vad_onnx`` (AUDIO [N,512], STATE_IN [N,2,128],
  CONTEXT_IN [N,64]); here without implicit state: each request carries its own state.
* ``mobilenet_onnx`` / ``mobilenet_torch``: torchvision's ``mobilenet_v3_small`` with random
  weights (resnet18 costs ~0.65 s per batch of 8 here; this one ~35 ms), FP32 [N,3,224,224],
  exported with ``torch.onnx.export`` (opset 17) and ``torch.jit.trace``.

Every model: ``max_batch_size: 8``, ``dynamic_batching { }`` (no queue delay: with 16 clients
and batches of 8 the queue already holds a full batch whenever the instance frees, so a delay
adds latency and nothing else), one KIND_CPU instance, one intra-op and one inter-op thread.

For each model and round: the served run (trident, then Triton unless ``--no-triton``; each
server pinned to CPU 0 with taskset) loaded from CPU 1 by tritonclient's gRPC aio client,
``--concurrency`` (16) requests of batch 1 in flight (gRPC carries tensors as raw bytes, and
one asyncio process keeps 16 requests in flight on one core, which a thread per request would
not), ``--warmup`` s and then ``--duration`` s measured; then the offline run: the framework
called in this process pinned to CPU 0 with the batch sizes trident's batcher formed (the
``batch_stats`` of the statistics extension over the measured window). Server CPU per
inference is utime+stime of the server's process tree (Triton: tritonserver and its Python
stubs) around the measured window. The batch-1 overhead is a sequential client (c=1): server
CPU per request minus the framework's CPU per batch-1 run offline (``time.process_time``),
the same client against Triton alike (its Python backend runs the same onnxruntime session).
Each server's first request per model is checked against the framework's output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from proc_stats import cpu_seconds, tree_pids  # tests/bench/proc_stats.py (the script runs from tests/bench)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # examples.streaming.vad_model

ANCHORS = Path(os.environ.get("ANCHORS", "/tmp/anchors"))
RUN_TRITON = Path(os.environ.get("TRIDENT_SHARED_BENCH", "/work/shared/bench")) / "run_triton.sh"
MAX_BATCH = 8
OCR_SIDE = 160
IMAGE_SIDE = 224
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ModelSpec:
    """One served model: FP32 inputs and outputs (dims without the batch dimension)."""

    name: str
    backend: str  # "onnxruntime" or "pytorch"
    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...]
    on_triton: bool  # also served by Triton's Python backend (ONNX files only)


MODELS = (
    ModelSpec("ppocr_det", "onnxruntime", (("x", (3, OCR_SIDE, OCR_SIDE)),),
              (("sigmoid_0.tmp_0", (1, -1, -1)),), True),  # outputs must match the file's dims exactly, as in Triton
    ModelSpec("silero_vad", "onnxruntime", (("AUDIO", (512,)), ("STATE_IN", (2, 128)), ("CONTEXT_IN", (64,))),
              (("SPEECH_PROB", (1,)), ("STATE_OUT", (2, 128)), ("CONTEXT_OUT", (64,))), True),
    ModelSpec("mobilenet_onnx", "onnxruntime", (("input", (3, IMAGE_SIDE, IMAGE_SIDE)),),
              (("output", (1000,)),), True),
    ModelSpec("mobilenet_torch", "pytorch", (("INPUT__0", (3, IMAGE_SIDE, IMAGE_SIDE)),),
              (("OUTPUT__0", (1000,)),), False),
)

# Triton's Python backend serving an ONNX file: what a user of the pytriton wheel (no
# onnxruntime backend in it) writes. Requests of one dynamic batch are concatenated, run once
# and split.
TRITON_MODEL_PY = '''\
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(params["intra_op_thread_count"]["string_value"])
        so.inter_op_num_threads = int(params["inter_op_thread_count"]["string_value"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        arrays = [[pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs] for r in requests]
        feeds = {n: (arrays[0][i] if len(arrays) == 1 else np.concatenate([a[i] for a in arrays]))
                 for i, n in enumerate(self.inputs)}
        results = self.session.run(self.outputs, feeds)
        responses, start = [], 0
        for a in arrays:
            n = a[0].shape[0]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, out[start:start + n]) for name, out in zip(self.outputs, results)]))
            start += n
        return responses
'''


# ---------------------------------------------------------------- pure parts

def config_text(spec: ModelSpec, backend: str, max_batch: int = MAX_BATCH, threads: int = 1) -> str:
    """config.pbtxt of ``spec`` served by ``backend`` (``onnxruntime``, ``pytorch`` or ``python``)."""
    def tensors(items: Sequence[tuple[str, tuple[int, ...]]]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ {", ".join(map(str, d))} ] }}'
                         for n, d in items)

    keys = (("INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT") if backend == "pytorch"
            else ("intra_op_thread_count", "inter_op_thread_count"))
    params = ", ".join(f'{{ key: "{k}" value {{ string_value: "{threads}" }} }}' for k in keys)
    return (f'name: "{spec.name}"\nbackend: "{backend}"\nmax_batch_size: {max_batch}\n'
            f"input [ {tensors(spec.inputs)} ]\noutput [ {tensors(spec.outputs)} ]\n"
            "instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n"
            f"parameters [ {params} ]\n")


def batch_histogram(stats: Mapping[str, Any]) -> dict[int, int]:
    """Executions per batch size from a ModelStatistics JSON answer (gRPC ``as_json`` or HTTP)."""
    out: dict[int, int] = {}
    for model in stats.get("model_stats", []):
        for b in model.get("batch_stats", []):
            count = int(b.get("compute_infer", {}).get("count", 0))
            if count:
                out[int(b["batch_size"])] = out.get(int(b["batch_size"]), 0) + count
    return out


def histogram_delta(after: Mapping[int, int], before: Mapping[int, int]) -> dict[int, int]:
    return {b: n - before.get(b, 0) for b, n in sorted(after.items()) if n - before.get(b, 0) > 0}


def batch_schedule(histogram: Mapping[int, int], length: int = 200) -> list[int]:
    """About ``length`` batch sizes in the proportions of ``histogram`` (each present size at
    least once), interleaved so that a run cut anywhere keeps the mix."""
    total = sum(histogram.values())
    if total == 0:
        return [1]
    counts = {b: max(1, round(n * length / total)) for b, n in histogram.items()}
    out: list[int] = []
    placed = dict.fromkeys(counts, 0)
    for _ in range(sum(counts.values())):
        # the size furthest behind its share goes next
        b = min(counts, key=lambda s: (placed[s] + 1) / counts[s])
        placed[b] += 1
        out.append(b)
    return out


def histogram_text(histogram: Mapping[int, int]) -> str:
    total = sum(histogram.values()) or 1
    return " ".join(f"{b}:{n * 100 / total:.0f}%" for b, n in sorted(histogram.items(), reverse=True))


def mean_batch(histogram: Mapping[int, int]) -> float:
    return sum(b * n for b, n in histogram.items()) / max(1, sum(histogram.values()))


def percentile_ms(latencies: Sequence[float], q: float) -> float:
    return float(np.percentile(latencies, q)) * 1e3 if latencies else float("nan")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class ServedRun:
    """One measured window of a server (from the load process's JSON line)."""

    inferences: int
    seconds: float
    p50_ms: float
    p99_ms: float
    server_cpu_s: float
    batches: dict[int, int]
    foreign: float  # CPUs used meanwhile by processes other than the server and the client
    client_cpu_s: float  # the load process's own CPU (one core is all it has)

    @property
    def rate(self) -> float:
        return self.inferences / self.seconds

    @property
    def cpu_ms_per_inference(self) -> float:
        return self.server_cpu_s / max(1, self.inferences) * 1e3

    @classmethod
    def from_json(cls, line: str) -> ServedRun:
        d = json.loads(line)
        return cls(d["inferences"], d["seconds"], d["p50_ms"], d["p99_ms"], d["server_cpu_s"],
                   {int(k): v for k, v in d["batches"].items()}, d["foreign"], d["client_cpu_s"])


# ---------------------------------------------------------------- processes

def tree_cpu_seconds(root: int) -> float:
    total = 0.0
    for pid in tree_pids(root):
        try:
            total += cpu_seconds(pid)
        except (OSError, ValueError, IndexError):
            pass  # exited between the listing and the read
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all CPUs, /proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICKS


def wait_quiet(max_wait: float, cores: float = 0.25) -> float:
    """Wait (up to ``max_wait`` s) for a half second in which the machine uses at most ``cores``
    CPUs (others' benchmarks share it); returns the last half second's use in CPUs."""
    deadline = time.monotonic() + max_wait
    while True:
        b0, t0 = machine_busy_seconds(), time.monotonic()
        time.sleep(0.5)
        used = (machine_busy_seconds() - b0) / (time.monotonic() - t0)
        if used <= cores or time.monotonic() >= deadline:
            return used


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    http: int
    grpc: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def wait_ready(server: Server, models: Sequence[str], timeout: float = 90.0) -> None:
    """Until every model answers ready over HTTP. Raises RuntimeError when the server exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{log_tail(server)}")
        try:
            for m in models:
                urllib.request.urlopen(f"http://127.0.0.1:{server.http}/v2/models/{m}/ready", timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{server.name}: {', '.join(models)} not ready within {timeout} s:\n{log_tail(server)}")


def log_tail(server: Server, chars: int = 4000) -> str:
    text = server.log.read_text(errors="replace")
    errors = [line for line in text.splitlines() if line.startswith(("E", "W"))]
    return "\n".join(errors[-20:]) + "\n...\n" + text[-chars:]


def stop(server: Server) -> None:
    """SIGTERM the server's process group (then SIGKILL), and any descendant that left it."""
    pids = tree_pids(server.pid)
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        try:
            server.proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in pids[1:]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def serving(name: str, cmd: list[str], http: int, grpc: int, models: Sequence[str], workdir: Path,
            env: Mapping[str, str] | None = None) -> Iterator[Server]:
    """Start ``cmd`` pinned to CPU 0 in its own process group, wait until ``models`` are ready,
    and stop it (group and descendants) on the way out, whatever happens."""
    log = workdir / f"{name}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(["taskset", "-c", "0", *cmd], stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
    server = Server(name, proc, http, grpc, log)
    try:
        wait_ready(server, models)
        yield server
    finally:
        stop(server)


def trident_command(repo: Path, http: int, grpc: int) -> list[str]:
    exe = Path(sys.executable).with_name("trident")
    head = [str(exe)] if exe.exists() else [sys.executable, "-m", "trident"]
    return [*head, "serve", "--model-repository", str(repo), "--http-address", "127.0.0.1",
            "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", "0", "--log-verbose", "0"]


# ---------------------------------------------------------------- models and repositories

def _import_torchvision() -> Any:
    """torchvision's PyPI wheel is built against CUDA torch: with the CPU torch its C++ ops do
    not load, and 0.28 then still registers fake kernels for ``nms``/``qnms``, which fails.
    Declaring those two schemas first lets the pure-Python models import; the ops are never
    called here."""
    import torch

    if not hasattr(torch.ops, "torchvision") or not hasattr(torch.ops.torchvision, "nms"):
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            try:
                lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            except RuntimeError:
                pass
        _KEEP.append(lib)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchvision
    return torchvision


_KEEP: list[Any] = []


def write_models(root: Path, names: Sequence[str]) -> tuple[Path, Path]:
    """trident's and Triton's repositories under ``root``; returns (trident_repo, triton_repo)."""
    import importlib.util

    import onnx

    ours, theirs = root / "trident", root / "triton"
    onnx_files: dict[str, Path] = {}
    for spec in MODELS:
        if spec.name not in names:
            continue
        version = ours / spec.name / "1"
        version.mkdir(parents=True)
        if spec.name == "ppocr_det":
            found = importlib.util.find_spec("rapidocr_onnxruntime")  # its file, without importing it
            if found is None or found.origin is None:
                raise FileNotFoundError("rapidocr-onnxruntime is not installed")
            src = Path(found.origin).parent / "models" / "ch_PP-OCRv4_det_infer.onnx"
            (version / "model.onnx").write_bytes(src.read_bytes())
        elif spec.name == "silero_vad":
            from examples.streaming.vad_model import build_vad_onnx

            onnx.save(build_vad_onnx(), str(version / "model.onnx"))
        else:
            import torch

            torch.manual_seed(0)
            net = _import_torchvision().models.mobilenet_v3_small(weights=None).eval()
            x = torch.rand(1, 3, IMAGE_SIDE, IMAGE_SIDE)
            if spec.backend == "pytorch":
                with torch.no_grad():
                    torch.jit.trace(net, x).save(str(version / "model.pt"))
            else:
                torch.onnx.export(net, (x,), str(version / "model.onnx"), opset_version=17,
                                  input_names=["input"], output_names=["output"],
                                  dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}, dynamo=False)
        (ours / spec.name / "config.pbtxt").write_text(config_text(spec, spec.backend))
        if spec.on_triton:
            onnx_files[spec.name] = version / "model.onnx"
    for name, path in onnx_files.items():
        spec = next(s for s in MODELS if s.name == name)
        version = theirs / name / "1"
        version.mkdir(parents=True)
        (version / "model.onnx").write_bytes(path.read_bytes())
        (version / "model.py").write_text(TRITON_MODEL_PY)
        (theirs / name / "config.pbtxt").write_text(config_text(spec, "python"))
    return ours, theirs


def sample(spec: ModelSpec, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.random((batch, *d), dtype=np.float32) for n, d in spec.inputs}


def offline_runner(spec: ModelSpec, repo: Path) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """The framework itself on the served file, one thread (what the server's instance runs)."""
    if spec.backend == "pytorch":
        import torch

        torch.set_num_threads(1)
        module = torch.jit.load(str(repo / spec.name / "1" / "model.pt")).eval()

        def run_torch(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            with torch.inference_mode():
                out = module(*(torch.from_numpy(feeds[n]) for n, _ in spec.inputs))
            return [out.numpy()]

        return run_torch
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    session = ort.InferenceSession(str(repo / spec.name / "1" / "model.onnx"), so,
                                   providers=["CPUExecutionProvider"])
    names = [n for n, _ in spec.outputs]
    return lambda feeds: session.run(names, feeds)


@contextmanager
def pinned(cpus: set[int]) -> Iterator[None]:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def offline_rate(run: Callable[[dict[str, np.ndarray]], list[np.ndarray]], spec: ModelSpec,
                 histogram: Mapping[int, int], seconds: float) -> tuple[float, float]:
    """Inferences/s of ``run`` cycling through the batch sizes of ``histogram``, on CPU 0, and the
    CPUs that other processes used meanwhile."""
    schedule = batch_schedule(histogram)
    feeds = {b: sample(spec, b, seed=b) for b in set(schedule)}
    with pinned({0}):
        for b in sorted(feeds):
            run(feeds[b])
        done, start = 0, time.perf_counter()
        own, busy = time.process_time(), machine_busy_seconds()
        while True:
            for b in schedule:
                run(feeds[b])
                done += b
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                foreign = (machine_busy_seconds() - busy - (time.process_time() - own)) / elapsed
                return done / elapsed, foreign


def offline_cpu_per_run(run: Callable[[dict[str, np.ndarray]], list[np.ndarray]], spec: ModelSpec,
                        seconds: float) -> float:
    """The framework's CPU seconds per batch-1 run (process CPU time, on CPU 0)."""
    feeds = sample(spec, 1, seed=1)
    with pinned({0}):
        for _ in range(5):
            run(feeds)
        n, wall, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - wall < seconds:
            run(feeds)
            n += 1
        return (time.process_time() - cpu) / n


# ---------------------------------------------------------------- load (its own process, on CPU 1)

async def closed_loop(url: str, spec: ModelSpec, concurrency: int, warmup: float, duration: float,
                      server_pid: int) -> dict[str, Any]:
    """``concurrency`` tritonclient gRPC aio requests (batch 1) in flight; the measured window's
    count, latencies, server tree CPU and batch statistics."""
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aio

    client = aio.InferenceServerClient(url)
    inputs = []
    for name, array in sample(spec, 1).items():
        t = grpcclient.InferInput(name, list(array.shape), "FP32")
        t.set_data_from_numpy(array)
        inputs.append(t)
    latencies: list[float] = []
    state = {"measuring": False, "stop": False}

    async def worker() -> None:
        while not state["stop"]:
            t0 = time.perf_counter()
            await client.infer(spec.name, inputs)
            if state["measuring"]:
                latencies.append(time.perf_counter() - t0)

    try:
        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        before = batch_histogram(await client.get_inference_statistics(spec.name, as_json=True))
        cpu0, t0 = tree_cpu_seconds(server_pid), time.perf_counter()
        own0, busy0 = time.process_time(), machine_busy_seconds()
        state["measuring"] = True
        await asyncio.sleep(duration)
        state["measuring"] = False
        cpu1, t1 = tree_cpu_seconds(server_pid), time.perf_counter()
        own1, busy1 = time.process_time(), machine_busy_seconds()
        after = batch_histogram(await client.get_inference_statistics(spec.name, as_json=True))
        state["stop"] = True
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    return {"inferences": len(latencies), "seconds": t1 - t0, "p50_ms": percentile_ms(latencies, 50),
            "p99_ms": percentile_ms(latencies, 99), "server_cpu_s": cpu1 - cpu0,
            "batches": histogram_delta(after, before),
            "foreign": ((busy1 - busy0) - (cpu1 - cpu0) - (own1 - own0)) / (t1 - t0), "client_cpu_s": own1 - own0}


def served_run(server: Server, spec: ModelSpec, concurrency: int, warmup: float, duration: float) -> ServedRun:
    """Run the load process (this script's ``load`` command) pinned to CPU 1."""
    cmd = ["taskset", "-c", "1", sys.executable, str(Path(__file__).resolve()), "load", "--url",
           f"127.0.0.1:{server.grpc}", "--model", spec.name, "--concurrency", str(concurrency),
           "--warmup", str(warmup), "--duration", str(duration), "--server-pid", str(server.pid)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=warmup + duration + 120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"load against {server.name} failed:\n{out.stderr[-3000:]}")
    return ServedRun.from_json(out.stdout.strip().splitlines()[-1])


def check_outputs(server: Server, spec: ModelSpec,
                  run: Callable[[dict[str, np.ndarray]], list[np.ndarray]]) -> None:
    """One request's outputs against the framework's on the same input. Raises AssertionError."""
    import tritonclient.grpc as grpcclient

    feeds = sample(spec, 1, seed=7)
    expected = run(feeds)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    try:
        inputs = []
        for name, array in feeds.items():
            t = grpcclient.InferInput(name, list(array.shape), "FP32")
            t.set_data_from_numpy(array)
            inputs.append(t)
        result = client.infer(spec.name, inputs)
        for (name, _), want in zip(spec.outputs, expected, strict=True):
            np.testing.assert_allclose(result.as_numpy(name), want, rtol=1e-3, atol=1e-5,
                                       err_msg=f"{server.name} {spec.name} {name}")
    finally:
        client.close()


# ---------------------------------------------------------------- driving

@dataclass
class Row:
    spec: ModelSpec
    offline: list[float]
    trident: list[ServedRun]
    triton: list[ServedRun]
    ratios: list[float]
    foreign: list[float]  # every run's (offline ones too), CPUs used by others meanwhile
    framework_cpu_us: float = float("nan")
    trident_c1: ServedRun | None = None
    triton_c1: ServedRun | None = None


@dataclass(frozen=True)
class Settings:
    rounds: int
    warmup: float
    duration: float
    c1_duration: float
    concurrency: int
    with_triton: bool
    triton_ports: tuple[int, int, int]
    trident_flags: tuple[str, ...]
    quiet_wait: float


def bench(names: Sequence[str], opts: Settings) -> list[Row]:
    """Each round: trident (all models, then batch-1 runs in round 1), Triton likewise, then the
    offline runs with the batch sizes trident formed in that round. Servers stopped on the way out."""
    specs = [s for s in MODELS if s.name in names]
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        ours, theirs = write_models(work, names)
        runners = {s.name: offline_runner(s, ours) for s in specs}
        rows = {s.name: Row(s, [], [], [], [], []) for s in specs}
        http, grpc = free_port(), free_port()
        th, tg, tm = opts.triton_ports
        servers: list[tuple[str, list[str], int, int, list[ModelSpec], dict[str, str]]] = [
            ("trident", [*trident_command(ours, http, grpc), *opts.trident_flags], http, grpc, specs, {})]
        if opts.with_triton:
            servers.append(("triton", ["bash", str(RUN_TRITON), str(ANCHORS / "venv-triton"), str(theirs)], th, tg,
                            [s for s in specs if s.on_triton],
                            {"HTTP_PORT": str(th), "GRPC_PORT": str(tg), "METRICS_PORT": str(tm),
                             "TRITON_WORK": str(work / "triton-work")}))

        def log(text: str) -> None:
            print(text, file=sys.stderr, flush=True)

        for r in range(opts.rounds):
            log(f"# round {r + 1}/{opts.rounds}")
            for name, cmd, hport, gport, served, env in servers:
                if not served:
                    continue
                with serving(name, cmd, hport, gport, [s.name for s in served], work, env) as server:
                    for s in served:
                        row = rows[s.name]
                        if r == 0:
                            check_outputs(server, s, runners[s.name])
                        wait_quiet(opts.quiet_wait)
                        run = served_run(server, s, opts.concurrency, opts.warmup, opts.duration)
                        (row.trident if name == "trident" else row.triton).append(run)
                        row.foreign.append(run.foreign)
                        log(f"  {name} {s.name}: {run.rate:.1f} inf/s, batches {histogram_text(run.batches)}, "
                            f"client used {run.client_cpu_s / run.seconds:.2f} CPUs, others {run.foreign:.2f}")
                        if r == 0:
                            wait_quiet(opts.quiet_wait)
                            c1 = served_run(server, s, 1, opts.warmup, opts.c1_duration)
                            row.foreign.append(c1.foreign)
                            if name == "trident":
                                row.trident_c1 = c1
                            else:
                                row.triton_c1 = c1
            for s in specs:  # offline, no server running
                row = rows[s.name]
                wait_quiet(opts.quiet_wait)
                rate, foreign = offline_rate(runners[s.name], s, row.trident[-1].batches, opts.duration)
                row.offline.append(rate)
                row.foreign.append(foreign)
                row.ratios.append(row.trident[-1].rate / rate)
                if r == 0:
                    row.framework_cpu_us = offline_cpu_per_run(runners[s.name], s, min(opts.c1_duration, 5.0)) * 1e6
                log(f"  offline {s.name}: {rate:.1f} inf/s, others used {foreign:.2f} CPUs")
        return list(rows.values())


def overhead_us(run: ServedRun | None, framework_cpu_us: float) -> float:
    """Server CPU per batch-1 request beyond the framework's own CPU per run."""
    if run is None or not run.inferences:
        return float("nan")
    return run.server_cpu_s / run.inferences * 1e6 - framework_cpu_us


def merged_batches(runs: Sequence[ServedRun]) -> dict[int, int]:
    out: dict[int, int] = {}
    for run in runs:
        for b, n in run.batches.items():
            out[b] = out.get(b, 0) + n
    return out


def throughput_table(rows: Sequence[Row]) -> str:
    lines = ["| model | backend | batches formed: trident / Triton (mean) | offline inf/s | trident inf/s "
             "| trident / offline (range) | trident p50 / p99 ms | Triton inf/s | trident / Triton "
             "| Triton p50 / p99 ms | server CPU ms/inf trident / Triton | client CPU trident / Triton "
             "| others' CPU (max) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        ours, theirs = row.trident, row.triton
        mine, other = merged_batches(ours), merged_batches(theirs)
        batches = f"{histogram_text(mine)} ({mean_batch(mine):.1f})"
        if theirs:
            batches += f" / {histogram_text(other)} ({mean_batch(other):.1f})"
        rate = median([r.rate for r in ours])
        ratio = f"{median(row.ratios):.3f} ({min(row.ratios):.3f}-{max(row.ratios):.3f})"
        lat = f"{median([r.p50_ms for r in ours]):.1f} / {median([r.p99_ms for r in ours]):.1f}"
        t_rate = median([r.rate for r in theirs])
        t_cells = (f"{t_rate:.1f} | {rate / t_rate:.2f} | {median([r.p50_ms for r in theirs]):.1f} / "
                   f"{median([r.p99_ms for r in theirs]):.1f}" if theirs else "- | - | -")
        cpu = f"{median([r.cpu_ms_per_inference for r in ours]):.2f}"
        cpu += f" / {median([r.cpu_ms_per_inference for r in theirs]):.2f}" if theirs else ""
        client = f"{median([r.client_cpu_s / r.seconds for r in ours]):.2f}"
        client += f" / {median([r.client_cpu_s / r.seconds for r in theirs]):.2f}" if theirs else ""
        lines.append(f"| {row.spec.name} | {row.spec.backend} | {batches} | {median(row.offline):.1f} | {rate:.1f} "
                     f"| {ratio} | {lat} | {t_cells} | {cpu} | {client} | {max(row.foreign):.2f} |")
    return "\n".join(lines)


def batch1_table(rows: Sequence[Row]) -> str:
    lines = ["| model | framework CPU us per batch-1 run | trident c=1 req/s (p50 ms) | trident server CPU us/req "
             "| trident overhead us | Triton c=1 req/s (p50 ms) | Triton server CPU us/req | Triton overhead us |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def cells(run: ServedRun | None, framework: float) -> str:
        if run is None:
            return "- | - | -"
        return (f"{run.rate:.0f} ({run.p50_ms:.2f}) | {run.server_cpu_s / max(1, run.inferences) * 1e6:.0f} "
                f"| {overhead_us(run, framework):.0f}")

    for row in rows:
        lines.append(f"| {row.spec.name} | {row.framework_cpu_us:.0f} | {cells(row.trident_c1, row.framework_cpu_us)} "
                     f"| {cells(row.triton_c1, row.framework_cpu_us)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    load = sub.add_parser("load", help="internal: one closed-loop run, prints a JSON line")
    load.add_argument("--url", required=True)
    load.add_argument("--model", required=True)
    load.add_argument("--concurrency", type=int, required=True)
    load.add_argument("--warmup", type=float, required=True)
    load.add_argument("--duration", type=float, required=True)
    load.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--quick", action="store_true", help="1 round, 2 s runs: checks that it works")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--c1-duration", type=float, default=8.0, help="the sequential batch-1 runs")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--models", nargs="*", default=[s.name for s in MODELS],
                        choices=[s.name for s in MODELS])
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--triton-ports", default="9350:9351:9352", help="HTTP:GRPC:METRICS")
    parser.add_argument("--trident-flags", default="", help="more flags for trident serve, e.g. '--busy-poll-us 0'")
    parser.add_argument("--quiet-wait", type=float, default=10.0,
                        help="before each run, wait up to this long for the machine to be idle")
    args = parser.parse_args()
    if args.command == "load":
        spec = next(s for s in MODELS if s.name == args.model)
        result = asyncio.run(closed_loop(args.url, spec, args.concurrency, args.warmup, args.duration,
                                         args.server_pid))
        print(json.dumps(result))
        return
    if args.quick:
        args.rounds, args.duration, args.warmup, args.c1_duration, args.quiet_wait = 1, 2.0, 0.5, 2.0, 2.0
    ports = tuple(int(p) for p in args.triton_ports.split(":"))
    if len(ports) != 3:
        parser.error("--triton-ports takes HTTP:GRPC:METRICS")
    opts = Settings(args.rounds, args.warmup, args.duration, args.c1_duration, args.concurrency, not args.no_triton,
                    (ports[0], ports[1], ports[2]), tuple(args.trident_flags.split()), args.quiet_wait)
    started = time.time()
    rows = bench(args.models, opts)
    print(f"\n## Real models, CPU: server on CPU 0, tritonclient gRPC aio on CPU 1 (c={args.concurrency}, batch-1 "
          f"requests), {args.rounds} round(s) of {args.duration:g} s after {args.warmup:g} s warm-up, medians; "
          f"{time.time() - started:.0f} s in all\n")
    print(throughput_table(rows))
    print(f"\n## Batch 1, sequential (c=1, {args.c1_duration:g} s, round 1)\n")
    print(batch1_table(rows))


if __name__ == "__main__":
    main()
