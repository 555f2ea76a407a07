"""Heavy request decoding off the event loop: worker threads owned by the request's task.

Small bodies are decoded inline (a thread hop costs more than their decode). A body of
``OFFLOAD_THRESHOLD`` bytes or more is decompressed (past its first ``OFFLOAD_THRESHOLD``
output bytes) and decoded with :func:`run_sync` in a worker thread, so other connections keep
being served meanwhile. The request's task awaits the thread: the thread has an owner, a
cancelled request still waits for it to return (nothing is abandoned), and ``DECODE_THREADS``
(one ``trio.CapacityLimiter`` per trio run) bounds how many run at once.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import trio
from trio.lowlevel import RunVar

from trident.protocol import kserve
from trident.server import worker_threads

T = TypeVar("T")

OFFLOAD_THRESHOLD = 1 << 20  # body bytes (decompressed) from which decoding leaves the loop
MAPPED_BUFFER = 16 << 20  # body bytes from which the body's buffer is mapped in a decode thread ...
MAP_AHEAD = 8 << 20  # ... a step ahead of what has arrived: as much as has arrived, from 1 MiB up to this
DECODE_THREADS = 2

_LIMITER: RunVar[trio.CapacityLimiter] = RunVar("trident.http.decode_limiter")


def limiter() -> trio.CapacityLimiter:
    """The limiter of decode threads of the current trio run."""
    try:
        return _LIMITER.get()
    except LookupError:
        value = trio.CapacityLimiter(DECODE_THREADS)
        _LIMITER.set(value)
        return value


async def run_sync(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a decode thread (trident.server.worker_threads.run_sync); returns or raises
    what it does. Waiting for a free thread can be cancelled; once the thread runs,
    cancellation takes effect when it returns (the thread is never abandoned).
    """
    return await worker_threads.run_sync(fn, *args, limiter=limiter())


def body_buffer(length: int) -> memoryview:
    """A writable buffer of ``length`` bytes for a body received straight into place (into what
    :func:`map_ahead` says is mapped)."""
    return np.empty(length, dtype=np.uint8).data


async def map_ahead(buffer: memoryview, start: int) -> int:
    """Map the memory of ``buffer`` from ``start`` (the bytes received so far end there) in a
    decode thread, each page written once (by numpy, without the GIL), for as many bytes as
    have arrived (at least 1 MiB, at most ``MAP_AHEAD``); returns where what is mapped ends.

    A fresh allocation of ``MAPPED_BUFFER`` bytes or more comes from the kernel unmapped, and
    the socket's reads into it would map it on the event loop a page at a time (~1.4 ms a MiB
    on a VM here, up to 5 ms per 256 KiB read: a stall for every other client). Mapped in steps
    that grow with what has arrived, not whole: a client that announces 64 MiB and sends a few
    bytes pins 1 MiB, and one that sent N bytes at most N more (a 60 MB body: ~11 steps).
    A smaller buffer is reused heap memory: all of it counts as mapped, at once. Cancellation:
    see :func:`run_sync`.
    """
    if len(buffer) < MAPPED_BUFFER:
        return len(buffer)
    end = min(len(buffer), start + min(MAP_AHEAD, max(1 << 20, start)))
    await run_sync(_map, buffer, start, end)
    return end


def _map(buffer: memoryview, start: int, end: int) -> None:
    np.frombuffer(buffer, dtype=np.uint8)[start:end:mmap.PAGESIZE] = 0


async def decompress(
    body: bytes | bytearray | memoryview, content_encoding: str, max_size: int
) -> bytes | bytearray | memoryview:
    """:func:`trident.protocol.kserve.decompress`, inline for the first ``OFFLOAD_THRESHOLD``
    output bytes and in a decode thread for the rest.

    Raises TritonError UNSUPPORTED for an unknown coding, INVALID_ARG for corrupt data or an
    output beyond ``max_size``. Cancellation: see :func:`run_sync`.
    """
    inflater = kserve.Inflater(body, content_encoding, max_size)
    if not inflater.run(OFFLOAD_THRESHOLD):
        await run_sync(inflater.run)
    return inflater.result
