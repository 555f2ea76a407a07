"""Triton's in-process Python API over trident (``trident.tritonserver``) and its front ends
(``trident.tritonfrontend``): driven from plain threads, from asyncio inside a running loop and
from trio; decoupled streaming and cancellation that reaches the model; tritonclient against the
front ends while the same process infers in-process; Triton's documented examples, written here
from their documentation, run with the import lines changed; and bad input, after which nothing
is left running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.python_models import write_model
from tritonclient.utils import InferenceServerException

import trident.tritonserver as tritonserver
from trident.options import EXAMPLE_REPOSITORY
from trident.tritonfrontend import Feature, FeatureGroup, KServeGrpc, KServeHttp, Metrics, RestrictedFeatures

# the tutorial's identity model: every <type>_input [-1, -1] comes back as <type>_output, and
# output_parameters holds the request's parameters as JSON
IDENTITY = ('''
name: "identity"
backend: "python"
max_batch_size: 0
input [
  { name: "string_input" data_type: TYPE_STRING dims: [ -1, -1 ] optional: true },
  { name: "fp16_input" data_type: TYPE_FP16 dims: [ -1, -1 ] optional: true },
  { name: "bool_input" data_type: TYPE_BOOL dims: [ -1, -1 ] optional: true },
  { name: "fp32_input" data_type: TYPE_FP32 dims: [ -1, -1 ] optional: true }
]
output [
  { name: "string_output" data_type: TYPE_STRING dims: [ -1, -1 ] },
  { name: "fp16_output" data_type: TYPE_FP16 dims: [ -1, -1 ] },
  { name: "bool_output" data_type: TYPE_BOOL dims: [ -1, -1 ] },
  { name: "fp32_output" data_type: TYPE_FP32 dims: [ -1, -1 ] },
  { name: "output_parameters" data_type: TYPE_STRING dims: [ 1 ] }
]
''', '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = [pb_utils.Tensor("output_parameters", np.array([request.parameters()], dtype=object))]
            for kind in ("string", "fp16", "bool", "fp32"):
                tensor = pb_utils.get_input_tensor_by_name(request, kind + "_input")
                if tensor is not None:
                    outputs.append(pb_utils.Tensor(kind + "_output", tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
''')

# tritonfrontend's example model: BYTES INPUT0 comes back as OUTPUT0 ({batch} and {dims} vary)
BYTES_IDENTITY = ('''
name: "identity"
backend: "python"
max_batch_size: {batch}
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
''', '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
''')

# one response per request, after X[0] seconds or as soon as it sees is_cancelled() (Y = 1 then)
SLOW = ('''
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
''', '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            deadline = time.monotonic() + float(x[0])
            while time.monotonic() < deadline and not r.is_cancelled():
                time.sleep(0.005)
            y = np.array([1.0 if r.is_cancelled() else 0.0], np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
''')

FAILS_TO_LOAD = ('''
name: "broken"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
''', '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model does not load")
''')

# writes "finalized" to the file its config's "marker" parameter names when it is unloaded
FINALIZER = ('''
name: "finalizer"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "marker" value: { string_value: "{marker}" } }
''', '''
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = json.loads(args["model_config"])["parameters"]["marker"]["string_value"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]

    def finalize(self):
        with open(self.marker, "w") as f:
            f.write("finalized")
''')

DELAY = 0.05  # seconds between two responses of the repeater


def _write(root: Path, name: str, model: tuple[str, str], **fmt: object) -> None:
    config, code = model
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    for key, value in fmt.items():
        config = config.replace("{" + key + "}", str(value))
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tritonserver-api")
    for name in ("identity_fp32", "add_sub", "bytes_echo"):
        shutil.copytree(EXAMPLE_REPOSITORY / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    _write(root, "identity", IDENTITY)
    _write(root, "slow", SLOW)
    write_model(root, "repeater")
    return root


@pytest.fixture(scope="module")
def server(repo: Path):
    s = tritonserver.Server(model_repository=str(repo), exit_timeout=5).start(wait_until_ready=True)
    yield s
    s.stop()


def _server_threads() -> set[threading.Thread]:
    """The in-process servers' threads (the module's server has one throughout)."""
    return {t for t in threading.enumerate() if t.name == "trident-tritonserver"}


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was not written")
        time.sleep(0.02)
    return path.read_text()


def _repeat(count: int, delay: float = DELAY) -> dict[str, np.ndarray]:
    return {"IN": np.array([count], np.int32), "DELAY": np.array([delay], np.float32)}


# ---- Triton's documented examples, run as scripts with the import lines changed ---------------

IMPORTS = {"import tritonserver": "import trident.tritonserver as tritonserver",
           "from tritonfrontend import": "from trident.tritonfrontend import"}

# Triton_Inference_Server_Python_API/README.md (tutorials): "Hello World"
HELLO_WORLD = '''
import tritonserver

server = tritonserver.Server(model_repository="/workspace/identity-models")
server.start()

server.models()

model = server.model("identity")
responses = model.infer(inputs={"string_input":[["hello world!"]]})

for response in responses:
    print(response.outputs["string_output"].to_string_array())
'''

# docs/customization_guide/tritonfrontend.md: steps 1 to 3
FRONTEND_STEPS = '''
import tritonserver

# Constructing path to Model Repository
model_path = f"server/src/python/examples/example_model_repository"

server_options = tritonserver.Options(
    server_id="ExampleServer",
    model_repository=model_path,
    log_error=True,
    log_warn=True,
    log_info=True,
)
server = tritonserver.Server(server_options).start(wait_until_ready=True)

from tritonfrontend import KServeHttp, KServeGrpc, Metrics
http_options = KServeHttp.Options(thread_count=5)
http_service = KServeHttp(server, http_options)
http_service.start()

# Default options (if none provided)
grpc_service = KServeGrpc(server)
grpc_service.start()

# Can start metrics service as well
metrics_service = Metrics(server)
metrics_service.start()

import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
import numpy as np # Use version numpy < 2
model_name = "identity" # output == input
url = "localhost:8000"

# Create a Triton client
client = httpclient.InferenceServerClient(url=url)

# Prepare input data
input_data = np.array([["Roger Roger"]], dtype=object)

# Create input and output objects
inputs = [httpclient.InferInput("INPUT0", input_data.shape, "BYTES")]

# Set the data for the input tensor
inputs[0].set_data_from_numpy(input_data)

results = client.infer(model_name, inputs=inputs)

# Get the output data
output_data = results.as_numpy("OUTPUT0")

# Print results
print("[INFERENCE RESULTS]")
print("Output data:", output_data)

# Stop respective services and server.
metrics_service.stop()
http_service.stop()
grpc_service.stop()
server.stop()
'''

# docs/customization_guide/tritonfrontend.md: step 1, then the context-manager form of 2 and 3
FRONTEND_WITH = FRONTEND_STEPS[:FRONTEND_STEPS.index("from tritonfrontend")] + '''
from tritonfrontend import KServeHttp
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
import numpy as np  # Use version numpy < 2

with KServeHttp(server) as http_service:
    # The identity model returns an exact duplicate of the input data as output
    model_name = "identity"
    url = "localhost:8000"
    # Create a Triton client
    with httpclient.InferenceServerClient(url=url) as client:
        # Prepare input data
        input_data = np.array(["Roger Roger"], dtype=object)
        # Create input and output objects
        inputs = [httpclient.InferInput("INPUT0", input_data.shape, "BYTES")]
        # Set the data for the input tensor
        inputs[0].set_data_from_numpy(input_data)
        # Perform inference
        results = client.infer(model_name, inputs=inputs)
        # Get the output data
        output_data = results.as_numpy("OUTPUT0")
        # Print results
        print("[INFERENCE RESULTS]")
        print("Output data:", output_data)

server.stop()
'''


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _run_example(source: str, changes: dict[str, str], cwd: Path) -> str:
    """Run ``source`` as a script with the import lines (and ``changes``) replaced; its stdout."""
    for old, new in IMPORTS.items():
        source = source.replace(old, new)
    for old, new in changes.items():
        assert old in source, old
        source = source.replace(old, new)
    done = subprocess.run([sys.executable, "-c", source], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _ports(source: str) -> dict[str, str]:
    """The examples listen on Triton's ports 8000-8002: kept when those are free here, else
    moved to free ones (the only other change to the examples)."""
    if all(_free(p) for p in (8000, 8001, 8002)):
        return {}
    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    http, grpc, metrics = ports
    moved = {'url = "localhost:8000"': f'url = "localhost:{http}"',
             "KServeHttp.Options(thread_count=5)": f"KServeHttp.Options(thread_count=5, port={http})",
             "KServeGrpc(server)": f"KServeGrpc(server, KServeGrpc.Options(port={grpc}))",
             "Metrics(server)": f"Metrics(server, Metrics.Options(port={metrics}))",
             "KServeHttp(server) as": f"KServeHttp(server, KServeHttp.Options(port={http})) as"}
    return {old: new for old, new in moved.items() if old in source}


def test_hello_world_example_runs(tmp_path: Path) -> None:
    """The tutorial's Hello World: start, list the models, infer a string, print it back (the
    script exits without stop(): the server is stopped at interpreter exit)."""
    models = tmp_path / "identity-models"
    _write(models, "identity", IDENTITY)
    out = _run_example(HELLO_WORLD, {"/workspace/identity-models": str(models)}, tmp_path)
    assert out.strip() == "[['hello world!']]"


def test_interpreter_exit_stops_the_server(tmp_path: Path) -> None:
    """A program that never calls stop(): at exit the server drains, unloads its models (their
    finalize() runs) and its thread ends, and the program exits."""
    repo = tmp_path / "repo"
    _write(repo, "finalizer", FINALIZER, marker=str(tmp_path / "marker"))
    script = "\n".join([
        "import numpy as np",
        "import trident.tritonserver as tritonserver",
        f"server = tritonserver.Server(model_repository={str(repo)!r}).start(wait_until_ready=True)",
        'responses = server.model("finalizer").infer(inputs={"X": np.ones(1, np.float32)})',
        'print(np.from_dlpack(next(responses).outputs["Y"]).tolist())',
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == "[1.0]"
    assert (tmp_path / "marker").read_text() == "finalized"


def test_tritonfrontend_example_runs(tmp_path: Path) -> None:
    """tritonfrontend's guide: HTTP, gRPC and metrics front ends over the in-process server,
    tritonclient's HTTP request through them, then everything stopped."""
    models = tmp_path / "server/src/python/examples/example_model_repository"
    _write(models, "identity", BYTES_IDENTITY, batch=8)
    out = _run_example(FRONTEND_STEPS, _ports(FRONTEND_STEPS), tmp_path)
    assert out.splitlines() == ["[INFERENCE RESULTS]", "Output data: [[b'Roger Roger']]"]


