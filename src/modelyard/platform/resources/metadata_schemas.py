"""Vertex ML Metadata's ``metadataSchemas``: the system.* and google.* schemas every store has (the
ones the SDK's schema classes, Experiments and Pipelines write), and schemas a user registers.

A node's ``schema_title`` must name one of them (Vertex: "Schema title and version is expected to be
registered"); built-in titles take any version, as the SDK's classes send their own.
"""
from __future__ import annotations

import time

from modelyard.platform.api import tracking_messages as msg
from modelyard.platform.api.errors import ApiError, invalid
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.api.tracking_names import check_chosen_id
from modelyard.platform.state.metadata_db import MetadataDB

ARTIFACT, EXECUTION, CONTEXT = "ARTIFACT_TYPE", "EXECUTION_TYPE", "CONTEXT_TYPE"
SCHEMA_TYPES = (ARTIFACT, EXECUTION, CONTEXT)
_KIND_TYPE = {"artifacts": ARTIFACT, "executions": EXECUTION, "contexts": CONTEXT}

# title -> (type, version, its properties)
BUILT_IN: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "system.Artifact": (ARTIFACT, "0.0.1", ()),
    "system.Dataset": (ARTIFACT, "0.0.1", ("container_format", "payload_format")),
    "system.Model": (ARTIFACT, "0.0.1", ("framework", "framework_version", "payload_format")),
    "system.Metrics": (ARTIFACT, "0.0.1", ("accuracy", "precision", "recall", "f1score", "mean_absolute_error",
                                           "mean_squared_error")),
    "system.ClassificationMetrics": (ARTIFACT, "0.0.1", ("confusionMatrix", "confidenceMetrics")),
    "system.SlicedClassificationMetrics": (ARTIFACT, "0.0.1", ()),
    "system.HTML": (ARTIFACT, "0.0.1", ()),
    "system.Markdown": (ARTIFACT, "0.0.1", ()),
    "google.VertexDataset": (ARTIFACT, "0.0.1", ("resourceName",)),
    "google.VertexModel": (ARTIFACT, "0.0.1", ("resourceName",)),
    "google.VertexEndpoint": (ARTIFACT, "0.0.1", ("resourceName",)),
    "google.VertexBatchPredictionJob": (ARTIFACT, "0.0.1", ("resourceName",)),
    "google.UnmanagedContainerModel": (ARTIFACT, "0.0.1", ("predictSchemata", "containerSpec")),
    "google.BQTable": (ARTIFACT, "0.0.1", ("projectId", "datasetId", "tableId")),
    "google.VertexTensorboardRun": (ARTIFACT, "0.0.1", ("resourceName",)),
    "google.ClassificationMetrics": (ARTIFACT, "0.0.1", ("aggregationType", "aggregationThreshold",
                                                         "recall", "precision", "f1Score", "accuracy", "auPrc",
                                                         "auRoc", "logLoss", "confusionMatrix",
                                                         "confidenceMetrics")),
    "google.RegressionMetrics": (ARTIFACT, "0.0.1", ("rootMeanSquaredError", "meanAbsoluteError",
                                                     "meanAbsolutePercentageError", "rSquared",
                                                     "rootMeanSquaredLogError")),
    "google.ForecastingMetrics": (ARTIFACT, "0.0.1", ("rootMeanSquaredError", "meanAbsoluteError",
                                                      "meanAbsolutePercentageError", "rSquared",
                                                      "rootMeanSquaredLogError", "weightedAbsolutePercentageError",
                                                      "rootMeanSquaredPercentageError",
                                                      "symmetricMeanAbsolutePercentageError")),
    "google.ExperimentModel": (ARTIFACT, "0.0.1", ("frameworkName", "frameworkVersion", "modelFile",
                                                   "modelClass", "predictSchemata")),
    "system.Run": (EXECUTION, "0.0.1", ()),
    "system.ContainerExecution": (EXECUTION, "0.0.1", ()),
    "system.CustomJobExecution": (EXECUTION, "0.0.1", ()),
    "system.DAGExecution": (EXECUTION, "0.0.1", ()),
    "system.ImporterExecution": (EXECUTION, "0.0.1", ()),
    "system.Experiment": (CONTEXT, "0.0.1", ()),
    "system.ExperimentRun": (CONTEXT, "0.0.1", ()),
    "system.Pipeline": (CONTEXT, "0.0.1", ()),
    "system.PipelineRun": (CONTEXT, "0.0.1", ()),
}


