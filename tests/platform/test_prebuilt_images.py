"""Issue 34: models for Vertex AI's prebuilt scikit-learn and XGBoost images, through the stock SDK.

``Model.upload_scikit_learn_model_file`` / ``upload_xgboost_model_file`` stage the file as
``model.joblib`` / ``model.bst`` in the staging bucket and name Vertex's ``sklearn-cpu.*`` /
``xgboost-cpu.*`` image. Each model (trained here on the digits, uploaded once for the module) runs a
batch job whose rows are the library's own ``predict``; both deploy once, to real replicas
(``modelyard serve`` serving the file) behind one endpoint split 50/50, and each answer of
``endpoint.predict`` is the library's own prediction of the model that served it (each replica
start imports its library: one deploy per model is all the module pays). Bad uploads are refused
at once; a missing library is FAILED_PRECONDITION with the install command (one layer down: the
platform's host has both).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import requests

from tests.platform.conftest import STAGING_BUCKET, require
from tests.platform.jobs_helpers import aiplatform, no_stray_jobs  # noqa: F401


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return X[:600], y[:600]  # enough to learn the ten digits; small enough to train in a second


@pytest.fixture(scope="module")
def sklearn_model(aiplatform, digits, tmp_path_factory):
    """A LogisticRegression of the digits as uploaded with the stock SDK, and its own predictions."""
    import joblib
    from sklearn.linear_model import LogisticRegression

    X, y = digits
    path = tmp_path_factory.mktemp("sklearn") / "digits.joblib"
    clf = LogisticRegression(max_iter=200).fit(X, y)
    joblib.dump(clf, path)
    model = aiplatform.Model.upload_scikit_learn_model_file(model_file_path=str(path), display_name="digits-sklearn")
    # Vertex's scikit-learn image answers predict(), the class labels
    yield model, joblib.load(path).predict(X)
    model.delete()


@pytest.fixture(scope="module")
def xgboost_model(aiplatform, digits, tmp_path_factory):
    """An XGBoost softprob booster of the digits as uploaded with the stock SDK, and its own predictions."""
    xgb = require("xgboost", "pip install -e '.[test]' (installs xgboost-cpu), or pip install 'modelyard[xgboost]'")
    X, y = digits
    path = tmp_path_factory.mktemp("xgboost") / "digits.bst"
    xgb.XGBClassifier(n_estimators=8, max_depth=3, objective="multi:softprob").fit(X, y).get_booster() \
        .save_model(str(path))
    model = aiplatform.Model.upload_xgboost_model_file(model_file_path=str(path), display_name="digits-xgboost")
    # Vertex's XGBoost image answers Booster.predict(DMatrix(instances)): softprob's ten probabilities
    own = xgb.Booster(model_file=str(path)).predict(xgb.DMatrix(X))
    assert own.shape == (len(X), 10)
    yield model, own
    model.delete()


def _batch(gcs_emulator, model, X, expected, name: str) -> None:
    """A batch job over 40 rows: every row succeeds and its prediction equals ``expected``'s."""
    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    bucket.blob(f"{name}/in/rows.jsonl").upload_from_string("".join(json.dumps(r) + "\n" for r in X[:40].tolist()))
    job = model.batch_predict(job_display_name=name, gcs_source=f"gs://{STAGING_BUCKET}/{name}/in/rows.jsonl",
                              gcs_destination_prefix=f"gs://{STAGING_BUCKET}/{name}/out", instances_format="jsonl",
                              predictions_format="jsonl", machine_type="n1-standard-2", sync=True)
    assert job.completion_stats.successful_count == 40 and job.completion_stats.failed_count == 0
    rows = [json.loads(line) for b in job.iter_outputs() if "results" in b.name
            for line in b.download_as_text().splitlines() if line.strip()]
    got = {json.dumps(r["instance"]): r["prediction"] for r in rows}
    np.testing.assert_allclose([got[json.dumps(x)] for x in X[:40].tolist()], expected[:40], rtol=1e-5, atol=1e-6)


def test_a_scikit_learn_model_file(sklearn_model, gcs_emulator, digits):
    model, expected = sklearn_model
    assert model.container_spec.image_uri == "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-0:latest"
    _batch(gcs_emulator, model, digits[0], expected, "digits-sklearn")


