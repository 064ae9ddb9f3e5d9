"""Resumable upload sessions (``uploadType=resumable``): a session id, then ``PUT``s of chunks with
``Content-Range`` answered by ``308 Resume Incomplete`` and a ``Range`` header of what is kept, until
the last chunk makes the object.

A session's bytes are a file under ``ROOT/.modelyard/uploads`` and its request (bucket, name,
metadata, preconditions) a row, so a session outlives a restart of the server; the running CRC32C is
kept in memory and recomputed from the file when missing. Sessions expire after a week, as Cloud
Storage's do.
"""
from __future__ import annotations

import asyncio
import re
import time
import uuid
import weakref

from modelyard.platform.storage.errors import StorageApiError, invalid
from modelyard.platform.storage.names import object_path
from modelyard.platform.storage.objects import Store, Writer

SESSION_LIFETIME_S = 7 * 24 * 3600
_RANGE = re.compile(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)$")


class Session:
    def __init__(self, upload_id: str, bucket: str, name: str, extra: dict, writer: Writer) -> None:
        self.id = upload_id
        self.bucket = bucket
        self.name = name
        self.extra = extra  # {"fields", "cond", "total"?, "done"?}
        self.writer = writer

    @property
    def persisted(self) -> int:
        return self.writer.hasher.size


class Uploads:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._open: dict[str, Session] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        for old in store.db.uploads_before(time.time() - SESSION_LIFETIME_S):
            self._forget(old)

    def start(self, bucket: str, name: str, fields: dict, cond: dict[str, int], total: int | None) -> str:
        self.store.bucket_path(bucket)
        object_path(self.store.root, bucket, name)  # a bad name fails now, not after the bytes
        upload_id = uuid.uuid4().hex
        (self.store.uploads_dir / upload_id).touch()
        self.store.db.add_upload(upload_id, bucket, name, time.time(),
                                 {"fields": fields, "cond": cond, "total": total})
        return upload_id

    def lock(self, upload_id: str) -> asyncio.Lock:
        """The session's lock (the routes hold it for a whole chunk request); kept while anyone holds or waits."""
        lock = self._locks.get(upload_id)
        if lock is None:
            lock = self._locks[upload_id] = asyncio.Lock()
        return lock

    def session(self, upload_id: str) -> Session:
        s = self._open.get(upload_id)
        if s is not None:
            return s
        row = self.store.db.upload(upload_id)
        if row is None or not re.fullmatch(r"[0-9a-f]{32}", upload_id):
            raise StorageApiError(404, "notFound", f"No such upload session: {upload_id}")
        bucket, name, _created, extra = row
        path = self.store.uploads_dir / upload_id
        if not extra.get("done") and not path.exists():
            if not extra.get("finishing"):  # its bytes are gone (removed by hand): nothing to resume
                self._forget(upload_id)
                raise StorageApiError(404, "notFound", f"No such upload session: {upload_id}")
            # The process stopped after the session's file became the object and before the row said so:
            # the upload is complete, and the session answers with the object as a finished one does.
            extra["done"] = [bucket, name, None]
        w = Writer.resume(self.store, path, done=bool(extra.get("done")))
        s = Session(upload_id, bucket, name, extra, w)
        self._open[upload_id] = s
        return s

    @staticmethod
    def parse_range(header: str | None) -> tuple[int | None, int | None, int | None]:
        """``Content-Range`` of a chunk -> (first, last, total); None where ``*`` (or no header: one whole body)."""
        if not header:
            return 0, None, None
        m = _RANGE.match(header.strip())
        if not m:
            raise invalid(f"Invalid Content-Range: {header!r}")
        first = int(m.group(1)) if m.group(1) is not None else None
        last = int(m.group(2)) if m.group(2) is not None else None
        total = int(m.group(3)) if m.group(3) != "*" else None
        if first is not None and last < first:
            raise invalid(f"Invalid Content-Range: {header!r}")
        return first, last, total

    def finish(self, s: Session, expect_crc: str | None, expect_md5: str | None):
        """Make the object from the session's bytes; the session then answers with that object. The row says
        "finishing" before the file is renamed into place and "done" after, each in one statement, so a
        crash at any point leaves a session that either resumes (its file is there) or is complete."""
        self.store.db.update_upload(s.id, {**s.extra, "finishing": True})
        try:
            rec = self.store.commit(s.writer, s.bucket, s.name, s.extra.get("fields", {}), s.extra.get("cond", {}),
                                    expect_crc, expect_md5, keep_on_error=True)
        except Exception:
            self._open.pop(s.id, None)  # the next request reads it again: its file to resume, or its object
            raise
        s.extra["done"] = [rec.bucket, rec.name, rec.generation]
        # Known here as done even if its row cannot say so (a full disk); forgotten once the row says it.
        self._open[s.id] = Session(s.id, s.bucket, s.name, s.extra, Writer.resume(self.store, s.writer.tmp, done=True))
        self.store.db.update_upload(s.id, s.extra)
        self._open.pop(s.id, None)
        return rec

    def fail(self, s: Session) -> None:
        """A session whose object was refused (checksum, precondition): its bytes are gone (commit removed them)."""
        self._forget(s.id)

    def cancel(self, upload_id: str) -> None:
        self.session(upload_id)
        self._forget(upload_id)

    def _forget(self, upload_id: str) -> None:
        s = self._open.pop(upload_id, None)
        if s is not None:
            s.writer.close()
        (self.store.uploads_dir / upload_id).unlink(missing_ok=True)
        self.store.db.drop_upload(upload_id)
