"""Issue 29, one layer below test_warm_jobs: which jobs start from the platform's warm interpreter
(warm_jobs.blocker over custom_jobs' checked pools, forkserver.warm_blocker's variables), and the
pid records a forked process is found by (a recycled pid is not the recorded process). No platform,
no TensorFlow."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from modelyard.platform.jobs import custom_jobs, warm_jobs
from modelyard.tuning.forkserver import read_pids, record_pid, recorded_pids, warm_blocker

TRAIN = [sys.executable, "-m", "modelyard", "train", "cfg.yaml"]


def _spec(command: list[str], env: dict | None = None, pools: int = 1) -> dict:
    pool = {"replicaCount": "1", "containerSpec": {"imageUri": "x", "command": command,
                                                             "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}}
    workers = {"replicaCount": "1", "containerSpec": {"imageUri": "x", "command": command}}
    return {"jobSpec": {"workerPoolSpecs": [pool] + [workers] * (pools - 1)}}


def test_variables_read_at_start_or_import_block_a_warm_start_and_first_op_ones_do_not():
    base = {"PATH": "/bin", "TF_USE_LEGACY_KERAS": "1"}
    assert warm_blocker(dict(base), base) is None
    for name in ("PYTHONHASHSEED", "PYTHONPATH", "LD_PRELOAD", "TF_CPP_MIN_LOG_LEVEL", "MALLOC_ARENA_MAX", "KERAS_HOME"):
        why = warm_blocker({**base, name: "7"}, base)
        assert why is not None and name in why, (name, why)
    assert "TF_USE_LEGACY_KERAS" in warm_blocker({**base, "TF_USE_LEGACY_KERAS": "0"}, base)
    assert "TF_USE_LEGACY_KERAS" in warm_blocker({"PATH": "/bin"}, base)  # unset in the job, set in the server
    # Read by TensorFlow at its first op (set in the child before it runs one), or applied in the child.
    for name in ("CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS", "TF_CONFIG", "PYTHONUNBUFFERED",
                 "AIP_MODEL_DIR", "MODELYARD_JOB_ID"):
        assert warm_blocker({**base, name: "1"}, base) is None, name


def test_a_user_base_counts_only_when_its_site_directory_exists(tmp_path: Path):
    base = {"PATH": "/bin"}
    assert warm_blocker({**base, "PYTHONUSERBASE": str(tmp_path / "userbase")}, base) is None
    (tmp_path / "userbase" / "lib").mkdir(parents=True)
    assert "PYTHONUSERBASE" in warm_blocker({**base, "PYTHONUSERBASE": str(tmp_path / "userbase")}, base)


def test_which_custom_jobs_start_warm(tmp_path: Path):
    def why(spec: dict, engine: dict | None = None) -> str | None:
        return custom_jobs.warm_blocker(spec, engine, tmp_path)

    assert why(_spec(TRAIN)) is None  # what `jobs submit` makes of a training config
    assert "Ray" in why(_spec(TRAIN), {"name": "ray", "address": "x"})
    assert "several replicas" in why(_spec(TRAIN, pools=2))
    assert "PYTHONHASHSEED" in why(_spec(TRAIN, env={"PYTHONHASHSEED": "0"}))
    assert why(_spec(TRAIN, env={"CUDA_VISIBLE_DEVICES": ""})) is None
    assert "not a Python script" in why(_spec(["/bin/sleep", "1"]))
    (tmp_path / "plain.py").write_text("import time\ntime.sleep(1)\n")
    (tmp_path / "tf.py").write_text("import json\nimport tensorflow as tf\n")
    assert "does not import TensorFlow" in why(_spec([sys.executable, str(tmp_path / "plain.py")]))
    assert why(_spec([sys.executable, "tf.py"])) is None  # relative: read from the job's directory
    packaged = {"jobSpec": {"workerPoolSpecs": [{"replicaCount": "1", "pythonPackageSpec": {
        "executorImageUri": "x", "packageUris": ["gs://b/p.tar.gz"], "pythonModule": "trainer.task"}}]}}
    assert "packages" in why(packaged)


def test_recorded_pids_are_the_running_processes_they_name(tmp_path: Path):
    pidfile = tmp_path / warm_jobs.PIDS_FILE
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record_pid(pidfile, proc.pid)
        with open(pidfile, "a") as f:
            f.write(f"{os.getpid()} 1\n")  # a pid now used by another process than the one recorded
            f.write("garbage line\n")
        assert list(read_pids(pidfile)) == [proc.pid, os.getpid()]
        assert [pid for pid, _ in recorded_pids(pidfile)] == [proc.pid]
        proc.kill()
        proc.wait()
        assert recorded_pids(pidfile) == []
    finally:
        proc.kill()
        proc.wait()
    assert recorded_pids(tmp_path / "missing") == []
