"""The tables of Vertex ML Metadata and of the TensorBoard API: what experiments, pipelines and
TensorBoard time series are recorded in (docs/metadata.md says how each maps onto them).

Kept apart from ``schema``'s registry tables on a ``MetaData`` of their own: ``schema`` creates
them in its migration to v6 (``create``), so this module imports nothing of the store.

ML Metadata is a graph: nodes (artifacts, contexts, executions: one table, ``kind`` says which,
since the three share every column but ``uri`` and ``state``'s values), events (an execution's
input or output artifact), a context's members (artifacts and executions) and a context's parents.
Every row carries its store's resource name (``projects/p/locations/l/metadataStores/s``) so
several stores, projects and locations share the tables.
"""
from __future__ import annotations

from sqlalchemy import (JSON, Column, Float, Index, Integer, LargeBinary, MetaData, String, Table, Text)
from sqlalchemy.engine import Connection

metadata = MetaData()

STORE_NAME = 320  # projects/{p}/locations/{l}/metadataStores/{s}, each segment bounded by names' rules

md_stores = Table(
    "md_stores", metadata,
    Column("name", String(STORE_NAME), primary_key=True),  # its resource name
    Column("parent", String(256), nullable=False, index=True),
    Column("description", Text, nullable=False, default=""),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
)

# Schemas registered by users (metadataSchemas.create); the system.* and google.* ones are built in.
md_schemas = Table(
    "md_schemas", metadata,
    Column("store", String(STORE_NAME), primary_key=True),
    Column("id", String(128), primary_key=True),
    Column("title", String(256), nullable=False),
    Column("version", String(64), nullable=False),
    Column("schema_type", String(32), nullable=False),  # ARTIFACT_TYPE | EXECUTION_TYPE | CONTEXT_TYPE
    Column("schema", Text, nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("created", Float, nullable=False),
)

md_nodes = Table(
    "md_nodes", metadata,
    Column("store", String(STORE_NAME), primary_key=True),
    Column("kind", String(16), primary_key=True),  # artifacts | contexts | executions (the REST collection)
    Column("id", String(128), primary_key=True),
    Column("display_name", String(256), nullable=False, default=""),
    Column("description", Text, nullable=False, default=""),
    Column("uri", Text, nullable=False, default=""),  # artifacts only
    Column("state", String(32), nullable=False, default=""),  # Artifact.State / Execution.State name
    Column("schema_title", String(256), nullable=False),
    Column("schema_version", String(64), nullable=False, default=""),
    Column("metadata", JSON, nullable=False, default=dict),
    Column("labels", JSON, nullable=False, default=dict),
    Column("etag", Integer, nullable=False, default=1),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Index("md_nodes_by_title", "store", "kind", "schema_title"),
)

# An execution's input or output artifact (one row per event: an artifact may be both).
md_events = Table(
    "md_events", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("store", String(STORE_NAME), nullable=False),
    Column("execution_id", String(128), nullable=False),
    Column("artifact_id", String(128), nullable=False),
    Column("type", String(16), nullable=False),  # INPUT | OUTPUT
    Column("labels", JSON, nullable=False, default=dict),
    Column("time", Float, nullable=False),
    Index("md_events_by_execution", "store", "execution_id"),
    Index("md_events_by_artifact", "store", "artifact_id"),
)

# A context's artifacts (attributions) and executions (associations).
md_members = Table(
    "md_members", metadata,
    Column("store", String(STORE_NAME), primary_key=True),
    Column("context_id", String(128), primary_key=True),
    Column("kind", String(16), primary_key=True),  # artifacts | executions
    Column("node_id", String(128), primary_key=True),
    Index("md_members_by_node", "store", "kind", "node_id"),
)

md_context_parents = Table(
    "md_context_parents", metadata,
    Column("store", String(STORE_NAME), primary_key=True),
    Column("child_id", String(128), primary_key=True),
    Column("parent_id", String(128), primary_key=True),
    Index("md_parents_by_parent", "store", "parent_id"),
)

# ---- TensorBoard -------------------------------------------------------------------------------
tb_tensorboards = Table(
    "tb_tensorboards", metadata,
    Column("id", String(32), primary_key=True),
    Column("parent", String(256), nullable=False, index=True),
    Column("display_name", String(256), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False, default=dict),
    Column("is_default", Integer, nullable=False, default=0),
    Column("etag", Integer, nullable=False, default=1),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
)

# Experiments, runs and time series: ``path`` is the name below the tensorboard
# (``e``, ``e/runs/r``); time series have numeric ids of their own.
tb_experiments = Table(
    "tb_experiments", metadata,
    Column("tensorboard_id", String(32), primary_key=True),
    Column("id", String(128), primary_key=True),
    Column("display_name", String(256), nullable=False, default=""),
    Column("description", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False, default=dict),
    Column("source", String(256), nullable=False, default=""),
    Column("etag", Integer, nullable=False, default=1),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
)

tb_runs = Table(
    "tb_runs", metadata,
    Column("tensorboard_id", String(32), primary_key=True),
    Column("experiment_id", String(128), primary_key=True),
    Column("id", String(128), primary_key=True),
    Column("display_name", String(256), nullable=False, default=""),
    Column("description", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False, default=dict),
    Column("etag", Integer, nullable=False, default=1),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
)

tb_series = Table(
    "tb_series", metadata,
    Column("id", String(32), primary_key=True),
    Column("tensorboard_id", String(32), nullable=False),
    Column("experiment_id", String(128), nullable=False),
    Column("run_id", String(128), nullable=False),
    Column("display_name", String(256), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("value_type", String(32), nullable=False),  # SCALAR | TENSOR | BLOB_SEQUENCE
    Column("plugin_name", String(128), nullable=False, default=""),
    Column("plugin_data", Text, nullable=False, default=""),  # base64, as the JSON API carries bytes
    Column("etag", Integer, nullable=False, default=1),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Index("tb_series_by_run", "tensorboard_id", "experiment_id", "run_id"),
)

# One point of a time series: a scalar, a tensor (bytes) or a list of blob ids.
tb_points = Table(
    "tb_points", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("series_id", String(32), nullable=False),
    Column("step", Integer, nullable=False),
    Column("wall_time", Float, nullable=False),
    Column("scalar", Float, nullable=True),
    Column("tensor", LargeBinary, nullable=True),
    Column("blobs", JSON, nullable=True),
    Index("tb_points_by_series", "series_id", "step"),
)


def create(conn: Connection) -> None:
    """Creates every table above that is missing (the migration to schema v6)."""
    metadata.create_all(conn, checkfirst=True)
