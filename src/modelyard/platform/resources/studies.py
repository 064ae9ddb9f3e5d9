"""Vertex AI Vizier's studies (``projects/*/locations/*/studies``) and the dispatch of every Vizier
path (studies, their trials and operations) to this module and ``trials``.

A study is its StudySpec: checked on create by the tuning engine's own parser (the one
``modelyard tune`` uses), stored with enum numbers named (the SDK sends ``enum-encoding=int``) and
the zero values proto3 JSON leaves out put back, and answered as the client sent it otherwise.
Display names are unique per location: creating a study again with the same spec answers the study
(the SDK's ``Study.create_or_load`` over REST; ``vizier_schema.add_study``), with another spec
``ALREADY_EXISTS``. A HyperparameterTuningJob's trials are a study too (its id is the job's),
listed and read here, changed only by the job.
"""
from __future__ import annotations

import re
import time
from typing import Any, Awaitable, Callable, Mapping

from modelyard.platform.api import fields, names
from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.resources import trials
from modelyard.platform.state import vizier_schema as db

_PATH = re.compile(
    r"^projects/(?P<project>[A-Za-z0-9][A-Za-z0-9._-]{0,62})/locations/(?P<location>[A-Za-z0-9][A-Za-z0-9._-]{0,62})"
    r"/studies(?:/(?P<study>[^/:]+))?(?:/trials(?P<trials>)(?:/(?P<trial>[^/:]+))?)?"
    r"(?:/operations/(?P<op>[^/:]+))?(?::(?P<verb>[A-Za-z]+))?$")
_ID = re.compile(r"^[0-9]{1,30}$")

# Enum fields of a StudySpec as numbers (proto3 JSON with enum-encoding=int) -> their names.
_ENUMS = {
    "goal": {0: "GOAL_TYPE_UNSPECIFIED", 1: "MAXIMIZE", 2: "MINIMIZE"},
    "scaleType": {0: "SCALE_TYPE_UNSPECIFIED", 1: "UNIT_LINEAR_SCALE", 2: "UNIT_LOG_SCALE", 3: "UNIT_REVERSE_LOG_SCALE"},
    "algorithm": {0: "ALGORITHM_UNSPECIFIED", 2: "GRID_SEARCH", 3: "RANDOM_SEARCH"},
    "measurementSelectionType": {0: "MEASUREMENT_SELECTION_TYPE_UNSPECIFIED", 1: "LAST_MEASUREMENT",
                                 2: "BEST_MEASUREMENT"},
    "observationNoise": {0: "OBSERVATION_NOISE_UNSPECIFIED", 1: "LOW", 2: "HIGH"},
}


_VIZIER = re.compile(r"^projects/[^/]+/locations/[^/]+/studies(?:[/:]|$)")


def is_vizier_path(tail: str) -> bool:
    """Whether a ``/v1/`` (or ``/ui/``) path names a study, a trial or one of their operations."""
    return _VIZIER.match(tail) is not None


def _named(value: Any, key: str | None = None) -> Any:
    """A StudySpec as proto3 JSON has it -> enum numbers named, omitted zero bounds put back."""
    if isinstance(value, list):
        return [_named(v) for v in value]
    if isinstance(value, dict):
        out = {k: _named(v, k) for k, v in value.items()}
        if key in ("doubleValueSpec", "integerValueSpec", "double_value_spec", "integer_value_spec"):
            for bound in ("minValue", "maxValue"):
                if bound not in out and _snake(bound) not in out:
                    out[bound] = 0
        return out
    if key in _ENUMS and isinstance(value, int) and not isinstance(value, bool):
        return _ENUMS[key].get(value, value)
    return value


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _render(row: dict) -> dict:
    out = {"name": f"{row['parent']}/studies/{row['id']}", "displayName": row["display_name"],
           "studySpec": row["spec"], "state": row["state"], "createTime": rfc3339(row["created"])}
    if row["inactive_reason"]:
        out["inactiveReason"] = row["inactive_reason"]
    return out


