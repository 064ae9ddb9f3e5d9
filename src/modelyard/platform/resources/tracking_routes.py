"""The HTTP routes of ML Metadata (``metadataStores/...``) and of the TensorBoard API
(``tensorboards/...``): each request checked (token, body size, fields), dispatched to its
resource module, and its failure answered in Google's error format. ``register`` adds them to
the platform's app ahead of its catch-all ``/v1/`` route."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Mapping

import orjson
from aiohttp import web

from modelyard.platform.api import bearer, fields, tracking_pages
from modelyard.platform.api.errors import ApiError, check_bearer
from modelyard.platform.api.tracking_names import TrackingRoute, parse_tracking_path
from modelyard.platform.resources import (metadata_lineage as lineage, metadata_nodes as nodes,
                                          metadata_schemas as schemas, metadata_store as stores,
                                          tensorboards as tb)
from modelyard.platform.state.metadata_db import MetadataDB
from modelyard.platform.state.tensorboard_db import TensorboardDB

log = logging.getLogger(__name__)
EMPTY = "type.googleapis.com/google.protobuf.Empty"


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def read_body(request: web.Request) -> dict:
    """The request's JSON object, bounded by the platform's --max-request-bytes as it arrives."""
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
    return doc


class Tracking:
    """ML Metadata and TensorBoard over the platform's store; ``ops`` records their operations."""

    def __init__(self, engine, ops) -> None:
        self.md = MetadataDB(engine)
        self.tb = TensorboardDB(engine)
        self.ops = ops

    def _done(self, route: TrackingRoute, metadata_type: str, response: dict) -> dict:
        return self.ops.done(route.parent, None, None, metadata_type, response)

    def _deleted(self, route: TrackingRoute) -> dict:
        return self._done(route, "DeleteOperationMetadata", {"@type": EMPTY})

    def dispatch(self, route: TrackingRoute, request: Call, body: dict) -> dict:
        """Runs in a worker thread (the store's calls block): ``request`` holds what it needs of the HTTP
        request, ``body`` its JSON object, read before."""
        if route.ids[0][0] == "metadataStores":
            return self._metadata(route, request, body)
        return self._tensorboard(route, request, body)

    def _metadata(self, route: TrackingRoute, request: Call, body: dict) -> dict:
        method, verb, q = request.method, route.verb, request.query
        store_id = route.ids[0][1]
        if store_id is None:
            if len(route.ids) == 1 and verb is None and method == "POST":
                row = stores.create(self.md, route.parent, body, q.get("metadataStoreId"))
                return self._done(route, "CreateMetadataStoreOperationMetadata",
                                  {"@type": f"{OPS_TYPE}MetadataStore", **row})
            if len(route.ids) == 1 and verb is None and method == "GET":
                return stores.list_(self.md, route.parent, q)
            raise _no_api(request)
        store = stores.resolve(self.md, route.parent, store_id)
        if len(route.ids) == 1:
            if verb is None and method == "GET":
                return stores.render(self.md.get_store(store))
            if verb is None and method == "DELETE":
                self.md.delete_store(store)
                return self._deleted(route)
            raise _no_api(request)
        kind, rid = route.ids[1]
        if kind == "metadataSchemas":
            if rid is None and method == "POST" and verb is None:
                return schemas.create(self.md, store, body, q.get("metadataSchemaId"))
            if rid is None and method == "GET" and verb is None:
                if q.get("filter"):  # refused rather than ignored: a caller would take the whole list as matching
                    raise ApiError("INVALID_ARGUMENT", "metadataSchemas.list takes no filter here: list them all.")
                rows = schemas.all_rows(self.md, store)
                chunk, token = tracking_pages.page(rows, q, f"{store}/metadataSchemas")
                out = {"metadataSchemas": [schemas.render(r) for r in chunk]}
                return {**out, "nextPageToken": token} if token else out
            if rid is not None and method == "GET" and verb is None:
                return schemas.get(self.md, store, rid)
            raise _no_api(request)
        if rid is None:
            if verb is None and method == "POST":
                return nodes.create(self.md, store, kind, body, q.get(f"{nodes.MESSAGE[kind].lower()}Id"))
            if verb is None and method == "GET":
                return nodes.list_(self.md, store, kind, q)
            if verb == "purge" and method == "POST":
                response = nodes.purge(self.md, store, kind, body)
                return self._done(route, f"Purge{nodes.MESSAGE[kind]}sMetadata",
                                  {"@type": f"{OPS_TYPE}Purge{nodes.MESSAGE[kind]}sResponse", **response})
            raise _no_api(request)
        if verb is None:
            if method == "GET":
                return nodes.get(self.md, store, kind, rid)
            if method == "PATCH":
                return nodes.patch(self.md, store, kind, rid, body, q.get("updateMask"),
                                   q.get("allowMissing", "").lower() == "true")
            if method == "DELETE":
                nodes.delete(self.md, store, kind, rid, q.get("force", "").lower() == "true")
                return self._deleted(route)
        elif kind == "executions" and verb == "addExecutionEvents" and method == "POST":
            return lineage.add_execution_events(self.md, store, rid, body)
        elif kind == "executions" and verb == "queryExecutionInputsAndOutputs" and method == "GET":
            return lineage.execution_io(self.md, store, rid)
        elif kind == "contexts" and verb == "addContextArtifactsAndExecutions" and method == "POST":
            return lineage.add_context_members(self.md, store, rid, body)
        elif kind == "contexts" and verb in ("addContextChildren", "removeContextChildren") and method == "POST":
            return lineage.add_context_children(self.md, store, rid, body, verb == "removeContextChildren")
        elif kind == "contexts" and verb == "queryContextLineageSubgraph" and method == "GET":
            return lineage.context_lineage(self.md, store, rid)
        elif kind == "artifacts" and verb == "queryArtifactLineageSubgraph" and method == "GET":
            return lineage.artifact_lineage(self.md, store, rid, q.get("maxHops"), q.get("filter"))
        raise _no_api(request)

    def _tensorboard(self, route: TrackingRoute, request: Call, body: dict) -> dict:
        method, verb, q = request.method, route.verb, request.query
        level, rid = route.leaf, route.leaf_id
        if rid is None:
            if verb is None and method == "POST":
                rendered, _name = tb.create(self.tb, route, body, q)
                if level == "tensorboards":
                    return self._done(route, "CreateTensorboardOperationMetadata",
                                      {"@type": f"{OPS_TYPE}Tensorboard", **rendered})
                return rendered
            if verb is None and method == "GET":
                return tb.list_(self.tb, route, q)
            if verb == "batchCreate" and level == "runs" and method == "POST":
                return tb.batch_create(self.tb, route, body)
            raise _no_api(request)
        if verb is None:
            if method == "GET":
                return tb.get(self.tb, route)
            if method == "PATCH":
                rendered = tb.patch(self.tb, route, body, q.get("updateMask"))
                if level == "tensorboards":
                    return self._done(route, "UpdateTensorboardOperationMetadata",
                                      {"@type": f"{OPS_TYPE}Tensorboard", **rendered})
                return rendered
            if method == "DELETE":
                tb.delete(self.tb, route)
                return self._deleted(route)
        elif verb == "write" and level in ("runs", "experiments") and method == "POST":
            return (tb.write_run if level == "runs" else tb.write_experiment)(self.tb, route, body)
        elif verb == "batchCreate" and level == "experiments" and method == "POST":
            return tb.batch_create(self.tb, route, body)
        elif verb == "batchRead" and level == "tensorboards" and method == "GET":
            return tb.batch_read(self.tb, route, request.query.getall("timeSeries", [])
                                 or request.query.getall("time_series", []))
        elif verb == "read" and level == "timeSeries" and method == "GET":
            return tb.read(self.tb, route, q)
        elif verb == "exportTensorboardTimeSeries" and level == "timeSeries" and method == "POST":
            return tb.export(self.tb, route, body)
        raise _no_api(request)


