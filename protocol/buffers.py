"""Large buffers assembled without one long copy, sans-IO.

A message or body that arrived in pieces is copied into one buffer a piece at a time
(:func:`join_pieces`), so a thread doing it lets others run between pieces; one copy of tens of
MiB holds the GIL for tens of milliseconds, page faults included. A growing ``bytearray`` is
avoided for the same reason: each time it outgrows its place ``realloc`` moves it whole (glibc
serves blocks up to the server's 32 MiB mmap threshold from the heap).
"""

from __future__ import annotations

import numpy as np

Buffer = bytes | bytearray | memoryview

JOIN_WHOLE = 1 << 20  # pieces up to this size in all are joined in one call


def join_pieces(pieces: list[Buffer], size: int) -> bytearray | memoryview:
    """``pieces`` (``size`` bytes in all) as one writable buffer; the list is emptied as it is
    copied, so each piece can be freed once copied. Up to ``JOIN_WHOLE`` bytes, a ``bytearray``
    joined in one call; above, a fresh numpy buffer (not zero-filled, its pages touched as they
    are written) filled a piece at a time."""
    if size <= JOIN_WHOLE:
        out = bytearray().join(pieces)
        pieces.clear()
        return out
    buffer = np.empty(size, dtype=np.uint8).data
    pos = 0
    pieces.reverse()
    while pieces:
        piece = pieces.pop()
        end = pos + len(piece)
        buffer[pos:end] = piece
        pos = end
    if pos != size:
        raise ValueError(f"pieces of {pos} bytes, {size} expected")
    return buffer
