"""The platform's database schema and its versioned migrations.

Migrations are a numbered list applied in order inside one transaction each, recorded in the
``modelyard_schema`` table. A small list rather than Alembic: the schema is a handful of tables,
the migrations must run unattended at every start of ``modelyard platform`` from the installed
package (no ``alembic.ini`` / ``env.py`` to ship or locate), and the same code path works on
SQLite and PostgreSQL. A database newer than this code is refused rather than misread.
"""
from __future__ import annotations

import uuid
from typing import Callable

from sqlalchemy import (JSON, Column, Float, Integer, MetaData, String, Table, Text, inspect, select,
                        text)
from sqlalchemy.engine import Connection, Engine

from modelyard.platform.api.names import DEFAULT_ALIAS
from modelyard.platform.state import metadata_schema
from modelyard.platform.state import pool_schema
from modelyard.platform.state.replica_table import replica_table
from modelyard.platform.state import schedule_schema
from modelyard.platform.state import vizier_schema

metadata = MetaData()

schema_version = Table("modelyard_schema", metadata, Column("version", Integer, primary_key=True))

# Schema v5: the store's identity, one row written once. Every replica carries it from before it starts,
# so any platform on this store (a restart, or a follower taking the lead from a dead leader with
# another state directory) finds what a dead platform of the store started.
store_identity = Table("modelyard_store", metadata, Column("id", String(32), primary_key=True))

# Model ids are 128 wide since schema v4: a chosen id (UploadModelRequest.model_id) has up to 63 characters.
models = Table(
    "models", metadata,
    Column("id", String(128), primary_key=True),
    Column("parent", String(256), nullable=False, index=True),
    Column("display_name", String(256), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False, default=dict),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
)

model_versions = Table(
    "model_versions", metadata,
    Column("model_id", String(128), primary_key=True),
    Column("version_id", String(16), primary_key=True),
    Column("artifact_uri", Text, nullable=False),
    Column("local_path", Text, nullable=False),  # where replicas load it from
    Column("container", JSON, nullable=False, default=dict),
    # Since schema v4 "default" is stored on the one version that holds it (before: implied, the highest).
    Column("aliases", JSON, nullable=False, default=list),
    Column("created", Float, nullable=False),
    # Schema v4: the version's own description and labels (merged over the model's when shown), last change.
    Column("description", Text, nullable=False, default="", server_default=""),
    Column("labels", JSON, nullable=True),
    Column("updated", Float, nullable=True),
)

endpoints = Table(
    "endpoints", metadata,
    Column("id", String(32), primary_key=True),
    Column("parent", String(256), nullable=False, index=True),
    Column("display_name", String(256), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False, default=dict),
    Column("traffic_split", JSON, nullable=False, default=dict),  # deployed model id -> percent
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
)

deployed_models = Table(
    "deployed_models", metadata,
    Column("id", String(32), primary_key=True),
    Column("endpoint_id", String(32), nullable=False, index=True),
    Column("model_id", String(128), nullable=False),
    Column("version_id", String(16), nullable=False),
    Column("display_name", String(256), nullable=False, default=""),
    Column("min_replicas", Integer, nullable=False),
    Column("max_replicas", Integer, nullable=False),
    Column("machine_type", String(64), nullable=False, default=""),
    Column("created", Float, nullable=False),
    # Schema v2: percent of the endpoint's served requests mirrored to this model (0: not a shadow).
    Column("shadow_percent", Integer, nullable=False, default=0, server_default="0"),
    # Schema v8: the deployment resource pool whose replicas serve it (None: its own replicas).
    Column("pool_id", String(64), nullable=True),
)

replicas = replica_table("replicas", metadata, Column("deployed_model_id", String(32), nullable=False, index=True))

operations = Table(
    "operations", metadata,
    Column("id", String(32), primary_key=True),
    Column("name", Text, nullable=False),
    Column("done", Integer, nullable=False, default=0),
    Column("metadata", JSON, nullable=True),
    Column("response", JSON, nullable=True),
    Column("error", JSON, nullable=True),
    Column("created", Float, nullable=False),
)


# Schema v3: jobs (batch prediction, custom training, tuning), one table, ``kind`` = the REST collection.
jobs = Table(
    "jobs", metadata,
    Column("id", String(32), primary_key=True),
    Column("kind", String(40), nullable=False),  # batchPredictionJobs | customJobs | hyperparameterTuningJobs
    Column("parent", String(256), nullable=False, index=True),
    Column("display_name", String(256), nullable=False),
    Column("state", String(40), nullable=False, index=True),  # JobState name, e.g. JOB_STATE_RUNNING
    Column("spec", JSON, nullable=False),  # the resource's input fields as submitted (camelCase)
    Column("result", JSON, nullable=False, default=dict),  # outputInfo, completionStats, trials, ...
    Column("error", JSON, nullable=True),  # google.rpc.Status when failed or cancelled
    Column("labels", JSON, nullable=False, default=dict),
    Column("work_dir", Text, nullable=False),
    Column("pid", Integer, nullable=True),  # the supervised child process while it runs
    Column("runs", Integer, nullable=False, default=0),  # child processes started (>1: resumed)
    Column("created", Float, nullable=False),
    Column("started", Float, nullable=True),
    Column("ended", Float, nullable=True),
    Column("updated", Float, nullable=False),
)


