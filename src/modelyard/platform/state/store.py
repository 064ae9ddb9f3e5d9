"""The registry's persistence: SQLAlchemy 2 Core over SQLite (default) or PostgreSQL.

Rows in, plain dicts out. Each public method is one transaction, so a mutation is all or nothing
(a deployed model and the traffic split that names it are written together).

A full disk must not lock the platform out of its own state (a job that filled it could then be
neither cancelled nor deleted, nor its end recorded). A SQLite store keeps a reserve file beside the
database (``RESERVE_BYTES`` of allocated blocks); a write that fails with "database or disk is full"
frees the reserve and is tried once more (``_room_on_full``: on the writes that end or remove things:
jobs, operations, replicas). The reserve comes back once the disk has room again (``keep_reserve``,
on the job runner's tick).
"""
from __future__ import annotations

import asyncio
import contextvars
import fcntl
import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import Integer, bindparam, cast, create_engine, delete, event, func, insert, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from modelyard.platform.api import aliases
from modelyard.platform.api.list_filter import ListRequest
from modelyard.platform.state import list_query as lq
from modelyard.platform.state import schema as s
from modelyard.platform.api.errors import ApiError, not_found
from modelyard.platform.api.names import DEFAULT_ALIAS, is_version_id


log = logging.getLogger(__name__)

_LEADER_LOCK_KEY = 0x6D7964  # any constant: one advisory lock per database
# Room kept for the store's own writes on a full disk: SQLite appends to its WAL and grows the database
# while it checkpoints; a few MiB take thousands of small transactions.
RESERVE_BYTES = 16 * 1024 * 1024
_SQLITE_FULL, _SQLITE_IOERR = 13, 10
# Below this much free space, an I/O error from SQLite is taken for a full disk (see _disk_full).
_NEARLY_FULL_BYTES = 1 << 20


def _free_bytes(directory: Path) -> int | None:
    """Free bytes for an unprivileged writer on ``directory``'s filesystem; None if unknown."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _disk_full(exc: OperationalError, directory: Path | None) -> bool:
    """A SQLite write refused for want of space. SQLITE_FULL is that (SQLite's own answer to ENOSPC or a
    short write). SQLITE_IOERR is any I/O error -- a bad block, EFBIG past a file-size limit, EIO -- and
    SQLite gives it for some ENOSPC paths too (growing the WAL index, preallocating): taken for a full disk
    only when the database's filesystem has (nearly) no room left. Python reports no errno, so the
    filesystem is asked; any other I/O error stays what it is, and the reserve is not spent on it."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    if code is None:
        return False
    primary = code & 0xFF  # the extended codes (SQLITE_IOERR_WRITE = 778, ...) carry the primary in the low byte
    if primary == _SQLITE_FULL:
        return True
    if primary != _SQLITE_IOERR or directory is None:
        return False
    free = _free_bytes(directory)
    return free is not None and free < _NEARLY_FULL_BYTES


class Reserve:
    """A file of ``size`` allocated bytes on the store's disk, given back when a write finds the disk full."""

    def __init__(self, path: Path | None, size: int = RESERVE_BYTES) -> None:
        self.path, self.size = path, size

    @property
    def directory(self) -> Path | None:
        """The database's directory (the reserve lives beside it); None for a store without a file."""
        return self.path.parent if self.path is not None else None

    def keep(self) -> bool:
        """Make the reserve if it is missing and the disk has room for it and as much again; True if it is there."""
        if self.path is None:
            return False
        if self.path.exists():
            return True
        try:
            st = os.statvfs(self.path.parent)
            if st.f_bavail * st.f_frsize < 2 * self.size:
                return False
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)  # blocks allocated now, not a sparse promise
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            return True
        except OSError:
            return False

    def release(self) -> bool:
        """Free the reserve; True if there was one to free."""
        if self.path is None:
            return False
        try:
            os.unlink(self.path)
            return True
        except FileNotFoundError:
            return False


