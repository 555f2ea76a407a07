"""Request bytes the gRPC transport holds, bounded per connection and per server.

A client controls how many request bytes the server buffers (messages in progress, messages
their handler has not taken yet, inflated output): each connection charges them to its
:class:`ConnectionBudget`, which charges the server's :class:`ServerBudget` too, and a stream
whose DATA would exceed either fails with RESOURCE_EXHAUSTED (the caller's call).
"""

from __future__ import annotations

import trio


class ServerBudget:
    """What the connections of one server share: the request bytes they buffer (``buffered``,
    its high-water mark ``peak``, at most ``limit``) and the worker-thread limiter."""

    def __init__(self, limit: int, threads: int = 2) -> None:
        self.limit = limit
        self.buffered = 0
        self.peak = 0
        self.limiter = trio.CapacityLimiter(max(1, threads))


class ConnectionBudget:
    """One connection's request bytes (``buffered``, at most ``limit``), charged to the server's
    budget as well."""

    __slots__ = ("server", "limit", "buffered")

    def __init__(self, server: ServerBudget, limit: int) -> None:
        self.server = server
        self.limit = limit
        self.buffered = 0

    def room(self) -> int:
        """Request bytes this connection may still buffer (its own budget and the server's)."""
        server = self.server
        return min(self.limit - self.buffered, server.limit - server.buffered)

    def charge(self, size: int) -> None:
        """``size`` more bytes held (negative: given back)."""
        self.buffered += size
        server = self.server
        server.buffered += size
        if server.buffered > server.peak:
            server.peak = server.buffered

    def refusal(self, size: int) -> str:
        """Why ``size`` more bytes do not fit (the RESOURCE_EXHAUSTED message)."""
        server = self.server
        if self.limit - self.buffered < size:
            return (f"request bytes buffered on this connection would exceed the limit "
                    f"({self.buffered + size} vs. {self.limit})")
        return (f"request bytes buffered by the server would exceed the limit "
                f"({server.buffered + size} vs. {server.limit})")