def test_tritonfrontend_context_manager_example_runs(tmp_path: Path) -> None:
    models = tmp_path / "server/src/python/examples/example_model_repository"
    _write(models, "identity", BYTES_IDENTITY, batch=0)
    out = _run_example(FRONTEND_WITH, _ports(FRONTEND_WITH), tmp_path)
    assert out.splitlines() == ["[INFERENCE RESULTS]", "Output data: [b'Roger Roger']"]


def test_the_api_docstring_examples(server: tritonserver.Server) -> None:
    """InferenceRequest's documented examples (an explicit request, and inputs given to infer),
    against this repository's identity model; and the model listing's documented shape."""
    import numpy

    request = server.model("identity").create_request()
    request.inputs["fp16_input"] = numpy.array([[1.0]]).astype(numpy.float16)
    printed = [numpy.from_dlpack(response.outputs["fp16_output"]) for response in server.model("identity").infer(request)]
    assert [a.tolist() for a in printed] == [[[1.0]]]
    for response in server.model("identity").infer(inputs={"fp16_input": numpy.array([[1.0]]).astype(numpy.float16)}):
        assert numpy.from_dlpack(response.outputs["fp16_output"]).tolist() == [[1.0]]
    assert str(server.models()[("identity", 1)]) == "{'name': 'identity', 'version': 1, 'state': 'READY'}"
    assert str(server.models()["identity"]) == "{'name': 'identity', 'version': -1, 'state': None}"


