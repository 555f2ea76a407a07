"""Client system shared memory reaching process-isolated Python models without a copy.

A process-isolated model (``TRIDENT_EXECUTION_MODE=process``) gets an input that a client
sent through a registered region as a read-only view of the region, mapped in the model
process itself (backends/python/isolated/channel.py); BYTES and regular tensors are copied as
before. The models report what they saw (is the input a view of a mapping? is it read-only?)
and their pid, so the tests can read the model process's /proc/<pid>/maps.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.e2e.conftest import start_server
from tests.e2e.python_models import build_repo

PROTOCOLS = ["http", "grpc"]
_CLIENTS = {"http": httpclient, "grpc": grpcclient}
PREFIX = "trident_iso_"

PROCESS = 'parameters { key: "TRIDENT_EXECUTION_MODE" value: { string_value: "process" } }'

PROBE_CONFIG = f'''
name: "shm_probe"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }}, {{ name: "VIEW" data_type: TYPE_INT32 dims: [ 2 ] }},
         {{ name: "KEPT" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
{PROCESS}
'''

WORDS_CONFIG = f'''
name: "shm_words"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ -1 ] }}, {{ name: "VIEW" data_type: TYPE_INT32 dims: [ 2 ] }},
         {{ name: "KEPT" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }} ]
{PROCESS}
'''

PROBE_PY = '''
import json
import mmap
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _root(array):
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


class TritonPythonModel:
    """OUT = IN; VIEW = [IN is a view of a mapping, IN is read-only]; KEPT = the sum of the input
    kept by an earlier request with parameter keep=true (-1: none); PID = this process."""

    def initialize(self, args):
        self.kept = None

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if json.loads(request.parameters()).get("keep"):
                self.kept = x  # outlives the request (and, in a test, the region's registration)
            view = np.array([isinstance(_root(x), mmap.mmap), not x.flags.writeable], np.int32)
            kept = -1.0 if self.kept is None else float(np.asarray(self.kept, np.float32).sum())
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", x), pb_utils.Tensor("VIEW", view),
                pb_utils.Tensor("KEPT", np.array([kept], np.float32)),
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
        return out
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo: Path = build_repo(tmp_path_factory.mktemp("shm_isolated"), ["add_sub"], mode="process")
    for name, config in (("shm_probe", PROBE_CONFIG), ("shm_words", WORDS_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(PROBE_PY)
    s = start_server("--allow-client-shm=true", repo=repo, timeout=120)
    yield s
    s.stop()


class Regions:
    """Shared-memory objects made for one test, destroyed at its end."""

    def __init__(self) -> None:
        self.made: dict[str, object] = {}

    def make(self, size: int, data: np.ndarray | None = None, key: str | None = None) -> str:
        key = key or f"/{PREFIX}{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        if data is not None:
            shm.set_shared_memory_region(handle, [data])
        self.made[key] = handle
        return key

    def destroy(self, key: str) -> None:
        shm.destroy_shared_memory_region(self.made.pop(key))

    def close(self) -> None:
        for handle in self.made.values():
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions():
    r = Regions()
    yield r
    r.close()


def _client(server, protocol: str):
    return (httpclient.InferenceServerClient(server.http_url) if protocol == "http"
            else grpcclient.InferenceServerClient(server.grpc_url))


def _probe(c, protocol: str, region: str | None, n: int, offset: int = 0, data: np.ndarray | None = None,
           keep: bool = False, model: str = "shm_probe", datatype: str = "FP32", nbytes: int | None = None):
    module = _CLIENTS[protocol]
    inp = module.InferInput("IN", [n], datatype)
    if region is not None:
        inp.set_shared_memory(region, nbytes if nbytes is not None else 4 * n, offset=offset)
    else:
        assert data is not None
        inp.set_data_from_numpy(data)
    outputs = [module.InferRequestedOutput(name) for name in ("OUT", "VIEW", "KEPT", "PID")]
    return c.infer(model, [inp], outputs=outputs, parameters={"keep": True} if keep else None)


def _pid(result) -> int:
    return int(result.as_numpy("PID")[0])


def _maps(pid: int, keys: list[str] | None = None) -> list[str]:
    """The model process's mappings of this suite's shared-memory objects (of ``keys`` if given)."""
    names = [k.lstrip("/") for k in keys] if keys else [PREFIX]
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if "/dev/shm/" in line and any(n in line for n in names)]


def _fds(pid: int, keys: list[str]) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        count += any(k.lstrip("/") in target for k in keys)
    return count


def _eventually(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("not within the timeout")
        time.sleep(0.1)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("n", [16, 1 << 20])  # 64 bytes, and 4 MiB (more than the model process's ring)
def test_shm_inputs_reach_the_model_process_as_views(server, regions, protocol: str, n: int) -> None:
    data = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    key = regions.make(4 * n + 64, np.concatenate([np.zeros(16, np.float32), data]))
    name = f"v{uuid.uuid4().hex[:8]}"
    c = _client(server, protocol)
    try:
        c.register_system_shared_memory(name, key, 4 * n + 64)
        result = _probe(c, protocol, name, n, offset=64)
        assert np.array_equal(result.as_numpy("OUT"), data)
        assert result.as_numpy("VIEW").tolist() == [1, 1]  # a read-only view of a mapping: not copied
        pid = _pid(result)
        assert pid != server.proc.pid and len(_maps(pid, [key])) == 1
        plain = _probe(c, protocol, None, n, data=data)  # the same values in the request: copied
        assert np.array_equal(plain.as_numpy("OUT"), data)
        assert plain.as_numpy("VIEW").tolist() == [0, 0]
    finally:
        c.unregister_system_shared_memory(name)
        c.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bytes_and_regular_tensors_beside_shm_still_work(server, regions, protocol: str) -> None:
    module = _CLIENTS[protocol]
    words = np.array([b"alpha", b"", "é".encode()], dtype=object)
    blob = serialize_byte_tensor(words).item()
    wkey = regions.make(len(blob), np.frombuffer(blob, np.uint8))
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    akey = regions.make(64, a)
    tag = uuid.uuid4().hex[:8]
    c = _client(server, protocol)
    try:
        c.register_system_shared_memory(f"w{tag}", wkey, len(blob))
        c.register_system_shared_memory(f"a{tag}", akey, 64)
        result = _probe(c, protocol, f"w{tag}", 3, model="shm_words", datatype="BYTES", nbytes=len(blob))
        assert result.as_numpy("OUT").tolist() == words.tolist()
        assert result.as_numpy("VIEW").tolist()[0] == 0  # BYTES are parsed, then copied
        x = module.InferInput("INPUT0", [1, 16], "FP32")
        x.set_shared_memory(f"a{tag}", 64)
        y = module.InferInput("INPUT1", [1, 16], "FP32")
        y.set_data_from_numpy(np.full((1, 16), 10, np.float32))
        summed = c.infer("add_sub", [x, y])  # add_sub runs process-isolated in this repository
        assert np.array_equal(summed.as_numpy("OUTPUT0"), a + 10)
        assert np.array_equal(summed.as_numpy("OUTPUT1"), a - 10)
    finally:
        c.unregister_system_shared_memory(f"w{tag}")
        c.unregister_system_shared_memory(f"a{tag}")
        c.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_region_registered_again_under_its_name_gives_the_new_contents(server, regions, protocol: str) -> None:
    name = f"again{uuid.uuid4().hex[:8]}"
    c = _client(server, protocol)
    try:
        key = regions.make(64, np.full(16, 1, np.float32))
        c.register_system_shared_memory(name, key, 64)
        assert _probe(c, protocol, name, 16).as_numpy("OUT").tolist() == [1] * 16
        c.unregister_system_shared_memory(name)
        regions.destroy(key)
        regions.make(64, np.full(16, 2, np.float32), key=key)  # the same key, a new object
        c.register_system_shared_memory(name, key, 64)
        assert _probe(c, protocol, name, 16).as_numpy("OUT").tolist() == [2] * 16
        c.unregister_system_shared_memory(name)
        other = regions.make(128, np.full(32, 3, np.float32))  # another object, larger
        c.register_system_shared_memory(name, other, 128)
        result = _probe(c, protocol, name, 16, offset=64)
        assert result.as_numpy("OUT").tolist() == [3] * 16 and result.as_numpy("VIEW").tolist() == [1, 1]
    finally:
        c.unregister_system_shared_memory(name)
        c.close()


def test_an_input_kept_by_the_model_outlives_its_region(server, regions) -> None:
    c = _client(server, "http")
    name = f"keep{uuid.uuid4().hex[:8]}"
    key = regions.make(64, np.full(16, 5, np.float32))
    c.register_system_shared_memory(name, key, 64)
    assert _probe(c, "http", name, 16, keep=True).as_numpy("VIEW").tolist() == [1, 1]
    c.unregister_system_shared_memory(name)
    regions.destroy(key)  # unlinked by the client; the model still holds a view
    time.sleep(1.5)  # the model process is told to forget the region meanwhile
    result = _probe(c, "http", None, 1, data=np.zeros(1, np.float32))
    assert result.as_numpy("KEPT").tolist() == [80.0]  # still readable: never unmapped under a view
    result = _probe(c, "http", None, 1, data=np.zeros(1, np.float32), keep=True)  # lets go of it
    _eventually(lambda: not _maps(_pid(result), [key]))
    c.close()


def test_mappings_do_not_grow_with_requests(server, regions) -> None:
    c = _client(server, "http")
    name = f"many{uuid.uuid4().hex[:8]}"
    key = regions.make(4096, np.arange(1024, dtype=np.float32))
    c.register_system_shared_memory(name, key, 4096)
    try:
        pid = _pid(_probe(c, "http", name, 16))
        before = len(_maps(pid))
        for i in range(200):
            result = _probe(c, "http", name, 16, offset=4 * (i % 64))
            assert result.as_numpy("OUT")[0] == i % 64
        assert _pid(result) == pid and len(_maps(pid)) == before
        assert len(_maps(pid, [key])) == 1
    finally:
        c.unregister_system_shared_memory(name)
    cycled = []
    for i in range(30):  # a region per request: each is unmapped once unregistered
        cycled.append(regions.make(64, np.full(16, i, np.float32)))
        c.register_system_shared_memory(f"{name}_{i}", cycled[-1], 64)
        assert _probe(c, "http", f"{name}_{i}", 16).as_numpy("OUT")[0] == i
        c.unregister_system_shared_memory(f"{name}_{i}")
    assert len(_maps(pid, cycled)) <= 2  # each request forgets what was unregistered before it
    _eventually(lambda: not _maps(pid, [key, *cycled]) and not _fds(pid, [key, *cycled]))  # idle: within ~1 s
    c.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_out_of_bounds_shm_inputs_are_refused_and_the_server_keeps_serving(server, regions, protocol: str) -> None:
    name = f"bad{uuid.uuid4().hex[:8]}"
    key = regions.make(64, np.arange(16, dtype=np.float32))
    c = _client(server, protocol)
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    try:
        c.register_system_shared_memory(name, key, 64)
        for offset, n in ((32, 16), (64, 1), (0, 17)):
            with pytest.raises(InferenceServerException) as info:
                _probe(c, protocol, name, n, offset=offset)
            assert str(info.value.status()) == expected
            assert "Invalid offset + byte size for shared memory region" in info.value.message()
        with pytest.raises(InferenceServerException, match="byte size mismatch"):
            _probe(c, protocol, name, 8, nbytes=64)
        result = _probe(c, protocol, name, 8, offset=32)
        assert result.as_numpy("OUT").tolist() == list(range(8, 16)) and result.as_numpy("VIEW").tolist() == [1, 1]
    finally:
        c.unregister_system_shared_memory(name)
        c.close()


def test_a_restarted_model_process_maps_regions_afresh(server, regions) -> None:
    c = _client(server, "http")
    name = f"restart{uuid.uuid4().hex[:8]}"
    key = regions.make(64, np.full(16, 7, np.float32))
    c.register_system_shared_memory(name, key, 64)
    try:
        before = _pid(_probe(c, "http", name, 16))
        os.kill(before, signal.SIGKILL)
        after = [before]

        def restarted() -> bool:
            try:
                after[0] = _pid(_probe(c, "http", None, 1, data=np.zeros(1, np.float32)))
            except InferenceServerException:  # the request the dead process was given
                return False
            return after[0] != before

        _eventually(restarted, timeout=30)
        result = _probe(c, "http", name, 16)
        assert _pid(result) == after[0] and result.as_numpy("OUT").tolist() == [7] * 16
        assert result.as_numpy("VIEW").tolist() == [1, 1] and len(_maps(after[0], [key])) == 1
    finally:
        c.unregister_system_shared_memory(name)
        c.close()
