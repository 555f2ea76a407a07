"""GPU checks of trident's GPU paths, as one prepared run on a host with a CUDA device (the lent
GPU machine): each check ran, failed or was skipped with its reason, under one time limit, and
the results go to ``tests/bench/results/<date>-<card>-gpu-backends.{md,json}``.

Not collected by pytest (tests/unit/bench/test_bench_gpu_backends.py runs it on the CPU, where
every GPU check must skip with a reason). Run::

    python tests/bench/bench_gpu_backends.py [--time-limit 420] [--seconds 6] [--only ort,resnet] [--out DIR]
    tests/bench/gpu_check.sh fetch && <device> tests/bench/gpu_check.sh run   # on the lent machine

Checks (``--only`` takes the keys):

* ``env``: torch, CUDA and the devices; onnxruntime's providers; tensorrt; torchvision; NVML.
* ``ort``: onnxruntime's CUDA execution provider on a KIND_GPU instance, outputs against the CPU EP.
* ``ort-trt``: onnxruntime's TensorRT execution provider (``gpu_execution_accelerator`` tensorrt).
* ``torch``: PyTorch on ``cuda:0`` (KIND_GPU), outputs against a KIND_CPU instance.
* ``trt``: the ``tensorrt`` backend: an engine built here from an ONNX model made here (TensorRT's
  builder), saved as ``model.plan``, loaded on KIND_GPU, outputs against onnxruntime's on the CPU.
* ``cudashm``: CUDA shared memory in and out through a real ``trident serve`` (gRPC), against the
  request body and system shared memory: req/s, MB/s, server CPU per request, outputs checked.
* ``pb-gpu``: Python-backend GPU tensors through BLS with real CUDA memory
  (tests/e2e/gpu_tensor_models.py, ``CUDA_SOURCE torch``): a callee that takes GPU inputs gets the
  caller's device memory and gives it back without a copy; a CPU-only callee gets a host copy;
  PreferredMemory CPU/GPU; the values against the CPU's; the time of a 64 MiB BLS call both ways.
* ``metrics``: a Prometheus scrape of a real ``trident serve`` with NVML: the ``nv_gpu_*`` and
  ``nv_energy_consumption`` families, their ``gpu_uuid`` against NVML's, totals against NVML's.
* ``resnet``: a ResNet-50 (torchvision's architecture, random weights, fp16) served by the
  pytorch backend with dynamic batching to many concurrent in-process clients, against the same
  module run offline at the batch sizes the server formed, host copies included both ways
  (target: served >= 90% of offline).

``--model small`` replaces ResNet-50 by a small conv net and ``--device cpu`` runs the served
against offline comparison on the CPU, and ``--cuda-source host`` runs pb-gpu with host memory
labelled CUDA: the script's own tests of that machinery on a CPU, not figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

RESULTS = HERE / "results"
STATUSES = ("ran", "failed", "skipped")


class Skip(Exception):
    """A check that cannot run here; the message is the reason."""


@dataclass
class Outcome:
    key: str
    title: str
    status: str = "skipped"
    reason: str = ""
    seconds: float = 0.0
    lines: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    tmp: Path
    seconds: float
    deadline: float
    device: str
    model: str
    cuda_source: str = "torch"
    outcome: Outcome | None = None

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        if self.outcome is not None:
            self.outcome.lines.append(line)

    def figure(self, name: str, value: Any) -> None:
        assert self.outcome is not None
        self.outcome.figures[name] = value

    def left(self) -> float:
        return self.deadline - time.monotonic()


# ---- what this host has ----


def _torch_cuda() -> str | None:
    """Why torch cannot use a CUDA device here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none"
    return None


def _ort_provider(provider: str) -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if provider not in ort.get_available_providers():
        return (f"onnxruntime {ort.__version__} has no {provider} (providers: {ort.get_available_providers()}; "
                "it comes with onnxruntime-gpu, which the GPU machine cannot fetch: no network there, and its "
                "wheel is over the 64 MiB a run can carry)")
    return None


def _tensorrt() -> str | None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return ("tensorrt is not installed (the GPU machine cannot fetch it: no network there, and its wheels are "
                "over the 64 MiB a run can carry)")
    return _torch_cuda()


def _nvml() -> str | None:
    try:
        import pynvml
    except ImportError:
        return "pynvml is not installed (pip install 'trident-inference[gpu]')"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded...
        return f"NVML cannot start: {type(e).__name__}: {e}"
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return "NVML sees no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None


def _module(name: str, why: str = "") -> str | None:
    try:
        __import__(name)
    except ImportError as e:
        return f"{name} is not installed{why} ({e})"
    return None


