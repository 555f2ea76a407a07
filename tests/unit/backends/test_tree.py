"""The tree backend (Triton's FIL equivalent) with forests trained at test time, no server.

The model writers here are shared with tests/e2e/test_backends_tree.py.
"""

from __future__ import annotations

from pathlib import Path

import joblib
import lightgbm as lgb
import numpy as np
import pytest
import treelite
import xgboost as xgb
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

from trident import config as cfg
from trident.backends import get_backend
from trident.backends.base import LoadContext
from trident.backends.tree_backend import TreeBackend
from trident.config_validation import validate_config
from trident.errors import Code, TritonError
from trident.protocol.generated.inference import DataType, ModelConfig
from trident.protocol.pbtxt import parse_pbtxt
from trident.types import InferenceRequest, RequestedOutput, Tensor

FEATURES = 6


def dataset(n: int = 300, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.random((n, FEATURES), dtype=np.float32)
    y = np.minimum((x[:, 0] + x[:, 1]) / 2 * classes, classes - 1).astype(np.int64)
    return x, y


def write_tree_model(repo: Path, name: str, kind: str, config: str = "", classes: int = 3) -> tuple[Path, object]:
    """Train a small forest of ``kind`` and save it in its native format; returns (folder, model)."""
    folder = repo / name
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    x, y = dataset(classes=classes)
    if kind == "xgboost_json":
        model = xgb.XGBClassifier(n_estimators=8, max_depth=3).fit(x, y)
        model.get_booster().save_model(str(version / "xgboost.json"))
    elif kind == "xgboost_ubj":
        model = xgb.XGBRegressor(n_estimators=8, max_depth=3).fit(x, x[:, 2] * 10)
        model.get_booster().save_model(str(version / "xgboost.ubj"))
    elif kind == "lightgbm":
        model = lgb.LGBMClassifier(n_estimators=8, num_leaves=7, verbose=-1).fit(x, y)
        model.booster_.save_model(str(version / "model.txt"))
    elif kind == "sklearn_pkl":
        model = RandomForestClassifier(n_estimators=8, max_depth=4, random_state=0).fit(x, np.array(["ant", "bee", "cat"])[y])
        joblib.dump(model, version / "model.pkl")
    elif kind == "treelite_checkpoint":
        model = RandomForestRegressor(n_estimators=8, max_depth=4, random_state=0).fit(x, x[:, 3])
        treelite.sklearn.import_model(model).serialize(str(version / "checkpoint.tl"))
    else:
        raise ValueError(kind)
    (folder / "config.pbtxt").write_text(config or 'backend: "fil"\n')
    return folder, model


def prepare(model_dir: Path) -> ModelConfig:
    config = cfg.complete_defaults(parse_pbtxt((model_dir / "config.pbtxt").read_text()), model_dir.name,
                                   model_dir=model_dir)
    config = TreeBackend().auto_complete_config(config, model_dir, model_dir / "1")
    config = cfg.complete_defaults(config, model_dir.name)
    validate_config(config, model_dir.name, model_dir)
    return config


def load(model_dir: Path, kind: str = "KIND_CPU"):
    config = prepare(model_dir)
    ctx = LoadContext(model_dir.name, 1, model_dir, model_dir / "1", config, cfg.config_to_json(config),
                      f"{model_dir.name}_0", kind, 0)
    return get_backend("fil").load_instance(ctx)


def infer(instance, *xs: np.ndarray, outputs: tuple[str, ...] = ()):
    reqs = [InferenceRequest("m", [Tensor.from_numpy("input__0", x)], outputs=[RequestedOutput(o) for o in outputs])
            for x in xs]
    responses = instance.execute(reqs)
    for r in responses:
        assert r.error is None, r.error
    return responses


ROLES_CONFIG = '''backend: "fil" max_batch_size: 16
input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "predict" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "predict_proba" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { }
'''


def test_xgboost_auto_complete_fil_output_and_batching(tmp_path):
    folder, model = write_tree_model(tmp_path, "xgb", "xgboost_json",
                                     'backend: "fil" parameters { key: "predict_proba" value { string_value: "true" } }')
    config = prepare(folder)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("input__0", DataType.TYPE_FP32, [6])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("output__0", [3])]
    assert config.max_batch_size == 4 and config.dynamic_batching is not None
    instance = load(folder)
    x, _ = dataset(7, seed=5)
    first, second = infer(instance, x[:3], x[3:])  # merged into one predict call
    np.testing.assert_allclose(np.concatenate([first.output("output__0").data, second.output("output__0").data]),
                               model.predict_proba(x), rtol=1e-5)


