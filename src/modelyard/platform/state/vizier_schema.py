"""Vizier's tables (studies and their trials) and the queries on them, beside the registry's.

A study row keeps its StudySpec as the client sent it (proto3 JSON, camelCase); a trial row keeps
the Vertex ``Trial`` JSON it renders as (``doc``), with its state and client id as columns so a
suggestion finds a worker's active trials with one query. Trial ids count from 1 within a study,
as Vertex's do. Everything a study is lives here, so a restarted platform carries on with it.
"""
from __future__ import annotations

import time
import zlib

from sqlalchemy import (JSON, Column, Float, Integer, MetaData, String, Table, Text, delete, func, insert, select,
                        text, update)
from sqlalchemy.engine import Connection, Engine

from modelyard.platform.api.errors import ApiError, not_found

# Its own MetaData: schema.py imports this module for its migration, so this one cannot import schema.
metadata = MetaData()

studies = Table(
    "vizier_studies", metadata,
    Column("id", String(32), primary_key=True),
    Column("parent", String(256), nullable=False, index=True),
    Column("display_name", String(256), nullable=False),
    Column("spec", JSON, nullable=False),  # StudySpec, proto3 JSON as sent (enums named)
    Column("state", String(16), nullable=False),  # Study.State: ACTIVE | INACTIVE | COMPLETED
    Column("inactive_reason", Text, nullable=False, default=""),
    Column("created", Float, nullable=False),
)

trials = Table(
    "vizier_trials", metadata,
    Column("study_id", String(32), primary_key=True),
    Column("id", Integer, primary_key=True),
    Column("state", String(16), nullable=False, index=True),  # Trial.State name
    Column("client_id", String(256), nullable=False, default=""),
    Column("doc", JSON, nullable=False),  # the Trial as rendered, without name/id/state/clientId
    Column("created", Float, nullable=False),
)


def create_tables(conn: Connection) -> None:
    """The migration that adds Vizier's tables (schema.MIGRATIONS)."""
    for table in (studies, trials):
        table.create(conn, checkfirst=True)


def _row(r) -> dict:
    return dict(r._mapping)


def _hold(c: Connection, parent: str, display_name: str) -> None:
    """Hold, until this transaction ends, the right to add a study of this display name: two
    platforms on one store must not both find the name free and both add it. PostgreSQL: an
    advisory lock on the name; SQLite: the database's write lock (a write that changes nothing
    takes it; pysqlite would otherwise begin the transaction only at the INSERT, after the check)."""
    if c.dialect.name == "postgresql":
        key = zlib.crc32(f"vizier-study\0{parent}\0{display_name}".encode())
        c.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
    else:
        c.execute(update(studies).where(studies.c.parent == parent).where(studies.c.display_name == display_name)
                  .values(state=studies.c.state))


def add_study(engine: Engine, row: dict) -> dict:
    """A new study, or the one of that display name in its parent when it has the same spec (display
    names are unique per location). Vertex answers ALREADY_EXISTS for any taken name, and the SDK's
    ``Study.create_or_load`` catches that to look the study up; but over REST a 409 reaches it as
    api_core's plain ``Conflict``, which it does not catch (its ``AlreadyExists`` is chosen by gRPC
    status only), so Google's test_vizier, whose tests create_or_load one display name in turn, would
    fail here. Answering the existing study for the same spec keeps that call working; another spec
    is ALREADY_EXISTS as on Vertex."""
    with engine.begin() as c:
        _hold(c, row["parent"], row["display_name"])
        taken = c.execute(select(studies).where(studies.c.parent == row["parent"])
                          .where(studies.c.display_name == row["display_name"])).first()
        if taken is not None:
            if taken.spec == row["spec"]:
                return _row(taken)
            raise ApiError("ALREADY_EXISTS", f"Study with display name {row['display_name']!r} already exists "
                           f"in {row['parent']} (studies/{taken.id}) with another study_spec.")
        c.execute(insert(studies).values(**row))
    return row


def get_study(engine: Engine, study_id: str, parent: str | None = None) -> dict:
    with engine.connect() as c:
        row = c.execute(select(studies).where(studies.c.id == study_id)).first()
    if row is None or (parent is not None and row.parent != parent):
        raise not_found("Study", study_id)
    return _row(row)


def find_study(engine: Engine, parent: str, display_name: str) -> dict:
    with engine.connect() as c:
        row = c.execute(select(studies).where(studies.c.parent == parent)
                        .where(studies.c.display_name == display_name)).first()
    if row is None:
        raise ApiError("NOT_FOUND", f"Study with display name {display_name!r} is not found in {parent}.")
    return _row(row)


def list_studies(engine: Engine, parent: str) -> list[dict]:
    with engine.connect() as c:
        return [_row(r) for r in c.execute(select(studies).where(studies.c.parent == parent)
                                           .order_by(studies.c.created, studies.c.id))]


def set_study_state(engine: Engine, study_id: str, state: str, reason: str = "") -> None:
    with engine.begin() as c:
        c.execute(update(studies).where(studies.c.id == study_id).values(state=state, inactive_reason=reason))


def delete_study(engine: Engine, study_id: str) -> None:
    with engine.begin() as c:
        c.execute(delete(trials).where(trials.c.study_id == study_id))
        c.execute(delete(studies).where(studies.c.id == study_id))


def list_trials(engine: Engine, study_id: str) -> list[dict]:
    with engine.connect() as c:
        return [_row(r) for r in c.execute(select(trials).where(trials.c.study_id == study_id)
                                           .order_by(trials.c.id))]


def get_trial(engine: Engine, study_id: str, trial_id: int) -> dict:
    with engine.connect() as c:
        row = c.execute(select(trials).where(trials.c.study_id == study_id).where(trials.c.id == trial_id)).first()
    if row is None:
        raise not_found("Trial", f"{trial_id} of study {study_id}")
    return _row(row)


def add_trials(engine: Engine, study_id: str, rows: list[dict]) -> list[dict]:
    """New trials with the next ids of the study (given rows lack ``id``); returns them with ids."""
    with engine.begin() as c:
        # One writer at a time per study, across platforms on one store: a write to the study's row
        # (changing nothing) comes first, so the next id is read and used under its lock: the row's lock
        # on PostgreSQL, the database's write lock on SQLite (whose transaction pysqlite would otherwise
        # begin only at the INSERT, after another platform read the same max).
        c.execute(update(studies).where(studies.c.id == study_id).values(state=studies.c.state))
        last = c.execute(select(func.max(trials.c.id)).where(trials.c.study_id == study_id)).scalar() or 0
        out = []
        now = time.time()
        for i, row in enumerate(rows, start=1):
            full = {"study_id": study_id, "id": last + i, "created": now, **row}
            c.execute(insert(trials).values(**full))
            out.append(full)
        return out


def update_trial(engine: Engine, study_id: str, trial_id: int, **values) -> None:
    with engine.begin() as c:
        c.execute(update(trials).where(trials.c.study_id == study_id).where(trials.c.id == trial_id).values(**values))


def delete_trial(engine: Engine, study_id: str, trial_id: int) -> None:
    with engine.begin() as c:
        gone = c.execute(delete(trials).where(trials.c.study_id == study_id).where(trials.c.id == trial_id)).rowcount
    if not gone:
        raise not_found("Trial", f"{trial_id} of study {study_id}")