def _v1(conn: Connection) -> None:
    for table in (models, model_versions, endpoints, deployed_models, replicas, operations):
        table.create(conn, checkfirst=True)


def _v2(conn: Connection) -> None:
    # v1 databases lack the shadow column (fresh ones got it from _v1, which builds today's tables).
    if "shadow_percent" not in {c["name"] for c in inspect(conn).get_columns("deployed_models")}:
        conn.execute(text("ALTER TABLE deployed_models ADD COLUMN shadow_percent INTEGER NOT NULL DEFAULT 0"))


def _v3(conn: Connection) -> None:
    jobs.create(conn, checkfirst=True)


def _v4(conn: Connection) -> None:
    # The model registry: chosen model ids (wider id columns), version descriptions and labels, and the
    # "default" alias stored where it is (it was implied: the highest version).
    if conn.dialect.name == "postgresql":  # SQLite does not enforce VARCHAR lengths
        for table, column in (("models", "id"), ("model_versions", "model_id"), ("deployed_models", "model_id")):
            conn.execute(text(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE VARCHAR(128)"))
    have = {c["name"] for c in inspect(conn).get_columns("model_versions")}
    for column, ddl in (("description", "TEXT NOT NULL DEFAULT ''"), ("labels", "JSON"), ("updated", "FLOAT")):
        if column not in have:
            conn.execute(text(f"ALTER TABLE model_versions ADD COLUMN {column} {ddl}"))
    latest: dict[str, tuple[int, list]] = {}
    for model_id, version_id, aliases in conn.execute(
            select(model_versions.c.model_id, model_versions.c.version_id, model_versions.c.aliases)):
        if int(version_id) > latest.get(model_id, (0, []))[0]:
            latest[model_id] = (int(version_id), list(aliases or []))
    for model_id, (version_id, aliases) in latest.items():
        if DEFAULT_ALIAS not in aliases:
            conn.execute(model_versions.update()
                         .where(model_versions.c.model_id == model_id)
                         .where(model_versions.c.version_id == str(version_id))
                         .values(aliases=[DEFAULT_ALIAS, *aliases]))


def _v5(conn: Connection) -> None:
    store_identity.create(conn, checkfirst=True)
    if conn.execute(select(store_identity.c.id)).first() is None:
        conn.execute(store_identity.insert().values(id=uuid.uuid4().hex))


def _v6(conn: Connection) -> None:
    metadata_schema.create(conn)  # ML Metadata and TensorBoard (experiments, pipelines)


def _v7(conn: Connection) -> None:
    vizier_schema.create_tables(conn)  # Vizier's studies and trials


def _v8(conn: Connection) -> None:
    # Deployment resource pools: their tables, and which pool serves a deployed model.
    pool_schema.create_tables(conn)
    if "pool_id" not in {c["name"] for c in inspect(conn).get_columns("deployed_models")}:
        conn.execute(text("ALTER TABLE deployed_models ADD COLUMN pool_id VARCHAR(64)"))


def _v9(conn: Connection) -> None:
    schedule_schema.create_tables(conn)  # Vertex AI schedules of pipeline runs


# Index i holds the migration that takes the schema from version i to i + 1.
MIGRATIONS: list[Callable[[Connection], None]] = [_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9]
LATEST = len(MIGRATIONS)


def migrate(engine: Engine) -> int:
    """Bring the database to ``LATEST``; returns the version it was at. Safe to run at every start."""
    with engine.begin() as conn:
        if not inspect(conn).has_table(schema_version.name):
            schema_version.create(conn)
            conn.execute(schema_version.insert().values(version=0))
        if engine.dialect.name == "postgresql":
            # Two control planes starting at once on one database: the second waits for the first.
            conn.execute(text("LOCK TABLE modelyard_schema IN EXCLUSIVE MODE"))
        found = conn.execute(select(schema_version.c.version)).scalar_one()
        if found > LATEST:
            raise RuntimeError(f"the platform database has schema version {found}, newer than this "
                               f"modelyard's {LATEST}: upgrade modelyard")
        for version in range(found, LATEST):
            MIGRATIONS[version](conn)
        if found != LATEST:
            conn.execute(schema_version.update().values(version=LATEST))
    return found
