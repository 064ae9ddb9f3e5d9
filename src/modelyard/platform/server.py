"""The platform's HTTP API (aiohttp): Vertex AI v1 REST paths dispatched to the resource modules,
the gateway's predict routes, the token check, and the one mapping of errors to HTTP responses."""
from __future__ import annotations

import asyncio
import logging

import orjson
from aiohttp import web

from modelyard.objstore import StorageError
from modelyard.platform.resources import endpoints, models, pools, projects, studies, tracking_routes
from modelyard.platform.api import bearer, fields, names
from modelyard.platform.jobs import jobs, pipeline_routes
from modelyard.platform import shutdown
from modelyard.platform.app import Platform
from modelyard.platform.api.errors import ApiError, check_bearer
from modelyard.platform.dataplane.gateway import PIN_HEADER

log = logging.getLogger(__name__)

_PREDICT_VERBS = ("predict", "rawPredict")


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(exc: ApiError) -> web.Response:
    return _json(exc.to_body(), exc.http_status)


async def _body(request: web.Request, message: str) -> dict:
    """The request's JSON object, checked as the Vertex message ``message`` (``fields.check_body``).
    The front server has bounded its size already; a request sent to this app's port directly is
    bounded here too, as it arrives."""
    limit = request.app["max_request_bytes"]
    if (request.content_length or 0) > limit:
        raise fields.too_large(request.content_length, limit, "--max-request-bytes")
    raw = bytearray()
    async for chunk in request.content.iter_any():
        raw += chunk
        if len(raw) > limit:
            raise fields.too_large(None, limit, "--max-request-bytes")
    if not raw:
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError("INVALID_ARGUMENT", "Invalid JSON payload received: expected an object.")
    fields.check_body(doc, message)
    return doc


