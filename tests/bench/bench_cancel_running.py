"""How soon an instance is free again once every client of its running call has left.

Not collected by pytest. Run: ``python tests/bench/bench_cancel_running.py [--tries 5] [--seconds 5]``

1. Instance-free time: ``trident serve`` with one instance per model (onnxruntime and OpenVINO
   serving the chain model of tests/e2e/long_models.py, sized here to run ``--seconds``; a
   Python model polling ``request.is_cancelled()`` every 5 ms for as long). OpenVINO's runs
   are not stopped (3.): its row shows what every backend did before. A client starts the
   long call, a second request is queued behind it, then the first client leaves (gRPC cancel,
   or an HTTP connection closed); the figure is the time from the leaving to the second
   request's answer (median of ``--tries``). The baseline is the uncancelled call, measured in
   the same run: what the instance was held for before.
2. What it costs when nothing is cancelled: the executor's per-call bookkeeping for an
   interruptible instance (``Interrupter``: one ``on_cancel`` per request, batch of 1 and 8),
   beyond making the requests.
3. Why OpenVINO's runs are not stopped: its CPU plugin's ``InferRequest.cancel()`` ends a
   ``start_async`` inference, but the next inference of the compiled model then sometimes runs
   with the cancelled one's shapes (wrong output, as slow as the cancelled run): counted here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/ for e2e

import tritonclient.grpc as grpcclient  # noqa: E402
from e2e.conftest import start_server  # noqa: E402
from e2e.long_models import long_graph, write_long_model  # noqa: E402
from e2e.models import SLOW_ONE_INSTANCE_CONFIG, SLOW_PY, write_model  # noqa: E402
from e2e.test_cancel_running import grpc_inputs, http_disconnect  # noqa: E402


def slow_inputs(seconds: float) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([seconds], np.float32))
    return [x]


def sized(client: grpcclient.InferenceServerClient, model: str, seconds: float) -> int:
    """The COUNT of a run of about ``seconds`` (from a measured run of a tenth of it)."""
    client.infer(model, grpc_inputs(200))
    count = 2000
    while True:
        t0 = time.monotonic()
        client.infer(model, grpc_inputs(count))
        took = time.monotonic() - t0
        if took >= seconds / 10:
            return int(count * seconds / took)
        count *= 2


def free_after_leaving(server, client: grpcclient.InferenceServerClient, model: str, long_inputs: list,
                       next_inputs: list, how: str, http_body: tuple[str, int] | None) -> float:
    """Seconds from the long call's client leaving to the next queued request's answer."""
    answered = threading.Event()
    stamps: dict[str, float] = {}
    if how == "grpc-cancel":
        context = client.async_infer(model, long_inputs, lambda result, error: None)
    else:
        assert http_body is not None
        closer = threading.Thread(target=http_disconnect, args=(server, http_body[0], http_body[1], 0.5))
        closer.start()
    time.sleep(0.2)  # the long call runs

    def done(result, error) -> None:
        stamps["answer"] = time.monotonic()
        answered.set()

    client.async_infer(model, next_inputs, done)  # queued behind the long call
    if how == "grpc-cancel":
        time.sleep(0.3)
        stamps["leave"] = time.monotonic()
        context.cancel()
    else:
        closer.join()
        stamps["leave"] = time.monotonic()
    if not answered.wait(120):
        raise RuntimeError(f"{model}: the queued request was not answered")
    return stamps["answer"] - stamps["leave"]


def instance_free(tries: int, seconds: float) -> list[tuple[str, str, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        for backend in ("onnxruntime", "openvino"):
            write_long_model(repo, f"long_{backend}", backend)
        write_model(repo, "slow", SLOW_ONE_INSTANCE_CONFIG, SLOW_PY)
        server = start_server(repo=repo)
        try:
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                for backend in ("onnxruntime", "openvino", "python"):
                    if backend == "python":
                        model, long_inputs, next_inputs = "slow", slow_inputs(seconds), slow_inputs(0.0)
                        http_body = None
                    else:
                        model = f"long_{backend}"
                        count = sized(client, model, seconds)
                        long_inputs, next_inputs, http_body = grpc_inputs(count), grpc_inputs(3), (model, count)
                    t0 = time.monotonic()
                    client.infer(model, long_inputs)
                    uncancelled = time.monotonic() - t0
                    for how in ("grpc-cancel", "http-disconnect"):
                        if how == "http-disconnect" and backend != "onnxruntime":
                            continue  # Python: another body, the same is_cancelled(); OpenVINO runs on either way
                        times = [free_after_leaving(server, client, model, long_inputs, next_inputs, how, http_body)
                                 for _ in range(tries)]
                        rows.append((backend, how, uncancelled, statistics.median(times)))
        finally:
            server.stop()
    return rows


def interrupter_cost(rounds: int = 5, calls: int = 20000) -> dict[int, float]:
    """ns per call of Interrupter(...) + finish() for batches of 1 and 8, on a trio thread."""
    import trio

    from trident.backends.base import ModelInstance
    from trident.server.execution import Interrupter
    from trident.types import InferenceRequest

    class Instance(ModelInstance):
        interruptible = True

        def execute(self, requests):  # pragma: no cover - never called
            return []

    results: dict[int, float] = {}

    async def main() -> None:
        instance = Instance()
        for size in (1, 8):
            best = []
            for _ in range(rounds):
                token, thread = trio.lowlevel.current_trio_token(), threading.get_ident()
                t0 = time.perf_counter_ns()
                for _ in range(calls):
                    [InferenceRequest("m", []) for _ in range(size)]
                alone = time.perf_counter_ns() - t0
                t0 = time.perf_counter_ns()
                for _ in range(calls):
                    Interrupter(instance, [InferenceRequest("m", []) for _ in range(size)], token, thread).finish()
                best.append((time.perf_counter_ns() - t0 - alone) / calls)
            results[size] = statistics.median(best)

    trio.run(main)
    return results


def openvino_cancel_check(tries: int, seconds: float) -> tuple[int, int, int]:
    """Why the OpenVINO backend does not stop a running inference: with the CPU plugin, cancel a
    ``start_async`` inference of the chain model ``tries`` times (at different points of a run
    of about ``seconds``) and run a short inference after each on the same compiled model (a new
    infer request). Returns (tries, next answers with a wrong output, next answers slower than
    a tenth of the cancelled run)."""
    import openvino as ov

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        long_graph(path)
        compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": "1", "NUM_STREAMS": "1",
                                                              "INFERENCE_PRECISION_HINT": "f32"})

    def run(count: int, cancel_after: float | None = None) -> tuple[float, np.ndarray | None]:
        request = compiled.create_infer_request()
        if cancel_after is not None:
            threading.Timer(cancel_after, request.cancel).start()
        t0 = time.monotonic()
        try:
            request.start_async({"INPUT0": np.zeros((1, 4), np.float32), "COUNT": np.array([[count]], np.int64)})
            request.wait()
        except RuntimeError:  # "Infer Request was canceled"
            return time.monotonic() - t0, None
        return time.monotonic() - t0, np.asarray(request.results[compiled.outputs[1]])

    run(3)
    t, _ = run(2000)
    count = int(2000 * seconds / t)
    _, reference = run(3)
    wrong = slow = 0
    for i in range(tries):
        run(count, seconds * (0.05 + 0.9 * i / max(tries - 1, 1)))
        took, out = run(3)
        wrong += int(out is None or not np.array_equal(out, reference))
        slow += int(took > seconds / 10)
    return tries, wrong, slow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the call that is cancelled")
    args = parser.parse_args()
    print(f"command: python tests/bench/bench_cancel_running.py --tries {args.tries} --seconds {args.seconds}")
    rows = instance_free(args.tries, args.seconds)
    print("\n| backend | client leaves by | uncancelled call (s) | instance free after leaving, median (ms) |")
    print("|---|---|---|---|")
    for backend, how, uncancelled, free in rows:
        print(f"| {backend} | {how} | {uncancelled:.2f} | {free * 1000:.1f} |")
    cost = interrupter_cost()
    print("\n| per-call bookkeeping of an interruptible instance (nothing cancelled) | ns |")
    print("|---|---|")
    for size, ns in cost.items():
        print(f"| Interrupter + finish, batch of {size} | {ns:.0f} |")
    tries, wrong, slow = openvino_cancel_check(8, 2.0)
    print("\n| OpenVINO CPU plugin: InferRequest.cancel() during a 2 s run, then a short inference | count |")
    print("|---|---|")
    print(f"| cancels | {tries} |")
    print(f"| next answer wrong (the cancelled run's shapes) | {wrong} |")
    print(f"| next answer slower than 0.2 s | {slow} |")


if __name__ == "__main__":
    main()
