"""Issue 29: a training config submitted with ``modelyard jobs submit`` starts from the platform's
warm interpreter (the tuner's fork server, kept by the job runner), as docs/training.md's block runs
it: the job's training process says from inside that it found TensorFlow already imported; its result equals a cold run's of the same
seeded config (a pool variable read when Python starts makes that one cold, saying why in its log);
a warm job survives a kill -9 of its platform, is adopted by the next one and cancelled by it. One
layer down: the leftover scan finds warm processes by the pids recorded in the job's directory,
since their /proc environment is the server's and carries no job id.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests
import yaml

from modelyard.platform.jobs.job_runner import FAILED, JOB_ID_ENV, RUNNING, JobRunner
from modelyard.platform.jobs.warm_jobs import PIDS_FILE
from modelyard.platform.state.store import Store
from modelyard.tuning.forkserver import proc_stat, record_pid
from tests.doc_blocks import blocks, sh, shell_env
from tests.platform.conftest import STAGING_BUCKET, _env
from tests.platform.jobs_helpers import alive, no_stray_jobs, wait_gone, wait_state  # noqa: F401

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"
SEEDED = {"model": "demo", "strategy": "one_device", "global_batch_size": 32, "epochs": 2, "steps_per_epoch": 3,
          "seed": 7, "tensorboard": False, "input_report": False}


def _cli(platform, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modelyard", *args, "--platform", platform.url],
                          env=_env(), capture_output=True, text=True, timeout=timeout)


def _log(platform, name: str) -> str:
    return requests.get(f"{platform.url}/modelyard/v1/jobs/{name.rsplit('/', 1)[-1]}/logs", timeout=10).text


def _losses(job_dir: Path) -> list:
    metrics = json.loads((job_dir / "metrics.json").read_text())
    return [(e["epoch"], e["loss"]) for e in metrics["epochs"]]


def test_a_training_config_starts_warm_and_ends_as_a_cold_run_does(platform, tmp_path, gcs_emulator):
    """docs/training.md's block as written (its platform URL the session platform's): the config is
    written, submitted with `jobs submit --wait`, and its log shows the training process found
    TensorFlow imported. Then the same config, cold, gives the same losses; its job dir is a gs:// one
    (issue 44: modelyard train in a job writes it through TensorFlow's gs:// and the job's gateway)."""
    (block,) = [b for b in blocks(DOC.read_text()) if b.lang == "bash" and b.body.startswith("cat > warm.yaml")]
    assert block.body.count("http://127.0.0.1:8600") == 2
    out = sh(block.body.replace("http://127.0.0.1:8600", platform.url), tmp_path, shell_env(tmp_path)).stdout
    # Printed by the training process itself, before `modelyard train` ran.
    assert re.search(r"^chief:0 \| \[modelyard\] warm start: pid \d+ forked from pid \d+, TensorFlow already "
                     r"imported$", out, re.M), out
    assert "chief:0 | chief:0: training modelyard.training.demo with one_device on 1 replica(s), global batch 32" in out, out
    assert "cold start" not in out and "epoch 2/2" in out, out
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    # `jobs submit` made a one-replica CustomJob of `modelyard train` on the file.
    ((pool,),) = [job["jobSpec"]["workerPoolSpecs"]]
    assert pool["containerSpec"]["command"][-3:] == ["modelyard", "train", str(tmp_path / "warm.yaml")]
    assert (tmp_path / "runs" / "warm" / "metrics.json").is_file()
    config = yaml.safe_load((tmp_path / "warm.yaml").read_text())

    # The same config as a CustomJob whose pool sets a variable read when Python starts: cold, and says why.
    cold_dir = f"{tmp_path.name}/runs/cold"  # in the platform's storage: the session storage's root
    (tmp_path / "cold.yaml").write_text(yaml.safe_dump({**config, "job_dir": f"gs://{STAGING_BUCKET}/{cold_dir}"}))
    body = {"displayName": "cold", "jobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {
        "imageUri": "modelyard/train", "command": [sys.executable, "-m", "modelyard", "train", str(tmp_path / "cold.yaml")],
        "env": [{"name": "PYTHONHASHSEED", "value": "0"}]}}]}}
    name = requests.post(platform.api("customJobs"), json=body, timeout=10).json()["name"]
    cold_job = wait_state(platform, name, ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), timeout=300)
    cold_log = _log(platform, name)
    assert cold_job["state"] == "JOB_STATE_SUCCEEDED", cold_log
    assert "cold start (not from the platform's warm interpreter): PYTHONHASHSEED differ" in cold_log, cold_log
    assert "warm start" not in cold_log, cold_log
    warm, cold = _losses(tmp_path / "runs" / "warm"), _losses(Path(gcs_emulator["root"]) / STAGING_BUCKET / cold_dir)
    assert len(warm) == 2 and warm == cold


def test_a_warm_job_survives_a_platform_kill_and_is_cancelled_by_the_next_one(platform, tmp_path):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(yaml.safe_dump({**SEEDED, "epochs": 1000, "steps_per_epoch": 50, "job_dir": str(tmp_path / "long")}))
    out = _cli(platform, "jobs", "submit", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    name = json.loads(out.stdout)["name"]
    work_dir = platform.workdir / "state" / "jobs" / name.rsplit("/", 1)[-1]
    deadline = time.monotonic() + 180
    while "warm start" not in _log(platform, name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "warm start" in _log(platform, name), _log(platform, name)
    pids = [int(line.split()[0]) for line in (work_dir / PIDS_FILE).read_text().splitlines()]
    assert len(pids) == 2 and all(alive(p) for p in pids)  # the job's process and its replica
    for pid in pids:  # forked: the job's id is not in the environment /proc shows
        assert f"{JOB_ID_ENV}=".encode() not in open(f"/proc/{pid}/environ", "rb").read()

    platform.stop(signal.SIGKILL)  # its warm interpreter dies with it; the job does not
    time.sleep(0.5)
    assert all(alive(p) for p in pids)
    platform.start()
    assert wait_state(platform, name, ("JOB_STATE_RUNNING", "JOB_STATE_FAILED"))["state"] == "JOB_STATE_RUNNING"
    time.sleep(1.0)  # a few ticks of the new runner: adopted (found by its recorded pids), not failed as lost
    assert requests.get(f"{platform.url}/v1/{name}", timeout=10).json()["state"] == "JOB_STATE_RUNNING"
    assert "run 2" not in _log(platform, name)

    cancelled = _cli(platform, "jobs", "cancel", name.rsplit("/", 1)[-1])
    assert cancelled.returncode == 0, cancelled.stderr
    job = wait_state(platform, name, ("JOB_STATE_CANCELLED", "JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"))
    assert job["state"] == "JOB_STATE_CANCELLED", job
    assert wait_gone(platform) == [] and not any(alive(p) for p in pids)


def test_the_leftover_scan_kills_warm_processes_by_their_recorded_pids(tmp_path):
    """A row RUNNING with no pid (the platform died before writing it) whose processes were forked:
    no job id in their environment, their pids in the job's warm.pids; one of them forked again."""
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    now = time.time()
    work_dir = tmp_path / "jobs" / "7"
    work_dir.mkdir(parents=True)
    store.add_job({"id": "7", "kind": "customJobs", "parent": "projects/p/locations/l", "display_name": "lost",
                   "state": RUNNING, "spec": {}, "result": {}, "labels": {}, "work_dir": str(work_dir),
                   "pid": None, "runs": 1, "created": now, "started": now, "updated": now})
    env = {k: v for k, v in os.environ.items() if k != JOB_ID_ENV}
    # The recorded process forks a child in its group (as a warm replica's own fork would be): no record of it.
    script = "import os, time\nif os.fork() == 0:\n    time.sleep(120)\nelse:\n    print(os.getpid(), flush=True); time.sleep(120)"
    leader = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True, stdout=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True)
    try:
        leader.stdout.readline()
        record_pid(work_dir / PIDS_FILE, leader.pid)
        members = [int(p) for p in os.listdir("/proc") if p.isdigit() and _group(int(p)) == leader.pid]
        assert len(members) == 2
        JobRunner(store, tmp_path, is_leader=lambda: True).tick()
        assert leader.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while any(alive(p) for p in members) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in members)
        assert other.poll() is None  # neither recorded nor of the job: left alone
        job = store.get_job("7")
        assert job["state"] == FAILED and "lost while the platform was stopped" in job["error"]["message"]
    finally:
        for p in (leader, other):
            p.kill()
            p.wait()


