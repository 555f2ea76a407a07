"""Tree models (XGBoost, LightGBM, scikit-learn, Treelite) served end to end with tritonclient."""

from __future__ import annotations

import numpy as np
import pytest
from e2e.test_backends_onnxruntime import BOTH, check_dynamic_batching, expect_error
from unit.backends.test_tree import ROLES_CONFIG, dataset, write_tree_model

PROBA = 'backend: "fil" parameters { key: "predict_proba" value { string_value: "true" } }'
BATCHED = ('backend: "fil" max_batch_size: 64 instance_group [{ count: 1 kind: KIND_CPU }] dynamic_batching { } '
           'parameters { key: "predict_proba" value { string_value: "true" } }')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.conftest import start_server

    repo = tmp_path_factory.mktemp("tree-repo")
    models = {
        "xgb": write_tree_model(repo, "xgb", "xgboost_json", PROBA)[1],
        "lgbm": write_tree_model(repo, "lgbm", "lightgbm", BATCHED)[1],
        "rf": write_tree_model(repo, "rf", "sklearn_pkl", ROLES_CONFIG.replace("TYPE_INT64", "TYPE_STRING"))[1],
        "tl": write_tree_model(repo, "tl", "treelite_checkpoint")[1],
    }
    s = start_server(repo=repo)
    s.models = models  # type: ignore[attr-defined]
    yield s
    s.stop()


@BOTH
def test_xgboost_proba_auto_completed(server, infer):
    x, _ = dataset(3, seed=4)
    out = infer(server, "xgb", {"input__0": x})
    np.testing.assert_allclose(out["output__0"], server.models["xgb"].predict_proba(x), rtol=1e-5)


@BOTH
def test_sklearn_labels_and_proba(server, infer):
    x, _ = dataset(4, seed=6)
    model = server.models["rf"]
    out = infer(server, "rf", {"input__0": x})
    assert [v.decode() for v in out["predict"].reshape(-1)] == list(model.predict(x))
    np.testing.assert_allclose(out["predict_proba"], model.predict_proba(x), rtol=1e-6)


@BOTH
def test_treelite_regressor(server, infer):
    x, _ = dataset(4, seed=8)
    out = infer(server, "tl", {"input__0": x})
    np.testing.assert_allclose(out["output__0"].reshape(-1), server.models["tl"].predict(x), rtol=1e-4, atol=1e-5)


def test_dynamic_batching_lightgbm(server):
    model = server.models["lgbm"]

    def make(i: int) -> dict[str, np.ndarray]:
        return {"input__0": dataset(1 + i % 5, seed=i)[0]}

    def check(inputs: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
        np.testing.assert_allclose(out["output__0"], model.predict_proba(inputs["input__0"]), rtol=1e-5, atol=1e-6)

    assert check_dynamic_batching(server, "lgbm", make, check) > 1


@BOTH
def test_bad_inputs(server, infer):
    expect_error(infer, server, "xgb", {"input__0": np.ones((1, 5), np.float32)}, "unexpected shape for input 'input__0'")
    expect_error(infer, server, "xgb", {"input__0": np.ones((1, 6), np.float64)}, "data-type is 'FP64'")
