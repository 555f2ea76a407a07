"""``trident perf`` over sockets: the model's description and the request bytes, the
load-generator processes (:mod:`trident.perf.worker`), system shared memory, and the sweep
(:mod:`trident.perf.sweep`).

The worker processes are owned by :func:`run_perf`: started there, stopped and joined before it
returns, also on error or Ctrl-C. With ``--workers`` unset it starts with one and the sweep adds
one (up to the CPU count) whenever each is busy at least ``SATURATED`` of a core.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import TextIO

from trident.perf.control import Control, open_control
from trident.perf.inputs import ModelInfo, build_requests, parse_shapes
from trident.perf.options import PerfOptions
from trident.perf.report import settings_text
from trident.perf.sweep import Progress, sweep, write_outputs
from trident.perf.wire import PerfError, Tensor, grpc_infer_message, http_infer_request
from trident.perf.worker import WorkerSpec, serve_worker

__all__ = ["run_perf"]


class _Workers:
    """The worker processes and their pipes; records arrive through :meth:`poll`."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.pipes: list[Connection] = []
        self.seen_ns: list[int] = []

    def grow(self, n: int, timeout_s: float = 60.0) -> None:
        """Start workers until there are ``n``, each ready (imported, listening) when this returns."""
        while len(self.procs) < n:
            parent, child = self.ctx.Pipe()
            proc = self.ctx.Process(target=serve_worker, args=(child, self.spec), daemon=True,
                                    name=f"trident-perf-worker-{len(self.procs)}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.pipes.append(parent)
            self.seen_ns.append(0)
            if not parent.poll(timeout_s):
                raise PerfError(f"a load-generator process did not start within {timeout_s:g} s")
            parent.recv()

    def send_all(self, messages: list[tuple]) -> None:  # type: ignore[type-arg]
        for pipe, msg in zip(self.pipes, messages, strict=True):
            pipe.send(msg)

    def poll(self, timeout_s: float) -> list[tuple[int, tuple]]:  # type: ignore[type-arg]
        out: list[tuple[int, tuple]] = []  # type: ignore[type-arg]
        for ready in wait(self.pipes, timeout_s):
            assert isinstance(ready, Connection)
            pipe = ready
            i = self.pipes.index(pipe)
            try:
                msg = pipe.recv()
            except EOFError:
                raise PerfError(f"load-generator worker {i} exited unexpectedly") from None
            self.seen_ns[i] = max(self.seen_ns[i], msg[4])
            out.append((i, msg))
        return out

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("stop",))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for pipe in self.pipes:
            pipe.close()


def _cuda_shared_memory(o: PerfOptions, control: Control, info: ModelInfo, variants: list[list[Tensor]]
                        ) -> tuple[list[list[Tensor]], dict[str, tuple[str, int, int]], Callable[[], None]]:
    """CUDA shared memory on device 0 for inputs and outputs (as ``--shared-memory system``):
    allocations made, filled, registered. Raises PerfError when this host has no CUDA."""
    import numpy as np

    from trident.errors import TritonError
    from trident.server.cuda_ipc import open_runtime

    try:
        runtime = open_runtime()
    except TritonError as e:
        raise PerfError(f"UNSUPPORTED: --shared-memory=cuda: {e.message}") from None
    tag = f"trident_perf_{os.getpid()}"
    total = sum(len(t.data) for v in variants for t in v) or 1
    made: list[tuple[str, int]] = []

    def cleanup() -> None:
        for name, pointer in made:
            try:
                control.unregister_cuda_shm(name)
            except PerfError:
                pass
            runtime.free(pointer, 0)

    try:
        pointer, handle = runtime.allocate(total, 0)
        made.append((tag + "_in", pointer))
        offset = 0
        out_variants = []
        for v in variants:
            refs = []
            for t in v:
                host = np.frombuffer(t.data, np.uint8)
                runtime.copy(pointer + offset, int(host.ctypes.data), len(t.data), 0)
                refs.append(Tensor(t.name, t.datatype, t.shape, b"", (tag + "_in", offset, len(t.data))))
                offset += len(t.data)
            out_variants.append(refs)
        control.register_cuda_shm(tag + "_in", handle, 0, total)
        size = o.output_shm_size * max(1, len(info.outputs))
        pointer, handle = runtime.allocate(size, 0)
        made.append((tag + "_out", pointer))
        control.register_cuda_shm(tag + "_out", handle, 0, size)
        out_refs = {name: (tag + "_out", i * o.output_shm_size, o.output_shm_size)
                    for i, name in enumerate(info.outputs)}
    except TritonError as e:
        cleanup()
        raise PerfError(f"--shared-memory=cuda: {e.message}") from None
    except BaseException:
        cleanup()
        raise
    return out_variants, out_refs, cleanup


