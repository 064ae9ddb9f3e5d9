"""ML Metadata's persistence (``metadata_schema``'s md_* tables): stores, schemas, nodes, events,
context membership and context parents. Rows in, plain dicts out; each public method is one
transaction. Node ids are unique per (store, kind); the REST layer turns them into resource names.
"""
from __future__ import annotations

import time
from typing import Iterable

from sqlalchemy import and_, bindparam, delete, insert, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from modelyard.platform.api.errors import ApiError
from modelyard.platform.api.list_filter import And, Cmp, Node
from modelyard.platform.state import list_query as lq
from modelyard.platform.state import metadata_schema as m

KINDS = ("artifacts", "contexts", "executions")
# A metadata filter's column fields in SQL (api.metadata_filter.COLUMN_FIELDS; state.list_query compiles them).
NODE_COLUMNS = lq.Columns({"display_name": m.md_nodes.c.display_name, "schema_title": m.md_nodes.c.schema_title,
                           "schema_version": m.md_nodes.c.schema_version, "description": m.md_nodes.c.description,
                           "uri": m.md_nodes.c.uri, "state": m.md_nodes.c.state, "create_time": m.md_nodes.c.created,
                           "update_time": m.md_nodes.c.updated},
                          lambda key: m.md_nodes.c.labels[key].as_string(), m.md_nodes.c.id)
_SINGULAR = {"artifacts": "Artifact", "contexts": "Context", "executions": "Execution"}


def _where(node: Node):
    """A metadata filter's SQL part (api.metadata_filter.column_part): list_query's, plus a metadata value's
    text at a top-level AND (the JSON value at the key's path, as text)."""
    if isinstance(node, Cmp) and node.field == "metadata":
        return m.md_nodes.c.metadata[tuple(node.path)].as_string() == node.value
    if isinstance(node, And):
        return and_(*(_where(i) for i in node.items))
    return lq.where(node, NODE_COLUMNS)


def _row(r) -> dict:
    return dict(r._mapping)


# A node by its key, built once: every artifact, context and execution read, whose building cost more than running.
_GET_NODE = select(m.md_nodes).where(m.md_nodes.c.store == bindparam("store"), m.md_nodes.c.kind == bindparam("kind"),
                                     m.md_nodes.c.id == bindparam("id"))


