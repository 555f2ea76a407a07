"""The HTTP/2 frame guard and gRPC's ping policy (trident.protocol.h2_guard): pure decisions."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from trident.protocol.h2_guard import (
    CONTINUATION,
    DATA,
    FLAG_END_HEADERS,
    HEADER_BLOCK_TOO_LARGE,
    HEADERS,
    PING,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    TOO_MANY_CONTROL_FRAMES,
    TOO_MANY_RESETS,
    WINDOW_UPDATE,
    FrameGuard,
    GuardLimits,
    PingPolicy,
    TokenBucket,
)


def frame(kind: int, flags: int = 0, stream_id: int = 0, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream_id) + payload


SETTINGS_FRAME = frame(SETTINGS)
LIMITS = GuardLimits(reset_burst=10, reset_rate=1.0, control_burst=10, control_rate=1.0,
                     max_header_block=1000, slice_frames=4)


def started(limits: GuardLimits = LIMITS) -> FrameGuard:
    guard = FrameGuard(limits, 0.0)
    assert guard.feed(PREFACE + SETTINGS_FRAME, 0.0) == []
    assert guard.handshake_done
    return guard


def test_token_bucket_refills_over_time_and_by_credit():
    bucket = TokenBucket(3, 2.0, now=0.0)
    assert all(bucket.take(0.0) for _ in range(3))
    assert not bucket.take(0.0)
    assert bucket.take(0.5)  # one token back after 0.5 s at 2/s
    assert not bucket.take(0.5)
    bucket.credit(100)
    assert bucket.tokens == 3  # never beyond the burst


def test_handshake_needs_the_preface_and_the_first_frame_whole():
    guard = FrameGuard(LIMITS, 0.0)
    data = PREFACE + frame(SETTINGS, payload=struct.pack(">HI", 4, 65535))
    for i in range(len(data) - 1):  # byte by byte: never done before the last byte
        guard.feed(data[i : i + 1], 0.0)
        assert not guard.handshake_done
    guard.feed(data[-1:], 0.0)
    assert guard.handshake_done and guard.abuse is None


def test_rapid_reset_is_abuse_once_the_budget_is_spent():
    guard = started()
    one = frame(HEADERS, 0x4, 1, b"\x83") + frame(DATA, 0, 1, b"\x00" * 6) + frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x08")
    for _ in range(10):
        guard.feed(one, 0.0)
        assert guard.abuse is None
    guard.feed(one, 0.0)
    assert guard.abuse == TOO_MANY_RESETS


def test_completed_calls_and_time_refill_the_reset_budget():
    guard = started()
    rst = frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x08")
    for _ in range(100):  # a client whose calls mostly complete never runs dry
        guard.feed(rst, 0.0)
        guard.call_completed()
    assert guard.abuse is None
    for _ in range(10):
        guard.feed(rst, 0.0)
    assert guard.abuse is None
    guard.feed(rst, 5.0)  # 5 s at 1/s refilled five, this reset took one
    assert guard.abuse is None
    assert all(guard.stream_refused(5.0) for _ in range(4))  # refused streams count as resets
    assert guard.abuse is None
    assert not guard.stream_refused(5.0)
    assert guard.abuse == TOO_MANY_RESETS


@pytest.mark.parametrize("flood", [
    frame(SETTINGS),
    frame(SETTINGS, 0x1),
    frame(PING, 0, 0, b"12345678"),
    frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01"),
    frame(PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10"),
    frame(DATA, 0, 1),  # empty DATA without END_STREAM
    frame(DATA, 0x8, 1, b"\x03\x00\x00\x00"),  # padded DATA that carries only padding
    frame(0x42, 0, 0, b"??"),  # unknown frame type
])
def test_control_and_zero_progress_floods_are_abuse(flood):
    guard = started()
    guard.feed(flood * 10, 0.0)
    assert guard.abuse is None
    guard.feed(flood, 0.0)
    assert guard.abuse == TOO_MANY_CONTROL_FRAMES


def test_frames_that_make_progress_cost_nothing():
    guard = started()
    useful = (frame(HEADERS, 0x4, 1, b"\x83") + frame(DATA, 0, 1, b"\x00\x00\x00\x00\x01x")
              + frame(DATA, 0x8, 1, b"\x01yz") + frame(DATA, 0x1, 1))  # END_STREAM may be empty
    for _ in range(1000):
        guard.feed(useful, 0.0)
    assert guard.abuse is None


def test_data_sent_credits_window_updates():
    guard = started()
    update = frame(WINDOW_UPDATE, 0, 0, b"\x00\x01\x00\x00")
    ping = frame(PING, 0, 0, b"\x00" * 8)
    for _ in range(2000):  # past the burst: each server DATA frame pays for the client's answers
        guard.feed(update * 2 + ping, 0.0)
        guard.data_sent(1)
    assert guard.abuse is None
    for _ in range(1000):  # without the server's DATA the same frames are a flood
        guard.feed(update * 2 + ping, 0.0)
    assert guard.abuse == "too_many_control_frames"


def test_header_block_is_bounded_across_continuations():
    guard = started()
    guard.feed(frame(HEADERS, 0, 1, b"h" * 400), 0.0)
    guard.feed(frame(CONTINUATION, 0, 1, b"c" * 400), 0.0)
    assert guard.abuse is None
    # only the frame header of the offending CONTINUATION is needed to decide
    guard.feed(frame(CONTINUATION, FLAG_END_HEADERS, 1, b"c" * 400)[:9], 0.0)
    assert guard.abuse == HEADER_BLOCK_TOO_LARGE


def test_a_complete_block_resets_the_count_and_one_huge_headers_frame_is_abuse():
    guard = started()
    for _ in range(10):
        guard.feed(frame(HEADERS, 0, 1, b"h" * 600) + frame(CONTINUATION, FLAG_END_HEADERS, 1, b"c" * 300), 0.0)
    assert guard.abuse is None
    guard.feed(frame(HEADERS, FLAG_END_HEADERS, 3, b"h" * 1001), 0.0)
    assert guard.abuse == HEADER_BLOCK_TOO_LARGE


def test_empty_continuations_are_zero_progress():
    guard = started()
    guard.feed(frame(HEADERS, 0, 1, b"h"), 0.0)
    guard.feed(frame(CONTINUATION, 0, 1) * 11, 0.0)
    assert guard.abuse == TOO_MANY_CONTROL_FRAMES


def test_cuts_fall_on_frame_boundaries_every_slice_frames():
    guard = started()  # slice_frames=4
    frames = [frame(DATA, 0x8, 1, b"\x00" + b"x" * n) for n in range(1, 11)]  # padded: each checked
    data = b"".join(frames)
    cuts = guard.feed(data, 0.0)
    starts = [sum(map(len, frames[:i])) for i in range(len(frames))]
    assert cuts == [starts[4], starts[8]]


def test_a_run_of_plain_data_frames_counts_half_in_a_slice():
    """A large message in small frames: after its first DATA frame (a whole frame's share of the
    slice), the plain DATA frames that follow count half: 7 frames in a slice of 4 (8 halves)."""
    guard = started()  # slice_frames=4
    frames = [frame(DATA, 0, 1, b"x" * n) for n in range(1, 17)]
    data = b"".join(frames)
    starts = [sum(map(len, frames[:i])) for i in range(len(frames))]
    assert guard.feed(data, 0.0) == [starts[7], starts[14]]
    # a frame of another kind after half a slice of a run: it needs a whole frame's share
    guard = started()
    run = [frame(DATA, 0, 1, b"x")] * 6 + [frame(DATA, 0x8, 1, b"\x00y")] * 2
    data = b"".join(run)
    starts = [sum(map(len, run[:i])) for i in range(len(run))]
    assert guard.feed(data, 0.0) == [starts[6]]  # 2 + 5 halves: no room for 2 more


HEADER_SLICES = GuardLimits(max_header_block=1 << 20, slice_frames=64, slice_header_bytes=16 * 1024)


def starts_of(frames: list[bytes]) -> list[int]:
    return [sum(map(len, frames[:i])) for i in range(len(frames))]


def test_a_large_header_block_ends_its_slice():
    """20 HEADERS frames with a 60 KB block each (a Huffman-coded header flood): one block per
    slice, so the engine decodes one and other tasks run before the next."""
    guard = started(HEADER_SLICES)
    frames = [frame(HEADERS, FLAG_END_HEADERS, 2 * i + 1, b"h" * 60_000) for i in range(20)]
    assert guard.feed(b"".join(frames), 0.0) == starts_of(frames)[1:]
    # small frames before a large block: it starts a slice of its own
    guard = started(HEADER_SLICES)
    frames = [frame(PING, 0, 0, b"p" * 8)] * 3 + [frame(HEADERS, FLAG_END_HEADERS, 1, b"h" * 20_000),
                                                  frame(HEADERS, FLAG_END_HEADERS, 3, b"h" * 100)]
    starts = starts_of(frames)
    assert guard.feed(b"".join(frames), 0.0) == [starts[3], starts[4]]


def test_small_header_blocks_count_as_frames():
    """Blocks under slice_header_bytes (every ordinary request) cost one frame each, as before."""
    guard = started(HEADER_SLICES)
    frames = [frame(HEADERS, FLAG_END_HEADERS | 0x1, 2 * i + 1, b"h" * 300) for i in range(130)]
    starts = starts_of(frames)
    assert guard.feed(b"".join(frames), 0.0) == [starts[64], starts[128]]
    # several mid-sized blocks share a slice up to about slice_header_bytes
    guard = started(HEADER_SLICES)
    frames = [frame(HEADERS, FLAG_END_HEADERS, 2 * i + 1, b"h" * 6000) for i in range(6)]
    assert guard.feed(b"".join(frames), 0.0) == []  # under the size: frames as usual
    guard = started(dataclasses.replace(HEADER_SLICES, slice_header_bytes=8192))
    frames = [frame(HEADERS, FLAG_END_HEADERS, 2 * i + 1, b"h" * 9000) for i in range(4)]
    assert guard.feed(b"".join(frames), 0.0) == starts_of(frames)[1:]


def test_a_large_block_in_continuation_frames_is_counted_where_it_ends():
    """The engine decodes a block when its END_HEADERS frame completes: the whole block's cost
    goes there, and a frame still arriving in the next chunk charges that chunk's slice."""
    guard = started(HEADER_SLICES)
    frames = [frame(HEADERS, 0, 1, b"h" * 16_000), frame(CONTINUATION, 0, 1, b"c" * 16_000),
              frame(CONTINUATION, FLAG_END_HEADERS, 1, b"c" * 16_000), frame(HEADERS, FLAG_END_HEADERS, 3, b"h")]
    starts = starts_of(frames)
    assert guard.feed(b"".join(frames), 0.0) == [starts[2], starts[3]]
    guard = started(HEADER_SLICES)
    data = frame(HEADERS, FLAG_END_HEADERS, 1, b"h" * 60_000) + frame(PING, 0, 0, b"p" * 8)
    assert guard.feed(data[:30_000], 0.0) == []
    assert guard.feed(data[30_000:], 0.0) == [60_009 - 30_000]  # the PING after the block's slice


