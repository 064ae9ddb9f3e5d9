"""Vertex AI ``DeploymentResourcePool`` resources: create (an operation that ends once the pool's
replicas run), get, list, delete (refused while a model is deployed into the pool), and
``queryDeployedModels``; and the parts of ``deployModel`` / ``undeployModel`` that differ for a model
deployed into a pool (``DeployedModel.sharedResources``): its replicas are the pool's.

Beyond Vertex: ``modelMemoryBudgetBytes`` on the pool (docs/pools.md), what the models each replica keeps
loaded may weigh at most (each the larger of its files' bytes and the memory its load was measured to add,
``serving/manager/on_demand.py``); models are loaded on their first request and the least recently used
unloaded to make room. A model whose files alone exceed the budget is refused at deploy.
"""
from __future__ import annotations

import time
from pathlib import Path

from modelyard.model.footprint import footprint_bytes
from modelyard.platform.api import names
from modelyard.platform.api.errors import ApiError, invalid, not_found
from modelyard.platform.api.names import Route
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.resources.operations import EMPTY, typed
from modelyard.platform.state import pool_db

MAX_PAGE_SIZE = 100


def _pools(p):
    if p.pools is None:
        raise ApiError("FAILED_PRECONDITION", "deployment resource pools run on the local replica engine only; "
                       "this platform runs replicas on Ray (--engine ray)")
    return p.pools


def _int(value, what: str, default: int) -> int:
    if value is None or value == "":
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).lstrip("-").isdigit():
        raise invalid(f"{what} must be an integer, got {value!r}.")
    return int(value)


def create(p, route: Route, body: dict) -> dict:
    """``POST deploymentResourcePools``: checked, stored, then its replicas started in the operation."""
    pools = _pools(p)
    pool_id = names.check_pool_id(body.get("deploymentResourcePoolId") or body.get("deployment_resource_pool_id"))
    spec = body.get("deploymentResourcePool", body.get("deployment_resource_pool"))
    if not isinstance(spec, dict):
        raise invalid("CreateDeploymentResourcePoolRequest.deployment_resource_pool is required.")
    resources = spec.get("dedicatedResources", spec.get("dedicated_resources"))
    if not isinstance(resources, dict):
        raise invalid("DeploymentResourcePool.dedicated_resources is required.")
    min_r = _int(resources.get("minReplicaCount"), "dedicated_resources.min_replica_count", 1)
    max_r = _int(resources.get("maxReplicaCount"), "dedicated_resources.max_replica_count", 0) or min_r
    if min_r < 1 or max_r < min_r:
        raise invalid(f"replica counts must satisfy 1 <= min_replica_count ({min_r}) <= max_replica_count ({max_r}).")
    if max_r > p.config.max_replicas:
        raise invalid(f"max_replica_count {max_r} exceeds this platform's limit of {p.config.max_replicas}.")
    budget = _int(spec.get("modelMemoryBudgetBytes"), "modelMemoryBudgetBytes", 0)
    if budget < 0:
        raise invalid(f"modelMemoryBudgetBytes must be 0 (no budget) or positive, got {budget}.")
    machine = (resources.get("machineSpec") or {}).get("machineType", "")
    row = {"id": pool_id, "parent": route.parent, "min_replicas": min_r, "max_replicas": max_r,
           "machine_type": machine, "budget_bytes": budget, "created": time.time()}
    pool_db.add_pool(p.store, row)  # ALREADY_EXISTS for a taken id, before any operation

    async def work() -> dict:
        try:
            await pools.create(row)
        except BaseException:
            await pools.delete(pool_id)
            try:
                pool_db.delete_pool(p.store, pool_id)
            except ApiError:
                pass
            raise
        return typed("DeploymentResourcePool", render(row))

    return p.ops.start(route.parent, names.POOLS, pool_id, "CreateDeploymentResourcePoolOperationMetadata", work)


def get(p, route: Route) -> dict:
    return render(_get_in(p, route))


def list_(p, route: Route, query) -> dict:
    """``GET deploymentResourcePools``: one page (``pageSize``, ``pageToken``), oldest first."""
    if query.get("filter") or query.get("orderBy"):
        raise invalid("deploymentResourcePools.list takes no filter nor order_by here.")
    size = _int(query.get("pageSize"), "page_size", MAX_PAGE_SIZE)
    size = MAX_PAGE_SIZE if size <= 0 else min(size, MAX_PAGE_SIZE)
    offset = _int(query.get("pageToken"), "page_token", 0)
    rows = pool_db.list_pools(p.store, route.parent)
    page = rows[offset:offset + size]
    out: dict = {"deploymentResourcePools": [render(r) for r in page]} if page else {}
    if offset + size < len(rows):
        out["nextPageToken"] = str(offset + size)
    return out