# ---- plain threads -------------------------------------------------------------------------


def test_sync_inference_with_numpy_lists_tensors_and_torch(server: tritonserver.Server) -> None:
    model = server.model("identity")
    fp16 = np.random.rand(1, 100).astype(np.float16)
    flags = np.random.rand(1, 100) > 0.5
    responses = list(model.infer(inputs={"fp16_input": fp16, "bool_input": flags, "string_input": [["hé", "x"]]},
                                 parameters={"int": 0, "float": 0.5, "bool": False, "str": "test"},
                                 request_id="r-1"))
    assert len(responses) == 1 and responses[0].final and responses[0].error is None
    r = responses[0]
    assert r.request_id == "r-1" and r.model.name == "identity" and r.model.version == 1
    np.testing.assert_array_equal(np.from_dlpack(r.outputs["fp16_output"]), fp16)
    np.testing.assert_array_equal(np.from_dlpack(r.outputs["bool_output"]), flags)
    assert r.outputs["string_output"].to_string_array().tolist() == [["hé", "x"]]
    assert r.outputs["string_output"].to_bytes_array().tolist() == [["hé".encode(), b"x"]]
    assert r.outputs["fp16_output"].data_type == tritonserver.DataType.FP16
    assert r.outputs["string_output"].data_type == tritonserver.DataType.BYTES
    assert json.loads(r.outputs["output_parameters"].to_string_array()[0]) == {
        "int": 0, "float": 0.5, "bool": False, "str": "test"}
    # torch in (a CPU tensor as the input, and through Tensor.from_dlpack), torch out, zero copy out
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for given in (x, tritonserver.Tensor.from_dlpack(x)):
        (r,) = model.infer(inputs={"fp32_input": given})
        out = torch.from_dlpack(r.outputs["fp32_output"])
        assert torch.equal(out, x)
        assert out.data_ptr() == r.outputs["fp32_output"].data_ptr
    # a batching model, input lists of lists of floats made FP32 by numpy
    (r,) = server.model("add_sub").infer(inputs={"INPUT0": np.ones((2, 16), np.float32),
                                                 "INPUT1": np.full((2, 16), 2, np.float32)})
    assert np.from_dlpack(r.outputs["OUTPUT0"]).tolist() == [[3.0] * 16] * 2
    assert np.from_dlpack(r.outputs["OUTPUT1"]).tolist() == [[-1.0] * 16] * 2


