"""Vertex ML Metadata's list filters (artifacts, contexts, executions, purges, lineage queries):
parsed into a small tree and checked here, evaluated against a node's row by ``matches``.

The grammar is AIP-160's, as ``ListArtifactsRequest.filter`` documents it, with ML Metadata's own
restrictions:

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

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Callable, Union

from modelyard.platform.api.errors import ApiError

MAX_FILTER_CHARS = 8192
MAX_DEPTH = 5
TEXT_FIELDS = ("display_name", "uri", "schema_title", "schema_version", "description", "state", "name")
TIME_FIELDS = ("create_time", "update_time")
RELATIONS = {"artifacts": ("in_context",), "executions": ("in_context",),
             "contexts": ("parent_contexts", "child_contexts")}
# The TensorBoard API's lists take the same grammar over their own fields (rows hold them as text).
_TB_TEXT = ("display_name", "description", "name")
TENSORBOARD_FIELDS = {"tensorboards": (*_TB_TEXT, "is_default"), "experiments": (*_TB_TEXT, "source"),
                      "runs": _TB_TEXT, "timeSeries": (*_TB_TEXT, "value_type", "plugin_name")}
_TYPED = ("number_value", "string_value", "bool_value", "struct_value")


@dataclass(frozen=True)
class Cmp:
    """``field op value``: ``path`` below ``labels``/``metadata`` (else empty); ``value`` None with
    ``op`` ":" means "present"; ``values`` holds a relation's names (``in_context``, ``parent_contexts``)."""
    field: str
    op: str
    value: object = None
    path: tuple[str, ...] = ()
    typed: str | None = None  # metadata's number_value | string_value | bool_value
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class And:
    items: tuple


@dataclass(frozen=True)
class Or:
    items: tuple


@dataclass(frozen=True)
class Not:
    item: object


Node = Union[Cmp, And, Or, Not]

_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<op><=|>=|!=|=|<|>|:)"""
                    r"""|(?P<punct>[(),])|(?P<word>[^\s(),"'<>=!:]+))""")


def _bad(text: str, why: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", f"Invalid filter {text!r}: {why}. Metadata filters are AIP-160 "
                    'expressions, e.g. schema_title="system.Model" AND metadata.accuracy.number_value>0.5 '
                    'AND in_context("projects/p/locations/l/metadataStores/default/contexts/c").')


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", lambda m: m.group(1), token[1:-1])


class _Parser:
    def __init__(self, text: str, kind: str) -> None:
        self.text, self.kind = text, kind
        self.toks: list[tuple[str, str]] = []
        pos = 0
        while text[pos:].strip():
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise _bad(text, f"cannot read it at character {pos + 1}")
            self.toks.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise _bad(self.text, "it ends too early")
        self.i += 1
        return tok

    def word(self, text: str) -> bool:
        return self.peek() == ("word", text)

    def parse(self) -> Node:
        node = self.expression()
        if self.peek() is not None:
            raise _bad(self.text, f"unexpected {self.peek()[1]!r}")
        return node

    def expression(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _bad(self.text, f"it nests deeper than {MAX_DEPTH} levels")
        items = [self.factor()]
        while True:
            tok = self.peek()
            if tok is None or tok == ("punct", ")"):
                break
            if self.word("AND"):
                self.take()
            items.append(self.factor())  # juxtaposition is AND too
        self.depth -= 1
        return items[0] if len(items) == 1 else And(tuple(items))

    def factor(self) -> Node:
        items = [self.term()]
        while self.word("OR"):
            self.take()
            items.append(self.term())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def term(self) -> Node:
        if self.word("NOT"):
            self.take()
            return Not(self.simple())
        tok = self.peek()
        if tok is not None and tok[0] == "word" and tok[1].startswith("-") and len(tok[1]) > 1:
            self.toks[self.i] = ("word", tok[1][1:])
            return Not(self.simple())
        return self.simple()

    def simple(self) -> Node:
        if self.peek() == ("punct", "("):
            self.take()
            node = self.expression()
            if self.peek() != ("punct", ")"):
                raise _bad(self.text, "a '(' is not closed")
            if self.take() != ("punct", ")"):
                raise _bad(self.text, "a '(' is not closed")
            return node
        return self.restriction()

    def value(self) -> tuple[object, bool]:
        kind, text = self.take()
        if kind == "str":
            return _unquote(text), True
        if kind != "word" or text in ("AND", "OR", "NOT"):
            raise _bad(self.text, f"expected a value but found {text!r}")
        return text, False

    def restriction(self) -> Node:
        kind, name = self.take()
        if kind != "word" or name in ("AND", "OR", "NOT"):
            raise _bad(self.text, f"expected a field but found {name!r}")
        field, *path = name.split(".")
        field = re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), field)
        if field == "in_context":
            return self.in_context(field)
        if self.kind in TENSORBOARD_FIELDS:
            known = (*TENSORBOARD_FIELDS[self.kind], *TIME_FIELDS, "labels")
        else:
            known = (*TEXT_FIELDS, *TIME_FIELDS, "labels", "metadata", *RELATIONS.get(self.kind, ()))
        if field not in known or (field == "uri" and self.kind != "artifacts"):
            raise _bad(self.text, f"{self.kind} have no filterable field {field!r}")
        if path and field not in ("labels", "metadata"):
            raise _bad(self.text, f"{field} has no sub-field {'.'.join(path)!r}")
        kind, op = self.peek() or ("end", "")
        self.i += 1
        if kind != "op":
            raise _bad(self.text, f"{name} needs a comparison (=, !=, <, <=, >, >= or :) and a value")
        if field in ("parent_contexts", "child_contexts"):
            if op != ":":
                raise _bad(self.text, f'{field} takes ":" and context names, e.g. {field}:"projects/..."')
            values = [self.value()[0]]
            while self.peek() == ("punct", ","):
                self.take()
                values.append(self.value()[0])
            return Cmp(field, ":", values=tuple(str(v) for v in values))
        value, quoted = self.value()
        if field == "labels":
            if not path:
                if op != ":":
                    raise _bad(self.text, "labels takes labels.KEY=VALUE, labels.KEY:* or labels:KEY")
                return Cmp("labels", ":", None, (str(value),))
            if op == ":" and value == "*" and not quoted:
                return Cmp("labels", ":", None, tuple(path))
            return Cmp("labels", "=" if op == ":" else op, value, tuple(path))
        if field == "metadata":
            if not path:
                raise _bad(self.text, "metadata takes metadata.KEY, e.g. metadata.accuracy.number_value>0.5")
            typed = path.pop() if path[-1] in _TYPED and len(path) > 1 else None
            if op == ":" and value == "*" and not quoted:
                return Cmp("metadata", ":", None, tuple(path), typed)
            return Cmp("metadata", "=" if op == ":" else op, _literal(value, quoted, typed, self.text),
                       tuple(path), typed)
        if field in TIME_FIELDS:
            if op == ":":
                raise _bad(self.text, f"{field} takes =, !=, <, <=, > or >=")
            return Cmp(field, op, parse_time(str(value), self.text))
        if op == ":" and value == "*" and not quoted:
            return Cmp(field, "!=", "")
        return Cmp(field, op, str(value))

    def in_context(self, field: str) -> Cmp:
        if "in_context" not in RELATIONS.get(self.kind, ()):
            raise _bad(self.text, f"in_context() filters artifacts and executions, not {self.kind}")
        if self.take() != ("punct", "("):
            raise _bad(self.text, 'in_context takes a context name: in_context("projects/.../contexts/c")')
        values = [self.value()[0]]
        while self.peek() == ("punct", ","):
            self.take()
            values.append(self.value()[0])
        if self.take() != ("punct", ")"):
            raise _bad(self.text, "in_context( is not closed")
        return Cmp(field, ":", values=tuple(str(v) for v in values))


