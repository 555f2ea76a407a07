"""Large buffers assembled without one long copy, sans-IO.

A message or body that arrived in pieces is copied into one buffer a piece at a time
(:func:`join_pieces`), so a thread doing it lets others run between pieces; one copy of tens of
MiB holds the GIL for tens of milliseconds, page faults included. A growing ``bytearray`` is
avoided for the same reason: each time it outgrows its place ``realloc`` moves it whole (glibc
serves blocks up to the server's 32 MiB mmap threshold from the heap).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Buffer = bytes | bytearray | memoryview

JOIN_WHOLE = 1 << 20  # pieces up to this size in all are joined in one call


def join_pieces(pieces: Sequence[Buffer], size: int) -> bytearray | memoryview:
    """``pieces`` (``size`` bytes in all) as one writable buffer. Up to ``JOIN_WHOLE`` bytes, a
    ``bytearray`` joined in one call; above, a fresh numpy buffer (not zero-filled, its pages
    touched as they are written) filled a piece at a time. A list of pieces is emptied as it
    is copied, so each piece can be freed once copied."""
    if size <= JOIN_WHOLE:
        out = bytearray().join(pieces)
        if isinstance(pieces, list):
            pieces.clear()
        return out
    buffer = np.empty(size, dtype=np.uint8).data
    pos = 0
    if isinstance(pieces, list):
        pieces.reverse()
        while pieces:
            piece = pieces.pop()
            end = pos + len(piece)
            buffer[pos:end] = piece
            pos = end
    else:
        for piece in pieces:
            end = pos + len(piece)
            buffer[pos:end] = piece
            pos = end
    if pos != size:
        raise ValueError(f"pieces of {pos} bytes, {size} expected")
    return buffer
