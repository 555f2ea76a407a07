"""The model-process transport: the shared-memory ring, one-off memfds, large headers, and
trident's core types on the wire."""

from __future__ import annotations

import mmap
import os
import socket
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trident.backends.python.isolated import channel as wire
from trident.errors import Code, TritonError
from trident.types import (
    InferenceRequest,
    InferenceResponse,
    RequestedOutput,
    SharedRegionMapping,
    Tensor,
    shared_region_of,
)


def _pair(ring_bytes: int = 4096) -> tuple[wire.Channel, wire.Channel]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ab = wire.create_memfd("test-ab", wire.RING_HEADER + ring_bytes)
    ba = wire.create_memfd("test-ba", wire.RING_HEADER + ring_bytes)
    left = wire.Channel(a, out_ring=wire.Ring(ab, ring_bytes), in_ring=wire.Ring(ba, ring_bytes))
    right = wire.Channel(b, out_ring=wire.Ring(ba, ring_bytes), in_ring=wire.Ring(ab, ring_bytes))
    return left, right


def test_ring_allocates_in_order_and_wraps() -> None:
    fd = wire.create_memfd("ring", wire.RING_HEADER + 1024)
    ring = wire.Ring(fd, 1024)
    first = ring.alloc(300)  # 320 with alignment
    second = ring.alloc(600)  # 640
    assert first == (0, 320) and second == (320, 960)
    assert ring.alloc(100) is None  # 64 bytes left at the end, nothing freed yet
    ring.free(320)  # the first message was read
    assert ring.alloc(100) == (0, 1024 + 128)  # skips the 64 bytes at the end, starts over
    assert ring.alloc(300) is None  # would overlap the second message, still unread
    ring.free(960)
    assert ring.alloc(300) == (128, 1024 + 128 + 320)
    assert ring.alloc(2000) is None  # larger than the ring: the caller uses a one-off memfd
    ring.close()


def test_messages_with_tensors_round_trip_through_the_ring() -> None:
    left, right = _pair()
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([b"x", "é".encode(), b""], dtype=object),
              np.array(True), np.zeros((0, 4), np.int64), np.arange(4, dtype=">i4")]
    left.send(("hello", {"k": [1, 2]}), arrays)
    message, got = right.recv()  # type: ignore[misc]
    assert message == ("hello", {"k": [1, 2]})
    for a, b in zip(arrays, got, strict=True):
        assert a.shape == b.shape
        assert a.tolist() == b.tolist()
    assert got[2].dtype == np.bool_ and got[3].dtype == np.int64
    assert got[0].flags.writeable  # a private copy, not a view of the ring
    left.close()
    right.close()


def test_a_full_ring_falls_back_to_a_one_off_memfd() -> None:
    left, right = _pair(ring_bytes=4096)
    big = np.arange(10_000, dtype=np.float64)  # 80 KB > the 4 KiB ring
    small = np.arange(8, dtype=np.int32)
    left.send("big", [big])
    left.send("small-1", [small])
    left.send("small-2", [small])
    for expected, array in (("big", big), ("small-1", small), ("small-2", small)):
        message, got = right.recv()  # type: ignore[misc]
        assert message == expected and got[0].tolist() == array.tolist()
    left.close()
    right.close()


def test_large_headers_travel_in_a_memfd() -> None:
    left, right = _pair()
    text = "x" * (wire.MAX_PACKET * 3)
    left.send(("long", text))
    assert right.recv() == (("long", text), [])
    left.close()
    right.close()


def test_recv_returns_none_when_the_peer_closes() -> None:
    left, right = _pair()
    done = threading.Event()
    result: list[object] = []

    def read() -> None:
        result.append(right.recv())
        done.set()

    threading.Thread(target=read).start()
    left.close()
    assert done.wait(10) and result == [None]
    with pytest.raises(wire.ChannelClosed):
        left.send("after close")
    right.close()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["<f4", "<i8", "|u1", "<f2", "|b1"]),
                          st.lists(st.integers(0, 5), max_size=3)), max_size=5),
       st.integers(1, 6))
