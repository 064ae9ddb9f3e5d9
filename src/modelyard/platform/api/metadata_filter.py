"""Vertex ML Metadata's list filters (artifacts, contexts, executions, purges, lineage queries) and the
TensorBoard API's: the fields each list takes, over the platform's one filter grammar (``api/list_filter``,
AIP-160), and ``matches``, which evaluates a parsed filter against a row for what the store cannot select in
SQL (``state/metadata_db`` selects by the columns; values inside ``metadata`` and relations are read here).

    display_name="a" AND schema_title="system.Model" AND uri="gs://b/m"
    state=LIVE  create_time>"2024-01-01T00:00:00Z"  labels.team="ml"  labels:team
    metadata.accuracy.number_value>0.5  metadata.framework.string_value="tf"  metadata.flag.bool_value=true
    metadata.framework="tf"  metadata.framework:*
    in_context("projects/p/locations/l/metadataStores/default/contexts/c")   (artifacts, executions)
    parent_contexts:"projects/.../contexts/a","projects/.../contexts/b"       (contexts: any of them)
    child_contexts:"projects/.../contexts/c"                                  (contexts)

combined with AND, OR (binding tighter, as AIP-160 has it), NOT / ``-`` and parentheses, at most
``MAX_DEPTH`` levels deep as Vertex allows. Anything else is INVALID_ARGUMENT: an ignored filter
would hand a purge every node of the store.
"""
from __future__ import annotations

import re
from typing import Callable

from modelyard.platform.api import list_filter as lf
from modelyard.platform.api.list_filter import And, Cmp, Field, Node, Not, Or

MAX_DEPTH = 5
TIME_FIELDS = ("create_time", "update_time")
_EXAMPLE = ('schema_title="system.Model" AND metadata.accuracy.number_value>0.5 '
            'AND in_context("projects/p/locations/l/metadataStores/default/contexts/c")')
_S, _T = Field(lf.STRING), Field(lf.TIME)
_COMMON = {"display_name": _S, "schema_title": _S, "schema_version": _S, "description": _S, "name": _S,
           "create_time": _T, "update_time": _T, "labels": Field(lf.LABELS), "metadata": Field(lf.METADATA)}
_NOT_FOR_CONTEXTS = "in_context() filters artifacts and executions, not contexts"
FIELDS = {
    "artifacts": {**_COMMON, "uri": _S, "state": _S, "in_context": Field(lf.CALL)},
    "executions": {**_COMMON, "state": _S, "in_context": Field(lf.CALL)},
    "contexts": {**_COMMON, "parent_contexts": Field(lf.RELATION), "child_contexts": Field(lf.RELATION),
                 "in_context": Field(lf.CALL, refused=_NOT_FOR_CONTEXTS)},
}
# The TensorBoard API's lists (rows hold their fields as text).
_TB = {"display_name": _S, "description": _S, "name": _S, "create_time": _T, "update_time": _T,
       "labels": Field(lf.LABELS)}
FIELDS.update({"tensorboards": {**_TB, "is_default": _S}, "experiments": {**_TB, "source": _S}, "runs": _TB,
               "timeSeries": {**_TB, "value_type": _S, "plugin_name": _S}})
# What the store can select in SQL: a node row's columns (``state/metadata_db.Columns`` maps them).
COLUMN_FIELDS = ("display_name", "schema_title", "schema_version", "description", "uri", "state", "create_time",
                 "update_time", "labels")


def parse(text: str | None, kind: str) -> Node | None:
    """The filter's tree for a list of ``kind`` (artifacts | contexts | executions, or a TensorBoard
    collection: tensorboards | experiments | runs | timeSeries); None: no filter."""
    return lf.parse_filter(text, FIELDS[kind], kind, MAX_DEPTH, _EXAMPLE)


def parse_time(text: str, whole: str) -> float:
    """An RFC 3339 timestamp -> epoch seconds (INVALID_ARGUMENT naming ``whole`` otherwise)."""
    return lf.parse_time(text, whole)


def relations_used(node: Node | None) -> set[str]:
    """Which relations (in_context, parent_contexts, child_contexts) a filter needs looked up."""
    if node is None:
        return set()
    if isinstance(node, Cmp):
        return {node.field} if node.values else set()
    if isinstance(node, Not):
        return relations_used(node.item)
    return set().union(*(relations_used(i) for i in node.items))


