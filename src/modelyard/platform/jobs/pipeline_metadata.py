"""A pipeline run's records in ML Metadata, as Vertex AI Pipelines writes them (docs/metadata.md):
the run is a ``system.PipelineRun`` context (a child of the pipeline's ``system.Pipeline`` context) holding
its own ``system.Run`` execution (its parameters and state: what an experiment's row shows), each task that ran a ``system.ContainerExecution`` in it (its parameters as ``input:``/``output:`` metadata),
and the task's artifacts ``system.*`` artifacts joined to it by ``INPUT``/``OUTPUT`` events. Written
through the ML Metadata resource code over the platform's store (the default metadata store of the
run's location), so what a user queries is what any other client wrote.
"""
from __future__ import annotations

from modelyard.platform.api.errors import ApiError
from modelyard.platform.resources import metadata_lineage as lineage, metadata_nodes as nodes
from modelyard.platform.resources import metadata_store as stores
from modelyard.platform.state.metadata_db import MetadataDB

_KNOWN_TITLES = ("system.Artifact", "system.Dataset", "system.Model", "system.Metrics", "system.ClassificationMetrics",
                 "system.SlicedClassificationMetrics", "system.HTML", "system.Markdown")


def _store(engine, row: dict) -> tuple[MetadataDB, str]:
    db = MetadataDB(engine)
    return db, stores.resolve(db, row["parent"], "default")


def run_context(engine, row: dict) -> tuple[dict, dict]:
    """The run's ``system.PipelineRun`` context (made now), a child of its pipeline's ``system.Pipeline``
    context (made unless one of that name exists); both."""
    db, store = _store(engine, row)
    spec = row["spec"]["pipelineSpec"]
    pipeline = spec["pipelineInfo"]["name"]
    found = nodes.select(db, store, "contexts", f'schema_title="system.Pipeline" AND display_name="{pipeline}"')
    parent = nodes.get(db, store, "contexts", found[0]["id"]) if found else \
        nodes.create(db, store, "contexts", {"displayName": pipeline, "schemaTitle": "system.Pipeline"}, None)
    run = nodes.create(db, store, "contexts", {
        "displayName": row["id"], "schemaTitle": "system.PipelineRun",
        "metadata": {"pipeline_job_name": f"{row['parent']}/pipelineJobs/{row['id']}",
                     "pipeline_root": row["spec"]["runtimeConfig"]["gcsOutputDirectory"],
                     **{f"input:{k}": v for k, v in (row["spec"]["runtimeConfig"].get("parameterValues") or {}).items()}}},
        None)
    lineage.add_context_children(db, store, nodes.node_id(parent["name"], store, "contexts"),
                                 {"childContexts": [run["name"]]})
    return nodes.get(db, store, "contexts", nodes.node_id(run["name"], store, "contexts")), parent


def current_context(engine, parent: str, context: dict) -> dict:
    """A context as it is now (its parents: an experiment the run was added to since), or as given when
    it is gone."""
    db = MetadataDB(engine)
    store = stores.resolve(db, parent, "default")
    try:
        return nodes.get(db, store, "contexts", nodes.node_id(context["name"], store, "contexts"))
    except ApiError:
        return context


def run_execution(engine, row: dict, run: dict, params: dict) -> dict:
    """The run's own execution (``system.Run``, RUNNING) in its context, its parameters as ``input:NAME``:
    what the SDK reads a pipeline run's parameters and state from when the run is in an experiment
    (``PipelineJob._query_experiment_row``), beside the metrics artifacts of the context."""
    db, store = _store(engine, row)
    execution = nodes.create(db, store, "executions", {
        "displayName": row["id"], "schemaTitle": "system.Run", "state": "RUNNING",
        "metadata": {f"input:{k}": v for k, v in params.items()}}, None)
    lineage.add_context_members(db, store, nodes.node_id(run["name"], store, "contexts"),
                                {"executions": [execution["name"]]})
    return execution


def end_run_execution(engine, row: dict, execution: dict, state: str) -> dict | None:
    """The run's ``system.Run`` execution in its end state (COMPLETE, FAILED, CANCELLED); None if a user
    deleted it meanwhile."""
    db, store = _store(engine, row)
    try:
        return nodes.patch(db, store, "executions", nodes.node_id(execution["name"], store, "executions"),
                           {"state": state}, "state", False)
    except ApiError:
        return None


