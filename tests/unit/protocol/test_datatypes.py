import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trident.protocol import datatypes as dt


def test_names_and_sizes():
    assert dt.DATATYPES == (
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP16",
        "FP32",
        "FP64",
        "BF16",
        "BYTES",
    )
    assert dt.element_size("FP32") == 4 and dt.element_size("BF16") == 2 and dt.element_size("BYTES") is None
    assert dt.numpy_dtype("BYTES") == np.dtype(object)
    assert dt.config_to_api("TYPE_STRING") == "BYTES" and dt.api_to_config("BYTES") == "TYPE_STRING"
    assert dt.config_to_api("TYPE_BF16") == "BF16" and dt.api_to_config("FP16") == "TYPE_FP16"
    assert dt.is_datatype("INT64") and not dt.is_datatype("FLOAT")


@pytest.mark.parametrize("name", [n for n in dt.DATATYPES if n not in ("BF16", "BYTES")])
def test_datatype_of_round_trip(name):
    assert dt.datatype_of(np.zeros(2, dtype=dt.numpy_dtype(name))) == name


def test_datatype_of_strings_and_big_endian():
    assert dt.datatype_of(np.array(["a"])) == "BYTES"
    assert dt.datatype_of(np.array([b"a"])) == "BYTES"
    assert dt.datatype_of(np.zeros(1, dtype=">f4")) == "FP32"
    with pytest.raises(ValueError):
        dt.datatype_of(np.zeros(1, dtype=np.complex64))


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_bytes_round_trip(items):
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    wire = dt.serialize_bytes(arr)
    assert len(wire) == sum(4 + len(i) for i in items)
    back = dt.deserialize_bytes(wire, len(items))
    assert back.tolist() == items


@given(st.integers(0, 6), st.lists(st.integers(0, 2), min_size=1, max_size=30), st.data())
def test_bytes_of_one_length_read_with_strides_are_what_the_walk_gives(width, seeds, data):
    """Elements that all have one length take the strided path: NUL bytes anywhere (trailing
    ones included) come back exactly, as bytes objects."""
    items = [bytes(data.draw(st.sampled_from([0, 1, 0xFF])) for _ in range(width)) for _ in seeds]
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    wire = dt.serialize_bytes(arr)
    back = dt.deserialize_bytes(wire, len(items))
    assert back.dtype == object and back.tolist() == items
    assert all(type(x) is bytes for x in back)
    assert dt.deserialize_bytes(wire).tolist() == items  # the walk (no count) agrees
    for wrong in (len(items) - 1, len(items) + 1):
        if wrong > 0:
            with pytest.raises(ValueError):
                dt.deserialize_bytes(wire, wrong)


def test_bytes_of_one_length_but_a_different_prefix_inside_are_walked():
    """Two elements of total size 2 x (4 + 3) whose second prefix is not 3: the strided read
    must not take it for two elements of 3 bytes."""
    wire = b"\x03\x00\x00\x00abc" + b"\x02\x00\x00\x00de" + b"\x00\x00\x00\x00" + b"\x00"
    with pytest.raises(ValueError):
        dt.deserialize_bytes(wire, 2)
    wire = b"\x01\x00\x00\x00a" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00bc"  # 3 x (4 + 1) bytes
    assert dt.deserialize_bytes(wire, 3).tolist() == [b"a", b"", b"bc"]
    assert dt.deserialize_bytes(b"\x00\x00\x00\x00" * 5, 5).tolist() == [b""] * 5


@pytest.mark.parametrize("count", [dt.FILL_SLICE - 1, dt.FILL_SLICE, dt.FILL_SLICE + 1, 3 * dt.FILL_SLICE + 7])
def test_large_bytes_are_the_elements_whatever_the_path(count):
    """Past ``FILL_SLICE`` elements the array is filled from chunks as they come (numpy's
    fromiter); the elements are the same as a small array's, for empty, one-length and varied
    elements, and the count must still match."""
    for items in ([b""] * count, [b"%05d" % (i % 99999) for i in range(count)],
                  [b"x" * (i % 3) for i in range(count)]):
        arr = np.empty(count, dtype=object)
        arr[:] = items
        wire = dt.serialize_bytes(arr)
        back = dt.deserialize_bytes(wire, count)
        assert back.dtype == object and back.shape == (count,) and back.tolist() == items
        assert dt.deserialize_bytes(wire).tolist() == items
        with pytest.raises(ValueError):
            dt.deserialize_bytes(wire, count + 1)
    chunks = ([i, i + 1] for i in range(0, 2 * dt.FILL_SLICE, 2))
    assert dt.object_array(chunks, 2 * dt.FILL_SLICE).tolist() == list(range(2 * dt.FILL_SLICE))


