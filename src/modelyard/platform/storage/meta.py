"""What a file cannot hold, kept in SQLite at ``ROOT/.modelyard/meta.db``: each object's generation,
checksums and metadata, each bucket's settings and IAM policy, and resumable upload sessions.

The files are the truth for what exists: a row whose file is gone is ignored, and a file that was
written behind the API's back (a job writing ``/gcs/...``, a user copying into the root) gets a
fresh row the next time it is looked at (``Record.matches`` compares size, mtime and inode). Several
processes may serve one root (WAL mode, a busy timeout).
"""
from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
  bucket TEXT NOT NULL, name TEXT NOT NULL, generation INTEGER NOT NULL, metageneration INTEGER NOT NULL,
  size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ino INTEGER NOT NULL, crc32c TEXT NOT NULL, md5 TEXT,
  created TEXT NOT NULL, updated TEXT NOT NULL, extra TEXT NOT NULL, PRIMARY KEY (bucket, name));
CREATE TABLE IF NOT EXISTS buckets (
  name TEXT PRIMARY KEY, created TEXT NOT NULL, metageneration INTEGER NOT NULL, extra TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS uploads (
  id TEXT PRIMARY KEY, bucket TEXT NOT NULL, name TEXT NOT NULL, created REAL NOT NULL, extra TEXT NOT NULL);
"""


@dataclass
class Record:
    """One object's row. ``extra`` holds the user-settable fields (contentType, metadata, ...)."""
    bucket: str
    name: str
    generation: int
    metageneration: int
    size: int
    mtime_ns: int
    ino: int
    crc32c: str
    md5: str | None
    created: str
    updated: str
    extra: dict = field(default_factory=dict)

    def matches(self, st) -> bool:
        """Whether the file (its ``os.stat``) is still the one this row describes."""
        return (self.size, self.mtime_ns, self.ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


class MetaDB:
    def __init__(self, root: Path) -> None:
        self.path = root / ".modelyard" / "meta.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._db() as db:
            db.executescript(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:  # one connection per thread: the event loop's and the background hasher's
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
        return db

    # objects
    def get(self, bucket: str, name: str) -> Record | None:
        row = self._db().execute("SELECT * FROM objects WHERE bucket=? AND name=?", (bucket, name)).fetchone()
        if row is None:
            return None
        return Record(*row[:11], extra=json.loads(row[11]))

    def put(self, r: Record) -> None:
        self._db().execute("INSERT OR REPLACE INTO objects VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                           (r.bucket, r.name, r.generation, r.metageneration, r.size, r.mtime_ns, r.ino, r.crc32c,
                            r.md5, r.created, r.updated, json.dumps(r.extra)))

    def set_md5(self, bucket: str, name: str, generation: int, md5: str) -> None:
        self._db().execute("UPDATE objects SET md5=? WHERE bucket=? AND name=? AND generation=?",
                           (md5, bucket, name, generation))

    def delete(self, bucket: str, name: str) -> None:
        self._db().execute("DELETE FROM objects WHERE bucket=? AND name=?", (bucket, name))

    def drop_bucket(self, bucket: str) -> None:
        db = self._db()
        db.execute("DELETE FROM objects WHERE bucket=?", (bucket,))
        db.execute("DELETE FROM buckets WHERE name=?", (bucket,))

    def folder_markers(self, bucket: str) -> set[str]:
        """Names of the ``dir/`` placeholder objects (the directory is on disk, the row says it is an object)."""
        return {r[0] for r in self._db().execute(
            "SELECT name FROM objects WHERE bucket=? AND name LIKE '%/'", (bucket,))}

    # buckets
    def bucket(self, name: str) -> tuple[str, int, dict] | None:
        row = self._db().execute("SELECT created, metageneration, extra FROM buckets WHERE name=?", (name,)).fetchone()
        return (row[0], row[1], json.loads(row[2])) if row else None

    def put_bucket(self, name: str, created: str, metageneration: int, extra: dict) -> None:
        self._db().execute("INSERT OR REPLACE INTO buckets VALUES (?,?,?,?)",
                           (name, created, metageneration, json.dumps(extra)))

    # resumable upload sessions
    def add_upload(self, upload_id: str, bucket: str, name: str, created: float, extra: dict) -> None:
        self._db().execute("INSERT INTO uploads VALUES (?,?,?,?,?)", (upload_id, bucket, name, created, json.dumps(extra)))

    def upload(self, upload_id: str) -> tuple[str, str, float, dict] | None:
        row = self._db().execute("SELECT bucket, name, created, extra FROM uploads WHERE id=?", (upload_id,)).fetchone()
        return (row[0], row[1], row[2], json.loads(row[3])) if row else None

    def update_upload(self, upload_id: str, extra: dict) -> None:
        """A session's state in one statement (a crash leaves the old row or the new one, never none)."""
        self._db().execute("UPDATE uploads SET extra=? WHERE id=?", (json.dumps(extra), upload_id))

    def drop_upload(self, upload_id: str) -> None:
        self._db().execute("DELETE FROM uploads WHERE id=?", (upload_id,))

    def uploads_before(self, cutoff: float) -> list[str]:
        return [r[0] for r in self._db().execute("SELECT id FROM uploads WHERE created < ?", (cutoff,))]
