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
