"""Replay the HTTP/1.1 parser fuzz corpus and deterministic mutations of it.

Every input must parse or fail with ProtocolError, and every parsed request must frame a
response or fail with ResponseError (fuzz_http1.one_input raises otherwise).
"""

from __future__ import annotations

import random
from pathlib import Path

import fuzz_http1
import pytest

HERE = Path(__file__).parent
one_input = fuzz_http1.one_input

CORPUS = HERE / "corpus" / "http1"
SEEDS = sorted(CORPUS.iterdir())
NOISE = [b"\r\n", b"\n", b"\r", b" ", b"\t", b":", b";", b",", b"0", b"ff", b"-1", b"\x00", b"\xff",
         b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n", b"Connection: close\r\n",
         b"Expect: 100-continue\r\n", b"HTTP/1.0", b"HTTP/2.0", b"0\r\n\r\n", b"1\r\nx\r\n",
         b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", b"99999999999999999999"]  # fmt: skip


def mutations(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(5)
            pos = rng.randrange(1, len(buf) + 1) if len(buf) > 1 else len(buf)
            if op == 0 and len(buf) > 1:  # flip a byte
                buf[pos % len(buf)] = rng.randrange(256)
            elif op == 1:  # insert HTTP-ish noise
                buf[pos:pos] = rng.choice(NOISE)
            elif op == 2 and len(buf) > 2:  # delete a span
                del buf[pos : pos + rng.randint(1, 8)]
            elif op == 3:  # truncate
                del buf[max(1, pos) :]
            else:  # another split pattern
                buf[:1] = bytes([rng.randrange(256)])
        out.append(bytes(buf))
    return out


def test_corpus_is_not_empty() -> None:
    assert len(SEEDS) >= 10


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_replay_seed_and_mutations(path: Path) -> None:
    data = path.read_bytes()
    one_input(data)
    rng = random.Random(path.name)
    for mutated in mutations(data, rng, 300):
        one_input(mutated)


def test_every_split_of_a_pipelined_seed() -> None:
    data = (CORPUS / "pipelined_three").read_bytes()
    for mode in range(256):
        one_input(bytes([mode]) + data[1:])
