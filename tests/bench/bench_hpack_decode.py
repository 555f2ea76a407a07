"""Micro benchmark: HPACK header block decoding, ``hpack.Decoder`` (what trident used before) against
:class:`trident.protocol.hpack_decoder.Decoder`, interleaved in one process. Not collected by pytest::

    python tests/bench/bench_hpack_decode.py [--rounds 5]

Cases: typical gRPC request headers as grpcio sends them, Huffman-coded, decoded without trident's
decode cache (a cache hit costs the same either way): a later block of a connection (its fields
indexed by the first), the same with a per-call grpc-timeout literal, and a new connection's
first block plus a later one (decoder made per pair); then a 60 KB Huffman-coded header value
and 16,000 small literal fields (80 KB). Prints the best per-block time of each decoder.

Then the longest single call into trident's HTTP/2 engine (``receive_data`` or one
``continue_headers`` piece: the event loop's longest turn for that connection) for one large
block, decoded whole (``header_step=0``, as before) and in the default pieces.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import hpack

from trident.protocol import http2
from trident.protocol.hpack_decoder import Decoder

GRPC_HEADERS = [
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"localhost:8001"), (b"te", b"trailers"), (b"content-type", b"application/grpc"),
    (b"user-agent", b"grpc-python/1.66.1 grpc-c/43.0.0 (linux; chttp2)"),
    (b"grpc-accept-encoding", b"identity, deflate, gzip"), (b"grpc-timeout", b"59999m"),
]


def best(fn: Callable[[], object], number: int, rounds: int) -> float:
    """Best mean seconds per call over ``rounds`` runs of ``number`` calls."""
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        out.append((time.perf_counter() - t) / number)
    return min(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    encoder = hpack.Encoder()
    first = encoder.encode(GRPC_HEADERS, huffman=True)
    later = encoder.encode(GRPC_HEADERS, huffman=True)
    big = hpack.Encoder().encode([(b"x-big", (b"abcdefghijklmnopqrstuvwxyz0123456789" * 3000)[:75_000])],
                                 huffman=True)
    literals = b"\x83\x86\x84" + b"\x00\x01a\x01b" * 16_000

    def old(block: bytes, size: int = 1 << 20) -> Callable[[], object]:
        return lambda: hpack.Decoder(max_header_list_size=size).decode(block, raw=True)

    def new(block: bytes, size: int = 1 << 20) -> Callable[[], object]:
        return lambda: Decoder(size).decode(block)

    def old_pair() -> object:
        d = hpack.Decoder(max_header_list_size=1 << 16)
        return d.decode(first, raw=True), d.decode(later, raw=True)

    def new_pair() -> object:
        d = Decoder(1 << 16)
        return d.decode(first), d.decode(later)

    primed_old, primed_new = hpack.Decoder(max_header_list_size=1 << 16), Decoder(1 << 16)
    primed_old.decode(first, raw=True)
    primed_new.decode(first)
    # a later block with a per-call value (a literal never indexed: the table stays as it is)
    varying = later + encoder.encode([hpack.NeverIndexedHeaderTuple(b"grpc-timeout", b"59998m")], huffman=True)

    cases = [
        (f"gRPC request headers, a later block ({len(later)} B, primed table)",
         lambda: primed_old.decode(later, raw=True), lambda: primed_new.decode(later), 20000),
        (f"gRPC request headers, a later block + grpc-timeout literal ({len(varying)} B, primed table)",
         lambda: primed_old.decode(varying, raw=True), lambda: primed_new.decode(varying), 20000),
        (f"gRPC request headers, first block + a later one ({len(first)} + {len(later)} B)", old_pair, new_pair, 2000),
        (f"60 KB Huffman-coded value ({len(big)} B)", old(big), new(big), 3),
        (f"16,000 small literals ({len(literals)} B)", old(literals), new(literals), 1),
    ]
    print(f"{'case':80} {'hpack.Decoder':>14} {'hpack_decoder':>14} {'ratio':>6}")
    for name, before, after, number in cases:
        b = a = float("inf")
        for _ in range(2):  # interleaved
            b = min(b, best(before, number, args.rounds))
            a = min(a, best(after, number, args.rounds))
        unit, scale = ("us", 1e6) if b < 1e-3 else ("ms", 1e3)
        print(f"{name:80} {b * scale:11.2f} {unit} {a * scale:11.2f} {unit} {b / a:6.2f}")
    engine_calls()


def longest_call(block: bytes, header_step: int) -> float:
    """Seconds of the longest engine call for one HEADERS frame carrying ``block``."""
    s = http2.H2Server(max_frame_size=1 << 20, header_step=header_step)
    s.initiate_connection()
    s.receive_data(http2.PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    frame = len(block).to_bytes(3, "big") + b"\x01\x05\x00\x00\x00\x01" + block
    t = time.perf_counter()
    longest = 0.0
    try:
        s.receive_data(frame)
        longest = time.perf_counter() - t
        while s.header_work is not None:
            t = time.perf_counter()
            s.continue_headers()
            longest = max(longest, time.perf_counter() - t)
    except http2.ProtocolError:  # the hard limit: the connection ends
        longest = max(longest, time.perf_counter() - t)
    return longest


def engine_calls() -> None:
    request = hpack.Encoder().encode(GRPC_HEADERS[:6], huffman=True)
    big = request + hpack.Encoder().encode(
        [hpack.NeverIndexedHeaderTuple(b"x-big", (b"abcdefghijklmnopqrstuvwxyz0123456789" * 3000)[:75_000])],
        huffman=True)
    literals = request + b"\x00\x01a\x01b" * 50_000  # 250 KB: past the 1 MiB hard limit after ~30,800 fields
    step = http2.H2Server().header_step
    print(f"\n{'longest engine call for one block':80} {'whole':>14} {f'{step} B pieces':>14}")
    for name, block in ((f"60 KB Huffman-coded value ({len(big)} B)", big),
                        (f"50,000 small literals ({len(literals)} B, ends the connection)", literals)):
        whole = min(longest_call(block, 0) for _ in range(3))
        pieces = min(longest_call(block, step) for _ in range(3))
        print(f"{name:80} {whole * 1e3:11.2f} ms {pieces * 1e3:11.2f} ms")


if __name__ == "__main__":
    main()
