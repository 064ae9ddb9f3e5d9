"""``modelyard jobs submit --config study.yaml``: a ``modelyard tune`` study file as a Vertex
``HyperparameterTuningJob`` request, with the files its trial command names shipped along (a Vertex
``HyperparameterTuningJob`` spec file gets its trial files shipped the same way).

The study file runs as it is under ``modelyard tune``: its ``trial.command`` is resolved beside
the file (``python3 train.py``). A platform may run elsewhere, and a job must not change when
``train.py`` is edited after the submit, so the client reads every file the command names by a
relative path under the study's folder and sends them in the request (``modelyardTrialFiles``:
path -> base64). The platform writes them into the job's folder, beside the study file it runs,
where the same relative command finds them. Absolute paths are left as they are (same host).
"""
from __future__ import annotations

import base64
import os
import shlex
from pathlib import Path
from typing import Any

from modelyard.platform.jobs.tuning_jobs import FILES_FIELD

MAX_SHIPPED_BYTES = 8 << 20  # scripts and small configs, not data sets: those belong in storage
# Keys of a study file a HyperparameterTuningJob carries (the rest say how to run locally).
_STUDY_KEYS = {"display_name": "displayName", "study_spec": "studySpec", "max_trial_count": "maxTrialCount",
               "parallel_trial_count": "parallelTrialCount", "max_failed_trial_count": "maxFailedTrialCount"}
_LOCAL_ONLY = {"storage": "the platform keeps each job's study in its own database",
               "seed": "a HyperparameterTuningJob has no seed"}
_TRIAL_KEYS = {"command", "env", "params_as", "workdir"}


class SubmitError(ValueError):
    """The study file cannot be sent as it is; the message says what to change."""


def is_study_file(doc: dict) -> bool:
    """A ``modelyard tune`` study file: a study spec and a ``trial:`` section (no Vertex trial_job_spec)."""
    return "trial" in doc and ("study_spec" in doc or "studySpec" in doc)


def tuning_job(path: Path, doc: dict[str, Any], display_name: str | None) -> dict[str, Any]:
    """The HyperparameterTuningJob request body for the study file at ``path`` (already read as ``doc``)."""
    from modelyard.tuning.spec import SpecError, from_mapping

    try:  # every check `modelyard tune` makes, here, before anything is sent (the script must exist too)
        from_mapping(doc, path, storage=f"sqlite:///{path.parent}/unused.db")
    except SpecError as exc:
        raise SubmitError(f"{path.name}: {exc}") from None
    for key, why in _LOCAL_ONLY.items():
        if key in doc:
            raise SubmitError(f"{path.name}: {key}: not sent to the platform ({why}); remove it to submit, or run "
                              f"`modelyard tune {path}` on this machine")
    trial = doc["trial"]
    extra = sorted(set(trial) - _TRIAL_KEYS)
    if extra:
        raise SubmitError(f"{path.name}: trial.{extra[0]}: a HyperparameterTuningJob has no such field; remove it "
                          f"to submit, or run `modelyard tune {path}` on this machine")
    if trial.get("params_as", "flags") != "flags":
        raise SubmitError(f"{path.name}: trial.params_as: jobs on the platform get their parameters as flags "
                          f"(Vertex's convention); drop params_as: {trial['params_as']}")
    base = path.parent
    if trial.get("workdir"):
        base = (base / str(trial["workdir"])).resolve()
    command = trial["command"]
    command = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    files = _shipped(command, base)
    body: dict[str, Any] = {camel: doc[key] for key, camel in _STUDY_KEYS.items() if key in doc}
    body["displayName"] = display_name or doc.get("display_name") or path.stem
    container: dict[str, Any] = {"imageUri": "modelyard/trial", "command": command}
    if trial.get("env"):
        container["env"] = [{"name": str(k), "value": str(v)} for k, v in trial["env"].items()]
    body["trialJobSpec"] = {"workerPoolSpecs": [{"replicaCount": "1", "machineSpec": {"machineType": "local"},
                                                 "containerSpec": container}]}
    if doc.get("job_dir"):
        job_dir = Path(str(doc["job_dir"]))
        body["trialJobSpec"]["baseOutputDirectory"] = {
            "outputUriPrefix": str(job_dir if job_dir.is_absolute() else (path.parent / job_dir).resolve())}
    if files:
        body[FILES_FIELD] = files
    return body


def ship_trial_files(path: Path, body: dict[str, Any]) -> dict[str, Any]:
    """A Vertex HyperparameterTuningJob spec (camelCase) from the file at ``path``: the files its one
    worker pool's command and args name by relative paths beside the file go with it, as for a study file."""
    pools = [p for p in (body.get("trialJobSpec") or {}).get("workerPoolSpecs") or [] if p]
    container = pools[0].get("containerSpec") if len(pools) == 1 and isinstance(pools[0], dict) else None
    if not isinstance(container, dict) or not isinstance(container.get("command"), list):
        return body  # the platform's own checks say what is wrong
    files = _shipped([str(c) for c in [*container["command"], *(container.get("args") or [])]], path.parent)
    return {**body, FILES_FIELD: files} if files else body


def _shipped(command: list[str], base: Path) -> dict[str, str]:
    """Files named by relative paths in ``command`` that exist under ``base``: relative path -> base64."""
    out: dict[str, str] = {}
    total = 0
    for token in command:
        value = token.split("=", 1)[1] if token.startswith("--") and "=" in token else token
        if not value or os.path.isabs(value) or value.startswith("-"):
            continue
        target = (base / value).resolve()
        if not target.is_file() or base.resolve() not in target.parents:
            continue
        data = target.read_bytes()
        total += len(data)
        if total > MAX_SHIPPED_BYTES:
            raise SubmitError(f"the files the trial command names ({', '.join([*out, value])}) pass "
                              f"{MAX_SHIPPED_BYTES >> 20} MB; put data in storage and read it from the trial")
        out[target.relative_to(base.resolve()).as_posix()] = base64.b64encode(data).decode()
    return out
