"""Micro benchmark: HPACK header block decoding, ``hpack.Decoder`` (what trident used before) against
:class:`trident.protocol.hpack_decoder.Decoder`, interleaved in one process. Not collected by pytest::

    python tests/bench/bench_hpack_decode.py [--rounds 5]

Cases: typical gRPC request headers as grpcio sends them, Huffman-coded, decoded without trident's
decode cache (a cache hit costs the same either way): a later block of a connection (its fields
indexed by the first), the same with a per-call grpc-timeout literal, and a new connection's
first block plus a later one (decoder made per pair); then a 60 KB Huffman-coded header value
and 16,000 small literal fields (80 KB). Prints the best per-block time of each decoder.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import hpack

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


if __name__ == "__main__":
    main()
