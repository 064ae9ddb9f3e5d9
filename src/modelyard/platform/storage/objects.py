"""Buckets and objects as directories and files under the storage root, with their metadata rows.

Every write goes to a temporary file under ``ROOT/.modelyard/tmp`` and is renamed into place only
when complete and checked, so a reader never sees half an object and an upload cut off half-way
leaves nothing; what is counted and hashed is what the kernel took (``Writer``). Preconditions are
checked and the rename and its row done under one lock (a thread lock and a file lock, so several
processes serving one root agree on generations); bucket deletes take it too. A reader opens the file
and takes the row that describes it (``open_read``), so it holds one generation however many commits
follow. Methods here block (disk, hashing): the routes run the slow ones in threads.
"""
from __future__ import annotations

import base64
import fcntl
import logging
import os
import re
import shutil
import stat
import threading
import time
import uuid
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from modelyard.platform.api.project_numbers import project_number
from modelyard.platform.storage import hashing
from modelyard.platform.storage.errors import StorageApiError, invalid, no_bucket, no_object, precondition
from modelyard.platform.storage.meta import MetaDB, Record
from modelyard.platform.storage.names import META_DIR, bucket_dir, check_bucket, object_path

log = logging.getLogger(__name__)

# Fields a client may set on an object (the rest are computed).
USER_FIELDS = ("contentType", "contentEncoding", "contentDisposition", "contentLanguage", "cacheControl",
               "metadata", "customTime", "temporaryHold", "eventBasedHold", "storageClass")
DEFAULT_POLICY_ROLES = ("roles/storage.legacyBucketOwner", "roles/storage.legacyBucketReader")


def rfc3339(t: float | None = None) -> str:
    t = time.time() if t is None else t
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(t * 1000) % 1000:03d}Z"


def check_preconditions(rec: Record | None, cond: dict[str, int], prefix: str = "if") -> None:
    """Cloud Storage's generation/metageneration preconditions (``ifGenerationMatch=0``: must not exist)."""
    gen = rec.generation if rec else 0
    if f"{prefix}GenerationMatch" in cond and cond[f"{prefix}GenerationMatch"] != gen:
        raise precondition()
    if f"{prefix}GenerationNotMatch" in cond and cond[f"{prefix}GenerationNotMatch"] == gen:
        raise StorageApiError(304, "notModified", "Not Modified")
    if f"{prefix}MetagenerationMatch" in cond and (rec is None or cond[f"{prefix}MetagenerationMatch"] != rec.metageneration):
        raise precondition()
    if f"{prefix}MetagenerationNotMatch" in cond and rec is not None and cond[f"{prefix}MetagenerationNotMatch"] == rec.metageneration:
        raise StorageApiError(304, "notModified", "Not Modified")


class Writer:
    """A new object being written: bytes go to a temporary file, hashed as they reach it.

    Only what the kernel took is counted and hashed: a short write is continued, and a write the disk
    refuses (full, or the process's file size limit) fails the request with 503 while ``hasher`` still
    describes exactly the bytes in the file. A resumable session relies on that: its offset is the file's.
    """

    def __init__(self, store: "Store", md5: bool) -> None:
        self.store = store
        self.tmp = store.tmp_dir / uuid.uuid4().hex
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.hasher = hashing.Hasher(md5=True)
        self.md5_wanted = md5  # the client sent an MD5 to check: keep it whatever the size

    @classmethod
    def resume(cls, store: "Store", path: Path, done: bool = False) -> "Writer":
        """A resumable session's writer over its file: the bytes kept so far hashed again, appended to
        from there (``done``: the session made its object already, nothing to open)."""
        w = cls.__new__(cls)
        w.store, w.tmp, w.md5_wanted, w.fd = store, path, False, -1
        w.hasher = hashing.Hasher(md5=False)
        if not done:
            w.fd = os.open(path, os.O_RDWR | os.O_APPEND)
            while chunk := os.read(w.fd, hashing.READ_CHUNK):
                w.hasher.update(chunk)
        return w

    def write(self, data: bytes | memoryview) -> None:
        while data:
            try:
                n = os.write(self.fd, data)
            except OSError as exc:
                raise disk_refused(exc, self.hasher.size) from None
            if n == len(data):
                self.hasher.update(data)
                break
            self.hasher.update(bytes(data[:n]))  # a short write: what reached the file, not what was offered
            data = data[n:]
        if not self.md5_wanted and self.hasher.size > hashing.MD5_INLINE_LIMIT:
            self.hasher.drop_md5()  # the background hasher does it once the object is in place

    def stored(self, offset: int, length: int) -> bytes:
        """Bytes already in the file (a resumable chunk sent again is compared with them)."""
        return os.pread(self.fd, length, offset)

    def finish(self) -> None:
        """Close the file, failing if it does not hold exactly the bytes counted (a write the kernel lost)."""
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size != self.hasher.size:
            raise StorageApiError(503, "backendError", f"The storage kept {size} bytes of the {self.hasher.size} "
                                  "written; nothing was stored.")

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def abort(self) -> None:
        self.close()
        self.tmp.unlink(missing_ok=True)