def test_model_and_server_queries(server: tritonserver.Server) -> None:
    assert server.live() and server.ready()
    meta = server.metadata()
    assert meta["name"] == "triton" and "model_repository" in meta["extensions"]
    models = server.models()
    assert ("identity_fp32", 1) in models and models[("identity_fp32", 1)].state == "READY"
    with pytest.raises(KeyError, match="Unknown Model"):
        models["nope"]
    model = server.model("identity_fp32")
    assert model.ready() and not server.model("nope").ready()
    assert model.metadata() == {"name": "identity_fp32", "versions": ["1"], "platform": "python",
                                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
                                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}]}
    assert model.config()["max_batch_size"] == 0 and model.config()["backend"] == "python"
    assert model.batch_properties() == tritonserver.ModelBatchFlag.UNKNOWN
    assert server.model("add_sub").batch_properties() == tritonserver.ModelBatchFlag.FIRST_DIM
    assert model.transaction_properties() == tritonserver.ModelTxnPropertyFlag.ONE_TO_ONE
    assert server.model("repeater").transaction_properties() == tritonserver.ModelTxnPropertyFlag.DECOUPLED
    before = model.statistics()["model_stats"][0]["inference_count"]
    list(model.infer(inputs={"INPUT0": np.ones(4, np.float32)}))
    assert model.statistics()["model_stats"][0]["inference_count"] == before + 1
    assert 'nv_inference_count{model="identity_fp32",version="1"}' in server.metrics()
    with pytest.raises(tritonserver.NotFoundError):
        server.model("nope").metadata()
    with pytest.raises(tritonserver.InvalidArgumentError):
        model.config(config_version=2)


def test_threads_share_one_server(server: tritonserver.Server) -> None:
    results: dict[int, list[float]] = {}

    def worker(i: int) -> None:
        model = server.model("identity_fp32")
        results[i] = [float(np.from_dlpack(r.outputs["OUTPUT0"])[0])
                      for _ in range(10) for r in model.infer(inputs={"INPUT0": np.full(3, i, np.float32)})]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: [float(i)] * 10 for i in range(8)}


def test_response_queue_gets_every_response(server: tritonserver.Server) -> None:
    responses: queue.SimpleQueue = queue.SimpleQueue()
    iterators = [server.model("identity_fp32").infer(inputs={"INPUT0": np.full(2, i, np.float32)},
                                                     response_queue=responses) for i in range(2)]
    got = sorted(float(np.from_dlpack(responses.get(timeout=30).outputs["OUTPUT0"])[0]) for _ in range(2))
    assert got == [0.0, 1.0]
    for i, iterator in enumerate(iterators):
        assert [float(np.from_dlpack(r.outputs["OUTPUT0"])[0]) for r in iterator] == [float(i)]
    assert responses.empty()


# ---- decoupled streaming and cancellation -----------------------------------------------------


def test_decoupled_model_streams_its_responses(server: tritonserver.Server) -> None:
    responses = list(server.model("repeater").infer(inputs=_repeat(5, 0.0)))
    assert [int(np.from_dlpack(r.outputs["OUT"])[0]) for r in responses if r.outputs] == [0, 1, 2, 3, 4]
    assert [r.final for r in responses] == [False] * 5 + [True]
    assert responses[-1].outputs == {}  # the final flag alone, as Triton sends it


def test_breaking_out_of_the_stream_cancels_the_request(server: tritonserver.Server, tmp_path: Path) -> None:
    received = []
    for response in server.model("repeater").infer(inputs=_repeat(1000), request_id="broken-off",
                                                   parameters={"marker": str(tmp_path)}):
        received.append(int(np.from_dlpack(response.outputs["OUT"])[0]))
        if len(received) == 3:
            break  # the temporary iterator is dropped: its request is cancelled
    stopped = int(_wait_for(tmp_path / "broken-off.stopped"))
    assert received == [0, 1, 2] and 3 <= stopped < 50  # far before the 1000 asked for


def test_close_and_cancel_reach_the_model(server: tritonserver.Server, tmp_path: Path) -> None:
    model = server.model("repeater")
    with model.infer(inputs=_repeat(1000), request_id="closed", parameters={"marker": str(tmp_path)}) as responses:
        assert not next(responses).final
    assert int(_wait_for(tmp_path / "closed.stopped")) < 50
    with pytest.raises(StopIteration):
        next(responses)
    responses = model.infer(inputs=_repeat(1000), request_id="cancelled", parameters={"marker": str(tmp_path)})
    assert not next(responses).final
    responses.cancel()
    with pytest.raises(tritonserver.UnknownError, match="cancelled"):
        for _ in responses:
            pass
    assert int(_wait_for(tmp_path / "cancelled.stopped")) < 50
    # a one-to-one model: cancelled from another thread while it runs, it sees is_cancelled()
    responses = server.model("slow").infer(inputs={"X": np.array([30.0], np.float32)}, raise_on_error=False)
    threading.Timer(0.5, responses.cancel).start()
    started = time.monotonic()
    (last,) = list(responses)
    assert isinstance(last.error, tritonserver.UnknownError) and last.final
    assert time.monotonic() - started < 10


# ---- asyncio, inside a running loop ----------------------------------------------------------


