"""Issue 44, must-show 2: a job's Python package (``python_package_spec``) follows one rule for every
job kind (platform/jobs/job_packages.py), tuning trials included.

End to end, through the stock SDK: the textbook's tuning pattern, ``CustomJob.from_local_script(
script_path, requirements=[...])`` (the SDK builds and stages the ``aiplatform_custom_trainer_script``
source distribution) wrapped in a ``HyperparameterTuningJob``, the metric reported with ``hypertune``:
every trial succeeds and is measured. (Before, every trial died with ``No module named
'aiplatform_custom_trainer_script'``: trials never installed their packages.) The trial trains
nothing: its metric is a plain function of its parameters, so the test costs Python starts only.
Packages that cannot be installed are refused at create in Google's error format, nothing made.
One layer down, without processes: the spec's parsing, the archive and requirement checks, and the
pool a tuning job's trials run.
"""
from __future__ import annotations

import io
import tarfile
import uuid

import pytest
import requests

from tests.platform.conftest import STAGING_BUCKET
from tests.platform.jobs_helpers import aiplatform  # noqa: F401  (the SDK pointed at the session platform)

TRIAL_SCRIPT = '''\
import argparse

import hypertune

parser = argparse.ArgumentParser()
parser.add_argument("--learning_rate", type=float, default=1e-2)
parser.add_argument("--n_neurons", type=int, default=256)
parser.add_argument("--optimizer", default="adam")
args = parser.parse_args()

# Stands in for training a model: an "accuracy" that is a plain function of the parameters.
accuracy = 1.0 - abs(args.learning_rate - 0.01) - abs(args.n_neurons - 100) / 1000 - (args.optimizer == "sgd") / 10
hypertune.HyperTune().report_hyperparameter_tuning_metric(
    hyperparameter_metric_tag="accuracy", metric_value=accuracy, global_step=1)
'''


def _expected(params: dict) -> float:
    return 1.0 - abs(params["learning_rate"] - 0.01) - abs(params["n_neurons"] - 100) / 1000 \
        - (params["optimizer"] == "sgd") / 10


def _hp_job(aiplatform, trial_job, trials: int):
    from google.cloud.aiplatform import hyperparameter_tuning as hpt

    return aiplatform.HyperparameterTuningJob(
        display_name="book-search", custom_job=trial_job, metric_spec={"accuracy": "maximize"},
        parameter_spec={"learning_rate": hpt.DoubleParameterSpec(min=1e-3, max=1e-1, scale="log"),
                        "n_neurons": hpt.IntegerParameterSpec(min=1, max=300, scale="linear"),
                        "optimizer": hpt.CategoricalParameterSpec(["sgd", "adam"])},
        max_trial_count=trials, parallel_trial_count=2)  # 2: one trial per core of a 2-core machine


def test_tuning_over_a_local_script_with_requirements(aiplatform, tmp_path):
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state
    from google.cloud.aiplatform.compat.types import study as gca_study

    script = tmp_path / "my_vertex_ai_trial.py"
    script.write_text(TRIAL_SCRIPT)
    trial_job = aiplatform.CustomJob.from_local_script(
        display_name="my_search_trial_job", script_path=str(script), requirements=["cloudml-hypertune"],
        container_uri="us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12:latest",
        staging_bucket=f"gs://{STAGING_BUCKET}/staging")
    job = _hp_job(aiplatform, trial_job, 2)
    job.run(sync=True)
    assert job.state == gca_job_state.JobState.JOB_STATE_SUCCEEDED
    spec = job.gca_resource.trial_job_spec.worker_pool_specs[0].python_package_spec
    assert spec.python_module == "aiplatform_custom_trainer_script.task"
    assert len(job.trials) == 2
    for trial in job.trials:
        assert trial.state == gca_study.Trial.State.SUCCEEDED
        params = {p.parameter_id: p.value for p in trial.parameters}
        final = trial.final_measurement.metrics[0]
        assert final.metric_id == "accuracy" and final.value == pytest.approx(_expected(params), abs=1e-9)


