"""Issue 16 test 4: Vertex AI BatchPredictionJobs on ``modelyard platform``, driven by the stock SDK.

Instances go to the GCS emulator with google.cloud.storage, ``Model.batch_predict`` runs the job,
``iter_outputs()`` reads the shards back from the emulator; predictions must equal the model's own.
Also: bad rows into the error file (local paths, instanceConfig), cancel of a running job, a job
resumed after the platform and the job's process were killed, and bad requests answered in
Google's error format with nothing created.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import requests

from tests.platform.conftest import PARENT, STAGING_BUCKET
from tests.platform.jobs_helpers import (aiplatform, job_processes, kill_platform_and_its_jobs,  # noqa: F401
                                         no_stray_jobs, wait_gone, wait_state)


@pytest.fixture(scope="module")
def tiny_model(aiplatform, tiny_models):
    model = aiplatform.Model.upload(display_name="tiny-batch", artifact_uri=tiny_models["models"]["tiny1"]["path"],
                                    serving_container_image_uri="modelyard/serve")
    yield model
    model.delete()


def _by_instance(rows: list[dict]) -> dict[str, list]:
    return {json.dumps(r["instance"]): r["prediction"] for r in rows}


def test_model_batch_predict_with_the_stock_sdk(aiplatform, tiny_model, tiny_models, gcs_emulator, platform):
    from google.api_core import exceptions
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    instances = tiny_models["instances"] * 4  # 12 rows in two files
    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    for i in range(2):
        rows = instances[i * 6:(i + 1) * 6]
        bucket.blob(f"bp/in/part-{i}.jsonl").upload_from_string("".join(json.dumps(r) + "\n" for r in rows))

    job = tiny_model.batch_predict(job_display_name="nightly-scoring", gcs_source=f"gs://{STAGING_BUCKET}/bp/in/*.jsonl",
                                   gcs_destination_prefix=f"gs://{STAGING_BUCKET}/bp/out", instances_format="jsonl",
                                   predictions_format="jsonl", machine_type="n1-standard-2",
                                   starting_replica_count=1, sync=True)
    assert job.state == gca_job_state.JobState.JOB_STATE_SUCCEEDED
    stats = job.completion_stats
    assert (stats.successful_count, stats.failed_count, stats.incomplete_count) == (12, 0, 0)
    out_dir = job.output_info.gcs_output_directory
    assert out_dir.startswith(f"gs://{STAGING_BUCKET}/bp/out/prediction-tiny-batch-")
    blobs = list(job.iter_outputs())
    names = sorted(b.name.rsplit("/", 1)[-1] for b in blobs)
    assert names == ["prediction.errors_stats-00000-of-00001",  # one result shard per input file here
                     "prediction.results-00000-of-00002", "prediction.results-00001-of-00002"]
    results = [json.loads(line) for b in blobs if "results" in b.name
               for line in b.download_as_text().splitlines() if line.strip()]
    assert len(results) == 12
    got = _by_instance(results)
    for instance, expected in zip(tiny_models["instances"], tiny_models["models"]["tiny1"]["predictions"]):
        np.testing.assert_allclose(got[json.dumps(instance)], expected, rtol=1e-5, atol=1e-6)
    errors = next(b for b in blobs if "errors_stats" in b.name).download_as_text()
    assert errors.strip() == ""

    # The resource as Vertex shapes it, listed by display name, then deleted with its staging.
    assert job.gca_resource.model_version_id == "1" and job.gca_resource.start_time and job.gca_resource.end_time
    listed = aiplatform.BatchPredictionJob.list(filter='display_name="nightly-scoring"')
    assert [j.resource_name for j in listed] == [job.resource_name]
    with pytest.raises(exceptions.BadRequest, match="cannot be cancelled"):  # FAILED_PRECONDITION is HTTP 400
        job.cancel()
    job.delete()
    with pytest.raises(exceptions.NotFound):
        aiplatform.BatchPredictionJob(job.resource_name)
    assert bucket.blob(out_dir.split(f"{STAGING_BUCKET}/", 1)[1] + "/prediction.results-00000-of-00002").exists()


def test_bad_rows_go_to_the_error_file_and_keys_are_carried(platform, tiny_model, tiny_models, tmp_path):
    rows = [{"id": i, "x": tiny_models["instances"][i % 3]} for i in range(30)]
    lines = [json.dumps(r) for r in rows]
    lines[7] = json.dumps({"id": 7, "x": [1.0, 2.0]})  # wrong shape: the model refuses it
    lines[19] = json.dumps({"id": 19, "x": "not numbers"})
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    body = {"displayName": "with-bad-rows", "model": tiny_model.resource_name,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [str(tmp_path / "in.jsonl")]}},
            "instanceConfig": {"keyField": "id"},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(tmp_path / "out")}},
            "dedicatedResources": {"startingReplicaCount": 1}}
    created = requests.post(platform.api("batchPredictionJobs"), json=body, timeout=30)
    assert created.status_code == 200, created.text
    # Alongside, a CSV job: the key column carried, the other columns sent as one array (instanceConfig).
    csv_rows = ["sku,a,b,c,d"] + [f"k{i}," + ",".join(str(v) for v in tiny_models["instances"][i % 3]) for i in range(6)]
    (tmp_path / "in.csv").write_text("\n".join(csv_rows) + "\n")
    csv_body = {**body, "displayName": "csv", "instanceConfig": {"keyField": "sku", "instanceType": "array"},
                "inputConfig": {"instancesFormat": "csv", "gcsSource": {"uris": [str(tmp_path / "in.csv")]}},
                "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(tmp_path / "csv")}}}
    csv_job = requests.post(platform.api("batchPredictionJobs"), json=csv_body, timeout=30).json()
    job = wait_state(platform, created.json()["name"], ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"))
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    assert job["completionStats"] == {"successfulCount": "28", "failedCount": "2", "incompleteCount": "0"}
    out = tmp_path / "out" / job["outputInfo"]["gcsOutputDirectory"].rsplit("/", 1)[-1]
    results = [json.loads(x) for x in (out / "prediction.results-00000-of-00001").read_text().splitlines()]
    errors = [json.loads(x) for x in (out / "prediction.errors_stats-00000-of-00001").read_text().splitlines()]
    assert sorted(r["key"] for r in results) == [i for i in range(30) if i not in (7, 19)]
    expected = tiny_models["models"]["tiny1"]["predictions"]
    for r in results:
        np.testing.assert_allclose(r["prediction"], expected[r["key"] % 3], rtol=1e-5, atol=1e-6)
    assert len(errors) == 2 and {e["error"]["status"] for e in errors} == {"INVALID_ARGUMENT"}

    csv_job = wait_state(platform, csv_job["name"], ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"))
    assert csv_job["state"] == "JOB_STATE_SUCCEEDED" and csv_job["completionStats"]["successfulCount"] == "6", csv_job
    out = tmp_path / "csv" / csv_job["outputInfo"]["gcsOutputDirectory"].rsplit("/", 1)[-1]
    results = [json.loads(x) for x in (out / "prediction.results-00000-of-00001").read_text().splitlines()]
    for r in results:
        np.testing.assert_allclose(r["prediction"], expected[int(r["key"][1:]) % 3], rtol=1e-5, atol=1e-6)


def test_cancel_a_running_job(aiplatform, platform, tiny_model, tmp_path):
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    # Large enough to be still running when checked and cancelled, even where the C path predicts
    # ~200k rows/s (20,000 rows were done before the check on a quiet machine).
    (tmp_path / "in.jsonl").write_text("[1.0, 2.0, 3.0, 4.0]\n" * 3_000_000)
    body = {"displayName": "to-cancel", "model": tiny_model.resource_name,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [str(tmp_path / "in.jsonl")]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(tmp_path / "out")}}}
    name = requests.post(platform.api("batchPredictionJobs"), json=body, timeout=30).json()["name"]
    wait_state(platform, name, ("JOB_STATE_RUNNING",))
    # The state can say RUNNING a moment before the job's process is up: give it a few seconds.
    deadline = time.monotonic() + 15
    while not job_processes(platform) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(platform)
    r = requests.delete(f"{platform.url}/v1/{name}", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["status"] == "FAILED_PRECONDITION"  # running: cancel first
    job = aiplatform.BatchPredictionJob(name)
    job.cancel()
    with pytest.raises(RuntimeError, match="CANCELED"):
        job.wait_for_completion()
    assert job.state == gca_job_state.JobState.JOB_STATE_CANCELLED
    assert job.gca_resource.error.code == 1  # google.rpc.Code.CANCELLED
    assert not (tmp_path / "out").exists()  # nothing published
    assert wait_gone(platform) == []  # the job's process group is gone
    assert requests.get(f"{platform.url}/healthz", timeout=5).text == "ok"


def test_a_job_resumes_after_the_platform_and_its_process_die(platform, tiny_model, tmp_path):
    rows = 300000
    # A field to exclude keeps these rows on the general loop (~25 us a row): the job runs for
    # seconds, where the C path would finish it between two polls.
    (tmp_path / "in.jsonl").write_text("".join(f'{{"k": {i}, "note": "n", "x": [1.0, 2.0, 3.0, {i % 7}.0]}}\n'
                                               for i in range(rows)))
    body = {"displayName": "resumed", "model": tiny_model.resource_name,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [str(tmp_path / "in.jsonl")]}},
            "instanceConfig": {"keyField": "k", "excludedFields": ["note"]},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(tmp_path / "out")}},
            "manualBatchTuningParameters": {"batchSize": 128}, "dedicatedResources": {"startingReplicaCount": 1}}
    name = requests.post(platform.api("batchPredictionJobs"), json=body, timeout=30).json()["name"]
    # Killed with some parts committed and some not (its committed counts, while it runs).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = requests.get(f"{platform.url}/v1/{name}", timeout=10).json()
        stats = job.get("completionStats", {})
        if int(stats.get("successfulCount", 0)) > 0:
            break
        assert job["state"] in ("JOB_STATE_PENDING", "JOB_STATE_RUNNING"), job
        time.sleep(0.05)
    assert 0 < int(stats["successfulCount"]) < rows and int(stats["incompleteCount"]) > 0, job
    kill_platform_and_its_jobs(platform)
    job = wait_state(platform, name, ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), timeout=180)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    assert job["completionStats"]["successfulCount"] == str(rows)
    out = tmp_path / "out" / job["outputInfo"]["gcsOutputDirectory"].rsplit("/", 1)[-1]
    keys = [json.loads(x)["key"] for f in sorted(out.glob("prediction.results-*")) for x in f.read_text().splitlines()]
    assert sorted(keys) == list(range(rows))  # every row exactly once
    log = requests.get(f"{platform.url}/modelyard/v1/jobs/{name.rsplit('/', 1)[-1]}/logs", timeout=10).text
    assert "run 2" in log


@pytest.mark.parametrize("change, status, words", [
    ({"model": f"{PARENT}/models/123456"}, "NOT_FOUND", "Model 123456"),
    ({"inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [f"gs://{STAGING_BUCKET}/nowhere/*.jsonl"]}}},
     "INVALID_ARGUMENT", "matches no file"),
    ({"inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": ["/no/such/file.jsonl"]}}},
     "INVALID_ARGUMENT", "matches no file"),
    ({"inputConfig": {"instancesFormat": "avro", "gcsSource": {"uris": ["/x"]}}}, "INVALID_ARGUMENT", "instances_format"),
    ({"outputConfig": {"predictionsFormat": "bigquery", "gcsDestination": {"outputUriPrefix": "/tmp"}}},
     "INVALID_ARGUMENT", "predictions_format"),
    ({"outputConfig": {"predictionsFormat": "jsonl"}}, "INVALID_ARGUMENT", "output_uri_prefix"),
    ({"displayName": ""}, "INVALID_ARGUMENT", "display_name"),
    ({"instanceConfig": {"includedFields": ["a"], "excludedFields": ["b"]}}, "INVALID_ARGUMENT", "cannot both"),
    ({"manualBatchTuningParameters": {"batchSize": -3}}, "INVALID_ARGUMENT", "batch_size"),
])
def test_bad_requests_create_nothing(platform, tiny_model, tmp_path, change, status, words):
    (tmp_path / "in.jsonl").write_text("[1, 2, 3, 4]\n")
    body = {"displayName": "bad", "model": tiny_model.resource_name,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [str(tmp_path / "in.jsonl")]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(tmp_path / "o")}}}
    body.update(change)
    before = requests.get(platform.api("batchPredictionJobs"), timeout=10).json().get("batchPredictionJobs", [])
    r = requests.post(platform.api("batchPredictionJobs"), json=body, timeout=30)
    err = r.json()["error"]
    assert (err["status"], r.status_code == err["code"]) == (status, True) and words in err["message"], err
    after = requests.get(platform.api("batchPredictionJobs"), timeout=10).json().get("batchPredictionJobs", [])
    assert [j["name"] for j in after] == [j["name"] for j in before] and not (tmp_path / "o").exists()
    assert requests.get(platform.api("batchPredictionJobs/99"), timeout=10).json()["error"]["status"] == "NOT_FOUND"


def test_a_job_that_cannot_read_its_input_fails_saying_why(platform, tiny_model, tmp_path):
    (tmp_path / "in.tfrecord").write_text("[1, 2, 3, 4]\n" * 5)  # JSON lines, not TFRecord
    body = {"displayName": "wrong-format", "model": tiny_model.resource_name,
            "inputConfig": {"instancesFormat": "tf-record", "gcsSource": {"uris": [str(tmp_path / "in.tfrecord")]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(tmp_path / "out")}},
            "dedicatedResources": {"startingReplicaCount": 1}}
    name = requests.post(platform.api("batchPredictionJobs"), json=body, timeout=30).json()["name"]
    job = wait_state(platform, name, ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"))
    assert job["state"] == "JOB_STATE_FAILED", job
    assert "TFRecord" in job["error"]["message"] and "in.tfrecord" in job["error"]["message"], job
    assert not (tmp_path / "out").exists()


def test_a_job_in_which_no_row_succeeded_fails(platform, tiny_model, tmp_path):
    """Issue 27: a CSV file sent as jsonl: every row is an error line, and the job is FAILED, not SUCCEEDED."""
    (tmp_path / "rows.csv").write_text("a,b,c,d\n1,2,3,4\n")
    body = {"displayName": "all-rows-fail", "model": tiny_model.resource_name,
            "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [str(tmp_path / "rows.csv")]}},
            "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {"outputUriPrefix": str(tmp_path / "out")}}}
    created = requests.post(platform.api("batchPredictionJobs"), json=body, timeout=30)
    assert created.status_code == 200, created.text
    job = wait_state(platform, created.json()["name"], ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"))
    assert job["state"] == "JOB_STATE_FAILED", job
    assert "no row succeeded: all 2 rows failed" in job["error"]["message"], job["error"]