class MetadataDB:
    """ML Metadata over the platform's engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Stores this object has seen exist: every metadata request names its store, and asking the database
        # each time was half the cost of reading one artifact. A delete through this object forgets it.
        self._stores: set[str] = set()

    # ---- stores ---------------------------------------------------------------------------------
    def store_seen(self, name: str) -> bool:
        """Whether store ``name`` was found or made by this object (and not deleted through it) before."""
        return name in self._stores

    def ensure_store(self, name: str, parent: str, description: str = "") -> tuple[dict, bool]:
        """The store ``name``, created if missing; (row, created)."""
        with self.engine.connect() as c:
            row = c.execute(select(m.md_stores).where(m.md_stores.c.name == name)).first()
        if row is not None:
            self._stores.add(name)
            return _row(row), False
        now = time.time()
        new = {"name": name, "parent": parent, "description": description, "created": now, "updated": now}
        try:
            with self.engine.begin() as c:
                c.execute(insert(m.md_stores).values(**new))
        except IntegrityError:  # made by a concurrent request meanwhile
            return self.get_store(name), False
        self._stores.add(name)
        return new, True

    def get_store(self, name: str) -> dict:
        with self.engine.connect() as c:
            row = c.execute(select(m.md_stores).where(m.md_stores.c.name == name)).first()
        if row is None:
            raise ApiError("NOT_FOUND", f"MetadataStore {name} is not found.")
        self._stores.add(name)
        return _row(row)

    def list_stores(self, parent: str) -> list[dict]:
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(select(m.md_stores).where(m.md_stores.c.parent == parent)
                                               .order_by(m.md_stores.c.created))]

    def delete_store(self, name: str) -> None:
        """The store and everything in it."""
        self.get_store(name)
        self._stores.discard(name)
        with self.engine.begin() as c:
            for table in (m.md_nodes, m.md_events, m.md_members, m.md_context_parents, m.md_schemas):
                c.execute(delete(table).where(table.c.store == name))
            c.execute(delete(m.md_stores).where(m.md_stores.c.name == name))

    # ---- schemas --------------------------------------------------------------------------------
    def add_schema(self, row: dict) -> None:
        try:
            with self.engine.begin() as c:
                c.execute(insert(m.md_schemas).values(**row))
        except IntegrityError:
            raise ApiError("ALREADY_EXISTS", f"MetadataSchema {row['id']} already exists.") from None

    def schemas(self, store: str) -> list[dict]:
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(select(m.md_schemas).where(m.md_schemas.c.store == store)
                                               .order_by(m.md_schemas.c.created))]

    # ---- nodes ----------------------------------------------------------------------------------
    def add_node(self, row: dict) -> None:
        """A new artifact, context or execution; ALREADY_EXISTS if its id is taken in its store."""
        try:
            with self.engine.begin() as c:
                c.execute(insert(m.md_nodes).values(**row))
        except IntegrityError:
            raise ApiError("ALREADY_EXISTS", f"{_SINGULAR[row['kind']]} {row['store']}/{row['kind']}/{row['id']} "
                           "already exists.") from None

    def get_node(self, store: str, kind: str, node_id: str) -> dict:
        with self.engine.connect() as c:
            row = c.execute(_GET_NODE, {"store": store, "kind": kind, "id": node_id}).first()
        if row is None:
            raise ApiError("NOT_FOUND", f"{_SINGULAR[kind]} {store}/{kind}/{node_id} is not found.")
        return _row(row)

    def nodes(self, store: str, kind: str, ids: Iterable[str] | None = None,
              titles: set[str] | None = None, in_contexts: set[str] | None = None, where: Node | None = None
              ) -> list[dict]:
        """A store's nodes of one kind, oldest first; only ``ids`` / ``titles`` / members of any of the
        context ids ``in_contexts`` / those passing the filter tree ``where`` (on ``NODE_COLUMNS``) when given."""
        q = select(m.md_nodes).where(m.md_nodes.c.store == store, m.md_nodes.c.kind == kind)
        if where is not None:
            q = q.where(_where(where))
        if in_contexts is not None:
            q = q.where(m.md_nodes.c.id.in_(select(m.md_members.c.node_id).where(
                m.md_members.c.store == store, m.md_members.c.kind == kind,
                m.md_members.c.context_id.in_(sorted(in_contexts)))))
        if ids is not None:
            ids = list(ids)
            if not ids:
                return []
            q = q.where(m.md_nodes.c.id.in_(ids))
        if titles is not None:
            q = q.where(m.md_nodes.c.schema_title.in_(sorted(titles)))
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q.order_by(m.md_nodes.c.created, m.md_nodes.c.id))]

    def update_node(self, store: str, kind: str, node_id: str, changes: dict, etag: int | None = None) -> dict:
        """Changes a node (its etag moves on); ABORTED if ``etag`` is given and no longer its own."""
        with self.engine.begin() as c:
            row = c.execute(select(m.md_nodes).where(self._key(store, kind, node_id)).with_for_update()).first()
            if row is None:
                raise ApiError("NOT_FOUND", f"{_SINGULAR[kind]} {store}/{kind}/{node_id} is not found.")
            if etag is not None and etag != row.etag:
                # Vertex's words: the SDK reads the two etags from them, and a Context.update whose copy is
                # older than the server's reads the context again and retries (metadata/context.py).
                raise ApiError("ABORTED", f"Specified {_SINGULAR[kind]} `etag`: `{etag}` does not match server "
                               f"`etag`: `{row.etag}`")
            values = {**changes, "etag": row.etag + 1, "updated": time.time()}
            c.execute(update(m.md_nodes).where(self._key(store, kind, node_id)).values(**values))
            return {**_row(row), **values}

    def delete_nodes(self, store: str, kind: str, ids: list[str]) -> None:
        """Nodes and every edge that touches them (events, membership, context parents)."""
        if not ids:
            return
        with self.engine.begin() as c:
            c.execute(delete(m.md_nodes).where(m.md_nodes.c.store == store, m.md_nodes.c.kind == kind,
                                               m.md_nodes.c.id.in_(ids)))
            if kind in ("artifacts", "executions"):
                column = m.md_events.c.artifact_id if kind == "artifacts" else m.md_events.c.execution_id
                c.execute(delete(m.md_events).where(m.md_events.c.store == store, column.in_(ids)))
                c.execute(delete(m.md_members).where(m.md_members.c.store == store, m.md_members.c.kind == kind,
                                                     m.md_members.c.node_id.in_(ids)))
            else:
                c.execute(delete(m.md_members).where(m.md_members.c.store == store,
                                                     m.md_members.c.context_id.in_(ids)))
                p = m.md_context_parents
                c.execute(delete(p).where(p.c.store == store, or_(p.c.child_id.in_(ids), p.c.parent_id.in_(ids))))

    @staticmethod
    def _key(store: str, kind: str, node_id: str):
        return and_(m.md_nodes.c.store == store, m.md_nodes.c.kind == kind, m.md_nodes.c.id == node_id)

    def _require(self, c, store: str, kind: str, ids: Iterable[str]) -> None:
        ids = set(ids)
        if not ids:
            return
        found = {r[0] for r in c.execute(select(m.md_nodes.c.id).where(
            m.md_nodes.c.store == store, m.md_nodes.c.kind == kind, m.md_nodes.c.id.in_(sorted(ids))))}
        missing = sorted(ids - found)
        if missing:
            raise ApiError("NOT_FOUND", f"{_SINGULAR[kind]} {store}/{kind}/{missing[0]} is not found.")

    # ---- events ---------------------------------------------------------------------------------
    def add_events(self, store: str, execution_id: str, events: list[tuple[str, str, dict]]) -> None:
        """(artifact id, INPUT|OUTPUT, labels) events of one execution; every node must exist."""
        now = time.time()
        with self.engine.begin() as c:
            self._require(c, store, "executions", [execution_id])
            self._require(c, store, "artifacts", [a for a, _, _ in events])
            for artifact_id, kind, labels in events:
                c.execute(insert(m.md_events).values(store=store, execution_id=execution_id, artifact_id=artifact_id,
                                                     type=kind, labels=labels, time=now))

    def events(self, store: str, execution_ids: Iterable[str] | None = None,
               artifact_ids: Iterable[str] | None = None) -> list[dict]:
        """Events touching any of the executions or any of the artifacts given, oldest first."""
        conds = []
        if execution_ids is not None:
            conds.append(m.md_events.c.execution_id.in_(sorted(set(execution_ids))))
        if artifact_ids is not None:
            conds.append(m.md_events.c.artifact_id.in_(sorted(set(artifact_ids))))
        q = select(m.md_events).where(m.md_events.c.store == store)
        if conds:
            q = q.where(or_(*conds))
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(q.order_by(m.md_events.c.seq))]

    # ---- contexts: members and parents ----------------------------------------------------------
    def add_members(self, store: str, context_id: str, artifacts: list[str], executions: list[str]) -> None:
        with self.engine.begin() as c:
            self._require(c, store, "contexts", [context_id])
            self._require(c, store, "artifacts", artifacts)
            self._require(c, store, "executions", executions)
            have = {(r.kind, r.node_id) for r in c.execute(select(m.md_members).where(
                m.md_members.c.store == store, m.md_members.c.context_id == context_id))}
            for kind, ids in (("artifacts", artifacts), ("executions", executions)):
                for node_id in dict.fromkeys(ids):
                    if (kind, node_id) not in have:
                        c.execute(insert(m.md_members).values(store=store, context_id=context_id, kind=kind,
                                                              node_id=node_id))

    def members(self, store: str, context_ids: Iterable[str]) -> list[dict]:
        with self.engine.connect() as c:
            return [_row(r) for r in c.execute(select(m.md_members).where(
                m.md_members.c.store == store, m.md_members.c.context_id.in_(sorted(set(context_ids)))))]

    def memberships(self, store: str, kind: str) -> dict[str, set[str]]:
        """node id -> the ids of the contexts it is in, for every node of ``kind`` in a context."""
        out: dict[str, set[str]] = {}
        with self.engine.connect() as c:
            for r in c.execute(select(m.md_members.c.node_id, m.md_members.c.context_id).where(
                    m.md_members.c.store == store, m.md_members.c.kind == kind)):
                out.setdefault(r.node_id, set()).add(r.context_id)
        return out

    def parent_links(self, store: str) -> list[tuple[str, str]]:
        """Every (child id, parent id) of a store's contexts."""
        p = m.md_context_parents
        with self.engine.connect() as c:
            return [(r.child_id, r.parent_id) for r in c.execute(select(p.c.child_id, p.c.parent_id)
                                                                 .where(p.c.store == store))]

    def add_children(self, store: str, parent_id: str, children: list[str]) -> None:
        """Makes ``parent_id`` a parent of each child; INVALID_ARGUMENT if that would close a cycle."""
        p = m.md_context_parents
        with self.engine.begin() as c:
            self._require(c, store, "contexts", [parent_id, *children])
            links = [(r.child_id, r.parent_id) for r in c.execute(select(p.c.child_id, p.c.parent_id)
                                                                  .where(p.c.store == store))]
            ancestors = {parent_id}
            frontier = [parent_id]
            while frontier:  # every ancestor of the parent: none may become its child
                up = [par for child, par in links if child in frontier and par not in ancestors]
                ancestors.update(up)
                frontier = up
            for child in dict.fromkeys(children):
                if child in ancestors:
                    raise ApiError("INVALID_ARGUMENT", f"Adding context {child} as a child of {parent_id} would "
                                   "make a cycle of parent contexts.")
                if (child, parent_id) not in links:
                    c.execute(insert(p).values(store=store, child_id=child, parent_id=parent_id))

    def remove_children(self, store: str, parent_id: str, children: list[str]) -> None:
        p = m.md_context_parents
        with self.engine.begin() as c:
            self._require(c, store, "contexts", [parent_id])
            c.execute(delete(p).where(p.c.store == store, p.c.parent_id == parent_id, p.c.child_id.in_(children)))
