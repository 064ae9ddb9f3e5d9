"""``modelyard tune STUDY --restart``: put the old study aside, under a timestamped name, then start over.

Nothing is deleted: a SQLite study's database file and its trials' directory (``job_dir``) are
renamed beside themselves with the time appended (``mnist-mlp.tuning.db`` ->
``mnist-mlp.tuning-20261126T154000.db``, ``runs/mnist-mlp`` -> ``runs/mnist-mlp-20261126T154000``);
a study in a shared database (PostgreSQL) is copied to ``NAME-archived-TIMESTAMP`` in the same
database and then removed under its own name. The caller prints where each went.
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

from modelyard.tuning.spec import SpecError, Study


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%dT%H%M%S")


def _free(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3`` ... when a restart in the same second already took it."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _sqlite_file(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    return Path(url[len("sqlite:///"):])


def archive(study: Study) -> list[tuple[str, str]]:
    """Move the study's database and trial directories aside; returns ``[(what, where it went)]``
    (empty when there was nothing to archive)."""
    stamp = _stamp()
    moved: list[tuple[str, str]] = []
    db = _sqlite_file(study.storage)
    if db is not None:
        if db.exists():
            stem = db.name[:-len(".db")] if db.name.endswith(".db") else db.name
            target = _free(db.with_name(f"{stem}-{stamp}.db"))
            db.rename(target)
            for suffix in ("-journal", "-wal", "-shm"):  # SQLite's side files go with it
                side = db.with_name(db.name + suffix)
                if side.exists():
                    side.rename(target.with_name(target.name + suffix))
            moved.append(("database", str(target)))
    else:
        archived = _archive_shared(study, stamp)
        if archived:
            moved.append(("trials", archived))
    if study.job_dir.exists():
        target = _free(study.job_dir.with_name(f"{study.job_dir.name}-{stamp}"))
        study.job_dir.rename(target)
        moved.append(("trial directories", str(target)))
    return moved


def _archive_shared(study: Study, stamp: str) -> str | None:
    """A study in a shared database: copied to ``NAME-archived-STAMP`` there, then deleted."""
    import optuna

    from modelyard.tuning.study import open_storage

    storage = open_storage(study.storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if study.name not in names:
        return None
    new_name = f"{study.name}-archived-{stamp}"
    if new_name in names:
        raise SpecError(f"--restart: {new_name} already exists in {study.storage}; try again in a second")
    optuna.copy_study(from_study_name=study.name, from_storage=storage, to_storage=storage, to_study_name=new_name)
    optuna.delete_study(study_name=study.name, storage=storage)
    return f"{new_name} in {study.storage.split('@')[-1]}"
