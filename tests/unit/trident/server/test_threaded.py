"""trident.start_server: the in-process server from asyncio and from plain threads."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import trident
from trident.errors import Code, TritonError
from trident.options import EXAMPLE_REPOSITORY

SLOW = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            deadline = time.monotonic() + float(x[0])
            while time.monotonic() < deadline and not r.is_cancelled():
                time.sleep(0.005)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([1.0 if r.is_cancelled() else 0.0], np.float32))]))
        return out
'''


def _identity(value: float = 1.0) -> trident.InferenceRequest:
    x = np.full(4, value, np.float32)
    return trident.InferenceRequest("identity_fp32", [trident.Tensor.from_numpy("INPUT0", x)])


def _options(*repos: Path) -> trident.ServerOptions:
    return trident.ServerOptions(model_repositories=[str(r) for r in (repos or (EXAMPLE_REPOSITORY,))])


def test_asyncio_programs_use_the_server_without_blocking_their_loop() -> None:
    async def main() -> list[float]:
        async with trident.start_server(_options()) as server:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.001)
                    ticks += 1

            tick_task = asyncio.create_task(ticker())
            responses = await asyncio.gather(*(server.ainfer(_identity(i)) for i in range(20)))
            tick_task.cancel()
            assert ticks > 0  # the asyncio loop kept running meanwhile
            with pytest.raises(TritonError) as info:
                await server.ainfer(trident.InferenceRequest("nope", []))
            assert info.value.code is Code.NOT_FOUND
            assert await server.acall(lambda s: s.is_ready()) is True
            return [float(r.output("OUTPUT0").data[0]) for r in responses]

    assert asyncio.run(main()) == [float(i) for i in range(20)]


def test_threads_use_the_server_with_blocking_calls() -> None:
    with trident.start_server(_options()) as server:
        results: dict[int, float] = {}

        def worker(i: int) -> None:
            results[i] = float(server.infer(_identity(i)).output("OUTPUT0").data[0])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == {i: float(i) for i in range(8)}
        assert server.call(lambda s: s.model_metadata("identity_fp32")).name == "identity_fp32"
    with pytest.raises(RuntimeError):
        server.infer(_identity())  # closed
    assert not any(t.name == "trident-server" for t in threading.enumerate())  # joined


def test_cancelling_the_asyncio_task_cancels_the_request(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text('''
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
''')
    (repo / "slow" / "1" / "model.py").write_text(SLOW)

    async def main() -> float:
        async with trident.start_server(_options(repo)) as server:
            request = trident.InferenceRequest("slow", [trident.Tensor.from_numpy("X", np.array([30.0], np.float32))])
            task = asyncio.create_task(server.ainfer(request))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the server saw the cancellation: its in-flight count drains long before the 30 s
            while await server.acall(lambda s: s._inflight.count) and time.monotonic() - started < 10:
                await asyncio.sleep(0.05)
            return time.monotonic() - started

    assert asyncio.run(main()) < 10


def test_start_up_errors_reach_the_starter(tmp_path: Path) -> None:
    options = _options()
    options.trace_config = ["no-such-setting"]
    server = trident.start_server(options)
    with pytest.raises(ValueError, match="--trace-config expects"):
        server.start()
    server.close()
    assert not any(t.name == "trident-server" for t in threading.enumerate())
