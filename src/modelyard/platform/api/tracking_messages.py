"""The fields of the Vertex AI v1 messages of ML Metadata and of the TensorBoard API, as data (their
JSON names, read off the v1 protos), and the check that refuses any other field as Google's JSON
parser does ("Unknown name ... Cannot find field"), in nested messages too."""
from __future__ import annotations

from modelyard.platform.api import fields
from modelyard.platform.api.errors import invalid

_NODE = ("name", "displayName", "etag", "labels", "createTime", "updateTime", "schemaTitle", "schemaVersion",
         "metadata", "description")
_TB = ("name", "displayName", "description", "createTime", "updateTime", "labels", "etag")

# message -> (its fields, {field: the listed message it holds, alone or in a list})
MESSAGES: dict[str, tuple[frozenset[str], dict[str, str]]] = {
    "Artifact": (frozenset((*_NODE, "uri", "state")), {}),
    "Context": (frozenset((*_NODE, "parentContexts")), {}),
    "Execution": (frozenset((*_NODE, "state")), {}),
    "MetadataStore": (frozenset(("name", "createTime", "updateTime", "encryptionSpec", "description", "state",
                                 "dataplexConfig")), {}),
    "MetadataSchema": (frozenset(("name", "schemaVersion", "schema", "schemaType", "createTime", "description")),
                       {}),
    "AddExecutionEventsRequest": (frozenset(("execution", "events")), {"events": "Event"}),
    "Event": (frozenset(("artifact", "execution", "eventTime", "type", "labels")), {}),
    "AddContextArtifactsAndExecutionsRequest": (frozenset(("context", "artifacts", "executions")), {}),
    "AddContextChildrenRequest": (frozenset(("context", "childContexts")), {}),
    "RemoveContextChildrenRequest": (frozenset(("context", "childContexts")), {}),
    "PurgeRequest": (frozenset(("parent", "filter", "force")), {}),
    "Tensorboard": (frozenset((*_TB, "encryptionSpec", "blobStoragePathPrefix", "runCount", "isDefault",
                               "satisfiesPzs", "satisfiesPzi")), {}),
    "TensorboardExperiment": (frozenset((*_TB, "source")), {}),
    "TensorboardRun": (frozenset(_TB), {}),
    "TensorboardTimeSeries": (frozenset((*(f for f in _TB if f != "labels"), "valueType", "pluginName", "pluginData",
                                         "metadata")), {}),
    "WriteTensorboardRunDataRequest": (frozenset(("tensorboardRun", "timeSeriesData")),
                                       {"timeSeriesData": "TimeSeriesData"}),
    "WriteTensorboardExperimentDataRequest": (frozenset(("tensorboardExperiment", "writeRunDataRequests")),
                                              {"writeRunDataRequests": "WriteTensorboardRunDataRequest"}),
    "TimeSeriesData": (frozenset(("tensorboardTimeSeriesId", "valueType", "values")),
                       {"values": "TimeSeriesDataPoint"}),
    "TimeSeriesDataPoint": (frozenset(("scalar", "tensor", "blobs", "wallTime", "step")), {}),
    "BatchCreateTensorboardRunsRequest": (frozenset(("parent", "requests")),
                                          {"requests": "CreateTensorboardRunRequest"}),
    "CreateTensorboardRunRequest": (frozenset(("parent", "tensorboardRun", "tensorboardRunId")),
                                    {"tensorboardRun": "TensorboardRun"}),
    "BatchCreateTensorboardTimeSeriesRequest": (frozenset(("parent", "requests")),
                                                {"requests": "CreateTensorboardTimeSeriesRequest"}),
    "CreateTensorboardTimeSeriesRequest": (frozenset(("parent", "tensorboardTimeSeriesId", "tensorboardTimeSeries")),
                                           {"tensorboardTimeSeries": "TensorboardTimeSeries"}),
    "ExportTensorboardTimeSeriesDataRequest": (frozenset(("tensorboardTimeSeries", "filter", "pageSize",
                                                          "pageToken", "orderBy")), {}),
}
_NAMED = {"Artifact", "Context", "Execution", "Tensorboard", "TensorboardExperiment", "TensorboardRun",
          "TensorboardTimeSeries"}


def check_message(doc: dict, message: str, at: str = "") -> None:
    """Refuses a field ``message`` does not know (by JSON or proto name), and display names,
    descriptions and labels beyond Vertex's limits (``fields``' rules)."""
    known, nested = MESSAGES[message]
    for key in doc:
        if key not in known and fields._camel(key) not in known:
            where = f" at '{at}'" if at else ""
            raise invalid(f'Invalid JSON payload received. Unknown name "{key}"{where}: Cannot find field.')
    if message in _NAMED:
        for name, check in (("displayName", fields.display_name), ("description", fields.description),
                            ("labels", fields.labels)):
            for spelling in (name, fields._snake(name)):
                if spelling in doc:
                    check(doc[spelling], f"{message}.{fields._snake(name)}")
    for key, inner in nested.items():
        value = doc.get(key, doc.get(fields._snake(key)))
        path = f"{at}.{fields._snake(key)}" if at else fields._snake(key)
        if isinstance(value, dict):
            check_message(value, inner, path)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    check_message(item, inner, f"{path}[{i}]")


def get(doc: dict, name: str, default=None):
    """A field by its JSON name or its proto name, as Google's parser takes either."""
    if name in doc:
        return doc[name]
    return doc.get(fields._snake(name), default)
