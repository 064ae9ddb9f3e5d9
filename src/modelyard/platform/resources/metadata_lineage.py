"""Vertex ML Metadata's edges and the lineage read back through them: events (addExecutionEvents),
a context's artifacts and executions (addContextArtifactsAndExecutions), context parents
(addContextChildren, removeContextChildren), and the subgraph queries
(queryArtifactLineageSubgraph, queryContextLineageSubgraph, queryExecutionInputsAndOutputs)."""
from __future__ import annotations

from modelyard.platform.api import tracking_messages as msg
from modelyard.platform.api.errors import invalid
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.resources import metadata_nodes as nodes
from modelyard.platform.state.metadata_db import MetadataDB

EVENT_TYPES = ("TYPE_UNSPECIFIED", "INPUT", "OUTPUT")
MAX_EVENTS = 1000  # per request, so that one call cannot grow a graph without bound


def _names(body: dict, field: str) -> list:
    value = msg.get(body, field, []) or []
    if not isinstance(value, list):
        raise invalid(f"{field} must be a list of resource names.")
    if len(value) > MAX_EVENTS:
        raise invalid(f"{field} has {len(value)} names: at most {MAX_EVENTS} per request.")
    return value


def add_execution_events(db: MetadataDB, store: str, execution_id: str, body: dict) -> dict:
    msg.check_message(body, "AddExecutionEventsRequest")
    events = []
    for i, event in enumerate(_names(body, "events")):
        if not isinstance(event, dict):
            raise invalid(f"events[{i}] must be an Event object.")
        kind = nodes.enum_name(msg.get(event, "type"), EVENT_TYPES, f"events[{i}].type")
        if kind == "TYPE_UNSPECIFIED":
            raise invalid(f"events[{i}].type is required: INPUT or OUTPUT.")
        artifact = nodes.node_id(msg.get(event, "artifact"), store, "artifacts")
        events.append((artifact, kind, dict(msg.get(event, "labels") or {})))
    db.add_events(store, execution_id, events)
    return {}


def add_context_members(db: MetadataDB, store: str, context_id: str, body: dict) -> dict:
    msg.check_message(body, "AddContextArtifactsAndExecutionsRequest")
    artifacts = [nodes.node_id(n, store, "artifacts") for n in _names(body, "artifacts")]
    executions = [nodes.node_id(n, store, "executions") for n in _names(body, "executions")]
    db.add_members(store, context_id, artifacts, executions)
    return {}


def add_context_children(db: MetadataDB, store: str, context_id: str, body: dict, remove: bool = False) -> dict:
    msg.check_message(body, "RemoveContextChildrenRequest" if remove else "AddContextChildrenRequest")
    children = [nodes.node_id(n, store, "contexts") for n in _names(body, "childContexts")]
    if context_id in children:
        raise invalid(f"Context {context_id} cannot be its own child.")
    if remove:
        db.remove_children(store, context_id, children)
    else:
        db.add_children(store, context_id, children)
    return {}


def _event(store: str, e: dict) -> dict:
    return {"artifact": f"{store}/artifacts/{e['artifact_id']}", "execution": f"{store}/executions/{e['execution_id']}",
            "eventTime": rfc3339(e["time"]), "type": e["type"], "labels": e["labels"] or {}}


def _subgraph(db: MetadataDB, store: str, artifact_ids: set[str], execution_ids: set[str]) -> dict:
    """The nodes given and the events between them, in creation order."""
    events = [e for e in db.events(store, execution_ids=execution_ids)
              if e["artifact_id"] in artifact_ids] if execution_ids and artifact_ids else []
    return {"artifacts": [nodes.render(r) for r in db.nodes(store, "artifacts", ids=artifact_ids)],
            "executions": [nodes.render(r) for r in db.nodes(store, "executions", ids=execution_ids)],
            "events": [_event(store, e) for e in events]}


def artifact_lineage(db: MetadataDB, store: str, artifact_id: str, max_hops: str | None,
                     filter_text: str | None) -> dict:
    """Every node reachable from the artifact through events, in both directions, up to ``maxHops``
    edges away (unset: the whole connected graph; 0: the artifact alone); ``filter`` selects which
    artifacts the walk may pass through (the starting one is always there)."""
    db.get_node(store, "artifacts", artifact_id)
    hops = None
    if max_hops not in (None, ""):
        try:
            hops = int(max_hops)
        except ValueError:
            raise invalid(f"Invalid max_hops {max_hops!r}: a whole number.") from None
        if hops < 0:
            raise invalid(f"Invalid max_hops {hops}: it cannot be negative.")
    allowed = None
    if filter_text:
        allowed = {r["id"] for r in nodes.select(db, store, "artifacts", filter_text)} | {artifact_id}
    artifacts, executions = {artifact_id}, set()
    frontier_a, frontier_e, depth = {artifact_id}, set(), 0
    while (frontier_a or frontier_e) and (hops is None or depth < hops):
        depth += 1
        next_e = {e["execution_id"] for e in db.events(store, artifact_ids=frontier_a)} - executions if frontier_a \
            else set()
        next_a = {e["artifact_id"] for e in db.events(store, execution_ids=frontier_e)} - artifacts if frontier_e \
            else set()
        if allowed is not None:
            next_a &= allowed
        executions |= next_e
        artifacts |= next_a
        frontier_a, frontier_e = next_a, next_e
    return _subgraph(db, store, artifacts, executions)


def context_lineage(db: MetadataDB, store: str, context_id: str) -> dict:
    """The context's artifacts and executions and the events between them."""
    db.get_node(store, "contexts", context_id)
    members = db.members(store, [context_id])
    return _subgraph(db, store, {m["node_id"] for m in members if m["kind"] == "artifacts"},
                     {m["node_id"] for m in members if m["kind"] == "executions"})


def execution_io(db: MetadataDB, store: str, execution_id: str) -> dict:
    """The execution, its input and output artifacts, and its events."""
    db.get_node(store, "executions", execution_id)
    events = db.events(store, execution_ids=[execution_id])
    return _subgraph(db, store, {e["artifact_id"] for e in events}, {execution_id})

