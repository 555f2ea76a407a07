"""gRPC framing, grpc-timeout, grpc-message, -bin metadata and gzip (trident.protocol.grpc_framing)."""

from __future__ import annotations

import base64
import gzip

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trident.errors import GRPC_INTERNAL, GRPC_RESOURCE_EXHAUSTED, GRPC_UNIMPLEMENTED
from trident.protocol import grpc_framing as f


def stream_of(messages: list[bytes]) -> bytes:
    return b"".join(f.frame([m], len(m)) for m in messages)


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1, max_size=40),
       st.booleans(), st.integers(0, 300))
def test_decoder_reassembles_any_chunking_and_joins_large_payloads_later(messages, cuts, reused, join_whole):
    """Whatever the chunking, the messages come back; a payload over ``join_whole`` bytes that
    spans several calls comes as Pieces, joined later to the same bytes, even when the chunks
    were views of a buffer the reader overwrote after each call."""
    data = stream_of(messages)
    decoder = f.MessageDecoder(1000, join_whole)
    out: list[bytes] = []
    pieces = 0
    pos, i = 0, 0
    buffer = bytearray(64)
    while pos < len(data):
        step = cuts[i % len(cuts)]
        chunk = data[pos : pos + step]
        if reused:  # a reader's buffer, overwritten once the call returns
            buffer[: len(chunk)] = chunk
            chunk = memoryview(buffer)[: len(chunk)]
        for compressed, m in decoder.feed(chunk):
            if isinstance(m, f.Pieces):
                pieces += 1
                m = m.join()
            assert type(m) is bytearray and not compressed
            out.append(bytes(m))
        if reused:
            buffer[:] = b"\xee" * len(buffer)
        pos += step
        i += 1
    assert out == messages
    if not any(len(m) > join_whole for m in messages):
        assert pieces == 0


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1, max_size=40))
def test_decoder_reassembles_any_chunking(messages, cuts):
    data = stream_of(messages)
    decoder = f.MessageDecoder(1000)
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(data):
        step = cuts[i % len(cuts)]
        out += [bytes(m) for compressed, m in decoder.feed(data[pos : pos + step]) if not compressed]
        pos += step
        i += 1
    assert out == messages
    assert not decoder.partial
    decoder.close()


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1, max_size=40),
       st.integers(1, 6))
def test_decoder_takes_lists_of_chunks_as_their_concatenation(messages, cuts, per_list):
    """A list of chunks (the engine's DATA event for a run of frames) decodes as the chunks one
    after the other, whatever the cuts: messages inside one part, across parts, and across lists."""
    data = stream_of(messages)
    chunks, pos, i = [], 0, 0
    while pos < len(data):
        step = cuts[i % len(cuts)]
        chunks.append(memoryview(data)[pos : pos + step])
        pos += step
        i += 1
    decoder = f.MessageDecoder(1000)
    out: list[bytes] = []
    for start in range(0, len(chunks), per_list):
        out += [bytes(m) for compressed, m in decoder.feed(chunks[start : start + per_list]) if not compressed]
    assert out == messages
    assert not decoder.partial


@given(st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=4),
       st.lists(st.integers(1, 700), min_size=1, max_size=20), st.integers(1, 5))
def test_decoder_holds_copies_and_counts_them(messages, cuts, per_list):
    """A payload spread over calls is kept as copies: the input buffers can be reused (here:
    overwritten) after each call, and ``buffered`` is the payload (or prefix) bytes held."""
    data = stream_of(messages)
    decoder = f.MessageDecoder(4000)
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(data):
        chunks = []
        for _ in range(per_list):
            step = cuts[i % len(cuts)]
            i += 1
            if pos < len(data):
                chunks.append(bytearray(data[pos : pos + step]))
                pos += step
        for compressed, m in decoder.feed(chunks):
            assert isinstance(m, bytearray) and not compressed
            out.append(bytes(m))
        for chunk in chunks:  # the reader's buffers are reused for the next read
            chunk[:] = b"\xee" * len(chunk)
        # what the decoder holds: the bytes past the last complete message
        done = sum(len(m) + f.PREFIX_SIZE for m in out)
        held = min(pos, len(data)) - done
        assert decoder.buffered == (held if held < f.PREFIX_SIZE or not decoder.partial else held - f.PREFIX_SIZE)
    assert out == messages
    assert not decoder.partial and decoder.buffered == 0


