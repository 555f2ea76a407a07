"""Tree models, trident's equivalent of Triton's FIL backend (``backend: "fil"`` or ``"tree"``).

Forests from XGBoost, LightGBM, scikit-learn and Treelite, predicted on CPU with each
library's own predictor (XGBoost ``inplace_predict``, LightGBM ``Booster.predict``,
scikit-learn ``predict``/``predict_proba``, Treelite GTIL), which release the GIL.

``model_type`` parameter (FIL's names) and default file in the version folder:
``xgboost`` (``xgboost.model``), ``xgboost_json`` (``xgboost.json``), ``xgboost_ubj``
(``xgboost.ubj``), ``lightgbm`` (``model.txt``), ``treelite_checkpoint`` (``checkpoint.tl``),
and trident's ``sklearn_pkl`` (``model.pkl``, a pickled/joblib estimator: unpickling runs
code, so only serve repositories you trust). Without ``model_type`` the type follows the
file found.

One input (FIL's ``input__0``: FP32 ``[num_features]``). Outputs by name:
``predict`` (class labels, or values for regressors), ``predict_proba`` (``[num_classes]``),
and any other name (FIL's ``output__0``) as FIL computes it from the parameters
``predict_proba``, ``output_class`` / ``is_classifier`` and ``threshold`` (binary models).
``cpu_nthread`` sets the predictor's threads. Auto-complete fills ``input__0``, ``output__0``
and max_batch_size (with dynamic batching) from the model.
"""

from __future__ import annotations

import copy
import json
import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from trident import config as cfg
from trident.backends._common import (
    BatchRunner,
    bool_parameter,
    closed_run,
    default_max_batch_size,
    int_parameter,
    parameter,
    require,
)
from trident.backends.base import Backend, LoadContext, ModelInstance
from trident.errors import TritonError, internal, invalid_arg, unavailable, unsupported
from trident.protocol.generated.inference import DataType, ModelConfig, ModelInput, ModelOutput
from trident.types import InferenceRequest, InferenceResponse

log = logging.getLogger("trident.backends.tree")

EXTRA = "tree"
MODEL_FILES = {
    "xgboost": "xgboost.model", "xgboost_json": "xgboost.json", "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt", "treelite_checkpoint": "checkpoint.tl", "sklearn_pkl": "model.pkl",
}
_SUFFIXES = {".model": "xgboost", ".json": "xgboost_json", ".ubj": "xgboost_ubj", ".txt": "lightgbm",
             ".tl": "treelite_checkpoint", ".pkl": "sklearn_pkl", ".joblib": "sklearn_pkl"}
ROLES = ("predict", "predict_proba")


class Forest:
    """A loaded forest behind one interface: ``scores`` are class probabilities ``[n, k]``
    for classifiers and values ``[n]`` for regressors."""

    def __init__(self, model: Any, num_features: int, num_classes: int, scores: Any, labels: Any = None) -> None:
        self.model = model
        self.num_features = num_features
        self.num_classes = num_classes  # 0: regressor
        self._scores = scores
        self._labels = labels

    @property
    def is_classifier(self) -> bool:
        return self.num_classes >= 2

    def scores(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._scores(x))

    @staticmethod
    def class_index(proba: np.ndarray, threshold: float = 0.5) -> np.ndarray:
        """Class indices from probabilities: ``p1 > threshold`` for two classes, else the argmax."""
        if proba.shape[1] == 2:
            return (proba[:, 1] > threshold).astype(np.int64)
        return np.argmax(proba, axis=1)

    def labels(self, x: np.ndarray, proba: np.ndarray | None = None, threshold: float = 0.5) -> np.ndarray:
        """Class labels: the estimator's own for scikit-learn, else class indices."""
        if self._labels is not None:
            return np.asarray(self._labels(x))
        return self.class_index(self.scores(x) if proba is None else proba, threshold)


def _two_class(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float32).reshape(-1)
    return np.stack([1 - p, p], axis=1)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _xgboost(path: Path, nthread: int) -> Forest:
    xgb = require("xgboost", "tree", EXTRA)
    booster = xgb.Booster()
    booster.load_model(bytearray(path.read_bytes()))
    if nthread > 0:
        booster.set_param({"nthread": nthread})
    learner = json.loads(booster.save_config())["learner"]
    objective = learner["objective"]["name"]
    classes = int(learner["learner_model_param"].get("num_class", "0"))
    features = booster.num_features()

    def predict(x: np.ndarray, **kw: Any) -> np.ndarray:
        return booster.inplace_predict(x, validate_features=False, **kw)

    if objective == "binary:logistic":
        return Forest(booster, features, 2, lambda x: _two_class(predict(x)))
    if objective == "binary:logitraw":
        return Forest(booster, features, 2, lambda x: _two_class(1 / (1 + np.exp(-predict(x)))))
    if objective == "multi:softprob":
        return Forest(booster, features, classes, lambda x: predict(x).reshape(len(x), classes))
    if objective == "multi:softmax":
        return Forest(booster, features, classes,
                      lambda x: _softmax(predict(x, predict_type="margin").reshape(len(x), classes)))
    def values(x: np.ndarray) -> np.ndarray:
        p = predict(x)
        return p.reshape(len(x)) if p.ndim > 1 and p.shape[1] == 1 else p

    return Forest(booster, features, 0, values)


