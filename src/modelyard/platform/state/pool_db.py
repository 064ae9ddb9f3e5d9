"""Deployment resource pools' queries: pools, their replicas, and the models deployed into them."""
from __future__ import annotations

from sqlalchemy import delete, func, insert, select

from modelyard.platform.api.errors import ApiError, not_found
from modelyard.platform.state import schema as s
from modelyard.platform.state.pool_schema import pool_replicas, pools


def _row(r) -> dict:
    return dict(r._mapping)


def add_pool(store, row: dict, operation: dict | None = None) -> None:
    """The pool and (given) its done operation in one transaction; ALREADY_EXISTS for a taken id."""
    with store.engine.begin() as c:
        if c.execute(select(pools.c.id).where(pools.c.id == row["id"])).first() is not None:
            raise ApiError("ALREADY_EXISTS", f"DeploymentResourcePool {row['id']} already exists.")
        c.execute(insert(pools).values(**row))
        if operation is not None:
            c.execute(insert(s.operations).values(**operation))


def get_pool(store, pool_id: str) -> dict:
    with store.engine.connect() as c:
        r = c.execute(select(pools).where(pools.c.id == pool_id)).first()
    if r is None:
        raise not_found("DeploymentResourcePool", pool_id)
    return _row(r)


def list_pools(store, parent: str | None = None) -> list[dict]:
    q = select(pools).order_by(pools.c.created, pools.c.id)
    if parent is not None:
        q = q.where(pools.c.parent == parent)
    with store.engine.connect() as c:
        return [_row(r) for r in c.execute(q)]


def delete_pool(store, pool_id: str) -> None:
    """Deletes the pool, or FAILED_PRECONDITION while a model is deployed into it (checked in the same
    transaction, so a deploy committing meanwhile cannot leave a model in a deleted pool)."""
    with store.engine.begin() as c:
        used = c.execute(select(func.count()).select_from(s.deployed_models)
                         .where(s.deployed_models.c.pool_id == pool_id)).scalar_one()
        if used:
            raise ApiError("FAILED_PRECONDITION", f"DeploymentResourcePool {pool_id} has {used} deployed model(s); "
                           "undeploy them before deleting the pool.")
        if c.execute(delete(pools).where(pools.c.id == pool_id)).rowcount != 1:
            raise not_found("DeploymentResourcePool", pool_id)


def pool_models(store, pool_id: str) -> list[dict]:
    """The deployed models in one pool (oldest first)."""
    with store.engine.connect() as c:
        return [_row(r) for r in c.execute(select(s.deployed_models).where(s.deployed_models.c.pool_id == pool_id)
                                           .order_by(s.deployed_models.c.created))]


def add_replica(store, row: dict) -> None:
    with store.engine.begin() as c:
        c.execute(insert(pool_replicas).values(**row))


def remove_replica(store, replica_id: str) -> None:
    with store.engine.begin() as c:
        c.execute(delete(pool_replicas).where(pool_replicas.c.id == replica_id))


def replicas(store, pool_id: str | None = None) -> list[dict]:
    q = select(pool_replicas).order_by(pool_replicas.c.created)
    if pool_id is not None:
        q = q.where(pool_replicas.c.pool_id == pool_id)
    with store.engine.connect() as c:
        return [_row(r) for r in c.execute(q)]
