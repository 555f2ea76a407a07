"""System shared memory (issue [13]) with tritonclient.utils.shared_memory, over HTTP and gRPC.

Statuses and messages are the real Triton 2.51's for the same calls (checked side by side).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.e2e.conftest import start_server
from tests.e2e.models import DATATYPES, write_identity

PROTOCOLS = ["http", "grpc"]
_CLIENTS = {"http": httpclient, "grpc": grpcclient}
_GRPC = {"400": "StatusCode.INVALID_ARGUMENT", "404": "StatusCode.NOT_FOUND", "500": "StatusCode.INTERNAL",
         "501": "StatusCode.UNIMPLEMENTED"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    import shutil

    from trident.options import EXAMPLE_REPOSITORY

    repo: Path = tmp_path_factory.mktemp("shm")
    for dt in DATATYPES:
        write_identity(repo, dt)
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub")  # two inputs: one in shm, one not
    # the same model on its instance's thread always (the others run inline once measured)
    write_identity(repo, "FP32", name="identity_on_thread")
    with (repo / "identity_on_thread" / "config.pbtxt").open("a") as f:
        f.write('parameters { key: "TRIDENT_INLINE_EXECUTION" value: { string_value: "never" } }\n')
    s = start_server("--allow-client-shm=true", repo=repo)
    yield s
    s.stop()


class Regions:
    """Shared-memory objects made for one test, destroyed at its end."""

    def __init__(self) -> None:
        self.made: list[tuple[str, object]] = []

    def make(self, size: int) -> tuple[str, object]:
        key = f"/trident_test_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        self.made.append((key, handle))
        return key, handle

    def close(self) -> None:
        for _, handle in self.made:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions():
    r = Regions()
    yield r
    r.close()


def _client(server, protocol: str):
    return (httpclient.InferenceServerClient(server.http_url) if protocol == "http"
            else grpcclient.InferenceServerClient(server.grpc_url))


def _error(call) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value.status()), e.value.message()


def _sample(dt: str) -> np.ndarray:
    if dt == "BYTES":
        return np.array([[b"a", b"\xff\x00bc"], [b"", "é".encode()]], dtype=object)
    if dt == "BOOL":
        return np.array([[True, False], [False, True]])
    if dt == "BF16":
        return np.array([[0x3F80, 0x4000], [0xBF80, 0]], dtype=np.uint16)
    np_dt = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dt) or np.dtype(dt.lower())
    return np.arange(4).reshape(2, 2).astype(np_dt)


def _raw(array: np.ndarray, dt: str) -> bytes:
    return serialize_byte_tensor(array).item() if dt == "BYTES" else array.tobytes()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("dt", DATATYPES)
def test_every_datatype_in_and_out_of_shared_memory(server, regions, protocol: str, dt: str) -> None:
    x = _sample(dt)
    data = _raw(x, dt)
    in_key, in_handle = regions.make(len(data))
    out_key, out_handle = regions.make(len(data))
    shm.set_shared_memory_region(in_handle, [np.frombuffer(data, np.uint8)])
    mod = _CLIENTS[protocol]
    model = f"identity_{dt.lower()}"
    tag = uuid.uuid4().hex[:8]
    with _client(server, protocol) as c:
        c.register_system_shared_memory(f"in{tag}", in_key, len(data))
        c.register_system_shared_memory(f"out{tag}", out_key, len(data))
        try:
            inp = mod.InferInput("INPUT0", list(x.shape), dt)
            inp.set_shared_memory(f"in{tag}", len(data))
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"out{tag}", len(data))
            result = c.infer(model, [inp], outputs=[out])  # both in shared memory
            entry = result.get_output("OUTPUT0")
            assert entry is not None
            got = bytes(shm.get_contents_as_numpy(out_handle, np.uint8, [len(data)]))
            assert got == data
            only_in = c.infer(model, [inp])  # the output comes back in the response
            expected = x.view(np.uint16) if dt == "BF16" else x
            got_array = only_in.as_numpy("OUTPUT0")
            if dt == "BF16":
                got_array = got_array.view(np.uint16)
            np.testing.assert_array_equal(got_array, expected)
            plain = mod.InferInput("INPUT0", list(x.shape), dt)
            if dt == "BF16":
                import ml_dtypes

                plain.set_data_from_numpy(x.view(ml_dtypes.bfloat16))
            else:
                plain.set_data_from_numpy(x)
            c.infer(model, [plain], outputs=[out])  # only the output in shared memory
            assert bytes(shm.get_contents_as_numpy(out_handle, np.uint8, [len(data)])) == data
        finally:
            c.unregister_system_shared_memory(f"in{tag}")
            c.unregister_system_shared_memory(f"out{tag}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_registry_answers_as_triton(server, regions, protocol: str) -> None:
    key, _ = regions.make(64)
    other, _ = regions.make(64)
    tag = uuid.uuid4().hex[:8]
    name = f"r{tag}"
    with _client(server, protocol) as c:
        c.register_system_shared_memory(name, key, 64)
        try:
            status, message = _error(lambda: c.register_system_shared_memory(name, key, 64))
            assert message == f"shared memory region '{name}' already in manager"
            assert status == ("400" if protocol == "http" else "StatusCode.ALREADY_EXISTS")
            for call, code, text in (
                    (lambda: c.register_system_shared_memory(f"x{tag}", "/no_such_trident_key", 64), "500",
                     "Unable to open shared memory region: '/no_such_trident_key'"),
                    (lambda: c.register_system_shared_memory(f"y{tag}", "../../etc/passwd", 16), "500",
                     "Unable to open shared memory region: '../../etc/passwd'"),
                    (lambda: c.register_system_shared_memory(f"y{tag}", other, 128), "400",
                     f"failed to register shared memory region 'y{tag}': invalid args"),
                    (lambda: c.register_system_shared_memory(f"z{tag}", other, 32, offset=48), "400",
                     f"failed to register shared memory region 'z{tag}': invalid args"),
                    (lambda: c.get_system_shared_memory_status("nope"), "404",
                     "Unable to find system shared memory region: 'nope'"),
                    (lambda: c.get_cuda_shared_memory_status("nope"), "404",
                     "Unable to find cuda shared memory region: 'nope'")):
                got_status, got_message = _error(call)
                assert got_message == text
                assert got_status == (code if protocol == "http" else _GRPC[code])
            status_all = c.get_system_shared_memory_status()
            names = ([r["name"] for r in status_all] if protocol == "http" else list(status_all.regions))
            assert name in names
            one = c.get_system_shared_memory_status(name)
            if protocol == "http":
                assert one == [{"name": name, "key": key, "offset": 0, "byte_size": 64}]
            else:
                assert one.regions[name].key == key and one.regions[name].byte_size == 64
            c.unregister_system_shared_memory("not_registered")  # as Triton: OK
        finally:
            c.unregister_system_shared_memory(name)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_tensors_are_refused_and_the_region_left_untouched(server, regions, protocol: str) -> None:
    key, handle = regions.make(64)
    out_key, out_handle = regions.make(64)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
    shm.set_shared_memory_region(out_handle, [np.full(16, 7, np.float32)])
    mod = _CLIENTS[protocol]
    tag = uuid.uuid4().hex[:8]
    with _client(server, protocol) as c:
        c.register_system_shared_memory(f"in{tag}", key, 64)
        c.register_system_shared_memory(f"out{tag}", out_key, 64)
        try:
            def infer(size: int = 64, offset: int = 0, region: str = f"in{tag}", out_size: int | None = None,
                      out_offset: int = 0):
                inp = mod.InferInput("INPUT0", [4, 4], "FP32")
                inp.set_shared_memory(region, size, offset=offset)
                outputs = None
                if out_size is not None:
                    out = mod.InferRequestedOutput("OUTPUT0")
                    out.set_shared_memory(f"out{tag}", out_size, offset=out_offset)
                    outputs = [out]
                return c.infer("identity_fp32", [inp], outputs=outputs)

            cases = [
                ({"size": 32}, "400", "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. "
                                      "Expected 64, got 32"),
                ({"offset": 16}, "400", f"Invalid offset + byte size for shared memory region: 'in{tag}'"),
                ({"region": "unknown"}, "404", "Unable to find shared memory region: 'unknown'"),
                ({"out_size": 64, "out_offset": 8}, "400",
                 f"Invalid offset + byte size for shared memory region: 'out{tag}'"),
                ({"out_size": 32}, "500", "shared memory size specified with the request for output 'OUTPUT0' "
                                          "(32 bytes) should be at least 64 bytes to hold the results"),
            ]
            for kwargs, code, text in cases:
                got_status, got_message = _error(lambda kwargs=kwargs: infer(**kwargs))
                assert text in got_message, got_message
                assert got_status == (code if protocol == "http" else _GRPC[code])
                assert shm.get_contents_as_numpy(out_handle, np.float32, [16]).tolist() == [7.0] * 16
            np.testing.assert_array_equal(infer().as_numpy("OUTPUT0"),
                                          np.arange(16, dtype=np.float32).reshape(4, 4))  # still serving
        finally:
            c.unregister_system_shared_memory()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_many_regions_reused_and_mixed_with_regular_tensors(server, regions, protocol: str) -> None:
    mod = _CLIENTS[protocol]
    tag = uuid.uuid4().hex[:8]
    with _client(server, protocol) as c:
        names = []
        for i in range(40):
            key, handle = regions.make(64)
            shm.set_shared_memory_region(handle, [np.full(16, i, np.float32)])
            c.register_system_shared_memory(f"m{tag}_{i}", key, 64)
            names.append(f"m{tag}_{i}")
        try:
            for _ in range(3):  # reused across requests
                for i, name in enumerate(names):
                    inp = mod.InferInput("INPUT0", [4, 4], "FP32")
                    inp.set_shared_memory(name, 64)
                    assert c.infer("identity_fp32", [inp]).as_numpy("OUTPUT0").tolist() == [[float(i)] * 4] * 4
            a = mod.InferInput("INPUT0", [1, 16], "FP32")
            a.set_shared_memory(names[5], 64)
            b = mod.InferInput("INPUT1", [1, 16], "FP32")
            b.set_data_from_numpy(np.ones((1, 16), np.float32))  # mixed: one regular tensor
            result = c.infer("add_sub", [a, b])
            assert result.as_numpy("OUTPUT0").tolist() == [[6.0] * 16]
            assert result.as_numpy("OUTPUT1").tolist() == [[4.0] * 16]
        finally:
            c.unregister_system_shared_memory()
        assert (c.get_system_shared_memory_status() == [] if protocol == "http"
                else not c.get_system_shared_memory_status().regions)


def read_while_unregistering(server, region: str, x: np.ndarray, unregister) -> None:
    """A client reads ``x`` (FP32 [1024, 1024]) from ``region`` 30 times over gRPC while the
    region is unregistered (``unregister()``, once the first answer is in): every request gets
    the right answer or "Unable to find shared memory region", and the server stays up."""
    errors: list[BaseException] = []
    answered = []

    def loop() -> None:
        try:
            with grpcclient.InferenceServerClient(server.grpc_url) as c2:
                for _ in range(30):
                    inp = grpcclient.InferInput("INPUT0", [1024, 1024], "FP32")
                    inp.set_shared_memory(region, x.nbytes)
                    try:
                        got = c2.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
                    except InferenceServerException as e:
                        assert "Unable to find shared memory region" in e.message()
                        continue
                    assert got[1023, 1023] == x[-1]
                    answered.append(1)
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=loop)
    t.start()
    while not answered and t.is_alive():
        threading.Event().wait(0.01)
    unregister()
    t.join(60)
    assert not errors, errors
    assert answered
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        assert c.is_server_live()


def test_unregister_while_a_request_reads_the_region_keeps_it_mapped(server, regions) -> None:
    """Unregistering forgets the name at once; a request already holding the region's pages
    keeps them until it is done (no crash, the right answer)."""
    key, handle = regions.make(4 * 1024 * 1024)
    x = np.arange(1024 * 1024, dtype=np.float32)
    shm.set_shared_memory_region(handle, [x])
    tag = uuid.uuid4().hex[:8]
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.register_system_shared_memory(f"big{tag}", key, x.nbytes)
        read_while_unregistering(server, f"big{tag}", x, lambda: c.unregister_system_shared_memory(f"big{tag}"))


@pytest.mark.parametrize("model", ["identity_fp32", "identity_on_thread"])
def test_an_unregistered_region_is_unmapped_when_its_last_request_is_done(server, regions, model: str) -> None:
    """Nothing keeps a finished request (and so its inputs' pages): an instance thread waiting
    for its next batch used to hold its last one, and with it the region's mapping."""
    key, handle = regions.make(64)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
    tag = uuid.uuid4().hex[:8]
    maps = Path(f"/proc/{server.proc.pid}/maps")
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.register_system_shared_memory(f"m{tag}", key, 64)
        inp = grpcclient.InferInput("INPUT0", [4, 4], "FP32")
        inp.set_shared_memory(f"m{tag}", 64)
        assert c.infer(model, [inp]).as_numpy("OUTPUT0").reshape(-1).tolist() == list(range(16))
        bad = grpcclient.InferInput("INPUT0", [4, 4], "FP32")
        bad.set_shared_memory(f"m{tag}", 32)  # refused after the region was read
        assert "input byte size mismatch" in _error(lambda: c.infer(model, [bad]))[1]
        assert key[1:] in maps.read_text()
        c.unregister_system_shared_memory(f"m{tag}")
        assert key[1:] not in maps.read_text()


def infer_with_aio_clients(server, region: str, register, unregister) -> None:
    """tritonclient's asyncio clients, HTTP then gRPC, each register ``region`` (``await
    register(client)``: 64 bytes holding FP32 0..15), read it as an identity input and
    unregister it (``await unregister(client)``)."""
    import asyncio

    async def main() -> None:
        for mod, url in ((httpaio, server.http_url), (grpcaio, server.grpc_url)):
            c = mod.InferenceServerClient(url)
            try:
                await register(c)
                inp = (httpclient if mod is httpaio else grpcclient).InferInput("INPUT0", [4, 4], "FP32")
                inp.set_shared_memory(region, 64)
                result = await c.infer("identity_fp32", [inp])
                assert result.as_numpy("OUTPUT0").reshape(-1).tolist() == list(range(16))
                await unregister(c)
            finally:
                await c.close()

    asyncio.run(main())


def test_aio_clients(server, regions) -> None:
    key, handle = regions.make(64)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
    name = f"a{uuid.uuid4().hex[:8]}"
    infer_with_aio_clients(server, name, lambda c: c.register_system_shared_memory(name, key, 64),
                           lambda c: c.unregister_system_shared_memory(name))


def test_off_by_default_with_an_answer_naming_the_flag(regions) -> None:
    s = start_server()
    try:
        key, _ = regions.make(64)
        message = "start it with --allow-client-shm=true"
        with httpclient.InferenceServerClient(s.http_url) as c:
            status, text = _error(lambda: c.register_system_shared_memory("r", key, 64))
            assert status == "501" and message in text
        with grpcclient.InferenceServerClient(s.grpc_url) as c:
            status, text = _error(lambda: c.register_system_shared_memory("r", key, 64))
            assert status == "StatusCode.UNIMPLEMENTED" and message in text
            inp = grpcclient.InferInput("INPUT0", [16], "FP32")
            inp.set_shared_memory("r", 64)
            status, text = _error(lambda: c.infer("identity_fp32", [inp]))
            assert status == "StatusCode.UNIMPLEMENTED" and message in text
    finally:
        s.stop()
