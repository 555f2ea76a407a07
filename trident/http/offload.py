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
MAPPED_BUFFER = 16 << 20  # body bytes from which the body's buffer is mapped in a decode thread
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


async def body_buffer(length: int) -> memoryview:
    """A writable buffer of ``length`` bytes for a body received straight into place.

    From ``MAPPED_BUFFER`` bytes on its memory is mapped in a decode thread (each page written
    once, by numpy without the GIL): a fresh allocation that large comes from the kernel
    unmapped, and the socket's reads into it would map it on the event loop, a page at a time
    (~1.4 ms a MiB on a VM here, up to 5 ms per 256 KiB read: a stall for every other client).
    Smaller ones are reused heap memory, made here. Cancellation: see :func:`run_sync`.
    """
    if length < MAPPED_BUFFER:
        return np.empty(length, dtype=np.uint8).data
    return (await run_sync(_mapped, length)).data


def _mapped(length: int) -> np.ndarray:
    array = np.empty(length, dtype=np.uint8)
    array[:: mmap.PAGESIZE] = 0
    return array


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
