"""trident.tritonserver's Tensor: DLPack in and out (numpy, torch on the CPU), BYTES, BF16,
Triton's MemoryBuffer constructor, and what it refuses (device memory, unsupported types)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import trident.tritonserver as tritonserver
from trident.tritonserver import DataType, DLDeviceType, MemoryBuffer, MemoryType, Tensor
from trident.tritonserver._tensor import _from_object, parse_device_or_memory_type


def test_numpy_in_and_out_without_a_copy() -> None:
    owner = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = Tensor.from_dlpack(owner)
    assert tensor.data_type == DataType.FP32 and tensor.shape == [3, 4] and tensor.size == 48
    assert tensor.data_ptr == owner.ctypes.data and tensor.memory_type == MemoryType.CPU
    assert tensor.__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    out = np.from_dlpack(tensor)
    assert out.ctypes.data == owner.ctypes.data and out.tolist() == owner.tolist()
    tensor.shape = [2, 6]  # Triton lets the shape be assigned; the export follows it
    assert np.from_dlpack(tensor).shape == (2, 6)
    with pytest.raises(tritonserver.InvalidArgumentError, match="does not fit"):
        tensor.shape = [5]
        np.from_dlpack(tensor)


def test_the_data_outlives_its_first_owner() -> None:
    owner = np.ones(1 << 20)
    tensor = Tensor.from_dlpack(owner)
    before = sys.getrefcount(owner)
    array = np.from_dlpack(tensor)
    del owner, tensor
    assert array.sum() == 1 << 20
    assert before >= 2


def test_torch_in_and_out() -> None:
    x = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    tensor = Tensor.from_dlpack(x)
    assert tensor.data_type == DataType.INT64 and tensor.data_ptr == x.data_ptr()
    y = torch.from_dlpack(tensor)
    assert torch.equal(x, y) and y.data_ptr() == x.data_ptr()
    flags = torch.tensor([True, False])
    assert Tensor.from_dlpack(flags).data_type == DataType.BOOL
    # a strided tensor is copied to a contiguous one (Triton refuses it)
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    assert np.from_dlpack(Tensor.from_dlpack(t)).tolist() == t.tolist()


def test_bf16_goes_through_torch() -> None:
    x = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    tensor = Tensor.from_dlpack(x)
    assert tensor.data_type == DataType.BF16 and tensor.size == 6
    back = torch.from_dlpack(tensor)
    assert back.dtype == torch.bfloat16 and torch.equal(back, x)
    assert tensor._core("X").datatype == "BF16"


def test_bytes_tensors() -> None:
    tensor = Tensor.from_string_array([["hello", "wörld"]])
    assert tensor.data_type == DataType.BYTES and tensor.shape == [1, 2]
    assert tensor.to_string_array().tolist() == [["hello", "wörld"]]
    assert tensor.to_bytes_array().tolist() == [[b"hello", "wörld".encode()]]
    # the memory buffer holds Triton's length-prefixed elements
    raw = np.frombuffer(bytes(np.ctypeslib.as_array(
        (np.ctypeslib.ctypes.c_uint8 * tensor.size).from_address(tensor.data_ptr))), np.uint8)
    assert raw.tobytes() == b"\x05\x00\x00\x00hello\x06\x00\x00\x00" + "wörld".encode()
    assert Tensor.from_bytes_array(np.array([b"a", b"bc"], dtype=object)).to_bytes_array().tolist() == [b"a", b"bc"]
    assert _from_object(np.array(["x", "yz"])).data_type == DataType.BYTES
    with pytest.raises(tritonserver.InvalidArgumentError, match="DLPack"):
        np.from_dlpack(tensor)
    with pytest.raises(tritonserver.InvalidArgumentError, match="BYTES"):
        Tensor.from_bytes_array(np.ones(3, np.float32))
    with pytest.raises(tritonserver.InvalidArgumentError, match="not"):
        Tensor.from_dlpack(np.ones(2, np.float32)).to_string_array()


def test_triton_constructor_over_a_memory_buffer() -> None:
    owner = np.arange(6, dtype=np.int32)
    tensor = Tensor(DataType.INT32, [2, 3], MemoryBuffer.from_dlpack(owner))
    assert np.from_dlpack(tensor).tolist() == [[0, 1, 2], [3, 4, 5]]
    serialized = np.frombuffer(b"\x02\x00\x00\x00hi\x00\x00\x00\x00", np.uint8)
    buffer = MemoryBuffer(serialized.ctypes.data, MemoryType.CPU, 0, serialized.nbytes, serialized)
    assert Tensor(DataType.BYTES, [2], buffer).to_bytes_array().tolist() == [b"hi", b""]
    with pytest.raises(tritonserver.InvalidArgumentError, match="does not fit"):
        Tensor(DataType.INT32, [4], MemoryBuffer.from_dlpack(owner))
    with pytest.raises(tritonserver.UnsupportedError, match="CPU memory only"):
        Tensor(DataType.INT32, [6], MemoryBuffer(owner.ctypes.data, MemoryType.GPU, 0, 24, owner))


class _OnDevice:
    """A DLPack producer on a CUDA device (what a cupy array or a CUDA torch tensor reports)."""

    def __dlpack__(self, stream: object = None) -> object:
        raise AssertionError("a device tensor must not be read")

    def __dlpack_device__(self) -> tuple[int, int]:
        return 2, 0


def test_device_memory_and_unknown_types_are_refused() -> None:
    with pytest.raises(tritonserver.UnsupportedError, match="kDLCUDA"):
        Tensor.from_dlpack(_OnDevice())
    with pytest.raises(tritonserver.InvalidArgumentError, match="does not support the DLPack"):
        Tensor.from_dlpack(object())
    with pytest.raises(tritonserver.InvalidArgumentError, match="not supported"):
        _from_object({"a": 1})
    with pytest.raises(tritonserver.InvalidArgumentError, match="Unsupported numpy data type"):
        _from_object(np.ones(2, np.complex128))
    tensor = Tensor.from_dlpack(np.ones(2, np.float32))
    assert tensor.to_host() is tensor and tensor.to_device("cpu") is tensor
    with pytest.raises(tritonserver.UnsupportedError, match="not supported"):
        tensor.to_device("gpu:0")
    with pytest.raises(tritonserver.UnsupportedError, match="stream"):
        tensor.__dlpack__(stream=5)


def test_device_names() -> None:
    assert parse_device_or_memory_type("cpu") == (MemoryType.CPU, 0)
    assert parse_device_or_memory_type("GPU:1") == (MemoryType.GPU, 1)
    assert parse_device_or_memory_type((MemoryType.CPU_PINNED, 0)) == (MemoryType.CPU_PINNED, 0)
    assert parse_device_or_memory_type((DLDeviceType.kDLCUDA, 2)) == (MemoryType.GPU, 2)
    for bad in ("tpu", "gpu:x", (1, 2), 3):
        with pytest.raises(tritonserver.InvalidArgumentError, match="Invalid memory type"):
            parse_device_or_memory_type(bad)  # type: ignore[arg-type]


def test_lists_and_scalars_become_tensors() -> None:
    assert _from_object([[True, False]]).data_type == DataType.BOOL
    assert _from_object(np.float16(1.5)).shape == []
    big_endian = np.arange(3, dtype=">i4")
    assert np.from_dlpack(_from_object(big_endian)).tolist() == [0, 1, 2]
    with pytest.raises(tritonserver.InvalidArgumentError):
        _from_object([[1, 2], [3]])  # ragged