def delete(p, route: Route) -> dict:
    """FAILED_PRECONDITION while a model is deployed into the pool; else the row goes at once (no new
    deploy can name it) and its replicas stop in the operation."""
    _get_in(p, route)
    pools = _pools(p)
    pool_db.delete_pool(p.store, route.resource_id)

    async def work() -> dict:
        await pools.delete(route.resource_id)
        return {"@type": EMPTY}

    return p.ops.start(route.parent, names.POOLS, route.resource_id, "DeleteOperationMetadata", work)


def query_deployed_models(p, route: Route) -> dict:
    """``:queryDeployedModels``: the pool's deployed models, a reference to each, and the counts."""
    _get_in(p, route)
    dms = pool_db.pool_models(p.store, route.resource_id)
    out: dict = {"totalDeployedModelCount": len(dms), "totalEndpointCount": len({d["endpoint_id"] for d in dms})}
    if dms:
        out["deployedModels"] = [render_deployed(route.parent, d) for d in dms]
        out["deployedModelRefs"] = [{"endpoint": names.endpoint_name(route.parent, d["endpoint_id"]),
                                     "deployedModelId": d["id"]} for d in dms]
    return out


# ---- deploying into a pool (called by endpoints.deploy / undeploy) ------------------------------------
def check_deploy(p, parent: str, ref: object, spec: dict, version: dict) -> str:
    """The pool a DeployedModel's ``sharedResources`` names, checked: it exists under ``parent``, the
    deployed model asks for no resources of its own, and the model fits the pool's budget."""
    pool_id = names.parse_resource(ref, names.POOLS)[0] if isinstance(ref, str) and ref else None
    if pool_id is None:
        raise invalid("DeployedModel.shared_resources must name a DeploymentResourcePool.")
    row = pool_db.get_pool(p.store, pool_id)
    if row["parent"] != parent:
        raise not_found("DeploymentResourcePool", pool_id)
    if spec.get("dedicatedResources") or spec.get("automaticResources"):
        raise invalid("a DeployedModel with shared_resources takes its pool's replicas: give no dedicated_resources "
                      "or automatic_resources.")
    _pools(p)
    size = footprint_bytes(version["local_path"])
    if row["budget_bytes"] and size > row["budget_bytes"]:
        raise ApiError("FAILED_PRECONDITION", f"model version {version['model_id']}@{version['version_id']} needs "
                       f"{size} bytes of files, more than the {row['budget_bytes']}-byte model memory budget of "
                       f"deployment resource pool {pool_id}: it could never be loaded there.")
    return pool_id


async def start_serving(p, pool_id: str, dm_id: str, version: dict) -> None:
    """Before a pool deploy commits: every replica of the pool knows the model."""
    await _pools(p).add_model(pool_id, dm_id, Path(version["local_path"]))


def stop_serving(p, pool_id: str, dm_id: str) -> None:
    """After an undeploy (or a deploy that did not commit): the pool's replicas drop the model."""
    if p.pools is not None:
        p.pools.remove_model(pool_id, dm_id)


def render_deployed(parent: str, dm: dict) -> dict:
    """A DeployedModel served by a pool: ``sharedResources`` names the pool, in place of its own resources."""
    return {"id": dm["id"], "model": names.model_name(parent, dm["model_id"]), "modelVersionId": dm["version_id"],
            "displayName": dm["display_name"], "createTime": rfc3339(dm["created"]),
            "sharedResources": names.pool_name(parent, dm["pool_id"])}


def _get_in(p, route: Route) -> dict:
    row = pool_db.get_pool(p.store, route.resource_id)
    if row["parent"] != route.parent:
        raise not_found("DeploymentResourcePool", route.resource_id)
    return row


def render(row: dict) -> dict:
    resources = {"minReplicaCount": row["min_replicas"], "maxReplicaCount": row["max_replicas"]}
    if row["machine_type"]:
        resources["machineSpec"] = {"machineType": row["machine_type"]}
    out = {"name": names.pool_name(row["parent"], row["id"]), "dedicatedResources": resources,
           "createTime": rfc3339(row["created"])}
    if row["budget_bytes"]:
        out["modelMemoryBudgetBytes"] = str(row["budget_bytes"])
    return out
