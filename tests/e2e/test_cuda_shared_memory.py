"""CUDA shared memory (issue [13], item 3) with tritonclient.utils.cuda_shared_memory, over HTTP
and gRPC, against a real server in another process (a CUDA IPC handle cannot be opened in the
process that made it).

The GPU tests need a CUDA device, cuda-python and torch with CUDA; on a host without them they
are skipped with the reason "no GPU: ...". The last test is the other way round: on a host
without a GPU, registration answers UNSUPPORTED naming what is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.e2e.conftest import start_server
from tests.e2e.models import DATATYPES, write_identity
from tests.e2e.test_shared_memory import (
    _CLIENTS,
    PROTOCOLS,
    _client,
    _error,
    _raw,
    _sample,
    infer_with_aio_clients,
    read_while_unregistering,
)
from tests.e2e.test_shared_memory import _GRPC as _SYSTEM_GRPC
from tests.unit.backends.test_device_inputs import NO_GPU as NO_CUDA


def _no_gpu() -> str | None:
    """Why the GPU tests cannot run here, or None."""
    if NO_CUDA is not None:
        return NO_CUDA
    try:
        import torch
    except ImportError:
        return "no GPU: torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU: torch has no CUDA"
    return None


NO_GPU = _no_gpu()
gpu = pytest.mark.skipif(NO_GPU is not None, reason=NO_GPU or "")
_GRPC = {**_SYSTEM_GRPC, "409": "StatusCode.ALREADY_EXISTS"}
_REFUSED = "failed to register shared memory region: invalid args"

# adds 1 to its input in place, then answers (input + 1) * 2: on a GPU instance the input is the
# client's CUDA memory itself, so the client sees the change; on a CPU instance it is a host copy
TORCH_CONFIG = '''
name: "{name}"
backend: "pytorch"
max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: {kind} }} ]
'''


def _write_torch(repo: Path, name: str, kind: str) -> None:
    import torch

    class InPlace(torch.nn.Module):
        def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:  # noqa: N803 (Triton's input name)
            INPUT__0.add_(1.0)
            return INPUT__0 * 2.0

    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(TORCH_CONFIG.format(name=name, kind=kind))
    torch.jit.script(InPlace()).save(str(repo / name / "1" / "model.pt"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    if NO_GPU is not None:
        pytest.skip(NO_GPU)
    from trident.options import EXAMPLE_REPOSITORY

    repo: Path = tmp_path_factory.mktemp("cudashm")
    for dt in DATATYPES:
        write_identity(repo, dt)
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub")
    _write_torch(repo, "torch_gpu", "KIND_GPU")
    _write_torch(repo, "torch_cpu", "KIND_CPU")
    s = start_server("--allow-client-shm=true", repo=repo, timeout=180.0)
    yield s
    s.stop()


class CudaRegions:
    """CUDA allocations made for one test (tritonclient's helper), freed at its end."""

    def __init__(self) -> None:
        import tritonclient.utils.cuda_shared_memory as cudashm

        self.cudashm = cudashm
        self.made: list[object] = []

    def make(self, size: int, data: np.ndarray | None = None) -> tuple[object, bytes]:
        handle = self.cudashm.create_shared_memory_region(f"t{uuid.uuid4().hex[:8]}", size, 0)
        self.made.append(handle)
        if data is not None:
            self.cudashm.set_shared_memory_region(handle, [data])
        return handle, self.cudashm.get_raw_handle(handle)

    def read(self, handle: object, dtype: type, shape: list[int]) -> np.ndarray:
        return self.cudashm.get_contents_as_numpy(handle, dtype, shape)

    def close(self) -> None:
        for handle in self.made:
            self.cudashm.destroy_shared_memory_region(handle)


@pytest.fixture
def cuda_regions():
    r = CudaRegions()
    yield r
    r.close()


@gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("dt", DATATYPES)
def test_every_datatype_in_and_out_of_cuda_shared_memory(server, cuda_regions, protocol: str, dt: str) -> None:
    x = _sample(dt)
    data = _raw(x, dt)
    in_handle, in_raw = cuda_regions.make(len(data), np.frombuffer(data, np.uint8))
    out_handle, out_raw = cuda_regions.make(len(data))
    mod = _CLIENTS[protocol]
    model = f"identity_{dt.lower()}"
    tag = uuid.uuid4().hex[:8]
    with _client(server, protocol) as c:
        c.register_cuda_shared_memory(f"in{tag}", in_raw, 0, len(data))
        c.register_cuda_shared_memory(f"out{tag}", out_raw, 0, len(data))
        try:
            inp = mod.InferInput("INPUT0", list(x.shape), dt)
            inp.set_shared_memory(f"in{tag}", len(data))
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(f"out{tag}", len(data))
            result = c.infer(model, [inp], outputs=[out])  # both in CUDA shared memory
            entry = result.get_output("OUTPUT0")
            assert entry is not None
            assert bytes(cuda_regions.read(out_handle, np.uint8, [len(data)])) == data
            only_in = c.infer(model, [inp]).as_numpy("OUTPUT0")  # the output comes back in the response
            if dt == "BF16":
                only_in = only_in.view(np.uint16)
            np.testing.assert_array_equal(only_in, x)
        finally:
            c.unregister_cuda_shared_memory(f"in{tag}")
            c.unregister_cuda_shared_memory(f"out{tag}")


@gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_registry_answers_as_triton(server, cuda_regions, protocol: str, tmp_path: Path) -> None:
    x = np.arange(16, dtype=np.float32)
    handle, raw = cuda_regions.make(x.nbytes, x)
    _, small_raw = cuda_regions.make(64)
    tag = uuid.uuid4().hex[:8]
    name = f"c{tag}"
    key = f"/trident_cudatest_{tag}"
    sys_handle = shm.create_shared_memory_region(key[1:], key, 64)
    mod = _CLIENTS[protocol]
    with _client(server, protocol) as c:
        c.register_cuda_shared_memory(name, raw, 0, x.nbytes)
        c.register_system_shared_memory(f"s{tag}", key, 64)
        try:
            for call, code, text in (
                    (lambda: c.register_cuda_shared_memory(name, raw, 0, x.nbytes), "409",
                     f"shared memory region '{name}' already in manager"),
                    (lambda: c.register_system_shared_memory(name, key, 64), "409",  # one namespace
                     f"shared memory region '{name}' already in manager"),
                    (lambda: c.register_cuda_shared_memory(f"s{tag}", raw, 0, x.nbytes), "409",
                     f"shared memory region 's{tag}' already in manager"),
                    (lambda: c.register_cuda_shared_memory(f"g{tag}", _garbage_handle(), 0, 64), "400", _REFUSED),
                    (lambda: c.register_cuda_shared_memory(f"d{tag}", raw, 99, x.nbytes), "400", _REFUSED),
                    (lambda: c.register_cuda_shared_memory(f"b{tag}", small_raw, 0, 1 << 20), "400",  # beyond it
                     f"failed to register shared memory region 'b{tag}': invalid args"),
                    (lambda: c.get_cuda_shared_memory_status("nope"), "404",
                     "Unable to find cuda shared memory region: 'nope'"),
                    (lambda: c.get_cuda_shared_memory_status(f"s{tag}"), "404",
                     f"The region named 's{tag}' is registered as system shared memory, not CUDA shared memory"),
                    (lambda: c.get_system_shared_memory_status(name), "404",
                     f"The region named '{name}' is registered as CUDA shared memory, not system shared memory")):
                got_status, got_message = _error(call)
                assert got_message == text
                # ALREADY_EXISTS is 400 over HTTP, as in Triton
                assert got_status == ({"409": "400"}.get(code, code) if protocol == "http" else _GRPC[code])
            one = c.get_cuda_shared_memory_status(name)
            if protocol == "http":
                assert one == [{"name": name, "device_id": 0, "byte_size": x.nbytes}]
                assert name in [r["name"] for r in c.get_cuda_shared_memory_status()]
            else:
                assert one.regions[name].device_id == 0 and one.regions[name].byte_size == x.nbytes
                assert name in c.get_cuda_shared_memory_status().regions
            # bad tensors: a range beyond the region, a byte size that does not fit the shape
            inp = mod.InferInput("INPUT0", [16], "FP32")
            inp.set_shared_memory(name, x.nbytes, offset=8)
            assert "Invalid offset + byte size for shared memory region" in _error(
                lambda: c.infer("identity_fp32", [inp]))[1]
            inp = mod.InferInput("INPUT0", [16], "FP32")
            inp.set_shared_memory(name, 32)
            assert "input byte size mismatch for input 'INPUT0'" in _error(lambda: c.infer("identity_fp32", [inp]))[1]
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(name, 16)  # too small for the output: the region is left untouched
            inp = mod.InferInput("INPUT0", [16], "FP32")
            inp.set_data_from_numpy(np.full(16, 7, np.float32))
            _error(lambda: c.infer("identity_fp32", [inp], outputs=[out]))
            np.testing.assert_array_equal(cuda_regions.read(handle, np.float32, [16]), x)
            c.unregister_cuda_shared_memory("not_registered")  # as Triton: OK
            c.unregister_cuda_shared_memory(name)
            assert "Unable to find cuda shared memory region" in _error(
                lambda: c.get_cuda_shared_memory_status(name))[1]
            assert c.is_server_live()
        finally:
            c.unregister_cuda_shared_memory()
            c.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(sys_handle)


def _garbage_handle() -> bytes:
    import base64

    return base64.b64encode(bytes(range(64)))


@gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_gpu_model_reads_the_client_memory_and_a_cpu_model_a_copy(server, cuda_regions, protocol: str) -> None:
    n = 256 * 1024  # 1 MiB of FP32
    x = np.arange(n, dtype=np.float32)
    mod = _CLIENTS[protocol]
    tag = uuid.uuid4().hex[:8]
    with _client(server, protocol) as c:
        for model, changed in (("torch_gpu", True), ("torch_cpu", False)):
            in_handle, in_raw = cuda_regions.make(x.nbytes, x)
            out_handle, out_raw = cuda_regions.make(x.nbytes)
            c.register_cuda_shared_memory(f"i{model}{tag}", in_raw, 0, x.nbytes)
            c.register_cuda_shared_memory(f"o{model}{tag}", out_raw, 0, x.nbytes)
            inp = mod.InferInput("INPUT__0", [1, n], "FP32")
            inp.set_shared_memory(f"i{model}{tag}", x.nbytes)
            out = mod.InferRequestedOutput("OUTPUT__0")
            out.set_shared_memory(f"o{model}{tag}", x.nbytes)
            c.infer(model, [inp], outputs=[out])
            np.testing.assert_array_equal(cuda_regions.read(out_handle, np.float32, [n]), (x + 1) * 2)
            seen = cuda_regions.read(in_handle, np.float32, [n])
            np.testing.assert_array_equal(seen, x + 1 if changed else x)
            c.unregister_cuda_shared_memory(f"i{model}{tag}")
            c.unregister_cuda_shared_memory(f"o{model}{tag}")


@gpu
def test_cuda_system_and_request_tensors_mixed_over_many_regions(server, cuda_regions) -> None:
    tag = uuid.uuid4().hex[:8]
    key = f"/trident_cudamix_{tag}"
    sys_handle = shm.create_shared_memory_region(key[1:], key, 64 * 20)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        try:
            out_handle, out_raw = cuda_regions.make(64)
            c.register_cuda_shared_memory(f"out{tag}", out_raw, 0, 64)
            c.register_system_shared_memory(f"sys{tag}", key, 64 * 20)
            for i in range(20):
                a = np.full(16, i, np.float32)
                b = np.arange(16, dtype=np.float32)
                _, raw = cuda_regions.make(64, a)
                c.register_cuda_shared_memory(f"a{i}{tag}", raw, 0, 64)
                shm.set_shared_memory_region(sys_handle, [b], offset=64 * i)
                in0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
                in0.set_shared_memory(f"a{i}{tag}", 64)
                in1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
                in1.set_shared_memory(f"sys{tag}", 64, offset=64 * i)
                o0 = grpcclient.InferRequestedOutput("OUTPUT0")
                o0.set_shared_memory(f"out{tag}", 64)  # reused by every request
                result = c.infer("add_sub", [in0, in1], outputs=[o0, grpcclient.InferRequestedOutput("OUTPUT1")])
                np.testing.assert_array_equal(cuda_regions.read(out_handle, np.float32, [16]), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1").reshape(-1), a - b)
            assert len(c.get_cuda_shared_memory_status().regions) >= 21
        finally:
            c.unregister_cuda_shared_memory()
            c.unregister_system_shared_memory()
            shm.destroy_shared_memory_region(sys_handle)


@gpu
def test_unregister_while_requests_read_the_region(server, cuda_regions) -> None:
    """Unregistering forgets the name at once; a request already holding the client's memory
    keeps it open until it is done (no crash, the right answers)."""
    x = np.arange(1024 * 1024, dtype=np.float32)
    _, raw = cuda_regions.make(x.nbytes, x)
    tag = uuid.uuid4().hex[:8]
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.register_cuda_shared_memory(f"big{tag}", raw, 0, x.nbytes)
        read_while_unregistering(server, f"big{tag}", x, lambda: c.unregister_cuda_shared_memory(f"big{tag}"))


@gpu
def test_aio_clients(server, cuda_regions) -> None:
    _, raw = cuda_regions.make(64, np.arange(16, dtype=np.float32))
    name = f"a{uuid.uuid4().hex[:8]}"
    infer_with_aio_clients(server, name, lambda c: c.register_cuda_shared_memory(name, raw, 0, 64),
                           lambda c: c.unregister_cuda_shared_memory(name))


@gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_trident_perf_with_cuda_shared_memory(server, protocol: str) -> None:
    url = server.http_url if protocol == "http" else server.grpc_url
    p = subprocess.run([sys.executable, "-m", "trident", "perf", "-m", "identity_fp32", "-i", protocol, "-u", url,
                        "--shape", "INPUT0:4,4", "--shared-memory", "cuda", "-p", "200", "-r", "3", "-s", "1000"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Using cuda shared memory" in p.stdout and "Throughput" in p.stdout
    with grpcclient.InferenceServerClient(server.grpc_url) as c:  # perf unregistered its regions
        assert not [n for n in c.get_cuda_shared_memory_status().regions if n.startswith("trident_perf_")]
        stats = c.get_inference_statistics("identity_fp32", as_json=True)["model_stats"][0]["inference_stats"]
        assert int(stats["success"]["count"]) > 0 and int(stats.get("fail", {}).get("count", 0)) == 0


@pytest.mark.skipif(NO_GPU is None, reason="this host has a GPU: the GPU tests above cover registration")
def test_without_a_gpu_registration_names_what_is_missing(tmp_path: Path) -> None:
    write_identity(tmp_path, "FP32")
    s = start_server("--allow-client-shm=true", repo=tmp_path)
    try:
        import base64

        raw = base64.b64encode(bytes(64))
        with httpclient.InferenceServerClient(s.http_url) as c:
            status, text = _error(lambda: c.register_cuda_shared_memory("r", raw, 0, 64))
            assert status == "501" and text.startswith("CUDA shared memory needs "), text
            assert c.get_cuda_shared_memory_status() == []
            c.unregister_cuda_shared_memory()
            status, text = _error(lambda: c.register_cuda_shared_memory("r", base64.b64encode(bytes(8)), 0, 64))
            assert status == "400" and text == _REFUSED  # a malformed handle first, as Triton
        with grpcclient.InferenceServerClient(s.grpc_url) as c:
            status, text = _error(lambda: c.register_cuda_shared_memory("r", raw, 0, 64))
            assert status == "StatusCode.UNIMPLEMENTED" and text.startswith("CUDA shared memory needs "), text
            assert not c.get_cuda_shared_memory_status().regions
            assert c.is_server_live()
    finally:
        s.stop()
