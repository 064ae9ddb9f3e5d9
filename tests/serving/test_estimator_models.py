"""scikit-learn and XGBoost version directories (Vertex's prebuilt images' files) served by ``modelyard serve``.

Through a real server: string class labels come back as JSON strings, a wrong feature count is
INVALID_ARGUMENT in the library's words, metadata describes the one signature. One layer down:
each file the prebuilt images read (``model.joblib``, ``model.pkl``, ``model.bst``, and a Booster
saved under ``model.joblib``) gives the library's own ``predict``.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import requests

from modelyard.model.runtime.estimators import load_estimator
from tests.platform.conftest import require
from tests.serving.server_process import ServerProcess


@pytest.fixture(scope="module")
def iris():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    return X, np.array(["setosa", "versicolor", "virginica"])[y]


def test_a_classifier_with_string_labels_through_modelyard_serve(iris, tmp_path):
    import joblib
    from sklearn.tree import DecisionTreeClassifier

    X, labels = iris
    clf = DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, labels)
    (tmp_path / "iris" / "1").mkdir(parents=True)
    joblib.dump(clf, tmp_path / "iris" / "1" / "model.joblib")
    with ServerProcess("--model_base_path", str(tmp_path / "iris"), "--model_name", "iris", log_dir=tmp_path) as server:
        r = requests.post(server.base + "/v1/models/iris:predict", json={"instances": X[::30].tolist()}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json() == {"predictions": clf.predict(X[::30]).tolist()}
        bad = requests.post(server.base + "/v1/models/iris:predict", json={"instances": [[5.1, 3.5]]}, timeout=30)
        # The one shape rule's message (model/signatures.TensorSpec.shape_mismatch), not scikit-learn's words.
        assert bad.status_code == 400 and bad.json()["error"] == (
            "input 'instances' has shape [1, 2]; the model expects [-1, 4] (-1: any size)"), bad.text
        meta = requests.get(server.base + "/v1/models/iris/metadata", timeout=30).json()
        sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert sig["inputs"]["instances"]["dtype"] == "DT_DOUBLE"
        assert [d["size"] for d in sig["inputs"]["instances"]["tensor_shape"]["dim"]] == ["-1", "4"]
        assert sig["outputs"]["predictions"]["dtype"] == "DT_STRING"


def test_each_file_the_prebuilt_images_read(iris, tmp_path):
    import joblib
    from sklearn.linear_model import LinearRegression

    xgb = require("xgboost", "pip install -e '.[test]' (installs xgboost-cpu), or pip install 'modelyard[xgboost]'")
    X, _labels = iris
    target = X[:, 3] * 2 + 1
    regressor = LinearRegression().fit(X[:, :3], target)
    (tmp_path / "pkl").mkdir()
    with open(tmp_path / "pkl" / "model.pkl", "wb") as f:
        pickle.dump(regressor, f)
    booster = xgb.train({"max_depth": 2}, xgb.DMatrix(X, label=target), num_boost_round=4)
    (tmp_path / "bst").mkdir()
    booster.save_model(str(tmp_path / "bst" / "model.bst"))
    (tmp_path / "booster-joblib").mkdir()  # a Booster file under joblib's name: XGBoost's image reads it so
    booster.save_model(str(tmp_path / "booster-joblib" / "model.joblib"))
    (tmp_path / "xgb-sklearn").mkdir()
    wrapped = xgb.XGBRegressor(n_estimators=4, max_depth=2).fit(X, target)
    joblib.dump(wrapped, tmp_path / "xgb-sklearn" / "model.joblib")
    own = booster.predict(xgb.DMatrix(X))
    for name, rows, expected, runtime in [("pkl", X[:, :3], regressor.predict(X[:, :3]), "sklearn"),
                                          ("bst", X, own, "xgboost"), ("booster-joblib", X, own, "xgboost"),
                                          ("xgb-sklearn", X, wrapped.predict(X), "xgboost")]:
        servable = load_estimator(tmp_path / name)
        assert servable.runtime == runtime, name
        sig = servable.signatures["serving_default"]
        got = servable.run(sig, {"instances": rows}, ("predictions",))["predictions"]
        np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=name)