def disk_refused(exc: OSError, kept: int) -> StorageApiError:
    """A write the disk refused (ENOSPC, EFBIG from a file size limit, EDQUOT ...) as Cloud Storage's
    retryable 503: a resumable session then asks what is kept (``kept`` bytes) and goes on from there."""
    return StorageApiError(503, "backendError", f"The storage could not write ({os.strerror(exc.errno or 0)}); "
                           f"{kept} bytes of this upload are kept. Retry later.")


class Store:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.tmp_dir = self.root / META_DIR / "tmp"
        self.uploads_dir = self.root / META_DIR / "uploads"
        for d in (self.tmp_dir, self.uploads_dir):
            d.mkdir(parents=True, exist_ok=True)
        for stale in self.tmp_dir.iterdir():  # a write cut off by a crash of this root's last process
            if stale.stat().st_mtime < time.time() - 3600:
                stale.unlink(missing_ok=True)
        self.db = MetaDB(self.root)
        self._lock_path = self.root / META_DIR / "lock"
        self._thread_lock = threading.RLock()
        self._lock_file = None  # held (flock) while this process's lock is taken, at any depth
        self._lock_depth = 0
        self.last_activity = time.monotonic()  # the routes keep these two up to date
        self.in_flight = 0
        self._md5_queue: list[tuple[str, str, int]] = []
        self._md5_wake = threading.Event()
        threading.Thread(target=self._md5_worker, name="storage-md5", daemon=True).start()

    @contextmanager
    def locked(self):
        """The root's commit lock: between processes (flock) and between this process's threads.
        Reentrant: a commit looks the current object up (which may take it again) while holding it."""
        with self._thread_lock:
            if self._lock_depth == 0:
                f = open(self._lock_path, "a")
                fcntl.flock(f, fcntl.LOCK_EX)
                self._lock_file = f
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0:
                    f, self._lock_file = self._lock_file, None
                    fcntl.flock(f, fcntl.LOCK_UN)
                    f.close()

    # ---- buckets -------------------------------------------------------------------------------
    def bucket_path(self, bucket: str) -> Path:
        path = bucket_dir(self.root, bucket)
        if not path.is_dir():
            raise no_bucket(bucket)
        return path

    def bucket_resource(self, bucket: str) -> dict:
        path = self.bucket_path(bucket)
        row = self.db.bucket(bucket)
        created, metageneration, extra = row if row else (rfc3339(path.stat().st_mtime), 1, {})
        extra = {k: v for k, v in extra.items() if k != "iam"}
        return {"kind": "storage#bucket", "id": bucket, "name": bucket, "selfLink": f"/storage/v1/b/{bucket}",
                "projectNumber": "0", "metageneration": str(metageneration), "location": "US",
                "locationType": "multi-region", "storageClass": "STANDARD", "etag": "CAE=", "timeCreated": created,
                "updated": extra.pop("updated", created),
                "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": False},
                                     "publicAccessPrevention": "inherited"}, **extra}

    def create_bucket(self, body: dict, project: str | None = None) -> dict:
        """A new bucket; ``project`` (the request's ``?project=``) owns it: its ``projectNumber`` is that
        project's (the SDK checks it before writing a pipeline's artifacts there; "0" when none was named)."""
        bucket = check_bucket(str(body.get("name", "")))
        path = bucket_dir(self.root, bucket)
        with self.locked():
            try:
                path.mkdir()
            except FileExistsError:
                raise StorageApiError(409, "conflict", "Your previous request to create the named bucket "
                                      "succeeded and you already own it.") from None
        keep = {k: body[k] for k in ("location", "storageClass", "labels", "versioning", "lifecycle",
                                     "cors", "website", "logging", "iamConfiguration", "defaultEventBasedHold")
                if k in body}
        if "location" in keep:
            keep["location"] = str(keep["location"]).upper()
        if project:
            keep["projectNumber"] = project_number(project)
        self.db.put_bucket(bucket, rfc3339(), 1, keep)
        return self.bucket_resource(bucket)

    def list_buckets(self, prefix: str = "") -> list[dict]:
        out = []
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            if entry.name == META_DIR or entry.is_symlink() or not entry.is_dir() or not entry.name.startswith(prefix):
                continue
            try:
                out.append(self.bucket_resource(entry.name))
            except StorageApiError:  # a directory whose name is no bucket name: not a bucket
                continue
        return out

    def patch_bucket(self, bucket: str, body: dict) -> dict:
        path = self.bucket_path(bucket)
        created, metageneration, extra = self.db.bucket(bucket) or (rfc3339(path.stat().st_mtime), 1, {})
        for key in ("labels", "versioning", "lifecycle", "cors", "website", "logging", "iamConfiguration",
                    "defaultEventBasedHold", "storageClass"):
            if key in body:
                if key == "labels" and isinstance(body[key], dict):
                    labels = {**extra.get("labels", {}), **body[key]}
                    extra["labels"] = {k: v for k, v in labels.items() if v is not None}
                else:
                    extra[key] = body[key]
        extra["updated"] = rfc3339()
        self.db.put_bucket(bucket, created, metageneration + 1, extra)
        return self.bucket_resource(bucket)

    def delete_bucket(self, bucket: str) -> None:
        """Under the commit lock, so an upload either lands before (and the bucket is not empty: 409) or
        finds no bucket when it commits (404): never a 200 for an object deleted with its bucket."""
        with self.locked():
            path = self.bucket_path(bucket)
            if next(self._objects(bucket, path, "", "", "", set()), None) is not None:
                raise StorageApiError(409, "conflict", "The bucket you tried to delete is not empty.")
            shutil.rmtree(path)  # only empty directories (and folder placeholders) remain
            self.db.drop_bucket(bucket)

    def iam_policy(self, bucket: str) -> dict:
        self.bucket_path(bucket)
        row = self.db.bucket(bucket)
        policy = (row[2].get("iam") if row else None) or {
            "bindings": [{"role": role, "members": ["projectOwner:local", "projectEditor:local"]
                          if role.endswith("Owner") else ["projectViewer:local"]} for role in DEFAULT_POLICY_ROLES],
            "version": 1}
        etag = base64.b64encode(str(row[1] if row else 1).encode()).decode()
        return {"kind": "storage#policy", "resourceId": f"projects/_/buckets/{bucket}", "etag": etag, **policy}

    def set_iam_policy(self, bucket: str, body: dict) -> dict:
        path = self.bucket_path(bucket)
        created, metageneration, extra = self.db.bucket(bucket) or (rfc3339(path.stat().st_mtime), 1, {})
        bindings = body.get("bindings", [])
        if not isinstance(bindings, list) or any(not isinstance(b, dict) or "role" not in b for b in bindings):
            raise invalid("Invalid policy: 'bindings' is a list of {role, members}.")
        extra["iam"] = {"bindings": bindings, "version": int(body.get("version", 1))}
        self.db.put_bucket(bucket, created, metageneration + 1, extra)
        return self.iam_policy(bucket)

    # ---- objects: reading ----------------------------------------------------------------------
    def record(self, bucket: str, name: str) -> Record:
        """The object's row, made or refreshed when its file changed behind the API (blocking: may hash)."""
        rec, f = self.open_read(bucket, name)
        if f is not None:
            f.close()
        return rec

    def open_read(self, bucket: str, name: str):
        """(row, open file) of one generation: the file is opened first and its ``fstat`` must be the one
        the row describes (a commit renames a new file in and then writes its row, both under the lock), so
        headers and bytes always come from the same generation; the open file keeps those bytes readable
        even if the object is replaced meanwhile. A folder placeholder has no file (None)."""
        self.bucket_path(bucket)
        path = object_path(self.root, bucket, name)
        if name.endswith("/"):  # a folder placeholder: the directory exists and the row says it is an object
            rec = self.db.get(bucket, name)
            if rec is None or not path.is_dir():
                raise no_object(bucket, name)
            return rec, None
        for under_lock in (False, True):  # first without the lock (the usual case: nothing is committing)
            with self.locked() if under_lock else nullcontext():
                try:
                    f = open(path, "rb")
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    raise no_object(bucket, name) from None
                try:
                    st = os.fstat(f.fileno())
                    if not stat.S_ISREG(st.st_mode):
                        raise no_object(bucket, name)
                    rec = self.db.get(bucket, name)
                    if rec is not None and rec.matches(st):
                        return rec, f
                    if under_lock:  # the file was written behind the API: a fresh row from these very bytes
                        return self._refresh(bucket, name, f, st, rec), f
                except BaseException:
                    f.close()
                    raise
                f.close()
        raise AssertionError("unreachable")

    def _refresh(self, bucket: str, name: str, f, st, rec: Record | None) -> Record:
        """A new row for a file changed outside the API, hashed from the open file (under the lock)."""
        h = hashing.Hasher(md5=st.st_size <= hashing.MD5_INLINE_LIMIT)
        while chunk := f.read(hashing.READ_CHUNK):
            h.update(chunk)
        f.seek(0)
        generation = max(st.st_mtime_ns // 1000, (rec.generation + 1) if rec else 0)
        extra = rec.extra if rec else {}
        fresh = Record(bucket, name, generation, 1, h.size, st.st_mtime_ns, st.st_ino, h.crc32c, h.md5,
                       rfc3339(st.st_mtime), rfc3339(st.st_mtime), extra)
        self.db.put(fresh)
        if fresh.md5 is None:
            self._queue_md5(bucket, name, generation)
        return fresh

    def resource(self, rec: Record, base_url: str = "") -> dict:
        from urllib.parse import quote

        qname = quote(rec.name, safe="")
        out = {"kind": "storage#object", "id": f"{rec.bucket}/{rec.name}/{rec.generation}",
               "selfLink": f"{base_url}/storage/v1/b/{rec.bucket}/o/{qname}",
               "mediaLink": f"{base_url}/download/storage/v1/b/{rec.bucket}/o/{qname}?generation={rec.generation}&alt=media",
               "name": rec.name, "bucket": rec.bucket, "generation": str(rec.generation),
               "metageneration": str(rec.metageneration), "contentType": "application/octet-stream",
               "storageClass": "STANDARD", "size": str(rec.size), "crc32c": rec.crc32c,
               "etag": base64.b64encode(f"{rec.generation}/{rec.metageneration}".encode()).decode(),
               "timeCreated": rec.created, "updated": rec.updated, "timeStorageClassUpdated": rec.created}
        if rec.md5:
            out["md5Hash"] = rec.md5
        out.update(rec.extra)
        return out

    # ---- objects: writing ----------------------------------------------------------------------
    def writer(self, md5: bool = False) -> Writer:
        return Writer(self, md5)

    def commit(self, w: Writer, bucket: str, name: str, fields: dict, cond: dict[str, int],
               expect_crc: str | None = None, expect_md5: str | None = None, keep_on_error: bool = False) -> Record:
        """Check the written bytes against the client's checksums and the preconditions, then put the
        object in place (rename) with its row. The temporary file is gone afterwards either way, except
        after a retryable error with ``keep_on_error`` (a resumable session's bytes, kept for the retry)."""
        try:
            w.finish()
            path = object_path(self.root, bucket, name)
            if expect_crc and expect_crc != w.hasher.crc32c:
                raise invalid(f"Provided CRC32C \"{expect_crc}\" doesn't match calculated CRC32C "
                              f"\"{w.hasher.crc32c}\".")
            md5 = w.hasher.md5
            if expect_md5:
                md5 = md5 or hashing.file_md5(w.tmp)
                if expect_md5 != md5:
                    raise invalid(f"Provided MD5 hash \"{expect_md5}\" doesn't match calculated MD5 hash \"{md5}\".")
            if name.endswith("/") and w.hasher.size:
                raise invalid(f"Invalid object name: {name[:80]!r}: an object whose name ends in '/' is kept as a "
                              "directory here, so it must be empty.")
            fields = {k: v for k, v in fields.items() if k in USER_FIELDS and v is not None}
            with self.locked():
                self.bucket_path(bucket)  # inside the lock: a bucket deleted meanwhile is a 404, not recreated
                old = self._current(bucket, name)
                check_preconditions(old, cond)
                self._place(w.tmp, path, bucket, name)
                st = path.stat()
                now = time.time()
                generation = max(time.time_ns() // 1000, (old.generation + 1) if old else 0)
                rec = Record(bucket, name, generation, 1, 0 if name.endswith("/") else st.st_size, st.st_mtime_ns,
                             st.st_ino, w.hasher.crc32c, md5, rfc3339(now), rfc3339(now), fields)
                self.db.put(rec)
            if md5 is None:
                self._queue_md5(bucket, name, generation)
            return rec
        except Exception as exc:
            # A resumable session's bytes outlive an error it may retry (``keep_on_error``: a 503, a failing
            # disk); a refusal (4xx) or any other writer's error removes them.
            if not (keep_on_error and (not isinstance(exc, StorageApiError) or exc.code >= 500)):
                w.tmp.unlink(missing_ok=True)
            raise
        finally:
            w.close()

    def _current(self, bucket: str, name: str) -> Record | None:
        try:
            return self.record(bucket, name)
        except StorageApiError as exc:
            if exc.code == 404:
                return None
            raise

    def _place(self, tmp: Path, path: Path, bucket: str, name: str) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if name.endswith("/"):
                path.mkdir(exist_ok=True)
            else:
                os.replace(tmp, path)
        except (FileExistsError, NotADirectoryError, IsADirectoryError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno not in (17, 20, 21, 39):
                raise
            raise StorageApiError(409, "conflict", f"Cannot store {bucket}/{name}: objects are files here, and "
                                  "another object's name is a prefix of this one (or this one of another's "
                                  "followed by '/').") from None

    def delete(self, bucket: str, name: str, cond: dict[str, int]) -> None:
        with self.locked():
            rec = self.record(bucket, name)
            check_preconditions(rec, cond)
            path = object_path(self.root, bucket, name)
            if name.endswith("/"):
                self.db.delete(bucket, name)
                try:
                    path.rmdir()
                except OSError:
                    pass  # objects remain below it: the placeholder row is gone, the directory stays
            else:
                path.unlink()
                self.db.delete(bucket, name)
            self._prune_dirs(bucket, path.parent)

    def _prune_dirs(self, bucket: str, d: Path) -> None:
        """Remove directories left empty by a delete (not the bucket, not folder placeholders)."""
        base = self.root / bucket
        markers = None
        while d != base and base in d.parents:
            if markers is None:
                markers = self.db.folder_markers(bucket)
            if d.relative_to(base).as_posix() + "/" in markers:
                return
            try:
                d.rmdir()
            except OSError:
                return
            d = d.parent

    def patch(self, bucket: str, name: str, body: dict, cond: dict[str, int]) -> Record:
        with self.locked():
            rec = self.record(bucket, name)
            check_preconditions(rec, cond)
            for key in USER_FIELDS:
                if key in body:
                    if key == "metadata" and isinstance(body[key], dict):
                        merged = {**rec.extra.get("metadata", {}), **body[key]}
                        rec.extra["metadata"] = {k: v for k, v in merged.items() if v is not None}
                    elif body[key] is None:
                        rec.extra.pop(key, None)
                    else:
                        rec.extra[key] = body[key]
            rec.metageneration += 1
            rec.updated = rfc3339()
            self.db.put(rec)
            return rec

    def copy(self, src_bucket: str, src_name: str, bucket: str, name: str, fields: dict,
             cond: dict[str, int], src_cond: dict[str, int]) -> Record:
        """copyTo / rewriteTo: the source's bytes read from the one generation its preconditions were
        checked against (its file open, so a concurrent overwrite cannot mix in), hashed as they are
        written, and the copy stored only if that hash is the source's; metadata from the source unless
        the request body sets it."""
        src, f = self.open_read(src_bucket, src_name)
        try:
            check_preconditions(src, src_cond, prefix="ifSource")
            w = self.writer()
            try:
                while f is not None and (chunk := f.read(hashing.READ_CHUNK)):
                    w.write(chunk)
            except BaseException:
                w.abort()
                raise
        finally:
            if f is not None:
                f.close()
        md5 = src.md5
        merged = {**src.extra, **{k: v for k, v in fields.items() if k in USER_FIELDS}}
        rec = self.commit(w, bucket, name, merged, cond, expect_crc=src.crc32c)
        if md5 and rec.md5 is None:
            rec.md5 = md5
            self.db.set_md5(bucket, name, rec.generation, md5)
        return rec

    def move(self, bucket: str, src_name: str, name: str, cond: dict[str, int], src_cond: dict[str, int]) -> Record:
        """moveTo: the object renamed inside its bucket in one step (the file is renamed, never copied)."""
        with self.locked():
            src = self.record(bucket, src_name)
            check_preconditions(src, src_cond, prefix="ifSource")
            if src_name.endswith("/") or name.endswith("/"):
                raise invalid("moveTo moves objects, not folder placeholders.")
            path = object_path(self.root, bucket, name)
            old = self._current(bucket, name)
            check_preconditions(old, cond)
            src_path = object_path(self.root, bucket, src_name)
            self._place(src_path, path, bucket, name)
            st = path.stat()
            rec = Record(bucket, name, max(time.time_ns() // 1000, (old.generation + 1) if old else 0), 1, st.st_size,
                         st.st_mtime_ns, st.st_ino, src.crc32c, src.md5, src.created, rfc3339(), src.extra)
            self.db.delete(bucket, src_name)
            self.db.put(rec)
            self._prune_dirs(bucket, src_path.parent)
            return rec

    def compose(self, bucket: str, name: str, sources: list[dict], fields: dict, cond: dict[str, int]) -> Record:
        if not sources or len(sources) > 32:
            raise invalid("A compose request takes 1 to 32 sourceObjects.")
        w = self.writer()
        try:
            components = 0
            for s in sources:
                rec, f = self.open_read(bucket, str(s.get("name", "")))  # one generation per source
                if f is None:
                    raise invalid("compose takes objects, not folder placeholders.")
                with f:
                    if s.get("generation") is not None and int(s["generation"]) != rec.generation:
                        raise no_object(bucket, rec.name)
                    check_preconditions(rec, {k: int(v) for k, v in (s.get("objectPreconditions") or {}).items()
                                             if v is not None})
                    components += int(rec.extra.get("componentCount", 1))
                    while chunk := f.read(hashing.READ_CHUNK):
                        w.write(chunk)
        except BaseException:
            w.abort()
            raise
        w.hasher.drop_md5()  # composite objects have no MD5 in Cloud Storage either
        rec = self.commit(w, bucket, name, {**fields, "componentCount": components}, cond)
        return rec

    # ---- listing -------------------------------------------------------------------------------
    def list(self, bucket: str, prefix: str = "", delimiter: str = "", page_token: str = "", max_results: int = 1000,
             start_offset: str = "", end_offset: str = "", match_glob: str = "") -> tuple[list[Record], list[str], str]:
        """(objects, prefixes, next page token), in name order, ``max_results`` of both together."""
        base = self.bucket_path(bucket)
        after = base64.b64decode(page_token.encode(), altchars=b"-_", validate=True).decode() if page_token else ""
        pattern = _glob_regex(match_glob) if match_glob else None
        markers = self.db.folder_markers(bucket)
        items: list[Record] = []
        prefixes: list[str] = []
        last = ""
        for name, collapsed in self._objects(bucket, base, prefix, "/" if delimiter == "/" else "", after, markers):
            if start_offset and name < start_offset or end_offset and name >= end_offset:
                continue
            is_prefix = collapsed or bool(delimiter and delimiter in name[len(prefix):])
            item = name[:name.index(delimiter, len(prefix)) + len(delimiter)] if is_prefix and not collapsed else name
            if item <= after or (is_prefix and prefixes and prefixes[-1] == item):
                continue
            if not is_prefix and pattern is not None and not pattern.fullmatch(item):
                continue
            if len(items) + len(prefixes) >= max_results:
                return items, prefixes, base64.urlsafe_b64encode(last.encode()).decode()
            if is_prefix:
                prefixes.append(item)
            else:
                try:
                    items.append(self.record(bucket, item))
                except StorageApiError:
                    continue  # deleted meanwhile
            last = item
        return items, prefixes, ""

    def _objects(self, bucket: str, base: Path, prefix: str, slash_delim: str, after: str,
                 markers: set[str], rel: str = "") -> Iterator[tuple[str, bool]]:
        """Object names under ``base/rel`` in Cloud Storage's order (UTF-8 byte order = code point order),
        as ``(name, False)``, pruned by ``prefix`` and ``after``; with ``slash_delim`` a directory below the
        prefix is yielded as ``("dir/", True)`` (one common prefix) instead of being walked, when it holds at
        least one object."""
        try:
            entries = list(os.scandir(base / rel) if rel else os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return
        keyed = []
        for e in entries:
            try:
                is_dir = e.is_dir()
            except OSError:
                continue
            if e.is_symlink() and not _inside(e.path, base):
                continue  # never serve what a symlink points to outside the bucket
            keyed.append((rel + e.name + ("/" if is_dir else ""), is_dir, e))
        keyed.sort(key=lambda k: k[0])
        for key, is_dir, e in keyed:
            if not is_dir:
                if not e.is_file():
                    continue
                if key.startswith(prefix) and key > after:
                    yield key, False
                continue
            if not (key.startswith(prefix) or prefix.startswith(key)):
                continue
            if key <= after and not after.startswith(key):
                continue
            if slash_delim and key.startswith(prefix) and len(key) > len(prefix):
                if key in markers or next(self._objects(bucket, base, "", "", "", markers, key), None) is not None:
                    yield key, True
                continue
            if key in markers and key.startswith(prefix) and key > after:
                yield key, False
            yield from self._objects(bucket, base, prefix, slash_delim, after, markers, key)

    # ---- background MD5 ------------------------------------------------------------------------
    def _queue_md5(self, bucket: str, name: str, generation: int) -> None:
        self._md5_queue.append((bucket, name, generation))
        self._md5_wake.set()

    def _md5_worker(self) -> None:
        """MD5 of large objects after they are in place, when the API has been idle for a second and at the
        lowest CPU priority, so it never slows a transfer; ``md5Hash`` appears in the metadata when done."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except (OSError, AttributeError):
            pass
        while True:
            self._md5_wake.wait()
            self._md5_wake.clear()
            while self._md5_queue:
                idle = time.monotonic() - self.last_activity
                if self.in_flight or idle < 1.0:
                    time.sleep(max(0.2, 1.0 - idle))
                    continue
                bucket, name, generation = self._md5_queue.pop(0)
                try:
                    rec, f = self.open_read(bucket, name)  # the file of that row, not a newer one
                    with f:
                        if rec.generation != generation or rec.md5:
                            continue
                        self.db.set_md5(bucket, name, generation, hashing.fileobj_md5(f))
                except Exception as exc:  # gone or replaced meanwhile: the next look computes afresh
                    log.debug("md5 of %s/%s skipped: %s", bucket, name, exc)


def _inside(path: str, base: Path) -> bool:
    real, real_base = os.path.realpath(path), os.path.realpath(base)
    return real == real_base or real.startswith(real_base + os.sep)


def _glob_regex(glob: str) -> re.Pattern:
    """Cloud Storage's ``matchGlob``: ``**`` crosses ``/``, ``*`` and ``?`` do not, ``[...]`` and ``{a,b}``."""
    out, i = [], 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = glob.find("]", i + 1)
            if j < 0:
                raise invalid(f"Invalid matchGlob: {glob!r}")
            out.append("[" + glob[i + 1:j].replace("\\", "\\\\") + "]")
            i = j
        elif c == "{":
            j = glob.find("}", i + 1)
            if j < 0:
                raise invalid(f"Invalid matchGlob: {glob!r}")
            out.append("(?:" + "|".join(re.escape(a) for a in glob[i + 1:j].split(",")) + ")")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.S)
