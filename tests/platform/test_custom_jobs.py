"""Issue 17: Vertex AI CustomJobs on ``modelyard platform`` with the stock SDK, and ``modelyard jobs``.

A worker pool's command + args run as local processes (one per replica), the image URI recorded
only; each replica sees Vertex's AIP_* directories under the base output directory, CLUSTER_SPEC,
and TF_CONFIG when there are several. Also: a failing replica fails the job with its last lines,
cancel stops every replica, bad specs are refused with nothing created, and the CLI submits a
CustomJob spec and a modelyard training config.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from tests.platform.conftest import STAGING_BUCKET, _env
from tests.platform.jobs_helpers import aiplatform, alive, job_processes, no_stray_jobs, wait_gone, wait_state  # noqa: F401

PROBE = str(Path(__file__).with_name("job_scripts") / "probe.py")


def _pool(args: list[str], replicas: int = 1, env: dict | None = None) -> dict:
    return {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": replicas,
            "container_spec": {"image_uri": "us-docker.pkg.dev/my-project/trainer:latest",
                               "command": [sys.executable, PROBE], "args": args,
                               "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}}


def test_custom_job_runs_its_pool_with_vertex_environment(aiplatform, gcs_emulator):
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    job = aiplatform.CustomJob(display_name="probe", worker_pool_specs=[_pool(["--epochs=2"], env={"GREETING": "hi"})])
    job.run(sync=True)  # base_output_dir: the SDK's timestamped directory under the staging bucket
    assert job.state == gca_job_state.JobState.JOB_STATE_SUCCEEDED
    spec = job.gca_resource.job_spec
    assert spec.worker_pool_specs[0].container_spec.image_uri == "us-docker.pkg.dev/my-project/trainer:latest"
    base = spec.base_output_directory.output_uri_prefix
    assert base.startswith(f"gs://{STAGING_BUCKET}/")
    # As on Vertex, AIP_MODEL_DIR is a gs:// URI under the base directory: the replica wrote its object there.
    blob = gcs_emulator["client"].bucket(STAGING_BUCKET).blob(base.split(f"{STAGING_BUCKET}/", 1)[1] + "/model/workerpool0-0.json")
    seen = json.loads(blob.download_as_text())
    assert seen["argv"] == ["--epochs=2"] and seen["env"]["GREETING"] == "hi"
    assert seen["env"]["CLOUD_ML_JOB_ID"] == job.name and seen["env"]["CLOUD_ML_PROJECT_ID"] == "local"
    for var, sub in (("AIP_MODEL_DIR", "model"), ("AIP_CHECKPOINT_DIR", "checkpoints"), ("AIP_TENSORBOARD_LOG_DIR", "logs")):
        assert seen["env"][var] == f"{base.rstrip('/')}/{sub}/"
    assert seen["env"]["TF_CONFIG"] is None  # one replica: no cluster, as on Vertex
    assert json.loads(seen["env"]["CLUSTER_SPEC"])["task"] == {"type": "workerpool0", "index": 0}
    assert job.gca_resource.start_time and job.gca_resource.end_time


def test_several_pools_get_one_cluster(aiplatform, tmp_path):
    # A parameter-server job: workers and ps serve until the chief (whose end ends the job) is done;
    # the chief ends once the four replicas have written their records (at most 60 s).
    job = aiplatform.CustomJob(display_name="cluster", base_output_dir=str(tmp_path),
                               worker_pool_specs=[_pool(["--sleep=60", "--records=4"]), _pool(["--sleep=300"], replicas=2),
                                                  _pool(["--sleep=300"])])
    job.run(sync=True)
    model_dir = tmp_path / "model"
    found = {p.stem: json.loads(p.read_text()) for p in model_dir.glob("*.json")}
    assert sorted(found) == ["workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool2-0"]
    configs = {name: json.loads(v["env"]["TF_CONFIG"]) for name, v in found.items()}
    cluster = configs["workerpool0-0"]["cluster"]
    assert sorted(cluster) == ["chief", "ps", "worker"] and len(cluster["worker"]) == 2
    assert all(c["cluster"] == cluster for c in configs.values())
    assert configs["workerpool0-0"]["task"] == {"type": "chief", "index": 0}
    assert configs["workerpool1-1"]["task"] == {"type": "worker", "index": 1}
    assert configs["workerpool2-0"]["task"] == {"type": "ps", "index": 0}
    assert len({v["pid"] for v in found.values()}) == 4


def test_a_failing_replica_fails_the_job_with_its_last_lines(aiplatform, tmp_path):
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    job = aiplatform.CustomJob(display_name="fails", base_output_dir=str(tmp_path), worker_pool_specs=[_pool(["--fail=3"])])
    with pytest.raises(RuntimeError, match="exited with code 3"):
        job.run(sync=True)
    assert job.state == gca_job_state.JobState.JOB_STATE_FAILED
    assert "failing on purpose" in job.gca_resource.error.message


def test_cancel_stops_every_replica(aiplatform, platform, tmp_path):
    from google.cloud.aiplatform.compat.types import job_state as gca_job_state

    job = aiplatform.CustomJob(display_name="long", base_output_dir=str(tmp_path),
                               worker_pool_specs=[_pool(["--sleep=120"]), _pool(["--sleep=120"], replicas=1)])
    job.submit()
    wait_state(platform, job.resource_name, ("JOB_STATE_RUNNING",))
    model_dir = tmp_path / "model"
    deadline = 60
    import time

    end = time.monotonic() + deadline
    while len(list(model_dir.glob("*.json"))) < 2 and time.monotonic() < end:
        time.sleep(0.2)
    pids = [json.loads(p.read_text())["pid"] for p in model_dir.glob("*.json")]
    assert len(pids) == 2
    job.cancel()
    with pytest.raises(RuntimeError, match="CANCELED"):
        job.wait_for_completion()
    assert job.state == gca_job_state.JobState.JOB_STATE_CANCELLED
    assert wait_gone(platform) == []
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("pools, words", [
    ([], "worker_pool_specs"),
    ([{"replicaCount": "1", "containerSpec": {"imageUri": "x"}}], "command is required"),
    ([{"replicaCount": "1", "containerSpec": {"imageUri": "x", "command": ["/no/such/trainer"]}}], "not an executable"),
    ([{"replicaCount": "2", "containerSpec": {"imageUri": "x", "command": ["python3"]}}], "exactly one replica"),
    ([{"replicaCount": "1", "containerSpec": {"imageUri": "x", "command": ["python3"]},
       "pythonPackageSpec": {"pythonModule": "m", "packageUris": ["gs://b/p.tar.gz"]}}], "exactly one of"),
    ([{"replicaCount": "many", "containerSpec": {"imageUri": "x", "command": ["python3"]}}], "integer"),
])
def test_bad_custom_jobs_create_nothing(platform, pools, words):
    before = requests.get(platform.api("customJobs"), timeout=10).json().get("customJobs", [])
    r = requests.post(platform.api("customJobs"), json={"displayName": "bad", "jobSpec": {"workerPoolSpecs": pools}},
                      timeout=10)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    assert words in r.json()["error"]["message"]
    after = requests.get(platform.api("customJobs"), timeout=10).json().get("customJobs", [])
    assert [j["name"] for j in after] == [j["name"] for j in before]


def _cli(platform, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modelyard", *args, "--platform", platform.url],
                          env=_env(), capture_output=True, text=True, timeout=timeout)


def test_jobs_cli_submits_a_custom_job_spec(platform, tmp_path):
    spec = {"worker_pool_specs": [_pool(["--sleep=60"])], "base_output_directory": {"output_uri_prefix": str(tmp_path / "o")}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = _cli(platform, "jobs", "submit", "--config", str(tmp_path / "spec.yaml"), "--display-name", "from-cli")
    assert out.returncode == 0, out.stderr
    job_id = json.loads(out.stdout)["name"].rsplit("/", 1)[-1]
    wait_state(platform, json.loads(out.stdout)["name"], ("JOB_STATE_RUNNING",))
    listed = json.loads(_cli(platform, "jobs", "list").stdout)
    assert job_id in [j["name"].rsplit("/", 1)[-1] for j in listed]
    described = json.loads(_cli(platform, "jobs", "describe", job_id).stdout)
    assert described["displayName"] == "from-cli" and described["state"] == "JOB_STATE_RUNNING"
    cancelled = _cli(platform, "jobs", "cancel", job_id)
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["state"] in ("JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")
    assert wait_state(platform, described["name"], ("JOB_STATE_CANCELLED",))["error"]["code"] == 1
    logs = _cli(platform, "jobs", "logs", job_id).stdout
    assert "workerpool0-0: started with ['--sleep=60']" in logs
    missing = _cli(platform, "jobs", "describe", "123")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    # A modelyard training config (a one-replica CustomJob of `modelyard train` on it, started warm):
    # test_warm_jobs.py submits docs/training.md's as written.


def test_a_running_job_survives_a_platform_restart_and_a_killed_one_fails(platform, tmp_path):
    import signal
    import time

    def submit(name: str, sleep: int, out: Path) -> str:
        # the replica ends when the test writes out/done (or after `sleep` seconds)
        body = {"displayName": name, "jobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {
            "imageUri": "x", "command": [sys.executable, PROBE], "args": [f"--sleep={sleep}", f"--until={out / 'done'}"]}}],
            "baseOutputDirectory": {"outputUriPrefix": str(out)}}}
        return requests.post(platform.api("customJobs"), json=body, timeout=10).json()["name"]

    def replica_pid(out: Path) -> int:
        end = time.monotonic() + 60
        while not (out / "model" / "workerpool0-0.json").exists() and time.monotonic() < end:
            time.sleep(0.1)
        return json.loads((out / "model" / "workerpool0-0.json").read_text())["pid"]

    name = submit("survivor", 120, tmp_path / "a")
    pid = replica_pid(tmp_path / "a")
    platform.stop()  # the job's processes are not the platform's to stop: the next platform adopts them
    assert alive(pid)
    platform.start()
    assert wait_state(platform, name, ("JOB_STATE_RUNNING", "JOB_STATE_FAILED"))["state"] == "JOB_STATE_RUNNING"
    assert alive(pid)
    (tmp_path / "a" / "done").touch()  # its replica ends now, under the new platform
    job = wait_state(platform, name, ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"))
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    log = requests.get(f"{platform.url}/modelyard/v1/jobs/{name.rsplit('/', 1)[-1]}/logs", timeout=10).text
    assert "run 1" in log and "run 2" not in log  # adopted, not started again

    # The job's own process dies (a crash): the job fails saying so; the platform serves on.
    name = submit("crashes", 120, tmp_path / "b")
    orphan = replica_pid(tmp_path / "b")
    child = requests.get(f"{platform.url}/v1/{name}", timeout=10).json()
    pids = [p for p in job_processes(platform) if b"job_child" in open(f"/proc/{p}/cmdline", "rb").read()]
    assert len(pids) == 1, child
    os.kill(pids[0], signal.SIGKILL)
    job = wait_state(platform, name, ("JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"))
    assert job["state"] == "JOB_STATE_FAILED" and "killed by signal 9" in job["error"]["message"]
    assert wait_gone(platform) == [] and not alive(orphan)  # its replica did not outlive it
    assert requests.get(f"{platform.url}/healthz", timeout=5).text == "ok"


def test_python_package_spec_is_installed_with_its_requirements_and_run(aiplatform, gcs_emulator, tmp_path):
    # The package declares a requirement (small, pure Python, from PyPI, not installed beside the platform):
    # it is installed with it into the job's own environment, as on Vertex; the platform's stays as it was.
    import importlib.util

    assert importlib.util.find_spec("pyjokes") is None, "pyjokes must not be installed for this test"
    src = tmp_path / "src"
    (src / "trainer").mkdir(parents=True)
    (src / "trainer" / "__init__.py").write_text("")
    (src / "trainer" / "task.py").write_text(
        "import os, sys, pyjokes\n"
        "open(os.path.join(os.environ['AIP_MODEL_DIR'], 'done.txt'), 'w').write(' '.join(sys.argv[1:]) + ' ' + "
        "pyjokes.__name__ + ' ' + os.environ['VIRTUAL_ENV'])\n")
    (src / "setup.py").write_text("from setuptools import setup\nsetup(name='trainer', version='0.1', packages=['trainer'], "
                                  "install_requires=['pyjokes'])\n")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist"], cwd=src, check=True, capture_output=True, timeout=120)
    sdist = next((src / "dist").glob("trainer-0.1.tar.gz"))
    gcs_emulator["client"].bucket(STAGING_BUCKET).blob("pkgs/trainer-0.1.tar.gz").upload_from_filename(str(sdist))
    job = aiplatform.CustomJob(display_name="pkg", base_output_dir=str(tmp_path / "out"), worker_pool_specs=[{
        "machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
        "python_package_spec": {"executor_image_uri": "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-12:latest",
                                "package_uris": [f"gs://{STAGING_BUCKET}/pkgs/trainer-0.1.tar.gz"],
                                "python_module": "trainer.task", "args": ["--lr=0.1"]}}])
    job.run(sync=True)
    args, module, venv = (tmp_path / "out" / "model" / "done.txt").read_text().split(" ")
    assert (args, module) == ("--lr=0.1", "pyjokes") and venv.endswith("/venv")
    assert importlib.util.find_spec("pyjokes") is None
