"""Replay the KServe codec fuzz corpus and deterministic mutations of it.

Every input must decode or fail with TritonError (fuzz_kserve.one_input raises otherwise).
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import fuzz_kserve
import pytest

HERE = Path(__file__).parent
NO_HEADER, one_input, seed = fuzz_kserve.NO_HEADER, fuzz_kserve.one_input, fuzz_kserve.seed

CORPUS = HERE / "corpus" / "kserve"
SEEDS = sorted(CORPUS.iterdir())


def mutations(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(6)
            pos = rng.randrange(len(buf) + 1)
            if op == 0 and buf:  # flip a byte
                buf[pos % len(buf)] = rng.randrange(256)
            elif op == 1:  # insert JSON-ish noise
                buf[pos:pos] = rng.choice(
                    [b"[", b"]", b"{", b"}", b",", b'"', b"-1", b"1e309", b"null", b"\xff"]
                )
            elif op == 2 and len(buf) > 4:  # delete a span
                del buf[pos : pos + rng.randint(1, 8)]
            elif op == 3:  # truncate
                del buf[max(4, pos) :]
            elif op == 4 and len(buf) >= 4:  # new header length
                field = rng.choice([NO_HEADER, 0, rng.randrange(len(buf) + 8), 2**31 - 1])
                buf[:4] = struct.pack("<I", field)
            else:  # append trailing bytes
                buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        out.append(bytes(buf))
    return out


def test_corpus_is_not_empty() -> None:
    assert len(SEEDS) >= 5


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_replay_seed_and_mutations(path: Path) -> None:
    data = path.read_bytes()
    one_input(data)
    rng = random.Random(path.name)
    for mutated in mutations(data, rng, 300):
        one_input(mutated)


def test_seed_helper_round_trips_the_header_field() -> None:
    assert struct.unpack_from("<I", seed(b"{}", None))[0] == NO_HEADER
    assert seed(b"xy", 2)[4:] == b"xy"
