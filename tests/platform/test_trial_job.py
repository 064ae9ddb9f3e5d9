"""A HyperparameterTuningJob's trial as a job under ``--engine ray`` (trial_job, jobs_ray), one layer down:
no Ray, no platform. The end-to-end test (trials on the nodes, through the stock SDK) is
tests/platform/test_ray_jobs.py::test_tuning_trials_run_on_ray_nodes."""
from __future__ import annotations

import os


def test_a_trials_metric_files_come_back_from_its_node_while_it_runs(tmp_path, monkeypatch):
    """One layer down (no Ray): the node side picks the trial's hypertune file and metrics.json in its
    output (jobs_ray.live_files), hands each only when it changed (changed_files), and the platform side
    writes them into the trial's directory (write_live), where the tuner reads every measurement."""
    import hypertune

    from modelyard.platform.jobs import jobs_ray
    from modelyard.tuning.metrics import HYPERTUNE_FILE, TrialMetrics

    node, host = tmp_path / "node" / "output", tmp_path / "host" / "trial-0001"
    env = {"CLOUD_ML_HP_METRIC_FILE": str(node / HYPERTUNE_FILE), "MODELYARD_JOB_DIR": str(node)}
    assert jobs_ray.live_files(env, node) == [node / HYPERTUNE_FILE, node / "metrics.json"]
    assert jobs_ray.live_files({"CLOUD_ML_HP_METRIC_FILE": "/etc/hostname"}, node) == []  # not the trial's
    assert jobs_ray.live_files({}, node) == []  # a CustomJob's replica: nothing mirrored
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", env["CLOUD_ML_HP_METRIC_FILE"])
    hpt = hypertune.HyperTune()
    seen: dict = {}
    metrics = TrialMetrics(host, host / HYPERTUNE_FILE, "auto")
    for step, value in ((1, 0.25), (2, 0.5)):
        hpt.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="score", metric_value=value, global_step=step)
        os.utime(node / HYPERTUNE_FILE, ns=(step, step))  # a distinct mtime per report, as time gives it
        got = jobs_ray.changed_files(jobs_ray.live_files(env, node), node, seen)
        assert list(got) == [HYPERTUNE_FILE]
        jobs_ray.write_live(str(host), got)
        metrics.poll()
        assert metrics.series("score") == {s: v for s, v in ((1, 0.25), (2, 0.5)) if s <= step}
    assert jobs_ray.changed_files(jobs_ray.live_files(env, node), node, seen) == {}  # nothing new: nothing sent


def test_a_trial_that_failed_on_a_node_says_why():
    """One layer down: a trial run as a job (trial_job) ends its log with the job's error on one line;
    the Trial's infeasibleReason carries it, so a node that died is named as in a CustomJob's error."""
    from modelyard.platform.jobs import trial_job, tuning_jobs

    tail = ("chief:0 | working\n" + trial_job.FAILED_PREFIX + "task chief:0 exited with code -9 (killed by SIGKILL); "
            "its last lines: / [modelyard] Ray node 7d7419b6f54e (10.0.0.2) is gone (ActorDiedError)")
    reason = tuning_jobs._failure({"error": "exit code 1", "log_tail": tail})
    assert reason.startswith("exit code 1: task chief:0 exited with code -9") and "Ray node 7d7419b6f54e" in reason
    assert tuning_jobs._failure({"error": "exit code 2", "log_tail": "Traceback ..."}) == "exit code 2"  # local trials


def test_a_trials_job_spec_carries_the_trials_variables():
    """One layer down: the trial pool as a one-replica job (trial_job.job_spec): the tuner's trial variables
    in its env (over the pool's own), the trial's directory its base output, the study's experiment not."""
    from modelyard.platform.jobs import trial_job

    pool = {"machineSpec": {"machineType": "n1"}, "replicaCount": "3", "experiment": "projects/p/x",
            "containerSpec": {"imageUri": "i", "command": ["python3", "t.py"],
                              "env": [{"name": "A", "value": "1"}, {"name": "AIP_MODEL_DIR", "value": "/old"}]}}
    spec = trial_job.job_spec(pool, {"AIP_MODEL_DIR": "/runs/trial-0001/model", "CLOUD_ML_TRIAL_ID": "1"},
                              "/runs/trial-0001")
    (one,) = spec["workerPoolSpecs"]
    assert one["replicaCount"] == "1" and "experiment" not in one
    assert one["containerSpec"]["env"] == [{"name": "A", "value": "1"}, {"name": "AIP_MODEL_DIR",
                                           "value": "/runs/trial-0001/model"}, {"name": "CLOUD_ML_TRIAL_ID", "value": "1"}]
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": "/runs/trial-0001"}


def test_on_ray_the_tuner_runs_each_trial_as_a_job(tmp_path):
    """One layer down: under --engine ray the study's trial command is trial_job's (the pool, engine and
    shipped files in trial.json beside it), which the tuner starts cold (no TensorFlow fork server) and
    whose study file `modelyard tune` accepts; under the local engine nothing changes (no trial.json)."""
    import json
    import sys

    from modelyard.platform.jobs import tuning_jobs
    from modelyard.tuning.forkserver import is_warm_command
    from modelyard.tuning.spec import from_mapping

    pool = {"replicaCount": "1", "machineSpec": {"acceleratorCount": 1},
            "containerSpec": {"imageUri": "i", "command": [sys.executable, "train.py"]}}
    body = {"studySpec": {"metrics": [{"metricId": "score", "goal": "MAXIMIZE"}],
                          "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]},
            "trialJobSpec": {"workerPoolSpecs": [pool]}, "_modelyard": {"trialFiles": {"train.py": "cHJpbnQoMSk="}}}
    job = {"id": "42", "parent": "projects/p/locations/l", "engine": {"name": "ray", "address": "a:1"}}
    assert tuning_jobs.processes_elsewhere(job) and not tuning_jobs.processes_elsewhere({**job, "engine": None})
    out = tuning_jobs.engine_trials(tmp_path, job, body)
    (trial_pool,) = out["trialJobSpec"]["workerPoolSpecs"]
    command = trial_pool["containerSpec"]["command"]
    assert command[1:4] == ["-u", "-m", "modelyard.platform.jobs.trial_job"] and not is_warm_command(command)
    assert json.loads((tmp_path / "trial.json").read_text()) == {
        "pool": pool, "engine": job["engine"], "jobId": "42", "project": "p", "storageRoot": None,
        "files": {"train.py": "cHJpbnQoMSk="}}
    study = from_mapping(tuning_jobs.study_mapping(out, "s", str(tmp_path / "out")), tmp_path / "study.json")
    assert study.command == command
