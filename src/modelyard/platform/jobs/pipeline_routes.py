"""The HTTP routes of Vertex AI's ``pipelineJobs``: create (with ``pipelineJobId``), get, list (the
platform's one list filter, and ``schedule_name``), cancel, delete, ``batchDelete`` and ``batchCancel``; and
of its ``schedules`` (``pipeline_schedules``: create, get, list, patch, delete, pause, resume), whose
scheduler starts runs through this module's ``create``, as a client's ``POST`` does. Every other verb of the
job API is the one code path of ``jobs``; this module adds what a pipeline job has of its own (a chosen
id) and registers the kind with the job runner. ``register`` adds the routes to the platform's app
ahead of its catch-all ``/v1/`` route and answers failures in Google's error format.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time

import orjson
from aiohttp import web

from modelyard.platform.api import bearer, names
from modelyard.platform.api.errors import ApiError, check_bearer, invalid
from modelyard.platform.api.names import Route
from modelyard.platform.api import list_filter
from modelyard.platform.jobs import job_runner, jobs, pipeline_jobs, pipeline_metadata, pipeline_schedules
from modelyard.platform.jobs.job_runner import CANCELLING, PENDING, RUNNING
from modelyard.platform.resources import models
from modelyard.platform.resources.tracking_routes import read_body

log = logging.getLogger(__name__)
COLLECTION = "pipelineJobs"
# The SDK's own check of a pipeline job id (pipeline_jobs._VALID_NAME_PATTERN).
_JOB_ID = re.compile(r"^[a-z][-a-z0-9]{0,127}$")
MAX_BATCH = 32  # Vertex's limit on names per batchDelete / batchCancel


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def create(p, route: Route, body: dict, job_id: str | None, schedule: str | None = None) -> dict:
    """``jobs.create`` with the client's ``pipelineJobId`` (ALREADY_EXISTS when taken) or a new id;
    ``schedule``: the name of the schedule starting it (its ``scheduleName``, output only)."""
    body = {k: v for k, v in body.items() if k != "scheduleName"}
    if schedule is not None:
        body["scheduleName"] = schedule
    if job_id is not None and not _JOB_ID.match(job_id):
        raise invalid(f"Invalid pipeline_job_id {job_id!r}: 1 to 128 characters of [a-z0-9-], starting with a letter.")
    display_name = body.get("displayName") or (job_id or "pipeline-job")
    labels = body.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise invalid("labels must be a map of strings.")
    if not isinstance(display_name, str):
        raise invalid("PipelineJob.display_name must be a string.")
    spec, result = await pipeline_jobs.validate(p, route, body)
    job_id = job_id or names.new_id()
    try:
        p.store.get_job(job_id)
    except ApiError:
        pass
    else:
        raise ApiError("ALREADY_EXISTS", f"PipelineJob {route.parent}/{COLLECTION}/{job_id} already exists.")
    now = time.time()
    row = {"id": job_id, "kind": COLLECTION, "parent": route.parent, "display_name": display_name,
           "state": PENDING, "spec": spec, "result": result, "error": None, "labels": labels,
           "work_dir": str(p.jobs.work_dir(job_id)), "pid": None, "runs": 0, "created": now, "started": None,
           "ended": None, "updated": now}
    # The run's ML Metadata context exists from its creation on, in the answer too: the SDK's
    # submit(experiment=...) reads it from the run and gives up once the run is done, which a short
    # pipeline here can be before the SDK's first poll.
    run_ctx, pipeline_ctx = pipeline_metadata.run_context(p.store.engine, row)
    row["result"] = {**result, "jobDetail": {"pipelineRunContext": run_ctx, "pipelineContext": pipeline_ctx}}
    p.store.add_job(row)
    p.jobs.wake()
    return jobs.render(row)


def _camel(path: str) -> list[str]:
    return [re.sub(r"_([a-z])", lambda m: m.group(1).upper(), part) for part in path.strip().split(".")]


def _masked(job: dict, mask: str) -> dict:
    """A pipeline job with only the fields of a ``read_mask`` (snake_case or camelCase paths, ``a.b``)."""
    out: dict = {}
    for path in filter(None, (p.strip() for p in mask.split(","))):
        parts = _camel(path)
        src, dst = job, out
        for part in parts[:-1]:
            if not isinstance(src.get(part), dict):
                break
            src, dst = src[part], dst.setdefault(part, {})
        else:
            if parts[-1] in src:
                dst[parts[-1]] = src[parts[-1]]
    return out


_SCHEDULE_FILTER = re.compile(r'\b(?:schedule_name|scheduleName)\s*=\s*("[^"]*"|\S+)')


def _schedule_filter(text: str | None) -> str | None:
    """The list filter with ``schedule_name=NAME`` (the SDK's ``PipelineJobSchedule.list_jobs``) as the label
    its runs carry, so the platform's one filter (and its pages) serves it."""
    if not text:
        return text

    def label(m: re.Match) -> str:
        name = m.group(1).strip('"')
        return f'labels.{pipeline_schedules.LABEL}="{name.rsplit("/", 1)[-1]}"'
    return _SCHEDULE_FILTER.sub(label, text)


def _batch_names(route: Route, body: dict) -> list[str]:
    given = body.get("names")
    if not isinstance(given, list) or not given or len(given) > MAX_BATCH:
        raise invalid(f"names must list 1 to {MAX_BATCH} pipeline jobs.")
    out = []
    for n in given:
        if not isinstance(n, str) or not n.startswith(f"{route.parent}/{COLLECTION}/"):
            raise invalid(f"names: {n!r} is not a pipeline job of {route.parent}.")
        out.append(n.rsplit("/", 1)[-1])
    return out


async def dispatch(p, project: str, location: str, tail: str, request: web.Request) -> dict:
    resource, _, verb = tail.lstrip("/").partition(":")
    verb = verb or None
    route = Route(project, location, COLLECTION, resource or None, verb=verb)
    method = request.method
    if not resource:
        if verb is None and method == "POST":
            return await create(p, route, await read_body(request), request.query.get("pipelineJobId"))
        if verb is None and method == "GET":
            query = dict(request.query)
            if query.get("filter"):
                query["filter"] = _schedule_filter(query["filter"])
            page = await jobs.list_(p, route, query)
            mask = request.query.get("readMask") or request.query.get("read_mask")
            if mask and page.get(COLLECTION):  # the SDK's list(enable_simple_view=True): the fields it names
                page[COLLECTION] = [_masked(j, mask) for j in page[COLLECTION]]
            return page
        if verb in ("batchDelete", "batchCancel") and method == "POST":
            ids = _batch_names(route, await read_body(request))
            rows = [jobs._get_in(p, Route(project, location, COLLECTION, i)) for i in ids]  # all exist, or nothing done
            if verb == "batchCancel":
                for i in ids:
                    jobs.cancel(p, Route(project, location, COLLECTION, i))
                return p.ops.done(route.parent, None, None, "BatchCancelPipelineJobsOperationMetadata",
                                  {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.BatchCancelPipelineJobsResponse",
                                   "pipelineJobs": [jobs.get(p, Route(project, location, COLLECTION, i)) for i in ids]})
            for i in ids:
                jobs.delete(p, Route(project, location, COLLECTION, i))
            return p.ops.done(route.parent, None, None, "DeleteOperationMetadata",
                              {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.BatchDeletePipelineJobsResponse",
                               "pipelineJobs": [jobs.render(r) for r in rows]})
    elif verb is None and method == "GET":
        return await asyncio.to_thread(pipeline_jobs.with_current_context, p, jobs.get(p, route))
    elif verb is None and method == "DELETE":
        return jobs.delete(p, route)
    elif verb == "cancel" and method == "POST":
        return jobs.cancel(p, route)
    raise ApiError("NOT_FOUND", f"No API for {method} {request.path}.")


async def dispatch_schedules(p, schedules: pipeline_schedules.Schedules, project: str, location: str, tail: str,
                             request: web.Request) -> dict:
    resource, _, verb = tail.lstrip("/").partition(":")
    route = Route(project, location, pipeline_schedules.COLLECTION, resource or None, verb=verb or None)
    method = request.method
    if not resource and not verb:
        if method == "POST":
            return await schedules.create(route, await read_body(request))
        if method == "GET":
            return await asyncio.to_thread(schedules.list, route, request.query)
    elif resource and not verb:
        if method == "GET":
            return await asyncio.to_thread(schedules.get, route)
        if method == "PATCH":
            mask = request.query.get("updateMask") or request.query.get("update_mask")
            return await schedules.patch(route, await read_body(request), mask)
        if method == "DELETE":
            await asyncio.to_thread(schedules.delete, route)
            return p.ops.done(route.parent, None, None, "DeleteOperationMetadata",
                              {"@type": "type.googleapis.com/google.protobuf.Empty"})
    elif resource and verb == "pause" and method == "POST":
        return await asyncio.to_thread(schedules.pause, route)
    elif resource and verb == "resume" and method == "POST":
        body = await read_body(request) if request.can_read_body else {}
        catch_up = body.get("catchUp", body.get("catch_up", False))
        if not isinstance(catch_up, bool):
            raise invalid("catch_up must be a boolean.")
        return await asyncio.to_thread(schedules.resume, route, catch_up)
    raise ApiError("NOT_FOUND", f"No API for {method} {request.path}.")


def _scheduler(p) -> tuple[pipeline_schedules.Schedules, pipeline_schedules.Scheduler]:
    """The schedules' API and their scheduler, which starts runs as ``create`` does for a client."""
    engine = p.store.engine

    async def validate(route: Route, job: dict) -> None:
        await pipeline_jobs.validate(p, Route(route.project, route.location, COLLECTION), job)

    async def start_run(parent: str, run_id: str, job: dict, schedule: str) -> str:
        project, location = _parent(parent)
        made = await create(p, Route(project, location, COLLECTION), job, run_id, schedule=schedule)
        return made["name"]

    async def active_runs(parent: str, schedule_id: str) -> int:
        request = list_filter.list_request({"filter": f'labels.{pipeline_schedules.LABEL}="{schedule_id}"'},
                                           jobs.JOB_FIELDS, list_filter.ORDERABLE, "pipelineJob")
        rows, _ = await asyncio.to_thread(p.store.jobs_page, parent, COLLECTION, request)
        return sum(1 for r in rows if r["state"] in (PENDING, RUNNING, CANCELLING))

    scheduler = pipeline_schedules.Scheduler(engine, start_run, active_runs)
    return pipeline_schedules.Schedules(engine, validate, scheduler.wake), scheduler


def _parent(parent: str) -> tuple[str, str]:
    parts = parent.split("/")  # projects/P/locations/L
    return parts[1], parts[3]


def register(app: web.Application, p) -> None:
    """Add the pipelineJobs and schedules routes (before the app's catch-all /v1/ route), the job kind, and
    the scheduler (a task of the platform's loop while it runs)."""
    job_runner.MODULES.setdefault(COLLECTION, "modelyard.platform.jobs.pipeline_jobs")
    token = p.config.auth_token
    schedules, scheduler = _scheduler(p)

    async def handle(request: web.Request) -> web.Response:
        m = request.match_info
        try:
            check_bearer(token, request.headers.get("Authorization"),
                         bearer.project_of(f"projects/{m['project']}/locations/{m['location']}"))
            models.ENUM_INTS.set("enum-encoding=int" in request.query.get("$alt", ""))
            if m["collection"] == pipeline_schedules.COLLECTION:
                return _json(await dispatch_schedules(p, schedules, m["project"], m["location"], m.get("tail", ""),
                                                      request))
            return _json(await dispatch(p, m["project"], m["location"], m.get("tail", ""), request))
        except ApiError as exc:
            return _json(exc.to_body(), exc.http_status)
        except Exception as exc:  # a bug: answered in Google's format, logged, the platform keeps serving
            log.exception("request %s %s failed", request.method, request.path)
            err = ApiError("INTERNAL", f"internal error: {type(exc).__name__}: {exc}")
            return _json(err.to_body(), err.http_status)

    base = "/v1/projects/{project}/locations/{location}/{collection:%s|%s}" % (COLLECTION, pipeline_schedules.COLLECTION)
    app.router.add_route("*", base, handle)
    app.router.add_route("*", base + "{tail:[:/].*}", handle)

    def leading() -> bool:
        supervisor = getattr(p, "supervisor", None)
        return supervisor is not None and bool(supervisor.leader)

    async def start(_app) -> None:
        app["pipeline_scheduler"] = asyncio.get_running_loop().create_task(scheduler.run_forever(leading))

    async def stop(_app) -> None:
        task = app.get("pipeline_scheduler")
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
