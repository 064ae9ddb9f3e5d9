"""Vertex ML Metadata's nodes: ``artifacts``, ``contexts`` and ``executions`` of a metadata store
(create, get, list with Vertex's filters and pages, patch, delete, purge). The three share every
rule but a few fields (an artifact's ``uri``, the ``state`` values, a context's parents), so one
module serves the three collections; edges between nodes are ``metadata_lineage``'s."""
from __future__ import annotations

import time
from typing import Mapping

from modelyard.platform.api import fields, metadata_filter, tracking_messages as msg, tracking_pages
from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.api.names import new_id
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.api.tracking_names import check_chosen_id, split_name
from modelyard.platform.resources import metadata_schemas
from modelyard.platform.state.metadata_db import MetadataDB

MESSAGE = {"artifacts": "Artifact", "contexts": "Context", "executions": "Execution"}
# The JSON API's enum names, and the numbers the SDK sends with $alt=json;enum-encoding=int.
STATES = {"artifacts": ("STATE_UNSPECIFIED", "PENDING", "LIVE"),
          "executions": ("STATE_UNSPECIFIED", "NEW", "RUNNING", "COMPLETE", "FAILED", "CACHED", "CANCELLED")}
PURGE_SAMPLE = 100
_ORDER = {"create_time": "created", "update_time": "updated", "display_name": "display_name"}


def enum_name(value: object, names: tuple[str, ...], what: str) -> str:
    """An enum field as sent (its name or its number) -> its name."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    if isinstance(value, str) and value in names:
        return value
    raise invalid(f"Invalid {what} {value!r}: one of {', '.join(names)}.")


def render(row: dict, parents: list[str] | None = None) -> dict:
    out = {"name": f"{row['store']}/{row['kind']}/{row['id']}", "displayName": row["display_name"],
           "etag": str(row["etag"]), "labels": row["labels"] or {}, "createTime": rfc3339(row["created"]),
           "updateTime": rfc3339(row["updated"]), "schemaTitle": row["schema_title"],
           "schemaVersion": row["schema_version"], "metadata": row["metadata"] or {},
           "description": row["description"]}
    if row["kind"] == "artifacts":
        out["uri"] = row["uri"]
    if row["kind"] != "contexts" and row["state"]:
        out["state"] = row["state"]
    if row["kind"] == "contexts" and parents:
        out["parentContexts"] = parents
    return out


def _fields(kind: str, body: dict, creating: bool) -> dict:
    """The stored columns a create or patch body sets (only those present on a patch)."""
    msg.check_message(body, MESSAGE[kind])
    out: dict = {}
    for field, column in (("displayName", "display_name"), ("description", "description"),
                          ("schemaVersion", "schema_version"), ("uri", "uri")):
        value = msg.get(body, field)
        if value is not None:
            if not isinstance(value, str):
                raise invalid(f"{MESSAGE[kind]}.{column} must be a string.")
            out[column] = value
    if kind != "artifacts":
        out.pop("uri", None)
    if msg.get(body, "labels") is not None:
        out["labels"] = dict(msg.get(body, "labels"))
    metadata = msg.get(body, "metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise invalid(f"{MESSAGE[kind]}.metadata must be an object (a google.protobuf.Struct).")
        out["metadata"] = metadata
    state = msg.get(body, "state")
    if kind in STATES and state is not None:
        out["state"] = enum_name(state, STATES[kind], f"{MESSAGE[kind]}.state")
        if out["state"] == "STATE_UNSPECIFIED":
            out["state"] = ""
    if creating:
        out.setdefault("schema_version", "")
    return out


def create(db: MetadataDB, store: str, kind: str, body: dict, chosen_id: str | None) -> dict:
    values = _fields(kind, body, creating=True)
    title = metadata_schemas.check_title(db, store, kind, msg.get(body, "schemaTitle"))
    rid = check_chosen_id(chosen_id, MESSAGE[kind].lower()) if chosen_id else new_id()
    now = time.time()
    row = {"store": store, "kind": kind, "id": rid, "display_name": "", "description": "", "uri": "",
           "state": "", "metadata": {}, "labels": {}, **values, "schema_title": title, "etag": 1,
           "created": now, "updated": now}
    db.add_node(row)
    return render(row)


def get(db: MetadataDB, store: str, kind: str, rid: str) -> dict:
    row = db.get_node(store, kind, rid)
    return render(row, _parents_of(db, store, [rid]).get(rid) if kind == "contexts" else None)


def _parents_of(db: MetadataDB, store: str, ids: list[str]) -> dict[str, list[str]]:
    wanted = set(ids)
    out: dict[str, list[str]] = {}
    for child, parent in db.parent_links(store):
        if child in wanted:
            out.setdefault(child, []).append(f"{store}/contexts/{parent}")
    return out


def select(db: MetadataDB, store: str, kind: str, filter_text: str | None) -> list[dict]:
    """The store's nodes of ``kind`` that pass the filter, oldest first."""
    tree = metadata_filter.parse(filter_text, kind)
    contexts = metadata_filter.top_contexts(tree)
    prefix = f"{store}/contexts/"
    # The store selects what it can in SQL (the filter's column fields); values in metadata and relations here.
    rows = db.nodes(store, kind, titles=metadata_filter.top_titles(tree),
                    in_contexts=None if contexts is None else {c[len(prefix):] for c in contexts
                                                               if c.startswith(prefix)},
                    where=metadata_filter.column_part(tree))
    if tree is None or metadata_filter.in_columns(tree):
        return rows
    used = metadata_filter.relations_used(tree)
    contexts_of = db.memberships(store, kind) if "in_context" in used else {}
    parents: dict[str, set[str]] = {}
    children: dict[str, set[str]] = {}
    if used & {"parent_contexts", "child_contexts"}:
        for child, parent in db.parent_links(store):
            parents.setdefault(child, set()).add(f"{store}/contexts/{parent}")
            children.setdefault(parent, set()).add(f"{store}/contexts/{child}")
    out = []
    for row in rows:
        row["name"] = f"{store}/{kind}/{row['id']}"

        def related(field: str, rid: str = row["id"]) -> set[str]:
            if field == "in_context":
                return {f"{store}/contexts/{c}" for c in contexts_of.get(rid, ())}
            return (parents if field == "parent_contexts" else children).get(rid, set())

        if metadata_filter.matches(tree, row, related):
            out.append(row)
    return out