def test_bytes_serialized_in_parts_join_to_the_whole():
    """Past FILL_SLICE elements the wire form comes in parts of FILL_SLICE elements (each made by
    C code); joined they are serialize_bytes, with str, bytearray, memoryview and other
    elements converted as one element at a time would be."""
    count = 2 * dt.FILL_SLICE + 5
    items = [b"ab", "hé", 7, bytearray(b"z"), memoryview(b"mv"), b""] * (count // 6) + [b"end"] * (count % 6)
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    parts = dt.serialize_bytes_parts(arr)
    assert len(parts) == 3
    whole = b"".join(parts)
    assert whole == dt.serialize_bytes(arr)
    expected = [bytes(x) if isinstance(x, (bytearray, memoryview)) else x.encode() if isinstance(x, str)
                else str(x).encode() if not isinstance(x, bytes) else x for x in items]
    assert dt.deserialize_bytes(whole, len(items)).tolist() == expected
    assert dt.serialize_bytes_parts(np.empty(0, dtype=object)) == [] and dt.serialize_bytes(np.empty(0, dtype=object)) == b""


def test_bytes_serialize_str_is_utf8():
    arr = np.array(["hé", "x"], dtype=object)
    assert dt.deserialize_bytes(dt.serialize_bytes(arr)).tolist() == ["hé".encode(), b"x"]


@pytest.mark.parametrize(
    "wire,count",
    [
        (b"\x05\x00\x00\x00ab", None),
        (b"\x01\x00", None),
        (b"\x01\x00\x00\x00a", 2),
        (b"\x01\x00\x00\x00a\x00\x00\x00\x00", 1),
    ],
)
def test_bytes_malformed(wire, count):
    with pytest.raises(ValueError):
        dt.deserialize_bytes(wire, count)


@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=50))
def test_bf16_round_trip_is_close(bits):
    f = np.array(bits, dtype=np.int32).view(np.float32)
    f = f[np.isfinite(f) & (np.abs(f) < 3e38)]
    back = dt.bf16_to_float32(dt.float32_to_bf16(f))
    assert np.allclose(back, f, rtol=1 / 128, atol=1e-38)


def test_bf16_exact_values():
    f = np.array([1.0, -2.0, 0.5, 0.0], dtype=np.float32)
    bits = dt.float32_to_bf16(f)
    assert bits.dtype == np.uint16 and bits.tolist() == [0x3F80, 0xC000, 0x3F00, 0]
    assert dt.bf16_to_float32(bits).tolist() == f.tolist()


def _reference_wire(items: list[bytes]) -> bytes:
    return b"".join(len(x).to_bytes(4, "little") + x for x in items)


@pytest.mark.parametrize("kind", ["empty", "fixed", "varied", "one long", "wide memoryviews"])
@pytest.mark.parametrize("count", [1, 511, 512, 4097, dt.FILL_SLICE + 3])
def test_bytes_serialized_by_either_way_match_one_element_at_a_time(kind, count):
    """Small parts are joined element by element, large ones (_NUMPY_PREFIXED and up) with numpy
    lengths and one payload join: both are the reference wire form, whatever the lengths (one
    for all, none, varied); a memoryview of items wider than a byte is its bytes."""
    if kind == "empty":
        items: list[object] = [b""] * count
    elif kind == "fixed":
        items = [b"%06d" % i for i in range(count)]
    elif kind == "varied":
        items = [b"v" * (i % 9) for i in range(count)]
    elif kind == "one long":
        items = [b""] * (count - 1) + [b"L" * 100_000]
    else:
        items = [memoryview(np.arange(i % 3, dtype=np.int32).tobytes()).cast("i") for i in range(count)]
    arr = np.empty(count, dtype=object)
    arr[:] = items
    expected = _reference_wire([bytes(x) for x in items])  # type: ignore[arg-type]
    assert b"".join(dt.serialize_bytes_parts(arr)) == expected


