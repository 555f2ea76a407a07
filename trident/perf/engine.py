"""``trident perf`` over sockets: the model's description and the request bytes, the
load-generator processes (:mod:`trident.perf.worker`), system shared memory, and the sweep
(:mod:`trident.perf.sweep`).

The worker processes are owned by :func:`run_perf`: started there, stopped and joined before it
returns, also on error or Ctrl-C. With ``--workers`` unset it starts with one and the sweep adds
one (up to the CPU count) whenever each is busy at least ``SATURATED`` of a core.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, TextIO

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


def _shm_layout(o: PerfOptions, info: ModelInfo, variants: list[list[Tensor]], tag: str
                ) -> tuple[list[list[Tensor]], list[tuple[int, bytes]], int, dict[str, tuple[str, int, int]], int]:
    """Where ``--shared-memory`` puts the tensors: every input one after another in the region
    ``<tag>_in``, each output in its own ``--output-shared-memory-size`` slot of ``<tag>_out``.
    Returns the variants with shm references, the (offset, bytes) to write into the input
    region, its size, the output references and the output region's size."""
    writes: list[tuple[int, bytes]] = []
    out_variants = []
    offset = 0
    for v in variants:
        refs = []
        for t in v:
            writes.append((offset, t.data))
            refs.append(Tensor(t.name, t.datatype, t.shape, b"", (tag + "_in", offset, len(t.data))))
            offset += len(t.data)
        out_variants.append(refs)
    out_refs = {name: (tag + "_out", i * o.output_shm_size, o.output_shm_size) for i, name in enumerate(info.outputs)}
    return out_variants, writes, offset or 1, out_refs, o.output_shm_size * max(1, len(info.outputs))


class _SystemRegions:
    """POSIX shared-memory objects perf creates, fills, registers and removes."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.made: list[tuple[str, Any]] = []

    def make(self, name: str, size: int, writes: list[tuple[int, bytes]]) -> None:
        from multiprocessing import shared_memory

        region = shared_memory.SharedMemory(name=name, create=True, size=size)
        self.made.append((name, region))
        buf = region.buf
        assert buf is not None
        for offset, data in writes:
            buf[offset:offset + len(data)] = data
        self.control.register_system_shm(name, "/" + name, region.size)

    def cleanup(self) -> None:
        for name, region in self.made:
            with contextlib.suppress(PerfError):
                self.control.unregister_system_shm(name)
            region.close()
            region.unlink()


class _CudaRegions:
    """CUDA memory on device 0 perf allocates, fills, registers and frees. Raises PerfError
    (UNSUPPORTED) on a host without CUDA."""

    def __init__(self, control: Control) -> None:
        from trident.errors import TritonError
        from trident.server.cuda_ipc import open_runtime

        try:
            self.runtime = open_runtime()
        except TritonError as e:
            raise PerfError(f"UNSUPPORTED: --shared-memory=cuda: {e.message}") from None
        self.control = control
        self.made: list[tuple[str, int]] = []

    def make(self, name: str, size: int, writes: list[tuple[int, bytes]]) -> None:
        import numpy as np

        from trident.errors import TritonError

        try:
            pointer, handle = self.runtime.allocate(size, 0)
            self.made.append((name, pointer))
            for offset, data in writes:
                self.runtime.copy(pointer + offset, int(np.frombuffer(data, np.uint8).ctypes.data), len(data), 0)
        except TritonError as e:
            raise PerfError(f"--shared-memory=cuda: {e.message}") from None
        self.control.register_cuda_shm(name, handle, 0, size)

    def cleanup(self) -> None:
        for name, pointer in self.made:
            with contextlib.suppress(PerfError):
                self.control.unregister_cuda_shm(name)
            self.runtime.free(pointer, 0)


def _shared_memory(o: PerfOptions, control: Control, info: ModelInfo, variants: list[list[Tensor]]
                   ) -> tuple[list[list[Tensor]], dict[str, tuple[str, int, int]], Callable[[], None]]:
    """System or CUDA shared memory (``--shared-memory``) for inputs and outputs: regions made,
    filled, registered. Returns the variants with shm references, the output regions, and the
    clean-up call. Raises PerfError for CUDA on a host without it."""
    tag = f"trident_perf_{os.getpid()}"
    out_variants, writes, in_size, out_refs, out_size = _shm_layout(o, info, variants, tag)
    regions = _CudaRegions(control) if o.shared_memory == "cuda" else _SystemRegions(control)
    try:
        regions.make(tag + "_in", in_size, writes)
        regions.make(tag + "_out", out_size, [])
    except BaseException:
        regions.cleanup()
        raise
    return out_variants, out_refs, regions.cleanup


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
        if o.shared_memory != "none":
            variants, output_shm, cleanup = _shared_memory(o, control, info, variants)
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


