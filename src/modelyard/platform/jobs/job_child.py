"""The child process of one job: ``python -m modelyard.platform.jobs.job_child WORK_DIR``.

Reads ``WORK_DIR/job.json`` (written by the runner), runs the job kind's ``execute(work_dir, job)``
and writes ``WORK_DIR/result.json``: ``{"state": "JOB_STATE_SUCCEEDED", ...result fields}`` or
``{"state": "JOB_STATE_FAILED", "error": google.rpc.Status}``. Its stdout/stderr are the job's log.
"""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from modelyard.platform.api.errors import ApiError
from modelyard.platform.jobs import job_identity, sdk_defaults, warm_jobs
from modelyard.platform.jobs.job_runner import FAILED, JOB_FILE, RESULT_FILE, SUCCEEDED, JobFailed, kind_module, write_json

def main(work_dir: str) -> int:
    root = Path(work_dir)
    job = json.loads((root / JOB_FILE).read_text())
    print(f"modelyard job {job['id']} ({job['kind']}), run {job.get('run', 1)}", flush=True)
    # The SDK's defaults here, so a replica forked from this process (a warm job's) has them too; a
    # fresh Python of the job's venv gets them from the venv's .pth (job_env).
    sdk_defaults.install()
    try:
        kind = kind_module(job["kind"])
        elsewhere = getattr(kind, "processes_elsewhere", None)  # its processes run on Ray nodes, served there
        with job_identity.job_identity(root, job, bool(elsewhere and elsewhere(job)), warm_jobs.may_fork_here()):
            result = kind.execute(root, job) or {}
        out = {"state": SUCCEEDED, **result}
    except (JobFailed, ApiError) as exc:
        print(f"job failed: {exc}", flush=True)
        out = {"state": FAILED, "error": ApiError(exc.status, str(exc)).to_rpc_status()}
    except Exception as exc:  # a bug or an unexpected I/O failure: the job fails and says what
        traceback.print_exc()
        out = {"state": FAILED, "error": ApiError("INTERNAL", f"{type(exc).__name__}: {exc}").to_rpc_status()}
    write_json(root / RESULT_FILE, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
