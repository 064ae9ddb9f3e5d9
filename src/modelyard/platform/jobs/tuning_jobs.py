"""Vertex AI ``HyperparameterTuningJob``: the tuning package runs the study; trials are reported back.

The request becomes a study file for ``modelyard tune`` (which reads a HyperparameterTuningJob's
fields itself): the study is checked on create (``SpecError`` -> INVALID_ARGUMENT, nothing made),
and the job's child runs ``modelyard tune STUDY --storage sqlite:///WORK_DIR/study.db``, whose
trials get their parameters as ``--name=value`` flags, as on Vertex. While it runs the child
copies the study's trials (read-only) into ``progress.json``; the resource shows them as Vertex
``Trial``s (``parameters``, ``finalMeasurement``, ``measurements``, ``state``). A gs:// / s3://
base output directory is written locally and published when the study ends. Killed and started
again, the same command resumes the study (finished trials kept).

Where a trial's process runs is the engine's, as for a CustomJob (``custom_jobs.processes_elsewhere``,
the same rule): under ``--engine ray`` each trial is a job of its own (``trial_job``: the trial pool
run by ``custom_jobs.run_pools``, so its replica is placed on a Ray node and supervised, stopped and
failed as a CustomJob's), and the tuner runs that instead of the trial's command (``engine_trials``),
with ``--devices none`` (the cluster's CPUs, not this host's cores, bound how many run at once: a
trial waits for a free node). Its metric files come back while it runs, so measurements, early
stopping, the trials' states and the experiment's runs are the same under either engine; a trial
that failed on a node says why in its ``infeasibleReason`` (``_failure``).

Under the local engine, trials find what a CustomJob's replicas find (job_packages.trial_pool): the
job's own Python first on PATH, and /gcs/ paths rewritten (job_env). A trial pool's ``python_package_spec`` follows
job_packages' rule, as a CustomJob's does: checked on create (a package that cannot be installed is
refused), installed once into the job's own Python before the study starts, and every trial runs
``python -m module`` there.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import json
import subprocess
import sys
import time
from pathlib import Path

from modelyard import objstore
from modelyard.platform.api.errors import invalid
from modelyard.platform.api.names import Route
from modelyard.platform.jobs import custom_jobs, job_env, job_packages, trial_job
from modelyard.platform.resources import metadata_experiments
from modelyard.platform.state.metadata_db import MetadataDB

RESUMABLE = True
PROGRESS_FILE = "progress.json"
STUDY_FILE = "study.json"
TRIAL_FILE = "trial.json"  # what each trial's job is (trial_job), under an engine that runs it elsewhere
FILES_FIELD = "modelyardTrialFiles"  # what `modelyard jobs submit` ships with a study file's trial command
PRIVATE = "_modelyard"

# Enum fields of StudySpec sent as numbers by clients using enum-encoding=int (the SDK does).
_ENUMS = {
    "goal": {0: "GOAL_TYPE_UNSPECIFIED", 1: "MAXIMIZE", 2: "MINIMIZE"},
    "scaleType": {0: "SCALE_TYPE_UNSPECIFIED", 1: "UNIT_LINEAR_SCALE", 2: "UNIT_LOG_SCALE", 3: "UNIT_REVERSE_LOG_SCALE"},
    "algorithm": {0: "ALGORITHM_UNSPECIFIED", 2: "GRID_SEARCH", 3: "RANDOM_SEARCH"},
    "measurementSelectionType": {0: "LAST_MEASUREMENT", 1: "LAST_MEASUREMENT", 2: "BEST_MEASUREMENT"},
}
# google.cloud.aiplatform.v1.Trial.State
TRIAL_STATES = {"STATE_UNSPECIFIED": 0, "REQUESTED": 1, "ACTIVE": 2, "STOPPING": 3, "SUCCEEDED": 4, "INFEASIBLE": 5}


def _from_proto_json(value, key: str | None = None):
    """A StudySpec as proto3 JSON has it -> as the tuning package reads it: enum numbers named, and
    the zero values proto3 JSON leaves out (``minValue: 0``) put back."""
    if isinstance(value, list):
        return [_from_proto_json(v) for v in value]
    if isinstance(value, dict):
        out = {k: _from_proto_json(v, k) for k, v in value.items()}
        if key in ("doubleValueSpec", "integerValueSpec"):
            out.setdefault("minValue", 0)
            out.setdefault("maxValue", 0)
        return out
    if key in _ENUMS and isinstance(value, int) and not isinstance(value, bool):
        return _ENUMS[key].get(value, value)
    return value


def study_mapping(body: dict, name: str, job_dir: str) -> dict:
    """The study file ``modelyard tune`` runs for this job (Vertex's fields, modelyard's study name)."""
    trial_job = body.get("trialJobSpec")
    if not isinstance(trial_job, dict):
        raise invalid("HyperparameterTuningJob.trial_job_spec is required.")
    out = {"display_name": name, "job_dir": job_dir,
           "study_spec": _from_proto_json(body.get("studySpec")),
           "trial_job_spec": {"worker_pool_specs": trial_job.get("workerPoolSpecs")}}
    for field, key in (("maxTrialCount", "max_trial_count"), ("parallelTrialCount", "parallel_trial_count"),
                       ("maxFailedTrialCount", "max_failed_trial_count")):
        if field in body:
            out[key] = body[field]
    return out


def _base_dir(body: dict) -> str | None:
    base = ((body.get("trialJobSpec") or {}).get("baseOutputDirectory") or {}).get("outputUriPrefix")
    if base:
        objstore.scheme_of(base)
    return base or None


async def validate(p, route: Route, body: dict) -> tuple[dict, dict]:
    import tempfile

    from modelyard.tuning.spec import SpecError, from_mapping

    _base_dir(body)
    files = trial_files(body.get(FILES_FIELD))
    trial_job = body.get("trialJobSpec")
    if isinstance(trial_job, dict):  # its buckets and packages, as a CustomJob's (nothing made if refused)
        await asyncio.to_thread(job_env.check_storage, trial_job)
        await asyncio.to_thread(job_packages.check, trial_job, "trial_job_spec")
        if trial_job.get("experiment") or trial_job.get("experimentRun"):  # the trials become the experiment's runs
            if trial_job.get("experimentRun"):
                raise invalid("trial_job_spec.experiment_run cannot be set: each trial is a run of its own "
                              "(name trial_job_spec.experiment only).")
            await asyncio.to_thread(metadata_experiments.experiment, MetadataDB(p.store.engine),
                                    trial_job["experiment"], "trial_job_spec.experiment")
    with tempfile.TemporaryDirectory(prefix="check-", dir=Path(p.config.state_dir)) as probe_dir:
        # The study file anchors relative paths: the shipped files sit beside it, as in the job's folder.
        probe = Path(probe_dir) / STUDY_FILE
        write_trial_files(Path(probe_dir), files)
        try:
            from_mapping(study_mapping(body, "check", str(probe.parent / "output")), probe, f"sqlite:///{probe}.db")
        except SpecError as exc:
            raise invalid(str(exc)) from None
    spec = {k: v for k, v in body.items() if k not in ("displayName", "labels", "name", "state", "trials", FILES_FIELD)}
    if files:
        spec[PRIVATE] = {"trialFiles": body[FILES_FIELD]}  # not shown in the resource
    return spec, {}


def trial_files(raw) -> dict[str, bytes]:
    """``modelyardTrialFiles`` (relative path -> base64, from ``modelyard jobs submit``) decoded and checked."""
    import base64
    import binascii

    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid(f"{FILES_FIELD} must map relative paths to base64 file contents.")
    out = {}
    for name, data in raw.items():
        parts = str(name).replace("\\", "/").split("/")
        if not name or str(name).startswith("/") or ".." in parts or not isinstance(data, str):
            raise invalid(f"{FILES_FIELD}: {name!r} must be a relative path inside the job, without '..', "
                          "mapped to base64 text.")
        try:
            out[str(name)] = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"{FILES_FIELD}: {name!r} is not base64.") from None
    return out


def write_trial_files(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def render(out: dict, enum_ints: bool) -> None:
    if enum_ints:
        for trial in out.get("trials", []):
            trial["state"] = TRIAL_STATES.get(trial["state"], 0)


def progress(work_dir: Path, row: dict) -> dict | None:
    try:
        return json.loads((work_dir / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


# ---- the child side -----------------------------------------------------------------------------
def processes_elsewhere(job: dict) -> bool:
    """For the job's process: its trials run where a CustomJob's replicas run (``trial_job``), each
    served its identity there, so the job's process serves none itself under ``--engine ray``."""
    return custom_jobs.processes_elsewhere(job)