def _lightgbm(path: Path, nthread: int) -> Forest:
    lgb = require("lightgbm", "tree", EXTRA)
    booster = lgb.Booster(model_file=str(path))
    objective, classes = "", 0
    with path.open() as f:
        for line in f:
            if line.startswith("objective="):
                objective = line.split("=", 1)[1].split()[0]
            elif line.startswith("num_class="):
                classes = int(line.split("=", 1)[1])
            elif line.startswith("Tree="):
                break
    kw = {"num_threads": nthread} if nthread > 0 else {}
    features = booster.num_feature()
    if objective in ("binary", "cross_entropy", "xentropy"):
        return Forest(booster, features, 2, lambda x: _two_class(booster.predict(x, **kw)))
    if objective in ("multiclass", "multiclassova", "softmax", "multiclass_ova", "ova", "ovr"):
        return Forest(booster, features, classes, lambda x: booster.predict(x, **kw))
    return Forest(booster, features, 0, lambda x: booster.predict(x, **kw))


def _treelite(path: Path, nthread: int) -> Forest:
    treelite = require("treelite", "tree", EXTRA)
    gtil = require("treelite.gtil", "tree", EXTRA)
    model = treelite.Model.deserialize(str(path))
    header = model.get_header_accessor()
    task = int(np.asarray(header.get_field("task_type")).reshape(-1)[0])
    classes = int(np.asarray(header.get_field("num_class")).reshape(-1)[0])
    features = int(np.asarray(header.get_field("num_feature")).reshape(-1)[0])
    threads = nthread if nthread > 0 else -1

    def predict(x: np.ndarray) -> np.ndarray:
        return gtil.predict(model, x, nthread=threads)

    if task == 0:  # kBinaryClf
        return Forest(model, features, 2, lambda x: _two_class(predict(x)))
    if task == 2:  # kMultiClf
        return Forest(model, features, classes, lambda x: predict(x).reshape(len(x), classes))
    return Forest(model, features, 0, lambda x: predict(x).reshape(len(x)))


def _sklearn(path: Path, nthread: int) -> Forest:
    require("sklearn", "tree", EXTRA)
    try:
        import joblib

        model = joblib.load(path)
    except ImportError:  # pragma: no cover - joblib comes with scikit-learn
        with path.open("rb") as f:
            model = pickle.load(f)
    if nthread > 0 and hasattr(model, "n_jobs"):
        model.n_jobs = nthread
    features = int(getattr(model, "n_features_in_", 0))
    if hasattr(model, "predict_proba") and hasattr(model, "classes_"):
        return Forest(model, features, len(model.classes_), model.predict_proba, model.predict)
    return Forest(model, features, 0, model.predict)


_LOADERS = {"xgboost": _xgboost, "xgboost_json": _xgboost, "xgboost_ubj": _xgboost, "lightgbm": _lightgbm,
            "treelite_checkpoint": _treelite, "sklearn_pkl": _sklearn}


def locate(config: ModelConfig, version_dir: Path) -> tuple[str, Path]:
    """The model type and file of a version. Raises INVALID_ARG / UNAVAILABLE."""
    model_type = parameter(config, "model_type")
    if model_type is not None and model_type not in MODEL_FILES:
        raise invalid_arg(f"Unrecognized model type '{model_type}' for model '{config.name}'; "
                          f"expected one of {', '.join(MODEL_FILES)}")
    if config.default_model_filename:
        path = version_dir / config.default_model_filename
        model_type = model_type or _SUFFIXES.get(path.suffix)
    elif model_type:
        path = version_dir / MODEL_FILES[model_type]
    else:
        found = [(t, version_dir / f) for t, f in MODEL_FILES.items() if (version_dir / f).exists()]
        if not found:
            raise unavailable(f"no tree model file ({', '.join(MODEL_FILES.values())}) in {version_dir} "
                              f"for model '{config.name}'")
        model_type, path = found[0]
    if path.is_dir():
        path = path / MODEL_FILES.get(model_type or "", path.name)
    if not path.is_file():
        raise unavailable(f"unable to find '{path}' for model '{config.name}'")
    if model_type is None:
        raise invalid_arg(f"cannot tell the model type of '{path.name}' for model '{config.name}'; set the "
                          "'model_type' parameter")
    return model_type, path


def load_forest(config: ModelConfig, version_dir: Path) -> Forest:
    """Load a version's forest. Raises UNSUPPORTED (missing package), UNAVAILABLE, INVALID_ARG."""
    model_type, path = locate(config, version_dir)
    try:
        return _LOADERS[model_type](path, int_parameter(config, "cpu_nthread", 0))
    except TritonError:
        raise
    except Exception as e:
        raise invalid_arg(f"failed to load {model_type} model '{config.name}' from {path.name}: "
                          f"{type(e).__name__}: {e}") from e


