"""What the platform's console shows, read from a running ``modelyard platform`` in its own process.

Models and their versions come from the store, endpoints and their split from the store too,
replicas (state, in flight, served) from the gateway's routing table, and traffic from the
platform's metrics: the same objects ``GET /metrics`` and ``/modelyard/v1/replicas`` read, so
the console's numbers are theirs. The platform object is duck-typed (``store``, ``routing``,
``metrics``, ``config``): ``modelyard.platform`` imports this package to serve it, so this package
never imports ``modelyard.platform``. Counters are cumulative; the page turns two samples into
a rate, so no history is kept here.
"""
from __future__ import annotations

import time

from sqlalchemy import text

# The tables whose rows name a parent (projects/{p}/locations/{l}); ``jobs`` only on schema v3+, Vizier's
# studies on v7+.
_PARENT_TABLES = ("models", "endpoints", "jobs", "vizier_studies", "pipeline_schedules")


def parents(store) -> list[str]:
    """Every project/location that holds a model, an endpoint, a job, a study or a pipeline schedule, sorted.

    The store lists models per parent only, and the console shows all of them at once, so the
    distinct parents are read here (one read-only query per table, on SQLite and PostgreSQL alike)."""
    found: set[str] = set()
    with store.engine.connect() as c:
        for table in _PARENT_TABLES:
            try:
                found.update(r[0] for r in c.execute(text(f"SELECT DISTINCT parent FROM {table}")))
            except Exception:  # a table this store's schema does not have yet (no jobs before v3)
                c.rollback()
    return sorted(found)


def _versions(store, model_id: str) -> list[dict]:
    out = []
    for version_id in sorted(store.version_ids(model_id), key=int):
        v = store.get_version(model_id, version_id)
        out.append({"versionId": v["version_id"], "aliases": list(v["aliases"] or []),
                    "artifactUri": v["artifact_uri"], "created": v["created"]})
    return out


def _replicas(deployed) -> list[dict]:
    if deployed is None:
        return []
    return [{"id": r.id, "state": r.state,
             "inFlight": r.outstanding, "served": r.served} for r in deployed.replicas]


def _traffic(metrics, endpoint_id: str, dm_id: str) -> dict:
    by_code = {str(code): n for (ep, dm, code), n in metrics.requests.items() if ep == endpoint_id and dm == dm_id}
    histogram = metrics.latency.get((endpoint_id, dm_id))
    shadow = metrics.shadow.get((endpoint_id, dm_id))
    out = {
        "requests": {"total": sum(by_code.values()), "ok": by_code.get("200", 0), "byCode": dict(sorted(by_code.items()))},
        "latencySeconds": {"sum": histogram[-2] if histogram else 0.0, "count": histogram[-1] if histogram else 0},
        "shadow": None,
    }
    if shadow is not None:
        mirrored, agreed, failed, diff = shadow
        answered = mirrored - failed
        out["shadow"] = {"mirrored": mirrored, "agreed": agreed, "failed": failed,
                         "agreementRatio": agreed / answered if answered else None, "maxAbsDiff": diff}
    return out


def _endpoint(p, row: dict, model_names: dict[str, str]) -> dict:
    deployed = []
    for dm in p.store.deployed_models(row["id"]):
        model = f'{row["parent"]}/models/{dm["model_id"]}'
        deployed.append({
            "id": dm["id"], "displayName": dm["display_name"], "model": model,
            "modelDisplayName": model_names.get(dm["model_id"], ""), "modelVersionId": dm["version_id"],
            "minReplicaCount": dm["min_replicas"], "maxReplicaCount": dm["max_replicas"],
            "shadowTrafficPercentage": dm["shadow_percent"] or 0,
            "replicas": _replicas(p.routing.deployed.get(dm["id"])),
            # A deployment resource pool's model: where it is loaded, its loads, last use (docs/pools.md).
            "pool": p.pools.model_state(dm["pool_id"], dm["id"]) if dm.get("pool_id") and p.pools is not None else None,
            **_traffic(p.metrics, row["id"], dm["id"]),
        })
    return {"name": f'{row["parent"]}/endpoints/{row["id"]}', "id": row["id"], "parent": row["parent"],
            "displayName": row["display_name"], "labels": row["labels"] or {},
            "trafficSplit": dict(row["traffic_split"] or {}), "deployedModels": deployed}


def collect(p, jobs: list[dict] | None = None) -> dict:
    """The console's JSON state (``jobs`` fetched separately, through the REST API: ``platform_jobs``)."""
    models, endpoints = [], []
    model_names: dict[str, str] = {}
    for parent in parents(p.store):
        for m in p.store.list_models(parent):
            model_names[m["id"]] = m["display_name"]
            models.append({"name": f'{parent}/models/{m["id"]}', "id": m["id"], "parent": parent,
                           "displayName": m["display_name"], "labels": m["labels"] or {},
                           "versions": _versions(p.store, m["id"])})
    for row in p.store.list_endpoints():
        endpoints.append(_endpoint(p, row, model_names))
    return {"time": time.time(), "canAct": bool(p.config.auth_token), "models": models,
            "endpoints": endpoints, "jobs": jobs or []}
