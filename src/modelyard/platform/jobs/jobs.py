"""Vertex AI job resources over REST, one code path for every kind: create, get, list, cancel, delete.

A kind (``batch_jobs``, ``custom_jobs``, ``tuning_jobs``) checks a create request with
``validate(p, route, body) -> spec`` (an ``ApiError`` creates nothing) and may render extra fields.
The stored ``spec`` holds the resource's input fields as the client sent them, plus private
``_modelyard`` context for the job's process; ``result`` holds the output fields the job reports
(``outputInfo``, ``completionStats``, ``trials`` ...). States follow ``JobState``.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path

from modelyard.platform.api import list_filter, names
from modelyard.platform.api.errors import ApiError, invalid, not_found
from modelyard.platform.jobs.job_runner import kind_module, CANCELLED, CANCELLING, LOG_FILE, PENDING, RUNNING, TERMINAL
from modelyard.platform.resources.models import ENUM_INTS
from modelyard.platform.api.names import Route
from modelyard.platform.resources.operations import EMPTY
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.state.store import DiskFull

# google.cloud.aiplatform.v1.JobState numbers, for clients asking $alt=json;enum-encoding=int.
JOB_STATES = {"JOB_STATE_UNSPECIFIED": 0, "JOB_STATE_QUEUED": 1, "JOB_STATE_PENDING": 2, "JOB_STATE_RUNNING": 3,
              "JOB_STATE_SUCCEEDED": 4, "JOB_STATE_FAILED": 5, "JOB_STATE_CANCELLING": 6,
              "JOB_STATE_CANCELLED": 7, "JOB_STATE_PAUSED": 8, "JOB_STATE_EXPIRED": 9}
log = logging.getLogger(__name__)

PRIVATE = "_modelyard"
_CANCELLED = ApiError("CANCELLED", "CANCELED").to_rpc_status()
# A job list's ``state`` filter: JobState names; a training pipeline's PipelineState names too (its
# states are stored as jobs').
_STATE_NAMES = {**{name: name for name in JOB_STATES},
                **{name.replace("JOB_STATE_", "PIPELINE_STATE_"): name for name in JOB_STATES}}
JOB_FIELDS = list_filter.job_fields(_STATE_NAMES)


def _kind(p, route: Route):
    return kind_module(route.collection)


def job_name(row: dict) -> str:
    return f"{row['parent']}/{row['kind']}/{row['id']}"


async def create(p, route: Route, body: dict, job_id: str | None = None) -> dict:
    """A job of the route's kind, PENDING; ``job_id`` lets a caller that records the id first (a pipeline
    task) find its job again after a restart."""
    display_name = body.get("displayName")
    if not isinstance(display_name, str) or not display_name.strip():
        raise invalid(f"{route.collection[:-1]}.display_name is required.")
    labels = body.get("labels") or {}
    if not isinstance(labels, dict):
        raise invalid("labels must be a map of strings.")
    spec, result = await _kind(p, route).validate(p, route, body)
    job_id = job_id or names.new_id()
    now = time.time()
    row = {"id": job_id, "kind": route.collection, "parent": route.parent, "display_name": display_name,
           "state": PENDING, "spec": spec, "result": result, "error": None, "labels": labels,
           "work_dir": str(p.jobs.work_dir(job_id)), "pid": None, "runs": 0, "created": now, "started": None,
           "ended": None, "updated": now}
    p.store.add_job(row)
    p.jobs.wake()
    return render(row)


def get(p, route: Route) -> dict:
    return render(_get_in(p, route))


async def list_(p, route: Route, query) -> dict:
    """One page of a kind's jobs, filtered (display_name, state, labels, create_time, update_time; AND,
    OR, NOT) and ordered by the store, off the event loop."""
    request = list_filter.list_request(query, JOB_FIELDS, list_filter.ORDERABLE, route.collection[:-1],
                                       f"{route.parent}/{route.collection}")
    rows, token = await asyncio.to_thread(p.store.jobs_page, route.parent, route.collection, request)
    out: dict = {route.collection: [render(r) for r in rows]} if rows else {}
    if token:
        out["nextPageToken"] = token
    return out


def follow_to_cancelled(p, row: dict, kind: str) -> dict:
    """A pipeline kind's cancel (it runs no process of its own): CANCELLING, which its ``follow`` turns
    into CANCELLED once what it started has ended; FAILED_PRECONDITION, in its PIPELINE_STATE_ words,
    when the run is over already."""
    if p.store.update_job(row["id"], (PENDING, RUNNING), state=CANCELLING):
        p.jobs.wake()
        return {}
    row = p.store.get_job(row["id"])
    if row["state"] == CANCELLING:
        return {}
    raise ApiError("FAILED_PRECONDITION", f"{kind} {job_name(row)} is in state "
                   f"{row['state'].replace('JOB_STATE_', 'PIPELINE_STATE_')} and cannot be cancelled.")


def cancel(p, route: Route) -> dict:
    """Never waits for the disk: a running job is signalled first (``JobRunner.cancel_now``), then its
    CANCELLING state written; if the store cannot take that (its disk full past its reserve), the runner
    holds the cancel in memory and records the end as soon as it can."""
    row = _get_in(p, route)
    hook = getattr(_kind(p, route), "cancel", None)  # a kind that cancels through another job
    if hook is not None:
        return hook(p, route, row)
    if row["state"] == RUNNING:
        p.jobs.cancel_now(row)  # the kill first: the writes below may find the disk full
    try:
        if row["state"] == PENDING and p.store.update_job(row["id"], (PENDING,), state=CANCELLED,
                                                          ended=time.time(), error=_CANCELLED):
            return {}
        if row["state"] == RUNNING and p.store.update_job(row["id"], (RUNNING,), state=CANCELLING):
            return {}
    except DiskFull as exc:  # cancelled anyway; the runner records it when the store takes it
        log.error("job %s: cancelled; %s", row["id"], exc.message)
        p.jobs.cancel_now(row)
        return {}
    row = _get_in(p, route)
    if row["state"] == CANCELLING:
        return {}
    raise ApiError("FAILED_PRECONDITION", f"Job {job_name(row)} is in state {row['state']} and cannot be cancelled.")


def delete(p, route: Route) -> dict:
    """Only a finished job (or one whose end the runner could not record yet: the store's disk full);
    if the store's disk is full past its reserve, the job's work dir (its staging and logs, deleted with
    it anyway) goes first to make room, then its row."""
    row = _get_in(p, route)
    states = TERMINAL + ((row["state"],) if p.jobs.ended(row["id"]) else ())
    try:
        deleted = p.store.delete_job(row["id"], states)
    except DiskFull:
        if row["state"] not in states:
            raise
        shutil.rmtree(row["work_dir"], ignore_errors=True)
        deleted = p.store.delete_job(row["id"], states)
    if deleted:
        p.jobs.forget(row["id"])
    if not deleted:
        raise ApiError("FAILED_PRECONDITION", f"Job {job_name(row)} is in state {row['state']}: only a finished job "
                       "can be deleted; cancel it first.")
    shutil.rmtree(row["work_dir"], ignore_errors=True)  # the job's staging and logs; its outputs stay
    return p.ops.done(route.parent, route.collection, row["id"], "DeleteOperationMetadata", {"@type": EMPTY})


def logs(p, job_id: str) -> str:
    row = p.store.get_job(job_id)
    backing = (row["spec"].get(PRIVATE) or {}).get("backing")
    if backing:  # a training pipeline: its custom job's log
        row = p.store.get_job(backing)
    try:
        return (Path(row["work_dir"]) / LOG_FILE).read_text(errors="replace")
    except OSError:
        return ""


def render(row: dict) -> dict:
    """The Vertex resource: the submitted fields, the reported ones, and the common job fields."""
    out = {"name": job_name(row), "displayName": row["display_name"]}
    out.update({k: v for k, v in row["spec"].items() if not k.startswith("_")})
    out.update({k: v for k, v in (row["result"] or {}).items() if not k.startswith("_")})
    out["state"] = JOB_STATES[row["state"]] if ENUM_INTS.get() else row["state"]
    out["createTime"] = rfc3339(row["created"])
    out["updateTime"] = rfc3339(row["updated"])
    if row["started"] is not None:
        out["startTime"] = rfc3339(row["started"])
    if row["ended"] is not None:
        out["endTime"] = rfc3339(row["ended"])
    if row["error"]:
        out["error"] = row["error"]
    out["labels"] = row["labels"] or {}
    hook = getattr(kind_module(row["kind"]), "render", None)  # a kind's own enums (e.g. Trial.State)
    if hook is not None:
        hook(out, ENUM_INTS.get())
    return out


def _get_in(p, route: Route) -> dict:
    row = p.store.get_job(route.resource_id, route.collection)
    if row["parent"] != route.parent:
        raise not_found("Job", route.resource_id)
    return row


async def dispatch(p, route: Route, method: str, body, query) -> dict:
    """The job routes of one collection; ``body`` is an awaitable factory of the request's JSON."""
    verb = route.verb
    if route.resource_id is None:
        if verb is None and method == "POST":
            return await create(p, route, await body())
        if verb is None and method == "GET":
            return await list_(p, route, query)
    elif verb is None and method == "GET":
        return get(p, route)
    elif verb is None and method == "DELETE":
        return delete(p, route)
    elif verb == "cancel" and method == "POST":
        return cancel(p, route)
    raise ApiError("NOT_FOUND", f"No API for {method} {route.collection} {verb or ''}".strip() + ".")

