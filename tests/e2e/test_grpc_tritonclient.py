"""gRPC end to end with tritonclient.grpc: every RPC, every datatype, sync, aio and streaming."""

from __future__ import annotations

import asyncio
import json
import queue
import shutil

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
from e2e.models import (
    CLASSIFY_CONFIG,
    DATATYPES,
    IDENTITY_PY,
    RAISES_CONFIG,
    RAISES_PY,
    write_identity,
    write_model,
)
from tritonclient.utils import InferenceServerException

from trident.options import EXAMPLE_REPOSITORY
from trident.protocol import datatypes
from trident.protocol.generated.grpc.health import v1 as health

pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation


@pytest.fixture(scope="module")
def server(tmp_path_factory, grpc_http2):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("grpc-repo")
    for dt in DATATYPES:
        write_identity(repo, dt)
    write_model(repo, "raises", RAISES_CONFIG, RAISES_PY)
    folder = write_model(repo, "scores", CLASSIFY_CONFIG, IDENTITY_PY)
    (folder / "labels.txt").write_text("cat\ndog\nbird\nfish\nfrog\n")
    shutil.copytree(EXAMPLE_REPOSITORY / "add_sub", repo / "add_sub")
    s = start_server(repo=repo)
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def sample(datatype: str, shape=(2, 3)) -> np.ndarray:
    rng = np.random.default_rng(len(datatype))
    n = int(np.prod(shape))
    if datatype == "BYTES":
        return np.array([f"élément {i}".encode() for i in range(n)], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    dtype = datatypes.numpy_dtype(datatype)
    return np.frombuffer(rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).tobytes(), dtype=dtype).reshape(shape)


def make_input(module, name: str, data: np.ndarray, datatype: str):
    inp = module.InferInput(name, list(data.shape), datatype)
    if datatype == "BF16":  # tritonclient takes BF16 as ml_dtypes.bfloat16 arrays
        import ml_dtypes

        inp.set_data_from_numpy(data.view(ml_dtypes.bfloat16))
    else:
        inp.set_data_from_numpy(data)
    return inp


def output_bytes(result, datatype: str) -> bytes:
    raw = result.get_response().raw_output_contents[0]
    return raw if datatype == "BYTES" else bytes(raw)


# ---- health, metadata, config, statistics ---------------------------------------------------


def test_health_and_server_metadata(client, server):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("identity_fp32") and not client.is_model_ready("missing")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "triton" and "model_repository" in meta["extensions"]
    with grpc.insecure_channel(server.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=health.HealthCheckRequest.SerializeToString,
                                    response_deserializer=health.HealthCheckResponse.FromString)
        assert check(health.HealthCheckRequest()).status == health.HealthCheckResponseServingStatus.SERVING
        with pytest.raises(grpc.RpcError) as e:
            list(channel.unary_stream("/grpc.health.v1.Health/Watch")(b""))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_model_metadata_config_and_index(client):
    meta = client.get_model_metadata("add_sub", as_json=True)
    assert meta["versions"] == ["1"] and meta["platform"] == "python"
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}
    config = client.get_model_config("add_sub").config
    assert config.name == "add_sub" and config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert config.input[0].data_type == 11  # TYPE_FP32
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "add_sub", "version": "1", "state": "READY"} in index
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("missing")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("missing")
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_statistics_count_inferences(client):
    x = sample("INT16")
    before = client.get_inference_statistics("identity_int16").model_stats[0].inference_stats.success.count
    client.infer("identity_int16", [make_input(grpcclient, "INPUT0", x, "INT16")])
    stats = client.get_inference_statistics("identity_int16").model_stats[0]
    assert stats.name == "identity_int16" and stats.version == "1"
    assert stats.inference_stats.success.count == before + 1
    assert stats.inference_stats.success.ns > 0 and stats.last_inference > 0
    everything = client.get_inference_statistics().model_stats
    assert {s.name for s in everything} >= {"identity_int16", "add_sub"}


