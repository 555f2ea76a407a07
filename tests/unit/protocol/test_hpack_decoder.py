"""trident.protocol.hpack_decoder against RFC 7541: the Appendix C examples, the ``hpack`` library's
encoder and decoder as an independent reference (same fields, same dynamic table), and every
decoding error. Each test names the section it checks."""

from __future__ import annotations

import hpack
import pytest
from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndex,
    InvalidTableSizeError,
    OversizedHeaderListError,
)
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.huffman_table import decode_huffman as reference_huffman
from hypothesis import given, settings
from hypothesis import strategies as st

from trident.protocol.hpack_decoder import Decoder, decode_huffman

huffman = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH).encode

# RFC 7541 Appendix C.3 (requests without Huffman) and C.4 (the same with Huffman): three blocks
# on one connection, the fields and the dynamic table (newest first) after each
C_FIELDS = [
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")],
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com"),
     (b"cache-control", b"no-cache")],
    [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"), (b":authority", b"www.example.com"),
     (b"custom-key", b"custom-value")],
]
C_TABLES = [
    [(b":authority", b"www.example.com")],
    [(b"cache-control", b"no-cache"), (b":authority", b"www.example.com")],
    [(b"custom-key", b"custom-value"), (b"cache-control", b"no-cache"), (b":authority", b"www.example.com")],
]
C3 = ["828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
      "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"]
C4 = ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf",
      "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"]


@pytest.mark.parametrize("blocks", [C3, C4], ids=["C.3", "C.4"])
def test_rfc7541_appendix_c_request_examples(blocks):
    decoder = Decoder(1 << 16)
    for block, fields, table in zip(blocks, C_FIELDS, C_TABLES, strict=True):
        assert decoder.decode(bytes.fromhex(block)) == fields
        assert list(decoder.table_entries) == table
    assert decoder.header_table_size == 4096


def test_rfc7541_5_2_huffman_round_trips_every_byte():
    data = bytes(range(256)) * 3
    assert decode_huffman(huffman(data)) == data
    assert decode_huffman(b"") == b""


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=12))
def test_rfc7541_5_2_huffman_agrees_with_hpack_on_any_input(data):
    """Valid or not: the same bytes or the same refusal as hpack's (nghttp2-derived) decoder."""
    try:
        expected = reference_huffman(data)
    except HPACKDecodingError:
        with pytest.raises(HPACKDecodingError):
            decode_huffman(data)
    else:
        assert decode_huffman(data) == expected


@pytest.mark.parametrize("data", [
    bytes.fromhex("fffffffc"),  # EOS (30 one bits) inside the string, then padding
    bytes.fromhex("ffff"),  # 16 bits of padding (more than 7)
    bytes.fromhex("1e"),  # 'a' (00011) then padding 110: not all ones
])
def test_rfc7541_5_2_bad_huffman_strings(data):
    with pytest.raises(HPACKDecodingError):
        decode_huffman(data)


def test_rfc7541_5_2_large_huffman_value():
    value = (b"abcdefghijklmnopqrstuvwxyz0123456789-_" * 2000)[:75_000]
    block = hpack.Encoder().encode([(b"x-big", value)], huffman=True)
    assert len(block) < len(value)
    assert Decoder(1 << 20).decode(block) == [(b"x-big", value)]


fields_strategy = st.lists(st.tuples(
    st.sampled_from([b":path", b"content-type", b"te", b"x-a", b"x-b", b"grpc-timeout", b"user-agent"])
    | st.binary(min_size=1, max_size=20),
    st.binary(max_size=300)), max_size=12)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(fields_strategy, st.booleans(), st.sampled_from([None, 0, 100, 256, 4096])),
                min_size=1, max_size=6))
def test_rfc7541_2_3_dynamic_table_in_step_with_hpack(blocks):
    """Blocks from hpack's encoder (indexing, eviction, size updates, Huffman or not): the
    fields and the dynamic table after each block are exactly hpack's decoder's."""
    encoder, reference, decoder = hpack.Encoder(), hpack.Decoder(max_header_list_size=1 << 24), Decoder(1 << 24)
    for fields, use_huffman, table_size in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size
        block = encoder.encode(fields, huffman=use_huffman)
        assert decoder.decode(block) == [tuple(f) for f in reference.decode(block, raw=True)]
        assert list(decoder.table_entries) == list(reference.header_table.dynamic_entries)
        assert decoder.header_table_size == reference.header_table_size


def test_rfc7541_4_4_entry_larger_than_the_table_empties_it():
    decoder = Decoder(1 << 16)
    decoder.decode(b"\x40\x01a\x01b")  # a: b, 34 bytes
    assert decoder.table_entries == ((b"a", b"b"),)
    big = b"v" * 4070  # 1 + 4070 + 32 > 4096
    assert decoder.decode(b"\x40\x01a\x7f" + _int_tail(4070 - 127) + big) == [(b"a", big)]
    assert decoder.table_entries == ()


def test_rfc7541_4_1_header_list_size_limit():
    block = b"\x82\x00\x01a\x4d" + b"v" * 77  # :method GET (7 + 3 + 32), a: v*77 (1 + 77 + 32)
    assert Decoder(152).decode(block) == [(b":method", b"GET"), (b"a", b"v" * 77)]
    with pytest.raises(OversizedHeaderListError):
        Decoder(151).decode(block)


