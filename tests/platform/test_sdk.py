"""Test 1 of issue 15: the stock google-cloud-aiplatform SDK drives ``modelyard platform`` unchanged.

The SDK stages a local model directory in GCS (here a local emulator) and hands the platform a
gs:// URI; a second model is uploaded by gs:// URI directly. Predictions must equal the model's own.
"""
from __future__ import annotations

import numpy as np
import pytest
import requests

from tests.platform.conftest import STAGING_BUCKET
from tests.platform.jobs_helpers import aiplatform  # noqa: F401  (the SDK pointed at the session platform)


def _upload_dir(client, local: str, prefix: str) -> str:
    from pathlib import Path

    bucket = client.bucket(STAGING_BUCKET)
    for f in Path(local).rglob("*"):
        if f.is_file():
            bucket.blob(f"{prefix}/{f.relative_to(local)}").upload_from_filename(str(f))
    return f"gs://{STAGING_BUCKET}/{prefix}"


def test_textbook_workflow_with_the_stock_sdk(aiplatform, platform, tiny_models, gcs_emulator):
    from google.api_core import exceptions

    tiny1, tiny2 = tiny_models["models"]["tiny1"], tiny_models["models"]["tiny2"]
    X_new = np.array(tiny_models["instances"], np.float32)

    model = aiplatform.Model.upload(display_name="tiny", artifact_uri=tiny1["path"],
                                    serving_container_image_uri="modelyard/serve")
    assert model.uri.startswith(f"gs://{STAGING_BUCKET}/")  # the SDK staged it
    assert model.version_id == "1"
    endpoint = aiplatform.Endpoint.create(display_name="tiny-endpoint")
    endpoint.deploy(model, min_replica_count=1, max_replica_count=3, machine_type="n1-standard-4")
    prediction = endpoint.predict(instances=X_new.tolist())
    np.testing.assert_allclose(prediction.predictions, tiny1["predictions"], rtol=1e-5, atol=1e-6)
    first = prediction.deployed_model_id
    assert prediction.model_resource_name == model.resource_name and prediction.model_version_id == "1"
    assert endpoint.traffic_split == {first: 100}

    # A second model, uploaded by gs:// URI, as a 10% canary.
    uri = _upload_dir(gcs_emulator["client"], tiny2["path"], "by-hand/tiny2")
    model_v2 = aiplatform.Model.upload(display_name="tiny-v2", artifact_uri=uri,
                                       serving_container_image_uri="modelyard/serve")
    assert model_v2.uri == uri
    endpoint.deploy(model_v2, traffic_percentage=10)
    split = endpoint.traffic_split
    canary = next(k for k in split if k != first)
    assert split == {first: 90, canary: 10}
    seen = {}
    for _ in range(30):
        p = endpoint.predict(instances=X_new.tolist())
        seen[p.deployed_model_id] = p.predictions
    assert seen[first] == prediction.predictions
    if canary in seen:
        np.testing.assert_allclose(seen[canary], tiny2["predictions"], rtol=1e-5, atol=1e-6)
    # The canary answers when pinned, with its own predictions.
    r = requests.post(f"{platform.url}/v1/{endpoint.resource_name}:predict", json={"instances": X_new.tolist()},
                      headers={"X-Modelyard-Deployed-Model-Id": canary}, timeout=30)
    assert r.status_code == 200 and r.json()["deployedModelId"] == canary
    np.testing.assert_allclose(r.json()["predictions"], tiny2["predictions"], rtol=1e-5, atol=1e-6)

    # update-traffic through the SDK (PATCH with an update mask), then rawPredict (the body as the replica sent it).
    endpoint.update(traffic_split={first: 0, canary: 100})
    assert endpoint.traffic_split == {canary: 100}
    # (The SDK's raw_predict always calls {location}-aiplatform.googleapis.com, whatever api_endpoint says.)
    raw = requests.post(f"{platform.url}/v1/{endpoint.resource_name}:rawPredict", json={"instances": X_new.tolist()},
                        timeout=30)
    assert raw.status_code == 200 and raw.headers["X-Vertex-AI-Deployed-Model-Id"] == canary
    assert set(raw.json()) == {"predictions"}

    endpoint_id = endpoint.name
    endpoint.undeploy_all()
    assert endpoint.traffic_split == {} and not endpoint.list_models()
    endpoint.delete()
    model.delete()
    model_v2.delete()
    with pytest.raises(exceptions.NotFound):
        aiplatform.Model(model.resource_name)
    with pytest.raises(exceptions.NotFound):
        aiplatform.Endpoint(endpoint.resource_name).display_name  # the SDK loads it lazily
    # No replica of this endpoint outlives it (other tests' endpoints share the platform).
    replicas = requests.get(f"{platform.url}/modelyard/v1/replicas", timeout=5).json()["replicas"]
    assert [r for r in replicas if r["endpointId"] == endpoint_id] == []
