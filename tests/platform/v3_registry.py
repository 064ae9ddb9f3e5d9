"""A registry database as schema v3 wrote it (before model versions had a stored "default" alias and
wider ids): the migration tests of SQLite (test_registry) and PostgreSQL (test_postgres) open it."""
from __future__ import annotations

from tests.platform.conftest import PARENT


def write_v3_registry(url: str) -> None:
    """Model 123 with versions 1 (alias "stable") and 2 (no alias), in v3's tables, at ``url``."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("CREATE TABLE modelyard_schema (version INTEGER PRIMARY KEY)"))
        c.execute(text("INSERT INTO modelyard_schema VALUES (3)"))
        c.execute(text("CREATE TABLE models (id VARCHAR(32) PRIMARY KEY, parent VARCHAR(256) NOT NULL, "
                       "display_name VARCHAR(256) NOT NULL, description TEXT NOT NULL, labels JSON NOT NULL, "
                       "created FLOAT NOT NULL, updated FLOAT NOT NULL)"))
        c.execute(text("CREATE TABLE model_versions (model_id VARCHAR(32), version_id VARCHAR(16), "
                       "artifact_uri TEXT NOT NULL, local_path TEXT NOT NULL, container JSON NOT NULL, "
                       "aliases JSON NOT NULL, created FLOAT NOT NULL, PRIMARY KEY (model_id, version_id))"))
        c.execute(text("CREATE TABLE deployed_models (id VARCHAR(32) PRIMARY KEY, endpoint_id VARCHAR(32) NOT NULL, "
                       "model_id VARCHAR(32) NOT NULL, version_id VARCHAR(16) NOT NULL)"))
        c.execute(text(f"INSERT INTO models VALUES ('123', '{PARENT}', 'old', '', '{{}}', 1, 1)"))
        for v, aliases in (("1", '["stable"]'), ("2", "[]")):
            c.execute(text(f"INSERT INTO model_versions VALUES ('123', '{v}', 'gs://b/m', '/m', '{{}}', "
                           f"'{aliases}', 1)"))
    engine.dispose()