def _shared_memory(o: PerfOptions, control: Control, info: ModelInfo, variants: list[list[Tensor]]
                   ) -> tuple[list[list[Tensor]], dict[str, tuple[str, int, int]], Callable[[], None]]:
    """System shared memory for inputs and outputs: regions created, filled, registered.
    Returns the variants with shm references, the output regions, and the clean-up call."""
    from multiprocessing import shared_memory

    tag = f"trident_perf_{os.getpid()}"
    total = sum(len(t.data) for v in variants for t in v) or 1
    made: list[tuple[str, shared_memory.SharedMemory]] = []

    def cleanup() -> None:
        for name, region in made:
            try:
                control.unregister_system_shm(name)
            except PerfError:
                pass
            region.close()
            region.unlink()

    try:
        inputs = shared_memory.SharedMemory(name=tag + "_in", create=True, size=total)
        made.append((tag + "_in", inputs))
        offset = 0
        out_variants = []
        for v in variants:
            refs = []
            for t in v:
                buf = inputs.buf
                assert buf is not None
                buf[offset:offset + len(t.data)] = t.data
                refs.append(Tensor(t.name, t.datatype, t.shape, b"", (tag + "_in", offset, len(t.data))))
                offset += len(t.data)
            out_variants.append(refs)
        size = o.output_shm_size * max(1, len(info.outputs))
        outputs = shared_memory.SharedMemory(name=tag + "_out", create=True, size=size)
        made.append((tag + "_out", outputs))
        out_refs = {name: (tag + "_out", i * o.output_shm_size, o.output_shm_size)
                    for i, name in enumerate(info.outputs)}
        for name, region in made:
            control.register_system_shm(name, "/" + name, region.size)
    except BaseException:
        cleanup()
        raise
    return out_variants, out_refs, cleanup


def run_perf(o: PerfOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Measure every load level and write the report; returns the exit status. Raises
    :class:`PerfError` (one line for the user) for a bad model, shape, input data, an unreachable
    server or a failed request; Ctrl-C stops the workers before it propagates."""
    if o.in_process:
        from trident.perf.inprocess import run_in_process

        return run_in_process(o, out, err)
    control = open_control(o.protocol, o.url, min(o.timeout_s, 30.0))
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    workers: _Workers | None = None
    try:
        info = control.model_info(o.model, o.version)
        if info.decoupled and not o.streaming:
            raise PerfError(f"model '{o.model}' is decoupled: measure it with -i grpc --streaming")
        variants = build_requests(info, o.batch_size, parse_shapes(o.shapes), o.input_data, o.string_length,
                                  o.string_data)
        output_shm: dict[str, tuple[str, int, int]] = {}
        if o.shared_memory == "system":
            variants, output_shm, cleanup = _shared_memory(o, control, info, variants)
        elif o.shared_memory == "cuda":
            variants, output_shm, cleanup = _cuda_shared_memory(o, control, info, variants)
        host = o.url.split("://", 1)[-1]
        hostname, _, port = host.rpartition(":")
        params: dict[str, object] = {"triton_enable_empty_final_response": True} if o.streaming else {}
        if o.protocol == "http":
            payloads = tuple(http_infer_request(host, o.model, o.version, v, info.outputs, output_shm) for v in variants)
        else:
            payloads = tuple(grpc_infer_message(o.model, o.version, v, info.outputs, output_shm, params)
                             for v in variants)
        spec = WorkerSpec("stream" if o.streaming else o.protocol, hostname.strip("[]") or "localhost",
                          int(port), payloads)
        out.write(settings_text(o, info) + "\n")
        out.flush()
        workers = _Workers(spec)
        n_workers = o.workers or 1
        workers.grow(n_workers)
        write_outputs(o, sweep(o, control, workers, info, Progress(err, o.verbose), out), out)
        return 0
    finally:
        if workers is not None:
            workers.close()
        cleanup()
        control.close()