def test_log_and_trace_settings(client):
    logs = client.get_log_settings(as_json=True)["settings"]
    assert set(logs) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    updated = client.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
    assert updated["log_verbose_level"] == {"uint32_param": 1}
    client.update_log_settings({"log_verbose_level": 0})
    with pytest.raises(InferenceServerException) as e:
        client.update_log_settings({"log_file": "/tmp/x.log"})
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    trace = client.get_trace_settings(as_json=True)["settings"]
    assert trace["trace_level"] == {"value": ["OFF"]}
    model = client.update_trace_settings("add_sub", {"trace_rate": "5"}, as_json=True)["settings"]
    assert model["trace_rate"] == {"value": ["5"]}
    reset = client.update_trace_settings("add_sub", {"trace_rate": None}, as_json=True)["settings"]
    assert reset["trace_rate"] == trace["trace_rate"]
    with pytest.raises(InferenceServerException) as e:
        client.update_trace_settings(settings={"trace_level": ["LOUD"]})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_shared_memory_rpcs_are_off_by_default(client):
    calls = [
        client.get_system_shared_memory_status,
        lambda: client.register_system_shared_memory("r", "/key", 16),
        client.unregister_system_shared_memory,
        client.get_cuda_shared_memory_status,
        lambda: client.register_cuda_shared_memory("r", b"\x00" * 64, 0, 16),
        client.unregister_cuda_shared_memory,
    ]
    for call in calls:
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"  # until --allow-client-shm=true
        assert "start it with --allow-client-shm=true" in e.value.message()


# ---- inference ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DATATYPES)
def test_every_datatype_raw(client, dt):
    x = sample(dt)
    result = client.infer(f"identity_{dt.lower()}", [make_input(grpcclient, "INPUT0", x, dt)], request_id="r1")
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("r1", f"identity_{dt.lower()}", "1")
    assert response.outputs[0].datatype == dt and list(response.outputs[0].shape) == [2, 3]
    if dt == "BYTES":
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    else:
        assert output_bytes(result, dt) == x.tobytes()


CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


@pytest.mark.parametrize("dt", sorted(CONTENTS))
def test_every_datatype_as_tensor_contents(server, dt):
    x = sample(dt)
    if dt in ("FP32", "FP64"):
        x = np.arange(6, dtype=datatypes.numpy_dtype(dt)).reshape(2, 3) / 4
    request = pb.ModelInferRequest(model_name=f"identity_{dt.lower()}")
    tensor = request.inputs.add(name="INPUT0", datatype=dt, shape=[2, 3])
    getattr(tensor.contents, CONTENTS[dt]).extend(x.reshape(-1).tolist())
    with grpc.insecure_channel(server.grpc_url) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    expected = datatypes.serialize_bytes(x) if dt == "BYTES" else x.tobytes()
    assert response.raw_output_contents[0] == expected


