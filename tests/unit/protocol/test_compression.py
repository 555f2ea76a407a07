"""Request/response body compression and base64 (trident.protocol.compression)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from trident.errors import Code, TritonError
from trident.protocol import compression


def test_decompress() -> None:
    body = b'{"inputs": []}' * 10
    assert compression.decompress(gzip.compress(body), "gzip") == body
    assert compression.decompress(zlib.compress(body), "deflate") == body
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    assert compression.decompress(raw.compress(body) + raw.flush(), "deflate") == body
    assert compression.decompress(body, None) is body
    assert compression.decompress(body, "identity") is body
    with pytest.raises(TritonError) as info:
        compression.decompress(body, "br")
    assert info.value.code is Code.UNSUPPORTED and "Unsupported compression type" in info.value.message
    with pytest.raises(TritonError) as info:
        compression.decompress(b"not gzip", "gzip")
    assert info.value.code is Code.INVALID_ARG and "failed to decompress" in info.value.message
    with pytest.raises(TritonError) as info:
        compression.decompress(gzip.compress(body)[:-6], "gzip")
    assert info.value.code is Code.INVALID_ARG
    bomb = gzip.compress(b"\x00" * 1_000_000)
    with pytest.raises(TritonError) as info:
        compression.decompress(bomb, "gzip", max_size=1000)
    assert info.value.code is Code.INVALID_ARG and "maximum input size of 1000" in info.value.message
    assert len(compression.decompress(bomb, "gzip", max_size=1_000_000)) == 1_000_000


@pytest.mark.parametrize(("size", "step"), [(size, step) for size in (0, 1, 4096, 1 << 20, (1 << 20) + 1, (5 << 20) + 12345)
                                             for step in (1, 4096, 1 << 20, 16 << 20) if step > 1 or size <= 4096])
def test_inflated_pieces_are_joined_into_one_writable_buffer(size: int, step: int) -> None:
    """The pieces of each step, joined by the step that ends the stream: the same bytes as one
    zlib call, writable (decoded tensors are), whatever the step and the size (over 1 MiB they
    are copied piece by piece into one fresh buffer)."""
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    inflater = compression.BoundedInflater(gzip.compress(body, 1), 16 + zlib.MAX_WBITS, size, pieces=True)
    steps = 0
    while not inflater.step(step):
        steps += 1
        assert inflater.size == min(size, steps * step)
        assert steps <= size + 2
    assert inflater.output == b""  # kept as pieces, not grown
    output = inflater.joined()
    assert inflater.size == len(output) == size and bytes(output) == body
    assert not memoryview(output).readonly
    growing = compression.BoundedInflater(gzip.compress(body, 1), 16 + zlib.MAX_WBITS, size)
    while not growing.step(step):
        pass
    assert growing.output == body and growing.joined() is growing.output


def test_inflating_in_pieces_stops_one_byte_past_the_limit() -> None:
    inflater = compression.BoundedInflater(gzip.compress(b"\x00" * (4 << 20)), 16 + zlib.MAX_WBITS, 3 << 20,
                                           pieces=True)
    with pytest.raises(compression.OutputTooLarge):
        while not inflater.step(1 << 20):
            pass
    assert inflater.size == (3 << 20) + 1 and inflater.output == b""


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate", "gzip"),
        ("deflate, gzip", "deflate"),
        ("gzip;q=0.5, deflate;q=0.8", "deflate"),
        ("gzip;q=0", None),
        ("identity, gzip;q=0.5", None),
        ("br, gzip;q=0.1", "gzip"),
        ("gzip;q=abc, deflate", "deflate"),
        ("*", None),
    ],
)
def test_choose_encoding(accept: str | None, expected: str | None) -> None:
    assert compression.choose_encoding(accept) == expected
