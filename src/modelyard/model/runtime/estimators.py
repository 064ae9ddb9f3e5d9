"""scikit-learn and XGBoost models as servables: what Vertex AI's prebuilt prediction images serve.

A version directory holding ``model.joblib``, ``model.pkl`` or ``model.bst`` (the file names
Vertex's ``sklearn-cpu.*`` and ``xgboost-cpu.*`` images look for) is served with one signature,
``serving_default``: input ``instances`` (float64 rows, ``[-1, n_features]`` when the model knows
its feature count), output ``predictions``. The prediction is what those images compute:

- scikit-learn: ``model.predict(np.asarray(instances))`` (the class labels for a classifier,
  not ``predict_proba``), the model from ``model.joblib`` (preferred) or ``model.pkl``;
- XGBoost: ``booster.predict(xgboost.DMatrix(instances))``, the model from ``model.bst`` (a saved
  Booster, preferred), else ``model.joblib`` (joblib, or a Booster file under that name) or
  ``model.pkl``. A Booster's ``predict`` gives what its objective gives (probabilities for
  ``multi:softprob``); a pickled ``XGBClassifier`` gives its own ``predict`` (class labels).

A loaded object is XGBoost's when it is a Booster or one of XGBoost's scikit-learn wrappers, so a
directory needs no other hint. Loading a pickle runs code from the file: serve only models you
trust (the platform takes artifacts only from its ``--artifact-root``s when given).
The libraries are optional (``pip install 'modelyard[sklearn]'``, ``'modelyard[xgboost]'``); a
missing one is FAILED_PRECONDITION naming the install command.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from modelyard.errors import Code, ServingError
from modelyard.model import dtypes
from modelyard.model.runtime.servable import Servable
from modelyard.model.signatures import DEFAULT_SIGNATURE, PREDICT_METHOD, Signature, TensorSpec

SKLEARN, XGBOOST = "sklearn", "xgboost"
# The files each framework's prebuilt image loads, in the order it looks for them.
MODEL_FILES = {SKLEARN: ("model.joblib", "model.pkl"), XGBOOST: ("model.bst", "model.joblib", "model.pkl")}
ESTIMATOR_FILES = ("model.bst", "model.joblib", "model.pkl")
INSTALL = {SKLEARN: "pip install 'modelyard[sklearn]'", XGBOOST: "pip install 'modelyard[xgboost]'"}
# The Python module each framework needs, and each file's loader.
MODULES = {SKLEARN: "sklearn", XGBOOST: "xgboost"}
INPUT, OUTPUT = "instances", "predictions"


def model_file(path: Path) -> Path | None:
    """The estimator file a version directory holds (in the prebuilt images' order), or None."""
    for name in ESTIMATOR_FILES:
        if (path / name).is_file():
            return path / name
    return None


def _missing(framework: str, exc: ImportError) -> ServingError:
    return ServingError(Code.FAILED_PRECONDITION, f"serving a {framework} model needs {MODULES[framework]} "
                                                  f"({exc}): {INSTALL[framework]}")


def _load_object(file: Path):
    """The model object in ``file``, as the prebuilt images read it."""
    if file.name == "model.bst":
        try:
            import xgboost
        except ImportError as exc:
            raise _missing(XGBOOST, exc) from None
        return xgboost.Booster(model_file=str(file))
    if file.name == "model.joblib":
        try:
            import joblib
        except ImportError as exc:
            raise _missing(SKLEARN, exc) from None
        try:
            return joblib.load(file)
        except KeyError:  # not a joblib pickle: XGBoost's image then reads it as a saved Booster
            try:
                import xgboost
            except ImportError as exc:
                raise _missing(XGBOOST, exc) from None
            booster = xgboost.Booster()
            booster.load_model(str(file))
            return booster
    with open(file, "rb") as f:
        return pickle.load(f)


def framework_of(model) -> str:
    """``xgboost`` for a Booster or one of XGBoost's scikit-learn wrappers, else ``sklearn``."""
    module = type(model).__module__ or ""
    return XGBOOST if module == "xgboost" or module.startswith("xgboost.") else SKLEARN


def _features(model) -> int:
    """The model's feature count, -1 when it does not say."""
    count = getattr(model, "n_features_in_", None)
    if count is None and hasattr(model, "num_features"):
        try:
            count = model.num_features()
        except Exception:  # a Booster of an old format may not know it
            count = None
    return int(count) if isinstance(count, (int, np.integer)) and count > 0 else -1


class EstimatorServable(Servable):
    """One scikit-learn or XGBoost model; ``runtime`` says which."""

    def __init__(self, path: Path, file: Path):
        try:
            model = _load_object(file)
        except ServingError:
            raise
        except ModuleNotFoundError as exc:  # a pickle naming a library this host lacks
            framework = XGBOOST if (exc.name or "").startswith("xgboost") else SKLEARN
            raise _missing(framework, exc) from None
        except Exception as exc:
            raise ServingError(Code.INVALID_ARGUMENT, f"could not load {file}: {type(exc).__name__}: {exc}") from None
        self.model = model
        self.runtime = framework_of(model)
        # A Booster predicts a DMatrix; XGBoost's scikit-learn wrappers take the rows as they are
        # (XGBoost 2+ refuses a DMatrix there), which gives the same predictions.
        self._booster = self.runtime == XGBOOST and type(model).__name__ == "Booster"
        if self.runtime == XGBOOST:
            try:
                import xgboost
            except ImportError as exc:
                raise _missing(XGBOOST, exc) from None
            self._dmatrix = xgboost.DMatrix
        elif not callable(getattr(model, "predict", None)):
            raise ServingError(Code.INVALID_ARGUMENT, f"{file} holds a {type(model).__name__}, which has no "
                                                      "predict method")
        classes = getattr(model, "classes_", None)
        out_dtype = dtypes.DT_DOUBLE
        if isinstance(classes, np.ndarray) and classes.dtype.kind in "iuf":
            out_dtype = dtypes.from_numpy(classes.dtype)
        elif isinstance(classes, np.ndarray):
            out_dtype = dtypes.DT_STRING
        elif self._booster:
            out_dtype = dtypes.DT_FLOAT
        signature = Signature(DEFAULT_SIGNATURE, PREDICT_METHOD,
                              {INPUT: TensorSpec(INPUT, INPUT, dtypes.DT_DOUBLE, (-1, _features(model)))},
                              {OUTPUT: TensorSpec(OUTPUT, OUTPUT, out_dtype, None)})
        # Servable.__init__ is not called: the SignatureDef map is built when metadata asks for it,
        # so a batch worker serving an estimator never imports TensorFlow's protos.
        self.path, self.signatures, self.file = path, {DEFAULT_SIGNATURE: signature}, file
        self._signature_def_map = None

    @property
    def signature_def_map(self):
        if self._signature_def_map is None:
            from modelyard.model.runtime.litert import signature_def_map

            self._signature_def_map = signature_def_map(self.signatures)
        return self._signature_def_map

    def run(self, signature: Signature, inputs: dict[str, np.ndarray],
            output_aliases: tuple[str, ...]) -> dict[str, np.ndarray]:
        rows = inputs[INPUT]
        try:
            if self._booster:
                predicted = self.model.predict(self._dmatrix(rows))
            else:
                predicted = self.model.predict(rows)
        except (ValueError, TypeError) as exc:  # the library's own words for a wrong instance
            raise ServingError(Code.INVALID_ARGUMENT, f"{type(exc).__name__}: {exc}") from None
        predicted = np.asarray(predicted)
        if predicted.dtype.kind in "OSU":  # string labels: DT_STRING's form, an object array of bytes
            predicted = np.array([v if isinstance(v, bytes) else str(v).encode("utf-8") for v in predicted.ravel()],
                                 dtype=object).reshape(predicted.shape)
        return {OUTPUT: predicted}


def load_estimator(path: Path) -> EstimatorServable:
    """The servable of a version directory holding ``model.joblib``, ``model.pkl`` or ``model.bst``."""
    file = model_file(path)
    if file is None:
        raise ServingError(Code.NOT_FOUND, f"{path} holds none of {', '.join(ESTIMATOR_FILES)}")
    return EstimatorServable(path, file)
