"""Vertex AI list requests, one rule for every list of the platform: ``filter`` (AIP-160's grammar, the
fields each resource's list documents), ``orderBy`` and pages (``pageSize`` / ``pageToken``, AIP-158).

This module only parses and checks: a filter becomes a small tree (``And``, ``Or``, ``Not``, ``Cmp``)
whose fields are known to the resource and whose values are already converted (a timestamp to epoch
seconds, an enum to its stored name); ``state/list_query`` turns the tree into SQL, so a list is
filtered, ordered and cut into pages by the database, never in Python after loading every row.
Anything it cannot read is refused with INVALID_ARGUMENT: an ignored filter would hand a caller's
``for m in Model.list(filter=...): m.delete()`` every resource.

Grammar (AIP-160), as Vertex accepts it::

    expression = sequence { "AND" sequence }
    sequence   = factor { factor }                  (juxtaposition is AND)
    factor     = term { "OR" term }                 (OR binds tighter than AND)
    term       = [ "NOT" | "-" ] simple
    simple     = restriction | "(" expression ")"
    restriction = field [ ("=" | "!=" | "<" | "<=" | ">" | ">=" | ":") value ]

Field names are taken in snake_case or camelCase. ``labels.KEY=V`` (``labels."a key"=V``),
``labels.KEY:*`` and ``labels:KEY`` (the key exists), ``labels.KEY:V`` (equality), ``display_name:"a*"``
(a wildcard match), ``create_time>"2024-01-01T00:00:00Z"``.

ML Metadata's lists (``api/metadata_filter``: artifacts, contexts, executions, purges, lineage queries; and
the TensorBoard API's lists) take the same grammar with three more kinds of field: ``metadata.KEY[.number_value
|.string_value|.bool_value]`` (a value inside a node's metadata), a relation ``parent_contexts:"a","b"`` (any of
the names) and a call ``in_context("a")``; and Vertex nests their filters at most 5 deep (``max_depth``).
"""
from __future__ import annotations

import base64
import binascii
import datetime as _dt
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Mapping, Union

from modelyard.platform.api.errors import ApiError

# Field kinds: what a field's values are and which comparisons it takes.
STRING, ID, ENUM, TIME, LABELS, BOOL = "string", "id", "enum", "time", "labels", "bool"
METADATA, RELATION, CALL = "metadata", "relation", "call"  # ML Metadata's (see above)
_OPS = {STRING: ("=", "!=", ":"), ID: ("=", "!="), ENUM: ("=", "!="),
        TIME: ("=", "!=", "<", "<=", ">", ">="), LABELS: ("=", "!=", ":"), BOOL: ("=", "!="),
        METADATA: ("=", "!=", "<", "<=", ">", ">=", ":"), RELATION: (":",), CALL: ()}
_TYPED = ("number_value", "string_value", "bool_value", "struct_value")  # metadata.KEY.<typed>

DEFAULT_PAGE_SIZE = 1000  # AIP-158: the API picks one when the caller does not; also the largest page
MAX_PAGE_SIZE = 1000
MAX_FILTER_CHARS = 8192
MAX_TERMS = 200


@dataclass(frozen=True)
class Field:
    """One filterable field of a resource. ``enum``: the values a client may write -> the stored value;
    ``refused``: why this resource's lists do not take a field other lists do (said instead of "no field")."""
    kind: str
    enum: Mapping[str, str] | None = None
    refused: str | None = None


@dataclass(frozen=True)
class Cmp:
    """``field op value``; for labels ``key`` is the label's key, ``value`` None means "the key exists"; for
    metadata ``path`` is the key's path and ``typed`` the value type asked for (``value`` None: present);
    a relation or call holds the names it takes in ``values``."""
    field: str
    op: str
    value: object
    key: str | None = None
    path: tuple[str, ...] = ()
    typed: str | None = None
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


@dataclass(frozen=True)
class ListRequest:
    """A list request as the store takes it: the filter tree (None: everything), the order as
    (field, descending) pairs, the page's offset and size."""
    where: Node | None
    order: tuple[tuple[str, bool], ...]
    offset: int
    size: int
    fingerprint: str  # what a page token is bound to: the same filter and order

    def next_token(self) -> str:
        return encode_token(self.offset + self.size, self.fingerprint)


def bad(message: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", message)


def snake(name: str) -> str:
    """``displayName`` -> ``display_name`` (field names are taken either way)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), name)


# ---- tokens ----------------------------------------------------------------------------------------
_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<op><=|>=|!=|=|<|>|:)"""
                    r"""|(?P<paren>[()])|(?P<word>[^\s()"'<>=!:]+))""")


@dataclass
class _Tok:
    kind: str  # str | op | paren | word
    text: str
    start: int
    end: int


_SPACE_TO_END = re.compile(r"\s*\Z")


