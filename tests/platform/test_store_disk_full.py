"""Which SQLite errors the store takes for a full disk (issue 43): SQLITE_FULL is one; SQLITE_IOERR is
any I/O error and counts only when the database's filesystem has no room left. A real I/O error on a
disk with room must not spend the full-disk reserve nor be reported as RESOURCE_EXHAUSTED."""
from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from modelyard.platform.state import store
from modelyard.platform.state.store import DiskFull, Reserve

SQLITE_FULL, SQLITE_IOERR, SQLITE_IOERR_WRITE, SQLITE_IOERR_SHMSIZE, SQLITE_BUSY = 13, 10, 778, 4874, 5


def sqlite_error(code: int, message: str) -> OperationalError:
    """What SQLAlchemy raises for a SQLite error with this (extended) result code."""
    orig = sqlite3.OperationalError(message)
    orig.sqlite_errorcode = code
    return OperationalError("INSERT INTO t VALUES (?)", (1,), orig)


class Writes:
    """The smallest owner of a reserve: one store write failing with ``errors`` in turn, then succeeding."""

    def __init__(self, reserve: Reserve, errors: list[OperationalError]) -> None:
        self.reserve, self.errors, self.calls = reserve, errors, 0

    @store._room_on_full
    def write(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "written"


@pytest.fixture
def reserve(tmp_path):
    r = Reserve(tmp_path / "platform.db.reserve", size=64 << 10)
    assert r.keep() and r.path.exists()
    return r


def test_sqlite_full_is_a_full_disk_whatever_the_room(tmp_path):
    assert store._disk_full(sqlite_error(SQLITE_FULL, "database or disk is full"), tmp_path)
    assert store._disk_full(sqlite_error(SQLITE_FULL, "database or disk is full"), None)


def test_an_io_error_on_a_disk_with_room_is_not_a_full_disk(tmp_path):
    for code in (SQLITE_IOERR, SQLITE_IOERR_WRITE, SQLITE_IOERR_SHMSIZE):
        assert not store._disk_full(sqlite_error(code, "disk I/O error"), tmp_path), code
    assert not store._disk_full(sqlite_error(SQLITE_IOERR_WRITE, "disk I/O error"), None)  # no file: no guess
    assert not store._disk_full(sqlite_error(SQLITE_BUSY, "database is locked"), tmp_path)
    assert not store._disk_full(OperationalError("SELECT 1", (), Exception("disk is full")), tmp_path)


def test_an_io_error_on_a_filesystem_without_room_is_a_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "_free_bytes", lambda directory: 4096)  # what statvfs says of a full disk
    assert store._disk_full(sqlite_error(SQLITE_IOERR_WRITE, "disk I/O error"), tmp_path)


@pytest.mark.parametrize("code", [SQLITE_IOERR, SQLITE_IOERR_WRITE])
def test_an_io_error_keeps_the_reserve_and_is_raised_as_it_is(reserve, code):
    w = Writes(reserve, [sqlite_error(code, "disk I/O error")])
    with pytest.raises(OperationalError) as caught:
        w.write()
    assert not isinstance(caught.value, DiskFull) and "disk I/O error" in str(caught.value)
    assert reserve.path.exists() and w.calls == 1


def test_a_full_disk_spends_the_reserve_and_the_write_is_tried_again(reserve):
    w = Writes(reserve, [sqlite_error(SQLITE_FULL, "database or disk is full")])
    assert w.write() == "written" and w.calls == 2
    assert not reserve.path.exists()
    w.errors = [sqlite_error(SQLITE_FULL, "database or disk is full")]  # no reserve left: RESOURCE_EXHAUSTED
    with pytest.raises(DiskFull) as caught:
        w.write()
    assert caught.value.status == "RESOURCE_EXHAUSTED" and "disk is full" in caught.value.message
