"""What serving an ONNX model through trident adds over calling onnxruntime directly.

Not collected by pytest. Run: ``python tests/bench/bench_onnx_overhead.py [--iterations N]``

1. Added cost per request: an MLP (128 -> 512 -> 512 -> 10, FP32) served by ``trident serve``
   (one instance, ``intra_op_thread_count: 1``, no dynamic batching) and called sequentially by
   tritonclient over HTTP (binary tensors) and gRPC, against ``session.run`` on the same input
   with the same thread count, at batch 1 and 32. The added cost is the median client-observed
   request latency minus the median ``session.run`` time; it includes the client library's
   own encode/decode.
2. Instances scale: two ``OnnxInstance`` objects executing from two threads (the GIL is
   released inside ``session.run``) against one, batch 32.
3. Unload releases memory: process RSS before loading, after loading and after unloading a
   model with ~200 MB of weights through the in-process server (explicit model control),
   for onnxruntime, OpenVINO and PyTorch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from proc_stats import cpu_seconds  # tests/bench/proc_stats.py (the script runs from tests/bench)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/ for e2e.conftest

FEATURES, HIDDEN, CLASSES = 128, 512, 10
CONFIG = '''
backend: "onnxruntime"
max_batch_size: 32
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters [ { key: "intra_op_thread_count" value { string_value: "1" } } ]
'''


def write_mlp(path: Path, features: int = FEATURES, hidden: int = HIDDEN, classes: int = CLASSES, layers: int = 2) -> Path:
    rng = np.random.default_rng(0)
    inits, nodes, prev, width = [], [], "x", features
    for i in range(layers):
        inits += [numpy_helper.from_array(rng.standard_normal((width, hidden)).astype(np.float32) * 0.05, f"W{i}"),
                  numpy_helper.from_array(np.zeros(hidden, np.float32), f"B{i}")]
        nodes += [helper.make_node("Gemm", [prev, f"W{i}", f"B{i}"], [f"h{i}"]),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"])]
        prev, width = f"r{i}", hidden
    inits += [numpy_helper.from_array(rng.standard_normal((width, classes)).astype(np.float32) * 0.05, "Wo"),
              numpy_helper.from_array(np.zeros(classes, np.float32), "Bo")]
    nodes.append(helper.make_node("Gemm", [prev, "Wo", "Bo"], ["logits"]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def timed(fn, iterations: int) -> list[float]:
    for _ in range(max(5, iterations // 20)):
        fn()
    out = []
    for _ in range(iterations):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out




def cell(v: list[float]) -> str:
    return f"{statistics.median(v):.0f} ({np.percentile(v, 90):.0f})"


def overhead(iterations: int) -> None:
    import onnxruntime as ort
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from e2e.conftest import start_server

    from trident.options import EXAMPLE_REPOSITORY

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        path = write_mlp(repo / "mlp" / "1" / "model.onnx")
        (repo / "mlp" / "config.pbtxt").write_text(CONFIG)
        shutil.copytree(EXAMPLE_REPOSITORY / "identity_fp32", repo / "identity_fp32",
                        ignore=shutil.ignore_patterns("__pycache__"))
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        server = start_server("--log-verbose=0", repo=repo)
        try:
            http = httpclient.InferenceServerClient(server.http_url)
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            print(f"\n## Added cost per request (µs, median of {iterations}; p90 in parentheses)\n")
            pid = server.proc.pid

            def served(fn) -> tuple[list[float], float]:
                """Latencies (µs) and the server's CPU µs per request over the timed calls."""
                before = cpu_seconds(pid)
                lat = timed(fn, iterations)
                return lat, (cpu_seconds(pid) - before) / (len(lat) + max(5, iterations // 20)) * 1e6

            print("| batch | session.run | HTTP request | HTTP added | server CPU/req HTTP | gRPC request | gRPC added "
                  "| server CPU/req gRPC |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|")
            for batch in (1, 32):
                x = np.random.default_rng(batch).random((batch, FEATURES), dtype=np.float32)
                expected = session.run(["logits"], {"x": x})[0]
                hin = httpclient.InferInput("x", list(x.shape), "FP32")
                hin.set_data_from_numpy(x, binary_data=True)
                hout = [httpclient.InferRequestedOutput("logits", binary_data=True)]
                gin = grpcclient.InferInput("x", list(x.shape), "FP32")
                gin.set_data_from_numpy(x)
                np.testing.assert_allclose(http.infer("mlp", [hin], outputs=hout).as_numpy("logits"), expected, rtol=1e-4)
                np.testing.assert_allclose(grpc.infer("mlp", [gin]).as_numpy("logits"), expected, rtol=1e-4)
                plain = timed(lambda x=x: session.run(["logits"], {"x": x}), iterations)
                over_http, cpu_http = served(lambda hin=hin, hout=hout: http.infer("mlp", [hin], outputs=hout))
                over_grpc, cpu_grpc = served(lambda gin=gin: grpc.infer("mlp", [gin]))
                p = statistics.median(plain)
                print(f"| {batch} | {cell(plain)} | {cell(over_http)} | {statistics.median(over_http) - p:.0f} "
                      f"| {cpu_http:.0f} | {cell(over_grpc)} | {statistics.median(over_grpc) - p:.0f} | {cpu_grpc:.0f} |")
            # the same round trip to a model that does no work: what the server and client cost alone
            x = np.ones(16, np.float32)
            hin = httpclient.InferInput("INPUT0", [16], "FP32")
            hin.set_data_from_numpy(x, binary_data=True)
            hout = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
            gin = grpcclient.InferInput("INPUT0", [16], "FP32")
            gin.set_data_from_numpy(x)
            floor_http, fcpu_http = served(lambda: http.infer("identity_fp32", [hin], outputs=hout))
            floor_grpc, fcpu_grpc = served(lambda: grpc.infer("identity_fp32", [gin]))
            print(f"| reference: Python identity model, FP32[16] | - | {cell(floor_http)} | - | {fcpu_http:.0f} "
                  f"| {cell(floor_grpc)} | - | {fcpu_grpc:.0f} |")
            http.close()
            grpc.close()
        finally:
            server.stop()


def scaling(seconds: float = 3.0) -> None:
    from trident import config as cfg
    from trident.backends.base import LoadContext
    from trident.backends.onnxruntime_backend import OnnxRuntimeBackend
    from trident.protocol.pbtxt import parse_pbtxt
    from trident.types import InferenceRequest, Tensor

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "mlp"
        write_mlp(folder / "1" / "model.onnx", hidden=1024, layers=3)
        config = cfg.complete_defaults(parse_pbtxt(CONFIG), "mlp", model_dir=folder)
        config = OnnxRuntimeBackend().auto_complete_config(config, folder, folder / "1")
        ctx = LoadContext("mlp", 1, folder, folder / "1", config, cfg.config_to_json(config), "mlp_0", "KIND_CPU", 0)
        instances = [OnnxRuntimeBackend().load_instance(ctx) for _ in range(2)]
        x = np.random.default_rng(0).random((32, FEATURES), dtype=np.float32)

        def rate(n: int) -> float:
            counts = [0] * n
            stop = time.perf_counter() + seconds

            def work(i: int) -> None:
                req = [InferenceRequest("mlp", [Tensor.from_numpy("x", x)])]
                while time.perf_counter() < stop:
                    instances[i].execute(req)
                    counts[i] += 1

            threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return sum(counts) / seconds

        one, two = rate(1), rate(2)
        print(f"\n## Instances scale (MLP 128->1024x3->10, batch 32, 1 intra-op thread each, {os.cpu_count()} cores)\n")
        print(f"one instance: {one:.0f} batches/s; two instances in two threads: {two:.0f} batches/s (x{two / one:.2f})")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def unload_memory() -> None:
    import trio

    from trident.options import ServerOptions
    from trident.server import open_server

    hidden = 7200  # one 7200 x 7200 FP32 layer: ~200 MB of weights
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        onnx_path = write_mlp(repo / "big_onnx" / "1" / "model.onnx", features=hidden, hidden=hidden, layers=1)
        (repo / "big_onnx" / "config.pbtxt").write_text('backend: "onnxruntime" instance_group [{ count: 1 kind: KIND_CPU }]')
        import openvino as ov

        (repo / "big_ov" / "1").mkdir(parents=True)
        ov.save_model(ov.Core().read_model(str(onnx_path)), str(repo / "big_ov" / "1" / "model.xml"), compress_to_fp16=False)
        (repo / "big_ov" / "config.pbtxt").write_text('backend: "openvino" instance_group [{ count: 1 kind: KIND_CPU }]')
        import torch

        (repo / "big_torch" / "1").mkdir(parents=True)
        linear = torch.nn.Linear(hidden, hidden)
        torch.jit.script(linear).save(str(repo / "big_torch" / "1" / "model.pt"))
        del linear
        (repo / "big_torch" / "config.pbtxt").write_text(
            f'backend: "pytorch" max_batch_size: 4 input [{{ name: "INPUT__0" data_type: TYPE_FP32 dims: [{hidden}] }}] '
            f'output [{{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [{hidden}] }}] '
            'instance_group [{ count: 1 kind: KIND_CPU }]')
        weights = hidden * hidden * 4 / 2**20

        async def main() -> None:
            options = ServerOptions(model_repositories=[str(repo)], model_control_mode="explicit")
            async with open_server(options) as server:
                print(f"\n## Unload releases memory (process RSS, MB; weights {weights:.0f} MB)\n")
                print("| backend | before load | loaded | after unload | released |")
                print("|---|---:|---:|---:|---:|")
                for name in ("big_onnx", "big_ov", "big_torch"):
                    for _ in range(2):  # the second round shows the steady state (framework imported)
                        before = rss_mb()
                        await server.load_model(name)
                        loaded = rss_mb()
                        await server.unload_model(name)
                        await trio.sleep(0.2)
                        after = rss_mb()
                    print(f"| {name.removeprefix('big_')} | {before:.0f} | {loaded:.0f} | {after:.0f} | "
                          f"{loaded - after:.0f} of {loaded - before:.0f} |")

        trio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["overhead", "scaling", "memory"])
    args = parser.parse_args()
    if "overhead" not in args.skip:
        overhead(args.iterations)
    if "scaling" not in args.skip:
        scaling()
    if "memory" not in args.skip:
        unload_memory()


if __name__ == "__main__":
    main()