def _sdist(requires: list[str]) -> bytes:
    """A source distribution as setuptools writes one: a module and its egg-info's requires.txt."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (("trainer-0.1/trainer/__init__.py", ""), ("trainer-0.1/trainer/task.py", "print('hi')\n"),
                           ("trainer-0.1/setup.py", "from setuptools import setup\nsetup(name='trainer', version='0.1', "
                                                    f"packages=['trainer'], install_requires={requires!r})\n"),
                           ("trainer-0.1/PKG-INFO", "Metadata-Version: 2.1\nName: trainer\nVersion: 0.1\n"),
                           ("trainer-0.1/trainer.egg-info/PKG-INFO", "Metadata-Version: 2.1\nName: trainer\nVersion: 0.1\n"),
                           ("trainer-0.1/trainer.egg-info/requires.txt", "".join(r + "\n" for r in requires))):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tuning_body(package_uri: str, module: str = "trainer.task") -> dict:
    return {"displayName": "refused", "maxTrialCount": 1, "parallelTrialCount": 1,
            "studySpec": {"metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
                          "parameters": [{"parameterId": "x", "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]},
            "trialJobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "machineSpec": {"machineType": "n1-standard-4"},
                                                  "pythonPackageSpec": {"executorImageUri": "x", "pythonModule": module,
                                                                        "packageUris": [package_uri]}}]}}


def test_packages_that_cannot_be_installed_are_refused_at_create(platform, gcs_emulator, aiplatform, tmp_path):
    from google.api_core import exceptions

    # The book's pattern with a requirement pip cannot find: the SDK's create is refused, no trial runs.
    script = tmp_path / "my_vertex_ai_trial.py"
    script.write_text(TRIAL_SCRIPT)
    trial_job = aiplatform.CustomJob.from_local_script(
        display_name="my_search_trial_job", script_path=str(script),
        requirements=["cloudml-hypertune", "modelyard-no-such-requirement-xq==9.9"],
        container_uri="us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12:latest",
        staging_bucket=f"gs://{STAGING_BUCKET}/staging")
    before = requests.get(platform.api("hyperparameterTuningJobs"), timeout=10).json().get("hyperparameterTuningJobs", [])
    with pytest.raises(exceptions.BadRequest, match="modelyard-no-such-requirement-xq"):  # 400 over REST
        _hp_job(aiplatform, trial_job, 2).run(sync=True)
    after = requests.get(platform.api("hyperparameterTuningJobs"), timeout=10).json().get("hyperparameterTuningJobs", [])
    assert [j["name"] for j in after] == [j["name"] for j in before]

    # Over REST, for both job kinds: each refusal names the field and says why.
    bucket = gcs_emulator["client"].bucket(STAGING_BUCKET)
    prefix = f"refused-{uuid.uuid4().hex[:8]}"
    bucket.blob(f"{prefix}/needs-missing.tar.gz").upload_from_string(_sdist(["modelyard-no-such-requirement-xq==9.9"]))
    bucket.blob(f"{prefix}/not-a-package.tar.gz").upload_from_string(b"just some bytes")
    bucket.blob(f"{prefix}/fine.tar.gz").upload_from_string(_sdist(["cloudml-hypertune"]))
    cases = [
        (f"gs://{STAGING_BUCKET}/{prefix}/nowhere.tar.gz", "trainer.task", "does not exist"),
        (f"/gcs/{STAGING_BUCKET}/{prefix}/nowhere.tar.gz", "trainer.task", "does not exist"),
        (f"gs://{STAGING_BUCKET}/{prefix}/not-a-package.tar.gz", "trainer.task", "is not a Python package pip can install"),
        (f"gs://{STAGING_BUCKET}/{prefix}/needs-missing.tar.gz", "trainer.task", "modelyard-no-such-requirement-xq"),
        (f"gs://{STAGING_BUCKET}/{prefix}/fine.tar.gz", "trainer/task.py", "is not a Python module name"),
    ]
    for kind in ("hyperparameterTuningJobs", "customJobs"):
        before = requests.get(platform.api(kind), timeout=10).json().get(kind, [])
        for uri, module, words in cases:
            body = _tuning_body(uri, module)
            if kind == "customJobs":
                body = {"displayName": "refused", "jobSpec": body["trialJobSpec"]}
            r = requests.post(platform.api(kind), json=body, timeout=180)
            assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", (kind, uri, r.text)
            assert words in r.json()["error"]["message"] and "python_package_spec" in r.json()["error"]["message"]
        after = requests.get(platform.api(kind), timeout=10).json().get(kind, [])
        assert [j["name"] for j in after] == [j["name"] for j in before]


# ---- one layer down: no process ------------------------------------------------------------------
def test_the_spec_is_parsed_and_named_in_errors():
    from modelyard.platform.api.errors import ApiError
    from modelyard.platform.jobs import job_packages

    assert job_packages.parse({"pythonModule": "a.b_c", "packageUris": ["gs://b/p.tar.gz"]}, "w") == \
        ("a.b_c", ["gs://b/p.tar.gz"])
    for spec, words in (({"packageUris": ["gs://b/p.tar.gz"]}, "needs python_module"),
                        ({"pythonModule": "m", "packageUris": []}, "needs python_module"),
                        ({"pythonModule": "m-1", "packageUris": ["gs://b/p"]}, "not a Python module name"),
                        ({"pythonModule": "m", "packageUris": ["gs://b/dir/"]}, r"package_uris\[0\] must name a package")):
        with pytest.raises(ApiError, match=words) as info:
            job_packages.parse(spec, "trial_job_spec.worker_pool_specs[0].python_package_spec")
        assert info.value.status == "INVALID_ARGUMENT" and "trial_job_spec.worker_pool_specs[0]" in info.value.message
    # On Ray a node fetches a /gcs/ package as the object it names (no disk is shared with the platform).
    from modelyard.platform.jobs.jobs_ray import NodeSetup

    assert NodeSetup.of(["/gcs/bkt/a/p.tar.gz"], None).packages == (("p.tar.gz", "gs://bkt/a/p.tar.gz"),)
    pools = job_packages.package_pools({"workerPoolSpecs": [{"containerSpec": {}}, {}, {"pythonPackageSpec": {"x": 1}}]})
    assert pools == [("job_spec.worker_pool_specs[2].python_package_spec", {"x": 1})]


def test_archives_and_requirements_checked_without_installing(tmp_path):
    from modelyard.platform.api.errors import ApiError
    from modelyard.platform.jobs import job_packages

    good = tmp_path / "trainer-0.1.tar.gz"
    good.write_bytes(_sdist(["cloudml-hypertune", "numpy>=1"]))
    bad = tmp_path / "trainer-0.2.tar.gz"
    bad.write_bytes(b"not gzip")
    assert job_packages._readable_archive(str(good)) and not job_packages._readable_archive(str(bad))
    # Satisfied by the platform's own environment: nothing to resolve (no pip run).
    assert job_packages._unsatisfied(["cloudml-hypertune", "numpy>=1", "numpy<1; python_version < '3'"], "f") == []
    assert job_packages._unsatisfied(["numpy<1", "modelyard-absent-xq"], "f") == ["numpy<1", "modelyard-absent-xq"]
    with pytest.raises(ApiError, match="not a valid requirement"):
        job_packages._unsatisfied(["numpy>>1"], "f")
    job_packages._check_installable("f", ["gs://b/trainer-0.1.tar.gz"], [str(good)])  # satisfied: passes
    with pytest.raises(ApiError, match="is not a Python package pip can install"):
        job_packages._check_installable("f", ["gs://b/trainer-0.2.tar.gz"], [str(bad)])


def test_a_trial_finds_the_jobs_python_and_gcs_paths(tmp_path):
    from modelyard.platform.jobs import job_env, job_packages

    python = job_env.PythonEnv(tmp_path)  # not created: only its paths and variables are read
    pool = {"replicaCount": "1", "machineSpec": {"machineType": "n1-standard-4"},
            "pythonPackageSpec": {"executorImageUri": "img", "pythonModule": "aiplatform_custom_trainer_script.task",
                                  "packageUris": ["gs://b/p.tar.gz"], "args": ["--epochs=2"],
                                  "env": [{"name": "GREETING", "value": "hi"}]}}
    out = job_packages.trial_pool(pool, python, None)
    assert "pythonPackageSpec" not in out and out["machineSpec"] == pool["machineSpec"]
    spec = out["containerSpec"]
    assert spec["command"] == [python.python, "-m", "aiplatform_custom_trainer_script.task"]
    assert spec["args"] == ["--epochs=2"] and spec["imageUri"] == "img"
    env = {e["name"]: e["value"] for e in spec["env"]}
    assert env["GREETING"] == "hi" and env["VIRTUAL_ENV"] == str(tmp_path / "venv")
    # A container trial finds the same: the job's Python first on PATH, /gcs/ paths rewritten as a CustomJob's.
    mount = job_env.GcsMount(tmp_path)  # no bucket served by this platform: the job's mirror
    pool = {"replicaCount": "1", "containerSpec": {"imageUri": "img", "command": ["sh", "-c", "pip3 install --user "
                                                   "/gcs/bkt/p.tar.gz && python3 -m trainer.task"], "args": ["--out=/gcs/bkt/o"]}}
    spec = job_packages.trial_pool(pool, python, mount)["containerSpec"]
    assert spec["command"] == ["sh", "-c", f"pip3 install --user {tmp_path}/gcs/bkt/p.tar.gz && python3 -m trainer.task"]
    assert spec["args"] == [f"--out={tmp_path}/gcs/bkt/o"]
    assert {e["name"]: e["value"] for e in spec["env"]}["PATH"].startswith(str(tmp_path / "venv" / "bin"))
