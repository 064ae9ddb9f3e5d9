"""``modelyard models ...`` / ``modelyard endpoints ...`` against a real platform (the token-guarded one
of the bad-input tests). The commands run in this process (their parser and client code, the real
HTTP calls): a subprocess per command would spend seconds building every area's parser."""
from __future__ import annotations

import argparse
import json

import pytest

from modelyard.platform import client_cli
from tests.platform.conftest import TOKEN
from tests.platform.jobs_helpers import no_stray_jobs  # noqa: F401  (the job tests leave no process)


def run(capsys, *argv: str) -> tuple[int, object, str]:
    parser = argparse.ArgumentParser(prog="modelyard")
    client_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_models_and_endpoints_commands(guarded, tiny_models, capsys):
    p, _ = guarded
    auth = ["--platform", p.url, "--token", TOKEN]
    code, up, _ = run(capsys, "models", "upload", *auth, "--display-name", "cli",
                      "--artifact-uri", tiny_models["models"]["tiny1"]["path"])
    assert code == 0 and up["modelVersionId"] == "1"
    model = up["model"].rsplit("/", 1)[-1]
    code, v2, _ = run(capsys, "models", "upload", *auth, "--display-name", "cli",
                      "--artifact-uri", tiny_models["models"]["tiny1"]["path"], "--parent-model", model)
    assert code == 0 and v2["modelVersionId"] == "2"
    code, desc, _ = run(capsys, "models", "describe", *auth, f"{model}@1")
    assert code == 0 and desc["versionId"] == "1" and desc["versionAliases"] == []
    assert run(capsys, "models", "describe", *auth, model)[1]["versionAliases"] == ["default"]
    assert model in [m["name"].rsplit("/", 1)[-1] for m in run(capsys, "models", "list", *auth)[1]]

    code, ep, _ = run(capsys, "endpoints", "create", *auth, "--display-name", "cli-ep")
    endpoint = ep["name"].rsplit("/", 1)[-1]
    assert run(capsys, "endpoints", "describe", *auth, endpoint)[1]["displayName"] == "cli-ep"
    code, _, err = run(capsys, "endpoints", "update-traffic", *auth, endpoint, "123=100")
    assert code == 1 and "INVALID_ARGUMENT" in err and "not deployed" in err
    code, _, err = run(capsys, "endpoints", "describe", "--platform", p.url, "--token", "wrong", endpoint)
    assert code == 1 and "UNAUTHENTICATED" in err
    assert run(capsys, "endpoints", "delete", *auth, endpoint)[0] == 0
    assert run(capsys, "models", "delete", *auth, model)[0] == 0
    code, _, err = run(capsys, "models", "describe", *auth, model)
    assert code == 1 and "NOT_FOUND" in err


# ---- issue 27: predict's --instances forms, and a `modelyard tune` study file submitted as it is ----
def test_predict_instances_take_json_text_a_file_or_stdin(platform, tiny_models, tmp_path, capsys, monkeypatch):
    import io

    at = ["--platform", platform.url]
    code, up, err = run(capsys, "models", "upload", *at, "--display-name", "cli-predict",
                        "--artifact-uri", tiny_models["models"]["tiny1"]["path"])
    assert code == 0, err
    model = up["model"].rsplit("/", 1)[-1]
    endpoint = run(capsys, "endpoints", "create", *at, "--display-name", "cli-predict")[1]["name"].rsplit("/", 1)[-1]
    code, deployed, err = run(capsys, "endpoints", "deploy", *at, endpoint, "--model", model)
    assert code == 0, err
    instances = tiny_models["instances"]
    expected = tiny_models["models"]["tiny1"]["predictions"]
    try:
        (tmp_path / "instances.json").write_text(json.dumps({"instances": instances}))
        monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(instances)))
        for value in (json.dumps(instances), "@" + str(tmp_path / "instances.json"), "-"):
            code, out, err = run(capsys, "endpoints", "predict", *at, endpoint, "--instances", value)
            assert code == 0, (value, err)
            assert [[round(v, 5) for v in row] for row in out["predictions"]] == \
                [[round(v, 5) for v in row] for row in expected], value
        # Each mistake: exit 1 and one line saying what to give, no traceback.
        for value, words in (("[[1.0, 2.0", "is not JSON"), ("@" + str(tmp_path / "none.json"), "cannot read it"),
                             ('{"rows": []}', 'without "instances"'), ("[]", "non-empty JSON list")):
            code, _, err = run(capsys, "endpoints", "predict", *at, endpoint, "--instances", value)
            assert code == 1 and words in err and "Traceback" not in err, (value, err)
            assert "@FILE" in err or "instances" in err
    finally:
        run(capsys, "endpoints", "undeploy", *at, endpoint, deployed["deployedModel"]["id"])
        run(capsys, "endpoints", "delete", *at, endpoint)
        run(capsys, "models", "delete", *at, model)


STUDY = """display_name: first-day-study
study_spec:
  metrics: [{metric_id: score, goal: MAXIMIZE}]
  parameters:
    - parameter_id: x
      double_value_spec: {min_value: 0, max_value: 1}
max_trial_count: 2
trial:
  command: python3 train.py --scale=2
"""
TRAIN = """import argparse, hypertune
parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float)
parser.add_argument("--scale", type=float)
args = parser.parse_args()
hypertune.HyperTune().report_hyperparameter_tuning_metric(
    hyperparameter_metric_tag="score", metric_value=args.scale * (1 - (args.x - 0.3) ** 2), global_step=1)
"""