class TreeInstance(ModelInstance):
    def __init__(self, forest: Forest, config: ModelConfig) -> None:
        self.forest = forest
        self.batching = config.max_batch_size > 0
        self.dims = {o.name: [int(d) for d in o.dims] for o in config.output}
        self.proba = bool_parameter(config, "predict_proba", False)
        self.output_class = bool_parameter(config, "is_classifier", bool_parameter(config, "output_class", False))
        self.threshold = float(parameter(config, "threshold") or 0.5)
        self.input = config.input[0].name
        self.runner = BatchRunner(config, self._run, _translate, cast_outputs=True)

    def _role(self, name: str) -> str:
        if name in ROLES:
            return name
        if self.proba:
            return "predict_proba"
        return "labels" if self.output_class else "raw"

    def _run(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        x = np.ascontiguousarray(inputs[self.input], dtype=np.float32)
        x = x.reshape(len(x), -1) if x.ndim != 2 else x
        forest, out = self.forest, {}
        memo: list[np.ndarray] = []

        def scores() -> np.ndarray:  # one predictor call however many outputs need it
            if not memo:
                memo.append(forest.scores(x))
            return memo[0]

        for name in names:
            role = self._role(name)
            if role == "predict_proba":
                value = scores()
            elif role == "labels":
                value = forest.class_index(scores(), self.threshold)
            elif role == "predict":
                value = forest.labels(x, None if forest._labels else scores(), self.threshold) \
                    if forest.is_classifier else scores()
            else:  # FIL's raw output: values, or the positive-class probability of a binary model
                value = scores()[:, 1] if forest.num_classes == 2 else scores()
            out[name] = self._shape(name, np.asarray(value), len(x))
        return out

    def _shape(self, name: str, value: np.ndarray, rows: int) -> np.ndarray:
        dims = self.dims[name]
        if not self.batching and dims and dims[0] in (-1, rows):
            dims = dims[1:]
        if -1 not in dims and value.size == rows * int(np.prod(dims)):
            return value.reshape((rows, *dims))
        return value

    def execute(self, requests: list[InferenceRequest]) -> list[InferenceResponse]:
        return self.runner.execute(requests)

    def finalize(self) -> None:
        self.forest = None  # type: ignore[assignment]
        self.runner.run = closed_run


def _translate(e: Exception) -> TritonError:
    if isinstance(e, ValueError):
        return invalid_arg(f"tree model: {e}")
    return internal(f"tree model: {type(e).__name__}: {e}")


class TreeBackend(Backend):
    name = "tree"
    platforms = ()
    default_model_filename = ""

    def auto_complete_config(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                             backend_config: dict[str, str] | None = None) -> ModelConfig:
        """``input__0`` FP32 [num_features], ``output__0`` and max_batch_size from the forest."""
        if (config.input and config.output) or version_dir is None:
            return config
        forest = load_forest(config, version_dir)
        config = copy.deepcopy(config)
        if not config.input:
            config.input.append(ModelInput(name="input__0", data_type=DataType.TYPE_FP32, dims=[forest.num_features]))
            if config.max_batch_size == 0:
                config.max_batch_size = default_max_batch_size(backend_config)
                cfg.enable_default_dynamic_batching(config)
        if not config.output:
            proba = bool_parameter(config, "predict_proba", False)
            width = forest.num_classes if proba and forest.is_classifier else 1
            config.output.append(ModelOutput(name="output__0", data_type=DataType.TYPE_FP32, dims=[width]))
        return config

    def load_instance(self, ctx: LoadContext) -> ModelInstance:
        """Load the forest for one CPU instance. Raises UNSUPPORTED (KIND_GPU, missing package),
        UNAVAILABLE (missing file) or INVALID_ARG (config that does not fit the model)."""
        config = ctx.config
        if ctx.instance_kind == "KIND_GPU":
            raise unsupported(f"model '{config.name}': the tree backend predicts on CPU only; use KIND_CPU")
        forest = load_forest(config, ctx.version_dir)
        check_tree_config(config, forest)
        log.info("loaded tree model '%s' %s (%d features, %s)", config.name, ctx.instance_name,
                 forest.num_features, f"{forest.num_classes} classes" if forest.is_classifier else "regressor")
        instance = TreeInstance(forest, config)
        instance.inline_safe = True
        return instance


def check_tree_config(config: ModelConfig, forest: Forest) -> None:
    """One numeric input of ``[num_features]``; ``predict_proba`` outputs need a classifier."""
    if len(config.input) != 1:
        raise invalid_arg(f"tree model '{config.name}' takes exactly one input, the configuration has "
                          f"{len(config.input)}")
    dims = [int(d) for d in config.input[0].dims]
    features = dims[-1] if dims else 0
    if forest.num_features and features not in (-1, forest.num_features):
        raise invalid_arg(f"tree model '{config.name}' has {forest.num_features} features, the configuration's "
                          f"input '{config.input[0].name}' has dims {dims}")
    wants_proba = any(o.name == "predict_proba" for o in config.output) or (
        bool_parameter(config, "predict_proba", False) and any(o.name not in ROLES for o in config.output))
    if wants_proba and not forest.is_classifier:
        raise invalid_arg(f"tree model '{config.name}' is a regressor; it has no predict_proba output")