class DiskFull(ApiError):
    """The store's disk is full and its reserve spent: RESOURCE_EXHAUSTED, in Google's format."""

    def __init__(self, what: str, exc: OperationalError) -> None:
        super().__init__("RESOURCE_EXHAUSTED", f"the platform's store cannot record {what}: its disk is full "
                         f"({exc.orig}); free space on it")


def _room_on_full(method):
    """A store write that, refused for a full disk, frees the reserve and is tried once more; DiskFull
    if there is no reserve left or the retry is refused too. ``use_reserve=False``: a write that may wait
    (a running job's progress) leaves the reserve to those that may not."""
    @functools.wraps(method)
    def write(self, *args, use_reserve: bool = True, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OperationalError as exc:
            if not _disk_full(exc, self.reserve.directory):
                raise
            if not use_reserve or not self.reserve.release():
                raise DiskFull(method.__name__, exc) from exc
            log.warning("the store's disk is full: freed its %d MiB reserve to record %s; it comes back once "
                        "the disk has room", self.reserve.size >> 20, method.__name__)
        try:
            return method(self, *args, **kwargs)
        except OperationalError as exc:
            if _disk_full(exc, self.reserve.directory):
                raise DiskFull(method.__name__, exc) from exc
            raise
    return write


def default_store_path() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "modelyard" / "platform.db"


def database_url(store: str | None) -> str:
    """``--store``: a PostgreSQL/SQLAlchemy URL, or a file path for SQLite (default under XDG data)."""
    if store and "://" in store:
        return store
    path = Path(store).expanduser() if store else default_store_path()
    if path.is_dir():
        path = path / "platform.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.resolve()}"


def _row(r) -> dict:
    return dict(r._mapping)


def _label(column):
    """The SQL of one label's value in a JSON ``labels`` column (NULL when the key is absent)."""
    return lambda key: column[key].as_string()


# What each list's filter fields are in SQL (api.list_filter names them; state.list_query compiles).
_MODEL_COLUMNS = lq.Columns({"display_name": s.models.c.display_name, "create_time": s.models.c.created,
                             "update_time": s.models.c.updated, "model": s.models.c.id},
                            _label(s.models.c.labels), s.models.c.id)
_VERSION_NUMBER = cast(s.model_versions.c.version_id, Integer)
# A version shows the model's labels merged with its own (its own win): a filter sees the same.
_VERSION_COLUMNS = lq.Columns({"create_time": s.model_versions.c.created,
                               "update_time": func.coalesce(s.model_versions.c.updated, s.model_versions.c.created),
                               "version_id": _VERSION_NUMBER},
                              lambda key: func.coalesce(s.model_versions.c.labels[key].as_string(),
                                                        s.models.c.labels[key].as_string()),
                              _VERSION_NUMBER)
_ENDPOINT_COLUMNS = lq.Columns({"display_name": s.endpoints.c.display_name, "create_time": s.endpoints.c.created,
                                "update_time": s.endpoints.c.updated, "endpoint": s.endpoints.c.id},
                               _label(s.endpoints.c.labels), s.endpoints.c.id)
_JOB_COLUMNS = lq.Columns({"display_name": s.jobs.c.display_name, "create_time": s.jobs.c.created,
                           "update_time": s.jobs.c.updated, "state": s.jobs.c.state, "job": s.jobs.c.id},
                          _label(s.jobs.c.labels), s.jobs.c.id)
_OPERATION_COLUMNS = lq.Columns({"done": s.operations.c.done, "create_time": s.operations.c.created},
                                None, s.operations.c.id)
_BY_CREATION = (("create_time", False),)


def _pick(rows: list[dict], model_id: str, ref: str | None) -> dict:
    """The version ``ref`` names among a model's versions: a number, an alias, or None for the default."""
    if not rows:
        raise not_found("Model", model_id)
    ref = ref or DEFAULT_ALIAS
    by_number = is_version_id(ref)
    for r in rows:
        if (r["version_id"] == ref) if by_number else (ref in (r["aliases"] or [])):
            return r
    if ref == DEFAULT_ALIAS:  # written before "default" was stored (it was implied: the highest version)
        return rows[-1]
    raise ApiError("NOT_FOUND", f"Model {model_id} has no version {'' if by_number else 'aliased '}{ref!r}: "
                   f"GET models/{model_id}:listVersions lists its versions and their aliases.")


# Statements built once, their values passed at execution: ``insert(t).values(**row)`` builds a new
# statement per call and computes its cache key from the values, four times the CPU (and GIL) of the
# write itself; endpoint creates come in thousands while predicts are served (bench/endpoints_scale.py).
_ENDPOINT_EXISTS = select(s.endpoints.c.id).where(s.endpoints.c.id == bindparam("endpoint_id"))
_INSERT_ENDPOINT = insert(s.endpoints)
_INSERT_OPERATION = insert(s.operations)


class Store:
    """The platform's state. Safe to share between threads (SQLAlchemy pools connections)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = create_engine(url, future=True)
        if self.engine.dialect.name == "sqlite":
            @event.listens_for(self.engine, "connect")
            def _sqlite_pragmas(dbapi_conn, _record) -> None:  # WAL: readers never wait for the writer
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA busy_timeout=5000")
                cur.close()
        self.migrated_from = s.migrate(self.engine)
        with self.engine.connect() as c:  # written once by the migration to v5: the same for every platform on it
            self.identity: str = c.execute(select(s.store_identity.c.id)).scalar_one()

        self._lead_conn = None  # PostgreSQL: the session holding the leader lock
        self._lead_file = None  # SQLite: the open, flock'ed lock file
        database = self.engine.url.database if self.engine.dialect.name == "sqlite" else None
        self.reserve = Reserve(Path(database + ".reserve") if database and database != ":memory:" else None)
        self.reserve.keep()
        # Writes made for the event loop run here, one at a time: SQLite takes one writer anyway, and one
        # thread (not one per request) competes with the event loop for the GIL while predicts are served.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")

    async def off_loop(self, fn, *args):
        """``fn(*args)`` (a store write) in the store's writer thread, with the caller's context; its result."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._writer, call)

    def keep_reserve(self) -> bool:
        """Make the full-disk reserve again once there is room (after a full disk used it)."""
        return self.reserve.keep()

    def try_lead(self) -> bool:
        """Become the one platform that supervises replicas for this store; True if this one is it.
        PostgreSQL: a session advisory lock (released when this process's connection dies); SQLite: an
        exclusive flock on a file beside the database (released when this process dies)."""
        if self._lead_conn is not None or self._lead_file is not None:
            return True
        if self.engine.dialect.name == "postgresql":
            conn = self.engine.connect()
            if conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _LEADER_LOCK_KEY}).scalar():
                conn.commit()
                self._lead_conn = conn
                return True
            conn.close()
            return False
        if self.engine.dialect.name == "sqlite" and self.engine.url.database:
            f = open(self.engine.url.database + ".leader", "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                return False
            self._lead_file = f
        return True

    def close(self) -> None:
        if self._lead_conn is not None:
            self._lead_conn.close()
        if self._lead_file is not None:
            self._lead_file.close()
        self._writer.shutdown(wait=True)
        self.engine.dispose()

    # ---- models and their versions ------------------------------------------------------------
    def add_model(self, model: dict, version: dict) -> None:
        """A new model and its first version; ALREADY_EXISTS if the (chosen) id is taken."""
        try:
            with self.engine.begin() as c:
                if c.execute(select(s.models.c.id).where(s.models.c.id == model["id"])).first() is not None:
                    raise ApiError("ALREADY_EXISTS", f"Model {model['id']} already exists.")
                c.execute(insert(s.models).values(**model))
                c.execute(insert(s.model_versions).values(**version))
        except IntegrityError:  # taken by a concurrent upload between the check and the insert
            raise ApiError("ALREADY_EXISTS", f"Model {model['id']} already exists.") from None

    def get_model(self, model_id: str) -> dict:
        with self.engine.connect() as c:
            row = c.execute(select(s.models).where(s.models.c.id == model_id)).first()
        if row is None:
            raise not_found("Model", model_id)
        return _row(row)

    def versions(self, model_id: str) -> list[dict]:
        """Every version of a model, oldest first."""
        with self.engine.connect() as c:
            return self._versions(c, model_id)

    @staticmethod
    def _versions(c, model_id: str, lock: bool = False) -> list[dict]:
        """``lock`` (in a transaction that changes them): the model's row is locked first, so changes to one
        model's versions and aliases never interleave on PostgreSQL (SQLite has one writer anyway)."""
        if lock:
            c.execute(select(s.models.c.id).where(s.models.c.id == model_id).with_for_update())
        rows = [_row(r) for r in c.execute(select(s.model_versions).where(s.model_versions.c.model_id == model_id))]
        return sorted(rows, key=lambda r: int(r["version_id"]))

    def get_version(self, model_id: str, ref: str | None) -> dict:
        """A version by number or alias; None -> the version holding the ``default`` alias."""
        with self.engine.connect() as c:
            return _pick(self._versions(c, model_id), model_id, ref)

    def add_version(self, version: dict) -> str:
        """A new version of an existing model, numbered next; its aliases leave the versions that held
        them (``default`` included: a version uploaded as the default takes it). Returns its number."""
        model_id = version["model_id"]
        for _ in range(5):
            try:
                with self.engine.begin() as c:
                    rows = self._versions(c, model_id, lock=True)
                    if not rows:
                        raise not_found("Model", model_id)
                    version_id = str(int(rows[-1]["version_id"]) + 1)
                    placement = aliases.place({r["version_id"]: list(r["aliases"] or []) for r in rows}, version_id,
                                              list(version["aliases"]), [])
                    self._save_aliases(c, model_id, rows, placement, version["created"])
                    c.execute(insert(s.model_versions).values(**{**version, "version_id": version_id}))
                    c.execute(update(s.models).where(s.models.c.id == model_id).values(updated=version["created"]))
                return version_id
            except IntegrityError:  # a concurrent upload took this number first: number it again
                continue
        raise ApiError("ABORTED", f"Concurrent uploads to model {model_id} kept taking the next version number: retry.")

    def version_ids(self, model_id: str) -> list[str]:
        with self.engine.connect() as c:
            return [r[0] for r in c.execute(select(s.model_versions.c.version_id)
                                            .where(s.model_versions.c.model_id == model_id))]

    def list_models(self, parent: str, request: ListRequest | None = None) -> list[dict]:
        """Every model of ``parent`` (oldest first); with ``request``, see ``models_page``."""
        if request is not None:
            return self.models_page(parent, request)[0]
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(
                select(s.models).where(s.models.c.parent == parent).order_by(s.models.c.created))]

    def _page(self, query, request: ListRequest, columns: lq.Columns,
              default_order=_BY_CREATION) -> tuple[list[dict], str | None]:
        with self.engine.connect() as c:
            rows = [_row(r) for r in c.execute(lq.page(query, request, columns, default_order))]
        return lq.cut(rows, request)

    def models_page(self, parent: str, request: ListRequest) -> tuple[list[dict], str | None]:
        """One page of ``parent``'s models the request's filter selects, in its order (filtered, ordered
        and cut by the database), and the next page's token (None on the last page)."""
        return self._page(select(s.models).where(s.models.c.parent == parent), request, _MODEL_COLUMNS)

    def default_versions(self, model_ids: list[str]) -> dict[str, dict]:
        """Each model's version that ``get_version(id, None)`` gives, for many models in one query."""
        if not model_ids:
            return {}
        with self.engine.connect() as c:
            rows = [_row(r) for r in c.execute(select(s.model_versions)
                                               .where(s.model_versions.c.model_id.in_(model_ids)))]
        by_model: dict[str, list[dict]] = {}
        for r in rows:
            by_model.setdefault(r["model_id"], []).append(r)
        return {m: _pick(sorted(vs, key=lambda r: int(r["version_id"])), m, None) for m, vs in by_model.items()}

    def versions_page(self, model_id: str, request: ListRequest) -> tuple[list[dict], str | None]:
        """One page of a model's versions (default order: by number), filtered on their merged labels."""
        query = (select(s.model_versions).join(s.models, s.models.c.id == s.model_versions.c.model_id)
                 .where(s.model_versions.c.model_id == model_id))
        return self._page(query, request, _VERSION_COLUMNS, (("version_id", False),))

    def update_model(self, model_id: str, changes: dict) -> None:
        with self.engine.begin() as c:
            c.execute(update(s.models).where(s.models.c.id == model_id).values(**changes, updated=time.time()))

    def update_version(self, model_id: str, ref: str | None, changes: dict,
                       new_aliases: list[str] | None = None, add: list[str] | None = None,
                       remove: list[str] | None = None) -> str:
        """Change one version's fields and aliases (``new_aliases``: exactly these; ``add``/``remove``:
        merged), moving aliases between versions by ``aliases``' rules, in one transaction. Returns
        the version's number."""
        now = time.time()
        with self.engine.begin() as c:
            rows = self._versions(c, model_id, lock=True)
            version_id = _pick(rows, model_id, ref)["version_id"]
            current = {r["version_id"]: list(r["aliases"] or []) for r in rows}
            if new_aliases is not None:
                current = aliases.replace(current, version_id, new_aliases)
            if add or remove:
                current = aliases.place(current, version_id, add or [], remove or [])
            self._save_aliases(c, model_id, rows, current, now)
            c.execute(update(s.model_versions).where(s.model_versions.c.model_id == model_id)
                      .where(s.model_versions.c.version_id == version_id).values(**changes, updated=now))
            c.execute(update(s.models).where(s.models.c.id == model_id).values(updated=now))
        return version_id

    @staticmethod
    def _save_aliases(c, model_id: str, rows: list[dict], placement: dict[str, list[str]], now: float) -> None:
        for r in rows:
            if placement.get(r["version_id"], []) != list(r["aliases"] or []):
                c.execute(update(s.model_versions).where(s.model_versions.c.model_id == model_id)
                          .where(s.model_versions.c.version_id == r["version_id"])
                          .values(aliases=placement[r["version_id"]], updated=now))

    def delete_version(self, model_id: str, ref: str) -> str:
        """Delete one version; refused while it is deployed, for the only version (delete the model)
        and for the default version (move ``default`` first). Returns its number."""
        with self.engine.begin() as c:
            rows = self._versions(c, model_id, lock=True)
            version = _pick(rows, model_id, ref)
            version_id = version["version_id"]
            used = c.execute(select(s.deployed_models.c.endpoint_id)
                             .where(s.deployed_models.c.model_id == model_id)
                             .where(s.deployed_models.c.version_id == version_id)).first()
            if used is not None:
                raise ApiError("FAILED_PRECONDITION", f"Model {model_id}@{version_id} is deployed to endpoint "
                               f"{used[0]}: undeploy it first.")
            if len(rows) == 1:
                raise ApiError("FAILED_PRECONDITION", f"Version {version_id} is the only version of model "
                               f"{model_id}: delete the model instead.")
            if DEFAULT_ALIAS in (version["aliases"] or []):
                raise ApiError("FAILED_PRECONDITION", f"Version {version_id} of model {model_id} holds the "
                               f"'{DEFAULT_ALIAS}' alias: give it to another version first (mergeVersionAliases).")
            c.execute(delete(s.model_versions).where(s.model_versions.c.model_id == model_id)
                      .where(s.model_versions.c.version_id == version_id))
            c.execute(update(s.models).where(s.models.c.id == model_id).values(updated=time.time()))
        return version_id

    def delete_model(self, model_id: str) -> None:
        with self.engine.begin() as c:
            if c.execute(select(s.models.c.id).where(s.models.c.id == model_id)).first() is None:
                raise not_found("Model", model_id)
            used = c.execute(select(s.deployed_models.c.endpoint_id)
                             .where(s.deployed_models.c.model_id == model_id)).first()
            if used is not None:
                raise ApiError("FAILED_PRECONDITION",
                               f"Model {model_id} is deployed to endpoint {used[0]}: undeploy it first.")
            c.execute(delete(s.model_versions).where(s.model_versions.c.model_id == model_id))
            c.execute(delete(s.models).where(s.models.c.id == model_id))

    # ---- endpoints ----------------------------------------------------------------------------
    def add_endpoint(self, endpoint: dict, operation: dict | None = None) -> None:
        """A new endpoint, with its (done) creation ``operation`` in the same transaction: one commit.
        ALREADY_EXISTS if the (chosen) id is taken."""
        try:
            with self.engine.begin() as c:
                if c.execute(_ENDPOINT_EXISTS, {"endpoint_id": endpoint["id"]}).first() is not None:
                    raise ApiError("ALREADY_EXISTS", f"Endpoint {endpoint['id']} already exists.")
                c.execute(_INSERT_ENDPOINT, endpoint)
                if operation is not None:
                    c.execute(_INSERT_OPERATION, operation)
        except IntegrityError:  # taken by a concurrent create between the check and the insert
            raise ApiError("ALREADY_EXISTS", f"Endpoint {endpoint['id']} already exists.") from None

    def get_endpoint(self, endpoint_id: str) -> dict:
        with self.engine.connect() as c:
            row = c.execute(select(s.endpoints).where(s.endpoints.c.id == endpoint_id)).first()
        if row is None:
            raise not_found("Endpoint", endpoint_id)
        return _row(row)

    def list_endpoints(self, parent: str | None = None) -> list[dict]:
        q = select(s.endpoints).order_by(s.endpoints.c.created)
        if parent is not None:
            q = q.where(s.endpoints.c.parent == parent)
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q)]

    def endpoints_page(self, parent: str, request: ListRequest) -> tuple[list[dict], str | None]:
        return self._page(select(s.endpoints).where(s.endpoints.c.parent == parent), request, _ENDPOINT_COLUMNS)

    def endpoints_changed_since(self, since: float) -> tuple[list[tuple[str, float]], int]:
        """(id, update time) of the endpoints updated at ``since`` or later, and how many endpoints there
        are, in one statement (one snapshot): what routing's sync needs to find what changed without
        reading every row."""
        count = select(func.count()).select_from(s.endpoints).scalar_subquery()
        with self.engine.connect() as c:
            rows = c.execute(select(s.endpoints.c.id, s.endpoints.c.updated, count)
                             .where(s.endpoints.c.updated >= since)).all()
            if not rows:
                return [], c.execute(select(count)).scalar_one()
        return [(r[0], r[1]) for r in rows], rows[0][2]

    def endpoints_with_deployed(self, endpoint_ids: list[str]) -> tuple[list[dict], list[dict]]:
        """The rows of these endpoints and of their deployed models, in one read."""
        with self.engine.connect() as c:
            rows = [_row(r) for r in c.execute(select(s.endpoints).where(s.endpoints.c.id.in_(endpoint_ids)))]
            dms = [_row(r) for r in c.execute(select(s.deployed_models)
                                              .where(s.deployed_models.c.endpoint_id.in_(endpoint_ids))
                                              .order_by(s.deployed_models.c.created))]
        return rows, dms

    def endpoint_with_deployed(self, endpoint_id: str) -> tuple[dict | None, list[dict]]:
        """One endpoint's row (None if gone) and its deployed models, in one transaction: what routing
        needs to follow a change of one endpoint without reading the others."""
        with self.engine.connect() as c:
            row = c.execute(select(s.endpoints).where(s.endpoints.c.id == endpoint_id)).first()
            dms = [_row(r) for r in c.execute(select(s.deployed_models)
                                              .where(s.deployed_models.c.endpoint_id == endpoint_id)
                                              .order_by(s.deployed_models.c.created))]
        return (_row(row) if row is not None else None), dms

    def delete_endpoint(self, endpoint_id: str) -> None:
        with self.engine.begin() as c:
            if c.execute(select(s.endpoints.c.id).where(s.endpoints.c.id == endpoint_id)).first() is None:
                raise not_found("Endpoint", endpoint_id)
            if c.execute(select(s.deployed_models.c.id)
                         .where(s.deployed_models.c.endpoint_id == endpoint_id)).first() is not None:
                raise ApiError("FAILED_PRECONDITION",
                               f"Endpoint {endpoint_id} has deployed models: undeploy them first.")
            c.execute(delete(s.endpoints).where(s.endpoints.c.id == endpoint_id))

    def update_endpoint(self, endpoint_id: str, changes: dict) -> None:
        with self.engine.begin() as c:
            c.execute(update(s.endpoints).where(s.endpoints.c.id == endpoint_id)
                      .values(**changes, updated=time.time()))

    def set_traffic(self, endpoint_id: str, split: dict[str, int]) -> None:
        with self.engine.begin() as c:
            c.execute(update(s.endpoints).where(s.endpoints.c.id == endpoint_id)
                      .values(traffic_split=split, updated=time.time()))

    # ---- deployed models ----------------------------------------------------------------------
    def deployed_models(self, endpoint_id: str | None = None, *, endpoint_ids: list[str] | None = None,
                        model_ids: list[str] | None = None) -> list[dict]:
        """Deployed models (oldest first): all, one endpoint's, those of ``endpoint_ids``, or those
        serving one of ``model_ids``."""
        q = select(s.deployed_models).order_by(s.deployed_models.c.created)
        if endpoint_id is not None:
            q = q.where(s.deployed_models.c.endpoint_id == endpoint_id)
        if endpoint_ids is not None:
            q = q.where(s.deployed_models.c.endpoint_id.in_(endpoint_ids))
        if model_ids is not None:
            q = q.where(s.deployed_models.c.model_id.in_(model_ids))
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q)]

    def add_deployed_model(self, dm: dict, split: dict[str, int], operation: tuple[str, dict] | None = None) -> None:
        """The deployed model and the endpoint's new split, together; with ``operation`` (its id and
        response), the deploy's operation ends done in the same transaction. An operation that is not
        pending any more (a new leader ended it) commits nothing: ABORTED."""
        with self.engine.begin() as c:
            if c.execute(select(s.endpoints.c.id).where(s.endpoints.c.id == dm["endpoint_id"])).first() is None:
                raise not_found("Endpoint", dm["endpoint_id"])
            c.execute(insert(s.deployed_models).values(**dm))
            c.execute(update(s.endpoints).where(s.endpoints.c.id == dm["endpoint_id"])
                      .values(traffic_split=split, updated=time.time()))
            if operation is not None:
                op_id, response = operation
                ended = c.execute(update(s.operations).where(s.operations.c.id == op_id)
                                  .where(s.operations.c.done == 0).values(done=1, response=response, error=None))
                if ended.rowcount != 1:  # raised inside the transaction: nothing of the deploy is written
                    raise ApiError("ABORTED", f"operation {op_id} was ended before this deploy could commit "
                                   "(the platform running it lost the lead); retry it")

    @_room_on_full
    def remove_deployed_model(self, endpoint_id: str, dm_id: str, split: dict[str, int]) -> None:
        with self.engine.begin() as c:
            c.execute(delete(s.deployed_models).where(s.deployed_models.c.id == dm_id))
            c.execute(update(s.endpoints).where(s.endpoints.c.id == endpoint_id)
                      .values(traffic_split=split, updated=time.time()))

    # ---- replicas -----------------------------------------------------------------------------
    def add_replica(self, replica: dict) -> None:
        with self.engine.begin() as c:
            c.execute(insert(s.replicas).values(**replica))

    @_room_on_full
    def remove_replica(self, replica_id: str) -> None:
        with self.engine.begin() as c:
            c.execute(delete(s.replicas).where(s.replicas.c.id == replica_id))

    def replicas(self, dm_id: str | None = None) -> list[dict]:
        q = select(s.replicas).order_by(s.replicas.c.created)
        if dm_id is not None:
            q = q.where(s.replicas.c.deployed_model_id == dm_id)
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q)]

    # ---- operations ---------------------------------------------------------------------------
    @_room_on_full
    def add_operation(self, op: dict) -> None:
        with self.engine.begin() as c:
            c.execute(insert(s.operations).values(**op))

    @_room_on_full
    def finish_operation(self, op_id: str, response: dict | None, error: dict | None) -> None:
        with self.engine.begin() as c:
            c.execute(update(s.operations).where(s.operations.c.id == op_id)
                      .values(done=1, response=response, error=error))

    def get_operation(self, op_id: str) -> dict:
        with self.engine.connect() as c:
            row = c.execute(select(s.operations).where(s.operations.c.id == op_id)).first()
        if row is None:
            raise not_found("Operation", op_id)
        return _row(row)

    def operations_page(self, name_prefix: str, request: ListRequest) -> tuple[list[dict], str | None]:
        """One page of the operations whose names start with ``name_prefix`` (a location's or a resource's)."""
        pattern = lq.like_pattern(name_prefix) + "%"
        return self._page(select(s.operations).where(s.operations.c.name.like(pattern, escape="\\")),
                          request, _OPERATION_COLUMNS)

    def pending_operations(self) -> list[dict]:
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(select(s.operations).where(s.operations.c.done == 0))]

    # ---- jobs (batch prediction, custom, tuning) ----------------------------------------------
    def add_job(self, job: dict) -> None:
        with self.engine.begin() as c:
            c.execute(insert(s.jobs).values(**job))

    def get_job(self, job_id: str, kind: str | None = None) -> dict:
        with self.engine.connect() as c:
            row = c.execute(select(s.jobs).where(s.jobs.c.id == job_id)).first()
        if row is None or (kind is not None and row.kind != kind):
            raise not_found("Job", job_id)
        return _row(row)

    def list_jobs(self, parent: str | None = None, kind: str | None = None,
                  states: tuple[str, ...] | None = None) -> list[dict]:
        q = select(s.jobs).order_by(s.jobs.c.created)
        if parent is not None:
            q = q.where(s.jobs.c.parent == parent)
        if kind is not None:
            q = q.where(s.jobs.c.kind == kind)
        if states is not None:
            q = q.where(s.jobs.c.state.in_(states))
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q)]

    def jobs_page(self, parent: str, kind: str, request: ListRequest) -> tuple[list[dict], str | None]:
        return self._page(select(s.jobs).where(s.jobs.c.parent == parent).where(s.jobs.c.kind == kind),
                          request, _JOB_COLUMNS)

    @_room_on_full
    def update_job(self, job_id: str, from_states: tuple[str, ...] | None = None, **values) -> bool:
        """Change a job; with ``from_states``, only if it is in one of them (a compare-and-set, so the
        runner and a cancel request never overwrite each other). True if the row changed."""
        q = update(s.jobs).where(s.jobs.c.id == job_id)
        if from_states is not None:
            q = q.where(s.jobs.c.state.in_(from_states))
        with self.engine.begin() as c:
            return c.execute(q.values(**values, updated=time.time())).rowcount > 0

    @_room_on_full
    def delete_job(self, job_id: str, from_states: tuple[str, ...]) -> bool:
        with self.engine.begin() as c:
            return c.execute(delete(s.jobs).where(s.jobs.c.id == job_id)
                             .where(s.jobs.c.state.in_(from_states))).rowcount > 0
