"""Vertex AI ``Endpoint`` resources: create, get, list, patch (traffic split), delete, and the
``deployModel`` / ``undeployModel`` operations that start and drain replicas."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from modelyard.platform.resources import models, pools
from modelyard.platform.api import list_filter, names
from modelyard.platform.dataplane import traffic
from modelyard.platform.api.errors import ApiError, invalid, not_found
from modelyard.platform.api.names import Route
from modelyard.platform.resources.operations import EMPTY, current_operation, typed
from modelyard.platform.api.timefmt import rfc3339


async def create(p, route: Route, body: dict, endpoint_id: str | None) -> dict:
    """The endpoint and its (done) operation in one transaction, written off the event loop (predicts
    go on meanwhile); then routing learns this one endpoint: the cost does not grow with their number."""
    display_name = body.get("displayName")
    if not isinstance(display_name, str) or not display_name.strip():
        raise invalid("Endpoint.display_name is required.")
    if endpoint_id is not None:
        endpoint_id = names.parse_resource(endpoint_id, "endpoints")[0]
    now = time.time()
    row = {"id": endpoint_id or names.new_id(), "parent": route.parent, "display_name": display_name,
           "description": body.get("description") or "", "labels": body.get("labels") or {},
           "traffic_split": {}, "created": now, "updated": now}
    op = p.ops.new_done(route.parent, "endpoints", row["id"], "CreateEndpointOperationMetadata",
                        typed("Endpoint", render(p, row, [])))
    await p.store.off_loop(p.store.add_endpoint, row, op)  # ALREADY_EXISTS if the chosen id is taken
    p.routing.put_endpoint(row, [])
    return p.ops.render(op)


def get(p, route: Route) -> dict:
    return render(p, _get_in(p, route))


async def list_(p, route: Route, query) -> dict:
    """``GET endpoints``: one page, filtered (endpoint, display_name, labels, create_time, update_time)
    and ordered by the store, off the event loop."""
    request = list_filter.list_request(query, list_filter.ENDPOINT_FIELDS, list_filter.ORDERABLE, "Endpoint",
                                       route.parent)
    return await asyncio.to_thread(_endpoints_page, p, route.parent, request)


def _endpoints_page(p, parent: str, request: list_filter.ListRequest) -> dict:
    rows, token = p.store.endpoints_page(parent, request)
    by_endpoint: dict[str, list[dict]] = {}
    for dm in p.store.deployed_models(endpoint_ids=[e["id"] for e in rows]):
        by_endpoint.setdefault(dm["endpoint_id"], []).append(dm)
    out: dict = {"endpoints": [render(p, e, by_endpoint.get(e["id"], [])) for e in rows]} if rows else {}
    if token:
        out["nextPageToken"] = token
    return out


def patch(p, route: Route, body: dict, update_mask: str | None) -> dict:
    """``PATCH endpoints/{id}``: display name, description, labels and the traffic split."""
    row = _get_in(p, route)
    fields = [f.strip() for f in update_mask.split(",")] if update_mask else list(body)
    changes = {}
    for f in fields:
        key = {"traffic_split": "trafficSplit", "display_name": "displayName"}.get(f, f)
        if key == "trafficSplit":
            ids = {dm["id"] for dm in p.store.deployed_models(row["id"])}
            changes["traffic_split"] = traffic.validate(body.get("trafficSplit") or {}, ids)
        elif key == "displayName":
            if not body.get("displayName"):
                raise invalid("Endpoint.display_name cannot be empty.")
            changes["display_name"] = body["displayName"]
        elif key in ("description", "labels"):
            changes[key] = body.get(key) or ("" if key == "description" else {})
        elif key not in ("name", "etag", "deployedModels", "createTime", "updateTime"):
            raise invalid(f"update_mask names {f!r}, which cannot be updated here.")
    p.store.update_endpoint(row["id"], changes)
    p.routing.load_endpoint(p.store, row["id"])
    return render(p, p.store.get_endpoint(row["id"]))


def delete(p, route: Route) -> dict:
    _get_in(p, route)
    p.store.delete_endpoint(route.resource_id)
    p.routing.load_endpoint(p.store, route.resource_id)
    return p.ops.done(route.parent, "endpoints", route.resource_id, "DeleteOperationMetadata", {"@type": EMPTY})


def deploy(p, route: Route, body: dict) -> dict:
    """Checks everything first (nothing is created on a bad request), then starts the replicas in an
    operation; the deployed model and the new split are committed together once they serve."""
    endpoint = _get_in(p, route)
    spec = body.get("deployedModel")
    if not isinstance(spec, dict):
        raise invalid("DeployModelRequest.deployed_model is required.")
    model, version = models.check_deployable(p, spec.get("model"), route.parent)
    shared = spec.get("sharedResources") or spec.get("shared_resources")
    pool_id = pools.check_deploy(p, route.parent, shared, spec, version) if shared else None
    resources = spec.get("dedicatedResources") or spec.get("automaticResources") or {}
    min_r = int(resources.get("minReplicaCount") or 1)
    max_r = int(resources.get("maxReplicaCount") or min_r)
    if min_r < 1 or max_r < min_r:
        raise invalid(f"replica counts must satisfy 1 <= min_replica_count ({min_r}) <= max_replica_count ({max_r}).")
    if max_r > p.config.max_replicas:
        raise invalid(f"max_replica_count {max_r} exceeds this platform's limit of {p.config.max_replicas}.")
    dm_id = names.new_id()
    existing = {dm["id"] for dm in p.store.deployed_models(endpoint["id"])}
    # modelyard's extension to DeployModelRequest: deploy as a shadow that gets a mirrored copy of
    # this percentage of the endpoint's served requests, and never answers clients itself.
    shadow = body.get("shadowTrafficPercentage", 0)
    if isinstance(shadow, bool) or not isinstance(shadow, int) or not 0 <= shadow <= 100:
        raise invalid(f"shadowTrafficPercentage must be an integer between 0 and 100, got {shadow!r}.")

    def new_split(current: dict, ids: set[str]) -> dict[str, int]:
        if shadow and not body.get("trafficSplit"):
            return dict(current)  # a shadow leaves the split as it is
        return traffic.for_deploy(current, body.get("trafficSplit"), dm_id, ids)

    split = new_split(endpoint["traffic_split"] or {}, existing)
    if shadow and split.get(dm_id):
        raise invalid("a shadow deployment takes no traffic itself: give it no share in traffic_split.")
    machine = (spec.get("dedicatedResources") or {}).get("machineSpec", {}).get("machineType", "")
    dm = {"id": dm_id, "endpoint_id": endpoint["id"], "model_id": model["id"], "version_id": version["version_id"],
          "display_name": spec.get("displayName") or model["display_name"], "min_replicas": min_r,
          "max_replicas": max_r, "machine_type": machine, "created": time.time(), "shadow_percent": shadow,
          "pool_id": pool_id}

    async def work() -> dict:
        if pool_id:  # the pool's replicas serve it: they are told, not started
            try:
                await pools.start_serving(p, pool_id, dm_id, version)
            except BaseException:
                pools.stop_serving(p, pool_id, dm_id)
                raise
            rows = []
        else:
            rows = await p.supervisor.start_replicas(dm_id, Path(version["local_path"]), min_r)
        response = typed("DeployModelResponse", {"deployedModel": _render_dm(p, endpoint["parent"], dm)})
        op = current_operation()
        try:
            current = p.store.get_endpoint(endpoint["id"])  # the split may have changed meanwhile
            ids = {d["id"] for d in p.store.deployed_models(endpoint["id"])}
            split = new_split(current["traffic_split"] or {}, ids)
            # The operation ends done in the deploy's own commit: a kill after it finds both written.
            p.store.add_deployed_model(dm, split, operation=(op.id, response))
            op.committed = True
        except Exception:  # refused, or the store failed (disk full): no replica runs for it
            for row in rows:
                await p.supervisor.discard(row)
            if pool_id:
                pools.stop_serving(p, pool_id, dm_id)
            raise
        p.routing.load_endpoint(p.store, endpoint["id"])
        for row in rows:
            p.routing.add_replica(dm_id, row)
            p.supervisor.started(row)
        return response

    return p.ops.start(route.parent, "endpoints", endpoint["id"], "DeployModelOperationMetadata", work)


def undeploy(p, route: Route, body: dict) -> dict:
    """The split changes first (no new request reaches the model), then its replicas drain and stop."""
    endpoint = _get_in(p, route)
    dm_id = body.get("deployedModelId")
    if not isinstance(dm_id, str) or not dm_id:
        raise invalid("UndeployModelRequest.deployed_model_id is required.")
    rows = {dm["id"]: dm for dm in p.store.deployed_models(endpoint["id"])}
    existing = set(rows)
    if dm_id not in existing:
        raise ApiError("NOT_FOUND", f"Deployed model {dm_id} is not deployed on endpoint {endpoint['id']}.")
    pool_id = rows[dm_id].get("pool_id")
    split = traffic.for_undeploy(endpoint["traffic_split"] or {}, body.get("trafficSplit"), dm_id, existing)
    leaving = p.routing.deployed.get(dm_id)
    p.store.remove_deployed_model(endpoint["id"], dm_id, split)
    p.routing.load_endpoint(p.store, endpoint["id"])

    async def work() -> dict:
        if pool_id:  # its replicas are the pool's: they only drop the model
            pools.stop_serving(p, pool_id, dm_id)
            return typed("UndeployModelResponse", {})
        if leaving is not None:
            await p.supervisor.retire_all(list(leaving.replicas))
        for row in p.store.replicas(dm_id):  # replicas the routing never saw (e.g. still starting)
            await p.engine.stop(row)
            p.store.remove_replica(row["id"])
        return typed("UndeployModelResponse", {})

    return p.ops.start(route.parent, "endpoints", endpoint["id"], "UndeployModelOperationMetadata", work)


def _get_in(p, route: Route) -> dict:
    row = p.store.get_endpoint(route.resource_id)
    if row["parent"] != route.parent:
        raise not_found("Endpoint", route.resource_id)
    return row


def _render_dm(p, parent: str, dm: dict) -> dict:
    if dm.get("pool_id"):
        return pools.render_deployed(parent, dm)
    out = {
        "id": dm["id"],
        "model": names.model_name(parent, dm["model_id"]),
        "modelVersionId": dm["version_id"],
        "displayName": dm["display_name"],
        "createTime": rfc3339(dm["created"]),
    }
    counts = {"minReplicaCount": dm["min_replicas"], "maxReplicaCount": dm["max_replicas"]}
    if dm["machine_type"]:
        out["dedicatedResources"] = {"machineSpec": {"machineType": dm["machine_type"]}, **counts}
    else:
        out["automaticResources"] = counts
    return out


def render(p, row: dict, deployed: list[dict] | None = None) -> dict:
    """An Endpoint resource; ``deployed``: its deployed models' rows if read already (a list page)."""
    out = {
        "name": names.endpoint_name(row["parent"], row["id"]),
        "displayName": row["display_name"],
        "description": row["description"],
        "labels": row["labels"] or {},
        "createTime": rfc3339(row["created"]),
        "updateTime": rfc3339(row["updated"]),
        "etag": f'"{int(row["updated"] * 1e6)}"',
    }
    if deployed is None:
        deployed = p.store.deployed_models(row["id"])
    dms = [_render_dm(p, row["parent"], dm) for dm in deployed]
    if dms:
        out["deployedModels"] = dms
    if row["traffic_split"]:
        out["trafficSplit"] = row["traffic_split"]
    return out
