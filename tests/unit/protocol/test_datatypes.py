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
