"""``trident perf --in-process REPO``: the same sweep against ``trident.open_server`` in this
process, with no sockets, to tell server cost from transport cost.

The server and the load run on one trio loop: ``c`` tasks each keep one request in flight
(concurrency), or a scheduler starts one task per request at the planned times (request rate,
at most ``--max-threads`` or 1024 in flight). The engine's measuring code
(:func:`trident.perf.sweep.sweep`) runs unchanged on a worker thread owned by the trio nursery
(``trio.to_thread.run_sync``), fed through :class:`_InProcessLoad` and :class:`_InProcessControl`,
which stand in for the worker processes and the control client. The CPU reported is this whole
process's: server and load together.
"""

from __future__ import annotations

import queue
import random
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import numpy as np
import trio

from trident.perf.control import Control
from trident.perf.inputs import InputSpec, ModelInfo, build_requests, parse_shapes
from trident.perf.measure import ServerStats, server_stats_from_json
from trident.perf.options import MAX_CONNECTIONS, PerfOptions
from trident.perf.report import settings_text
from trident.perf.wire import PerfError
from trident.perf.wire import Tensor as WireTensor

if TYPE_CHECKING:
    from trident.server import Server

__all__ = ["run_in_process"]

T = TypeVar("T")
_SWITCH_S = 0.0002  # the GIL switch interval while measuring in process
_FLUSH_S = 0.05


class _InProcessControl(Control):
    def __init__(self, server: Server, token: trio.lowlevel.TrioToken) -> None:
        self.server = server
        self.token = token

    def _run(self, fn: Callable[[], T]) -> T:
        from trident.errors import TritonError

        try:
            return trio.from_thread.run_sync(fn, trio_token=self.token)
        except TritonError as e:
            raise PerfError(f"{e.code.value}: {e.message}") from None

    def model_info(self, model: str, version: str) -> ModelInfo:
        meta = self._run(lambda: self.server.model_metadata(model, version))
        config = self._run(lambda: self.server.model_config(model, version))
        max_batch = int(config.max_batch_size)
        policy = config.model_transaction_policy
        decoupled = bool(policy is not None and policy.decoupled)
        inputs = tuple(InputSpec(i.name, i.datatype, tuple(i.shape[1:] if max_batch > 0 else i.shape))
                       for i in meta.inputs)
        return ModelInfo(model, version, inputs, tuple(o.name for o in meta.outputs), max_batch, decoupled)

    def stats(self, model: str, version: str) -> ServerStats:
        entries = self._run(lambda: self.server.model_statistics(model, version))
        from trident.protocol import kserve

        return server_stats_from_json(kserve.statistics_json(entries), version)

    def register_system_shm(self, name: str, key: str, size: int) -> None:
        raise PerfError("--shared-memory does not apply to --in-process (there is no transport)")

    def unregister_system_shm(self, name: str) -> None:
        raise PerfError("--shared-memory does not apply to --in-process (there is no transport)")

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, size: int) -> None:
        raise PerfError("--shared-memory does not apply to --in-process (there is no transport)")

    def unregister_cuda_shm(self, name: str) -> None:
        raise PerfError("--shared-memory does not apply to --in-process (there is no transport)")


class _InProcessLoad:
    """The worker-process interface of the engine (``procs``, ``pipes``, ``seen_ns``,
    ``send_all``, ``poll``, ``grow``) over trio tasks in this process."""

    def __init__(self, server: Server, token: trio.lowlevel.TrioToken, o: PerfOptions, info: ModelInfo,
                 variants: list[list[WireTensor]]) -> None:
        self.server = server
        self.token = token
        self.o = o
        self.info = info
        self.variants = [[_tensor(t) for t in v] for v in variants]
        self.turn = 0
        self.procs = [None]
        self.pipes = [None]
        self.seen_ns = [0]
        self.queue: queue.Queue[tuple[int, tuple]] = queue.Queue()  # type: ignore[type-arg]
        self.records: list[tuple[int, int, int, int, int]] = []
        self.error = ""
        self.delayed = 0
        self.generation = 0
        self.mode = "idle"
        self.inflight = 0
        self.cpu_mark = time.process_time()
        self.nursery: trio.Nursery | None = None

    def grow(self, n: int, timeout_s: float = 0.0) -> None:
        """One 'worker': the trio loop."""

    def send_all(self, messages: list[tuple]) -> None:  # type: ignore[type-arg]
        trio.from_thread.run_sync(self._command, messages[0], trio_token=self.token)

    def poll(self, timeout_s: float) -> list[tuple[int, tuple]]:  # type: ignore[type-arg]
        try:
            first = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return []
        out = [first]
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        for _i, msg in out:
            self.seen_ns[0] = max(self.seen_ns[0], msg[4])
        return out

    def close(self) -> None:
        pass

    # -- on the trio loop

    def _command(self, msg: tuple) -> None:  # type: ignore[type-arg]
        assert self.nursery is not None
        self.generation += 1
        gen = self.generation
        if msg[0] == "pause":
            self.mode = "pausing"
        elif msg[0] == "concurrency":
            self.mode = "running"
            for _ in range(int(msg[1])):
                self.nursery.start_soon(self._closed_loop, gen)
        elif msg[0] == "rate":
            self.mode = "running"
            self.nursery.start_soon(self._open_loop, gen, float(msg[1]), msg[2] == "poisson", int(msg[3]),
                                    int(msg[4]))

    def _request(self) -> Any:
        from trident.types import InferenceRequest

        tensors = self.variants[self.turn]
        self.turn = (self.turn + 1) % len(self.variants)
        params: dict[str, Any] = {}
        return InferenceRequest(self.info.name, list(tensors), model_version=self.info.version, parameters=params)

    async def _one(self) -> None:
        from trident.errors import TritonError

        self.inflight += 1
        start = time.monotonic_ns()
        ok, message = 1, ""
        try:
            if self.info.decoupled:
                async def keep(response: Any) -> None:
                    if response.error is not None:
                        raise response.error

                await self.server.infer_stream(self._request(), keep)
            else:
                await self.server.infer(self._request(), endpoint="trident perf")
        except TritonError as e:
            ok, message = 0, f"{e.code.value}: {e.message}"
        end = time.monotonic_ns()
        self.records.append((start, start, end, end, ok))
        if not ok and not self.error:
            self.error = message
        self.inflight -= 1

    async def _closed_loop(self, gen: int) -> None:
        while self.mode == "running" and gen == self.generation:
            await self._one()
            # a request answered here and now (an idle instance run inline) took no trip
            # through the loop: take one, as a request read from a socket does, or this task
            # would hold the loop and the flushes, and the measuring thread would never hear
            await trio.lowlevel.checkpoint()

    async def _open_loop(self, gen: int, rate: float, poisson: bool, seed: int, max_inflight: int) -> None:
        rng = random.Random(seed)
        limit = trio.CapacityLimiter(max_inflight or MAX_CONNECTIONS)
        next_t = trio.current_time()
        async with trio.open_nursery() as inner:
            while self.mode == "running" and gen == self.generation:
                next_t += rng.expovariate(rate) if poisson else 1.0 / rate
                await trio.sleep_until(next_t)
                if limit.available_tokens == 0:
                    self.delayed += 1
                await limit.acquire()

                async def run() -> None:
                    try:
                        await self._one()
                    finally:
                        limit.release()

                inner.start_soon(run)

    async def serve_flush(self) -> None:
        """Every 50 ms, hand the finished requests to the measuring thread."""
        while True:
            await trio.sleep(_FLUSH_S)
            now = time.monotonic_ns()
            kind = "records"
            if self.mode == "pausing" and not self.inflight:
                kind, self.mode = "paused", "idle"
            elif self.mode == "idle":
                continue
            cpu = time.process_time()
            arr = np.array(self.records, dtype=np.int64).reshape(-1, 5)
            self.records = []
            self.queue.put((0, (kind, arr.tobytes(), cpu - self.cpu_mark, self.delayed, now, self.error)))
            self.cpu_mark, self.delayed, self.error = cpu, 0, ""