def _literal(value: object, quoted: bool, typed: str | None, text: str) -> object:
    """A metadata value: strings stay strings when quoted or asked for; numbers and booleans otherwise."""
    if typed == "string_value" or (quoted and typed is None):
        return str(value)
    if typed == "bool_value" or (not quoted and str(value).lower() in ("true", "false") and typed is None):
        if str(value).lower() not in ("true", "false"):
            raise _bad(text, f"a bool_value is true or false, not {value!r}")
        return str(value).lower() == "true"
    try:
        return float(value)
    except ValueError:
        if typed == "number_value":
            raise _bad(text, f"a number_value compares with a number, not {value!r}") from None
        return str(value)


def parse_time(text: str, whole: str) -> float:
    """An RFC 3339 timestamp -> epoch seconds."""
    try:
        when = _dt.datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise _bad(whole, f'times compare with an RFC 3339 timestamp such as "2024-01-01T00:00:00Z", not '
                   f"{text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return when.timestamp()


def parse(text: str | None, kind: str) -> Node | None:
    """The filter's tree for a list of ``kind`` (artifacts | contexts | executions, or a TensorBoard
    collection: tensorboards | experiments | runs | timeSeries); None: no filter."""
    if text is None or not text.strip():
        return None
    if len(text) > MAX_FILTER_CHARS:
        raise ApiError("INVALID_ARGUMENT", f"Invalid filter: longer than {MAX_FILTER_CHARS} characters.")
    return _Parser(text, kind).parse()


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
            return node.path[0] in labels
        return _compare(labels.get(node.path[0]), node.op, str(node.value))
    if node.field == "metadata":
        have = _metadata_value(row.get("metadata") or {}, node.path)
        if node.value is None and node.op == ":":
            return have is not None
        return _compare(have, node.op, node.value)
    if node.field in TIME_FIELDS:
        return _compare(row["created" if node.field == "create_time" else "updated"], node.op, float(node.value))
    return _compare(row.get(node.field) or "", node.op, node.value)
