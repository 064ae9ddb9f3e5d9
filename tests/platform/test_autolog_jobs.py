"""``CustomJob.from_local_script(..., enable_autolog=True)`` (test_custom_job's two autolog flows of
googleapis/python-aiplatform, the prebuilt-image one): the SDK adds ``google-cloud-aiplatform[autologging]``
to the job's requirements, whose MLflow cannot install beside the platform's protobuf and pandas, so the
job gets a Python environment of its own (platform/jobs/job_python.py); inside it the SDK finds the
platform through the job's variables alone, and a scikit-learn fit is recorded into the run the platform
made for the job. The rule deciding it, one layer down and without processes, is in test_autolog_rule.py.

The first run on a machine downloads that environment's ~90 packages from PyPI; the environment is kept
per requirement set under the session platform's jobs directory, so a run pays its build once."""
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


@pytest.mark.e2e
@pytest.mark.timeout(1800)  # a machine's first run resolves and downloads the job's ~90 packages
def test_a_job_with_enable_autolog_records_its_fit_into_the_run_made_for_it(sdk, platform, tmp_path):
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    board = sdk.Tensorboard.create(display_name="autolog-job-tb")  # autolog() needs the experiment's TensorBoard
    sdk.init(experiment=EXPERIMENT, experiment_tensorboard=board)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    temp_mode = os.stat(tempfile.gettempdir()).st_mode
    job = sdk.CustomJob.from_local_script(
        display_name="autolog-job", script_path=str(script), requirements=["scikit-learn", "pandas"],
        container_uri="us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest", enable_autolog=True,
        staging_bucket=f"gs://{STAGING_BUCKET}/autolog-job")
    job.run(experiment=EXPERIMENT)  # the job makes its run, as test_custom_job's custom-container flow lets it
    log = requests.get(f"{platform.url}/modelyard/v1/jobs/{job.name}/logs", timeout=10).text
    assert job.state == gca_job_state.JobState.JOB_STATE_SUCCEEDED, log[-3000:]
    # Its own environment, said in its log with the reason; the platform's protobuf 7 is not the job's.
    why = next((line for line in log.splitlines() if "the job gets a Python environment of its own" in line), "")
    assert "protobuf 7." in why and "pandas 3." in why, log[-3000:]
    job_python = next((line for line in log.splitlines() if "job python" in line), "")
    # ... and it found the platform through its variables alone: nothing of modelyard is importable there.
    assert " protobuf 5." in job_python and " mlflow 2." in job_python and "modelyard False" in job_python, log[-3000:]

    run = job.job_spec.experiment_run
    assert run.startswith(f"{PARENT}/metadataStores/default/contexts/{EXPERIMENT}-custom-job-")
    rows = sdk.get_experiment_df(EXPERIMENT, include_time_series=False).to_dict("records")
    assert [r["run_name"] for r in rows] == [run.rsplit(f"/contexts/{EXPERIMENT}-", 1)[1]]
    row = rows[0]
    assert (row["state"], float(row["param.alpha"]), row["metric.training_r2_score"] > 0.9) == ("COMPLETE", 0.5, True)
    assert os.stat(tempfile.gettempdir()).st_mode == temp_mode  # the job's autolog left /tmp as it was
    board.delete()