def build_app(p: Platform) -> web.Application:
    token = p.config.auth_token

    def check_token(request: web.Request) -> None:
        # A job's own token is taken under its project's paths only (the rule: errors.check_bearer).
        check_bearer(token, request.headers.get("Authorization"), bearer.project_of(request.match_info.get("tail", "")))

    async def handle(request: web.Request) -> web.Response:
        try:
            if studies.is_vizier_path(request.match_info["tail"]):  # Vizier: studies, trials, their operations
                check_token(request)
                return _json(await studies.dispatch(p, request.match_info["tail"], request.method,
                                                    lambda message: _body(request, message), request.query,
                                                    lambda route, query: jobs.dispatch(p, route, "GET", None, query)))
            route = names.parse_path(request.match_info["tail"])
            if route.verb in _PREDICT_VERBS and route.collection == "endpoints" and route.resource_id:
                if p.config.auth_predict:
                    check_token(request)
                if request.method != "POST":
                    raise ApiError("NOT_FOUND", f"{route.verb} takes POST")
                status, data, headers = await p.gateway.predict(
                    route.resource_id, route.parent, await request.read(),
                    request.headers.get(PIN_HEADER), route.verb == "rawPredict")
                return web.Response(body=data, status=status, headers=headers, content_type="application/json")
            check_token(request)
            models.ENUM_INTS.set("enum-encoding=int" in request.query.get("$alt", ""))
            answer = await dispatch(p, route, request)
            if p.dataplane is not None:  # what this answer says (deployed, undeployed ...) holds for predicts too
                await p.dataplane.synced()
            return _json(answer)
        except ApiError as exc:
            return _error(exc)
        except StorageError as exc:  # a gs:// / s3:// URI a request named: its status, in Google's format
            return _error(ApiError(exc.status, exc.message))
        except Exception as exc:  # a bug: answered in Google's format, logged, the platform keeps serving
            log.exception("request %s %s failed", request.method, request.path)
            return _error(ApiError("INTERNAL", f"internal error: {type(exc).__name__}: {exc}"))

    async def list_replicas(request: web.Request) -> web.Response:
        """modelyard's own view (not a Vertex API): every replica, for operators and tests."""
        try:
            check_token(request)
        except ApiError as exc:
            return _error(exc)
        if p.dataplane is not None:  # in-flight and served counts as the data plane has them now
            await p.dataplane.fresh()
        out = [{"id": r.id, "deployedModelId": d.id, "endpointId": d.endpoint_id, "pid": r.row["pid"],
                "port": r.row["port"], "host": r.row["host"], "inFlight": r.outstanding, "served": r.served,
                "shadowTrafficPercentage": d.shadow_percent,
                "state": r.state}
               for d in p.routing.deployed.values() for r in d.replicas]
        return _json({"replicas": out})

    async def not_found(request: web.Request) -> web.Response:
        return _error(ApiError("NOT_FOUND", f"No API at {request.path}: Vertex AI paths start with /v1/projects/"))

    app = web.Application(client_max_size=p.config.max_predict_bytes)
    app["max_request_bytes"] = p.config.max_request_bytes
    tracking_routes.register(app, p)  # ML Metadata and TensorBoard (metadataStores/..., tensorboards/...)
    pipeline_routes.register(app, p)  # Vertex AI Pipelines (pipelineJobs/...)
    app.router.add_route("*", "/v1/{tail:.*}", handle)
    # The SDK's REST operations client polls operations under /ui/ (the console's prefix) first.
    app.router.add_route("*", "/ui/{tail:.*}", handle)
    async def job_logs(request: web.Request) -> web.Response:
        """modelyard's own view (Vertex keeps logs in Cloud Logging): a job's log, for `modelyard jobs logs`."""
        try:
            check_token(request)
            return web.Response(text=jobs.logs(p, names.parse_resource(request.match_info["id"], "jobs")[0]),
                                content_type="text/plain", charset="utf-8")
        except ApiError as exc:
            return _error(exc)

    async def stop_platform(request: web.Request) -> web.Response:
        """`modelyard platform stop`: its jobs cancelled, its replicas stopped, then the platform exits."""
        try:
            check_token(request)
            if request.content_type != "application/json":  # a cross-site page cannot send it without a preflight
                raise ApiError("INVALID_ARGUMENT", "stop takes a JSON body ({}), as `modelyard platform stop` sends")
            if not p.supervisor.leader:
                raise ApiError("FAILED_PRECONDITION", "this platform does not supervise the store's replicas and "
                               "jobs: stop the one that does (the first started on this store)")
        except ApiError as exc:
            return _error(exc)
        stopped = await shutdown.stop_everything(p)
        if getattr(p, "exit", None) is not None:  # after this answer is sent
            asyncio.get_running_loop().call_later(0.2, p.exit)
        return _json(stopped)

    async def get_project(request: web.Request) -> web.Response:
        """Cloud Resource Manager's projects.get (v3): the SDK asks it a project's number."""
        try:
            check_bearer(token, request.headers.get("Authorization"), request.match_info["project"])
            return _json(projects.get(f"projects/{request.match_info['project']}"))
        except ApiError as exc:
            return _error(exc)

    app.router.add_get("/v3/projects/{project}", get_project)
    app.router.add_get("/modelyard/v1/replicas", list_replicas)
    app.router.add_post(shutdown.STOP_PATH, stop_platform)
    app.router.add_get("/modelyard/v1/jobs/{id}/logs", job_logs)
    async def metrics(request: web.Request) -> web.Response:
        """Prometheus text; with --auth-token it needs the token (it names endpoints and their traffic)."""
        try:
            check_token(request)
        except ApiError as exc:
            return _error(exc)
        if p.dataplane is not None:  # the predicts' counts, from the process that answers them
            await p.dataplane.fresh()
        text = p.metrics.render(p.routing) + (p.pools.render_metrics() if p.pools is not None else "")
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", lambda r: web.Response(text="ok"))
    if p.config.console:  # the browser console at /console, before the catch-all
        from modelyard.web.console.platform_app import register as register_console

        register_console(app, p)
    app.router.add_route("*", "/{tail:.*}", not_found)

    async def on_startup(_app) -> None:
        await p.start()

    async def on_cleanup(_app) -> None:
        await p.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def dispatch(p: Platform, route: names.Route, request: web.Request) -> dict:
    method, verb, coll = request.method, route.verb, route.collection
    if route.operations:
        if method != "GET" or verb:
            raise ApiError("NOT_FOUND", "a list of operations supports GET only")
        return await p.ops.list_(route, request.query)
    if route.operation_id:
        if method != "GET" or verb:
            raise ApiError("NOT_FOUND", "operations support GET only")
        return p.ops.get(route.operation_id)
    if coll == "models":
        if route.resource_id is None:
            if verb == "upload" and method == "POST":
                return await models.upload(p, route, await _body(request, "UploadModelRequest"))
            if verb is None and method == "GET":
                return await models.list_(p, route, request.query)
        elif verb is None and method == "GET":
            return models.get(p, route)
        elif verb is None and method == "PATCH":
            return models.patch(p, route, await _body(request, "Model"), request.query.get("updateMask"))
        elif verb in (None, "deleteVersion") and method == "DELETE":
            return models.delete(p, route)
        elif verb == "listVersions" and method == "GET":
            return models.list_versions(p, route, request.query)
        elif verb == "mergeVersionAliases" and method == "POST":
            return models.merge_version_aliases(p, route, await _body(request, "MergeVersionAliasesRequest"))
    elif coll in names.JOB_COLLECTIONS:
        return await jobs.dispatch(p, route, method, lambda: _body(request, fields.JOB_MESSAGES[coll]), request.query)
    elif coll == "endpoints":
        if route.resource_id is None:
            if verb is None and method == "POST":
                return await endpoints.create(p, route, await _body(request, "Endpoint"),
                                              request.query.get("endpointId"))
            if verb is None and method == "GET":
                return await endpoints.list_(p, route, request.query)
        elif verb is None and method == "GET":
            return endpoints.get(p, route)
        elif verb is None and method == "PATCH":
            return endpoints.patch(p, route, await _body(request, "Endpoint"), request.query.get("updateMask"))
        elif verb is None and method == "DELETE":
            return endpoints.delete(p, route)
        elif verb == "deployModel" and method == "POST":
            return endpoints.deploy(p, route, await _body(request, "DeployModelRequest"))
        elif verb == "undeployModel" and method == "POST":
            return endpoints.undeploy(p, route, await _body(request, "UndeployModelRequest"))
    elif coll == names.POOLS:
        if route.resource_id is None:
            if verb is None and method == "POST":
                return pools.create(p, route, await _body(request, "CreateDeploymentResourcePoolRequest"))
            if verb is None and method == "GET":
                return pools.list_(p, route, request.query)
        elif verb is None and method == "GET":
            return pools.get(p, route)
        elif verb is None and method == "DELETE":
            return pools.delete(p, route)
        elif verb == "queryDeployedModels" and method == "GET":
            return pools.query_deployed_models(p, route)
    raise ApiError("NOT_FOUND", f"No API for {method} {request.path}.")