def test_many_messages_keep_their_tensors(specs: list[tuple[str, list[int]]], repeats: int) -> None:
    left, right = _pair(ring_bytes=2048)
    rng = np.random.default_rng(0)
    try:
        for _ in range(repeats):
            arrays = [(rng.random(tuple(shape)) * 100).astype(dtype) for dtype, shape in specs]
            left.send("m", arrays)
            _, got = right.recv()  # type: ignore[misc]
            assert [g.dtype for g in got] == [a.dtype for a in arrays]
            for a, g in zip(arrays, got, strict=True):
                np.testing.assert_array_equal(a, g)
    finally:
        left.close()
        right.close()


def test_core_types_on_the_wire() -> None:
    request = InferenceRequest(
        "m", [Tensor.from_numpy("A", np.ones((1, 2), np.float32)),
              Tensor.from_numpy("S", np.array([b"s"], dtype=object))],
        model_version="3", id="r1", outputs=[RequestedOutput("B")], parameters={"p": 1, "q": "x"})
    arrays: list[np.ndarray] = []
    meta = wire.request_to_wire(request, arrays)
    back = wire.request_from_wire(meta, arrays)
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("m", "3", "r1", {"p": 1, "q": "x"})
    assert [o.name for o in back.outputs] == ["B"]
    assert [(t.name, t.datatype, t.shape) for t in back.inputs] == [("A", "FP32", (1, 2)), ("S", "BYTES", (1,))]
    response = InferenceResponse(outputs=[Tensor.from_numpy("B", np.arange(3, dtype=np.int16))],
                                 parameters={"k": True}, final=False)
    arrays = []
    again = wire.response_from_wire(wire.response_to_wire(response, arrays), arrays)
    assert again.output("B").data.tolist() == [0, 1, 2] and again.parameters == {"k": True} and not again.final
    failed = InferenceResponse(error=TritonError(Code.INVALID_ARG, "bad"))
    again = wire.response_from_wire(wire.response_to_wire(failed, []), [])
    assert again.error is not None and again.error.code == Code.INVALID_ARG and again.error.message == "bad"


# ---- client shared memory by reference ----


def _region(size: int = 4096, fill: int = 0) -> tuple[SharedRegionMapping, int]:
    """A registered-region lookalike: a mapping of a memfd with its read-only descriptor, as
    trident.server.shared_memory makes them (and the object's fd, for the test to change)."""
    fd = wire.create_memfd("region", size)
    mapping = SharedRegionMapping(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    mapping.attach_file(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY))
    mapping[:] = bytes([fill]) * size
    return mapping, fd


def _view(mapping: SharedRegionMapping, offset: int, count: int, dtype: str = "<f4") -> np.ndarray:
    """An input as the front ends decode it: a numpy view of a read-only memoryview."""
    blob = memoryview(mapping)[offset:offset + count * np.dtype(dtype).itemsize].toreadonly()
    return np.frombuffer(blob, np.dtype(dtype)).reshape(count)


def _base(array: np.ndarray) -> object:
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_shared_region_of_finds_views_only() -> None:
    mapping, fd = _region()
    view = _view(mapping, 128, 16)
    assert shared_region_of(view) == (mapping, 128)
    assert shared_region_of(view[4:]) == (mapping, 128 + 16)
    assert shared_region_of(view[::2]) is None  # not one contiguous run
    assert shared_region_of(view.copy()) is None
    assert shared_region_of(np.frombuffer(memoryview(mmap.mmap(-1, 64)), np.uint8)) is None  # not a region
    assert shared_region_of(view[:0]) is None
    del view
    mapping.release_file()
    assert mapping.file_released and mapping.dup_file() is None
    mapping.close()
    os.close(fd)