def test_rfc7541_6_2_many_small_literals_decode_in_one_pass():
    """hpack copied the rest of the block per literal (quadratic); the result is the same."""
    block = b"\x82\x86\x84" + b"\x00\x01a\x01b" * 40_000
    fields = Decoder(1 << 21).decode(block)
    assert len(fields) == 40_003 and fields[-1] == (b"a", b"b")
    with pytest.raises(OversizedHeaderListError):
        Decoder(1 << 20).decode(block)  # 40,000 x 34 bytes: past a 1 MiB hard limit


@pytest.mark.parametrize(("block", "error"), [
    (b"\x80", InvalidTableIndex),  # §6.1 index 0
    (b"\xbe", InvalidTableIndex),  # §2.3.3 index 62 with an empty dynamic table
    (b"\x7f\x80\x01\x01v", InvalidTableIndex),  # §6.2.1 name index past the tables
    (b"\x0f\x7f\x01v", InvalidTableIndex),  # §6.2.2 name index 142
    (b"\xff\x80", HPACKDecodingError),  # §5.1 truncated integer
    (b"\xff\xff\xff\xff\xff\xff\x01", HPACKDecodingError),  # §5.1 integer in too many bytes
    (b"\xff\x80\x80\x80\x80\x10", HPACKDecodingError),  # §5.1 integer of 2**32 or more
    (b"\x00\x85abc", HPACKDecodingError),  # §5.2 string shorter than its length
    (b"\x00\x01a", HPACKDecodingError),  # §6.2.2 a name without its value
    (b"\x00\x81\xff\x01v", HPACKDecodingError),  # §5.2 bad Huffman name
    (b"\x3f\xe2\x1f", InvalidTableSizeError),  # §6.3 size update above the allowed 4096
    (b"\x82\x20", HPACKDecodingError),  # §4.2 size update after a field
])
def test_rfc7541_decoding_errors(block, error):
    with pytest.raises(error):
        Decoder(1 << 16).decode(block)


def test_rfc7541_6_3_size_updates_at_the_start_evict():
    decoder = Decoder(1 << 16)
    decoder.decode(b"\x40\x01a\x01b\x40\x01c\x01d")
    assert decoder.table_entries == ((b"c", b"d"), (b"a", b"b"))
    assert decoder.decode(b"\x20\x3f\x03\x82") == [(b":method", b"GET")]  # 0, then 34: room for one entry
    assert decoder.table_entries == ()
    assert decoder.header_table_size == 34
    decoder.decode(b"\x40\x01a\x01b\x40\x01c\x01d")
    assert decoder.table_entries == ((b"c", b"d"),)
    assert decoder.decode(b"\xbe") == [(b"c", b"d")]


def _int_tail(value: int) -> bytes:
    """The continuation bytes of an HPACK integer (§5.1) beyond a full prefix."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def run_steps(decoder: Decoder, block: bytes, step: int) -> tuple[list, int]:
    steps, pauses = decoder.decode_steps(block, step), 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, pauses
        pauses += 1


def test_rfc7541_5_2_a_long_huffman_string_decodes_in_pieces():
    value = (b"abcdefghijklmnopqrstuvwxyz0123456789-_" * 2000)[:75_000]
    block = hpack.Encoder().encode([(b"x-big", value), (b"x-after", b"1")], huffman=True)
    fields, pauses = run_steps(Decoder(1 << 20), block, 4096)
    assert fields == Decoder(1 << 20).decode(block) == [(b"x-big", value), (b"x-after", b"1")]
    assert pauses >= len(block) // 4096 - 1
    assert run_steps(Decoder(1 << 20), block, 0)[1] == 0  # step 0: whole


@settings(max_examples=60, deadline=None)
@given(st.lists(fields_strategy, min_size=1, max_size=4), st.sampled_from([1, 7, 64, 1000]))
def test_rfc7541_2_3_decoding_in_pieces_gives_what_decoding_whole_gives(blocks, step):
    encoder, whole, pieces = hpack.Encoder(), Decoder(1 << 24), Decoder(1 << 24)
    for fields in blocks:
        block = encoder.encode(fields, huffman=True)
        assert run_steps(pieces, block, step)[0] == whole.decode(block)
        assert pieces.table_entries == whole.table_entries


def test_rfc7541_errors_surface_from_the_piece_that_finds_them():
    block = b"\x00\x01a\x01b" * 1000 + b"\xbf\x7f"  # index 190 at the end
    steps = Decoder(1 << 20).decode_steps(block, 100)
    next(steps)  # the first piece is fine
    with pytest.raises(InvalidTableIndex):
        for _ in steps:
            pass
    coded = huffman(b"x" * 2000)[:-1] + b"\x00"  # its last byte: padding of zeros
    steps = Decoder(1 << 20).decode_steps(b"\x00\x01a\xff" + _int_tail(len(coded) - 127) + coded, 64)
    for _ in range(len(coded) // 64):  # every piece but the last is fine
        next(steps)
    with pytest.raises(HPACKDecodingError, match="Huffman"):
        next(steps)