def _group(pid: int) -> int | None:
    stat = proc_stat(pid)
    return int(stat[3]) if stat else None


# Issue 44: a warm job's replica (the platform's Python, forked: no venv .pth) finds what a cold one does.
SDK_SCRIPT = '''
import os
import tensorflow as tf  # a warm start: this replica is forked from the platform's warm interpreter
from google.cloud import aiplatform

aiplatform.init()  # no arguments: the platform's URL and the job's project (sdk_defaults)
config = aiplatform.initializer.global_config
names = [j.resource_name for j in aiplatform.CustomJob.list()]
print("sdk:", config.project, config.api_endpoint, os.environ["CLOUD_ML_JOB_ID"] in " ".join(names), flush=True)
print("metadata:", os.environ.get("GCE_METADATA_HOST", "-"), "gateway:", os.environ.get("HTTPS_PROXY", "-"), flush=True)
'''


def test_a_warm_jobs_sdk_finds_the_platform_and_its_identity(platform, tmp_path):
    script = tmp_path / "sdk_job.py"
    script.write_text(SDK_SCRIPT)
    body = {"displayName": "warm-sdk", "jobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {
        "imageUri": "modelyard/train", "command": [sys.executable, str(script)]}}]}}
    name = requests.post(platform.api("customJobs"), json=body, timeout=10).json()["name"]
    job = wait_state(platform, name, ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), timeout=300)
    log = _log(platform, name)
    assert job["state"] == "JOB_STATE_SUCCEEDED", log
    assert "[modelyard] warm start:" in log and "cold start" not in log, log
    project = name.split("/")[1]
    assert f"sdk: {project} {platform.url} True" in log, log  # the platform's API, this job in its list
    metadata, gateway = re.search(r"metadata: (\S+) gateway: (\S+)", log).groups()
    assert metadata.startswith("127.0.0.1:") and gateway.startswith("http://127.0.0.1:"), log  # job_identity's
