"""The platform's state is its user's alone: the state directory 0700, the SQLite store 0600, and every
file or directory the platform and its children create afterwards private too (umask 077).

The state directory holds the store's neighbours (replica directories with their bearer secrets, logs,
copies of artifacts, job work directories, the storage's objects by default); the store holds the
registry. Other users of the host must read none of them, as PostgreSQL requires of its data directory.
SQLite creates its journal and WAL files with the database file's own mode, so the store's file is made
0600 before SQLAlchemy first opens it.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
SQLITE_PREFIX = "sqlite:///"
_SQLITE_SIDE_FILES = ("", "-journal", "-wal", "-shm")


class SharedStateDir(ValueError):
    """The state directory named is one that other users share (``/tmp`` and the like)."""


def make_private(state_dir: Path, store_url: str) -> None:
    """Create (or tighten) ``state_dir`` as 0700 and the SQLite file of ``store_url`` as 0600, and set this
    process's umask so that what it and its children create later is private as well.

    A directory others may write into (world-writable or sticky, as ``/tmp`` is) is refused with
    :class:`SharedStateDir` rather than tightened: taking it private would lock every other user out of it."""
    if state_dir.is_dir():
        mode = state_dir.stat().st_mode
        if mode & (stat.S_IWOTH | stat.S_ISVTX):
            raise SharedStateDir(
                f"state directory {state_dir} is shared with other users (mode {stat.S_IMODE(mode):o}); "
                f"name a directory of the platform's own, e.g. --state-dir {state_dir / 'modelyard-platform'}")
    os.umask(PRIVATE_UMASK)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state_dir, 0o700)  # an existing directory (an older platform's) is tightened too
    if store_url.startswith(SQLITE_PREFIX):
        db = Path(store_url[len(SQLITE_PREFIX):])
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))  # before SQLAlchemy creates it with 0644
        for suffix in _SQLITE_SIDE_FILES:
            try:
                os.chmod(f"{db}{suffix}", 0o600)
            except FileNotFoundError:
                pass
