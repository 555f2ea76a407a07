"""Replay the config.pbtxt fuzz corpus and deterministic mutations of it.

Every input must parse into a ModelConfig or fail with PbtxtError (fuzz_pbtxt.one_input
raises otherwise, and also checks the format/parse round trip of what parsed).
"""

from __future__ import annotations

import random
from pathlib import Path

import fuzz_pbtxt
import pytest

from trident.protocol.generated.inference import ModelConfig

HERE = Path(__file__).parent
one_input = fuzz_pbtxt.one_input

CORPUS = HERE / "corpus" / "pbtxt"
SEEDS = sorted(CORPUS.iterdir())
NOISE = [b"{", b"}", b"<", b">", b"[", b"]", b":", b",", b";", b"-", b'"', b"'", b"\\", b"#", b"\n",
         b"0x", b"1e", b".", b"nan", b"inf", b"true", b"name", b"input", b"\\x", b"\\u12", b"\\777",
         b"\xff", b"\x00", b"99999999999999999999999"]  # fmt: skip


def mutations(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(5)
            pos = rng.randrange(len(buf) + 1)
            if op == 0 and buf:  # replace a byte
                buf[pos % len(buf)] = rng.randrange(256)
            elif op == 1:  # insert pbtxt-ish noise
                buf[pos:pos] = rng.choice(NOISE)
            elif op == 2:  # delete a span
                del buf[pos : pos + rng.randint(1, 12)]
            elif op == 3:  # truncate
                del buf[pos:]
            else:  # duplicate a span
                end = min(len(buf), pos + rng.randint(1, 40))
                buf[end:end] = buf[pos:end]
        out.append(bytes(buf))
    return out


def test_corpus_is_not_empty() -> None:
    assert len(SEEDS) >= 5


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_seed_parses(path: Path) -> None:
    config = one_input(path.read_bytes())
    assert isinstance(config, ModelConfig) and config.name


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_mutations_parse_or_fail_cleanly(path: Path) -> None:
    rng = random.Random(path.name)
    outcomes = [one_input(variant) for variant in mutations(path.read_bytes(), rng, 300)]
    assert all(o is None or isinstance(o, ModelConfig) for o in outcomes)
    assert any(o is None for o in outcomes)  # the mutations do reach the error paths
