"""HTTP/2 abuse limits, sans-IO: a frame guard in front of the HTTP/2 engine and gRPC's ping policy.

:class:`FrameGuard` reads the 9-byte frame headers of the client's byte stream before the
HTTP/2 engine (trident's own :mod:`trident.protocol.http2`, or ``h2``) parses it. It never
changes the bytes; it says

* where the data may be cut into slices of at most ``slice_frames`` frames, so that the
  transport can hand each slice to the engine and let other tasks run in between (one
  connection's flood of tiny frames cannot hold the event loop for a whole read); the plain
  DATA frames that follow a DATA frame (a large message in small frames, a few lines each in
  the engine) count half, so a slice holds up to twice as many of them (a 1 MiB message in
  16 KiB frames: one slice); a HEADERS or CONTINUATION frame that ends a header block of
  ``slice_header_bytes`` or more (which the engine decodes as that frame completes) counts
  as many frames as its block is that many bytes of a whole slice, so a slice decodes at
  most about ``slice_header_bytes`` of large blocks (a flood of 60 KB Huffman-coded headers
  on one connection: one block per slice, the other clients served in between);
* when the client abuses the connection, with the reason to put in a GOAWAY
  ENHANCE_YOUR_CALM: too many RST_STREAM frames (rapid reset, CVE-2023-44487), too many
  control or zero-progress frames (SETTINGS, PING, WINDOW_UPDATE, PRIORITY, unknown types,
  empty DATA, empty CONTINUATION), or a header block (HEADERS + CONTINUATION) larger than
  ``max_header_block`` bytes (CONTINUATION flood, CVE-2024-27316). A header block is never
  dropped before the engine sees it -- skipping one would desynchronise the HPACK table -- so
  too large a block ends the connection, deliberately, as soon as its frame header arrives.

The budgets are token buckets: ``burst`` tokens, refilled at ``rate`` per second, and credited
by useful work the transport reports (:meth:`FrameGuard.call_completed`,
:meth:`FrameGuard.data_sent`), so a busy legitimate client never runs dry.

:class:`PingPolicy` is gRPC core's ping abuse policy (``Chttp2PingAbusePolicy``): a client
PING that arrives sooner than the minimum interval after the previous one, with no DATA or
HEADERS sent by the server in between, is a strike (with no call open and pings without calls
not permitted, the interval is two hours); more than ``max_strikes`` strikes (0 = unlimited)
-> GOAWAY ENHANCE_YOUR_CALM ``too_many_pings``.

Nothing here does I/O or reads a clock: callers pass ``now`` (seconds, any monotonic origin).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_SIZE = 9

# frame types (RFC 9113 §6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8

# what a GOAWAY ENHANCE_YOUR_CALM carries as debug data
TOO_MANY_RESETS = "too_many_resets"
TOO_MANY_CONTROL_FRAMES = "too_many_control_frames"
HEADER_BLOCK_TOO_LARGE = "header_block_too_large"
TOO_MANY_PINGS = "too_many_pings"


@dataclass(frozen=True)
class GuardLimits:
    """Per-connection budgets of :class:`FrameGuard` (trident's own; Triton has no flags for these)."""

    reset_burst: int = 1000  # client RST_STREAMs (and refused streams) in a burst
    reset_rate: float = 200.0  # ... refilled per second; +1 per call that completed normally
    control_burst: int = 1000  # SETTINGS, PING, WINDOW_UPDATE, PRIORITY, unknown, empty DATA/CONTINUATION
    control_rate: float = 100.0  # ... refilled per second; +4 per DATA frame the server sends
    max_header_block: int = 256 * 1024  # bytes of one HEADERS + CONTINUATION block, compressed
    slice_frames: int = 64  # frames handed to the HTTP/2 engine between two checkpoints
    #: header block bytes (compressed) decoded per slice: a larger block ends its slice
    slice_header_bytes: int = 16 * 1024


class TokenBucket:
    """``burst`` tokens refilled at ``rate`` per second; :meth:`take` says whether one was left."""

    __slots__ = ("burst", "rate", "tokens", "stamp")

    def __init__(self, burst: float, rate: float, now: float) -> None:
        self.burst = float(burst)
        self.rate = float(rate)
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float, count: float = 1.0) -> bool:
        """Spend ``count`` tokens; False (and the bucket left empty) when there were not enough."""
        tokens = self.tokens
        if tokens < count:
            if now > self.stamp:
                tokens = min(self.burst, tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if tokens < count:
                self.tokens = 0.0
                return False
        self.tokens = tokens - count
        return True

    def credit(self, count: float) -> None:
        """Give back ``count`` tokens (never beyond ``burst``)."""
        tokens = self.tokens + count
        self.tokens = tokens if tokens < self.burst else self.burst


class FrameGuard:
    """Scans one connection's inbound bytes (client side: preface first, then frames).

    :meth:`feed` returns the offsets at which a chunk may be cut; after it, :attr:`abuse` is
    the reason to send GOAWAY ENHANCE_YOUR_CALM (None while the client behaves) and
    :attr:`abuse_offset` where in the chunk the offending frame starts. Once abuse is found
    the guard stops scanning; the connection is expected to close.
    """

    def __init__(self, limits: GuardLimits, now: float, *, max_frame_size: int = 1 << 24) -> None:
        self.limits = limits
        self.max_frame_size = max_frame_size
        self.resets = TokenBucket(limits.reset_burst, limits.reset_rate, now)
        self.control = TokenBucket(limits.control_burst, limits.control_rate, now)
        self.abuse: str | None = None
        self.abuse_offset = 0
        self.frames = 0  # frame headers seen
        self._preface = len(PREFACE)  # preface bytes still to skip
        self._header = bytearray()  # a frame header split across chunks
        self._skip = 0  # payload bytes of the current frame still to pass
        self._want_pad = False  # the current frame is a PADDED DATA frame whose pad length is next
        self._skip_cost = 0  # slice units the current frame costs when its payload completes (a block's decode)
        self._data_length = 0  # payload length of that DATA frame
        self._block = -1  # bytes of the header block in progress (-1: none)
        self._handshake = False  # preface and the first frame (SETTINGS) have passed
        self._stopped = False  # abuse found, or a frame the engine will refuse: scan no further

    @property
    def handshake_done(self) -> bool:
        """The client's preface and its first frame have arrived whole."""
        return self._handshake

    def call_completed(self) -> None:
        """A call ended normally: credit the reset budget."""
        self.resets.credit(1)

    def data_sent(self, frames: int) -> None:
        """The server sent ``frames`` DATA frames: the client may answer each with up to four
        control frames. gRPC clients answer with a WINDOW_UPDATE for the stream and one for the
        connection, and C-core's bandwidth probe adds a PING (policed by :class:`PingPolicy`)
        as data arrives: with many streams on one connection, 2 per frame ran dry under load."""
        self.control.credit(4 * frames)

    def stream_refused(self, now: float) -> bool:
        """The transport refused a stream (over the concurrency limit): charged like a reset.

        Returns False, and sets :attr:`abuse`, when that exhausts the budget."""
        if self.resets.take(now):
            return True
        if self.abuse is None:
            self._fail(TOO_MANY_RESETS, 0)
        return False

    def feed(self, data: bytes | bytearray | memoryview, now: float) -> list[int]:
        """Scan one chunk; returns ascending cut offsets (each a frame boundary inside the chunk,
        every ``slice_frames`` frames, a run's plain DATA frames counting half). Sets
        :attr:`abuse` when a budget is exceeded."""
        if self._stopped:
            return []
        end = len(data)
        pos = 0
        cuts: list[int] = []
        if self._preface:
            pos = min(self._preface, end)
            self._preface -= pos
        units = 2 * self.limits.slice_frames  # per slice: a frame costs 2, a run's plain DATA frame 1
        header_bytes = self.limits.slice_header_bytes  # ... a large header block a share of the slice
        since_cut = 0
        while pos < end:
            if self._skip:
                if self._want_pad:
                    self._want_pad = False
                    if self._data_length - 1 - data[pos] <= 0 and not self._zero_progress(now, pos):
                        return cuts
                take = min(self._skip, end - pos)
                self._skip -= take
                pos += take
                if not self._skip:
                    if not self._handshake:
                        self._handshake = True
                    since_cut += self._skip_cost  # the engine decodes the block as the frame completes
                    self._skip_cost = 0
                continue
            # a frame header, maybe split across chunks
            if self._header or end - pos < FRAME_HEADER_SIZE:
                start = 0 if self._header else pos
                need = FRAME_HEADER_SIZE - len(self._header)
                self._header += data[pos : pos + need]
                pos = min(end, pos + need)
                if len(self._header) < FRAME_HEADER_SIZE:
                    break
                header: bytes | bytearray | memoryview = bytes(self._header)
                self._header.clear()
                hpos = 0
            else:
                header = data
                hpos = start = pos
                pos += FRAME_HEADER_SIZE
            length = (header[hpos] << 16) | (header[hpos + 1] << 8) | header[hpos + 2]
            self.frames += 1
            kind = header[hpos + 3]
            cost = 2
            if kind == HEADERS or kind == CONTINUATION:
                block = length if kind == HEADERS else self._block + length
                if block >= header_bytes and header[hpos + 4] & FLAG_END_HEADERS:  # decoded as it completes
                    cost += block * units // header_bytes
            if since_cut + cost > units and since_cut and start > 0:  # no room left for the frame
                cuts.append(start)
                since_cut = 0
            plain = kind == DATA and length and self._block < 0 and not header[hpos + 4] & FLAG_PADDED
            if not plain and not self._check(kind, header[hpos + 4], length, now, start):
                return cuts
            if length > self.max_frame_size:
                self._stopped = True  # the engine answers FRAME_SIZE_ERROR and reads no further
                return cuts
            if length:
                if length <= end - pos and not self._want_pad:  # the whole payload is here: pass it
                    since_cut += cost
                    pos += length
                    if not self._handshake:
                        self._handshake = True
                    if plain:  # payload bytes, nothing to count: so are the frames like it that follow
                        pos, since_cut = self._plain_data(data, pos, end, since_cut, units)
                else:
                    self._skip = length
                    since_cut += 2
                    self._skip_cost = cost - 2
            else:
                since_cut += cost
                if not self._handshake:
                    self._handshake = True
        return cuts

    def _plain_data(self, data: bytes | bytearray | memoryview, pos: int, end: int, since_cut: int,
                    units: int) -> tuple[int, int]:
        """Pass the non-empty, unpadded DATA frames (within the frame size) that follow whole at
        ``pos`` (a large message in small frames), one unit each, up to ``units`` in the slice;
        returns ``(pos, since_cut)`` after them. Any other frame is left to :meth:`feed`."""
        max_size = self.max_frame_size
        frames = 0
        while end - pos >= FRAME_HEADER_SIZE and since_cut < units:
            length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
            if (data[pos + 3] != DATA or data[pos + 4] & FLAG_PADDED or not length or length > max_size
                    or end - pos - FRAME_HEADER_SIZE < length):
                break
            frames += 1
            since_cut += 1
            pos += FRAME_HEADER_SIZE + length
        self.frames += frames
        return pos, since_cut

    def _check(self, kind: int, flags: int, length: int, now: float, start: int) -> bool:
        """Account one frame; False (with :attr:`abuse` set) when it breaks a budget."""
        if self._block >= 0:  # inside a header block: only CONTINUATION may follow (the engine checks)
            if kind == CONTINUATION:
                self._block += length
                if self._block > self.limits.max_header_block:
                    return self._fail(HEADER_BLOCK_TOO_LARGE, start)
                if flags & FLAG_END_HEADERS:
                    self._block = -1
                if length == 0 and not self._zero_progress(now, start):
                    return False
                return True
            self._block = -1
        if kind == DATA:
            if flags & FLAG_PADDED and length:
                self._want_pad = True
                self._data_length = length
            elif length == 0 and not flags & FLAG_END_STREAM:
                return self._zero_progress(now, start)
            return True
        if kind == HEADERS:
            if length > self.limits.max_header_block:
                return self._fail(HEADER_BLOCK_TOO_LARGE, start)
            if not flags & FLAG_END_HEADERS:
                self._block = length
            return True
        if kind == RST_STREAM:
            if self.resets.take(now):
                return True
            return self._fail(TOO_MANY_RESETS, start)
        if kind == GOAWAY or (kind == SETTINGS and not self._handshake):  # the preface's SETTINGS is free
            return True
        if kind == CONTINUATION:  # outside a block: the engine answers PROTOCOL_ERROR
            return True
        return self._zero_progress(now, start)  # SETTINGS, PING, WINDOW_UPDATE, PRIORITY, PUSH_PROMISE, unknown

    def _zero_progress(self, now: float, start: int) -> bool:
        if self.control.take(now):
            return True
        return self._fail(TOO_MANY_CONTROL_FRAMES, start)

    def _fail(self, reason: str, start: int) -> bool:
        self._stopped = True
        self.abuse = reason
        self.abuse_offset = start
        return False


class PingPolicy:
    """gRPC core's server-side ping abuse policy (see the module docstring).

    ``min_interval`` in seconds; ``max_strikes`` 0 = unlimited."""

    __slots__ = ("min_interval", "max_strikes", "permit_without_calls", "strikes", "_last")

    IDLE_INTERVAL = 2 * 3600.0  # the interval when no call is open and pings without calls are not permitted

    def __init__(self, min_interval: float, max_strikes: int, permit_without_calls: bool) -> None:
        self.min_interval = min_interval
        self.max_strikes = max_strikes
        self.permit_without_calls = permit_without_calls
        self.strikes = 0
        self._last = -math.inf

    def reset(self) -> None:
        """The server sent DATA or HEADERS: strikes start over."""
        self.strikes = 0
        self._last = -math.inf

    def received_ping(self, now: float, idle: bool) -> bool:
        """A client PING (not an ACK) arrived; ``idle``: no call is open.

        Returns True when the client has now exceeded its strikes (answer GOAWAY
        ENHANCE_YOUR_CALM ``too_many_pings``)."""
        interval = self.IDLE_INTERVAL if idle and not self.permit_without_calls else self.min_interval
        allowed = self._last + interval
        self._last = now
        if allowed <= now:
            return False
        self.strikes += 1
        return self.max_strikes != 0 and self.strikes > self.max_strikes
