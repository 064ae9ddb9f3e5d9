"""A parsed list request (``api.list_filter``) as SQL: the WHERE clause, the ORDER BY and the page's
LIMIT/OFFSET, the same on SQLite and PostgreSQL, so a list costs one query of one page.

Each list hands ``Columns``: what each filter field is in SQL (a column, or for ``labels`` a function
of the key giving the label's value). Label values are read with SQLAlchemy's JSON index
(``json_extract`` on SQLite, ``->>`` on PostgreSQL). A comparison on a label that is absent is
false, and its ``!=`` true, so ``NOT`` behaves as a client expects (no SQL NULL logic leaks out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from sqlalchemy import and_, false, not_, or_, true
from sqlalchemy.sql import ColumnElement, Select

from modelyard.platform.api.list_filter import And, Cmp, ListRequest, Node, Not, Or


@dataclass(frozen=True)
class Columns:
    """The SQL of each filter field; ``labels(key)`` the value of one label (NULL when absent);
    ``tie`` the unique column that makes the order total (pages never repeat or skip a row)."""
    fields: Mapping[str, ColumnElement]
    labels: Callable[[str], ColumnElement] | None
    tie: ColumnElement


def like_pattern(pattern: str) -> str:
    """A Vertex wildcard (``*``) as a LIKE pattern, LIKE's own wildcards escaped (ESCAPE '\\')."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")


def _time_cmp(col: ColumnElement, op: str, t: float) -> ColumnElement:
    # Timestamps are shown to the microsecond: "=" means "within that microsecond".
    hi = t + 1e-6
    return {"=": and_(col >= t, col < hi), "!=": or_(col < t, col >= hi), "<": col < t, "<=": col < hi,
            ">": col >= hi, ">=": col >= t}[op]


def _cmp(node: Cmp, cols: Columns) -> ColumnElement:
    if node.key is not None:  # a label
        value = cols.labels(node.key)
        if node.value is None:
            return value.is_not(None)
        if node.op == "=":
            return and_(value.is_not(None), value == node.value)
        return or_(value.is_(None), value != node.value)
    col = cols.fields[node.field]
    if isinstance(node.value, float):
        return _time_cmp(col, node.op, node.value)
    if isinstance(node.value, bool):
        flag = col == (1 if node.value else 0)
        return flag if node.op == "=" else not_(flag)
    if node.op == ":":
        return col.like(like_pattern(str(node.value)), escape="\\")
    if node.op == "=":
        return col == node.value
    return col != node.value


def where(node: Node | None, cols: Columns) -> ColumnElement:
    if node is None:
        return true()
    if isinstance(node, Cmp):
        return _cmp(node, cols)
    if isinstance(node, And):
        return and_(*(where(n, cols) for n in node.items))
    if isinstance(node, Or):
        return or_(false(), *(where(n, cols) for n in node.items))
    if isinstance(node, Not):
        return not_(where(node.item, cols))
    raise TypeError(f"not a filter node: {node!r}")


def page(query: Select, request: ListRequest, cols: Columns, default_order: tuple[tuple[str, bool], ...]
         ) -> Select:
    """``query`` filtered, ordered (the request's order, else ``default_order``, then ``tie``) and cut to
    the request's page plus one row (whether another page follows)."""
    query = query.where(where(request.where, cols))
    for name, desc in request.order or default_order:
        col = cols.fields[name]
        query = query.order_by(col.desc() if desc else col.asc())
    return query.order_by(cols.tie.asc()).limit(request.size + 1).offset(request.offset)


def cut(rows: list, request: ListRequest) -> tuple[list, str | None]:
    """(the page's rows, the next page's token or None) from ``page``'s one-row-longer result."""
    if len(rows) > request.size:
        return rows[:request.size], request.next_token()
    return rows, None