def _tensor(t: WireTensor) -> Any:
    from trident.protocol.datatypes import deserialize_bytes, numpy_dtype
    from trident.types import Tensor

    if t.datatype == "BYTES":
        arr = deserialize_bytes(t.data).reshape(t.shape)
    else:
        arr = np.frombuffer(t.data, numpy_dtype(t.datatype)).reshape(t.shape)
    return Tensor.from_numpy(t.name, arr, t.datatype)


def run_in_process(o: PerfOptions, out: TextIO, err: TextIO) -> int:
    """Serve ``o.in_process`` with ``trident.open_server`` and run the sweep against it; returns
    the exit status. Raises :class:`PerfError` as :func:`trident.perf.engine.run_perf`."""
    if o.shared_memory != "none":
        raise PerfError("--shared-memory does not apply to --in-process (there is no transport)")
    if o.streaming:
        raise PerfError("--streaming does not apply to --in-process (decoupled models are measured without it)")
    o.workers = 1
    # the measuring thread shares the GIL with a loop that is never idle under a closed loop:
    # at Python's default switch interval (5 ms) each of its turns waits that long (measured:
    # a 3 s sweep took 6.5-8.5 s)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, _SWITCH_S))
    try:
        return trio.run(_main, o, out, err)
    finally:
        sys.setswitchinterval(switch)


async def _main(o: PerfOptions, out: TextIO, err: TextIO) -> int:
    import trident
    from trident.errors import TritonError

    options = trident.ServerOptions(model_repositories=[o.in_process], exit_on_error=False)
    try:
        async with trident.open_server(options) as server:
            return await _measure(server, o, out, err)
    except PerfError:
        raise
    except TritonError as e:
        raise PerfError(f"{e.code.value}: {e.message}") from None
    except (OSError, ValueError) as e:
        raise PerfError(f"cannot serve {o.in_process}: {e}") from None
    except BaseExceptionGroup as group:
        for leaf in _leaves(group):
            if isinstance(leaf, PerfError):
                raise leaf from None
            if isinstance(leaf, TritonError):
                raise PerfError(f"{leaf.code.value}: {leaf.message}") from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:  # type: ignore[type-arg]
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


async def _measure(server: Server, o: PerfOptions, out: TextIO, err: TextIO) -> int:
    from trident.perf.sweep import Progress, sweep, write_outputs

    token = trio.lowlevel.current_trio_token()
    control = _InProcessControl(server, token)
    info = await trio.to_thread.run_sync(control.model_info, o.model, o.version)
    variants = build_requests(info, o.batch_size, parse_shapes(o.shapes), o.input_data, o.string_length,
                              o.string_data)
    load = _InProcessLoad(server, token, o, info, variants)
    out.write(settings_text(o, info) + "\n")
    box: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        load.nursery = nursery

        async def measure() -> None:
            try:
                box["results"] = await trio.to_thread.run_sync(
                    sweep, o, control, load, info, Progress(err, o.verbose), out)  # type: ignore[arg-type]
            except PerfError as e:
                box["error"] = e
            finally:
                nursery.cancel_scope.cancel()

        nursery.start_soon(load.serve_flush)
        nursery.start_soon(measure)
    if "error" in box:
        raise box["error"]
    write_outputs(o, box["results"], out)
    return 0
