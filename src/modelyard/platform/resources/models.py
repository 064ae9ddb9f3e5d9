"""Vertex AI ``Model`` resources and their versions: upload (a new model or a new version), get, list,
listVersions, patch, mergeVersionAliases, delete (a model, or one version)."""
from __future__ import annotations

import asyncio
import contextvars
import time

from modelyard.platform.api import aliases, fields, list_filter, names
from modelyard.platform.resources import artifacts, prebuilt_images
from modelyard.platform.api.errors import ApiError, invalid, not_found
from modelyard.platform.api.names import Route
from modelyard.platform.resources.operations import EMPTY, typed
from modelyard.platform.api.timefmt import rfc3339

# Whether this request asked for enums as numbers ($alt=json;enum-encoding=int, as the SDK does).
# A context variable: each request is its own task, so concurrent requests never see another's choice.
ENUM_INTS: contextvars.ContextVar[bool] = contextvars.ContextVar("enum_ints", default=False)

# Model.DeploymentResourcesType: DEDICATED_RESOURCES = 1, AUTOMATIC_RESOURCES = 2.
_DEPLOYMENT_TYPES = ((1, "DEDICATED_RESOURCES"), (2, "AUTOMATIC_RESOURCES"), (3, "SHARED_RESOURCES"))


async def upload(p, route: Route, body: dict) -> dict:
    """``models:upload``: a new model (its id chosen by ``modelId`` or generated), or with ``parentModel``
    a new version of one. A new version takes ``default`` only if its ``versionAliases`` say so (the
    SDK adds it unless ``is_default_version=False``); a model's first version always holds it."""
    spec = body.get("model")
    if not isinstance(spec, dict):
        raise invalid("UploadModelRequest.model is required.")
    display_name = spec.get("displayName")
    if not isinstance(display_name, str) or not display_name.strip():
        raise invalid("Model.display_name is required.")
    version_aliases = aliases.check_list(spec.get("versionAliases"))
    labels = check_labels(spec.get("labels"))
    description = _text(spec, "description")
    version_description = _text(spec, "versionDescription")
    model_id = body.get("modelId") or None
    if model_id is not None:
        model_id = names.check_model_id(model_id)
    parent_model = body.get("parentModel")
    if parent_model:
        parent_id, parent_version = names.parse_resource(parent_model, "models")
        if parent_version is not None:
            raise invalid(f"UploadModelRequest.parent_model {parent_model!r} names a version: name the model.")
        if model_id is not None and model_id != parent_id:
            raise invalid(f"UploadModelRequest.model_id {model_id!r} differs from parent_model {parent_model!r}.")
        model_id = parent_id
        _get_in(p, route, model_id)  # before the artifact is fetched: a wrong parent costs nothing
    elif model_id is not None:
        _absent(p, model_id)
    # Off the event loop: a gs:// or s3:// artifact is downloaded here.
    path = await asyncio.to_thread(artifacts.resolve, spec.get("artifactUri", ""), p.config.artifact_roots,
                                   p.config.state_dir)
    prebuilt_images.check_upload(spec.get("containerSpec") or {}, path, spec["artifactUri"])  # sklearn/XGBoost
    now = time.time()
    version = {"model_id": model_id, "version_id": "1", "artifact_uri": spec["artifactUri"],
               "local_path": str(path), "container": spec.get("containerSpec") or {}, "aliases": version_aliases,
               "created": now, "updated": now, "description": version_description}
    if parent_model:
        version_id = p.store.add_version({**version, "labels": labels or None})
    else:
        model_id = model_id or names.new_id()
        version_id = "1"
        p.store.add_model({"id": model_id, "parent": route.parent, "display_name": display_name,
                           "description": description, "labels": labels, "created": now, "updated": now},
                          {**version, "model_id": model_id,
                           "aliases": aliases.first_version(version_aliases)})
    name = names.model_name(route.parent, model_id)
    return p.ops.done(route.parent, "models", model_id, "UploadModelOperationMetadata",
                      typed("UploadModelResponse", {"model": name, "modelVersionId": version_id}))


def get(p, route: Route) -> dict:
    """A model as its default version, or the version ``@N`` / ``@alias`` names (then named ``@N``)."""
    model = _get_in(p, route, route.resource_id)
    return render(p, model, p.store.get_version(model["id"], route.version), versioned=route.version is not None)


