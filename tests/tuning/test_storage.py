"""Opening a study's database while another process creates Optuna's tables in it."""
from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from modelyard.tuning import study as study_module


def _raising_first(message: str, calls: list):
    real = study_module.RDBStorage

    def make(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 1:
            raise OperationalError("CREATE TABLE ...", (), sqlite3.OperationalError(message))
        return real(*args, **kwargs)
    return make


def test_losing_the_table_creation_race_retries(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(study_module, "RDBStorage", _raising_first("table trials already exists", calls))
    monkeypatch.setattr(study_module.time, "sleep", lambda _s: None)
    storage = study_module.open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    assert len(calls) == 2 and storage.get_all_studies() == []


def test_other_database_errors_are_not_retried(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(study_module, "RDBStorage", _raising_first("unable to open database file", calls))
    with pytest.raises(OperationalError, match="unable to open"):
        study_module.open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    assert len(calls) == 1