def create(p, parent: str, body: dict) -> dict:
    """``body``: a Study its fields checked (``fields.check_body``)."""
    name = body.get("displayName", body.get("display_name"))
    if not name:
        raise invalid("Study.display_name is required.")
    fields.display_name(name, "Study.display_name")
    raw_spec = body.get("studySpec", body.get("study_spec"))
    if not isinstance(raw_spec, dict):
        raise invalid("Study.study_spec is required.")
    spec = _named(raw_spec)
    trials.engine_spec(spec)  # refused here, with the parser's message, before anything is stored
    row = {"id": names.new_id(), "parent": parent, "display_name": name, "spec": spec, "state": "ACTIVE",
           "inactive_reason": "", "created": time.time()}
    return _render(db.add_study(p.store.engine, row))


def _list(p, parent: str, query: Mapping[str, str], job_studies: list[dict]) -> dict:
    """The location's studies, then its tuning jobs' studies."""
    rows = [_render(r) for r in db.list_studies(p.store.engine, parent)] + job_studies
    page, token = _page(rows, query)
    out: dict = {"studies": page}
    if token:
        out["nextPageToken"] = token
    return out


def _page(rows: list, query: Mapping[str, str]) -> tuple[list, str]:
    """Offset paging: ``pageToken`` is the offset a previous page ended at (opaque to clients)."""
    try:
        size = int(query.get("pageSize") or 0) or 100
        start = int(query.get("pageToken") or 0)
    except ValueError:
        raise invalid("pageSize must be a number and pageToken one this API handed out.") from None
    if size < 0 or start < 0:
        raise invalid("pageSize and pageToken must not be negative.")
    end = start + min(size, 1000)
    return rows[start:end], (str(end) if end < len(rows) else "")


def _study_id(value: str | None) -> str:
    if value is None or not _ID.match(value):
        raise invalid(f"Invalid study id {value!r}: ids are decimal numbers.")
    return value


def _trial_id(value: str | None) -> int:
    if value is None or not _ID.match(value):
        raise invalid(f"Invalid trial id {value!r}: trial ids are decimal numbers.")
    return int(value)


# ---- a HyperparameterTuningJob's study: its trials, read-only, as on Vertex ---------------------------------
# Its id is the job's. ``jobs(route, query)`` answers GET on the job collection (platform.jobs renders jobs;
# this layer may not import it, so the server hands it in).
JobReader = Callable[[names.Route, Mapping[str, str]], Awaitable[dict]]
_JOB_STATES = {"JOB_STATE_SUCCEEDED": "COMPLETED", "JOB_STATE_FAILED": "INACTIVE", "JOB_STATE_CANCELLED": "INACTIVE",
               "JOB_STATE_CANCELLING": "INACTIVE", "JOB_STATE_EXPIRED": "INACTIVE"}


def _job_study(parent: str, job: dict) -> dict:
    study_id = job["name"].rsplit("/", 1)[1]
    out = {"name": f"{parent}/studies/{study_id}", "displayName": job.get("displayName", ""),
           "studySpec": job.get("studySpec", {}), "state": _JOB_STATES.get(job.get("state"), "ACTIVE")}
    if job.get("createTime"):
        out["createTime"] = job["createTime"]
    if out["state"] == "INACTIVE":
        out["inactiveReason"] = f"{job['name']} ended {job.get('state')}"
    return out


def _job_trials(study: dict, job: dict) -> list[dict]:
    return [{**t, "name": f"{study['name']}/trials/{t['id']}"} for t in job.get("trials", [])]


async def _job(jobs: JobReader | None, m, study_id: str) -> dict | None:
    if jobs is None:
        return None
    route = names.Route(m["project"], m["location"], "hyperparameterTuningJobs", study_id)
    try:
        return await jobs(route, {})
    except ApiError as exc:
        if exc.status == "NOT_FOUND":
            return None
        raise


async def _job_dispatch(parent: str, job: dict, m, method: str, tail: str) -> dict:
    study = _job_study(parent, job)
    if method != "GET" or m["verb"] is not None:
        raise ApiError("FAILED_PRECONDITION", f"Study {study['name']} is the study of {job['name']}: the job "
                       "runs its trials; it is read-only here.")
    if m["trials"] is None:
        return study
    trials_ = _job_trials(study, job)
    if m["trial"] is None:
        return {"trials": trials_} if trials_ else {}
    found = next((t for t in trials_ if t["id"] == m["trial"]), None)
    if found is None:
        raise ApiError("NOT_FOUND", f"Trial {m['trial']} of study {study['name']} is not found.")
    return found


