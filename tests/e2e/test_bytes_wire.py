"""Large BYTES tensors held in their wire form (protocol.datatypes.WireBytes): a BYTES input of
WIRE_MIN elements or more, sent as binary data (HTTP) or raw_input_contents (gRPC), reaches a
Python model with no Python object per element until the model asks (``as_numpy()``), and an
input the model returns unchanged is answered with its bytes as they came. Every answer must be
exactly what serializing the elements gives; a model that changes an element must be answered
with the change; BLS calls that forward the tensor unread; bad data is refused with Triton's
status and the server keeps serving.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import RunningServer, start_server
from e2e.models import write_model
from tritonclient.grpc import service_pb2

from trident.protocol import datatypes

N = 3 * datatypes.WIRE_MIN + 5  # past the wire-form threshold, and past FILL_SLICE for some cases
BIG = datatypes.FILL_SLICE + 11

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] }} ]
'''

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''

RESHAPED = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Returns its input through a reshaped view (the same elements, in order)."""

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.reshape(1, -1).reshape(-1))]))
        return out
'''

MUTATE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Changes the first and the last element of its input in place and returns it."""

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            x[0] = b"changed"
            x[-1] = x[-1] + b"!"
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
'''

SECOND_LOOK = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Asks for its input twice (one array, as Triton), changes it, and returns the second look."""

    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            first = t.as_numpy()
            first[1] = b"seen"
            assert t.as_numpy() is first and t.shape() == [first.size]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", t.as_numpy())]))
        return out
'''

FORWARD = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """BLS: forwards its input, unread, to bytes_identity and answers with its output."""

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            assert x.shape()[0] > 0  # needs no element
            call = pb_utils.InferenceRequest(model_name="bytes_identity", inputs=[x],
                                             requested_output_names=["OUTPUT0"])
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            y = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y.as_numpy())]))
        return out
'''

MAKE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Answers a small request with %d BYTES elements it makes (serialized off the loop).\"\"\"

    def execute(self, requests):
        made = np.array([b"m%%d" %% (i %% 1000) for i in range(%d)], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", made)]) for r in requests]
"""

MODELS = {"bytes_identity": IDENTITY, "bytes_reshaped": RESHAPED, "bytes_mutate": MUTATE,
          "bytes_second_look": SECOND_LOOK, "bytes_forward": FORWARD, "bytes_make": MAKE % (2 * BIG, 2 * BIG)}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("bytes_wire")
    for name, code in MODELS.items():
        write_model(repo, name, CONFIG.format(name=name), code)
    s = start_server(repo=repo)
    yield s
    s.stop()


def elements(n: int, kind: str) -> list[bytes]:
    if kind == "empty":
        return [b""] * n
    if kind == "fixed":
        return [b"%08d" % i for i in range(n)]
    return [b"e%d" % i * (i % 5) for i in range(n)]  # lengths vary, empty ones among them


def wire(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def post_binary(server: RunningServer, model: str, data: bytes, count: int, binary_out: bool = True) -> httpx.Response:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [count], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(data)}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": binary_out}}]}).encode()
    return httpx.post(f"http://{server.http_url}/v2/models/{model}/infer", content=header + data, timeout=120,
                      headers={"Inference-Header-Content-Length": str(len(header)),
                               "Content-Type": "application/octet-stream"})


def binary_output(response: httpx.Response) -> bytes:
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == len(response.content) - length
    return response.content[length:]


@pytest.mark.parametrize("kind", ["empty", "fixed", "varied"])
@pytest.mark.parametrize("model", ["bytes_identity", "bytes_reshaped", "bytes_forward"])
def test_http_binary_answer_is_the_input(server, model, kind):
    items = elements(N, kind)
    data = wire(items)
    assert binary_output(post_binary(server, model, data, N)) == data


