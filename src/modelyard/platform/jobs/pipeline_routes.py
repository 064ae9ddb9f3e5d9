"""The HTTP routes of Vertex AI's ``pipelineJobs``: create (with ``pipelineJobId``), get, list (the
platform's one list filter), cancel, delete, ``batchDelete`` and ``batchCancel``. Every other verb of the
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
from modelyard.platform.jobs import job_runner, jobs, pipeline_jobs, pipeline_metadata
from modelyard.platform.jobs.job_runner import PENDING
from modelyard.platform.resources import models
from modelyard.platform.resources.tracking_routes import read_body

log = logging.getLogger(__name__)
COLLECTION = "pipelineJobs"
# The SDK's own check of a pipeline job id (pipeline_jobs._VALID_NAME_PATTERN).
_JOB_ID = re.compile(r"^[a-z][-a-z0-9]{0,127}$")
MAX_BATCH = 32  # Vertex's limit on names per batchDelete / batchCancel


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def create(p, route: Route, body: dict, job_id: str | None) -> dict:
    """``jobs.create`` with the client's ``pipelineJobId`` (ALREADY_EXISTS when taken) or a new id."""
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
            page = await jobs.list_(p, route, request.query)
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


def register(app: web.Application, p) -> None:
    """Add the pipelineJobs routes (before the app's catch-all /v1/ route) and the job kind."""
    job_runner.MODULES.setdefault(COLLECTION, "modelyard.platform.jobs.pipeline_jobs")
    token = p.config.auth_token

    async def handle(request: web.Request) -> web.Response:
        m = request.match_info
        try:
            check_bearer(token, request.headers.get("Authorization"),
                         bearer.project_of(f"projects/{m['project']}/locations/{m['location']}"))
            models.ENUM_INTS.set("enum-encoding=int" in request.query.get("$alt", ""))
            return _json(await dispatch(p, m["project"], m["location"], m.get("tail", ""), request))
        except ApiError as exc:
            return _json(exc.to_body(), exc.http_status)
        except Exception as exc:  # a bug: answered in Google's format, logged, the platform keeps serving
            log.exception("request %s %s failed", request.method, request.path)
            err = ApiError("INTERNAL", f"internal error: {type(exc).__name__}: {exc}")
            return _json(err.to_body(), err.http_status)

    base = "/v1/projects/{project}/locations/{location}/" + COLLECTION
    app.router.add_route("*", base, handle)
    app.router.add_route("*", base + "{tail:[:/].*}", handle)
