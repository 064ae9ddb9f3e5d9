"""The one shape of a replica's row: a serving process of the platform's, written as soon as it runs so a
restarted platform adopts it (or stops it). A deployed model's replicas (``schema.replicas``) and a
deployment resource pool's (``pool_schema.pool_replicas``) are tables of this shape, told apart by the
column naming what they serve; the supervisor reads both the same way.
"""
from __future__ import annotations

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, Text


def replica_table(name: str, metadata: MetaData, owner: Column) -> Table:
    """The table ``name`` in ``metadata``: a replica's id, ``owner`` (what it serves), where it listens,
    its pid and log, when it was started."""
    return Table(
        name, metadata,
        Column("id", String(32), primary_key=True),
        owner,
        Column("host", String(256), nullable=False),
        Column("port", Integer, nullable=False),
        Column("grpc_port", Integer, nullable=False),
        Column("pid", Integer, nullable=False),
        Column("log_path", Text, nullable=False, default=""),
        Column("created", Float, nullable=False),
    )