def schema_id(title: str, version: str) -> str:
    """Vertex's ids of its own schemas: ``system.Dataset`` 0.0.1 -> ``system-dataset-v0-0-1``."""
    return f"{title.replace('.', '-').lower()}-v{version.replace('.', '-')}"


def _yaml(title: str, properties: tuple[str, ...]) -> str:
    lines = [f"title: {title}", "type: object"]
    if properties:
        lines.append("properties:")
        lines += [f"  {p}:\n    type: object" for p in properties]
    return "\n".join(lines) + "\n"


def _built_in_rows(store: str) -> list[dict]:
    return [{"store": store, "id": schema_id(title, version), "title": title, "version": version,
             "schema_type": kind, "schema": _yaml(title, props), "description": "", "created": 0.0}
            for title, (kind, version, props) in BUILT_IN.items()]


def render(row: dict) -> dict:
    return {"name": f"{row['store']}/metadataSchemas/{row['id']}", "schemaVersion": row["version"],
            "schema": row["schema"], "schemaType": row["schema_type"], "createTime": rfc3339(row["created"]),
            "description": row["description"]}


def all_rows(db: MetadataDB, store: str) -> list[dict]:
    return _built_in_rows(store) + db.schemas(store)


def check_title(db: MetadataDB, store: str, kind: str, title: object) -> str:
    """A node's schema title: known to the store, and of the node's type."""
    if not isinstance(title, str) or not title:
        raise invalid(f"schema_title is required: a {kind[:-1]} names the schema its metadata follows, "
                      "e.g. system.Artifact.")
    built = BUILT_IN.get(title)
    if built is not None:
        found = built[0]
    else:
        found = next((r["schema_type"] for r in db.schemas(store) if r["title"] == title), None)
        if found is None:
            raise invalid(f"schema_title {title!r} is not a schema of {store}: register it first "
                          "(metadataSchemas.create), or use a system.* or google.* schema.")
    if found != _KIND_TYPE[kind]:
        raise invalid(f"schema_title {title!r} is a schema of type {found}, not of {_KIND_TYPE[kind]}.")
    return title


def create(db: MetadataDB, store: str, body: dict, schema_id_arg: str | None) -> dict:
    msg.check_message(body, "MetadataSchema")
    text = msg.get(body, "schema")
    kind = msg.get(body, "schemaType")
    version = msg.get(body, "schemaVersion", "0.0.1")
    if not isinstance(text, str) or not text.strip():
        raise invalid("MetadataSchema.schema is required: the OpenAPI YAML of the schema, with its title.")
    if kind not in SCHEMA_TYPES:
        raise invalid(f"MetadataSchema.schema_type is one of {', '.join(SCHEMA_TYPES)}, not {kind!r}.")
    title = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("title:")), "")
    if not title:
        raise invalid("MetadataSchema.schema has no top-level 'title:' line: the title nodes name it by.")
    if title in BUILT_IN:
        raise ApiError("ALREADY_EXISTS", f"MetadataSchema title {title!r} is a system schema.")
    rid = check_chosen_id(schema_id_arg, "metadataSchema") if schema_id_arg else schema_id(title, str(version))
    row = {"store": store, "id": rid, "title": title, "version": str(version), "schema_type": kind,
           "schema": text, "description": msg.get(body, "description", "") or "", "created": time.time()}
    db.add_schema(row)
    return render(row)


def get(db: MetadataDB, store: str, rid: str) -> dict:
    for row in all_rows(db, store):
        if row["id"] == rid:
            return render(row)
    raise ApiError("NOT_FOUND", f"MetadataSchema {store}/metadataSchemas/{rid} is not found.")