def test_an_xgboost_model_file(xgboost_model, gcs_emulator, digits):
    model, expected = xgboost_model
    assert model.container_spec.image_uri == "us-docker.pkg.dev/vertex-ai/prediction/xgboost-cpu.1-4:latest"
    _batch(gcs_emulator, model, digits[0], expected, "digits-xgboost")


def test_an_image_whose_files_are_missing_is_refused_at_upload(platform, gcs_emulator):
    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    bucket.blob("prebuilt-bad/model.bst").upload_from_string(b"not read: refused before any load")
    body = {"model": {"displayName": "wrong-file", "artifactUri": f"gs://{STAGING_BUCKET}/prebuilt-bad",
                      "containerSpec": {"imageUri": "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest"}}}
    r = requests.post(platform.api("models:upload"), json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert "serves model.joblib or model.pkl" in error["message"], error


# ---- one layer down: the image names and the missing-library answer ----------------------------------
def test_which_images_are_prebuilt_scikit_learn_or_xgboost():
    from modelyard.platform.resources.prebuilt_images import image_framework

    assert image_framework("us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3:latest") == "sklearn"
    assert image_framework("europe-docker.pkg.dev/vertex-ai/prediction/xgboost-cpu.2-1:latest") == "xgboost"
    assert image_framework("asia-docker.pkg.dev/vertex-ai/prediction/xgboost-gpu.1-1:latest") == "xgboost"
    for other in ("us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest", "modelyard/serve", "",
                  "us-docker.pkg.dev/vertex-ai/prediction/sklearn-cpu.1-3", "gcr.io/x/sklearn-cpu.1-3:latest"):
        assert image_framework(other) is None, other


@pytest.mark.parametrize("framework,file,install", [("sklearn", "model.joblib", "pip install 'modelyard[sklearn]'"),
                                                    ("xgboost", "model.bst", "pip install 'modelyard[xgboost]'")])
def test_a_missing_library_is_a_clear_error_at_upload(framework, file, install, tmp_path, monkeypatch):
    from modelyard.platform.resources import prebuilt_images
    from modelyard.platform.api.errors import ApiError

    (tmp_path / file).write_bytes(b"x")
    image = f"us-docker.pkg.dev/vertex-ai/prediction/{framework}-cpu.1-0:latest"
    prebuilt_images.check_upload({"imageUri": image}, tmp_path, "gs://b/m")  # installed here: accepted
    monkeypatch.setattr(prebuilt_images, "_installed", lambda module: False)  # as on a host without it
    with pytest.raises(ApiError) as caught:
        prebuilt_images.check_upload({"imageUri": image}, tmp_path, "gs://b/m")
    assert caught.value.status == "FAILED_PRECONDITION" and caught.value.message.endswith(install), caught.value.message
    if framework == "xgboost":  # model.bst needs XGBoost whatever image is named
        with pytest.raises(ApiError, match="modelyard\\[xgboost\\]"):
            prebuilt_images.check_upload({"imageUri": "modelyard/serve"}, tmp_path, "gs://b/m")


def test_scikit_learn_and_xgboost_behind_one_traffic_split(aiplatform, sklearn_model, xgboost_model, digits):
    """Two kinds of model on one endpoint, 50/50: each answer is the library's own prediction of the
    deployed model that served it (the response names it), and both serve."""
    (sk, sk_own), (xg, xg_own) = sklearn_model, xgboost_model
    X = digits[0][:16]
    expected = {sk.resource_name: sk_own[:16], xg.resource_name: xg_own[:16]}
    endpoint = aiplatform.Endpoint.create(display_name="split-kinds")
    try:
        endpoint.deploy(sk, machine_type="n1-standard-2", traffic_percentage=100)
        endpoint.deploy(xg, machine_type="n1-standard-2", traffic_percentage=50)
        assert sorted(endpoint.traffic_split.values()) == [50, 50]
        served = set()
        for _ in range(40):
            answer = endpoint.predict(instances=X.tolist())
            served.add(answer.model_resource_name)
            np.testing.assert_allclose(np.asarray(answer.predictions, np.float64), expected[answer.model_resource_name],
                                       rtol=1e-5, atol=1e-6)
            if len(served) == 2:
                break
        assert served == set(expected)  # 40 tries at 50/50: both answered (a miss is 2**-39)
    finally:
        endpoint.undeploy_all()
        endpoint.delete()
