"""A shared-memory arena one worker writes tensors into and another reads them from.

The arena is an anonymous memory file (``memfd_create``) mapped by its owner; the owner passes
its descriptor to the peer once (over their Unix socket), which maps it too. Only the owner
allocates and frees (:class:`Allocator`: first fit over a sorted free list, 4 KiB granules,
neighbours coalesced on free); the peer only reads and tells the owner which allocations it
is done with. Pages are touched only as they are first written, and stay resident for reuse
(the arena is not shrunk), so a steady stream of large tensors costs no page faults after the
first ones.
"""

from __future__ import annotations

import bisect
import mmap
import os

GRANULE = 4096
DEFAULT_SIZE = 256 * 1024 * 1024  # bytes of address space per direction of a worker pair


class Allocator:
    """Offsets in ``[0, size)``; pure bookkeeping (no memory)."""

    def __init__(self, size: int) -> None:
        self.size = size - size % GRANULE
        self._starts: list[int] = [0]  # free blocks, sorted by start
        self._lengths: dict[int, int] = {0: self.size}
        self._taken: dict[int, int] = {}  # allocation start -> length

    def allocate(self, nbytes: int) -> int | None:
        """The offset of ``nbytes`` free bytes (rounded up to a granule), or None when no free
        block is large enough."""
        need = max(GRANULE, -(-nbytes // GRANULE) * GRANULE)
        for i, start in enumerate(self._starts):
            length = self._lengths[start]
            if length >= need:
                del self._starts[i]
                del self._lengths[start]
                if length > need:
                    rest = start + need
                    bisect.insort(self._starts, rest)
                    self._lengths[rest] = length - need
                self._taken[start] = need
                return start
        return None

    def free(self, offset: int) -> None:
        """Give back the allocation at ``offset``; an offset not allocated is ignored (a peer's
        mistake must not corrupt the free list)."""
        length = self._taken.pop(offset, None)
        if length is None:
            return
        i = bisect.bisect_left(self._starts, offset)
        if i < len(self._starts) and self._starts[i] == offset + length:  # merge with the next
            nxt = self._starts.pop(i)
            length += self._lengths.pop(nxt)
        if i > 0:
            prev = self._starts[i - 1]
            if prev + self._lengths[prev] == offset:  # merge with the previous
                self._lengths[prev] += length
                return
        self._starts.insert(i, offset)
        self._lengths[offset] = length

    @property
    def in_use(self) -> int:
        return sum(self._taken.values())


class Arena:
    """An arena this process owns: ``view`` to write, ``fd`` to hand to the peer."""

    def __init__(self, size: int = DEFAULT_SIZE, name: str = "trident-forward") -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self._map)
        self.allocator = Allocator(size)

    def allocate(self, nbytes: int) -> int | None:
        return self.allocator.allocate(nbytes)

    def free(self, offset: int) -> None:
        self.allocator.free(offset)

    def close(self) -> None:
        self.view.release()
        try:
            self._map.close()
        except BufferError:  # a tensor still views it: the mapping goes with the last view
            pass
        os.close(self.fd)


class PeerArena:
    """The peer's arena, mapped here from the descriptor it sent (writable: a model may write to
    its inputs, which live there)."""

    def __init__(self, fd: int) -> None:
        try:
            size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.view = memoryview(self._map)

    def close(self) -> None:
        self.view.release()
        try:
            self._map.close()
        except BufferError:
            pass
