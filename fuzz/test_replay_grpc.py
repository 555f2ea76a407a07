"""Replay the gRPC fuzz corpus and deterministic mutations of it.

Every input must decode or fail with an accepted error (fuzz_grpc.one_input raises otherwise).
"""

from __future__ import annotations

import random
from pathlib import Path

import fuzz_grpc
import pytest

HERE = Path(__file__).parent
one_input = fuzz_grpc.one_input

CORPUS = HERE / "corpus" / "grpc"
SEEDS = sorted(CORPUS.iterdir())


def mutations(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(5)
            pos = rng.randrange(1, len(buf) + 1)
            if op == 0 and len(buf) > 1:  # flip a byte (never the target selector)
                buf[max(1, pos % len(buf))] = rng.randrange(256)
            elif op == 1:  # insert protobuf-ish noise: tags, long varints, lengths
                buf[pos:pos] = rng.choice([b"\x0a", b"\x2a\x7f", b"\x3a\xff\xff\xff\x0f", b"\x80" * 11,
                                           b"\x08\x01", b"\x12\x00", b"\x00\x00\x00\x00\x05", b"%", b"\xc3"])
            elif op == 2 and len(buf) > 2:  # delete a span
                del buf[pos : pos + rng.randint(1, 8)]
            elif op == 3:  # truncate
                del buf[max(1, pos) :]
            else:  # append trailing bytes
                buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        out.append(bytes(buf))
    return out


def test_corpus_covers_every_target() -> None:
    assert {p.read_bytes()[0] % 4 for p in SEEDS} == {0, 1, 2, 3}


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_replay_seed_and_mutations(path: Path) -> None:
    data = path.read_bytes()
    one_input(data)
    rng = random.Random(path.name)
    for mutated in mutations(data, rng, 400):
        one_input(mutated)
