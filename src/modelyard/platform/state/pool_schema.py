"""Deployment resource pools' tables (schema v8), beside the registry's; their queries are in ``pool_db``.

A pool row keeps what its replicas are (their counts, the machine type shown back, the memory budget
for models loaded on demand); each pool replica is a row of its own, written as soon as its process
runs, so a restarted platform adopts it (or stops it) as it does a deployed model's replicas. Which
models a pool serves is the ``pool_id`` column of ``deployed_models`` (schema.py), so a deploy into a
pool commits in the same transaction as any other deploy.
"""
from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Integer, MetaData, String, Table
from sqlalchemy.engine import Connection

from modelyard.platform.state.replica_table import replica_table

# Its own MetaData: schema.py imports this module for its migration, so this one cannot import schema.
metadata = MetaData()

pools = Table(
    "deployment_resource_pools", metadata,
    Column("id", String(64), primary_key=True),
    Column("parent", String(256), nullable=False, index=True),
    Column("min_replicas", Integer, nullable=False),
    Column("max_replicas", Integer, nullable=False),
    Column("machine_type", String(64), nullable=False, default=""),
    Column("budget_bytes", BigInteger, nullable=False, default=0),  # 0: no budget (models never unloaded)
    Column("created", Float, nullable=False),
)

pool_replicas = replica_table("pool_replicas", metadata, Column("pool_id", String(64), nullable=False, index=True))


def create_tables(conn: Connection) -> None:
    metadata.create_all(conn, checkfirst=True)
