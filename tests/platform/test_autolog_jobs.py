"""``CustomJob.from_local_script(..., enable_autolog=True)``: test_custom_job's two autolog flows of
googleapis/python-aiplatform. The SDK adds ``google-cloud-aiplatform[autologging]`` to the job's package,
whose MLflow cannot install beside the platform's protobuf and pandas, so the job gets a Python environment
of its own (platform/jobs/job_python.py): before it starts for a prebuilt image (a python_package_spec), or
when its command's own ``pip3 install`` meets the conflict for a custom image (job_packages.job_pip). Inside
it the SDK finds the platform through the job's variables alone, and a scikit-learn fit is recorded into the
run the platform made for the job. The rule deciding it, one layer down and without processes, is in
test_autolog_rule.py.

The first run on a machine downloads that environment's ~90 packages from PyPI; the environment is kept
per requirement set under the session platform's jobs directory, so a run pays its build once (both flows
here ask the same set and run at once: the second waits for the first's build, then finds it ready)."""
from __future__ import annotations

import os
import tempfile

import pytest
import requests

from tests.platform.conftest import PARENT, STAGING_BUCKET
from tests.platform.jobs_helpers import aiplatform, experiments_sdk  # noqa: F401  (the module's SDK fixtures)

EXPERIMENT = "exp-autolog-job"
SCRIPT = '''\
import numpy as np
from sklearn.linear_model import Ridge

# A regressor: a classifier's autolog also saves plots as artifacts, copied into the SDK's file:///tmp/.
x = np.random.default_rng(0).random((64, 3))
Ridge(alpha=0.5).fit(x, x @ np.array([1.0, 2.0, 3.0]))
import importlib.util, google.protobuf, mlflow, sys
print("job python", sys.prefix, "protobuf", google.protobuf.__version__, "mlflow", mlflow.__version__,
      "modelyard", importlib.util.find_spec("modelyard") is not None)
'''


@pytest.fixture(scope="module")
def experiment(sdk):
    board = sdk.Tensorboard.create(display_name="autolog-job-tb")  # autolog() needs the experiment's TensorBoard
    sdk.init(experiment=EXPERIMENT, experiment_tensorboard=board)
    yield EXPERIMENT
    board.delete()


@pytest.mark.e2e
@pytest.mark.timeout(1800)  # a machine's first run resolves and downloads the job's ~90 packages
def test_both_autolog_flows_of_test_custom_job_record_their_fit_into_the_run_made_for_each(sdk, platform, experiment,
                                                                                          tmp_path):
    """test_custom_job's two flows, run at once (the second waits for the environment the first builds):
    a prebuilt image's job is a python_package_spec, its own Python made before it starts; a custom image's
    command is the SDK's ``sh -c "pip install --upgrade pip && pip3 install -q --user /gcs/.../package.tar.gz
    && python3 -m ...task"``, whose pip3 meets the conflict, so the python3 after it runs in the job's own
    Python. Each makes its run (only the experiment is given), as Google's custom-container test lets it."""
    from importlib import metadata

    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    platform_protobuf = metadata.version("protobuf")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    temp_mode = os.stat(tempfile.gettempdir()).st_mode
    jobs = {image: sdk.CustomJob.from_local_script(
        display_name=f"autolog-{name}", script_path=str(script), requirements=["scikit-learn", "pandas"],
        container_uri=image, enable_autolog=True, staging_bucket=f"gs://{STAGING_BUCKET}/autolog-{name}")
        for name, image in (("prebuilt", "us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest"),
                            ("custom", "python:3.8"))}
    command = jobs["python:3.8"].job_spec.worker_pool_specs[0].container_spec.command
    assert command[:2] == ["sh", "-c"] and "pip3 install -q --user /gcs/" in command[2]  # the SDK's, as on Vertex
    for job in jobs.values():
        job.run(experiment=experiment, sync=False)
    for image, job in jobs.items():
        try:
            job.wait()
        except RuntimeError:  # the SDK's "Job failed": the job's log says more
            pass
        log = requests.get(f"{platform.url}/modelyard/v1/jobs/{job.name}/logs", timeout=10).text
        assert job.state == gca_job_state.JobState.JOB_STATE_SUCCEEDED, (image, log[-3000:])
        # Its own environment, said in its log with the reason; the platform's protobuf 7 is not the job's, and
        # it found the platform through its variables alone: nothing of modelyard is importable there.
        why = next((line for line in log.splitlines() if "the job gets a Python environment of its own" in line), "")
        assert "protobuf 7." in why and "pandas 3." in why, (image, log[-3000:])
        python = next((line for line in log.splitlines() if "job python" in line), "")
        assert " protobuf 5." in python and " mlflow 2." in python and "modelyard False" in python, (image, log[-3000:])

    rows = {r["run_name"]: r for r in sdk.get_experiment_df(EXPERIMENT, include_time_series=False).to_dict("records")}
    for job in jobs.values():  # each job's run, made by the platform for it, holds the fit's parameter and metric
        run = job.job_spec.experiment_run
        assert run.startswith(f"{PARENT}/metadataStores/default/contexts/{EXPERIMENT}-custom-job-")
        row = rows[run.rsplit(f"/contexts/{EXPERIMENT}-", 1)[1]]
        assert (row["state"], float(row["param.alpha"]), row["metric.training_r2_score"] > 0.9) == ("COMPLETE", 0.5,
                                                                                                   True)
    assert len(rows) == 2
    assert os.stat(tempfile.gettempdir()).st_mode == temp_mode  # the jobs' autolog left /tmp as it was
    assert metadata.version("protobuf") == platform_protobuf  # the platform's packages untouched
