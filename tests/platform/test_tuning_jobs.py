"""Issue 17: Vertex AI HyperparameterTuningJobs on ``modelyard platform`` with the stock SDK.

The trial is a script written for Vertex AI (flags in, ``cloudml-hypertune`` out); the job runs
``modelyard tune`` on the request and reports its trials as Vertex ``Trial``s. Also: cancel of a
running study stops its trials, and bad studies are refused before any trial runs.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.platform.jobs_helpers import (aiplatform, kill_platform_and_its_jobs,  # noqa: F401
                                         no_stray_jobs, wait_gone, wait_state)

TRIALS = Path(__file__).resolve().parents[1] / "tuning" / "trials"


def _trial_job(aip, script: str, args: list[str], base: Path):
    return aip.CustomJob(display_name="trial", base_output_dir=str(base), worker_pool_specs=[{
        "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
        "container_spec": {"image_uri": "us-docker.pkg.dev/p/trainer:1", "command": [sys.executable, str(TRIALS / script)],
                           "args": args}}])


def test_hyperparameter_tuning_job_with_the_stock_sdk(aiplatform, tmp_path):
    from google.cloud.aiplatform import hyperparameter_tuning as hpt
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state
    from google.cloud.aiplatform.compat.types import study as gca_study

    job = aiplatform.HyperparameterTuningJob(
        display_name="quadratic", custom_job=_trial_job(aiplatform, "hypertune_quadratic.py", ["--epochs=2"], tmp_path),
        metric_spec={"score": "maximize"},
        parameter_spec={"x": hpt.DoubleParameterSpec(min=0.0, max=1.0, scale="linear"),
                        "units": hpt.IntegerParameterSpec(min=16, max=256, scale="log")},
        max_trial_count=4, parallel_trial_count=2)
    job.run(sync=True)
    assert job.state == gca_job_state.JobState.JOB_STATE_SUCCEEDED
    trials = job.trials
    assert [t.id for t in trials] == ["1", "2", "3", "4"]
    # algorithm unset: Vizier's default, the GP bandit (tuning.gp_bandit), whose first trial is the space's centre.
    assert {p.parameter_id: p.value for p in trials[0].parameters} == {"x": 0.5, "units": 64}
    for t in trials:
        assert t.state == gca_study.Trial.State.SUCCEEDED
        params = {p.parameter_id: p.value for p in t.parameters}
        assert 0.0 <= params["x"] <= 1.0 and 16 <= params["units"] <= 256 and params["units"] == int(params["units"])
        final = t.final_measurement
        assert final.step_count == 2 and final.metrics[0].metric_id == "score"
        expected = 1.0 - (params["x"] - 0.3) ** 2 - 0.1 * (math.log2(params["units"]) - 6) ** 2
        assert final.metrics[0].value == pytest.approx(expected, abs=1e-9)
        assert [m.step_count for m in t.measurements] == [1, 2]
    # Each trial ran in its own directory under the base output directory, as on Vertex.
    assert len([d for d in tmp_path.iterdir() if d.is_dir()]) == 4


def test_cancel_a_running_study(aiplatform, platform, tmp_path):
    from google.cloud.aiplatform import hyperparameter_tuning as hpt
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    job = aiplatform.HyperparameterTuningJob(
        display_name="slow", custom_job=_trial_job(aiplatform, "slow_curve.py", ["--epochs=600", "--epoch-seconds=0.1"],
                                                   tmp_path),
        metric_spec={"score": "maximize"}, parameter_spec={"quality": hpt.DoubleParameterSpec(min=0.1, max=1.0, scale="linear")},
        max_trial_count=3, parallel_trial_count=1)
    job.run(sync=False)  # HyperparameterTuningJob has no submit(): run in the SDK's background thread
    job.wait_for_resource_creation()
    wait_state(platform, job.resource_name, ("JOB_STATE_RUNNING",))

    end = time.monotonic() + 90
    while time.monotonic() < end:  # until the first trial reports a measurement
        trials = requests.get(f"{platform.url}/v1/{job.resource_name}", timeout=10).json().get("trials", [])
        if trials and trials[0].get("measurements"):
            break
        time.sleep(0.5)
    assert trials and trials[0]["state"] == "ACTIVE" and trials[0]["parameters"][0]["parameterId"] == "quality"
    job.cancel()
    with pytest.raises(RuntimeError, match="CANCELED"):
        job.wait_for_completion()
    assert job.state == gca_job_state.JobState.JOB_STATE_CANCELLED
    assert wait_gone(platform) == []  # the tuner and its trial are gone


@pytest.mark.parametrize("parameter, words", [
    ({"parameterId": "lr", "doubleValueSpec": {"minValue": 0.5, "maxValue": 0.1}}, "min"),
    ({"parameterId": "lr", "doubleValueSpec": {"minValue": 0.0, "maxValue": 0.1}, "scaleType": "UNIT_LOG_SCALE"}, "min_value"),
    ({"parameterId": "lr", "doubleValueSpec": {"minValue": 0.1, "maxValue": 0.2}, "scaleType": "UNIT_CUBE_SCALE"}, "scale_type"),
])
def test_bad_studies_create_nothing(platform, tmp_path, parameter, words):
    body = {"displayName": "bad", "maxTrialCount": 2, "parallelTrialCount": 1,
            "studySpec": {"metrics": [{"metricId": "score", "goal": "MAXIMIZE"}], "parameters": [parameter]},
            "trialJobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {
                "imageUri": "x", "command": [sys.executable, str(TRIALS / "hypertune_quadratic.py")]}}]}}
    before = requests.get(platform.api("hyperparameterTuningJobs"), timeout=10).json().get("hyperparameterTuningJobs", [])
    r = requests.post(platform.api("hyperparameterTuningJobs"), json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    assert words in r.json()["error"]["message"]
    after = requests.get(platform.api("hyperparameterTuningJobs"), timeout=10).json().get("hyperparameterTuningJobs", [])
    assert [j["name"] for j in after] == [j["name"] for j in before]


def test_a_trial_command_that_does_not_exist_is_refused(platform):
    body = {"displayName": "nocmd", "studySpec": {"metrics": [{"metricId": "score", "goal": 1}],
                                                  "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]},
            "trialJobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {"imageUri": "x",
                                                                                         "command": ["no-such-trainer"]}}]}}
    r = requests.post(platform.api("hyperparameterTuningJobs"), json=body, timeout=30)
    assert r.status_code == 400 and "'no-such-trainer' was not found" in r.json()["error"]["message"], r.text


def test_jobs_cli_submits_a_tuning_spec(platform, tmp_path):
    import json
    import subprocess

    import yaml

    from tests.platform.conftest import _env

    spec = {"display_name": "from-cli", "max_trial_count": 2, "parallel_trial_count": 1,
            "study_spec": {"metrics": [{"metric_id": "score", "goal": "MAXIMIZE"}],
                           "parameters": [{"parameter_id": "x", "double_value_spec": {"min_value": 0, "max_value": 1}},
                                          {"parameter_id": "units", "discrete_value_spec": {"values": [32, 64]}}]},
            "trial_job_spec": {"worker_pool_specs": [{"replica_count": 1, "container_spec": {
                "image_uri": "x", "command": [sys.executable, str(TRIALS / "hypertune_quadratic.py")], "args": ["--epochs=1"]}}],
                "base_output_directory": {"output_uri_prefix": str(tmp_path / "runs")}}}
    (tmp_path / "hpt.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "modelyard", "jobs", "submit", "--config", str(tmp_path / "hpt.yaml"),
                           "--wait", "--platform", platform.url], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    job = json.loads(done.stdout)
    assert job["name"].split("/")[-2] == "hyperparameterTuningJobs" and job["state"] == "JOB_STATE_SUCCEEDED"
    assert [t["state"] for t in job["trials"]] == ["SUCCEEDED", "SUCCEEDED"]
    assert all(t["finalMeasurement"]["metrics"][0]["metricId"] == "score" for t in job["trials"])


def test_a_study_resumes_after_the_platform_and_its_processes_die(platform, tmp_path):
    # Trials of about 2 s: the kill lands while trial 2 runs, so the restarted tuner must re-run it.
    body = {"displayName": "resumed-study", "maxTrialCount": 3, "parallelTrialCount": 1,
            "studySpec": {"metrics": [{"metricId": "score", "goal": "MAXIMIZE"}],
                          "parameters": [{"parameterId": "quality", "doubleValueSpec": {"minValue": 0.1, "maxValue": 1}}]},
            "trialJobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {
                "imageUri": "x", "command": [sys.executable, str(TRIALS / "slow_curve.py")],
                "args": ["--epochs=10", "--epoch-seconds=0.2"]}}],
                "baseOutputDirectory": {"outputUriPrefix": str(tmp_path)}}}
    name = requests.post(platform.api("hyperparameterTuningJobs"), json=body, timeout=30).json()["name"]
    end = time.monotonic() + 120
    first = None
    while time.monotonic() < end:
        trials = requests.get(f"{platform.url}/v1/{name}", timeout=10).json().get("trials", [])
        done = [t for t in trials if t["state"] == "SUCCEEDED"]
        if done:
            first = done[0]
            break
        time.sleep(0.2)
    assert first is not None
    kill_platform_and_its_jobs(platform)
    job = wait_state(platform, name, ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), timeout=180)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    finished = [t for t in job["trials"] if t["state"] == "SUCCEEDED"]
    assert len(finished) == 3  # an interrupted trial is run again and not counted, as `modelyard tune` resumes
    assert next(t for t in finished if t["id"] == first["id"])["parameters"] == first["parameters"]  # kept