async def list_(p, route: Route, query) -> dict:
    """``GET models``: one page of the location's models (each as its default version), filtered and
    ordered by the store (``filter`` on model, display_name, labels, create_time, update_time)."""
    request = list_filter.list_request(query, list_filter.MODEL_FIELDS, list_filter.ORDERABLE, "Model", route.parent)
    return await asyncio.to_thread(_models_page, p, route.parent, request)  # database work off the event loop


def _models_page(p, parent: str, request: list_filter.ListRequest) -> dict:
    rows, token = p.store.models_page(parent, request)
    ids = [m["id"] for m in rows]
    versions = p.store.default_versions(ids)
    deployed = p.store.deployed_models(model_ids=ids)
    out: dict = {"models": [render(p, m, versions[m["id"]], deployed=deployed) for m in rows]} if rows else {}
    if token:
        out["nextPageToken"] = token
    return out


def list_versions(p, route: Route, query) -> dict:
    """``models/{id}:listVersions``: one page of the versions, each named ``models/{id}@N``; ``filter`` on
    their (merged) labels, create_time, update_time, ``orderBy`` create_time / update_time [desc]."""
    if route.version is not None:
        raise invalid("listVersions takes the model's name, without a version.")
    model = _get_in(p, route, route.resource_id)
    request = list_filter.list_request(query, list_filter.VERSION_FIELDS, list_filter.VERSION_ORDERABLE,
                                       "Model version", model["id"])
    rows, token = p.store.versions_page(model["id"], request)
    deployed = p.store.deployed_models(model_ids=[model["id"]])
    out: dict = {"models": [render(p, model, v, versioned=True, deployed=deployed) for v in rows]} if rows else {}
    if token:
        out["nextPageToken"] = token
    return out


def patch(p, route: Route, body: dict, update_mask: str | None) -> dict:
    """``PATCH models/{id}[@version]`` with an ``updateMask``. The model's fields (display name,
    description, labels) on its plain name; a version's (version description, labels) on ``@version``;
    version aliases on either (the default version for a plain name). Vertex refuses a request that
    mixes the two kinds, and so does this."""
    model = _get_in(p, route, route.resource_id)
    fields = [_FIELD_NAMES.get(f.strip(), f.strip()) for f in (update_mask or "").split(",") if f.strip()]
    if update_mask in (None, "{}") or not fields:
        raise invalid("UpdateModelRequest.update_mask is required: the fields to change, e.g. "
                      "updateMask=displayName,labels.")
    for f in fields:
        if f not in _MODEL_FIELDS + _VERSION_FIELDS + _EITHER_FIELDS:
            raise invalid(f"update_mask names {f!r}, which cannot be updated: a model's displayName, description, "
                          "labels and versionAliases, a version's versionDescription, labels and versionAliases.")
        if route.version is not None and f in _MODEL_FIELDS:
            raise ApiError("FAILED_PRECONDITION", f"{f} is a field of the model, not of one version: update "
                           f"models/{model['id']} without @{route.version}.")
        if route.version is None and f in _VERSION_FIELDS:
            raise ApiError("FAILED_PRECONDITION", f"{f} is a field of a version: update models/{model['id']}@VERSION.")
    model_changes, version_changes, new_aliases = {}, {}, None
    for f in fields:
        if f == "displayName":
            value = body.get("displayName")
            if not isinstance(value, str) or not value.strip():
                raise invalid("Model.display_name cannot be empty.")
            model_changes["display_name"] = value
        elif f == "description":
            model_changes["description"] = _text(body, "description")
        elif f == "versionDescription":
            version_changes["description"] = _text(body, "versionDescription")
        elif f == "labels":
            target = version_changes if route.version is not None else model_changes
            target["labels"] = check_labels(body.get("labels"))
        elif f == "versionAliases":
            new_aliases = aliases.check_list(body.get("versionAliases"))
    if model_changes:
        p.store.update_model(model["id"], model_changes)
    version_id = None
    if version_changes or new_aliases is not None:
        version_id = p.store.update_version(model["id"], route.version, version_changes, new_aliases=new_aliases)
    shown = p.store.get_version(model["id"], version_id or route.version)
    return render(p, p.store.get_model(model["id"]), shown, versioned=route.version is not None)


