"""The registry's mappings as data a backend can read: an input view names its region
(trident.types.shared_region_of) and the region's file while it is registered."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from trident.errors import Code, TritonError
from trident.protocol import kserve
from trident.server.shared_memory import SharedMemory
from trident.types import DeviceCopy, SharedRegionMapping, device_source_of, shared_region_of


@pytest.fixture
def key():
    name = f"trident_unit_{uuid.uuid4().hex[:12]}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 256)
    os.pwrite(fd, np.arange(64, dtype=np.float32).tobytes(), 0)
    os.close(fd)
    yield "/" + name
    os.unlink(f"/dev/shm/{name}")


def test_input_views_name_their_region_and_its_file(key: str) -> None:
    registry = SharedMemory(allowed=True)
    registry.register_system("r", key, 64, 128)  # bytes 64..192 of the object
    array = kserve.shm_array("IN", "FP32", (2, 8), 16, registry.input_view("r", 32, 64), "m")
    assert array.tolist() == np.arange(24, 40, dtype=np.float32).reshape(2, 8).tolist()
    found = shared_region_of(array)
    assert found is not None
    mapping, offset = found
    assert isinstance(mapping, SharedRegionMapping) and offset == 96 and mapping.length == 192
    fd = mapping.dup_file()
    assert fd is not None
    try:
        assert os.fstat(fd).st_size == 256 and os.pread(fd, 4, offset) == np.float32(24).tobytes()
        with pytest.raises(OSError):
            os.pwrite(fd, b"x", 0)  # the file handed out is read-only
    finally:
        os.close(fd)
    serial = mapping.serial
    registry.unregister_system("r")
    assert mapping.file_released and mapping.dup_file() is None
    assert array.tolist()[0][0] == 24  # the request's view stays valid
    registry.register_system("r", key, 0, 64)
    again = shared_region_of(kserve.shm_array("IN", "FP32", (4,), 4, registry.input_view("r", 0, 16), "m"))
    assert again is not None and again[0].serial != serial  # a registration of its own
    registry.close()
    assert again[0].file_released


def test_copies_and_output_views_of_other_memory_name_no_region(key: str) -> None:
    registry = SharedMemory(allowed=True)
    registry.register_system("r", key, 0, 256)
    view = kserve.shm_array("IN", "FP32", (8,), 8, registry.input_view("r", 0, 32), "m")
    assert shared_region_of(view.copy()) is None
    assert shared_region_of(np.arange(8, dtype=np.float32)) is None
    words = kserve.shm_array("IN", "BYTES", (1,), 1, memoryview(b"\x01\x00\x00\x00a"), "m")
    assert shared_region_of(words) is None
    registry.close()


def test_running_out_of_descriptors_is_a_clear_error(key: str) -> None:
    """Each region holds two descriptors; registering past the process's limit answers INTERNAL
    with the reason and leaves the registry as it was (run in a child with a small limit)."""
    import subprocess
    import sys

    script = f"""
import os, resource
from trident.errors import TritonError
from trident.server.shared_memory import SharedMemory
registry = SharedMemory(allowed=True)
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 5, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
errors = []
for i in range(10):
    try:
        registry.register_system(f"r{{i}}", {key!r}, 0, 64)
    except TritonError as e:
        errors.append((e.code.name, e.message))
registered = len(registry.system_status())
print(registered, errors[0][0], "Unable to" in errors[0][1])
registry.unregister_system()
print(len(registry.system_status()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.split("\n")[:2]
    registered, code, named = first.split()
    assert 1 <= int(registered) < 10 and code == "INTERNAL" and named == "True"
    assert second == "0"


def test_a_host_copy_of_cuda_memory_names_where_it_came_from() -> None:
    """What a GPU backend reads (trident.types.device_source_of): the device address of an
    array's first element in the client's CUDA memory, through reshapes and slices along
    axis 0; nothing for strided, empty, object or ordinary arrays, or without an owner."""
    owner = object()
    copy = DeviceCopy.allocate(64, 1, 0x7F0000001000, owner)
    copy[:] = np.frombuffer(np.arange(16, dtype=np.float32).tobytes(), np.uint8)
    array = kserve.shm_array("IN", "FP32", (4, 4), 16, copy.data.toreadonly(), "m")
    assert array.tolist() == np.arange(16, dtype=np.float32).reshape(4, 4).tolist()
    assert device_source_of(array) == (1, 0x7F0000001000, owner)
    assert device_source_of(array[1:]) == (1, 0x7F0000001000 + 16, owner)
    assert device_source_of(array.reshape(-1)[4:8]) == (1, 0x7F0000001000 + 16, owner)
    assert device_source_of(array[:, 1]) is None  # strided: the backend copies the host bytes
    assert device_source_of(array[:0]) is None
    assert device_source_of(np.arange(4.0)) is None
    assert device_source_of(np.frombuffer(bytearray(16), np.float32)) is None
    orphan = DeviceCopy.allocate(16, 0, 0x7F0000001000, None)
    assert device_source_of(np.frombuffer(orphan, np.float32)) is None
    assert shared_region_of(array) is None  # not a system region either


def test_cuda_regions_on_a_host_without_cuda_are_unsupported_after_the_argument_checks() -> None:
    registry = SharedMemory(allowed=True)
    with pytest.raises(TritonError) as e:
        registry.register_cuda("c", bytes(8), 0, 64)
    assert e.value.code == Code.INVALID_ARG and e.value.message == "failed to register shared memory region: invalid args"
    if device_count() == 0:
        with pytest.raises(TritonError) as e:
            registry.register_cuda("c", bytes(64), 0, 64)
        assert e.value.code == Code.UNSUPPORTED and e.value.message.startswith("CUDA shared memory needs ")
    assert registry.cuda_status() == []
    with pytest.raises(TritonError) as e:
        registry.cuda_status("c")
    assert e.value.code == Code.NOT_FOUND
    with pytest.raises(TritonError) as e:
        SharedMemory(allowed=False).register_cuda("c", bytes(64), 0, 64)
    assert e.value.code == Code.UNSUPPORTED and "--allow-client-shm" in e.value.message


def device_count() -> int:
    try:
        import cuda.bindings.runtime as rt
    except ImportError:
        return 0
    err, count = rt.cudaGetDeviceCount()
    return int(count) if int(err) == 0 else 0


def test_the_number_of_regions_is_bounded(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from trident.server import shared_memory

    monkeypatch.setattr(shared_memory, "MAX_REGIONS", 3)
    registry = SharedMemory(allowed=True)
    for i in range(3):
        registry.register_system(f"r{i}", key, 0, 64)
    with pytest.raises(TritonError) as e:
        registry.register_system("r3", key, 0, 64)
    assert e.value.code == Code.INVALID_ARG
    assert e.value.message == ("failed to register shared memory region 'r3': at most 3 system shared memory "
                               "regions can be registered")
    with pytest.raises(TritonError) as e:
        registry.register_system("r0", key, 0, 64)  # a name in use is refused first
    assert e.value.code == Code.ALREADY_EXISTS
    registry.unregister_system("r1")
    registry.register_system("r3", key, 0, 64)
    assert [r["name"] for r in registry.system_status()] == ["r0", "r2", "r3"]
    registry.close()