def test_asyncio_programs_await_without_blocking_their_loop(server: tritonserver.Server, tmp_path: Path) -> None:
    async def main() -> None:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        model = server.model("identity_fp32")

        async def one(i: int) -> float:
            async for response in model.async_infer(inputs={"INPUT0": np.full(4, i, np.float32)}):
                return float(np.from_dlpack(response.outputs["OUTPUT0"])[0])
            raise AssertionError("no response")

        assert await asyncio.gather(*(one(i) for i in range(20))) == [float(i) for i in range(20)]
        # a stream of a decoupled model, each response as it comes
        seen = [int(np.from_dlpack(r.outputs["OUT"])[0]) async for r in server.model("repeater").async_infer(
            inputs=_repeat(4, 0.01)) if r.outputs]
        assert seen == [0, 1, 2, 3]
        # response_queue (an asyncio.Queue) gets them too
        responses: asyncio.Queue = asyncio.Queue()
        iterator = model.async_infer(inputs={"INPUT0": np.ones(1, np.float32)}, response_queue=responses)
        assert (await asyncio.wait_for(responses.get(), 30)).final
        assert [r.final async for r in iterator] == [True]
        # errors: raised, or in the response with raise_on_error=False; an unknown model either way
        with pytest.raises(tritonserver.InvalidArgumentError, match="FP32"):
            async for _ in model.async_infer(inputs={"INPUT0": np.ones(1, np.int32)}):
                pass
        (response,) = [r async for r in model.async_infer(inputs={"INPUT0": np.ones(1, np.int32)},
                                                          raise_on_error=False)]
        assert isinstance(response.error, tritonserver.InvalidArgumentError) and response.final
        with pytest.raises(tritonserver.NotFoundError):
            async for _ in server.model("nope").async_infer(inputs={"INPUT0": np.ones(1, np.float32)},
                                                            raise_on_error=False):
                pass
        # cancelling the task that awaits the next response cancels the request in the server
        stream = server.model("repeater").async_infer(inputs=_repeat(1000), request_id="task",
                                                      parameters={"marker": str(tmp_path)})

        async def consume() -> None:
            async for _ in stream:
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stopped = int(await asyncio.to_thread(_wait_for, tmp_path / "task.stopped"))
        assert stopped < 100
        # and aclose()
        async with server.model("repeater").async_infer(inputs=_repeat(1000), request_id="aclose",
                                                        parameters={"marker": str(tmp_path)}) as closing:
            async for _ in closing:
                break
        assert int(await asyncio.to_thread(_wait_for, tmp_path / "aclose.stopped")) < 100
        tick_task.cancel()
        assert ticks > 10  # the loop ran meanwhile

    asyncio.run(main())


def test_async_infer_needs_a_running_loop(server: tritonserver.Server) -> None:
    with pytest.raises(tritonserver.InvalidArgumentError, match="running asyncio"):
        server.model("identity_fp32").async_infer(inputs={"INPUT0": np.ones(1, np.float32)})


# ---- trio ------------------------------------------------------------------------------------


async def test_trio_programs_await_and_cancel(server: tritonserver.Server, tmp_path: Path) -> None:
    """From trio: async_infer delivers to the caller's trio loop (the server runs on its own);
    cancelling the awaiting scope cancels the request; blocking calls go through to_thread."""
    import trio

    assert await trio.to_thread.run_sync(server.ready)
    model = server.model("identity_fp32")
    results = []

    async def one(i: int) -> None:
        async for r in model.async_infer(inputs={"INPUT0": np.full(2, i, np.float32)}):
            results.append(float(np.from_dlpack(r.outputs["OUTPUT0"])[0]))

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(one, i)
    assert sorted(results) == [float(i) for i in range(10)]
    seen = []
    with trio.move_on_after(0.3):
        async for r in server.model("repeater").async_infer(inputs=_repeat(1000), request_id="trio",
                                                            parameters={"marker": str(tmp_path)}):
            seen.append(r)
    assert seen
    assert int(await trio.to_thread.run_sync(_wait_for, tmp_path / "trio.stopped")) < 100


# ---- front ends over the in-process server -------------------------------------------------


