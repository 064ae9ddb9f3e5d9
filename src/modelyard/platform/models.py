"""Vertex AI ``Model`` resources: upload (new model or new version), get, list, delete."""
from __future__ import annotations

import asyncio
import contextvars
import time

from modelyard.platform import artifacts, names
from modelyard.platform.errors import ApiError, invalid, not_found
from modelyard.platform.names import Route
from modelyard.platform.operations import EMPTY, typed
from modelyard.platform.timefmt import rfc3339

# Whether this request asked for enums as numbers ($alt=json;enum-encoding=int, as the SDK does).
# A context variable: each request is its own task, so concurrent requests never see another's choice.
ENUM_INTS: contextvars.ContextVar[bool] = contextvars.ContextVar("enum_ints", default=False)

# Model.DeploymentResourcesType: DEDICATED_RESOURCES = 1, AUTOMATIC_RESOURCES = 2.
_DEPLOYMENT_TYPES = ((1, "DEDICATED_RESOURCES"), (2, "AUTOMATIC_RESOURCES"))


async def upload(p, route: Route, body: dict) -> dict:
    spec = body.get("model")
    if not isinstance(spec, dict):
        raise invalid("UploadModelRequest.model is required.")
    display_name = spec.get("displayName")
    if not isinstance(display_name, str) or not display_name.strip():
        raise invalid("Model.display_name is required.")
    # Off the event loop: a gs:// or s3:// artifact is downloaded here.
    path = await asyncio.to_thread(artifacts.resolve, spec.get("artifactUri", ""), p.config.artifact_roots,
                                   p.config.state_dir)
    now = time.time()
    parent_model = body.get("parentModel")
    if parent_model:
        model_id, _ = names.parse_resource(parent_model, "models")
        model = _get_in(p, route, model_id)
        version_id = str(max(int(v) for v in p.store.version_ids(model_id)) + 1)
    else:
        model_id = body.get("modelId") or names.new_id()
        model = None
        version_id = "1"
    version = {"model_id": model_id, "version_id": version_id, "artifact_uri": spec["artifactUri"],
               "local_path": str(path), "container": spec.get("containerSpec") or {},
               "aliases": [a for a in spec.get("versionAliases") or [] if isinstance(a, str)], "created": now}
    if model is None:
        p.store.add_model({"id": model_id, "parent": route.parent, "display_name": display_name,
                           "description": spec.get("description") or "", "labels": spec.get("labels") or {},
                           "created": now, "updated": now}, version)
    else:
        p.store.add_version(version)
    name = names.model_name(route.parent, model_id)
    return p.ops.done(route.parent, "models", model_id, "UploadModelOperationMetadata",
                      typed("UploadModelResponse", {"model": name, "modelVersionId": version_id}))


def get(p, route: Route) -> dict:
    model = _get_in(p, route, route.resource_id)
    return render(p, model, p.store.get_version(model["id"], route.version))


def list_(p, route: Route) -> dict:
    out = [render(p, m, p.store.get_version(m["id"], None)) for m in p.store.list_models(route.parent)]
    return {"models": out} if out else {}


def delete(p, route: Route) -> dict:
    _get_in(p, route, route.resource_id)
    p.store.delete_model(route.resource_id)
    p.refresh()
    return p.ops.done(route.parent, "models", route.resource_id, "DeleteOperationMetadata", {"@type": EMPTY})


def _get_in(p, route: Route, model_id: str) -> dict:
    model = p.store.get_model(model_id)
    if model["parent"] != route.parent:
        raise not_found("Model", model_id)
    return model


def render(p, model: dict, version: dict) -> dict:
    latest = max(int(v) for v in p.store.version_ids(model["id"]))
    aliases = list(version["aliases"] or [])
    if int(version["version_id"]) == latest:
        aliases = ["default", *aliases]
    deployed = [{"endpoint": names.endpoint_name(model["parent"], dm["endpoint_id"]), "deployedModelId": dm["id"]}
                for dm in p.store.deployed_models() if dm["model_id"] == model["id"]
                and dm["version_id"] == version["version_id"]]
    out = {
        "name": names.model_name(model["parent"], model["id"]),
        "displayName": model["display_name"],
        "description": model["description"],
        "versionId": version["version_id"],
        "versionAliases": aliases,
        "versionCreateTime": rfc3339(version["created"]),
        "versionUpdateTime": rfc3339(version["created"]),
        "createTime": rfc3339(model["created"]),
        "updateTime": rfc3339(model["updated"]),
        "artifactUri": version["artifact_uri"],
        "containerSpec": version["container"] or {},
        "labels": model["labels"] or {},
        "supportedDeploymentResourcesTypes": [n if ENUM_INTS.get() else s for n, s in _DEPLOYMENT_TYPES],
        "etag": f'"{int(model["updated"] * 1e6)}"',
    }
    if deployed:
        out["deployedModels"] = deployed
    return out


def check_deployable(p, model_ref: str, parent: str) -> tuple[dict, dict]:
    """(model, version) named by a DeployedModel.model reference, checked to exist and load."""
    if not isinstance(model_ref, str) or not model_ref:
        raise invalid("DeployedModel.model is required.")
    model_id, version_id = names.parse_resource(model_ref, "models")
    model = p.store.get_model(model_id)
    if model["parent"] != parent:
        raise not_found("Model", model_id)
    version = p.store.get_version(model_id, version_id)
    from pathlib import Path

    try:
        artifacts.check_saved_model(Path(version["local_path"]), version["artifact_uri"])
    except ApiError as exc:
        raise ApiError("FAILED_PRECONDITION", f"Model {model_id}@{version['version_id']} cannot be deployed: "
                       f"{exc.message}") from None
    return model, version