def list_(db: MetadataDB, store: str, kind: str, query: Mapping[str, str]) -> dict:
    rows = tracking_pages.order(select(db, store, kind, query.get("filter")),
                                query.get("orderBy") or query.get("order_by"), _ORDER)
    chunk, token = tracking_pages.page(rows, query, f"{store}/{kind}")
    parents = _parents_of(db, store, [r["id"] for r in chunk]) if kind == "contexts" else {}
    out = {kind: [render(r, parents.get(r["id"])) for r in chunk]}
    if token:
        out["nextPageToken"] = token
    return out


def patch(db: MetadataDB, store: str, kind: str, rid: str, body: dict, update_mask: str | None,
          allow_missing: bool) -> dict:
    """Vertex's update: the fields of ``updateMask`` (every field given when absent: ``metadata`` is
    replaced whole, the SDK merges before it sends); with ``allowMissing`` a missing node is created."""
    values = _fields(kind, body, creating=False)
    try:
        db.get_node(store, kind, rid)
    except ApiError as exc:
        if exc.status == "NOT_FOUND" and allow_missing:
            return create(db, store, kind, body, rid)
        raise
    if update_mask:
        wanted = {fields._snake(f.strip()).split(".")[0] for f in update_mask.split(",") if f.strip()}
        values = {k: v for k, v in values.items() if k in wanted}
    etag = msg.get(body, "etag")
    row = db.update_node(store, kind, rid, values, int(etag) if isinstance(etag, str) and etag.isdigit() else None)
    return render(row, _parents_of(db, store, [rid]).get(rid) if kind == "contexts" else None)


def delete(db: MetadataDB, store: str, kind: str, rid: str, force: bool) -> None:
    """A node and its links. A context's child contexts stay, without it as their parent, as on Vertex:
    the SDK's ``Experiment.delete`` deletes the experiment's runs, then the experiment, leaving the pipeline
    runs it holds (Google's test_experiments deletes an experiment a pipeline run joined). ``force`` changes
    nothing (Vertex: "the force deletion semantics is still undefined")."""
    del force
    db.get_node(store, kind, rid)
    db.delete_nodes(store, kind, [rid])


def purge(db: MetadataDB, store: str, kind: str, body: dict) -> dict:
    """Every node the (required) filter selects: counted and sampled; deleted only with ``force``."""
    msg.check_message(body, "PurgeRequest")
    filter_text = msg.get(body, "filter")
    if not isinstance(filter_text, str) or not filter_text.strip():
        raise invalid(f"Purge{MESSAGE[kind]}sRequest.filter is required: it selects what is purged.")
    rows = select(db, store, kind, filter_text)
    if msg.get(body, "force"):
        db.delete_nodes(store, kind, [r["id"] for r in rows])
    return {"purgeCount": str(len(rows)), "purgeSample": [f"{store}/{kind}/{r['id']}" for r in rows[:PURGE_SAMPLE]]}


def node_id(name: object, store: str, kind: str) -> str:
    """A node named in a request body: in this store, of this kind."""
    head, rid = split_name(name, kind, MESSAGE[kind].lower())
    if head != store:
        raise invalid(f"{MESSAGE[kind]} {name!r} is not in metadata store {store}.")
    return rid