def test_front_ends_serve_tritonclient_while_the_process_infers(repo: Path) -> None:
    threads = _server_threads()
    server = tritonserver.Server(model_repository=str(repo), exit_timeout=5).start(wait_until_ready=True)
    try:
        http = KServeHttp(server, KServeHttp.Options(address="127.0.0.1", port=0))
        grpc = KServeGrpc(server, KServeGrpc.Options(address="127.0.0.1", port=0))
        metrics = Metrics(server, Metrics.Options(address="127.0.0.1", port=0))
        for front_end in (http, grpc, metrics):
            front_end.start()
            assert front_end.port > 0
        model = server.model("identity_fp32")
        before = model.statistics()["model_stats"][0]["inference_count"]
        stop = threading.Event()
        in_process = [0]

        def infer_in_process() -> None:
            while not stop.is_set():
                (r,) = model.infer(inputs={"INPUT0": np.full(3, 7, np.float32)})
                assert np.from_dlpack(r.outputs["OUTPUT0"]).tolist() == [7.0] * 3
                in_process[0] += 1

        worker = threading.Thread(target=infer_in_process)
        worker.start()
        try:
            hc = httpclient.InferenceServerClient(f"127.0.0.1:{http.port}")
            gc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc.port}")
            assert hc.is_server_ready() and gc.is_server_live() and hc.is_model_ready("identity_fp32")
            for i in range(10):
                a = httpclient.InferInput("INPUT0", [2], "FP32")
                a.set_data_from_numpy(np.full(2, i, np.float32))
                assert hc.infer("identity_fp32", [a]).as_numpy("OUTPUT0").tolist() == [float(i)] * 2
                b = grpcclient.InferInput("INPUT0", [2], "FP32")
                b.set_data_from_numpy(np.full(2, i, np.float32))
                assert gc.infer("identity_fp32", [b]).as_numpy("OUTPUT0").tolist() == [float(i)] * 2
            # a decoupled model streams over gRPC
            streamed: queue.Queue = queue.Queue()
            gc.start_stream(callback=lambda result, error: streamed.put((result, error)))
            inputs = [grpcclient.InferInput("IN", [1], "INT32"), grpcclient.InferInput("DELAY", [1], "FP32")]
            inputs[0].set_data_from_numpy(np.array([3], np.int32))
            inputs[1].set_data_from_numpy(np.array([0.0], np.float32))
            gc.async_stream_infer("repeater", inputs)
            got = [int(streamed.get(timeout=30)[0].as_numpy("OUT")[0]) for _ in range(3)]
            gc.stop_stream()
            assert got == [0, 1, 2]
        finally:
            stop.set()
            worker.join(30)
        assert in_process[0] > 0
        text = httpx.get(f"http://127.0.0.1:{metrics.port}/metrics", timeout=10).text
        count = 20 + in_process[0]
        assert model.statistics()["model_stats"][0]["inference_count"] == before + count
        scraped = re.search(r'nv_inference_count\{model="identity_fp32",version="1"\} ([\d.]+)', text)
        assert scraped is not None and float(scraped.group(1)) == before + count
        hc.close()
        gc.close()
        # stopped front ends refuse connections; the server goes on in-process
        http_port = http.port
        http.stop()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=5)
        assert server.ready()
        with KServeHttp(server, KServeHttp.Options(address="127.0.0.1", port=0)) as again:
            assert httpx.get(f"http://127.0.0.1:{again.port}/v2/health/ready", timeout=10).status_code == 200
        grpc_port = grpc.port
    finally:
        server.stop()  # stops the front ends still running (gRPC, metrics)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", grpc_port), timeout=5).close()
    metrics.stop()  # nothing left to stop: no error
    assert _server_threads() == threads


def test_front_end_bad_input(server: tritonserver.Server) -> None:
    with pytest.raises(tritonserver.InvalidArgumentError, match="options argument must be of type"):
        KServeHttp(server, KServeGrpc.Options())
    with pytest.raises(tritonserver.InvalidArgumentError, match="port"):
        KServeHttp.Options(port=70000)
    with pytest.raises(tritonserver.InvalidArgumentError):
        KServeGrpc.Options(infer_compression_level=9)
    with pytest.raises(tritonserver.InvalidArgumentError):
        KServeHttp(object())  # type: ignore[arg-type]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(tritonserver.UnavailableError, match="already in use"):
            KServeHttp(server, KServeHttp.Options(address="127.0.0.1", port=port)).start()
        with pytest.raises(tritonserver.UnavailableError, match="already in use"):
            KServeGrpc(server, KServeGrpc.Options(address="127.0.0.1", port=port)).start()
    with pytest.raises(tritonserver.InvalidArgumentError, match="server-cert"):
        KServeGrpc(server, KServeGrpc.Options(address="127.0.0.1", port=0, use_ssl=True)).start()
    http = KServeHttp.Server(server, KServeHttp.Options(address="127.0.0.1", port=0))  # the 24.08 spelling
    with http:
        with pytest.raises(tritonserver.InvalidArgumentError, match="already started"):
            http.start()
    quiet = tritonserver.Server(model_repository=str(EXAMPLE_REPOSITORY), metrics=False).start()
    try:
        with pytest.raises(tritonserver.UnsupportedError, match="metrics"):
            Metrics(quiet)
        with pytest.raises(tritonserver.UnsupportedError, match="metrics"):
            quiet.metrics()
    finally:
        quiet.stop()
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        KServeGrpc(quiet)


def test_restricted_features_need_their_header(server: tritonserver.Server) -> None:
    restricted = RestrictedFeatures()
    restricted.create_feature_group("admin-key", "admin-value", [Feature.MODEL_REPOSITORY, Feature.STATISTICS])
    assert restricted.has_feature(Feature.STATISTICS) and not restricted.has_feature(Feature.HEALTH)
    with KServeHttp(server, KServeHttp.Options(address="127.0.0.1", port=0, restricted_features=restricted)) as http:
        stats = f"http://127.0.0.1:{http.port}/v2/models/identity_fp32/stats"
        refused = httpx.get(stats, timeout=10)
        assert refused.status_code == 403 and "admin-key" in refused.json()["error"]
        assert httpx.get(stats, headers={"admin-key": "admin-value"}, timeout=10).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{http.port}/v2/health/ready", timeout=10).status_code == 200
    with KServeGrpc(server, KServeGrpc.Options(address="127.0.0.1", port=0, restricted_features=restricted)) as grpc:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc.port}")
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_inference_statistics("identity_fp32")
        client.get_inference_statistics("identity_fp32", headers={"triton-grpc-protocol-admin-key": "admin-value"})
        assert client.is_server_live()
        client.close()
    with pytest.raises(tritonserver.InvalidArgumentError, match="only belong to one group"):
        restricted.create_feature_group("other", "v", Feature.STATISTICS)
    with pytest.raises(tritonserver.InvalidArgumentError, match="Invalid features"):
        FeatureGroup("k", "v", ["health"])  # type: ignore[list-item]
    with pytest.raises(tritonserver.InvalidArgumentError, match="restricted_features"):
        KServeHttp.Options(restricted_features="model-repository:k=v")  # type: ignore[arg-type]
    restricted.remove_features(Feature.STATISTICS)
    assert not restricted.has_feature(Feature.MODEL_REPOSITORY) and restricted.specs() == []


