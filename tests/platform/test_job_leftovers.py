"""kill -9 of the platform between starting a job's process and writing its pid: the next platform
finds the row RUNNING with no pid, and the process it started still runs, untracked. Before anything
else the runner kills every process carrying the job's id (a custom job must not run twice), then
fails the job saying it was lost: no orphan, no stuck job. The end-to-end restarts (adopted jobs,
killed children) are in test_custom_jobs.py; this is the window those cannot hit on purpose."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from modelyard.platform.jobs.job_runner import FAILED, JOB_ID_ENV, RUNNING, JobRunner
from modelyard.platform.state.store import Store


def test_a_job_process_started_before_its_pid_was_written_is_killed_and_the_job_fails(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    now = time.time()
    store.add_job({"id": "42", "kind": "customJobs", "parent": "projects/p/locations/l", "display_name": "lost",
                   "state": RUNNING, "spec": {}, "result": {}, "labels": {}, "work_dir": str(tmp_path / "jobs" / "42"),
                   "pid": None, "runs": 1, "created": now, "started": now, "updated": now})
    # What the killed platform had started: the job's child, and a grandchild in its own session.
    env = {**os.environ, JOB_ID_ENV: "42"}
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env,
                              start_new_session=True) for _ in range(2)]
    try:
        runner = JobRunner(store, tmp_path, is_leader=lambda: True)
        runner.tick()
        assert [p.wait(timeout=10) for p in procs] == [-9, -9]
        job = store.get_job("42")
        assert job["state"] == FAILED and job["pid"] is None
        assert "lost while the platform was stopped" in job["error"]["message"]
        runner.tick()  # nothing more to do: the job stays failed, nothing is started again
        assert store.get_job("42")["runs"] == 1
    finally:
        for p in procs:
            p.kill()
            p.wait()