@pytest.mark.parametrize("kind", ["empty", "fixed", "varied"])
def test_wire_bytes_parse_keeps_the_buffer_and_objects_match_a_decode(kind):
    count = 3 * dt.FILL_SLICE // 2
    items = ([b""] * count if kind == "empty" else [b"%07d" % i for i in range(count)] if kind == "fixed"
             else [b"x" * (i % 13) for i in range(count)])
    data = _reference_wire(items)
    wire = dt.WireBytes.parse(data, count)
    assert wire.count == count and wire.buffer.nbytes == len(data) and bytes(wire.buffer) == data
    assert wire.width == (None if kind == "varied" else len(items[0]))
    assert wire.objects().tolist() == items == dt.deserialize_bytes(data, count).tolist()


@pytest.mark.parametrize(
    "data,count,message",
    [
        (b"\x02\x00\x00\x00ab\x01\x00", 1, "length prefix is truncated"),
        (b"\x02\x00\x00\x00ab\x05\x00\x00\x00xy", 2, "element is truncated"),
        (b"\x00\x00\x00\x00" * 3, 2, "more than the 2 elements"),
        (b"\x01\x00\x00\x00a\x00\x00\x00\x00", 3, "holds 2 elements, its shape declares 3"),
        (b"\x00\x00\x00\x00" * 2, 3, "holds 2 elements"),
        (b"", 1, "holds 0 elements"),
    ],
)
def test_wire_bytes_parse_refuses_what_a_decode_refuses(data, count, message):
    with pytest.raises(ValueError, match=message):
        dt.WireBytes.parse(data, count)
    with pytest.raises(ValueError):
        dt.deserialize_bytes(data, count)


def test_shrink_lets_go_of_the_elements_a_slice_at_a_time():
    import sys

    gone = object()
    count = dt.FILL_SLICE * 2 + 3
    private = np.array([gone] * count, dtype=object)
    assert dt.shrink(private) and private.size == 0 and sys.getrefcount(gone) == 2
    owner = np.array([gone] * count, dtype=object)
    assert not dt.shrink(owner.reshape(1, count))  # a view: not its memory to let go of
    small = np.array([gone] * 10, dtype=object)
    assert not dt.shrink(small) and small.size == 10
    assert not dt.shrink(np.zeros(count))  # not objects


def _huge_pages_advised() -> bool:
    """numpy's huge-page advice for its large arrays, as it stands (set and put back)."""
    before = dt._SET_HUGE_PAGES(True)
    dt._SET_HUGE_PAGES(before)
    return bool(before)


def test_object_arrays_are_filled_without_huge_page_advice_and_the_advice_comes_back():
    """A large object array is allocated and filled with numpy's huge-page advice off (its
    elements are written with the GIL held: a 2 MiB page fault each time would hold it for
    milliseconds), and the advice is as it was once the fill ends, also when the fill fails and
    when two fills overlap (the last one to end puts it back)."""
    assert dt._SET_HUGE_PAGES is not None, "numpy's _set_madvise_hugepage is gone: object arrays would fill in huge pages"
    assert _huge_pages_advised()  # numpy's default on Linux
    seen: list[bool] = []

    def chunks(inner: bool):
        for start in range(0, 2 * dt.FILL_SLICE, dt.FILL_SLICE):
            seen.append(_huge_pages_advised())
            if inner and start:  # a second fill inside the first: the advice stays off until the outer one ends
                assert dt.object_array(chunks(False), 2 * dt.FILL_SLICE).size == 2 * dt.FILL_SLICE
                seen.append(_huge_pages_advised())
            yield [start] * dt.FILL_SLICE

    assert dt.object_array(chunks(True), 2 * dt.FILL_SLICE).tolist() == [0] * dt.FILL_SLICE + [dt.FILL_SLICE] * dt.FILL_SLICE
    assert seen and not any(seen)
    assert _huge_pages_advised()

    def failing():
        yield [b""] * dt.FILL_SLICE
        raise ValueError("cut short")

    with pytest.raises(ValueError, match="cut short"):
        dt.object_array(failing(), 2 * dt.FILL_SLICE)
    assert _huge_pages_advised()
    assert dt.object_array([[b""] * 3], 3).tolist() == [b""] * 3  # small arrays: made whole, advice untouched
    assert _huge_pages_advised()