# ---- bad input ------------------------------------------------------------------------------


def test_bad_requests_get_clear_errors(server: tritonserver.Server) -> None:
    model = server.model("identity_fp32")
    with pytest.raises(tritonserver.NotFoundError, match="nope"):
        list(server.model("nope").infer(inputs={"INPUT0": np.ones(1, np.float32)}, raise_on_error=False))
    with pytest.raises(tritonserver.InvalidArgumentError, match="FP32"):
        list(model.infer(inputs={"INPUT0": np.ones(2, np.int64)}))
    with pytest.raises(tritonserver.InvalidArgumentError):
        list(server.model("add_sub").infer(inputs={"INPUT0": np.ones((1, 3), np.float32),
                                                   "INPUT1": np.ones((1, 3), np.float32)}))
    with pytest.raises(tritonserver.InvalidArgumentError):
        list(model.infer(inputs={"WRONG": np.ones(2, np.float32)}))
    with pytest.raises(tritonserver.NotFoundError):
        list(server.model("identity_fp32", 7).infer(inputs={"INPUT0": np.ones(1, np.float32)}))
    # refused before anything is sent
    with pytest.raises(tritonserver.InvalidArgumentError, match="not supported"):
        model.infer(inputs={"INPUT0": {"a": 1}})
    with pytest.raises(tritonserver.InvalidArgumentError, match="Request Parameter"):
        model.infer(inputs={"INPUT0": np.ones(1, np.float32)}, parameters={"invalid": {"test": 1}})
    with pytest.raises(tritonserver.InvalidArgumentError, match="Request Parameter"):
        model.infer(inputs={"INPUT0": np.ones(1, np.float32)}, parameters={"invalid": None})
    with pytest.raises(tritonserver.InvalidArgumentError, match="Unsupported numpy data type"):
        model.infer(inputs={"INPUT0": np.ones(1, np.complex64)})
    with pytest.raises(tritonserver.UnsupportedError, match="CPU memory only"):
        model.infer(inputs={"INPUT0": np.ones(1, np.float32)}, output_memory_type="gpu")
    with pytest.raises(tritonserver.InvalidArgumentError, match="Invalid memory type"):
        model.infer(inputs={"INPUT0": np.ones(1, np.float32)}, output_memory_type="unsupported")
    with pytest.raises(tritonserver.InvalidArgumentError, match="flags"):
        model.infer(inputs={"INPUT0": np.ones(1, np.float32)}, flags=8)
    with pytest.raises(tritonserver.InvalidArgumentError, match="either"):
        model.infer(model.create_request(), inputs={})
    assert server.ready()  # none of it disturbed the server


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the repeater's thread
def test_stop_second_start_and_calls_after_stop(repo: Path) -> None:
    """(The repeater's own thread raises when it sends its final flag after the server ended its
    request at the stop: the model's business, not the API's.)"""
    threads = _server_threads()
    server = tritonserver.Server(model_repository=str(repo), exit_timeout=1)
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        server.ready()
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        server.model("identity_fp32")
    server.start()
    with pytest.raises(tritonserver.InvalidArgumentError, match="already started"):
        server.start()
    assert server.ready()  # the second start disturbed nothing
    model = server.model("identity_fp32")
    # in flight when the server stops: drained for exit_timeout, then cancelled
    running = server.model("slow").infer(inputs={"X": np.array([30.0], np.float32)})
    streaming = server.model("repeater").infer(inputs=_repeat(10_000))
    assert not next(streaming).final
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 15
    with pytest.raises(tritonserver.UnavailableError, match="stopped"):
        list(running)
    with pytest.raises(tritonserver.UnavailableError, match="stopped"):
        list(streaming)
    assert _server_threads() == threads
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        model.infer(inputs={"INPUT0": np.ones(1, np.float32)})
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        server.ready()
    with pytest.raises(tritonserver.InvalidArgumentError, match="not started"):
        server.stop()
    # and it starts again
    server.start(wait_until_ready=True)
    try:
        (r,) = server.model("identity_fp32").infer(inputs={"INPUT0": np.ones(1, np.float32)})
        assert np.from_dlpack(r.outputs["OUTPUT0"]).tolist() == [1.0]
    finally:
        server.stop()
    assert _server_threads() == threads