async def _job_studies(jobs: JobReader | None, m) -> list[dict]:
    if jobs is None:
        return []
    route = names.Route(m["project"], m["location"], "hyperparameterTuningJobs")
    page = await jobs(route, {"pageSize": "1000"})
    parent = f"projects/{m['project']}/locations/{m['location']}"
    return [_job_study(parent, job) for job in page.get("hyperparameterTuningJobs", [])]


async def dispatch(p, tail: str, method: str, body: Callable[[str], Awaitable[dict]], query: Mapping[str, str],
                   jobs: JobReader | None = None) -> dict:
    """Every Vizier REST call (``/v1/`` or the SDK's ``/ui/`` prefix for operations); ``body(message)``
    reads the request's JSON, its fields checked as that Vertex message; ``jobs`` reads tuning jobs,
    whose studies are listed and read here too."""
    m = _PATH.match(tail)
    if m is None:
        raise ApiError("NOT_FOUND", f"No API at /v1/{tail}.")
    parent = f"projects/{m['project']}/locations/{m['location']}"
    verb, engine = m["verb"], p.store.engine
    if m["op"] is not None:
        if method != "GET" or verb:
            raise ApiError("NOT_FOUND", "operations support GET only")
        if not _ID.match(m["op"]):
            raise invalid(f"Invalid operation id {m['op']!r}: ids are decimal numbers.")
        return p.ops.get(m["op"])
    if m["study"] is None:
        if verb is None and method == "POST":
            return create(p, parent, await body("Study"))
        if verb is None and method == "GET":
            return _list(p, parent, query, await _job_studies(jobs, m))
        if verb == "lookup" and method == "POST":
            doc = await body("LookupStudyRequest")
            name = doc.get("displayName", doc.get("display_name"))
            if not name:
                raise invalid("LookupStudyRequest.display_name is required.")
            return _render(db.find_study(engine, parent, name))
        raise ApiError("NOT_FOUND", f"No API for {method} /v1/{tail}.")
    try:
        study = db.get_study(engine, _study_id(m["study"]), parent)
    except ApiError as exc:
        job = await _job(jobs, m, m["study"]) if exc.status == "NOT_FOUND" else None
        if job is None:
            raise
        return await _job_dispatch(parent, job, m, method, tail)
    if m["trials"] is None:
        if verb is None and method == "GET":
            return _render(study)
        if verb is None and method == "DELETE":
            db.delete_study(engine, study["id"])
            return {}
        raise ApiError("NOT_FOUND", f"No API for {method} /v1/{tail}.")
    if m["trial"] is None:
        if verb is None and method == "POST":
            return trials.create(p, study, await body("Trial"))
        if verb is None and method == "GET":
            rows = db.list_trials(engine, study["id"])
            page, token = _page(rows, query)
            out: dict = {"trials": [trials.render(study, r) for r in page]}
            if token:
                out["nextPageToken"] = token
            return out
        if verb == "suggest" and method == "POST":
            return trials.suggest(p, study, await body("SuggestTrialsRequest"))
        if verb == "listOptimalTrials" and method == "POST":
            await body("ListOptimalTrialsRequest")
            return trials.optimal(p, study)
        raise ApiError("NOT_FOUND", f"No API for {method} /v1/{tail}.")
    trial_id = _trial_id(m["trial"])
    if verb is None and method == "GET":
        return trials.render(study, db.get_trial(engine, study["id"], trial_id))
    if verb is None and method == "DELETE":
        db.delete_trial(engine, study["id"], trial_id)
        return {}
    if method == "POST" and verb in trials.VERBS:
        action, message = trials.VERBS[verb]
        return action(p, study, trial_id, await body(message))
    raise ApiError("NOT_FOUND", f"No API for {method} /v1/{tail}.")