def test_a_run_of_data_frames_is_counted_frame_by_frame_and_what_follows_is_still_checked():
    run = frame(DATA, 0, 1, b"x" * 100) * 30
    for flood, abuse in ((frame(DATA, 0, 1) * 11, TOO_MANY_CONTROL_FRAMES),  # empty DATA: zero progress
                         (frame(DATA, 0x8, 1, b"\x00") * 11, TOO_MANY_CONTROL_FRAMES),  # padding only
                         (frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x08") * 11, TOO_MANY_RESETS)):
        whole, split = started(dataclasses.replace(LIMITS, slice_frames=1000)), started()
        whole.feed(run + flood, 0.0)
        data = run + flood
        for i in range(0, len(data), 7):
            split.feed(data[i : i + 7], 0.0)
        assert whole.frames == split.frames  # the SETTINGS, 30 DATA frames, the flood up to the abuse
        assert whole.abuse == split.abuse == abuse
    guard = FrameGuard(LIMITS, 0.0, max_frame_size=100)
    guard.feed(PREFACE + SETTINGS_FRAME + run + frame(DATA, 0, 1, b"x" * 101) + frame(SETTINGS) * 50, 0.0)
    assert guard.frames == 1 + 30 + 1 and guard.abuse is None  # stopped at the oversized frame


def test_frame_headers_split_across_chunks():
    guard = started()
    data = (frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x08") * 11)
    for i in range(0, len(data), 5):
        guard.feed(data[i : i + 5], 0.0)
    assert guard.frames == 12  # the SETTINGS and eleven resets
    assert guard.abuse == TOO_MANY_RESETS


def test_a_frame_larger_than_the_maximum_stops_the_scan():
    guard = FrameGuard(LIMITS, 0.0, max_frame_size=100)
    guard.feed(PREFACE + SETTINGS_FRAME + frame(DATA, 0, 1, b"x" * 101) + frame(SETTINGS) * 50, 0.0)
    assert guard.abuse is None  # h2 answers FRAME_SIZE_ERROR itself


def test_ping_policy_strikes_follow_grpc_core():
    policy = PingPolicy(min_interval=10.0, max_strikes=2, permit_without_calls=False)
    # with calls open: pings closer than 10 s are strikes; the third strike is too many
    assert not policy.received_ping(0.0, idle=False)
    assert not policy.received_ping(1.0, idle=False)  # strike 1
    assert not policy.received_ping(2.0, idle=False)  # strike 2
    assert policy.received_ping(3.0, idle=False)  # strike 3 > 2
    # data sent by the server in between starts over
    policy.reset()
    assert not any(policy.received_ping(t, idle=False) for t in (4.0, 5.0, 6.0))
    policy.reset()
    # pings 10 s apart are fine
    assert not any(policy.received_ping(t, idle=False) for t in (10.0, 20.0, 30.0, 40.0))
    # without calls and not permitted: the interval is two hours
    policy.reset()
    assert not any(policy.received_ping(t, idle=True) for t in (0.0, 100.0, 200.0))
    assert policy.received_ping(300.0, idle=True)
    permitted = PingPolicy(min_interval=10.0, max_strikes=2, permit_without_calls=True)
    assert not any(permitted.received_ping(t, idle=True) for t in (0.0, 100.0, 200.0, 300.0))
    unlimited = PingPolicy(min_interval=10.0, max_strikes=0, permit_without_calls=False)
    assert not any(unlimited.received_ping(t / 1000, idle=True) for t in range(1000))