def test_region_views_travel_by_reference_and_are_mapped_once() -> None:
    left, right = _pair()
    mapping, fd = _region()
    view = _view(mapping, 256, 32)
    view_data = np.arange(32, dtype=np.float32)
    mapping[256:256 + 128] = view_data.tobytes()
    regular = np.arange(5, dtype=np.int64)
    words = np.array([b"a", b"bc"], dtype=object)
    left.send(("m", 1), [regular, view, words])
    _, got = right.recv()  # type: ignore[misc]
    assert got[0].tolist() == regular.tolist() and got[2].tolist() == words.tolist()
    shm_in = got[1]
    assert shm_in.tolist() == view_data.tolist()
    assert not shm_in.flags.writeable and isinstance(_base(shm_in), mmap.mmap)
    mapping[256:260] = np.float32(42).tobytes()  # the client writes: the receiver sees it (no copy)
    assert shm_in[0] == 42
    assert list(right.regions) == [mapping.serial]
    left.send(("m", 2), [_view(mapping, 0, 4)])  # the region is not passed again
    _, again = right.recv()  # type: ignore[misc]
    assert again[0].tolist() == [0, 0, 0, 0] and list(right.regions) == [mapping.serial]
    left.close()
    right.close()
    os.close(fd)


def test_unregistered_regions_are_forgotten_and_copied() -> None:
    left, right = _pair()
    mapping, fd = _region(fill=1)
    view = _view(mapping, 0, 8, "u1")
    left.send(("m",), [view])
    _, got = right.recv()  # type: ignore[misc]
    kept = got[0]  # the model keeps a view past the region's life
    assert list(right.regions) == [mapping.serial]
    mapping.release_file()  # unregistered; the server's own view (``view``) is still alive
    left.send(("m",), [view])  # the next packet forgets it, and this view is copied instead
    _, got = right.recv()  # type: ignore[misc]
    assert right.regions == {} and got[0].flags.writeable and got[0].tolist() == [1] * 8
    assert kept.tolist() == [1] * 8  # still mapped for the view that outlives the cache entry
    left.close()
    right.close()
    os.close(fd)


def test_release_regions_reaches_an_idle_receiver() -> None:
    left, right = _pair()
    mapping, fd = _region()
    left.send(("m",), [_view(mapping, 0, 4)])
    right.recv()
    left.release_regions()  # nothing unregistered: sends nothing
    mapping.release_file()
    left.release_regions()
    left.send(("next",))
    message, _ = right.recv()  # type: ignore[misc]
    assert message == ("next",) and right.regions == {}  # the regions-only packet was read on the way
    left.close()
    right.close()
    os.close(fd)


def test_the_receiver_keeps_a_bounded_number_of_regions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_PEER_REGIONS", 3)
    left, right = _pair()
    made = [_region(fill=i) for i in range(6)]
    for i, (mapping, _) in enumerate(made):
        left.send(("m",), [_view(mapping, 0, 4, "u1")])
        _, got = right.recv()  # type: ignore[misc]
        assert got[0].tolist() == [i] * 4
        assert len(right.regions) == min(i + 1, 3)
    assert set(right.regions) == {m.serial for m, _ in made[3:]}  # the most recently used
    left.close()
    right.close()
    for _, fd in made:
        os.close(fd)


def test_a_bad_reference_fails_the_message_not_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    left, right = _pair()
    mapping, fd = _region(size=4096)
    view = _view(mapping, 0, 16)
    left.send(("m",), [view])
    right.recv()
    monkeypatch.setattr(wire, "shared_region_of", lambda a: (mapping, 4096 - 8) if a is view else None)
    left.send(("execute", 7), [view])  # 64 bytes claimed at 8 bytes before the end
    with pytest.raises(wire.UnreadableTensors, match=r"outside the 4096 bytes") as info:
        right.recv()
    assert info.value.message == ("execute", 7)
    left.send(("after",), [np.ones(3)])  # the channel is still in step
    message, got = right.recv()  # type: ignore[misc]
    assert message == ("after",) and got[0].tolist() == [1, 1, 1]
    left.close()
    right.close()
    os.close(fd)


def test_an_object_smaller_than_its_region_is_not_mapped() -> None:
    left, right = _pair()
    mapping, fd = _region(size=8192)
    view = _view(mapping, 0, 4)
    os.ftruncate(fd, 4096)  # the client shrank it after registering (reading past its end would fault)
    left.send(("execute", 1), [view])
    with pytest.raises(wire.UnreadableTensors, match=r"could not be mapped.*fewer than the 8192"):
        right.recv()
    assert right.regions == {}
    left.close()
    right.close()
    os.close(fd)
