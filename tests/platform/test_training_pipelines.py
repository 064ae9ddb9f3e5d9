"""Issue 34: Vertex AI training pipelines (``CustomTrainingJob``, ``CustomContainerTrainingJob``) with the
stock SDK, and what every CustomJob's processes find: Vertex's variables, /gcs/ paths, and a refusal
at create of a bucket that does not exist (a CustomJob package's requirements: test_custom_jobs).

One representative end-to-end case (a script with requirements -> a Model that deploys and
predicts); the variants (container command, two workers, failure, cancel, restart) stop at the
pipeline's resource.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.platform.conftest import STAGING_BUCKET
from tests.platform.jobs_helpers import aiplatform, alive, no_stray_jobs, wait_gone  # noqa: F401

SCRIPT = str(Path(__file__).with_name("job_scripts") / "train_copy.py")
TRAIN_IMAGE = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12.py310:latest"
SERVE_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-12:latest"
REQUIREMENT = "pyjokes"  # small, pure Python, from PyPI, and not installed beside the platform
FINAL = ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED")


@pytest.fixture(scope="module")
def sdk(aiplatform):
    from google.cloud.aiplatform import training_jobs

    saved = training_jobs._JOB_WAIT_TIME
    training_jobs._JOB_WAIT_TIME = 0.5  # the SDK polls a pipeline every 5 s
    yield aiplatform
    training_jobs._JOB_WAIT_TIME = saved


def _blob_json(gcs, uri: str) -> dict:
    from google.cloud import storage

    return json.loads(storage.Blob.from_uri(uri, client=gcs["client"]).download_as_text())


def _wait(platform, name: str, states: tuple[str, ...], timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = requests.get(f"{platform.url}/v1/{name}", timeout=10).json()
        if got["state"] in states:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{name} did not reach {states}: {got}")


def test_custom_training_job_installs_its_requirements_and_returns_a_model_that_serves(sdk, platform, tiny_models,
                                                                                       gcs_emulator):
    assert importlib.util.find_spec(REQUIREMENT) is None, f"{REQUIREMENT} must not be installed for this test"
    tiny = tiny_models["models"]["tiny1"]
    job = sdk.CustomTrainingJob(display_name="script-train", script_path=SCRIPT, container_uri=TRAIN_IMAGE,
                                requirements=[REQUIREMENT], model_serving_container_image_uri=SERVE_IMAGE)
    model = job.run(args=["--epochs=2"], environment_variables={"SOURCE_MODEL": tiny["path"], "REQUIRE": REQUIREMENT,
                                                                  "GREETING": "hi"}, replica_count=1)
    assert isinstance(model, sdk.Model) and model.display_name == "script-train-model"
    pipeline = job.gca_resource
    assert pipeline.state.name == "PIPELINE_STATE_SUCCEEDED"
    backing = pipeline.training_task_metadata["backingCustomJob"]
    custom = requests.get(f"{platform.url}/v1/{backing}", timeout=10).json()
    assert custom["state"] == "JOB_STATE_SUCCEEDED"
    base = pipeline.training_task_inputs["base_output_directory"]["output_uri_prefix"].rstrip("/")
    assert base.startswith(f"gs://{STAGING_BUCKET}/") and model.uri.rstrip("/") == f"{base}/model"
    assert pipeline.model_to_upload.name == model.resource_name

    seen = _blob_json(gcs_emulator, f"{base}/checkpoints/workerpool0-0.json")
    assert seen["argv"] == ["--epochs=2"] and seen["env"]["GREETING"] == "hi"
    assert seen["env"]["CLOUD_ML_PROJECT_ID"] == "local" and seen["env"]["CLOUD_ML_JOB_ID"] == backing.rsplit("/", 1)[1]
    assert seen["env"]["AIP_MODEL_DIR"] == f"{base}/model/" and seen["env"]["AIP_TENSORBOARD_LOG_DIR"] == f"{base}/logs/"
    # The job's own storage gateway (jobs/job_identity), which forwards to the platform's storage.
    assert seen["env"]["STORAGE_EMULATOR_HOST"].startswith("http://127.0.0.1:") and seen["env"]["TF_CONFIG"] is None
    assert "/venv/" in seen["python"]  # the job's own environment: the requirement went there, not beside the platform
    assert importlib.util.find_spec(REQUIREMENT) is None

    endpoint = model.deploy(machine_type="n1-standard-4", min_replica_count=1, max_replica_count=1)
    try:
        got = endpoint.predict(instances=np.array(tiny_models["instances"], np.float32).tolist())
        np.testing.assert_allclose(got.predictions, tiny["predictions"], rtol=1e-5, atol=1e-6)
    finally:
        endpoint.undeploy_all()
        endpoint.delete()
    model.delete()


def test_container_training_job_with_two_workers(sdk, platform, tiny_models, gcs_emulator):
    job = sdk.CustomContainerTrainingJob(display_name="container-train", container_uri="example.com/trainer:1",
                                         command=[sys.executable, SCRIPT], model_serving_container_image_uri=SERVE_IMAGE)
    model = job.run(args=["--steps=3"], replica_count=2,
                    environment_variables={"SOURCE_MODEL": tiny_models["models"]["tiny2"]["path"]})
    assert isinstance(model, sdk.Model)
    assert sdk.Model(model.resource_name).uri == model.uri
    base = job.gca_resource.training_task_inputs["base_output_directory"]["output_uri_prefix"].rstrip("/")
    chief = _blob_json(gcs_emulator, f"{base}/checkpoints/workerpool0-0.json")
    worker = _blob_json(gcs_emulator, f"{base}/checkpoints/workerpool1-0.json")
    assert chief["argv"] == worker["argv"] == ["--steps=3"]
    configs = [json.loads(r["env"]["TF_CONFIG"]) for r in (chief, worker)]
    assert configs[0]["cluster"] == configs[1]["cluster"] and len(configs[0]["cluster"]["worker"]) == 1
    assert [c["task"] for c in configs] == [{"type": "chief", "index": 0}, {"type": "worker", "index": 0}]
    assert json.loads(worker["env"]["CLUSTER_SPEC"])["task"] == {"type": "workerpool1", "index": 0}
    model.delete()


def test_a_failing_script_fails_the_pipeline_with_its_last_lines(sdk, platform, capsys):
    job = sdk.CustomContainerTrainingJob(display_name="fails", container_uri="example.com/trainer:1",
                                         command=[sys.executable, SCRIPT])
    with pytest.raises(RuntimeError, match="failing on purpose"):
        job.run(args=["--fail=3"], replica_count=1)
    assert job.gca_resource.state.name == "PIPELINE_STATE_FAILED"
    assert "exited with code 3" in job.gca_resource.error.message
    log = requests.get(f"{platform.url}/modelyard/v1/jobs/{job.name}/logs", timeout=10).text  # its job's log
    assert "workerpool0-0: failing on purpose" in log
    # The jobs CLI lists, describes and shows the logs of pipelines as of every other job.
    from modelyard.platform import client_cli
    from tests.platform.test_cli import run

    listed = run(capsys, "jobs", "list", "--platform", platform.url)[1]
    assert job.resource_name in [j["name"] for j in listed]
    described = run(capsys, "jobs", "describe", "--platform", platform.url, job.name)[1]
    assert described["state"] == "PIPELINE_STATE_FAILED"
    parser = argparse.ArgumentParser(prog="modelyard")
    client_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["jobs", "logs", "--platform", platform.url, job.name])
    assert args.func(args) == 0 and "workerpool0-0: failing on purpose" in capsys.readouterr().out

    # A job that succeeds without writing a model: the pipeline fails at the upload, saying why.
    body = _pipeline_body([], f"gs://{STAGING_BUCKET}/no-model-{time.time_ns()}")
    name = requests.post(platform.api("trainingPipelines"), json=body, timeout=30).json()["name"]
    done = _wait(platform, name, FINAL)
    assert done["state"] == "PIPELINE_STATE_FAILED" and "could not be uploaded" in done["error"]["message"], done


def test_cancel_stops_the_pipeline_and_its_job(sdk, platform):
    job = sdk.CustomContainerTrainingJob(display_name="long", container_uri="example.com/trainer:1",
                                         command=[sys.executable, SCRIPT])
    job.submit(args=["--sleep=300"], replica_count=1)
    running = _wait(platform, job.resource_name, ("PIPELINE_STATE_RUNNING",))
    backing = running["trainingTaskMetadata"]["backingCustomJob"]
    job.cancel()
    ended = _wait(platform, job.resource_name, FINAL)
    assert ended["state"] == "PIPELINE_STATE_CANCELLED" and ended["error"]["code"] == 1
    assert requests.get(f"{platform.url}/v1/{backing}", timeout=10).json()["state"] == "JOB_STATE_CANCELLED"
    assert wait_gone(platform) == []
    listed = requests.get(platform.api("trainingPipelines"), params={"filter": 'state="PIPELINE_STATE_CANCELLED"'},
                          timeout=10).json()["trainingPipelines"]
    assert job.resource_name in [p["name"] for p in listed]
    # Deleted, it is gone; its custom job stays, as on Vertex.
    assert requests.delete(f"{platform.url}/v1/{job.resource_name}", timeout=10).status_code == 200
    assert requests.get(f"{platform.url}/v1/{job.resource_name}", timeout=10).status_code == 404
    assert requests.get(f"{platform.url}/v1/{backing}", timeout=10).status_code == 200


def _pipeline_body(args: list[str], base: str, model_env: dict | None = None) -> dict:
    return {"displayName": "by-rest", "trainingTaskDefinition":
            "gs://google-cloud-aiplatform/schema/trainingjob/definition/custom_task_1.0.0.yaml",
            "trainingTaskInputs": {"worker_pool_specs": [{"replica_count": 1, "machine_spec": {"machine_type": "n1"},
                                                          "container_spec": {"image_uri": "x", "command": [sys.executable, SCRIPT],
                                                                             "args": args, "env": [{"name": k, "value": v} for k, v in (model_env or {}).items()]}}],
                                   "base_output_directory": {"output_uri_prefix": base}},
            "modelToUpload": {"displayName": "restarted", "containerSpec": {"imageUri": SERVE_IMAGE}}}


def test_a_pipeline_survives_a_platform_restart(platform, tiny_models, tmp_path):
    base = f"gs://{STAGING_BUCKET}/restart-{time.time_ns()}"
    go = tmp_path / "go"  # its script ends once this exists: after the restart
    body = _pipeline_body(["--sleep=120", f"--until={go}"], base, {"SOURCE_MODEL": tiny_models["models"]["tiny1"]["path"]})
    body["modelId"] = model_id = f"restarted_{time.time_ns()}"  # the uploaded model's id, chosen
    name = requests.post(platform.api("trainingPipelines"), json=body, timeout=30).json()["name"]
    _wait(platform, name, ("PIPELINE_STATE_RUNNING",))
    platform.stop()  # the job's processes are not the platform's to stop: the next platform adopts them
    platform.start()
    assert _wait(platform, name, ("PIPELINE_STATE_RUNNING", *FINAL))["state"] == "PIPELINE_STATE_RUNNING"
    go.touch()
    done = _wait(platform, name, FINAL)
    assert done["state"] == "PIPELINE_STATE_SUCCEEDED", done
    assert done["modelToUpload"]["name"].endswith(f"/models/{model_id}") and done["modelToUpload"]["versionId"] == "1"
    model = requests.get(f"{platform.url}/v1/{done['modelToUpload']['name']}", timeout=10).json()
    assert model["artifactUri"] == f"{base}/model/" and model["displayName"] == "restarted"
    requests.delete(f"{platform.url}/v1/{model['name']}", timeout=10)


def test_a_command_reads_and_writes_gcs_paths(aiplatform, gcs_emulator, tmp_path):
    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    bucket.blob("fuse/in/words.txt").upload_from_string("hello from the bucket\n")
    job = aiplatform.CustomJob(display_name="fuse", base_output_dir=str(tmp_path), worker_pool_specs=[{
        "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
        "container_spec": {"image_uri": "x", "command": ["sh", "-c", f"mkdir -p /gcs/{STAGING_BUCKET}/fuse/out && "
                                                         f"tr a-z A-Z < /gcs/{STAGING_BUCKET}/fuse/in/words.txt > \"$0\""],
                           "args": [f"/gcs/{STAGING_BUCKET}/fuse/out/shout.txt"]}}])
    job.run(sync=True)
    assert bucket.blob("fuse/out/shout.txt").download_as_text() == "HELLO FROM THE BUCKET\n"
    assert bucket.blob("fuse/in/words.txt").download_as_text() == "hello from the bucket\n"  # unchanged


def test_an_output_bucket_that_does_not_exist_is_refused_at_create(platform):
    def count(coll: str) -> int:
        return len(requests.get(platform.api(coll), timeout=10).json().get(coll, []))

    before = count("customJobs"), count("trainingPipelines")
    job = {"displayName": "nowhere", "jobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {
        "imageUri": "x", "command": [sys.executable, SCRIPT]}}],
        "baseOutputDirectory": {"outputUriPrefix": "gs://no-such-bucket-34/out"}}}
    r = requests.post(platform.api("customJobs"), json=job, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["status"] == "FAILED_PRECONDITION", r.text
    assert "gs://no-such-bucket-34/out" in r.json()["error"]["message"]
    r = requests.post(platform.api("trainingPipelines"), json=_pipeline_body([], "gs://no-such-bucket-34/out"), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["status"] == "FAILED_PRECONDITION", r.text
    bad = {**_pipeline_body([], f"gs://{STAGING_BUCKET}/x"), "trainingTaskDefinition": "gs://other/task.yaml"}
    r = requests.post(platform.api("trainingPipelines"), json=bad, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    assert (count("customJobs"), count("trainingPipelines")) == before


def test_gcs_paths_of_a_storage_the_platform_does_not_serve_are_mirrored(gcs_emulator, tmp_path):
    # One layer down: an outside STORAGE_EMULATOR_HOST (here the session's storage, as this process sees it).
    from modelyard.platform.jobs.job_env import GcsMount

    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    bucket.blob("mirror/in/a.txt").upload_from_string("a")
    bucket.blob("mirror/in/sub/b.txt").upload_from_string("b")
    mount = GcsMount(tmp_path)
    args = [f"--data=/gcs/{STAGING_BUCKET}/mirror/in/", f"sh -c 'cat /gcs/{STAGING_BUCKET}/mirror/in/a.txt'",
            f"/gcs/{STAGING_BUCKET}/mirror/out/new.txt", "/gcsx/not/a/mount"]
    mount.stage_in(args)
    local = [mount.rewrite(a) for a in args]
    assert local[0] == f"--data={tmp_path}/gcs/{STAGING_BUCKET}/mirror/in/" and local[3] == args[3]
    assert (tmp_path / "gcs" / STAGING_BUCKET / "mirror/in/sub/b.txt").read_text() == "b"
    Path(local[2]).write_text("written")
    (tmp_path / "gcs" / STAGING_BUCKET / "mirror/in/a.txt").write_text("changed")
    assert mount.publish() == 2  # the new file and the changed one; b.txt untouched is not sent again
    assert bucket.blob("mirror/out/new.txt").download_as_text() == "written"
    assert bucket.blob("mirror/in/a.txt").download_as_text() == "changed"


@pytest.mark.parametrize("files, expected", [
    ({"p-0.1/PKG-INFO": "Metadata-Version: 2.1\n", "p-0.1/p.egg-info/PKG-INFO": "",
      "p-0.1/p.egg-info/requires.txt": "pyjokes\nsix>=1\n\n[dev]\npytest\n"}, ["pyjokes", "six>=1"]),
    ({"p-0.1/PKG-INFO": "Metadata-Version: 2.1\n", "p-0.1/p.egg-info/PKG-INFO": ""}, []),
    ({"p-0.1/PKG-INFO": "Metadata-Version: 2.1\n", "p-0.1/p.egg-info/PKG-INFO": "",
      "p-0.1/p.egg-info/requires.txt": "six\n[:python_version < '3.12']\nold\n"}, None),  # markers: pip decides
    ({"p-0.1/PKG-INFO": "Metadata-Version: 2.2\nRequires-Dist: six\nRequires-Dist: x; extra == 'dev'\n"}, ["six"]),
    ({"p-0.1/PKG-INFO": "Metadata-Version: 2.2\nDynamic: Requires-Dist\n"}, None),
    ({"p-0.1/PKG-INFO": "Metadata-Version: 2.1\n"}, None),  # an older sdist may leave them out
])
def test_the_requirements_a_package_declares(tmp_path, files, expected):
    # One layer down: what decides whether a package's requirements come from the shared per-set environment.
    import io
    import tarfile

    from modelyard.platform.jobs.job_env import declared_requirements

    path = tmp_path / "p-0.1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    assert declared_requirements(str(path)) == expected
