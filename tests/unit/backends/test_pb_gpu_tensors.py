"""``pb_utils`` tensors and DLPack: round trips with numpy and torch on the CPU, and GPU tensors
on a host without CUDA.

A "CUDA" tensor here is host memory whose capsule says ``kDLCUDA`` device 0: trident's own code
never reads device memory (only the CUDA library behind ``_cuda`` copies it), so importing,
exporting, lifetimes and every refusal behave as with real device memory. Copies go through
``_cuda``'s library lookup, set per test: a stand-in that copies host memory, or one that is
missing (the errors of a host without CUDA). Real CUDA memory: tests/bench/bench_gpu_backends.py.
"""

from __future__ import annotations

import ctypes
import gc
import json
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from trident.backends.python import _convert, _cuda, _dlpack, pb_utils
from trident.backends.python._execution import force_cpu_only_inputs
from trident.backends.python._pb_tensor import DeviceTensor
from trident.backends.python.isolated import channel
from trident.config import config_from_json
from trident.errors import Code, TritonError
from trident.types import DeviceCopy, InferenceRequest, Tensor


class HostAsDevice:
    """Stands in for a CUDA library: "device" memory is host memory."""

    name = "host-as-device"
    synchronized: list[int] = []

    def synchronize(self, device_id: int) -> None:
        HostAsDevice.synchronized.append(device_id)

    def to_host(self, buffer: _dlpack.DeviceBuffer) -> np.ndarray:
        raw = (ctypes.c_uint8 * buffer.nbytes).from_address(buffer.pointer)
        return np.frombuffer(raw, np.uint8).copy()

    def to_device(self, flat: np.ndarray, device_id: int) -> tuple[int, object]:
        copy = flat.copy()
        return int(copy.ctypes.data), copy


class Missing:
    name = "cuda"

    def __init__(self) -> None:
        raise RuntimeError("no CUDA device in this test")


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch) -> Iterator[type]:
    """The stand-in as the one CUDA library (restored afterwards)."""
    monkeypatch.setattr(_cuda, "CANDIDATES", [HostAsDevice])
    _cuda.forget()
    HostAsDevice.synchronized.clear()
    yield HostAsDevice
    _cuda.forget()


@pytest.fixture
def no_library(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_cuda, "CANDIDATES", [Missing])
    _cuda.forget()
    yield
    _cuda.forget()


def fake_cuda(array: np.ndarray, datatype: str = "FP32", device_id: int = 0) -> tuple[object, np.ndarray]:
    """(a capsule saying ``array``'s memory is on CUDA device ``device_id``, the array)."""
    a = np.ascontiguousarray(array)
    buffer = _dlpack.DeviceBuffer(_dlpack.KDL_CUDA, device_id, int(a.ctypes.data), a.shape, datatype, a.nbytes, a)
    return _dlpack.export(buffer), a


