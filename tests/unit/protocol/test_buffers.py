"""trident.protocol.buffers: pieces joined into one bytearray without one long copy."""

from __future__ import annotations

import pytest

from trident.protocol import buffers


@pytest.mark.parametrize("size", [0, 10, buffers.JOIN_WHOLE, buffers.JOIN_WHOLE + 1, 3 * buffers.JOIN_WHOLE + 7])
def test_pieces_join_to_their_bytes_and_are_let_go(size):
    data = bytes(i % 251 for i in range(size))
    step = 65_537
    pieces: list[buffers.Buffer] = [data[i:i + step] for i in range(0, size, step)]
    if len(pieces) > 1:  # views and bytearrays join as bytes do
        pieces[0] = memoryview(pieces[0])
        pieces[-1] = bytearray(pieces[-1])
    out = buffers.join_pieces(pieces, size)
    assert type(out) is bytearray and out == data and pieces == []


def test_pieces_that_do_not_hold_the_size_are_refused():
    with pytest.raises(ValueError):
        buffers.join_pieces([b"x" * (buffers.JOIN_WHOLE + 1)], buffers.JOIN_WHOLE + 2)
    with pytest.raises(ValueError):
        buffers.join_pieces([b"x" * 10], 11)


def test_a_fresh_bytearray_has_its_size_and_takes_writes():
    out = buffers.fresh_bytearray(5 << 20)
    assert type(out) is bytearray and len(out) == 5 << 20
    out[:] = b"\x01" * (5 << 20)
    assert out.count(1) == 5 << 20


def test_pieces_beyond_the_size_are_refused_not_grown_into():
    with pytest.raises(ValueError):
        buffers.join_pieces([b"x" * buffers.JOIN_WHOLE, b"y" * 10], buffers.JOIN_WHOLE + 5)
