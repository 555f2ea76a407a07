"""Heavy request decoding off the event loop: worker threads owned by the request's task.

Small bodies are decoded inline (a thread hop costs more than their decode). A body of
``OFFLOAD_THRESHOLD`` bytes or more is decompressed (past its first ``OFFLOAD_THRESHOLD``
output bytes) and decoded with :func:`run_sync` in a worker thread, so other connections keep
being served meanwhile. The request's task awaits the thread: the thread has an owner, a
cancelled request still waits for it to return (nothing is abandoned), and ``DECODE_THREADS``
(one ``trio.CapacityLimiter`` per trio run) bounds how many run at once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

import trio
from trio.lowlevel import RunVar

from trident.protocol import kserve

T = TypeVar("T")

OFFLOAD_THRESHOLD = 1 << 20  # body bytes (decompressed) from which decoding leaves the loop
DECODE_THREADS = 2
SWITCH_INTERVAL = 0.0005  # seconds: the GIL switch interval while a decode thread runs

_running = 0  # decode jobs running (all on the event loop's thread, so no lock)
_saved_interval = 0.005

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
    """``fn(*args)`` in a decode thread; returns or raises what it does.

    While any such job runs, the interpreter's GIL switch interval is ``SWITCH_INTERVAL``
    instead of the default 5 ms: a decode thread running Python code then gives the GIL back
    to the event loop within that, so other clients wait for it about as long, not 5 ms at
    every turn. Waiting for a free thread can be cancelled; once the thread runs, cancellation
    takes effect when it returns (the thread is never abandoned).
    """
    global _running, _saved_interval
    if _running == 0:
        _saved_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL))
    _running += 1
    try:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter())
    finally:
        _running -= 1
        if _running == 0:
            sys.setswitchinterval(_saved_interval)


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