def card_name() -> str:
    """The GPU's name as a file-name part ("nvidia-h200"), or "no-gpu"."""
    try:
        import torch

        if torch.cuda.is_available():
            return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")
    except ImportError:
        pass
    return "no-gpu"


# ---- shared helpers ----


def context(folder: Path, pbtxt: str, backend: str, kind: str) -> Any:
    from trident import config as cfg
    from trident.backends import get_backend
    from trident.backends.base import LoadContext
    from trident.protocol.pbtxt import parse_pbtxt

    config = cfg.complete_defaults(parse_pbtxt(pbtxt), folder.name, model_dir=folder)
    config = get_backend(backend).auto_complete_config(config, folder, folder / "1")
    config = cfg.complete_defaults(config, folder.name)
    return LoadContext(folder.name, 1, folder, folder / "1", config, cfg.config_to_json(config),
                       f"{folder.name}_0", kind, 0)


def run(instance: Any, name: str, x: np.ndarray, output: str) -> np.ndarray:
    from trident.types import InferenceRequest, Tensor

    (resp,) = instance.execute([InferenceRequest("m", [Tensor.from_numpy(name, x)])])
    if resp.error is not None:
        raise resp.error
    return resp.output(output).data


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- the checks ----


def environment(ctx: Context) -> None:
    versions: dict[str, Any] = {"python": platform.python_version(), "host": socket.gethostname()}
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
        versions["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError as e:
        versions["torch"] = f"not importable ({e})"
    try:
        import onnxruntime as ort

        versions["onnxruntime"] = ort.__version__
        versions["onnxruntime_providers"] = ort.get_available_providers()
    except ImportError as e:
        versions["onnxruntime"] = f"not importable ({e})"
    for name in ("tensorrt", "torchvision", "tritonclient", "cuda.bindings"):
        try:
            module = __import__(name, fromlist=["_"])
            versions[name] = getattr(module, "__version__", "installed")
        except ImportError:
            versions[name] = "not installed"
    versions["nvml"] = _nvml() or "ok"
    for k, v in versions.items():
        ctx.say(f"- {k}: {v}")
        ctx.figure(k, v)


def onnxruntime_cuda(ctx: Context) -> None:
    from bench_onnx_overhead import FEATURES, write_mlp

    from trident.backends import get_backend

    folder = ctx.tmp / "ort_mlp"
    write_mlp(folder / "1" / "model.onnx")
    x = np.random.default_rng(0).random((16, FEATURES), dtype=np.float32)
    cpu = get_backend("onnxruntime").load_instance(context(folder, "", "onnxruntime", "KIND_CPU"))
    gpu = get_backend("onnxruntime").load_instance(context(folder, "", "onnxruntime", "KIND_GPU"))
    try:
        providers = gpu.session.get_providers()
        diff = float(np.abs(run(gpu, "x", x, "logits") - run(cpu, "x", x, "logits")).max())
    finally:
        gpu.finalize()
        cpu.finalize()
    ctx.say(f"KIND_GPU session providers: {providers}; max |gpu - cpu| = {diff:.2e}")
    ctx.figure("providers", providers)
    ctx.figure("max_abs_diff", diff)
    if providers[0] != "CUDAExecutionProvider":
        raise AssertionError(f"the KIND_GPU session runs on {providers[0]}, not CUDA")
    if diff > 1e-3:
        raise AssertionError(f"outputs differ from the CPU's by {diff:.2e}")


ORT_TRT_CONFIG = '''optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }
instance_group [ { count: 1 kind: KIND_GPU } ]
'''


def onnxruntime_tensorrt(ctx: Context) -> None:
    from bench_onnx_overhead import FEATURES, write_mlp

    from trident.backends import get_backend

    folder = ctx.tmp / "ort_trt_mlp"
    write_mlp(folder / "1" / "model.onnx")
    x = np.random.default_rng(4).random((16, FEATURES), dtype=np.float32)
    cpu = get_backend("onnxruntime").load_instance(context(folder, "", "onnxruntime", "KIND_CPU"))
    start = time.perf_counter()
    trt = get_backend("onnxruntime").load_instance(context(folder, ORT_TRT_CONFIG, "onnxruntime", "KIND_GPU"))
    try:
        first = run(trt, "x", x, "logits")  # TensorRT builds its engine on the first run
        built = time.perf_counter() - start
        providers = trt.session.get_providers()
        diff = float(np.abs(first - run(cpu, "x", x, "logits")).max())
    finally:
        trt.finalize()
        cpu.finalize()
    ctx.say(f"session providers: {providers}; load and first run (engine build) {built:.1f} s; "
            f"max |tensorrt ep - cpu| = {diff:.2e}")
    ctx.figure("providers", providers)
    ctx.figure("max_abs_diff", diff)
    ctx.figure("load_and_first_run_s", round(built, 2))
    if providers[0] != "TensorrtExecutionProvider":
        raise AssertionError(f"the session runs on {providers[0]}, not TensorRT")
    if diff > 1e-2:
        raise AssertionError(f"outputs differ from the CPU's by {diff:.2e}")


TORCH_CONFIG = '''backend: "pytorch" max_batch_size: 256
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {f} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] }} ]
instance_group [ {{ count: 1 kind: {kind} }} ]
'''


def torch_cuda(ctx: Context) -> None:
    import torch
    from bench_onnx_overhead import FEATURES

    from trident.backends import get_backend

    folder = ctx.tmp / "torch_mlp"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(FEATURES, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    torch.jit.script(mlp).save(str(folder / "1" / "model.pt"))
    pbtxt = TORCH_CONFIG.format(f=FEATURES, kind="KIND_GPU")
    (folder / "config.pbtxt").write_text(pbtxt)
    x = np.random.default_rng(1).random((8, FEATURES), dtype=np.float32)
    cpu = get_backend("pytorch").load_instance(context(folder, pbtxt.replace("KIND_GPU", "KIND_CPU"), "pytorch",
                                                       "KIND_CPU"))
    gpu = get_backend("pytorch").load_instance(context(folder, pbtxt, "pytorch", "KIND_GPU"))
    try:
        diff = float(np.abs(run(gpu, "INPUT__0", x, "OUTPUT__0") - run(cpu, "INPUT__0", x, "OUTPUT__0")).max())
        device = str(gpu.device)
    finally:
        gpu.finalize()
        cpu.finalize()
    ctx.say(f"KIND_GPU instance on {device}; max |gpu - cpu| = {diff:.2e}")
    ctx.figure("device", device)
    ctx.figure("max_abs_diff", diff)
    if not device.startswith("cuda") or diff > 1e-3:
        raise AssertionError(f"instance on {device}, outputs differ by {diff:.2e}")


def tensorrt_plan(ctx: Context) -> None:
    import onnxruntime as ort
    import tensorrt as trt
    from bench_onnx_overhead import FEATURES, write_mlp

    from trident.backends import get_backend

    folder = ctx.tmp / "trt_mlp"
    onnx_path = write_mlp(ctx.tmp / "trt_src" / "model.onnx")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        raise RuntimeError([parser.get_error(i) for i in range(parser.num_errors)])
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, FEATURES), (16, FEATURES), (64, FEATURES))
    build = builder.create_builder_config()
    build.add_optimization_profile(profile)
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, build)
    ctx.figure("engine_build_s", round(time.perf_counter() - start, 2))
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.plan").write_bytes(bytes(plan))
    load = context(folder, "", "tensorrt", "KIND_GPU")
    ctx.say(f"tensorrt {trt.__version__}; auto-completed: max_batch_size {load.config.max_batch_size}, inputs "
            f"{[(i.name, list(i.dims)) for i in load.config.input]}, outputs "
            f"{[(o.name, list(o.dims)) for o in load.config.output]}")
    instance = get_backend("tensorrt").load_instance(load)
    try:
        x = np.random.default_rng(3).random((16, FEATURES), dtype=np.float32)
        expected = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        diff = float(np.abs(run(instance, "x", x, "logits") - expected).max())
    finally:
        instance.finalize()
    ctx.say(f"max |tensorrt - onnxruntime cpu| = {diff:.2e}")
    ctx.figure("max_abs_diff", diff)
    if diff > 1e-2:
        raise AssertionError(f"outputs differ from onnxruntime's by {diff:.2e}")


