"""Vertex AI schedules' table (schema v9) and its queries: a schedule of pipeline runs lives in the
platform's store, SQLite or PostgreSQL, so a restarted platform's scheduler carries on with it.

A row keeps what the client set (``spec``: the cron, the ``createPipelineJobRequest``, the limits and
times, proto3 JSON as sent) apart from what the scheduler keeps (state, runs started, the next run's
time, the last run's answer). ``advance`` is a compare-and-set on the next run's time, so a run is
started for one scheduled time once, whoever ticks.
"""
from __future__ import annotations

import time

from sqlalchemy import JSON, Boolean, Column, Float, Integer, MetaData, String, Table, delete, select, update
from sqlalchemy.engine import Connection, Engine

from modelyard.platform.api.list_filter import ListRequest
from modelyard.platform.state import list_query as lq

# Its own MetaData: schema.py imports this module for its migration, so this one cannot import schema.
metadata = MetaData()

schedules = Table(
    "pipeline_schedules", metadata,
    Column("id", String(32), primary_key=True),
    Column("parent", String(256), nullable=False, index=True),
    Column("display_name", String(256), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("state", String(16), nullable=False),  # Schedule.State: ACTIVE | PAUSED | COMPLETED
    Column("started_run_count", Integer, nullable=False, default=0),
    Column("next_run", Float, nullable=True),  # epoch seconds; None once nothing more will run
    Column("catch_up", Boolean, nullable=False, default=False),
    Column("last_pause", Float, nullable=True),
    Column("last_resume", Float, nullable=True),
    Column("last_response", JSON, nullable=True),  # Schedule.RunResponse of the last run started
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
)

COLUMNS = lq.Columns({"display_name": schedules.c.display_name, "state": schedules.c.state,
                      "create_time": schedules.c.created, "update_time": schedules.c.updated,
                      "next_run_time": schedules.c.next_run}, None, schedules.c.id)


def create_tables(conn: Connection) -> None:
    """The migration that adds the table (schema.MIGRATIONS)."""
    schedules.create(conn, checkfirst=True)


def _row(r) -> dict:
    return dict(r._mapping)


def add(engine: Engine, row: dict) -> None:
    with engine.begin() as c:
        c.execute(schedules.insert().values(**row))


def get(engine: Engine, schedule_id: str) -> dict | None:
    with engine.connect() as c:
        found = c.execute(select(schedules).where(schedules.c.id == schedule_id)).first()
    return _row(found) if found is not None else None


def page(engine: Engine, parent: str, request: ListRequest) -> tuple[list[dict], str | None]:
    query = lq.page(select(schedules).where(schedules.c.parent == parent), request, COLUMNS,
                    (("create_time", False),))
    with engine.connect() as c:
        rows = [_row(r) for r in c.execute(query)]
    return lq.cut(rows, request)


def due(engine: Engine, now: float) -> list[dict]:
    """The active schedules whose next run's time has come."""
    with engine.connect() as c:
        return [_row(r) for r in c.execute(select(schedules).where(schedules.c.state == "ACTIVE")
                                           .where(schedules.c.next_run <= now).order_by(schedules.c.next_run))]


def change(engine: Engine, schedule_id: str, expect: dict | None = None, **values) -> bool:
    """Set ``values``; with ``expect`` (column -> value), only if the row still holds them. True if it changed."""
    q = update(schedules).where(schedules.c.id == schedule_id)
    for column, value in (expect or {}).items():
        col = schedules.c[column]
        q = q.where(col.is_(None) if value is None else col == value)
    with engine.begin() as c:
        return c.execute(q.values(**values, updated=time.time())).rowcount > 0


def remove(engine: Engine, schedule_id: str) -> bool:
    with engine.begin() as c:
        return c.execute(delete(schedules).where(schedules.c.id == schedule_id)).rowcount > 0