@pytest.mark.parametrize("dt", ["FP16", "BF16"])
def test_half_types_need_raw_contents(server, dt):
    request = pb.ModelInferRequest(model_name=f"identity_{dt.lower()}")
    request.inputs.add(name="INPUT0", datatype=dt, shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"expected datatype '{dt}'" in e.value.details()


def test_batched_model_classification_and_output_selection(client):
    a, b = np.full((1, 16), 3, np.float32), np.ones((1, 16), np.float32)
    inputs = [make_input(grpcclient, "INPUT0", a, "FP32"), make_input(grpcclient, "INPUT1", b, "FP32")]
    result = client.infer("add_sub", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    scores = np.array([[0.1, 0.9, 0.3, 0.7, 0.2]], np.float32)
    result = client.infer("scores", [make_input(grpcclient, "INPUT0", scores, "FP32")],
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert result.as_numpy("OUTPUT0").tolist() == [[b"0.900000:1:dog", b"0.700000:3:fish"]]


def test_parameters_travel_to_the_model(client):
    x = np.array([1.0], np.float32)
    result = client.infer("raises", [make_input(grpcclient, "X", x, "FP32")],
                          parameters={"color": "red", "n": 3, "flag": True})
    assert json.loads(result.get_response().parameters["echo"].string_param) == {"color": "red", "n": 3, "flag": True}


def test_errors_map_to_grpc_statuses(client):
    x = sample("FP32")
    cases = [
        (lambda: client.infer("missing", [make_input(grpcclient, "INPUT0", x, "FP32")]), "NOT_FOUND", "unknown model"),
        (lambda: client.infer("identity_fp32", [make_input(grpcclient, "WRONG", x, "FP32")]), "INVALID_ARGUMENT", ""),
        (lambda: client.infer("identity_fp32", [make_input(grpcclient, "INPUT0", x, "FP32")], model_version="7"),
         "NOT_FOUND", ""),
        (lambda: client.infer("raises", [make_input(grpcclient, "X", np.array([-1.0], np.float32), "FP32")]),
         "INTERNAL", "negative input is not allowed"),
        (lambda: client.infer("raises", [make_input(grpcclient, "X", np.array([0.0], np.float32), "FP32")]),
         None, "zero is refused"),
    ]
    for call, status, fragment in cases:
        with pytest.raises(InferenceServerException) as e:
            call()
        if status:
            assert e.value.status() == f"StatusCode.{status}", e.value
        assert fragment in e.value.message()
    assert client.infer("identity_fp32", [make_input(grpcclient, "INPUT0", x, "FP32")]).as_numpy("OUTPUT0") is not None


def test_large_tensor_and_gzip(client):
    x = np.random.default_rng(1).random((1, 1 << 18), dtype=np.float32)  # 1 MiB
    for compression in (None, "gzip"):
        result = client.infer("identity_fp32", [make_input(grpcclient, "INPUT0", x, "FP32")],
                              compression_algorithm=compression)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    big = np.zeros((1, 4 << 20), np.float32)  # 16 MiB, beyond grpcio's default 4 MiB
    np.testing.assert_array_equal(
        client.infer("identity_fp32", [make_input(grpcclient, "INPUT0", big, "FP32")]).as_numpy("OUTPUT0"), big)


# ---- streaming ---------------------------------------------------------------------------------


def test_stream_many_requests_errors_in_band(client):
    results: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: results.put((result, error)))
    try:
        for i, dt in enumerate(["INT8", "BYTES", "FP16"]):
            x = sample(dt)
            client.async_stream_infer(f"identity_{dt.lower()}", [make_input(grpcclient, "INPUT0", x, dt)],
                                      request_id=f"ok{i}")
        client.async_stream_infer("missing", [make_input(grpcclient, "INPUT0", sample("FP32"), "FP32")],
                                  request_id="bad")
        client.async_stream_infer("identity_fp32", [make_input(grpcclient, "INPUT0", sample("FP32"), "FP32")],
                                  request_id="after", enable_empty_final_response=True)
        got = {}
        for _ in range(5):
            result, error = results.get(timeout=30)
            if error is not None:
                got["error"] = str(error)
            else:
                response = result.get_response()
                got[response.id] = response
    finally:
        client.stop_stream()
    assert "unknown model" in got["error"] and "missing" in got["error"]
    for key in ("ok0", "ok1", "ok2", "after"):
        assert got[key].parameters["triton_final_response"].bool_param is True
    np.testing.assert_array_equal(grpcclient.InferResult(got["ok1"]).as_numpy("OUTPUT0"), sample("BYTES"))


def test_aio_client_every_rpc_and_stream(server):
    async def main():
        c = aioclient.InferenceServerClient(server.grpc_url)
        try:
            assert await c.is_server_live() and await c.is_server_ready()
            assert await c.is_model_ready("add_sub")
            assert (await c.get_server_metadata()).name == "triton"
            assert (await c.get_model_metadata("identity_int8")).inputs[0].datatype == "INT8"
            assert (await c.get_model_config("identity_int8")).config.name == "identity_int8"
            assert (await c.get_inference_statistics("identity_int8")).model_stats[0].name == "identity_int8"
            assert len((await c.get_model_repository_index()).models) >= 3
            assert "log_info" in (await c.get_log_settings()).settings
            assert "trace_level" in (await c.get_trace_settings()).settings
            x = sample("UINT32")
            result = await c.infer("identity_uint32", [make_input(aioclient, "INPUT0", x, "UINT32")])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)

            async def requests():
                for i in range(20):
                    yield {"model_name": "identity_uint32", "request_id": str(i),
                           "inputs": [make_input(aioclient, "INPUT0", x + i, "UINT32")]}

            seen = {}
            async for result, error in c.stream_infer(requests()):
                assert error is None
                seen[result.get_response().id] = result.as_numpy("OUTPUT0")
                if len(seen) == 20:
                    break
            assert sorted(seen, key=int) == [str(i) for i in range(20)]
            np.testing.assert_array_equal(seen["7"], x + 7)
        finally:
            await c.close()

    asyncio.run(main())


def test_explicit_load_with_overrides_and_unload(server_factory, tmp_path):
    repo = tmp_path / "repo"
    write_identity(repo, "INT32")
    s = server_factory("--model-control-mode=explicit", repo=repo)
    c = grpcclient.InferenceServerClient(s.grpc_url)
    try:
        assert not c.is_model_ready("identity_int32")
        c.load_model("identity_int32")
        assert c.is_model_ready("identity_int32")
        config = json.dumps({"name": "twice", "backend": "python", "max_batch_size": 0,
                             "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1, -1]}],
                             "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1, -1]}]})
        doubled = IDENTITY_PY.replace("x.as_numpy()", "x.as_numpy() * 2")
        c.load_model("twice", config=config, files={"file:1/model.py": doubled.encode()})
        x = sample("INT32") % 100
        result = c.infer("twice", [make_input(grpcclient, "INPUT0", x, "INT32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * 2)
        c.unload_model("twice")
        assert not c.is_model_ready("twice")
        with pytest.raises(InferenceServerException):
            c.load_model("nothing_here")
    finally:
        c.close()