CUDA_SHM_CONFIG = '''backend: "pytorch" max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_GPU } ]
'''


def cuda_shared_memory(ctx: Context) -> None:
    import uuid

    import torch
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.cuda_shared_memory as cudashm
    import tritonclient.utils.shared_memory as sysshm
    from e2e.conftest import start_server

    class Identity(torch.nn.Module):
        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:  # noqa: N803
            return INPUT__0 * 1.0

    repo = ctx.tmp / "cudashm_repo"
    (repo / "torch_identity" / "1").mkdir(parents=True)
    (repo / "torch_identity" / "config.pbtxt").write_text(CUDA_SHM_CONFIG)
    torch.jit.script(Identity()).save(str(repo / "torch_identity" / "1" / "model.pt"))
    server = start_server("--allow-client-shm=true", repo=repo, timeout=180.0)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    made_cuda: list[Any] = []
    made_sys: list[Any] = []
    rows = []
    ctx.say("| size | transport | req/s | MB/s in | server CPU ms/req | output correct |\n|---|---|---:|---:|---:|---|")
    try:
        for mib in (1, 16):
            n = mib * 1024 * 1024 // 4
            x = np.random.default_rng(mib).random(n, dtype=np.float32)
            tag = uuid.uuid4().hex[:6]
            cin = cudashm.create_shared_memory_region(f"ci{tag}", x.nbytes, 0)
            cout = cudashm.create_shared_memory_region(f"co{tag}", x.nbytes, 0)
            made_cuda.extend([cin, cout])
            cudashm.set_shared_memory_region(cin, [x])
            grpc.register_cuda_shared_memory(f"ci{tag}", cudashm.get_raw_handle(cin), 0, x.nbytes)
            grpc.register_cuda_shared_memory(f"co{tag}", cudashm.get_raw_handle(cout), 0, x.nbytes)
            key = f"/trident_bench_{tag}"
            sys_region = sysshm.create_shared_memory_region(key[1:] + "io", key, 2 * x.nbytes)
            made_sys.append(sys_region)
            sysshm.set_shared_memory_region(sys_region, [x])
            grpc.register_system_shared_memory(f"s{tag}", key, 2 * x.nbytes)

            def body(n: int = n, x: np.ndarray = x) -> np.ndarray:
                i = grpcclient.InferInput("INPUT__0", [n], "FP32")
                i.set_data_from_numpy(x)
                return grpc.infer("torch_identity", [i]).as_numpy("OUTPUT__0")

            def in_shm(kind: str, n: int = n, x: np.ndarray = x, tag: str = tag, cout: Any = cout,
                       sys_region: Any = sys_region) -> Callable[[], np.ndarray]:
                def shm_call() -> np.ndarray:
                    i = grpcclient.InferInput("INPUT__0", [n], "FP32")
                    o = grpcclient.InferRequestedOutput("OUTPUT__0")
                    if kind == "cuda":
                        i.set_shared_memory(f"ci{tag}", x.nbytes)
                        o.set_shared_memory(f"co{tag}", x.nbytes)
                    else:
                        i.set_shared_memory(f"s{tag}", x.nbytes)
                        o.set_shared_memory(f"s{tag}", x.nbytes, offset=x.nbytes)
                    grpc.infer("torch_identity", [i], outputs=[o])
                    if kind == "cuda":
                        return cudashm.get_contents_as_numpy(cout, np.float32, [n])
                    return sysshm.get_contents_as_numpy(sys_region, np.float32, [2 * n])[n:]
                return shm_call

            for label, call in (("gRPC, in the body", body), ("gRPC, system shared memory", in_shm("system")),
                                ("gRPC, CUDA shared memory in and out", in_shm("cuda"))):
                correct = bool(np.array_equal(call(), x))
                done, cpu0, start = 0, _cpu_seconds(server.proc.pid), time.perf_counter()
                while time.perf_counter() - start < ctx.seconds / 6:
                    call()
                    done += 1
                elapsed = time.perf_counter() - start
                cpu = _cpu_seconds(server.proc.pid) - cpu0
                row = {"mib": mib, "transport": label, "req_s": round(done / elapsed, 1),
                       "mb_s_in": round(done * x.nbytes / elapsed / 1e6), "server_cpu_ms": round(cpu / done * 1e3, 3),
                       "correct": correct}
                rows.append(row)
                ctx.say(f"| {mib} MiB | {label} | {row['req_s']:.0f} | {row['mb_s_in']} | {row['server_cpu_ms']:.3f} | "
                        f"{correct} |")
            grpc.unregister_cuda_shared_memory()
            grpc.unregister_system_shared_memory()
    finally:
        grpc.close()
        server.stop()
        for h in made_cuda:
            cudashm.destroy_shared_memory_region(h)
        for h in made_sys:
            sysshm.destroy_shared_memory_region(h)
    ctx.figure("rows", rows)
    if not all(r["correct"] for r in rows):
        raise AssertionError("an output differs from its input")


