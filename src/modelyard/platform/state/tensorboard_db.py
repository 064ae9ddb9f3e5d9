"""The TensorBoard API's persistence (``metadata_schema``'s tb_* tables): tensorboards, their
experiments, runs and time series (one generic set of methods over the four, keyed by the ids
of the path), and the time series' points. Deleting a resource deletes what is below it."""
from __future__ import annotations

import functools
import time
from typing import Iterable

from sqlalchemy import Integer, Table, and_, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from modelyard.platform.api.errors import ApiError
from modelyard.platform.state import metadata_schema as m

# level -> (table, the key columns naming a row, its singular for messages)
LEVELS: dict[str, tuple[Table, tuple[str, ...], str]] = {
    "tensorboards": (m.tb_tensorboards, ("id",), "Tensorboard"),
    "experiments": (m.tb_experiments, ("tensorboard_id", "id"), "TensorboardExperiment"),
    "runs": (m.tb_runs, ("tensorboard_id", "experiment_id", "id"), "TensorboardRun"),
    "timeSeries": (m.tb_series, ("tensorboard_id", "experiment_id", "run_id", "id"), "TensorboardTimeSeries"),
}
_BELOW = {"tensorboards": ("experiments", "runs", "timeSeries"), "experiments": ("runs", "timeSeries"),
          "runs": ("timeSeries",), "timeSeries": ()}
_PARENT_KEY = {"tensorboards": "tensorboard_id", "experiments": "experiment_id", "runs": "run_id"}


def _row(r) -> dict:
    return dict(r._mapping)


def _where(table: Table, keys: dict):
    return and_(*(table.c[k] == v for k, v in keys.items()))


@functools.cache
def _select(level: str, columns: tuple[str, ...], ordered: bool = False):
    """SELECT of a level's rows by ``columns`` (bind parameters named after them), built once: the reads
    of every TensorBoard request, whose building cost more than their running."""
    table = LEVELS[level][0]
    q = select(table).where(and_(*(table.c[k] == bindparam(k) for k in columns)))
    return q.order_by(table.c.created, table.c.id) if ordered else q


@functools.cache
def _stats_query():
    p = m.tb_points
    return (select(p.c.series_id, func.max(p.c.step), func.max(p.c.wall_time))
            .where(p.c.series_id.in_(bindparam("ids", expanding=True))).group_by(p.c.series_id))