def test_jobs_submit_takes_the_tune_study_file_as_it_is(platform, tmp_path, capsys, monkeypatch):
    """The docs' study file (trial: command: python3 train.py) runs as a HyperparameterTuningJob: the
    command is read beside the file, wherever the CLI runs, and train.py travels with the job."""
    import time

    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "study.yaml").write_text(STUDY)
    (folder / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)  # not the study's folder
    code, job, err = run(capsys, "jobs", "submit", "--platform", platform.url, "--config", "study/study.yaml")
    assert code == 0, err
    (folder / "train.py").unlink()  # the job has its own copy
    assert "modelyardTrialFiles" not in job and "_modelyard" not in job  # shipped files stay out of the resource
    deadline = time.monotonic() + 240
    while job["state"] not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
        assert time.monotonic() < deadline, job
        time.sleep(1)
        job = run(capsys, "jobs", "describe", "--platform", platform.url, job["name"])[1]
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    assert job["displayName"] == "first-day-study"
    assert [t["state"] for t in job["trials"]] == ["SUCCEEDED", "SUCCEEDED"]
    x = float(job["trials"][0]["parameters"][0]["value"])
    assert job["trials"][0]["finalMeasurement"]["metrics"][0]["value"] == pytest.approx(2 * (1 - (x - 0.3) ** 2))

    # A study file that cannot run is refused before anything is sent.
    (folder / "study.yaml").write_text(STUDY.replace("train.py", "missing.py"))
    code, _, err = run(capsys, "jobs", "submit", "--platform", platform.url, "--config", "study/study.yaml")
    assert code == 1 and "script missing.py not found" in err, err

    # A Vertex HyperparameterTuningJob spec naming a relative script: read beside the file, sent along
    # (it was looked for in the platform's state directory).
    (folder / "train.py").write_text(TRAIN)
    (folder / "hpt.yaml").write_text(
        "display_name: vertex-spec\nmax_trial_count: 1\n" + STUDY[STUDY.index("study_spec:"):STUDY.index("max_trial")]
        + "trial_job_spec:\n  worker_pool_specs:\n  - replica_count: 1\n    container_spec:\n"
        "      image_uri: x\n      command: [python3, train.py]\n      args: [--scale=3]\n")
    code, job, err = run(capsys, "jobs", "submit", "--platform", platform.url, "--config", "study/hpt.yaml", "--wait")
    assert code == 0 and job["state"] == "JOB_STATE_SUCCEEDED", (err, job)
    x = float(job["trials"][0]["parameters"][0]["value"])
    assert job["trials"][0]["finalMeasurement"]["metrics"][0]["value"] == pytest.approx(3 * (1 - (x - 0.3) ** 2))


def test_jobs_submit_has_one_wait_flag():
    parser = argparse.ArgumentParser(prog="modelyard")
    client_cli.register(parser.add_subparsers(dest="command"))
    submit = parser._subparsers._group_actions[0].choices["jobs"]._subparsers._group_actions[0].choices["submit"]
    flags = {s for a in submit._actions for s in a.option_strings}
    assert "--wait" in flags and "--no-wait" not in flags


# ---- issue 27 point 1: --artifact-root as the Quickstart uses it ----
def test_artifact_root_relative_to_the_working_directory_and_said_at_start(tmp_path, tiny_models):
    import shutil
    import subprocess
    import sys

    import requests

    from tests.platform.conftest import PARENT, PlatformProcess, _env

    project = tmp_path / "project"
    shutil.copytree(tiny_models["models"]["tiny1"]["path"], project / "models" / "my_model" / "0001")
    # A root that does not exist stops the start, saying where it looked.
    refused = subprocess.run([sys.executable, "-m", "modelyard.platform", "--artifact-root", "modles",
                              "--store", str(tmp_path / "p.db")], cwd=project, env=_env(), capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"--artifact-root modles: {project / 'modles'} (from the working directory {project}) is not a directory" \
        in refused.stderr, refused.stderr
    assert not (tmp_path / "p.db").exists()

    p = PlatformProcess(project, _env(), ["--artifact-root", "models", "--no-warm-spare"])
    p.start()
    try:
        log = (project / "platform-1.log").read_text()
        assert f"artifact URIs are accepted only under {project / 'models'} (--artifact-root)" in log, log
        up = requests.post(f"{p.url}/v1/{PARENT}/models:upload", timeout=60, json={"model": {
            "displayName": "quickstart", "artifactUri": "models/my_model/0001",
            "containerSpec": {"imageUri": "modelyard/serve"}}})
        assert up.status_code == 200, up.text
        outside = requests.post(f"{p.url}/v1/{PARENT}/models:upload", timeout=60, json={"model": {
            "displayName": "outside", "artifactUri": tiny_models["models"]["tiny1"]["path"],
            "containerSpec": {"imageUri": "modelyard/serve"}}})
        assert outside.status_code == 403 and "outside the allowed roots" in outside.text, outside.text
    finally:
        p.cleanup()
