"""Issue 34: the platform hands the model what Vertex AI hands it, through the stock SDK.

The SDK sends a uint8 image's pixels as JSON doubles (``0.0``: every number is a protobuf Value
on the way). On Vertex AI the model gets them as integers; so here, on ``:predict``, ``:rawPredict``
and batch jobs (the platform starts its replicas with ``--json_numbers vertex`` and its jobs with
the same rule), while ``0.5`` and ``300`` are still INVALID_ARGUMENT. ``modelyard serve`` alone keeps
TF Serving's rule (tests/serving/test_json_number_rules.py).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import requests

from tests.platform.jobs_helpers import aiplatform, no_stray_jobs, wait_state  # noqa: F401


@pytest.fixture(scope="module")
def digits(tiny_models) -> dict:
    """A small digits classifier on uint8 pixels (load_digits' 0-16 scaled to 0-240), its first three
    images and its own predictions of them: built with the session's tiny models (build_models.py),
    in the one process that imports TensorFlow for them."""
    return tiny_models["digits"]


@pytest.fixture(scope="module")
def endpoint(aiplatform, digits):
    model = aiplatform.Model.upload(display_name="digits-uint8", artifact_uri=digits["path"],
                                    serving_container_image_uri="us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest")
    endpoint = aiplatform.Endpoint.create(display_name="digits-uint8")
    endpoint.deploy(model, machine_type="n1-standard-2")
    yield model, endpoint
    endpoint.undeploy_all()
    endpoint.delete()
    model.delete()


def test_the_sdks_doubles_reach_a_uint8_input_as_integers(endpoint, digits, platform):
    from google.api_core import exceptions

    _model, endpoint = endpoint
    pixels = np.array(digits["instances"], np.uint8)
    for instances in (pixels.tolist(), pixels.astype(np.float64).tolist()):  # the SDK sends both as 0.0, 240.0, ...
        prediction = endpoint.predict(instances=instances)
        np.testing.assert_allclose(prediction.predictions, digits["predictions"], rtol=1e-5, atol=1e-6)
    # :rawPredict gets the body as written: doubles and an exponent
    body = '{"instances": [[' + ",".join(f"{v:.1f}" if i % 2 else f"{v / 10:g}e1" for i, v in
                                         enumerate(pixels[0].tolist())) + "]]}"
    raw = requests.post(f"{platform.url}/v1/{endpoint.resource_name}:rawPredict", data=body,
                        headers={"Content-Type": "application/json"}, timeout=30)
    assert raw.status_code == 200, raw.text
    np.testing.assert_allclose(raw.json()["predictions"], digits["predictions"][:1], rtol=1e-5, atol=1e-6)

    with pytest.raises(exceptions.BadRequest, match="JSON Value: 0.5 Type: Number is not of expected type: uint8"):
        endpoint.predict(instances=[[0.5] + [0.0] * 63])
    with pytest.raises(exceptions.BadRequest, match="JSON Value out of range for uint8"):
        endpoint.predict(instances=[[300.0] + [0.0] * 63])
    bad = requests.post(f"{platform.url}/v1/{endpoint.resource_name}:predict",
                        json={"instances": [[0.5] + [0] * 63]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT", bad.text


def test_a_batch_job_follows_the_same_rule(endpoint, digits, platform, tmp_path):
    model, _endpoint = endpoint
    pixels = np.array(digits["instances"], np.uint8)
    lines = [json.dumps(row) for row in pixels.astype(np.float64).tolist()]  # 0.0, 240.0, ...
    lines.append(json.dumps([0.5] + [0] * 63))
    lines.append(json.dumps([300] + [0] * 63))
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    body = {"displayName": "uint8-doubles", "model": model.resource_name,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [str(tmp_path / "in.jsonl")]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(tmp_path / "out")}}}
    created = requests.post(platform.api("batchPredictionJobs"), json=body, timeout=30)
    assert created.status_code == 200, created.text
    job = wait_state(platform, created.json()["name"], ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"))
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    assert job["completionStats"] == {"successfulCount": "3", "failedCount": "2", "incompleteCount": "0"}
    out = tmp_path / "out" / job["outputInfo"]["gcsOutputDirectory"].rsplit("/", 1)[-1]
    results = [json.loads(x) for x in (out / "prediction.results-00000-of-00001").read_text().splitlines()]
    np.testing.assert_allclose([r["prediction"] for r in results], digits["predictions"], rtol=1e-5, atol=1e-6)
    errors = [json.loads(x)["error"] for x in (out / "prediction.errors_stats-00000-of-00001").read_text().splitlines()]
    messages = sorted(e["message"] for e in errors)
    assert {e["status"] for e in errors} == {"INVALID_ARGUMENT"}
    assert messages[0].startswith("JSON Value out of range for uint8 in input pixels")
    assert messages[1].startswith("JSON Value: 0.5 not of type uint8")
