"""Answers that must be Triton's (issue [11] part 1), over HTTP and gRPC with tritonclient.

Each status and message below was read off the real Triton 2.51 (tritonserver of the
nvidia-pytriton wheel, Python models, explicit model control) on the same requests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, start_server
from tests.e2e.models import IDENTITY_PY, write_model

FP16_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.astype(np.float16))]))
        return out
'''

IDENTITY = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {out} dims: [ -1 ] }} ]
'''

SEQ = '''
name: "seq"
backend: "python"
max_batch_size: 4
sequence_batching { }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
'''

OVERRIDE = json.dumps({
    "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "parameters": {"marker": {"string_value": "over"}},
})


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory):
    repo: Path = tmp_path_factory.mktemp("answers")
    write_model(repo, "ident", IDENTITY.format(name="ident", out="TYPE_FP32"), IDENTITY_PY)
    write_model(repo, "other", IDENTITY.format(name="other", out="TYPE_FP32"), IDENTITY_PY)  # never loaded
    write_model(repo, "fp16_out", IDENTITY.format(name="fp16_out", out="TYPE_FP16"), FP16_PY)
    write_model(repo, "seq", SEQ, IDENTITY_PY)
    server = start_server("--model-control-mode", "explicit", "--load-model", "ident", "--load-model", "fp16_out",
                          "--load-model", "seq", repo=repo)
    yield server
    server.stop()


def _http_error(call) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as e:
        call()
    return str(e.value.status()), e.value.message()


_GRPC = {"400": "StatusCode.INVALID_ARGUMENT", "404": "StatusCode.NOT_FOUND", "500": "StatusCode.INTERNAL",
         "503": "StatusCode.UNAVAILABLE"}


def _both(server: RunningServer, call_http, call_grpc, status: str, message: str) -> None:
    """The same error, in Triton's status and words, over both protocols."""
    with httpclient.InferenceServerClient(server.http_url) as c:
        assert _http_error(lambda: call_http(c)) == (status, message)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        got_status, got_message = _http_error(lambda: call_grpc(c))
        assert got_status == _GRPC[status] and message in got_message


def _inputs(module, shape=(2,)):
    inp = module.InferInput("INPUT0", list(shape), "FP32")
    inp.set_data_from_numpy(np.ones(shape, np.float32))
    return [inp]


def test_statistics_of_what_is_not_serving_is_invalid_argument(explicit) -> None:
    for name, version, message in (
            ("nope", "", "requested model 'nope' is not available"),
            ("other", "", "requested model 'other' is not available"),  # in the repository, not loaded
            ("ident", "7", "requested model version is not available for model 'ident'")):
        _both(explicit, lambda c, n=name, v=version: c.get_inference_statistics(n, v),
              lambda c, n=name, v=version: c.get_inference_statistics(n, v), "400", message)


def test_infer_on_a_model_never_loaded_or_version_absent_is_not_found(explicit) -> None:
    _both(explicit, lambda c: c.infer("other", _inputs(httpclient)), lambda c: c.infer("other", _inputs(grpcclient)),
          "404", "Request for unknown model: 'other' is not found")
    _both(explicit, lambda c: c.infer("ident", _inputs(httpclient), model_version="7"),
          lambda c: c.infer("ident", _inputs(grpcclient), model_version="7"),
          "404", "Request for unknown model: 'ident' version 7 is not found")


def test_unloaded_model_has_no_available_versions(explicit) -> None:
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        c.load_model("other")
        c.unload_model("other")
    _both(explicit, lambda c: c.infer("other", _inputs(httpclient)), lambda c: c.infer("other", _inputs(grpcclient)),
          "404", "Request for unknown model: 'other' has no available versions")
    _both(explicit, lambda c: c.infer("other", _inputs(httpclient), model_version="1"),
          lambda c: c.infer("other", _inputs(grpcclient), model_version="1"),
          "503", "Request for unknown model: 'other' version 1 is not at ready state")
    _both(explicit, lambda c: c.get_inference_statistics("other"), lambda c: c.get_inference_statistics("other"),
          "400", "requested model 'other' is not available")