def execute(work_dir: Path, job: dict) -> dict:
    from modelyard.platform.jobs.job_runner import JobFailed, log_tail, write_json

    body = job["spec"]
    base = _base_dir(body)
    remote = bool(base) and bool(objstore.scheme_of(base))
    job_dir = str(work_dir / "output") if remote or not base else objstore.local_path(base)
    name = f"hpt-{job['id']}"
    study = work_dir / STUDY_FILE
    # The files `modelyard jobs submit` shipped, beside the study file: its relative trial command finds them.
    write_trial_files(work_dir, trial_files((body.get(PRIVATE) or {}).get("trialFiles")))
    devices: list[str] = []
    mount = None  # trials on nodes: each node mirrors /gcs/ for its trial and writes it back (jobs_ray)
    if processes_elsewhere(job):
        body = engine_trials(work_dir, job, body)
        devices = ["--devices", "none"]  # the trials' CPUs are the cluster's, not this host's
    else:
        body, mount = _trials_setup(work_dir, body, job.get("storageRoot"))
    write_json(study, study_mapping(body, name, job_dir))
    storage = f"sqlite:///{work_dir / 'study.db'}"
    sys.stdout.flush()
    # Same process group as this child: cancel (SIGTERM to the group) reaches the tuner, whose trials die with it.
    proc = subprocess.Popen([sys.executable, "-m", "modelyard", "tune", str(study), "--storage", storage,
                             *devices, *_experiment_args(body.get("trialJobSpec") or {})],
                            stdout=sys.stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    while proc.poll() is None:
        time.sleep(1.0)
        _write_progress(work_dir, storage, name)
    trials = _write_progress(work_dir, storage, name)
    if mount is not None and mount.publish():
        print("wrote the trials' files under /gcs/ back to their buckets", flush=True)
    if remote:
        n = objstore.publish_tree(Path(job_dir), base)
        print(f"published {n} output file(s) to {base}", flush=True)
    if proc.returncode != 0:
        raise JobFailed(f"modelyard tune exited with code {proc.returncode}: {log_tail(work_dir, 1500)}")
    return {"trials": trials}


def _experiment_args(trial_job: dict) -> list[str]:
    """``modelyard tune``'s flags recording each trial as a run of ``trialJobSpec.experiment`` (checked at create)."""
    name = trial_job.get("experiment")
    if not name:
        return []
    parts = name.split("/")  # projects/{p}/locations/{l}/metadataStores/default/contexts/{experiment}
    return ["--experiment", parts[-1], "--project", parts[1], "--location", parts[3]]


def engine_trials(work_dir: Path, job: dict, body: dict) -> dict:
    """The job's body with its trial pool replaced by ``trial_job``'s command: each trial a job of its own
    under the platform's engine (``TRIAL_FILE`` says which pool, engine and shipped files). ``-u``: its
    lines reach the trial's log as they come; and the tuner forks no warm TensorFlow server for it (only
    a plain ``python -m``/script command starts warm), which a trial on a node would not use."""
    from modelyard.platform.jobs.job_runner import write_json

    trial_job_spec = body.get("trialJobSpec") or {}
    pools = [p for p in trial_job_spec.get("workerPoolSpecs") or [] if isinstance(p, dict) and p]
    spec = {"pool": pools[0], "engine": job.get("engine"), "jobId": job["id"], "project": job["parent"].split("/")[1],
            "storageRoot": job.get("storageRoot"), "files": (body.get(PRIVATE) or {}).get("trialFiles") or {}}
    write_json(work_dir / TRIAL_FILE, spec)
    command = [sys.executable, "-u", "-m", trial_job.__name__, str(work_dir / TRIAL_FILE)]
    pool = {"replicaCount": "1", "containerSpec": {"imageUri": (pools[0].get("containerSpec") or {}).get("imageUri", ""),
                                                   "command": command}}
    return {**body, "trialJobSpec": {**trial_job_spec, "workerPoolSpecs": [pool]}}


def _trials_setup(work_dir: Path, body: dict, storage_root: str | None):
    """The job's body with each trial pool made the container pool its trials run
    (job_packages.trial_pool: the job's own Python, with a python_package_spec's packages installed
    once for every trial, and /gcs/ paths rewritten), and the job's /gcs/ mount."""
    trial_job = body.get("trialJobSpec") or {}
    mount = job_env.GcsMount(work_dir, storage_root)
    mount.stage_in(job_env.pool_strings(trial_job))
    uris = [u for _, spec in job_packages.package_pools(trial_job) for u in spec["packageUris"]]
    python = job_packages.install(work_dir, uris, mount)
    pools = [job_packages.trial_pool(p, python, mount) if isinstance(p, dict) and p else p
             for p in trial_job.get("workerPoolSpecs") or []]
    return {**body, "trialJobSpec": {**trial_job, "workerPoolSpecs": pools}}, mount


def _write_progress(work_dir: Path, storage: str, name: str) -> list[dict]:
    from modelyard.platform.jobs.job_runner import write_json

    try:
        trials = read_trials(storage, name)
    except Exception as exc:  # the tuner may be mid-write; the next read will do
        print(f"(could not read the study's trials yet: {exc})", flush=True)
        return []
    write_json(work_dir / PROGRESS_FILE, {"trials": trials})
    return trials


def read_trials(storage_url: str, name: str) -> list[dict]:
    """The study's trials as Vertex ``Trial`` JSON, read without writing the database."""
    import optuna
    from optuna.trial import TrialState

    from modelyard.tuning.report import curve
    from modelyard.tuning.study import retried_numbers

    storage = optuna.storages.RDBStorage(storage_url, skip_compatibility_check=True, skip_table_creation=True)
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return []
    metric_ids = storage.get_study_user_attrs(study_id).get("spec", {}).get("metrics", [])
    trials = storage.get_all_trials(study_id, deepcopy=False)
    skip = retried_numbers(trials)
    states = {TrialState.COMPLETE: "SUCCEEDED", TrialState.PRUNED: "SUCCEEDED", TrialState.FAIL: "INFEASIBLE",
              TrialState.RUNNING: "ACTIVE", TrialState.WAITING: "REQUESTED"}
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        if t.number in skip:
            continue
        series = curve(t)
        first = metric_ids[0][0] if metric_ids else "objective"
        trial = {"id": str(t.number + 1), "state": states.get(t.state, "STATE_UNSPECIFIED"),
                 "parameters": [{"parameterId": k, "value": v}
                                for k, v in (t.user_attrs.get("params") or t.params).items()],
                 "measurements": [{"stepCount": str(step), "metrics": [{"metricId": first, "value": series[step]}]}
                                  for step in sorted(series)]}
        if t.state == TrialState.COMPLETE and t.values:
            step = max(series) if series else 0
            trial["finalMeasurement"] = {"stepCount": str(step), "metrics": [
                {"metricId": m[0] if m else f"metric{i}", "value": v}
                for i, (m, v) in enumerate(zip(metric_ids or [None] * len(t.values), t.values))]}
        elif t.state == TrialState.PRUNED and series:  # stopped early: its last measurement is final, as on Vertex
            step = max(series)
            trial["finalMeasurement"] = {"stepCount": str(step), "metrics": [{"metricId": first, "value": series[step]}]}
        if t.state == TrialState.FAIL:
            trial["infeasibleReason"] = _failure(t.user_attrs)
        if t.datetime_start:
            trial["startTime"] = _time(t.datetime_start)
        if t.datetime_complete:
            trial["endTime"] = _time(t.datetime_complete)
        out.append(trial)
    return out


def _failure(attrs: dict) -> str:
    """Why a trial failed: the tuner's word (``exit code 1``), and for a trial run as a job
    (``trial_job``) that job's own error (a node gone, its replica's last lines), as a CustomJob's."""
    reason = str(attrs.get("error", "the trial failed"))
    lines = [ln for ln in str(attrs.get("log_tail") or "").splitlines() if ln.startswith(trial_job.FAILED_PREFIX)]
    if lines:
        reason += f": {lines[-1][len(trial_job.FAILED_PREFIX):]}"
    return reason


def _time(value: _dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.astimezone()  # optuna stores local naive times
    return value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