def cached(engine, row: dict, key: str) -> dict | None:
    """The outputs of the newest completed task execution with this cache key (any run), or None."""
    db, store = _store(engine, row)
    found = nodes.select(db, store, "executions", 'schema_title="system.ContainerExecution" AND state="COMPLETE" '
                         f'AND metadata.cache_key.string_value="{key}"')
    if not found:
        return None
    return (found[-1].get("metadata") or {}).get("cached_outputs")  # select's rows: oldest first


def artifact_by_uri(engine, row: dict, artifact: dict) -> str | None:
    """The name of the newest artifact recorded for this URI and type (what an importer that does not
    ``reimport`` reuses), or None."""
    db, store = _store(engine, row)
    title = (artifact.get("type") or {}).get("schemaTitle")
    uri = artifact["uri"].replace("\\", "\\\\").replace('"', '\\"')
    found = nodes.select(db, store, "artifacts", f'uri="{uri}" AND schema_title="{_title(title)}"')
    return f"{store}/artifacts/{found[-1]['id']}" if found else None  # select's rows: oldest first


def _title(title: str | None) -> str:
    return title if title in _KNOWN_TITLES else "system.Artifact"


def task_execution(engine, row: dict, name: str, task: dict, state: str,
                   schema: str = "system.ContainerExecution") -> dict:
    """A finished (or cache-hit: ``CACHED``) task's execution, its output artifacts made unless they exist
    (their names set in ``task['outputs']``), its events and its membership of the run's context."""
    db, store = _store(engine, row)
    inputs, outputs = task.get("inputs") or {}, task.get("outputs") or {}
    metadata = {**{f"input:{k}": v for k, v in (inputs.get("parameters") or {}).items()},
                **{f"output:{k}": v for k, v in (outputs.get("parameters") or {}).items()}}
    if task.get("cache_key") and state == "COMPLETE":
        metadata["cache_key"] = task["cache_key"]
    elif task.get("cache_key"):
        metadata["cached_execution_key"] = task["cache_key"]
    execution = nodes.create(db, store, "executions", {
        "displayName": name, "schemaTitle": schema, "state": state, "metadata": metadata}, None)
    events = [{"artifact": a["name"], "type": "INPUT"} for arts in (inputs.get("artifacts") or {}).values()
              for a in arts if a.get("name", "").startswith(store)]
    made = []
    for arts in (outputs.get("artifacts") or {}).values():
        for a in arts:
            if a.get("name", "").startswith(f"{store}/artifacts/"):  # a cache hit's: the artifact it reuses
                events.append({"artifact": a["name"], "type": "OUTPUT"})
                made.append(a["name"])
                continue
            title = (a.get("type") or {}).get("schemaTitle")
            created = nodes.create(db, store, "artifacts", {
                "displayName": a.get("name") or "", "uri": a["uri"], "state": "LIVE",
                "schemaTitle": _title(title),
                "metadata": a.get("metadata") or {}}, None)
            a["name"] = created["name"]
            made.append(created["name"])
            events.append({"artifact": created["name"], "type": "OUTPUT"})
    if metadata.get("cache_key"):  # what a later identical task reuses (names set above)
        execution = nodes.patch(db, store, "executions", nodes.node_id(execution["name"], store, "executions"),
                                {"metadata": {**metadata, "cached_outputs": outputs}}, "metadata", False)
    ex_id = nodes.node_id(execution["name"], store, "executions")
    if events:
        lineage.add_execution_events(db, store, ex_id, {"events": events})
    run = ((row.get("result") or {}).get("jobDetail") or {}).get("pipelineRunContext") or {}
    if run.get("name"):
        try:
            lineage.add_context_members(db, store, nodes.node_id(run["name"], store, "contexts"),
                                        {"artifacts": made, "executions": [execution["name"]]})
        except ApiError:  # the context was deleted by a user: the execution stands on its own
            pass
    return execution


def artifact_resource(a: dict) -> dict:
    """A task's artifact as ``PipelineTaskDetail.inputs/outputs`` lists it (an ML Metadata Artifact)."""
    return {"name": a.get("name", ""), "uri": a.get("uri", ""), "schemaTitle": (a.get("type") or {}).get("schemaTitle", ""),
            "schemaVersion": (a.get("type") or {}).get("schemaVersion", ""), "metadata": a.get("metadata") or {}}
