"""Shared by the job tests (batch prediction, custom, tuning, pipelines): the stock SDK pointed at the session
platform with a quicker poll, a wait on a job's state, and the job processes of a platform."""
from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import requests

from tests.platform.conftest import STAGING_BUCKET, live_processes, require

FINAL = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")


@contextlib.contextmanager
def quick_lro_polling():
    """The SDK's long-running operations (deploy, undeploy, delete...) polled every 0.1-0.5 s while
    inside: google-api-core's default waits 1 s, then 1.5 times longer each time up to 20 s, so a
    deploy done in 3 s is seen at 4.75 s and one done in 9 s at 13.2 s. (Every operation future
    defaults to the one ``DEFAULT_POLLING`` object, bound as a default argument: changed in place.)"""
    from google.api_core.future import polling

    default = polling.DEFAULT_POLLING
    saved = default._initial, default._maximum, default._multiplier
    default._initial, default._maximum, default._multiplier = 0.1, 0.5, 1.5
    try:
        yield
    finally:
        default._initial, default._maximum, default._multiplier = saved


@pytest.fixture(scope="module")
def aiplatform(platform, gcs_emulator):
    aip = require("google.cloud.aiplatform", "pip install -e '.[test]' (installs google-cloud-aiplatform)")
    import google.auth.credentials
    from google.cloud.aiplatform import jobs as sdk_jobs

    aip.init(project="local", location="us-central1", api_endpoint=platform.url, api_transport="rest",
             credentials=google.auth.credentials.AnonymousCredentials(), staging_bucket=f"gs://{STAGING_BUCKET}")
    saved = sdk_jobs._JOB_WAIT_TIME
    sdk_jobs._JOB_WAIT_TIME = 0.5  # the SDK polls every 5 s; the jobs here take a few seconds
    with quick_lro_polling():
        yield aip
    sdk_jobs._JOB_WAIT_TIME = saved


@pytest.fixture(scope="module", name="sdk")
def experiments_sdk(aiplatform):
    """``sdk`` of the experiment tests: ``aiplatform`` with ``google.auth.default()`` answering anonymous
    credentials. The SDK asks it when an experiment reuses the global TensorBoard
    (metadata._ExperimentTracker._get_global_tensorboard), whatever init() was given, and this machine has no
    Google credentials, as a local platform's user need not have. The experiment tracker is reset after."""
    import google.auth
    import google.auth.credentials

    saved = google.auth.default
    google.auth.default = lambda *a, **k: (google.auth.credentials.AnonymousCredentials(), "local")
    yield aiplatform
    google.auth.default = saved
    aiplatform.metadata.metadata._experiment_tracker.reset()


@pytest.fixture(scope="module", name="sdk")
def pipeline_sdk(aiplatform):
    """``sdk`` of the pipeline tests: ``aiplatform`` with PipelineJob's 5 s poll cut to 0.5 s and Cloud
    Resource Manager failing at once."""
    from google.cloud.aiplatform import pipeline_jobs
    from google.cloud.aiplatform.utils import resource_manager_utils

    def no_resource_manager(*_a, **_k):
        raise ConnectionError("no route to cloudresourcemanager.googleapis.com from this machine")

    saved = pipeline_jobs._JOB_WAIT_TIME, resource_manager_utils.get_project_number
    pipeline_jobs._JOB_WAIT_TIME = 0.5  # the SDK polls a pipeline every 5 s
    # submit() checks who owns the pipeline root's bucket through Cloud Resource Manager (not the API
    # endpoint it was given): offline that call retries for 60 s, then the SDK logs it and goes on.
    # Failing it at once changes nothing else (docs/pipelines.md, known limits).
    resource_manager_utils.get_project_number = no_resource_manager
    yield aiplatform
    pipeline_jobs._JOB_WAIT_TIME, resource_manager_utils.get_project_number = saved


def job_processes(platform) -> list[int]:
    """Live processes started for the platform's jobs (found by the jobs' work dir in their command
    line or environment: the replicas of a custom job get it as their working directory)."""
    marker = str(platform.workdir / "state" / "jobs").encode()
    return [pid for pid, cmdline, cwd in live_processes() if marker in cmdline or cwd.startswith(marker)]


def kill_platform_and_its_jobs(platform) -> None:
    """kill -9 of the platform and of every process its jobs started, then the platform again."""
    platform.stop(signal.SIGKILL)
    for pid in job_processes(platform):
        os.kill(pid, signal.SIGKILL)
    platform.start()


@pytest.fixture(scope="module", autouse=True)
def no_stray_jobs(platform):
    """Every job process a module started is gone at the end (killed if a test failed midway)."""
    yield
    for pid in job_processes(platform):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_state(platform, name: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = requests.get(f"{platform.url}/v1/{name}", timeout=10).json()
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"{name} did not reach {states}: {job}")


def wait_gone(platform, timeout: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout
    while job_processes(platform) and time.monotonic() < deadline:
        time.sleep(0.1)
    return job_processes(platform)


def alive(pid: int) -> bool:
    """The process runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