def test_failed_starts_leave_nothing_running(tmp_path: Path) -> None:
    threads = _server_threads()
    with pytest.raises(tritonserver.InternalError, match="does not exist"):
        tritonserver.Server(model_repository=str(tmp_path / "nowhere")).start()
    with pytest.raises(tritonserver.InvalidArgumentError, match="Model repository must be specified"):
        tritonserver.Server(model_repository=None).start()
    with pytest.raises(TypeError):
        tritonserver.Server(server_id=1, model_repository=str(tmp_path)).start()
    with pytest.raises(TypeError):
        tritonserver.Server(model_repository=1).start()
    with pytest.raises(TypeError):
        tritonserver.Server(no_such_option=1)
    repo = tmp_path / "repo"
    _write(repo, "broken", FAILS_TO_LOAD)
    shutil.copytree(EXAMPLE_REPOSITORY / "identity_fp32", repo / "identity_fp32")
    with pytest.raises(tritonserver.InternalError, match="broken"):
        tritonserver.Server(model_repository=str(repo)).start()  # exit_on_error, Triton's default
    assert _server_threads() == threads
    server = tritonserver.Server(model_repository=str(repo), exit_on_error=False, strict_readiness=False).start()
    try:
        models = server.models()
        assert models[("broken", 1)].state == "UNAVAILABLE" and "does not load" in models[("broken", 1)].reason
        assert models[("identity_fp32", 1)].state == "READY"
        with pytest.raises(tritonserver.UnavailableError):
            list(server.model("broken").infer(inputs={"X": np.ones(1, np.float32)}))
        with pytest.raises(tritonserver.UnavailableError, match="Timeout before ready"):
            tritonserver.Server(model_repository=str(repo), exit_on_error=False).start(
                wait_until_ready=True, timeout=0.2).stop()
    finally:
        server.stop()
    assert _server_threads() == threads


def test_forked_child_gets_a_clear_error(server: tritonserver.Server) -> None:
    model = server.model("identity_fp32")
    pid = os.fork()
    if pid == 0:  # the child: the server's thread does not exist here
        code = 1
        try:
            refused = 0
            for call in (server.ready, lambda: server.model("identity_fp32"),
                         lambda: model.infer(inputs={"INPUT0": np.ones(1, np.float32)})):
                try:
                    call()
                except tritonserver.InvalidArgumentError as e:
                    refused += "forked child" in str(e)
            server.stop()  # the parent's server: nothing of it runs here, no error
            code = 0 if refused == 3 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert server.ready() and len(list(model.infer(inputs={"INPUT0": np.ones(1, np.float32)}))) == 1


def test_calls_from_the_servers_own_thread_are_refused(server: tritonserver.Server) -> None:
    # what a model's code calling the API would do: wait on the loop it runs on
    with pytest.raises(tritonserver.InvalidArgumentError, match="own thread"):
        server._loop_or_raise().call(lambda s: server.ready())
    with pytest.raises(tritonserver.InvalidArgumentError, match="own thread"):
        server._loop_or_raise().call(lambda s: server.stop())
    assert server.ready()


def test_explicit_model_control(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_REPOSITORY / "identity_fp32", repo / "identity_fp32")
    server = tritonserver.Server(model_repository=str(repo), model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                                 startup_models=[]).start(wait_until_ready=True)
    try:
        assert list(server.models()) == [("identity_fp32", -1)]
        assert server.models()[("identity_fp32", -1)].state is None
        assert server.models(exclude_not_ready=True) == {}
        config = json.dumps({"backend": "python", "max_batch_size": 0,
                             "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                             "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
        model = server.load("identity_fp32", {"config": config})
        assert model.ready() and server.models()[("identity_fp32", 1)].state == "READY"
        server.unload("identity_fp32", wait_until_unloaded=True)
        assert not model.ready()
        with pytest.raises(tritonserver.InvalidArgumentError, match="load parameter"):
            server.load("identity_fp32", {"config": 1})
        with pytest.raises(tritonserver.TritonError):
            server.load("no_such_model")
    finally:
        server.stop()
    plain = tritonserver.Server(model_repository=str(repo)).start()
    try:
        with pytest.raises(tritonserver.UnsupportedError, match="EXPLICIT"):
            plain.load("identity_fp32")
    finally:
        plain.stop()


def test_options_trident_ignores_are_logged_and_unsupported_calls_refused(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = tritonserver.Server(model_repository=str(EXAMPLE_REPOSITORY), pinned_memory_pool_size=1 << 20,
                                 backend_directory="/opt/x", log_warn=True, log_file=str(log)).start()
    try:
        text = log.read_text()
        assert "ignoring Options.pinned_memory_pool_size=1048576: no pinned-memory pool" in text
        assert "ignoring Options.backend_directory=/opt/x: backends are Python modules" in text
        for call in (lambda: server.register_model_repository("/tmp"), lambda: server.unregister_model_repository("/tmp"),
                     server.poll_model_repository,
                     lambda: tritonserver.MetricFamily(tritonserver.MetricKind.COUNTER, "x", "y")):
            with pytest.raises(tritonserver.UnsupportedError):
                call()
    finally:
        server.stop()
    # the log settings are undone at stop: the handler is gone, its file closed
    assert not any(isinstance(h, logging.FileHandler) and h.baseFilename == str(log)
                   for h in logging.getLogger("trident").handlers)