OPS_TYPE = "type.googleapis.com/google.cloud.aiplatform.v1."


@dataclass(frozen=True)
class Call:
    """What the resource code reads of an HTTP request (handed to a worker thread)."""
    method: str
    path: str
    query: Mapping[str, str]


def _no_api(request: Call) -> ApiError:
    return ApiError("NOT_FOUND", f"No API for {request.method} {request.path}.")


def register(app: web.Application, platform) -> Tracking:
    """Adds the routes to ``app`` (before its catch-all); ``platform`` is the running ``Platform``
    (its store's engine, its operations, its ``--auth-token``)."""
    tracking = Tracking(platform.store.engine, platform.ops)
    token = platform.config.auth_token

    async def handle(request: web.Request) -> web.Response:
        try:
            check_bearer(token, request.headers.get("Authorization"), bearer.project_of(request.match_info["tail"]))
            route = parse_tracking_path(request.match_info["tail"])
            body = await read_body(request) if request.method in ("POST", "PATCH") else {}
            call = Call(request.method, request.path, request.query)
            # The store's calls block: in a worker thread, so the platform's loop (its gateway) never waits on them.
            return _json(await asyncio.to_thread(tracking.dispatch, route, call, body))
        except ApiError as exc:
            return _json(exc.to_body(), exc.http_status)
        except Exception as exc:  # a bug: answered in Google's format, logged, the platform keeps serving
            log.exception("request %s %s failed", request.method, request.path)
            err = ApiError("INTERNAL", f"internal error: {type(exc).__name__}: {exc}")
            return _json(err.to_body(), err.http_status)

    for collection in ("metadataStores", "tensorboards"):
        app.router.add_route("*", "/v1/{tail:projects/[^/]+/locations/[^/]+/" + collection + "(?:[/:].*)?}", handle)
    return tracking