def merge_version_aliases(p, route: Route, body: dict) -> dict:
    """``models/{id}@version:mergeVersionAliases``: add aliases to the version (taking them from others)
    and remove ``-alias``; the version as it is afterwards."""
    model = _get_in(p, route, route.resource_id)
    if route.version is None:
        raise invalid("mergeVersionAliases needs a version: models/{id}@{version}.")
    add, remove = aliases.parse_merge(body.get("versionAliases"))
    version_id = p.store.update_version(model["id"], route.version, {}, add=add, remove=remove)
    return render(p, p.store.get_model(model["id"]), p.store.get_version(model["id"], version_id), versioned=True)


def delete(p, route: Route) -> dict:
    """``DELETE models/{id}``: the model and every version; ``DELETE models/{id}@v[:deleteVersion]``: one version."""
    _get_in(p, route, route.resource_id)
    if route.version is not None:
        p.store.delete_version(route.resource_id, route.version)
    elif route.verb == "deleteVersion":
        raise invalid("deleteVersion needs a version: models/{id}@{version}:deleteVersion.")
    else:
        p.store.delete_model(route.resource_id)
    return p.ops.done(route.parent, "models", route.resource_id, "DeleteOperationMetadata", {"@type": EMPTY})


# updateMask paths as the REST transport sends them (camelCase) or as written by hand (snake_case).
_FIELD_NAMES = {"display_name": "displayName", "version_description": "versionDescription",
                "version_aliases": "versionAliases"}
_MODEL_FIELDS = ("displayName", "description")
_VERSION_FIELDS = ("versionDescription",)
_EITHER_FIELDS = ("labels", "versionAliases")


def check_labels(labels: object) -> dict:
    """Labels as Vertex documents them (the one rule: ``fields.labels``)."""
    return fields.labels(labels, "Model.labels")


def _text(spec: dict, field: str) -> str:
    value = spec.get(field) or ""
    if not isinstance(value, str):
        raise invalid(f"Model.{field} must be a string.")
    return value


def _absent(p, model_id: str) -> None:
    try:
        p.store.get_model(model_id)
    except ApiError as exc:
        if exc.status == "NOT_FOUND":
            return
        raise
    raise ApiError("ALREADY_EXISTS", f"Model {model_id} already exists: upload with parent_model to add a version.")


def _get_in(p, route: Route, model_id: str) -> dict:
    model = p.store.get_model(model_id)
    if model["parent"] != route.parent:
        raise not_found("Model", model_id)
    return model


def render(p, model: dict, version: dict, versioned: bool = False, deployed: list[dict] | None = None) -> dict:
    """A Model resource: the model's fields with one version's; named ``models/{id}@N`` when ``versioned``
    (a version asked for by number or alias, and every entry of listVersions). ``deployed``: deployed
    models read already (a list page reads them once for all its models), else this model's are read."""
    if deployed is None:
        deployed = p.store.deployed_models(model_ids=[model["id"]])
    deployed = [{"endpoint": names.endpoint_name(model["parent"], dm["endpoint_id"]), "deployedModelId": dm["id"]}
                for dm in deployed if dm["model_id"] == model["id"] and dm["version_id"] == version["version_id"]]
    out = {
        "name": names.model_name(model["parent"], model["id"], version["version_id"] if versioned else None),
        "displayName": model["display_name"],
        "description": model["description"],
        "versionId": version["version_id"],
        "versionAliases": list(version["aliases"] or []),
        "versionCreateTime": rfc3339(version["created"]),
        "versionUpdateTime": rfc3339(version.get("updated") or version["created"]),
        "createTime": rfc3339(model["created"]),
        "updateTime": rfc3339(model["updated"]),
        "artifactUri": version["artifact_uri"],
        "containerSpec": version["container"] or {},
        # Vertex merges the model's labels and the version's when it returns a version.
        "labels": {**(model["labels"] or {}), **(version.get("labels") or {})},
        "supportedDeploymentResourcesTypes": [n if ENUM_INTS.get() else s for n, s in _DEPLOYMENT_TYPES],
        "etag": f'"{int(model["updated"] * 1e6)}"',
    }
    if version.get("description"):
        out["versionDescription"] = version["description"]
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