@functools.cache
def _points_query(kind: str):
    """The points query (``all``; ``last``: each series' last point; ``spread``: at most ``:limit`` of each,
    evenly spread), built once with bind parameters: building it per read cost more than running it."""
    p = m.tb_points
    cols = (p.c.series_id, p.c.step, p.c.wall_time, p.c.scalar, p.c.tensor, p.c.blobs)
    ids = bindparam("ids", expanding=True)
    if kind == "all":
        return select(*cols).where(p.c.series_id.in_(ids)).order_by(p.c.series_id, p.c.step, p.c.seq)
    # The rows are ranked on the index's columns alone (series, step, and seq: the rowid), then only
    # the chosen ones are read whole.
    rank = (func.row_number().over(partition_by=p.c.series_id, order_by=(p.c.step, p.c.seq)) - 1).label("rn")
    size = func.count().over(partition_by=p.c.series_id).label("n")
    lean = select(p.c.seq, rank, size).where(p.c.series_id.in_(ids)).subquery()
    rn, n = lean.c.rn, lean.c.n
    if kind == "last":
        keep = rn == n - 1
    else:  # rn starts a new one of ``limit`` equal buckets of [0, n-1]: the first and last rows, and limit-2 between
        limit = bindparam("limit", type_=Integer)
        keep = or_(n <= limit, rn == 0, (rn * (limit - 1)) // (n - 1) > ((rn - 1) * (limit - 1)) // (n - 1))
    return select(*cols).where(p.c.seq.in_(select(lean.c.seq).where(keep))).order_by(p.c.series_id, p.c.step, p.c.seq)


class TensorboardDB:
    """TensorBoard resources and points over the platform's engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, level: str, row: dict) -> None:
        table, key_cols, what = LEVELS[level]
        try:
            with self.engine.begin() as c:
                c.execute(insert(table).values(**row))
        except IntegrityError:
            raise ApiError("ALREADY_EXISTS", f"{what} {row['id']} already exists.") from None

    def get(self, level: str, keys: dict) -> dict:
        table, _, what = LEVELS[level]
        with self.engine.connect() as c:
            row = c.execute(_select(level, tuple(keys)), keys).first()
        if row is None:
            raise ApiError("NOT_FOUND", f"{what} {'/'.join(keys.values())} is not found.")
        return _row(row)

    def get_many(self, level: str, keys: list[dict]) -> list[dict]:
        """The rows of ``keys`` (each as ``get`` takes it), in their order, in one query; NOT_FOUND naming
        the first missing one."""
        table, _, what = LEVELS[level]
        if not keys:
            return []
        with self.engine.connect() as c:
            found = [_row(r) for r in c.execute(select(table).where(or_(*(_where(table, k) for k in keys))))]
        out = []
        for k in keys:
            row = next((r for r in found if all(r[col] == v for col, v in k.items())), None)
            if row is None:
                raise ApiError("NOT_FOUND", f"{what} {'/'.join(k.values())} is not found.")
            out.append(row)
        return out

    def list(self, level: str, keys: dict, parent: str | None = None) -> list[dict]:
        """Rows below the parent ``keys`` (``parent`` for tensorboards), oldest first. ``parent``: the
        level of the row ``keys`` names, checked to exist in the same connection (NOT_FOUND)."""
        with self.engine.connect() as c:
            if parent is not None:
                above, key_cols, what = LEVELS[parent]
                # ``keys`` names the parent with its level's column names below (run_id for a run's id...).
                own = {col: keys[_PARENT_KEY.get(parent) if col == "id" else col] for col in key_cols}
                if c.execute(_select(parent, tuple(own)), own).first() is None:
                    raise ApiError("NOT_FOUND", f"{what} {'/'.join(own.values())} is not found.")
            return [_row(r) for r in c.execute(_select(level, tuple(keys), ordered=True), keys)]

    def update(self, level: str, keys: dict, changes: dict) -> dict:
        table = LEVELS[level][0]
        current = self.get(level, keys)
        values = {**changes, "etag": current["etag"] + 1, "updated": time.time()}
        with self.engine.begin() as c:
            c.execute(update(table).where(_where(table, keys)).values(**values))
        return {**current, **values}

    def delete(self, level: str, keys: dict) -> None:
        """The resource, what is below it, and the points of every time series among them."""
        self.get(level, keys)
        ids = {_PARENT_KEY.get(level, "id"): keys["id"],
               **{k: v for k, v in keys.items() if k != "id"}}
        with self.engine.begin() as c:
            series = m.tb_series
            if level == "timeSeries":
                doomed = select(series.c.id).where(series.c.id == keys["id"])
            else:
                doomed = select(series.c.id).where(_where(series, ids))
            c.execute(delete(m.tb_points).where(m.tb_points.c.series_id.in_(doomed)))
            for below in _BELOW[level]:
                table = LEVELS[below][0]
                c.execute(delete(table).where(_where(table, ids)))
            table = LEVELS[level][0]
            c.execute(delete(table).where(_where(table, keys)))

    def count(self, level: str, keys: dict) -> int:
        table = LEVELS[level][0]
        with self.engine.connect() as c:
            return c.execute(select(func.count()).select_from(table).where(_where(table, keys))).scalar_one()

    # ---- points ---------------------------------------------------------------------------------
    def add_points(self, rows: list[dict]) -> None:
        """Points of any time series, in one transaction (a write request is all or nothing)."""
        if rows:
            with self.engine.begin() as c:
                c.execute(insert(m.tb_points), rows)

    def points(self, series_ids: Iterable[str], limit: int | None = None) -> dict[str, list[dict]]:
        """series id -> its points, by step then by write order; with ``limit``, at most that many of
        each series, evenly spread over it (its first and last kept), chosen by the database so that a
        long series is never loaded whole."""
        ids = sorted(set(series_ids))
        out: dict[str, list[dict]] = {i: [] for i in ids}
        if not ids:
            return out
        kind = "all" if limit is None else "last" if limit <= 1 else "spread"
        with self.engine.connect() as c:
            for r in c.execute(_points_query(kind), {"ids": ids, **({"limit": limit} if kind == "spread" else {})}):
                out[r.series_id].append(_row(r))
        return out

    def series_stats(self, series_ids: Iterable[str]) -> dict[str, tuple[int, float]]:
        """series id -> (its largest step, its latest wall time), for those with points."""
        ids = sorted(set(series_ids))
        if not ids:
            return {}
        with self.engine.connect() as c:
            return {r[0]: (r[1], r[2]) for r in c.execute(_stats_query(), {"ids": ids})}