class CudaObject:
    """An object with the DLPack protocol in "CUDA" memory (as a torch or cupy tensor is)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.streams: list[object] = []

    def __dlpack__(self, stream: object = "unset", **kwargs: object) -> object:
        self.streams.append(stream)
        return fake_cuda(self.array)[0]

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_dlpack.KDL_CUDA, 0)


def _described(t: pb_utils.Tensor) -> _dlpack.Described:
    return _dlpack.describe(t.to_dlpack())[0]


# ---- CPU round trips ----


def test_numpy_and_torch_cpu_round_trips_share_memory() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = pb_utils.Tensor("a", a)
    assert t.is_cpu() and t.__dlpack_device__() == (1, 0)
    back = np.from_dlpack(t)
    assert back.ctypes.data == a.ctypes.data
    via_torch = torch.from_dlpack(t.to_dlpack())
    assert via_torch.data_ptr() == a.ctypes.data and via_torch.shape == (3, 4)
    # torch -> pb_utils -> torch: one memory all the way
    src = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    pb = pb_utils.Tensor.from_dlpack("t", src)
    assert pb.is_cpu() and pb.triton_dtype() == 9 and pb.shape() == [2, 3]
    assert pb.as_numpy().ctypes.data == src.data_ptr()
    assert torch.utils.dlpack.from_dlpack(pb.to_dlpack()).data_ptr() == src.data_ptr()
    from_capsule = pb_utils.Tensor.from_dlpack("c", torch.utils.dlpack.to_dlpack(src))
    assert from_capsule.as_numpy().ctypes.data == src.data_ptr()


def test_torch_bfloat16_round_trips_as_bf16() -> None:
    src = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    pb = pb_utils.Tensor.from_dlpack("b", src)
    assert pb.triton_dtype() == 14 and pb.is_cpu()
    with pytest.raises(pb_utils.TritonModelException, match="bf16"):
        pb.as_numpy()
    back = torch.from_dlpack(pb.to_dlpack())
    assert back.dtype == torch.bfloat16 and back.tolist() == [1.5, -2.0, 3.25]


def test_cpu_import_refusals() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="not a DLPack capsule"):
        pb_utils.Tensor.from_dlpack("x", object())
    capsule = torch.utils.dlpack.to_dlpack(torch.zeros(2))
    pb_utils.Tensor.from_dlpack("x", capsule)
    with pytest.raises(pb_utils.TritonModelException, match="consumed already"):
        pb_utils.Tensor.from_dlpack("x", capsule)


# ---- GPU tensors without CUDA ----


def test_a_cuda_capsule_becomes_a_gpu_tensor_over_the_same_memory() -> None:
    capsule, a = fake_cuda(np.arange(6, dtype=np.float32).reshape(2, 3))
    t = pb_utils.Tensor.from_dlpack("g", capsule)
    assert isinstance(t, pb_utils.Tensor) and type(t) is DeviceTensor
    assert not t.is_cpu() and t.shape() == [2, 3] and t.triton_dtype() == 11 and t.name() == "g"
    assert t.__dlpack_device__() == (_dlpack.KDL_CUDA, 0)
    with pytest.raises(pb_utils.TritonModelException, match="^Tensor is stored in GPU and cannot be converted to NumPy.$"):
        t.as_numpy()
    # to_dlpack hands the device memory out, as often as asked; each capsule imports once
    first, second = _described(t), _described(t)
    assert first.pointer == second.pointer == a.ctypes.data
    assert (first.device_type, first.device_id, first.shape, first.datatype) == (2, 0, (2, 3), "FP32")


def test_bf16_and_other_datatypes_keep_their_type_on_the_device() -> None:
    for datatype, dtype in (("BF16", np.uint16), ("INT8", np.int8), ("BOOL", np.bool_), ("FP16", np.float16)):
        capsule, _ = fake_cuda(np.zeros((2, 2), dtype), datatype)
        t = pb_utils.Tensor.from_dlpack("x", capsule)
        assert t._datatype == datatype and _described(t).datatype == datatype


def test_device_memory_lives_while_a_tensor_or_capsule_holds_it_and_is_released_once() -> None:
    gc.collect()
    before = _dlpack.live_exports()
    owner = np.arange(4, dtype=np.float32)
    released = []
    weakref.finalize(owner, released.append, True)
    buffer = _dlpack.DeviceBuffer(_dlpack.KDL_CUDA, 0, int(owner.ctypes.data), (4,), "FP32", 16, owner)
    t = pb_utils.Tensor.from_dlpack("x", _dlpack.export(buffer))
    del owner, buffer
    exported = t.to_dlpack()
    consumer = pb_utils.Tensor.from_dlpack("y", t.to_dlpack())
    unconsumed = t.to_dlpack()
    del t
    gc.collect()
    assert not released  # capsules and the second tensor hold it
    del consumer, exported
    gc.collect()
    assert not released
    del unconsumed  # its destructor calls the deleter (nobody consumed it)
    gc.collect()
    assert released == [True] and _dlpack.live_exports() == before


def test_gpu_import_refusals() -> None:
    # strided (Triton's words): a transposed tensor, its capsule relabelled as CUDA
    capsule = torch.arange(12.0).reshape(3, 4).t().__dlpack__()
    managed = _dlpack.DLManagedTensor.from_address(_dlpack._get_pointer(capsule, b"dltensor"))
    managed.dl_tensor.device_type = _dlpack.KDL_CUDA
    with pytest.raises(pb_utils.TritonModelException,
                       match="DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order"):
        pb_utils.Tensor.from_dlpack("s", capsule)
    # another device type
    a = np.zeros(3, np.float32)
    rocm = _dlpack.export(_dlpack.DeviceBuffer(10, 0, int(a.ctypes.data), (3,), "FP32", 12, a))
    with pytest.raises(pb_utils.TritonModelException, match=r"DLDevice type 10 \(ROCm\) is not supported"):
        pb_utils.Tensor.from_dlpack("r", rocm)

    class Rocm:
        def __dlpack__(self, **kwargs: object) -> object:
            raise AssertionError("not asked")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (10, 0)

    with pytest.raises(pb_utils.TritonModelException, match="DLDevice type 10"):
        pb_utils.Tensor.from_dlpack("r", Rocm())
    # a capsule whose device differs from what its producer said
    class Liar(CudaObject):
        def __dlpack_device__(self) -> tuple[int, int]:
            return (_dlpack.KDL_CUDA, 1)

    with pytest.raises(pb_utils.TritonModelException, match="not the CUDA device 1"):
        pb_utils.Tensor.from_dlpack("l", Liar(np.zeros(2, np.float32)))


def test_an_object_on_cuda_is_waited_for_through_the_cuda_library(library: type) -> None:
    obj = CudaObject(np.arange(3, dtype=np.float32))
    t = pb_utils.Tensor.from_dlpack("x", obj)
    assert not t.is_cpu() and library.synchronized == [0] and obj.streams == [None]
    # a bare capsule is taken as is (Triton does not wait either)
    y = pb_utils.Tensor.from_dlpack("y", fake_cuda(np.zeros(2, np.float32))[0])
    assert library.synchronized == [0]
    # a GPU tensor is such an object too: the same memory again
    assert _described(pb_utils.Tensor.from_dlpack("z", y)).pointer == _described(y).pointer
    assert library.synchronized == [0, 0]


def test_without_a_cuda_library_only_what_needs_one_fails(no_library: None) -> None:
    capsule, a = fake_cuda(np.arange(4, dtype=np.float32))
    t = pb_utils.Tensor.from_dlpack("x", capsule)  # needs nothing
    assert _described(t).pointer == a.ctypes.data
    with pytest.raises(_cuda.CudaUnavailable) as e:
        pb_utils.Tensor.from_dlpack("w", CudaObject(a))  # waiting for a producer needs a library
    assert "tensor 'w': importing a CUDA tensor needs CUDA in this process through torch, cupy or cuda-python" in str(e.value)
    assert "cuda: no CUDA device in this test" in str(e.value)
    with pytest.raises(pb_utils.TritonModelException, match="tensor 'x' in CUDA device 0: a copy to the host needs CUDA"):
        _convert.to_tensor(t)
    response = _convert.to_response(pb_utils.InferenceResponse([t]), "prefix: ")
    assert response.error is not None and response.error.code == Code.INTERNAL
    assert response.error.message.startswith("prefix: cannot convert outputs: CudaUnavailable: tensor 'x'")
    with pytest.raises(TritonError) as bls:
        _convert.to_request(pb_utils.InferenceRequest(model_name="m", inputs=[t]))
    assert bls.value.code == Code.INTERNAL and "BLS request to 'm'" in bls.value.message
    assert _cuda.library_name() is None


def test_copies_through_the_cuda_library(library: type) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor.from_dlpack("x", fake_cuda(a)[0])
    host = _convert.to_tensor(t)
    assert host.shape == (2, 3) and host.data.ctypes.data != a.ctypes.data
    np.testing.assert_array_equal(host.data, a)
    kept = _convert.to_tensor(t, keep_device=True)
    assert _dlpack.device_buffer_of(kept.data) is t._buffer and kept.data.shape == (2, 3)
    assert _convert.to_pb_tensor(kept)._buffer is t._buffer  # back to the same GPU tensor
    # PreferredMemory: CPU brings device outputs home, GPU takes host outputs (not BYTES) there
    response = InferenceResponse_of([kept, Tensor.from_numpy("n", np.array([7], np.int64)),
                                     Tensor.from_numpy("s", np.array([b"z"], dtype=object))])
    cpu = _convert.to_pb_response(response, pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU))
    assert [o.is_cpu() for o in cpu.output_tensors()] == [True, True, True]
    np.testing.assert_array_equal(cpu.output_tensors()[0].as_numpy(), a)
    gpu = _convert.to_pb_response(response, pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0))
    assert [o.is_cpu() for o in gpu.output_tensors()] == [False, False, True]
    assert gpu.output_tensors()[0]._buffer is t._buffer
    np.testing.assert_array_equal(_cuda.to_host(gpu.output_tensors()[1]._buffer, "test"), [7])
    as_produced = _convert.to_pb_response(response)
    assert [o.is_cpu() for o in as_produced.output_tensors()] == [False, True, True]


def InferenceResponse_of(outputs: list[Tensor]):  # noqa: N802 (reads as the type it makes)
    from trident.types import InferenceResponse

    return InferenceResponse(outputs=outputs)


def test_inputs_for_models_that_take_cpu_or_gpu_tensors(library: type) -> None:
    a = np.arange(4, dtype=np.float32)
    gpu = pb_utils.Tensor.from_dlpack("x", fake_cuda(a)[0])
    core = _convert.to_tensor(gpu, keep_device=True)
    request = InferenceRequest("m", [core, Tensor.from_numpy("c", np.ones(2, np.float32))])
    # FORCE_CPU_ONLY_INPUT_TENSORS yes (default): a host copy, made when the model reads inputs
    cpu_side = _convert.wrap_request(request, ["Y"])
    x, c = cpu_side.inputs()
    assert x.is_cpu() and c.is_cpu() and x.as_numpy().ctypes.data != a.ctypes.data
    np.testing.assert_array_equal(x.as_numpy(), a)
    # "no": the same device memory; a CPU input stays a CPU tensor
    gpu_side = _convert.wrap_request(request, ["Y"], device_inputs=True)
    x, c = gpu_side.inputs()
    assert not x.is_cpu() and x._buffer is gpu._buffer and c.is_cpu()
    # an input read from a client's CUDA shared memory: a host copy naming the device memory
    owner = object()
    copy = DeviceCopy.allocate(16, 0, 0xD0000, owner)
    copy[:] = np.frombuffer(a.tobytes(), np.uint8)
    shm = Tensor.from_numpy("shm", np.frombuffer(copy.data, np.float32))
    shm_request = InferenceRequest("m", [shm])
    on_device = _convert.wrap_request(shm_request, ["Y"], device_inputs=True).inputs()[0]
    assert not on_device.is_cpu() and _described(on_device).pointer == 0xD0000
    assert on_device._buffer.owner is owner and on_device.shape() == [4]
    on_host = _convert.wrap_request(shm_request, ["Y"]).inputs()[0]
    assert on_host.is_cpu()
    np.testing.assert_array_equal(on_host.as_numpy(), a)


def test_a_model_process_gets_host_copies(library: type) -> None:
    a = np.arange(3, dtype=np.float32)
    core = _convert.to_tensor(pb_utils.Tensor.from_dlpack("x", fake_cuda(a)[0]), keep_device=True)
    arrays: list[np.ndarray] = []
    assert channel.tensors_to_wire([core], arrays) == [("x", "FP32")]
    assert type(arrays[0]) is np.ndarray
    np.testing.assert_array_equal(arrays[0], a)


def test_a_model_process_without_a_cuda_library_fails_the_tensor_clearly(no_library: None) -> None:
    core = _convert.to_tensor(pb_utils.Tensor.from_dlpack("x", fake_cuda(np.zeros(2, np.float32))[0]),
                              keep_device=True)
    with pytest.raises(TritonError) as e:
        channel.tensors_to_wire([core], [])
    assert e.value.code == Code.INTERNAL and "tensor 'x' in CUDA device 0" in e.value.message


def test_device_view_stands_for_the_tensor_without_bytes_of_its_own() -> None:
    a = np.zeros((5, 7), np.float64)
    buffer = _dlpack.DeviceBuffer(_dlpack.KDL_CUDA, 0, int(a.ctypes.data), (5, 7), "FP64", a.nbytes, a)
    view = buffer.view()
    assert view.shape == (5, 7) and view.strides == (0, 0) and view.nbytes == a.nbytes
    assert not view.flags.writeable and _dlpack.device_buffer_of(view) is buffer
    assert _dlpack.device_buffer_of(view.reshape(35)) is buffer and _dlpack.device_buffer_of(a) is None
    assert _convert.host_tensors([Tensor.from_numpy("h", a)])[0].data is a


def test_preferred_memory_checks_its_arguments() -> None:
    assert pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 1).preferred_device_id == 1
    for bad in ((5,), ("gpu",), (pb_utils.TRITONSERVER_MEMORY_GPU, -1), (pb_utils.TRITONSERVER_MEMORY_GPU, "0"),
                (pb_utils.TRITONSERVER_MEMORY_CPU, True)):
        with pytest.raises(pb_utils.TritonModelException, match="preferred_"):
            pb_utils.PreferredMemory(*bad)
    with pytest.raises(pb_utils.TritonModelException, match="preferred_memory must be"):
        pb_utils.InferenceRequest(model_name="m", preferred_memory=pb_utils.TRITONSERVER_MEMORY_GPU)


def _config(value: str | None):
    params = {} if value is None else {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": value}}
    return config_from_json(json.dumps({"name": "m", "backend": "python", "parameters": params}))


@pytest.mark.parametrize(("value", "expected"), [(None, True), ("yes", True), ("no", False), (" no ", False)])
def test_force_cpu_only_input_tensors_is_parsed(value: str | None, expected: bool) -> None:
    assert force_cpu_only_inputs(_config(value)) is expected


@pytest.mark.parametrize("value", ["No", "YES", "true", "0", ""])
def test_force_cpu_only_input_tensors_refuses_other_values(value: str) -> None:
    with pytest.raises(TritonError) as e:
        force_cpu_only_inputs(_config(value))
    assert e.value.code == Code.UNSUPPORTED
    assert f"Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: '{value}'" in e.value.message