def top_titles(node: Node | None) -> set[str] | None:
    """The schema titles a filter requires whatever else it says (``schema_title="x"`` at its top, or an
    OR of them), so the store can select by its index first; None if it names none that way."""
    if isinstance(node, Cmp) and node.field == "schema_title" and node.op == "=":
        return {str(node.value)}
    if isinstance(node, Or):
        parts = [top_titles(i) for i in node.items]
        return None if any(p is None for p in parts) else set().union(*parts)
    if isinstance(node, And):
        for item in node.items:
            found = top_titles(item)
            if found is not None:
                return found
    return None


def top_contexts(node: Node | None) -> set[str] | None:
    """The context names an ``in_context(...)`` at the filter's top requires (the node is in one of
    them whatever else the filter says), so the store can select the contexts' members first; None if
    it has none there."""
    if isinstance(node, Cmp) and node.field == "in_context":
        return set(node.values)
    if isinstance(node, And):
        for item in node.items:
            found = top_contexts(item)
            if found is not None:
                return found
    return None


def in_columns(node: Node) -> bool:
    """Whether the store can evaluate ``node`` on a node row's columns alone (no metadata value, no relation)."""
    if isinstance(node, Cmp):
        return node.field in COLUMN_FIELDS
    if isinstance(node, Not):
        return in_columns(node.item)
    return all(in_columns(i) for i in node.items)


def metadata_text_equality(node: Node) -> bool:
    """``metadata.KEY="text"`` (or ``.string_value``): the store can select it by the JSON value's text. Only
    as a pre-selection the rows are then checked against (a number stored as text would pass it too), so
    never under NOT or OR."""
    return isinstance(node, Cmp) and node.field == "metadata" and node.op == "=" and isinstance(node.value, str)


def column_part(node: Node | None) -> Node | None:
    """What of a filter every match must pass and the store can select in SQL: the whole filter if it can,
    else the AND of its top-level parts that can (columns, labels, a metadata value's text); None if nothing."""
    if node is None:
        return None
    if in_columns(node) or metadata_text_equality(node):
        return node
    if isinstance(node, And):
        parts = tuple(i for i in node.items if in_columns(i) or metadata_text_equality(i))
        return None if not parts else parts[0] if len(parts) == 1 else And(parts)
    return None


def _compare(have: object, op: str, want: object) -> bool:
    if have is None:
        return op == "!="
    if isinstance(want, bool) or isinstance(have, bool):
        if not (isinstance(want, bool) and isinstance(have, bool)):
            return op == "!="
    elif isinstance(want, float):
        if not isinstance(have, (int, float)):
            return op == "!="
    else:
        have = have if isinstance(have, str) else str(have)
    if op == ":":  # a wildcard match, as list_query's LIKE
        return isinstance(have, str) and re.fullmatch(".*".join(map(re.escape, str(want).split("*"))), have,
                                                      re.S) is not None
    try:
        return {"=": have == want, "!=": have != want, "<": have < want, "<=": have <= want,
                ">": have > want, ">=": have >= want}[op]
    except TypeError:
        return False


def _metadata_value(metadata: dict, path: tuple[str, ...]) -> object:
    value: object = metadata
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def matches(node: Node | None, row: dict, related: Callable[[str], set[str]]) -> bool:
    """Whether a node's row (``display_name``, ``metadata``, ``created``... and its ``name``) passes the
    filter; ``related(field)`` gives the row's context names for in_context / parent_contexts / child_contexts."""
    if node is None:
        return True
    if isinstance(node, And):
        return all(matches(i, row, related) for i in node.items)
    if isinstance(node, Or):
        return any(matches(i, row, related) for i in node.items)
    if isinstance(node, Not):
        return not matches(node.item, row, related)
    if node.values:
        return bool(related(node.field) & set(node.values))
    if node.field == "labels":
        labels = row.get("labels") or {}
        if node.value is None:
            return node.key in labels
        return _compare(labels.get(node.key), node.op, str(node.value))
    if node.field == "metadata":
        have = _metadata_value(row.get("metadata") or {}, node.path)
        if node.value is None and node.op == ":":
            return have is not None
        return _compare(have, node.op, node.value)
    if node.field in TIME_FIELDS:
        return _compare(row["created" if node.field == "create_time" else "updated"], node.op, float(node.value))
    return _compare(row.get(node.field) or "", node.op, node.value)
