"""The metadata and TensorBoard tests of test_metadata.py that touch the store, run on PostgreSQL (the
platform's store for several hosts): its JSON columns, window query and integer division differ from
SQLite's. One fresh database per test on the session's PostgreSQL server."""
from __future__ import annotations

import secrets

import pytest
from sqlalchemy import create_engine, text

from modelyard.platform.state import metadata_schema
from modelyard.platform.state.metadata_db import MetadataDB
from tests.platform import test_metadata as on_sqlite
from tests.tuning.conftest import postgres_url  # noqa: F401  (the session's PostgreSQL server)


@pytest.fixture
def engine(postgres_url):  # noqa: F811
    url = postgres_url.replace("postgresql://", "postgresql+psycopg://", 1)
    name = f"metadata_{secrets.token_hex(4)}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    out = create_engine(url.rsplit("/", 1)[0] + f"/{name}")
    with out.begin() as conn:
        metadata_schema.create(conn)
    yield out
    out.dispose()
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name}"))
    admin.dispose()


@pytest.fixture
def db(engine) -> MetadataDB:
    out = MetadataDB(engine)
    out.ensure_store(on_sqlite.STORE, on_sqlite.PARENT)
    return out


def test_lineage_on_postgres(db):
    on_sqlite.test_artifact_lineage_walks_events_both_ways_within_max_hops_and_filter(db)


def test_contexts_on_postgres(db):
    on_sqlite.test_contexts_members_children_and_their_filters(db)


def test_purge_pages_etags_and_schemas_on_postgres(db):
    on_sqlite.test_purge_pages_etags_and_schemas(db)


def test_tensorboard_points_on_postgres(engine):
    on_sqlite.test_tensorboard_points_are_checked_sampled_and_deleted_with_their_run(engine)


@pytest.mark.parametrize("text", [
    'display_name:"ds*" AND labels.team="ml"',
    'labels:team AND metadata.rows.number_value>=1 AND -uri="gs://b/ds-0"',
    'metadata.kind.string_value="raw" AND metadata.nested.k="v1"', 'metadata.kind="3" OR display_name="model"'])
def test_filters_in_sql_on_postgres(db, text):
    on_sqlite.test_the_store_selects_a_filters_columns_in_sql_with_the_same_answer(db, text)