def test_model_control_answers(explicit) -> None:
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        c.unload_model("not_in_the_repository")  # Triton: OK
    with grpcclient.InferenceServerClient(explicit.grpc_url) as c:
        c.unload_model("not_in_the_repository")
    _both(explicit, lambda c: c.load_model("nope"), lambda c: c.load_model("nope"),
          "500", "failed to load 'nope', failed to poll from model repository")
    _both(explicit, lambda c: c.load_model("ident", config="{not json"),
          lambda c: c.load_model("ident", config="{not json"),
          "500", "failed to load 'ident', failed to poll from model repository")
    _both(explicit, lambda c: c.load_model("ident", config="[1, 2]"), lambda c: c.load_model("ident", config="[1, 2]"),
          "500", "failed to load 'ident', failed to poll from model repository")
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        assert c.is_model_ready("ident")  # a refused load leaves the loaded model serving
        index = {row["name"]: row for row in c.get_model_repository_index()}
        assert "nope" not in index


def test_reload_without_config_keeps_the_override_until_unloaded(explicit) -> None:
    def marker(c) -> object:
        return c.get_model_config("ident").get("parameters", {}).get("marker")

    with httpclient.InferenceServerClient(explicit.http_url) as c:
        c.load_model("ident", config=OVERRIDE)
        assert marker(c) == {"string_value": "over"}
        c.load_model("ident")
        assert marker(c) == {"string_value": "over"}
    with grpcclient.InferenceServerClient(explicit.grpc_url) as g:
        g.load_model("ident")
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        assert marker(c) == {"string_value": "over"}
        c.unload_model("ident")
        c.load_model("ident")  # after an unload: the repository's config again
        assert marker(c) is None
        assert c.is_model_ready("ident")


def test_a_refused_override_load_leaves_no_phantom_entry(explicit) -> None:
    files = {"file:1/../../escape.py": b"x = 1"}
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.load_model("phantom", config=OVERRIDE, files=files)
        assert e.value.status() == "400" and "invalid file override path" in e.value.message()
        assert "phantom" not in {row["name"] for row in c.get_model_repository_index()}
    with grpcclient.InferenceServerClient(explicit.grpc_url) as g:
        with pytest.raises(InferenceServerException) as e:
            g.load_model("phantom", config=OVERRIDE, files=files)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "phantom" not in {m.name for m in g.get_model_repository_index().models}


def test_sequence_model_refuses_a_batch_of_more_than_one(explicit) -> None:
    message = "inference request to model 'seq' must specify batch-size 1 due to requirements of sequence batcher"
    for kwargs in ({"sequence_id": 5, "sequence_start": True}, {}):
        _both(explicit, lambda c, kw=kwargs: c.infer("seq", _inputs(httpclient, (2, 1)), **kw),
              lambda c, kw=kwargs: c.infer("seq", _inputs(grpcclient, (2, 1)), **kw), "400", message)
    with httpclient.InferenceServerClient(explicit.http_url) as c:  # a batch of one is served
        result = c.infer("seq", _inputs(httpclient, (1, 1)), sequence_id=6, sequence_start=True, sequence_end=True)
        assert result.as_numpy("OUTPUT0").tolist() == [[1.0]]


def test_fp16_outputs_travel_only_as_binary(explicit) -> None:
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        json_out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
        assert _http_error(lambda: c.infer("fp16_out", _inputs(httpclient), outputs=json_out)) == (
            "400", "sending FP16 data via JSON is not supported. Please use the binary data format for output")
        binary_out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
        result = c.infer("fp16_out", _inputs(httpclient), outputs=binary_out)
        assert result.as_numpy("OUTPUT0").dtype == np.float16
    with grpcclient.InferenceServerClient(explicit.grpc_url) as g:  # gRPC carries raw bytes: served
        assert g.infer("fp16_out", _inputs(grpcclient)).as_numpy("OUTPUT0").tolist() == [1.0, 1.0]