@pytest.mark.parametrize("kind", ["fixed", "varied"])
def test_http_json_answer_lists_the_elements(server, kind):
    items = elements(N, kind)
    response = post_binary(server, "bytes_identity", wire(items), N, binary_out=False)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [x.decode() for x in items]


@pytest.mark.parametrize("count", [N, BIG])
def test_changed_elements_are_answered_changed(server, count):
    items = elements(count, "varied")
    expected = [b"changed", *items[1:-1], items[-1] + b"!"]
    assert binary_output(post_binary(server, "bytes_mutate", wire(items), count)) == wire(expected)
    items[1] = b"seen"
    assert binary_output(post_binary(server, "bytes_second_look", wire(items), count)) == wire(items)


def test_tritonclient_http_and_grpc(server):
    items = elements(BIG, "varied")
    array = np.array(items, dtype=object)
    hc = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    gc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    for model in ("bytes_identity", "bytes_mutate", "bytes_forward"):
        expected = array.copy()
        if model == "bytes_mutate":
            expected[0], expected[-1] = b"changed", expected[-1] + b"!"
        hi = httpclient.InferInput("INPUT0", [BIG], "BYTES")
        hi.set_data_from_numpy(array, binary_data=True)
        got = hc.infer(model, [hi], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
        assert got.as_numpy("OUTPUT0").tolist() == expected.tolist()
        gi = grpcclient.InferInput("INPUT0", [BIG], "BYTES")
        gi.set_data_from_numpy(array)
        got = gc.infer(model, [gi], client_timeout=120)
        assert got.as_numpy("OUTPUT0").tolist() == expected.tolist()
    hc.close()
    gc.close()


def test_bad_wire_data_is_refused_and_the_server_serves_on(server):
    items = elements(N, "varied")
    data = wire(items)
    cases = {
        "cut short": (data[:-1], N),
        "a length prefix cut": (data + b"\x01\x00", N),
        "one element more": (data + wire([b"x"]), N),
        "one element less": (data, N + 1),
        "a length past the end": (data[: -len(wire(items[-1:]))] + struct.pack("<I", 1 << 30) + b"x", N),
    }
    for what, (body, count) in cases.items():
        response = post_binary(server, "bytes_identity", body, count)
        assert response.status_code == 400, (what, response.text)
        assert "unable to deserialize BYTES input 'INPUT0'" in response.json()["error"], what
    # gRPC: the raw message (tritonclient serializes well-formed data only)
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                    response_deserializer=service_pb2.ModelInferResponse.FromString)
        for body, count in cases.values():
            message = service_pb2.ModelInferRequest(
                model_name="bytes_identity", raw_input_contents=[body],
                inputs=[service_pb2.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="BYTES", shape=[count])])
            with pytest.raises(grpc.RpcError) as info:
                infer(message, timeout=60)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "invalid BYTES data for input 'INPUT0' for model 'bytes_identity'" in info.value.details()
    # still serving, with the same tensor well formed
    assert binary_output(post_binary(server, "bytes_identity", data, N)) == data


def test_a_large_made_output_answers_a_small_request(server):
    """A small request whose answer has FILL_SLICE elements and more to serialize: encoded in a
    worker thread (HTTP: binary and JSON; gRPC: the call answered at once or later)."""
    expected = [b"m%d" % (i % 1000) for i in range(2 * BIG)]
    assert binary_output(post_binary(server, "bytes_make", wire([b"x"]), 1)) == wire(expected)
    response = post_binary(server, "bytes_make", wire([b"x"]), 1, binary_out=False)
    assert response.json()["outputs"][0]["data"] == [x.decode() for x in expected]
    gc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    gi = grpcclient.InferInput("INPUT0", [1], "BYTES")
    gi.set_data_from_numpy(np.array([b"x"], dtype=object))
    for timeout in (None, 60):  # without a deadline the call may be answered later, with one by its task
        assert gc.infer("bytes_make", [gi], client_timeout=timeout).as_numpy("OUTPUT0").tolist() == expected
    gc.close()