#: (callee, preferred memory) -> what gpu_caller must see (tests/e2e/test_python_gpu_tensors.py)
PB_GPU_EXPECTED = {
    ("gpu_callee", "default"): {"CALLEE_SAW_CPU": False, "SAME_IN": True, "Y_CPU": False, "SAME_OUT": True},
    ("gpu_callee", "cpu"): {"CALLEE_SAW_CPU": False, "SAME_IN": True, "Y_CPU": True, "SAME_OUT": False},
    ("cpu_callee", "default"): {"CALLEE_SAW_CPU": True, "SAME_IN": False, "Y_CPU": True, "SAME_OUT": False},
    ("cpu_callee", "gpu"): {"CALLEE_SAW_CPU": True, "SAME_IN": False, "Y_CPU": False, "SAME_OUT": False},
    ("process_callee", "default"): {"CALLEE_SAW_CPU": True, "SAME_IN": False, "Y_CPU": True, "SAME_OUT": False},
}


def python_gpu_tensors(ctx: Context) -> None:
    """gpu_caller's cases against PB_GPU_EXPECTED (``--cuda-source host``: the CPU stand-in, for
    the script's own test), then a 64 MiB tensor sent by BLS to each callee."""
    import tritonclient.grpc as grpcclient
    from e2e.conftest import start_server
    from e2e.gpu_tensor_models import write_gpu_models

    source = ctx.cuda_source

    repo = ctx.tmp / f"pb_gpu_{source}"
    write_gpu_models(repo, source)
    server = start_server(repo=repo, timeout=180.0)
    failures = []
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            def call(callee: str, memory: str, x: np.ndarray) -> Any:
                inputs = [grpcclient.InferInput("X", [len(x)], "FP32"), grpcclient.InferInput("CALLEE", [1], "BYTES"),
                          grpcclient.InferInput("MEMORY", [1], "BYTES")]
                inputs[0].set_data_from_numpy(x)
                inputs[1].set_data_from_numpy(np.array([callee.encode()], dtype=object))
                inputs[2].set_data_from_numpy(np.array([memory.encode()], dtype=object))
                return c.infer("gpu_caller", inputs)

            x = np.arange(1024, dtype=np.float32) - 511.5
            ctx.say("| callee | preferred memory | callee saw CPU | same memory in | Y on CPU | same memory out | "
                    "values | as expected |\n|---|---|---|---|---|---|---|---|")
            cases = []
            for (callee, memory), expected in PB_GPU_EXPECTED.items():
                result = call(callee, memory, x)
                seen = {k: bool(result.as_numpy(k)[0]) for k in expected}
                values = bool(np.array_equal(result.as_numpy("Y"), x))
                ok = seen == expected and values
                if not ok:
                    failures.append(f"{callee}/{memory}: saw {seen}, values equal {values}")
                cases.append({"callee": callee, "memory": memory, **seen, "values_equal": values, "as_expected": ok})
                ctx.say(f"| {callee} | {memory} | {seen['CALLEE_SAW_CPU']} | {seen['SAME_IN']} | {seen['Y_CPU']} | "
                        f"{seen['SAME_OUT']} | {values} | {ok} |")
            ctx.figure("cases", cases)
            big = np.random.default_rng(5).random(16 * 1024 * 1024, dtype=np.float32)  # 64 MiB
            timing = {}
            for callee in ("gpu_callee", "cpu_callee"):
                call(callee, "default", big)
                times = []
                for _ in range(5):
                    start = time.perf_counter()
                    call(callee, "default", big)
                    times.append(time.perf_counter() - start)
                timing[callee] = round(min(times) * 1e3, 2)
            ctx.say(f"\n64 MiB GPU tensor through BLS, client round trip (best of 5, the client's own 64 MiB each "
                    f"way included): to a callee that takes GPU inputs {timing['gpu_callee']} ms, to a CPU-only "
                    f"callee (device -> host copy, and back for the client) {timing['cpu_callee']} ms")
            ctx.figure("bls_64mib_ms", timing)
    finally:
        server.stop()
    if failures:
        raise AssertionError("; ".join(failures))


