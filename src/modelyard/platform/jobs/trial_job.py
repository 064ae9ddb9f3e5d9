"""A HyperparameterTuningJob's trial run as a job: ``python -u -m modelyard.platform.jobs.trial_job TRIAL_JSON [--name=value ...]``.

When the platform's engine runs a job's processes elsewhere (``custom_jobs.processes_elsewhere``:
``--engine ray``), the tuner (``modelyard tune``, in the tuning job's process) starts this as each
trial's command instead of the trial pool's own (``tuning_jobs.engine_trials``). It runs the trial
pool as a one-replica job through ``custom_jobs.run_pools``, the one place that decides where a job's
processes run, so a trial is placed, supervised and stopped as a CustomJob's replica is: on a Ray
node, its output in the trial's log, SIGTERM (the tuner stopping it: pruned, cancelled) stopping it
on its node, a node that dies failing it with the node's name.

What the tuner gave the trial travels with it: the parameter flags (this command's arguments), and
Vertex's trial variables (``TRIAL_VARS``: ``CLOUD_ML_TRIAL_ID``, ``CLOUD_ML_HP_METRIC_FILE``,
``AIP_MODEL_DIR`` ...) whose paths are the trial's directory on the platform's host; that directory is
the job's local base output directory, so the node writes it in a scratch directory of its own,
its metric files come back as they change (``jobs_ray.live_files``) and the rest when it ends.

``TRIAL_JSON`` (written by ``tuning_jobs.execute``): ``{"pool": the trial pool as the request gave
it, "engine", "jobId", "project", "storageRoot", "files": {relative path: base64}}``.
"""
from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

# What the tuner sets for a trial (tuning.runner.trial_env): each goes to the trial's node.
TRIAL_VARS = ("CLOUD_ML_TRIAL_ID", "CLOUD_ML_HP_METRIC_FILE", "CLOUD_ML_HP_METRIC_TAG", "AIP_MODEL_DIR",
              "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR", "MODELYARD_JOB_DIR", "MODELYARD_TRIAL_ID",
              "MODELYARD_STUDY", "MODELYARD_TRIAL_PARAMS")
FAILED_PREFIX = "[modelyard] the trial's job failed: "  # its last line when it fails (tuning_jobs reads it)
MAX_REASON = 4000
# Fields of a trial pool's job spec that are the study's, not each trial's (the tuner records the trials).
_STUDY_ONLY = ("experiment", "experimentRun", "tensorboard")


def job_spec(pool: dict, trial_env: dict[str, str], job_dir: str) -> dict:
    """The one-pool CustomJobSpec of a trial: ``pool`` with the trial's variables added to its env,
    and the trial's directory as its (local) base output directory."""
    spec = dict(pool.get("pythonPackageSpec") or pool.get("containerSpec") or {})
    env = [e for e in spec.get("env") or [] if isinstance(e, dict) and e.get("name") not in trial_env]
    spec["env"] = env + [{"name": k, "value": v} for k, v in trial_env.items()]
    key = "pythonPackageSpec" if pool.get("pythonPackageSpec") else "containerSpec"
    one = {**{k: v for k, v in pool.items() if k not in _STUDY_ONLY}, key: spec, "replicaCount": "1"}
    return {"workerPoolSpecs": [one], "baseOutputDirectory": {"outputUriPrefix": job_dir}}


def main(argv: list[str]) -> int:
    from modelyard.platform.jobs import custom_jobs
    from modelyard.platform.jobs.job_runner import JobFailed

    trial = json.loads(Path(argv[0]).read_text())
    # Out of this process's environment: jobs_ray sends a replica only what differs from it (node_env).
    trial_env = {k: os.environ.pop(k) for k in TRIAL_VARS if k in os.environ}
    pool = trial["pool"]
    for e in (pool.get("pythonPackageSpec") or pool.get("containerSpec") or {}).get("env") or []:
        if isinstance(e, dict) and e.get("name") not in (None, "PATH"):  # PATH: this process finds commands by it
            os.environ.pop(e["name"], None)  # the pool's own env, which the tuner set here too
    job_dir = trial_env.get("MODELYARD_JOB_DIR") or os.getcwd()
    spec = job_spec(pool, trial_env, job_dir)
    files = {name: base64.b64decode(data) for name, data in (trial.get("files") or {}).items()}
    job_id = f"{trial['jobId']}-trial-{trial_env.get('CLOUD_ML_TRIAL_ID', '0')}"  # its actors' names
    try:
        custom_jobs.run_pools(spec, Path(job_dir), job_id, extra_args=list(argv[1:]), engine=trial.get("engine"),
                              project=trial.get("project", "local"), storage_root=trial.get("storageRoot"),
                              node_files=files)
    except JobFailed as exc:  # on one line: the tuner keeps the last lines of the trial's log
        print(FAILED_PREFIX + " / ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())[:MAX_REASON],
              flush=True)
        return 143 if exc.status == "CANCELLED" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