def _tokens(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        if _SPACE_TO_END.match(text, pos):
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise bad(f"Invalid filter {text!r}: cannot read it at character {pos + 1} ({text[pos:pos + 20]!r}).")
        kind = m.lastgroup
        out.append(_Tok(kind, m.group(kind), m.start(kind), m.end()))
        pos = m.end()
    return out


def _unquote(token: str) -> str:
    body = token[1:-1]
    return re.sub(r"\\(.)", lambda m: m.group(1), body)


# ---- parser ------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str, fields: Mapping[str, Field], resource: str, max_depth: int | None = None,
                 example: str | None = None) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.fields = fields
        self.resource = resource
        self.terms = 0
        self.depth, self.max_depth = 0, max_depth
        self.example = example or 'display_name="my-model" AND labels.team="ml" AND create_time>"2024-01-01T00:00:00Z"'

    def peek(self, offset: int = 0) -> _Tok | None:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise self.error("it ends too early")
        self.i += 1
        return tok

    def error(self, why: str) -> ApiError:
        return bad(f"Invalid filter {self.text!r}: {why}. Filters are AIP-160 expressions, e.g. {self.example}.")

    def is_word(self, text: str, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok is not None and tok.kind == "word" and tok.text == text

    def parse(self) -> Node | None:
        if not self.toks:
            return None
        node = self.expression()
        if self.peek() is not None:
            raise self.error(f"unexpected {self.peek().text!r}")
        return node

    def expression(self) -> Node:
        self.depth += 1
        if self.max_depth is not None and self.depth > self.max_depth:
            raise self.error(f"it nests deeper than {self.max_depth} levels")
        items = [self.sequence()]
        while self.is_word("AND"):
            self.take()
            items.append(self.sequence())
        self.depth -= 1
        return items[0] if len(items) == 1 else And(tuple(items))

    def sequence(self) -> Node:
        items = [self.factor()]
        while True:
            tok = self.peek()
            if tok is None or (tok.kind == "paren" and tok.text == ")") or self.is_word("AND"):
                break
            items.append(self.factor())
        return items[0] if len(items) == 1 else And(tuple(items))

    def factor(self) -> Node:
        items = [self.term()]
        while self.is_word("OR"):
            self.take()
            items.append(self.term())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def term(self) -> Node:
        tok = self.peek()
        if tok is not None and tok.kind == "word" and tok.text == "NOT":
            self.take()
            return Not(self.simple())
        if tok is not None and tok.kind == "word" and tok.text == "-":
            self.take()  # "-(...)"
            return Not(self.simple())
        if tok is not None and tok.kind == "word" and tok.text.startswith("-") and len(tok.text) > 1:
            tok.text, tok.start = tok.text[1:], tok.start + 1  # "-field=..." negates the restriction
            return Not(self.simple())
        return self.simple()

    def simple(self) -> Node:
        tok = self.peek()
        if tok is not None and tok.kind == "paren" and tok.text == "(":
            self.take()
            node = self.expression()
            if self.peek() is None:
                raise self.error("a '(' is not closed: it ends too early")
            close = self.take()
            if close.kind != "paren" or close.text != ")":
                raise self.error(f"expected ')' but found {close.text!r}")
            return node
        return self.restriction()

    def field_path(self) -> tuple[str, str | None]:
        """``name`` or ``labels.key`` / ``labels."a key"`` -> (field, label key)."""
        tok = self.take()
        if tok.kind != "word" or tok.text in ("AND", "OR", "NOT"):
            raise self.error(f"expected a field name but found {tok.text!r}")
        name, key = tok.text, None
        nxt = self.peek()
        if name.endswith(".") and nxt is not None and nxt.kind == "str" and nxt.start == tok.end:
            self.take()  # labels."a key"
            name, key = name[:-1], _unquote(nxt.text)
        elif "." in name:
            name, key = name.split(".", 1)
        return snake(name), key

    def restriction(self) -> Node:
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise self.error(f"it has more than {MAX_TERMS} restrictions")
        start = self.peek()
        if start is not None and start.kind == "str":
            raise self.error(f"{start.text} has no field: name one, e.g. display_name={start.text}")
        field, key = self.field_path()
        spec = self.fields.get(field)
        if spec is None:
            known = ", ".join(sorted(f for f, s in self.fields.items() if not s.refused))
            raise self.error(f"{self.resource} has no filterable field {field!r} (it has {known})")
        if spec.refused:
            raise self.error(spec.refused)
        if spec.kind == CALL:
            return self.call(field)
        op_tok = self.peek()
        if op_tok is None or op_tok.kind != "op":
            raise self.error(f"{field} needs a comparison (=, !=, <, <=, >, >= or :) and a value")
        self.take()
        op = op_tok.text
        value_tok = self.take()
        if value_tok.kind == "paren":
            raise self.error("a value cannot be a parenthesised list here")
        if value_tok.kind == "word" and value_tok.text in ("AND", "OR", "NOT"):
            raise self.error(f"{field}{op} has no value")
        quoted = value_tok.kind == "str"
        raw = _unquote(value_tok.text) if quoted else value_tok.text
        if op not in _OPS[spec.kind]:
            if spec.kind == RELATION:
                raise self.error(f'{field} takes ":" and context names, e.g. {field}:"projects/..."')
            raise self.error(f"{field} takes {', '.join(_OPS[spec.kind])}, not {op}")
        if spec.kind == RELATION:
            return Cmp(field, ":", None, values=(raw, *self.more_names()))
        return self.compare(field, spec, key, op, raw, quoted)

    def more_names(self) -> tuple[str, ...]:
        """The names after a first one in ``"a","b"`` (a relation's, a call's)."""
        out = []
        while self.peek() is not None and self.peek().kind == "word" and self.peek().text == ",":
            self.take()
            tok = self.take()
            if tok.kind not in ("str", "word") or tok.text in ("AND", "OR", "NOT", ","):
                raise self.error(f"expected a name after ',' but found {tok.text!r}")
            out.append(_unquote(tok.text) if tok.kind == "str" else tok.text)
        return tuple(out)

    def call(self, field: str) -> Cmp:
        """``in_context("a"[, "b"])``."""
        usage = f'{field} takes a context name: {field}("projects/.../contexts/c")'
        if self.peek() is None or self.take().text != "(":
            raise self.error(usage)
        tok = self.take()
        if tok.kind not in ("str", "word") or tok.text in (")", ","):
            raise self.error(usage)
        names = (_unquote(tok.text) if tok.kind == "str" else tok.text, *self.more_names())
        if self.peek() is None or self.take().text != ")":
            raise self.error(f"{field}( is not closed")
        return Cmp(field, ":", None, values=names)

    def compare(self, field: str, spec: Field, key: str | None, op: str, raw: str, quoted: bool) -> Cmp:
        if spec.kind == METADATA:
            path = key.split(".") if key else []
            if not path or not all(path):
                raise self.error(f"{field} takes {field}.KEY, e.g. {field}.accuracy.number_value>0.5")
            typed = path.pop() if path[-1] in _TYPED and len(path) > 1 else None
            if op == ":" and raw == "*" and not quoted:
                return Cmp(field, ":", None, path=tuple(path), typed=typed)
            return Cmp(field, "=" if op == ":" else op, self.metadata_literal(raw, quoted, typed),
                       path=tuple(path), typed=typed)
        if spec.kind == LABELS:
            if key is None:
                if op != ":":
                    raise self.error("labels takes labels.KEY=VALUE, labels.KEY:* or labels:KEY")
                return Cmp(field, ":", None, _label_key(raw, self))  # labels:KEY, the key exists
            _label_key(key, self)
            if op == ":" and raw == "*" and not quoted:
                return Cmp(field, ":", None, key)
            return Cmp(field, "=" if op == ":" else op, raw, key)  # labels.k:v is equality
        if key is not None:
            raise self.error(f"{field} has no sub-field {key!r}")
        if spec.kind == TIME:
            return Cmp(field, op, parse_time(raw, field))
        if spec.kind == ENUM:
            stored = (spec.enum or {}).get(raw)
            if stored is None:
                raise self.error(f"{field} is one of {', '.join(sorted(spec.enum or {}))}, not {raw!r}")
            return Cmp(field, op, stored)
        if spec.kind == BOOL:
            if raw.lower() not in ("true", "false"):
                raise self.error(f"{field} is true or false, not {raw!r}")
            return Cmp(field, op, raw.lower() == "true")
        if op == ":" and raw == "*" and not quoted:
            return Cmp(field, "!=", "")  # present: a non-empty value
        return Cmp(field, op, raw)


    def metadata_literal(self, raw: str, quoted: bool, typed: str | None) -> object:
        """A metadata value: strings stay strings when quoted or asked for; numbers and booleans otherwise."""
        if typed == "string_value" or (quoted and typed is None):
            return raw
        if typed == "bool_value" or (not quoted and raw.lower() in ("true", "false") and typed is None):
            if raw.lower() not in ("true", "false"):
                raise self.error(f"a bool_value is true or false, not {raw!r}")
            return raw.lower() == "true"
        try:
            return float(raw)
        except ValueError:
            if typed == "number_value":
                raise self.error(f"a number_value compares with a number, not {raw!r}") from None
            return raw


_LABEL_KEY = re.compile(r"^[\w\- .]{1,128}$")


def _label_key(key: str, parser: _Parser) -> str:
    if not _LABEL_KEY.match(key):
        raise parser.error(f"label key {key!r} has characters a label key cannot have")
    return key


def parse_time(text: str, field: str = "time") -> float:
    """An RFC 3339 timestamp (``2024-01-01T00:00:00Z``, fractions and offsets allowed) -> epoch seconds."""
    try:
        when = _dt.datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise bad(f"Invalid filter: {field} compares with an RFC 3339 timestamp such as "
                  f'"2024-01-01T00:00:00Z", not {text!r}.') from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return when.timestamp()


def parse_filter(text: str | None, fields: Mapping[str, Field], resource: str, max_depth: int | None = None,
                 example: str | None = None) -> Node | None:
    """The tree of a ``filter`` over ``fields`` (names in snake_case), or None for no filter; ``max_depth``
    bounds its nesting, ``example`` is the filter an error message shows."""
    if text is None or not text.strip():
        return None
    if len(text) > MAX_FILTER_CHARS:
        raise bad(f"Invalid filter: longer than {MAX_FILTER_CHARS} characters.")
    return _Parser(text, fields, resource, max_depth, example).parse()


def parse_order(text: str | None, orderable: tuple[str, ...], resource: str) -> tuple[tuple[str, bool], ...]:
    """``"display_name, create_time desc"`` -> (("display_name", False), ("create_time", True))."""
    out = []
    for part in (x.strip() for x in (text or "").split(",")):
        if not part:
            continue
        words = part.split()
        name = snake(words[0])
        if name not in orderable or len(words) > 2 or (len(words) == 2 and words[1].lower() not in ("asc", "desc")):
            raise bad(f"Invalid order_by {part!r}: {resource} orders by {', '.join(orderable)}, each optionally "
                      "followed by asc or desc, separated by commas.")
        out.append((name, len(words) == 2 and words[1].lower() == "desc"))
    return tuple(out)


def encode_token(offset: int, fingerprint: str) -> str:
    raw = json.dumps({"o": offset, "f": fingerprint}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_token(token: str, fingerprint: str) -> int:
    try:
        doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        offset = doc["o"]
        if not isinstance(offset, int) or offset < 0:
            raise ValueError
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise bad(f"Invalid page_token {token!r}: pass the next_page_token of the previous page.") from None
    if doc.get("f") != fingerprint:
        raise bad("Invalid page_token: it belongs to a list with another filter or order_by; a page token "
                  "must come with the same filter and order_by as the request that returned it.")
    return offset


def _int(query: Mapping[str, str], *names: str) -> int:
    for name in names:
        value = query.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise bad(f"Invalid {name} {value!r}: a whole number.") from None
    return 0


def _first(query: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if query.get(name) not in (None, ""):
            return query.get(name)
    return None


def list_request(query: Mapping[str, str], fields: Mapping[str, Field], orderable: tuple[str, ...],
                 resource: str, scope: str = "") -> ListRequest:
    """The list request a REST query string holds (``filter``, ``orderBy``/``order_by``, ``pageSize``/
    ``page_size``, ``pageToken``/``page_token``). ``scope`` (e.g. the parent) binds page tokens too."""
    filter_text = _first(query, "filter")
    order_text = _first(query, "orderBy", "order_by")
    where = parse_filter(filter_text, fields, resource)
    order = parse_order(order_text, orderable, resource)
    size = _int(query, "pageSize", "page_size")
    if size < 0:
        raise bad(f"Invalid page_size {size}: it cannot be negative.")
    size = min(size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    fingerprint = hashlib.sha256(json.dumps([scope, filter_text or "", order_text or ""]).encode()).hexdigest()[:16]
    token = _first(query, "pageToken", "page_token")
    offset = _decode_token(token, fingerprint) if token else 0
    return ListRequest(where, order, offset, size, fingerprint)


# ---- the fields of each list (Vertex's documented filters; times on every resource) ------------------
COMMON = {"display_name": Field(STRING), "labels": Field(LABELS), "create_time": Field(TIME),
          "update_time": Field(TIME)}
ORDERABLE = ("display_name", "create_time", "update_time")

MODEL_FIELDS = {**COMMON, "model": Field(ID)}
# ListModelVersions documents labels only (a version's display name is its model's); times and the
# version's number besides.
VERSION_FIELDS = {"labels": Field(LABELS), "create_time": Field(TIME), "update_time": Field(TIME),
                  "version_id": Field(ID)}
VERSION_ORDERABLE = ("create_time", "update_time", "version_id")
ENDPOINT_FIELDS = {**COMMON, "endpoint": Field(ID)}


def job_fields(states: Mapping[str, str]) -> dict[str, Field]:
    """A job list's fields: ``state`` takes the kind's state names (``states``: written -> stored)."""
    return {**COMMON, "state": Field(ENUM, states), "job": Field(ID)}


OPERATION_FIELDS = {"done": Field(BOOL), "create_time": Field(TIME)}
OPERATION_ORDERABLE = ("create_time",)