GPU_FAMILIES = ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
                "nv_gpu_power_limit", "nv_energy_consumption")


def gpu_metrics(ctx: Context) -> None:
    import httpx
    import pynvml
    from e2e.conftest import start_server

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        limit_w = pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000
    finally:
        pynvml.nvmlShutdown()
    repo = ctx.tmp / "metrics_repo"
    repo.mkdir()
    server = start_server("--metrics-interval-ms=200", repo=repo, timeout=120.0)
    try:
        time.sleep(1.0)  # a few polls
        text = httpx.get(server.metrics_url, timeout=10).text
    finally:
        server.stop()
    samples: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        m = re.match(r"^(nv_gpu_\w+|nv_energy_consumption)\{([^}]*)\} (\S+)$", line)
        if m:
            samples.setdefault(m.group(1), []).append((m.group(2), float(m.group(3))))
    ctx.say(f"NVML device 0: {uuid}, {total / 2**30:.1f} GiB, power limit {limit_w:.0f} W")
    for family in GPU_FAMILIES:
        ctx.say(f"- {family}: {samples.get(family, 'MISSING')}")
    ctx.figure("nvml_uuid", uuid)
    ctx.figure("samples", {k: [list(s) for s in v] for k, v in samples.items()})
    missing = [f for f in GPU_FAMILIES if f not in samples]
    if missing:
        raise AssertionError(f"families missing from the scrape: {missing}")
    labels = samples["nv_gpu_memory_total_bytes"][0][0]
    if f'gpu_uuid="{uuid}"' not in labels:
        raise AssertionError(f"gpu_uuid label {labels} is not NVML's {uuid}")
    scraped_total = samples["nv_gpu_memory_total_bytes"][0][1]
    if abs(scraped_total - total) > 0.01 * total:
        raise AssertionError(f"nv_gpu_memory_total_bytes {scraped_total} is not NVML's {total}")
    if abs(samples["nv_gpu_power_limit"][0][1] - limit_w) > 1:
        raise AssertionError(f"nv_gpu_power_limit {samples['nv_gpu_power_limit'][0][1]} W is not NVML's {limit_w} W")


