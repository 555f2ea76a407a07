"""Ensembles in the model repository: load-time checks with Triton's reasons, explicit-mode
loading of composing models, unload_dependents, and ensembles following their composing
models out and back in. Real server in explicit mode, tritonclient over HTTP and gRPC."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.ensemble_models import write_pipeline_repo
from tritonclient.utils import InferenceServerException

RAW = np.ones((1, 4), np.float32)

STEP_PRE = '{ model_name: "pre" input_map { key: "RAW" value: "RAW" } output_map { key: "NORM" value: "OUT" } }'
IO = '''input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]'''



def _body(step: str, io: str = IO, max_batch_size: int = 8) -> str:
    return f"max_batch_size: {max_batch_size}\n{io}\nensemble_scheduling {{ step [ {step} ] }}"


def _step_to(model: str) -> str:
    """A step running ``model`` (an ensemble with RAW -> OUT) in place of pre."""
    return STEP_PRE.replace('"pre"', f'"{model}"').replace("NORM", "OUT")


# name -> (config body after name/platform, the reason the load fails with)
INVALID: dict[str, tuple[str, str]] = {
    "bad_unknown_model": (
        _body(STEP_PRE.replace('"pre"', '"no_such_model"')),
        "ensemble bad_unknown_model contains models that are not available or ambiguous: no_such_model"),
    "bad_input_key": (
        _body(STEP_PRE.replace('key: "RAW"', 'key: "WRONG"')),
        "in ensemble bad_input_key, ensemble tensor RAW is mapping to non-existing input WRONG in model pre"),
    "bad_output_key": (
        _body(STEP_PRE.replace("NORM", "WRONG")),
        "in ensemble bad_output_key, ensemble tensor OUT is mapped from non-existing output WRONG in model pre"),
    "bad_dtype": (
        _body(STEP_PRE, IO.replace("TYPE_FP32", "TYPE_INT32", 1)),
        "in ensemble bad_dtype, ensemble tensor RAW: inconsistent data type: TYPE_INT32 is inferred from model "
        "bad_dtype while TYPE_FP32 is inferred from model pre"),
    "bad_shape": (
        _body(STEP_PRE, IO.replace("dims: [ 4 ]", "dims: [ 3 ]", 1)),
        "in ensemble bad_shape, ensemble tensor RAW: inconsistent shape: [-1,3] is inferred from model bad_shape "
        "while [-1,4] is inferred from model pre"),
    "bad_batch": (
        _body(STEP_PRE, max_batch_size=16),
        "ensemble bad_batch allows maximum batch size 16, but it contains model pre which only allows maximum "
        "batch size to be 8"),
    "bad_version": (
        _body(STEP_PRE.replace("{ model_name", "{ model_version: 7 model_name", 1)),
        "ensemble 'bad_version' depends on 'pre' whose required version 7 is not loaded."),
    "bad_unmapped": (
        '''max_batch_size: 0
input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "add_n" input_map { key: "A" value: "A" } output_map { key: "SUM" value: "SUM" } } ] }''',
        "in ensemble bad_unmapped, input B in model add_n is not mapped to any ensemble tensors"),
    "bad_cycle": (
        '''max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "join" input_map [ { key: "A" value: "RAW" }, { key: "B" value: "t2" } ] output_map { key: "SUM" value: "t1" } },
  { model_name: "pre" input_map { key: "RAW" value: "t1" } output_map { key: "NORM" value: "t2" } },
  { model_name: "post" input_map { key: "SCORES" value: "t1" } output_map { key: "OUT" value: "OUT" } }
] }''',
        "in ensemble 'bad_cycle', circular dependency between steps: step 0 (model 'join') -> step 1 (model 'pre') "
        "-> step 0 (model 'join')"),
    "bad_self": (
        _body(_step_to("bad_self")),
        "circular dependency between ensembles: bad_self -> bad_self"),
    "bad_loop_a": (
        _body(_step_to("bad_loop_b")),
        "circular dependency between ensembles: bad_loop_a -> bad_loop_b -> bad_loop_a"),
    "bad_loop_b": (
        _body(_step_to("bad_loop_a")),
        "circular dependency between ensembles: bad_loop_b -> bad_loop_a -> bad_loop_b"),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = write_pipeline_repo(tmp_path_factory.mktemp("ensemble-repo"))
    for name, (body, _) in INVALID.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "ensemble"\n{body}\n')
    return root


@pytest.fixture
def explicit(server_factory, repo):
    return server_factory("--model-control-mode=explicit", repo=repo, timeout=120)


@pytest.fixture(scope="module")
def explicit_shared(repo):
    from e2e.conftest import start_server

    server = start_server("--model-control-mode=explicit", repo=repo, timeout=120)
    yield server
    server.stop()


def _index(client: httpclient.InferenceServerClient) -> dict[str, dict]:
    return {row["name"]: row for row in client.get_model_repository_index()}


def _ready(client, *names: str) -> list[bool]:
    return [client.is_model_ready(n) for n in names]


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_ensemble_fails_to_load_with_its_reason(explicit_shared, name):
    explicit = explicit_shared
    reason = INVALID[name][1]
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.load_model(name)
        assert e.value.status() == "400"
        assert e.value.message() == f"load failed for model '{name}': {reason}"
        row = _index(c)[name]
        assert row["state"] == "UNAVAILABLE" and reason in row["reason"]
        with pytest.raises(InferenceServerException) as infer_error:
            c.infer(name, [httpclient.InferInput("RAW", [1, 4], "FP32").set_data_from_numpy(RAW)])
        assert infer_error.value.status() == "503"
    with grpcclient.InferenceServerClient(explicit.grpc_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.load_model(name)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and reason in e.value.message()
    # the server goes on serving what does load
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        c.load_model("pipeline")
        result = c.infer("pipeline", [httpclient.InferInput("RAW", [1, 4], "FP32").set_data_from_numpy(RAW)])
        np.testing.assert_array_equal(result.as_numpy("OUT"), (RAW * 2 + 1) * 10)


def test_loading_an_ensemble_loads_its_composing_models(explicit):
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        assert not any(row.get("state") == "READY" for row in c.get_model_repository_index())
        c.load_model("nested")  # nested -> pipeline -> pre, mlp, post
        assert _ready(c, "nested", "pipeline", "pre", "mlp", "post") == [True] * 5
        assert not c.is_model_ready("split")
        result = c.infer("nested", [httpclient.InferInput("RAW", [1, 4], "FP32").set_data_from_numpy(RAW)])
        np.testing.assert_array_equal(result.as_numpy("FINAL"), (RAW * 2 + 1) * 100)


def test_unload_dependents(explicit):
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        c.load_model("pipeline")
        c.unload_model("pipeline")
        assert _ready(c, "pipeline", "pre", "mlp", "post") == [False, True, True, True]
        assert _index(c)["pipeline"]["state"] == "UNAVAILABLE"
        c.load_model("pipeline")
        c.load_model("diamond")  # shares nothing with pipeline
        c.unload_model("pipeline", unload_dependents=True)
        assert _ready(c, "pipeline", "pre", "mlp", "post") == [False] * 4
        assert _ready(c, "diamond", "split", "join") == [True] * 3
    with grpcclient.InferenceServerClient(explicit.grpc_url) as c:
        # a model another loaded ensemble uses stays, and so does one the user loaded
        c.load_model("post")
        c.load_model("pipeline")
        c.load_model("nested")
        c.unload_model("nested", unload_dependents=True)
        assert [c.is_model_ready(n) for n in ("nested", "pipeline", "pre", "mlp", "post")] == [
            False, True, True, True, True]
        c.unload_model("pipeline", unload_dependents=True)
        assert [c.is_model_ready(n) for n in ("pipeline", "pre", "mlp", "post")] == [False, False, False, True]


def test_unloading_a_composing_model_unloads_its_ensembles_until_it_is_back(explicit):
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        c.load_model("pipeline")
        c.unload_model("mlp")
        assert _ready(c, "pipeline", "mlp", "pre") == [False, False, True]
        row = _index(c)["pipeline"]
        assert row["state"] == "UNAVAILABLE" and row["reason"] == "unloaded"
        with pytest.raises(InferenceServerException) as e:
            c.infer("pipeline", [httpclient.InferInput("RAW", [1, 4], "FP32").set_data_from_numpy(RAW)])
        assert e.value.status() == "404"  # Triton: an unloaded model has no available versions
        assert e.value.message() == "Request for unknown model: 'pipeline' has no available versions"
        c.load_model("mlp")
        assert c.is_model_ready("pipeline")
        result = c.infer("pipeline", [httpclient.InferInput("RAW", [1, 4], "FP32").set_data_from_numpy(RAW)])
        np.testing.assert_array_equal(result.as_numpy("OUT"), (RAW * 2 + 1) * 10)
        # an ensemble the user unloaded does not come back with its composing model
        c.unload_model("pipeline")
        c.unload_model("post")
        c.load_model("post")
        assert not c.is_model_ready("pipeline")


def test_ensembles_load_after_their_composing_models_at_start_up(server_factory, repo):
    """In the default mode every model loads at start-up; each ensemble waits for its models."""
    server = server_factory(repo=repo, timeout=120)
    with httpclient.InferenceServerClient(server.http_url) as c:
        assert _ready(c, "nested", "pipeline", "diamond", "stream_pipe") == [True] * 4
        rows = _index(c)
        assert rows["bad_unknown_model"]["state"] == "UNAVAILABLE"
        assert "no_such_model" in rows["bad_unknown_model"]["reason"]
        assert "circular dependency between ensembles" in rows["bad_loop_a"]["reason"]
        with pytest.raises(InferenceServerException) as e:
            c.unload_model("pipeline")
        assert "not allowed" in e.value.message()


def test_reloading_a_composing_model_that_no_longer_fits_unloads_the_ensemble(explicit):
    with httpclient.InferenceServerClient(explicit.http_url) as c:
        c.load_model("pipeline")
        config = c.get_model_config("pre")
        config["input"][0]["dims"] = [5]
        config["output"][0]["dims"] = [5]
        c.load_model("pre", config=json.dumps(config))
        assert c.is_model_ready("pre") and not c.is_model_ready("pipeline")
        row = _index(c)["pipeline"]
        assert row["state"] == "UNAVAILABLE"
        assert "in ensemble pipeline, ensemble tensor RAW: inconsistent shape" in row["reason"]
        # put it back and load the ensemble again
        config["input"][0]["dims"] = [4]
        config["output"][0]["dims"] = [4]
        c.load_model("pre", config=json.dumps(config))
        c.load_model("pipeline")
        result = c.infer("pipeline", [httpclient.InferInput("RAW", [1, 4], "FP32").set_data_from_numpy(RAW)])
        np.testing.assert_array_equal(result.as_numpy("OUT"), (RAW * 2 + 1) * 10)
