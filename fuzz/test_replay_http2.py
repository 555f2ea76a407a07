"""Replay the HTTP/2 fuzz corpus and deterministic mutations of it.

Every input must be consumed or end in a ProtocolError, with the HPACK caches changing nothing
(fuzz_http2.one_input raises otherwise).
"""

from __future__ import annotations

import random
from pathlib import Path

import fuzz_http2
import pytest

HERE = Path(__file__).parent
CORPUS = HERE / "corpus" / "http2"
SEEDS = sorted(CORPUS.iterdir())


def mutations(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(5)
            pos = rng.randrange(1, len(buf) + 1)
            if op == 0 and len(buf) > 1:  # flip a byte (the mode byte too)
                buf[pos % len(buf)] = rng.randrange(256)
            elif op == 1:  # insert frame-ish noise: headers of odd frames, HPACK prefixes
                buf[pos:pos] = rng.choice([b"\x00\x00\x00\x09\x04\x00\x00\x00\x01", b"\x00\x00\x08\x06\x00\x00\x00\x00\x00",
                                           b"\x00\x00\x04\x03\x00\x00\x00\x00\x01", b"\x3f\xe1\x1f", b"\xbe", b"\x40",
                                           b"\x00\x00\x00\x00\x01\x00\x00\x00\x03"])
            elif op == 2 and len(buf) > 2:  # delete a span
                del buf[pos : pos + rng.randint(1, 16)]
            elif op == 3:  # truncate
                del buf[max(1, pos) :]
            else:  # append trailing bytes
                buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 12)))
        out.append(bytes(buf))
    return out


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_replay_seed_and_mutations(path: Path) -> None:
    data = path.read_bytes()
    fuzz_http2.one_input(data)
    rng = random.Random(path.name)
    for mutated in mutations(data, rng, 200 if len(data) < 4096 else 40):
        fuzz_http2.one_input(mutated)