RESNET_CONFIG = '''name: "resnet"
backend: "pytorch"
max_batch_size: {max_batch}
input [ {{ name: "INPUT__0" data_type: {dtype} dims: [ 3, {size}, {size} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: {dtype} dims: [ 1000 ] }} ]
instance_group [ {{ count: 1 kind: {kind} }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
'''


def _small_net() -> Any:
    """A small conv net with ResNet-50's input and output (``--model small``: the script's test)."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
        torch.nn.Linear(128, 1000))


def resnet_served_vs_offline(ctx: Context) -> None:
    import torch
    import trio

    from trident.options import ServerOptions
    from trident.server import open_server
    from trident.types import InferenceRequest, Tensor

    gpu = ctx.device == "cuda"
    dtype = torch.float16 if gpu else torch.float32
    np_dtype = np.float16 if gpu else np.float32
    size = 224 if ctx.model == "resnet50" else 64
    batches = (1, 8, 16, 32, 64) if gpu else (1, 4, 8)
    max_batch = batches[-1]
    clients = 256 if gpu else 16
    device = torch.device("cuda:0" if gpu else "cpu")
    torch.manual_seed(0)
    if ctx.model == "resnet50":
        import torchvision

        net = torchvision.models.resnet50(weights=None)
    else:
        net = _small_net()
    net = net.eval().to(device=device, dtype=dtype)
    example = torch.randn(1, 3, size, size, device=device, dtype=dtype)
    with torch.inference_mode():
        module = torch.jit.trace(net, example)
    folder = ctx.tmp / "resnet_repo" / "resnet"
    (folder / "1").mkdir(parents=True)
    module.save(str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text(RESNET_CONFIG.format(
        max_batch=max_batch, dtype="TYPE_FP16" if gpu else "TYPE_FP32", size=size,
        kind="KIND_GPU" if gpu else "KIND_CPU", delay_us=2000))
    rng = np.random.default_rng(6)
    images = rng.standard_normal((max_batch, 3, size, size)).astype(np_dtype)
    ctx.say(f"model: {ctx.model} ({'torchvision' if ctx.model == 'resnet50' else 'small test net'}, random weights), "
            f"{dtype}, {size}x{size}, on {device}; offline = the saved model.pt loaded as the backend loads it (a "
            f"fresh load per batch size), host array -> device -> module -> host, as the server does")

    def offline(batch: int, seconds: float) -> float:
        loaded = torch.jit.load(str(folder / "1" / "model.pt"), map_location=device)
        x = images[:batch]
        with torch.inference_mode(), torch.jit.optimized_execution(True):
            for _ in range(10):
                loaded(torch.from_numpy(x).to(device)).cpu()
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                loaded(torch.from_numpy(x).to(device)).cpu().numpy()
                n += 1
            return n * batch / (time.perf_counter() - start)

    per = ctx.seconds / (len(batches) + 2)
    table = {b: offline(b, per) for b in batches}
    ctx.say("\n| batch | offline images/s |\n|---:|---:|")
    for b, rate in table.items():
        ctx.say(f"| {b} | {rate:.0f} |")
    with torch.inference_mode():
        expected = net(torch.from_numpy(images[:1]).to(device)).float().cpu().numpy()

    async def served() -> tuple[float, list[tuple[int, int]], float]:
        options = ServerOptions(model_repositories=[str(folder.parent)], model_control_mode="explicit",
                                load_models=["resnet"])
        async with open_server(options) as server:
            one = images[:1]
            first = await server.infer(InferenceRequest("resnet", [Tensor.from_numpy("INPUT__0", one)]))
            if first.error is not None:
                raise first.error
            diff = float(np.abs(first.output("OUTPUT__0").data.astype(np.float32) - expected).max())
            done = 0
            stop = time.perf_counter() + 2 * per

            async def client() -> None:
                nonlocal done
                while time.perf_counter() < stop:
                    response = await server.infer(InferenceRequest("resnet", [Tensor.from_numpy("INPUT__0", one)]))
                    if response.error is not None:
                        raise response.error
                    done += 1

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(clients):
                    nursery.start_soon(client)
            elapsed = time.perf_counter() - start
            stats = server.model_statistics("resnet")[0]
            formed = sorted(((b.batch_size, b.compute_infer.count) for b in stats.batch_stats), key=lambda t: -t[1])
            return done / elapsed, formed, diff

    rate, formed, diff = trio.run(served)
    executions = sum(count for _, count in formed)
    mean_batch = sum(size_ * count for size_, count in formed) / max(executions, 1)
    # offline at the batch sizes the server formed, each weighted by the images it carried
    shown = sorted({b for b, _ in formed[:4]} | {max_batch})
    at_formed = {b: table.get(b) or offline(b, per / 2) for b in shown}
    images_by_size = {b: b * count for b, count in formed}
    weight = sum(images_by_size.get(b, 0) for b in at_formed)
    offline_mix = (sum(images_by_size.get(b, 0) / at_formed[b] for b in at_formed) / weight) ** -1 if weight else 0.0
    ratio = rate / offline_mix if offline_mix else 0.0
    ctx.say(f"\nserved: {clients} concurrent in-process clients, one image per request, dynamic batching "
            f"(max batch {max_batch}, 2 ms queue delay): {rate:.0f} images/s; batch sizes formed (size, executions), "
            f"most frequent first: {formed[:6]}; mean batch {mean_batch:.1f}")
    ctx.say(f"offline at those batch sizes (weighted by the images each carried): {offline_mix:.0f} images/s -> "
            f"served/offline = {ratio:.1%} (target >= 90%: {'met' if ratio >= 0.9 else 'NOT met'}); "
            f"best offline {max(table.values()):.0f} images/s at batch {max(table, key=table.get)}")
    ctx.say(f"served output against the module's for the same image: max |diff| = {diff:.2e}")
    for name, value in (("served_images_s", round(rate, 1)), ("offline_images_s", {b: round(r, 1) for b, r in table.items()}),
                        ("offline_at_formed_images_s", round(offline_mix, 1)), ("ratio", round(ratio, 4)),
                        ("target_met", ratio >= 0.9), ("formed", formed), ("mean_batch", round(mean_batch, 2)),
                        ("max_abs_diff", diff), ("clients", clients), ("model", ctx.model), ("device", str(device))):
        ctx.figure(name, value)
    if diff > (5e-2 if gpu else 1e-4):
        raise AssertionError(f"served outputs differ from the module's by {diff:.2e}")


@dataclass
class Check:
    key: str
    title: str
    run: Callable[[Context], None]
    needs: Callable[[Context], str | None]
    estimate: float  # seconds it usually takes (a check is skipped when less is left)


def _cuda_and(*more: Callable[[], str | None]) -> Callable[[Context], str | None]:
    def needs(ctx: Context) -> str | None:
        for why in (_torch_cuda, *more):
            reason = why()
            if reason:
                return reason
        return None
    return needs


def _pb_gpu_needs(ctx: Context) -> str | None:
    if ctx.cuda_source == "torch":
        return _cuda_and(lambda: _module("tritonclient.grpc"))(ctx)
    return _module("tritonclient.grpc")


def _resnet_needs(ctx: Context) -> str | None:
    if ctx.device == "cuda":
        reason = _torch_cuda()
        if reason:
            return reason
    elif _module("torch"):
        return _module("torch")
    if ctx.model == "resnet50":
        return _module("torchvision", ": ResNet-50 is torchvision's architecture")
    return None


CHECKS = [
    Check("env", "Environment", environment, lambda ctx: None, 0),
    Check("ort", "onnxruntime CUDA execution provider (KIND_GPU, device 0)", onnxruntime_cuda,
          _cuda_and(lambda: _ort_provider("CUDAExecutionProvider")), 20),
    Check("ort-trt", "onnxruntime TensorRT execution provider (gpu_execution_accelerator tensorrt)",
          onnxruntime_tensorrt, _cuda_and(lambda: _ort_provider("TensorrtExecutionProvider")), 90),
    Check("torch", "PyTorch on cuda:0 (KIND_GPU) against the CPU", torch_cuda, _cuda_and(), 20),
    Check("trt", "TensorRT backend: an engine built here from an ONNX model made here", tensorrt_plan,
          _cuda_and(_tensorrt), 90),
    Check("cudashm", "CUDA shared memory in and out (trident serve, gRPC, one client)", cuda_shared_memory,
          _cuda_and(lambda: _module("tritonclient.grpc"), lambda: _module("cuda.bindings")), 40),
    Check("pb-gpu", "Python-backend GPU tensors through BLS (real CUDA memory)", python_gpu_tensors,
          _pb_gpu_needs, 40),
    Check("metrics", "nv_gpu_* metrics scraped from trident serve with real NVML", gpu_metrics,
          lambda ctx: _nvml() or _module("httpx"), 15),
    Check("resnet", "ResNet-50 fp16 served with dynamic batching against offline at the same batch sizes",
          resnet_served_vs_offline, _resnet_needs, 90),
]


def run_checks(ctx: Context, only: set[str]) -> list[Outcome]:
    outcomes = []
    for check in CHECKS:
        if only and check.key not in only:
            continue
        outcome = Outcome(check.key, check.title)
        outcomes.append(outcome)
        ctx.outcome = outcome
        print(f"\n## {check.title} [{check.key}]\n", flush=True)
        start = time.monotonic()
        try:
            reason = check.needs(ctx)
            if reason is None and ctx.left() < check.estimate:
                reason = (f"time limit: {max(ctx.left(), 0):.0f} s left of --time-limit, the check takes about "
                          f"{check.estimate:.0f} s")
            if reason is not None:
                raise Skip(reason)
            check.run(ctx)
            outcome.status = "ran"
        except Skip as e:
            outcome.status, outcome.reason = "skipped", str(e)
        except Exception as e:
            outcome.status, outcome.reason = "failed", f"{type(e).__name__}: {e}"
            outcome.lines.extend(traceback.format_exc(limit=6).splitlines())
        outcome.seconds = round(time.monotonic() - start, 2)
        print(f"-> {outcome.status}{': ' + outcome.reason if outcome.reason else ''} ({outcome.seconds} s)", flush=True)
    ctx.outcome = None
    return outcomes


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_results(outcomes: list[Outcome], out: Path, card: str, args: dict[str, Any],
                  now: datetime.datetime | None = None) -> tuple[Path, Path]:
    """``<out>/<date>-<card>-gpu-backends.md`` and ``.json``: every check's status, reason, time,
    printed lines and figures. Returns both paths."""
    now = now or datetime.datetime.now(datetime.UTC)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{now:%Y-%m-%d}-{card}-gpu-backends"
    doc = {"date": now.isoformat(timespec="seconds"), "card": card, "commit": _commit(), "args": args,
           "python": platform.python_version(), "checks": [asdict(o) for o in outcomes]}
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    lines = [f"# GPU checks: {card}, {now:%Y-%m-%d %H:%M} UTC", "",
             f"commit {doc['commit']}; `python tests/bench/bench_gpu_backends.py "
             f"{' '.join(f'--{k.replace(chr(95), chr(45))} {v}' for k, v in args.items() if v not in ('', None))}`", "",
             "| check | status | time | reason |", "|---|---|---:|---|"]
    lines += [f"| {o.key} | {o.status} | {o.seconds:.1f} s | {o.reason.replace('|', '/')} |" for o in outcomes]
    for o in outcomes:
        lines += ["", f"## {o.title} [{o.key}]: {o.status}", ""]
        if o.reason:
            lines += [o.reason, ""]
        lines += o.lines
    md_path = out / f"{stem}.md"
    md_path.write_text("\n".join(lines) + "\n")
    return md_path, json_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="measuring time of each timed check (s)")
    parser.add_argument("--time-limit", type=float, default=420.0,
                        help="the whole run's budget (s): a check that would not fit is skipped, saying so")
    parser.add_argument("--only", default="", help=f"comma-separated keys of {[c.key for c in CHECKS]} (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the result files")
    parser.add_argument("--card", default="", help="the GPU's name in the file names (default: as torch names it)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="resnet's device (cpu: a test)")
    parser.add_argument("--model", choices=("resnet50", "small"), default="resnet50", help="resnet's model")
    parser.add_argument("--cuda-source", choices=("torch", "host"), default="torch",
                        help="pb-gpu's device tensors (host: host memory labelled CUDA, a test on the CPU)")
    args = parser.parse_args(argv)
    unknown = set(filter(None, args.only.split(","))) - {c.key for c in CHECKS}
    if unknown:
        parser.error(f"--only: unknown check(s) {sorted(unknown)}; known: {[c.key for c in CHECKS]}")
    if args.seconds <= 0 or args.time_limit <= 0:
        parser.error("--seconds and --time-limit must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    card = args.card or card_name()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trident-gpu-check-") as tmp_name:
        ctx = Context(Path(tmp_name), args.seconds, start + args.time_limit, args.device, args.model, args.cuda_source)
        outcomes = run_checks(ctx, only)
    md, js = write_results(outcomes, args.out, card, {"seconds": args.seconds, "time_limit": args.time_limit,
                                                      "only": args.only, "device": args.device, "model": args.model,
                                                      "cuda_source": args.cuda_source})
    counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    print(f"\n{counts['ran']} ran, {counts['failed']} failed, {counts['skipped']} skipped in "
          f"{time.monotonic() - start:.0f} s; results: {md} and {js}", flush=True)
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