def test_header_length_that_cuts_the_json_names_the_header(explicit) -> None:
    import httpx

    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]}).encode()
    url = f"http://{explicit.http_url}/v2/models/ident/infer"
    for length, fragment in ((10, "Inference-Header-Content-Length is 10"),
                             (len(body) + 5, f"inference header size should be in range (0, {len(body)})")):
        r = httpx.post(url, content=body, headers={"Inference-Header-Content-Length": str(length)})
        assert r.status_code == 400 and fragment in r.json()["error"], r.text
    blob = np.ones(2, np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2],
                                     "parameters": {"binary_data_size": 8}}]}).encode()
    r = httpx.post(url, content=header + blob, headers={"Inference-Header-Content-Length": str(len(header) + 4)})
    assert r.status_code == 400 and f"Inference-Header-Content-Length is {len(header) + 4}" in r.json()["error"]


def test_infer_on_an_unknown_model_is_404_before_the_body_is_parsed(explicit) -> None:
    import httpx

    for body in (b"{}", b"not json at all"):
        r = httpx.post(f"http://{explicit.http_url}/v2/models/nope/infer", content=body)
        assert r.status_code == 404 and r.json() == {"error": "Request for unknown model: 'nope' is not found"}


def test_load_answers_with_an_empty_body_as_triton(explicit) -> None:
    import httpx

    r = httpx.post(f"http://{explicit.http_url}/v2/repository/models/ident/load")
    assert r.status_code == 200 and r.content == b""


def test_http_header_forward_pattern_copies_matching_headers_into_parameters(tmp_path: Path) -> None:
    import httpx

    echo = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            params = json.dumps(json.loads(r.parameters()), sort_keys=True).encode()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([params], dtype=object))]))
        return out
'''
    write_model(tmp_path, "params", '''
name: "params"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
''', echo)
    server = start_server("--http-header-forward-pattern", "x-trace-.*", repo=tmp_path)
    try:
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
        r = httpx.post(f"http://{server.http_url}/v2/models/params/infer", json=body,
                       headers={"X-Trace-Id": "abc", "X-Other": "no"})
        assert r.status_code == 200, r.text
        forwarded = json.loads(r.json()["outputs"][0]["data"][0])
        assert forwarded == {"x-trace-id": "abc"}
    finally:
        server.stop()


def test_grpc_deflate_requests_and_responses(tmp_path: Path) -> None:
    """grpc-encoding deflate (zlib, as gRPC defines it) is accepted on requests and used for
    responses when the client accepts deflate and not gzip, as Triton does; gzip still wins."""
    import struct
    import zlib

    import trio
    import tritonclient.grpc.service_pb2 as pb

    from tests.e2e.grpc_raw import frame, open_raw

    write_model(tmp_path, "ident", IDENTITY.format(name="ident", out="TYPE_FP32"), IDENTITY_PY)
    server = start_server("--grpc-infer-response-compression-level=high", repo=tmp_path)
    try:
        x = np.arange(64, dtype=np.float32)
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            inp = grpcclient.InferInput("INPUT0", [64], "FP32")
            inp.set_data_from_numpy(x)
            for algorithm in ("deflate", "gzip"):
                got = c.infer("ident", [inp], compression_algorithm=algorithm).as_numpy("OUTPUT0")
                assert got.tolist() == x.tolist()
        request = pb.ModelInferRequest(model_name="ident", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="INPUT0", datatype="FP32", shape=[64])], raw_input_contents=[x.tobytes()]).SerializeToString()

        async def raw(accept: bytes) -> tuple[bytes | None, bytes]:
            async with open_raw(server.grpc_port) as client:
                s = await client.open("/inference.GRPCInferenceService/ModelInfer", extra=[
                    (b"grpc-encoding", b"deflate"), (b"grpc-accept-encoding", accept)])
                await client.send(s, frame(zlib.compress(request), compressed=True), end_stream=True)
                await s.closed.wait()
                assert s.status == 0, s.message
                return s.headers.get(b"grpc-encoding"), bytes(s.data)

        encoding, data = trio.run(raw, b"identity,deflate")
        assert encoding == b"deflate" and data[0] == 1
        (length,) = struct.unpack(">I", data[1:5])
        reply = pb.ModelInferResponse.FromString(zlib.decompress(data[5:5 + length]))
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == x.tolist()
        encoding, _ = trio.run(raw, b"identity,deflate,gzip")
        assert encoding == b"gzip"
    finally:
        server.stop()