def test_predict_and_predict_proba_roles_sklearn_labels(tmp_path):
    folder, model = write_tree_model(tmp_path, "rf", "sklearn_pkl", ROLES_CONFIG.replace("TYPE_INT64", "TYPE_STRING"))
    instance = load(folder)
    x, _ = dataset(5, seed=9)
    (resp,) = infer(instance, x)
    assert resp.output("predict").datatype == "BYTES" and resp.output("predict").shape == (5, 1)
    assert [v.decode() for v in resp.output("predict").data.reshape(-1)] == list(model.predict(x))
    np.testing.assert_allclose(resp.output("predict_proba").data, model.predict_proba(x), rtol=1e-6)
    (only,) = infer(instance, x, outputs=("predict_proba",))
    assert [t.name for t in only.outputs] == ["predict_proba"]


def test_lightgbm_class_output_and_threshold(tmp_path):
    config = ('backend: "fil" max_batch_size: 8 input [{ name: "input__0" data_type: TYPE_FP32 dims: [6] }] '
              'output [{ name: "output__0" data_type: TYPE_FP32 dims: [1] }] '
              'parameters { key: "output_class" value { string_value: "true" } }')
    folder, model = write_tree_model(tmp_path, "lgbm", "lightgbm", config)
    instance = load(folder)
    x, _ = dataset(6, seed=2)
    (resp,) = infer(instance, x)
    out = resp.output("output__0")
    assert out.datatype == "FP32" and out.shape == (6, 1)
    assert out.data.reshape(-1).tolist() == model.predict(x).astype(np.float32).tolist()


def test_regressors_xgboost_ubj_and_treelite(tmp_path):
    for kind in ("xgboost_ubj", "treelite_checkpoint"):
        folder, model = write_tree_model(tmp_path, kind, kind)
        config = prepare(folder)
        assert [(o.name, list(o.dims)) for o in config.output] == [("output__0", [1])]
        x, _ = dataset(4, seed=3)
        (resp,) = infer(load(folder), x)
        np.testing.assert_allclose(resp.output("output__0").data.reshape(-1), model.predict(x), rtol=1e-4, atol=1e-5)


def test_config_errors(tmp_path):
    folder, _ = write_tree_model(tmp_path, "reg", "xgboost_ubj", ROLES_CONFIG)
    with pytest.raises(TritonError, match="is a regressor; it has no predict_proba output"):
        load(folder)
    wrong = ROLES_CONFIG.replace("dims: [ 6 ]", "dims: [ 5 ]")
    folder, _ = write_tree_model(tmp_path, "wrong", "xgboost_json", wrong)
    with pytest.raises(TritonError, match="has 6 features"):
        load(folder)
    bad_type = 'backend: "fil" parameters { key: "model_type" value { string_value: "catboost" } }'
    folder, _ = write_tree_model(tmp_path, "bad_type", "lightgbm", bad_type)
    with pytest.raises(TritonError) as e:
        prepare(folder)
    assert e.value.code == Code.INVALID_ARG and "Unrecognized model type 'catboost'" in e.value.message
    folder, _ = write_tree_model(tmp_path, "gpu", "lightgbm")
    with pytest.raises(TritonError) as e:
        load(folder, "KIND_GPU")
    assert e.value.code == Code.UNSUPPORTED
    empty = tmp_path / "empty"
    (empty / "1").mkdir(parents=True)
    (empty / "config.pbtxt").write_text('backend: "tree"\n')
    with pytest.raises(TritonError) as e:
        prepare(empty)
    assert e.value.code == Code.UNAVAILABLE and "no tree model file" in e.value.message


def test_bad_feature_count_in_request_fails_that_request(tmp_path):
    folder, _ = write_tree_model(tmp_path, "xgb", "xgboost_json", ROLES_CONFIG.replace("dims: [ 6 ]", "dims: [ -1 ]"))
    instance = load(folder)
    x, _ = dataset(2)
    good = InferenceRequest("m", [Tensor.from_numpy("input__0", x)])
    bad = InferenceRequest("m", [Tensor.from_numpy("input__0", x[:, :4])])
    r_good, r_bad = instance.execute([good, bad])
    assert r_good.error is None and r_bad.error is not None