@given(st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=4),
       st.lists(st.integers(1, 900), min_size=1, max_size=20), st.lists(st.integers(1, 400), min_size=1, max_size=9))
def test_decoder_keeps_large_pieces_of_reads_and_holds_at_most_twice_buffered(messages, reads, frames):
    """Reads are ``bytes``; each call gets views of one read (frame payloads, as the HTTP/2
    engine hands them). The messages come out right, and what the decoder keeps alive (copies,
    and every read it keeps a view of) is at most twice ``buffered`` after every call."""
    data = stream_of(messages)
    decoder = f.MessageDecoder(4000)
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(data):
        read = bytes(data[pos : pos + reads[i % len(reads)]]) + b"\x00" * frames[i % len(frames)]  # and other streams' bytes
        i += 1
        size = min(len(read) - frames[(i - 1) % len(frames)], len(data) - pos)
        view = memoryview(read)
        parts, start = [], 0
        while start < size:
            step = frames[(i + start) % len(frames)]
            parts.append(view[start : min(size, start + step)])
            start += step
        pos += size
        out += [bytes(m) for _, m in decoder.feed(parts)]
        del read, view, parts
        assert decoder.held <= 2 * decoder.buffered + f.PREFIX_SIZE
    assert out == messages
    assert decoder.held == decoder.buffered == 0


def test_decoder_keeps_views_of_a_read_they_mostly_cover_and_copies_small_pieces():
    payload = bytes(range(256)) * 64  # 16 KiB
    data = f.frame([payload], len(payload))
    first = bytes(data[:10_000])
    decoder = f.MessageDecoder()
    assert decoder.feed([memoryview(first)[:5_000], memoryview(first)[5_000:]]) == []
    assert decoder.held == len(first)  # the read itself: no copy of its part
    small = bytes(data[10_000:12_000]) + bytes(20_000)  # a read mostly of other streams' frames
    assert decoder.feed(memoryview(small)[:2_000]) == []
    assert decoder.held == len(first) + 2_000  # a copy of the piece, not the whole read
    assert decoder.buffered == 12_000 - f.PREFIX_SIZE
    (compressed, message), = decoder.feed(bytes(data[12_000:]))
    assert bytes(message) == payload and isinstance(message, bytearray)
    assert decoder.held == decoder.buffered == 0


def test_decoder_returns_writable_private_buffers():
    data = stream_of([b"abc", b""])
    messages = f.MessageDecoder().feed(data)
    assert [(c, bytes(m)) for c, m in messages] == [(False, b"abc"), (False, b"")]
    assert all(isinstance(m, bytearray) for _, m in messages)


def test_decoder_limits_declared_length_before_the_payload():
    decoder = f.MessageDecoder(10)
    with pytest.raises(f.FramingError) as e:
        decoder.feed(b"\x00\x00\x00\x00\x0b")
    assert e.value.status == GRPC_RESOURCE_EXHAUSTED
    assert "(11 vs. 10)" in e.value.message
    assert f.MessageDecoder(10).feed(b"\x00\x00\x00\x00\x0a" + b"x" * 10)[0][1] == b"x" * 10


def test_decoder_rejects_unknown_flag_and_truncation():
    with pytest.raises(f.FramingError) as e:
        f.MessageDecoder().feed(b"\x05\x00\x00\x00\x00")
    assert e.value.status == GRPC_INTERNAL
    for partial in (b"\x00\x00", b"\x00\x00\x00\x00\x04ab"):
        decoder = f.MessageDecoder()
        assert decoder.feed(partial) == []
        assert decoder.partial
        with pytest.raises(f.FramingError, match="incomplete"):
            decoder.close()


def test_compressed_flag_is_reported():
    assert f.MessageDecoder().feed(f.frame([b"z"], 1, compressed=True)) == [(True, bytearray(b"z"))]
    assert f.frame_prefix(3, True) == b"\x01\x00\x00\x00\x03"


@pytest.mark.parametrize(
    "value, seconds",
    [("1H", 3600), ("2M", 120), ("3S", 3), ("250m", 0.25), ("7u", 7e-6), ("99999999n", 0.099999999)],
)
def test_parse_timeout(value, seconds):
    assert f.parse_timeout(value) == pytest.approx(seconds)
    assert f.parse_timeout(value.encode()) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "S", "1", "123456789S", "1s", "-1S", "1.5S", "１S"])
