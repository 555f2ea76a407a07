"""GPU checks of the framework backends, for a host with a CUDA device (the lent GPU machine).

Not collected by pytest. Run: ``python tests/bench/bench_gpu_backends.py [--seconds S]``; prints
a Markdown report and exits 0 whatever it finds (each check says ran / failed / not possible).

1. Environment: the CUDA devices torch sees, onnxruntime's providers, tensorrt's version.
2. onnxruntime CUDA EP: an MLP on a KIND_GPU instance (device 0) against the CPU EP's outputs.
3. PyTorch on ``cuda:0``: a TorchScript MLP on a KIND_GPU instance against CPU outputs; then its
   offline throughput (``module(x)`` on the device, best batch size) and the throughput of the
   same model served in-process by trident with dynamic batching and concurrent requests, as
   a fraction of the offline figure.
4. TensorRT: an engine built from the ONNX MLP with TensorRT's builder, saved as ``model.plan``,
   loaded on a KIND_GPU instance, outputs compared with onnxruntime's.
5. CUDA shared memory: a real ``trident serve`` with a PyTorch identity model on ``cuda:0``,
   one tritonclient gRPC/HTTP client at a time: 1 MiB and 16 MiB FP32 in the request body
   (gRPC, HTTP binary), in system shared memory and in CUDA shared memory (inputs and outputs);
   req/s, MB/s of input and server CPU per request (from /proc). The end-to-end CUDA tests are
   ``tests/e2e/test_cuda_shared_memory.py`` (run them with pytest on the same host).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_onnx_overhead import FEATURES, write_mlp  # noqa: E402

from trident import config as cfg  # noqa: E402
from trident.backends import get_backend  # noqa: E402
from trident.backends.base import LoadContext  # noqa: E402
from trident.protocol.pbtxt import parse_pbtxt  # noqa: E402
from trident.types import InferenceRequest, Tensor  # noqa: E402


def context(folder: Path, pbtxt: str, backend: str, kind: str) -> LoadContext:
    config = cfg.complete_defaults(parse_pbtxt(pbtxt), folder.name, model_dir=folder)
    config = get_backend(backend).auto_complete_config(config, folder, folder / "1")
    config = cfg.complete_defaults(config, folder.name)
    return LoadContext(folder.name, 1, folder, folder / "1", config, cfg.config_to_json(config),
                       f"{folder.name}_0", kind, 0)


def run(instance, name: str, x: np.ndarray, output: str) -> np.ndarray:
    (resp,) = instance.execute([InferenceRequest("m", [Tensor.from_numpy(name, x)])])
    if resp.error is not None:
        raise resp.error
    return resp.output(output).data


def check(title: str, fn) -> None:
    print(f"\n## {title}\n")
    try:
        fn()
    except Exception as e:
        print(f"FAILED: {type(e).__name__}: {e}")
        traceback.print_exc(limit=4, file=sys.stdout)


def environment() -> None:
    try:
        import torch

        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, devices: "
              f"{[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
    except ImportError as e:
        print(f"torch: not importable ({e})")
    try:
        import onnxruntime as ort

        print(f"onnxruntime {ort.__version__}: {ort.get_available_providers()}")
    except ImportError as e:
        print(f"onnxruntime: not importable ({e})")
    try:
        import tensorrt as trt

        print(f"tensorrt {trt.__version__}")
    except ImportError as e:
        print(f"tensorrt: not importable ({e})")


def onnxruntime_cuda(tmp: Path) -> None:
    folder = tmp / "ort_mlp"
    write_mlp(folder / "1" / "model.onnx")
    x = np.random.default_rng(0).random((16, FEATURES), dtype=np.float32)
    cpu = get_backend("onnxruntime").load_instance(context(folder, "", "onnxruntime", "KIND_CPU"))
    gpu = get_backend("onnxruntime").load_instance(context(folder, "", "onnxruntime", "KIND_GPU"))
    diff = np.abs(run(gpu, "x", x, "logits") - run(cpu, "x", x, "logits")).max()
    print(f"KIND_GPU session providers: {gpu.session.get_providers()}; max |gpu - cpu| = {diff:.2e}")
    gpu.finalize()
    cpu.finalize()


TORCH_CONFIG = '''backend: "pytorch" max_batch_size: 256
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {f} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] }} ]
instance_group [ {{ count: 1 kind: {kind} }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
'''


def torch_model(folder: Path, kind: str) -> None:
    import torch

    (folder / "1").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(FEATURES, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                              torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    torch.jit.script(mlp).save(str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text(TORCH_CONFIG.format(f=FEATURES, kind=kind))


def torch_cuda(tmp: Path, seconds: float) -> None:
    import torch
    import trio

    from trident.options import ServerOptions
    from trident.server import open_server

    folder = tmp / "torch_mlp"
    torch_model(folder, "KIND_GPU")
    pbtxt = (folder / "config.pbtxt").read_text()
    x = np.random.default_rng(1).random((8, FEATURES), dtype=np.float32)
    cpu = get_backend("pytorch").load_instance(context(folder, pbtxt.replace("KIND_GPU", "KIND_CPU"), "pytorch", "KIND_CPU"))
    gpu = get_backend("pytorch").load_instance(context(folder, pbtxt, "pytorch", "KIND_GPU"))
    diff = np.abs(run(gpu, "INPUT__0", x, "OUTPUT__0") - run(cpu, "INPUT__0", x, "OUTPUT__0")).max()
    print(f"KIND_GPU instance on {gpu.device}; max |gpu - cpu| = {diff:.2e}")
    module = gpu.module
    best = (0.0, 0)
    print("\n| batch | offline rows/s |\n|---:|---:|")
    for batch in (1, 8, 32, 64, 128, 256):
        xb = torch.from_numpy(np.random.default_rng(batch).random((batch, FEATURES), dtype=np.float32)).cuda()
        with torch.inference_mode():
            for _ in range(5):
                module(xb).cpu()
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 6:
                module(xb).cpu()
                n += 1
        rate = n * batch / (time.perf_counter() - start)
        best = max(best, (rate, batch))
        print(f"| {batch} | {rate:.0f} |")
    gpu.finalize()
    cpu.finalize()

    async def served() -> float:
        options = ServerOptions(model_repositories=[str(tmp)], model_control_mode="explicit", load_models=["torch_mlp"])
        async with open_server(options) as server:
            one = np.random.default_rng(2).random((1, FEATURES), dtype=np.float32)
            done = 0
            stop = time.perf_counter() + seconds

            async def client() -> None:
                nonlocal done
                while time.perf_counter() < stop:
                    await server.infer(InferenceRequest("torch_mlp", [Tensor.from_numpy("INPUT__0", one)]))
                    done += 1

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(256):
                    nursery.start_soon(client)
            elapsed = time.perf_counter() - start
            stats = server.model_statistics("torch_mlp")[0]
            sizes = sorted(((b.batch_size, b.compute_infer.count) for b in stats.batch_stats), key=lambda t: -t[1])[:5]
            print(f"\nserved: 256 concurrent in-process clients, batch-1 requests; most frequent batch sizes "
                  f"(size, executions): {sizes}")
            return done / elapsed

    rate = trio.run(served)
    print(f"served with dynamic batching: {rate:.0f} rows/s = {rate / best[0]:.1%} of offline {best[0]:.0f} rows/s "
          f"(best offline batch {best[1]})")


def tensorrt_plan(tmp: Path) -> None:
    import onnxruntime as ort
    import tensorrt as trt

    folder = tmp / "trt_mlp"
    onnx_path = write_mlp(tmp / "trt_src" / "model.onnx")
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
    plan = builder.build_serialized_network(network, build)
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.plan").write_bytes(bytes(plan))
    ctx = context(folder, "", "tensorrt", "KIND_GPU")
    print(f"auto-completed: max_batch_size {ctx.config.max_batch_size}, inputs "
          f"{[(i.name, list(i.dims)) for i in ctx.config.input]}, outputs {[(o.name, list(o.dims)) for o in ctx.config.output]}")
    instance = get_backend("tensorrt").load_instance(ctx)
    x = np.random.default_rng(3).random((16, FEATURES), dtype=np.float32)
    expected = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    print(f"max |tensorrt - onnxruntime cpu| = {np.abs(run(instance, 'x', x, 'logits') - expected).max():.2e}")
    instance.finalize()


CUDA_SHM_CONFIG = '''backend: "pytorch" max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_GPU } ]
'''


def _cpu_seconds(pid: int) -> float:
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cuda_shared_memory(tmp: Path, seconds: float) -> None:
    import uuid

    import torch
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm
    import tritonclient.utils.shared_memory as sysshm
    from e2e.conftest import start_server

    class Identity(torch.nn.Module):
        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:  # noqa: N803
            return INPUT__0 * 1.0

    repo = tmp / "cudashm_repo"
    (repo / "torch_identity" / "1").mkdir(parents=True)
    (repo / "torch_identity" / "config.pbtxt").write_text(CUDA_SHM_CONFIG)
    torch.jit.script(Identity()).save(str(repo / "torch_identity" / "1" / "model.pt"))
    server = start_server("--allow-client-shm=true", repo=repo, timeout=180.0)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.http_url)
    made_cuda, made_sys = [], []
    print("\n| size | transport | req/s | MB/s in | server CPU ms/req | output correct |\n|---|---|---:|---:|---:|---|")
    try:
        def one_size(mib: int) -> None:
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

            def body_grpc():
                i = grpcclient.InferInput("INPUT__0", [n], "FP32")
                i.set_data_from_numpy(x)
                return grpc.infer("torch_identity", [i]).as_numpy("OUTPUT__0")

            def body_http():
                i = httpclient.InferInput("INPUT__0", [n], "FP32")
                i.set_data_from_numpy(x, binary_data=True)
                o = httpclient.InferRequestedOutput("OUTPUT__0", binary_data=True)
                return http.infer("torch_identity", [i], outputs=[o]).as_numpy("OUTPUT__0")

            def in_shm(kind):
                def call():
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
                        return None
                    return sysshm.get_contents_as_numpy(sys_region, np.float32, [2 * n])[n:]
                return call

            for label, call in (("gRPC, in the body", body_grpc), ("HTTP binary, in the body", body_http),
                                ("gRPC, system shared memory", in_shm("system")),
                                ("gRPC, CUDA shared memory", in_shm("cuda"))):
                got = call()
                if got is None:
                    got = cudashm.get_contents_as_numpy(cout, np.float32, [n])
                correct = bool(np.array_equal(got, x))
                done, cpu0, start = 0, _cpu_seconds(server.proc.pid), time.perf_counter()
                while time.perf_counter() - start < seconds / 8:
                    call()
                    done += 1
                elapsed = time.perf_counter() - start
                cpu = _cpu_seconds(server.proc.pid) - cpu0
                print(f"| {mib} MiB | {label} | {done / elapsed:.0f} | {done * x.nbytes / elapsed / 1e6:.0f} | "
                      f"{cpu / done * 1e3:.3f} | {correct} |")
            grpc.unregister_cuda_shared_memory()
            grpc.unregister_system_shared_memory()
        for mib in (1, 16):
            one_size(mib)
    finally:
        grpc.close()
        http.close()
        server.stop()
        for h in made_cuda:
            cudashm.destroy_shared_memory_region(h)
        for h in made_sys:
            sysshm.destroy_shared_memory_region(h)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--only", default="", help="comma-separated: ort, torch, trt, cudashm (default: all)")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        check("Environment", environment)
        for key, title, fn in (
                ("ort", "onnxruntime CUDA execution provider (KIND_GPU, device 0)", lambda: onnxruntime_cuda(tmp)),
                ("torch", "PyTorch on cuda:0 (KIND_GPU) and dynamic batching vs offline",
                 lambda: torch_cuda(tmp, args.seconds)),
                ("trt", "TensorRT plan (KIND_GPU, device 0)", lambda: tensorrt_plan(tmp)),
                ("cudashm", "CUDA shared memory against the request body and system shared memory (1 client)",
                 lambda: cuda_shared_memory(tmp, args.seconds))):
            if not only or key in only:
                check(title, fn)


if __name__ == "__main__":
    main()