def test_parse_timeout_rejects_malformed(value):
    with pytest.raises(ValueError):
        f.parse_timeout(value)


@given(st.floats(0, 1e9))
def test_format_timeout_round_trips_within_a_unit(seconds):
    value = f.format_timeout(seconds)
    assert len(value) <= 9
    parsed = f.parse_timeout(value)
    assert parsed >= seconds * (1 - 1e-9) - 1e-9
    assert parsed <= max(seconds * 1.001, seconds + 1e-6)


@given(st.text())
def test_grpc_message_round_trip(text):
    encoded = f.encode_grpc_message(text)
    assert all(0x20 <= ord(c) < 0x7F for c in encoded)
    assert f.decode_grpc_message(encoded) == text.encode("utf-8", "replace").decode("utf-8", "replace")


def test_grpc_message_examples():
    assert f.encode_grpc_message("plain text") == "plain text"
    assert f.encode_grpc_message("100% ü\n") == "100%25 %C3%BC%0A"
    assert f.decode_grpc_message(b"bad %zz escape %4") == "bad %zz escape %4"


@given(st.binary())
def test_binary_header_round_trip_padded_or_not(value):
    assert f.decode_binary_header(f.encode_binary_header(value)) == value
    assert f.decode_binary_header(base64.b64encode(value)) == value


def test_metadata_decoding():
    headers = [(b":path", b"/x"), (b"content-type", b"application/grpc"), (b"grpc-timeout", b"1S"),
               (b"x-user", b"alice"), (b"x-blob-bin", b"AP8")]
    assert f.decode_metadata(headers) == [("x-user", "alice"), ("x-blob-bin", b"\x00\xff")]
    with pytest.raises(ValueError):
        f.decode_metadata([(b"x-bin", b"***")])


def test_gzip_round_trip_and_limits():
    data = b"tensor" * 1000
    assert f.gzip_decompress(f.gzip_compress(data), len(data)) == data
    assert f.gzip_decompress(gzip.compress(data), len(data)) == data
    with pytest.raises(f.FramingError) as e:
        f.gzip_decompress(gzip.compress(b"\x00" * 10_000_000), 1000)
    assert e.value.status == GRPC_RESOURCE_EXHAUSTED
    for bad in (b"not gzip", gzip.compress(data)[:-5]):
        with pytest.raises(f.FramingError) as e:
            f.gzip_decompress(bad, 10**6)
        assert e.value.status == GRPC_INTERNAL


def test_check_encoding():
    for ok in (None, "identity", "gzip"):
        f.check_encoding(ok)
    with pytest.raises(f.FramingError) as e:
        f.check_encoding("snappy")
    assert e.value.status == GRPC_UNIMPLEMENTED and "snappy" in e.value.message


def test_a_declared_length_allocates_nothing_until_bytes_arrive():
    import tracemalloc

    decoder = f.MessageDecoder(1 << 30)
    tracemalloc.start()
    try:
        for _ in range(8):
            decoder = f.MessageDecoder(1 << 30)
            assert decoder.feed(f.frame_prefix(64 << 20)) == []
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current < 1 << 20  # a 64 MiB declaration held nothing
    assert decoder.partial and decoder.buffered == 0
    assert decoder.feed(b"x" * 1000) == [] and decoder.buffered == 1000
    decoder.discard()
    assert not decoder.partial and decoder.buffered == 0


def test_gzip_inflates_in_bounded_steps():
    data = b"\x00" * (10 << 20)
    inflater = f.GzipInflater(gzip.compress(data), len(data))
    steps = 0
    while not inflater.step(1 << 20):
        steps += 1
        assert inflater.inflated == steps << 20  # never more than one step's output at a time
        assert not inflater.output  # joined once, by the step that ends the message
    assert inflater.output == data and type(inflater.output) is bytearray and steps >= 9
    with pytest.raises(f.FramingError) as e:
        bomb = f.GzipInflater(gzip.compress(data), 1 << 20)
        while not bomb.step(1 << 16):
            pass
    assert e.value.status == GRPC_RESOURCE_EXHAUSTED
    with pytest.raises(f.FramingError, match="truncated"):
        cut = f.GzipInflater(gzip.compress(b"abc" * 1000)[:-10], 1 << 20)
        while not cut.step(1 << 16):
            pass
