"""Vertex AI resource names, parsed and formatted in one place.

A request path below ``/v1/`` names one of:

    projects/{p}/locations/{l}/models:upload           (a verb on a collection)
    projects/{p}/locations/{l}/models/{id}[@{version}]  (a resource)
    projects/{p}/locations/{l}/endpoints/{id}:predict   (a verb on a resource)
    projects/{p}/locations/{l}/batchPredictionJobs/{id}:cancel  (jobs: customJobs, hyperparameterTuningJobs, trainingPipelines too)
    projects/{p}/locations/{l}[/{collection}/{id}]/operations/{op}
    projects/{p}/locations/{l}[/{collection}/{id}]/operations      (ListOperations)

Ids are decimal strings, as Vertex AI hands out; a model may also have the id its uploader chose
(``UploadModelRequest.model_id``). A model version is named by its number or by one of its aliases
(``models/{id}@3``, ``models/{id}@prod``); ``@-`` means the model itself, as in Vertex AI.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from modelyard.platform.api.errors import ApiError

COLLECTIONS = ("models", "endpoints", "batchPredictionJobs", "customJobs", "hyperparameterTuningJobs",
               "trainingPipelines", "deploymentResourcePools")
JOB_COLLECTIONS = COLLECTIONS[2:6]
POOLS = "deploymentResourcePools"
# CreateDeploymentResourcePoolRequest.deployment_resource_pool_id: chosen by the client, Vertex's rule.
_POOL_ID = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
_ID = re.compile(r"^[0-9]{1,30}$")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# UploadModelRequest.model_id: up to 63 characters of [a-z0-9_-], the first not a digit nor a hyphen
# (so a chosen id never looks like a generated one).
_MODEL_ID = re.compile(r"^[a-z_][a-z0-9_-]{0,62}$")
# Model.version_aliases: [a-z][a-zA-Z0-9-]{0,126}[a-z0-9], never a bare number (that is a version id).
_ALIAS = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]$")
_VERSION_ID = re.compile(r"^[0-9]{1,18}$")
DEFAULT_ALIAS = "default"


@dataclass(frozen=True)
class Route:
    """What a path names; ``resource_id``/``version``/``operation_id``/``verb`` are None when absent."""

    project: str
    location: str
    collection: str | None = None  # "models", "endpoints", or None for location-level operations
    resource_id: str | None = None
    version: str | None = None
    operation_id: str | None = None
    verb: str | None = None
    operations: bool = False  # the path names a list of operations (a location's, or one resource's)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"


def parse_path(path: str) -> Route:
    """``projects/p/locations/l/...`` (no leading ``/v1/``) -> Route, or NOT_FOUND/INVALID_ARGUMENT."""
    verb = None
    head, colon, tail = path.rpartition(":")
    if colon and "/" not in tail:
        path, verb = head, tail
    parts = path.strip("/").split("/")
    if len(parts) < 4 or parts[0] != "projects" or parts[2] != "locations":
        raise ApiError("NOT_FOUND", f"No API at /v1/{path}: expected projects/{{p}}/locations/{{l}}/...")
    project, location = parts[1], parts[3]
    for segment in (project, location):
        if not _SEGMENT.match(segment):
            raise ApiError("INVALID_ARGUMENT", f"Invalid project or location {segment!r}.")
    rest = parts[4:]
    route = Route(project, location)
    if rest and rest[-1] == "operations" and verb is None and len(rest) in (1, 3):  # ListOperations
        if len(rest) == 1:
            return Route(project, location, operations=True)
        if rest[0] not in COLLECTIONS:
            raise ApiError("NOT_FOUND", f"No API at /v1/{path}: collections are {', '.join(COLLECTIONS)}.")
        resource_id, _ = _split_resource(rest[1], rest[0])
        return Route(project, location, rest[0], resource_id, operations=True)
    if len(rest) >= 2 and rest[-2] == "operations":
        op_id = _check_id(rest[-1], "operation")
        rest = rest[:-2]
        route = Route(project, location, operation_id=op_id)
        if not rest:
            return route
    if not rest or rest[0] not in COLLECTIONS:
        raise ApiError("NOT_FOUND", f"No API at /v1/{path}: collections are {', '.join(COLLECTIONS)}.")
    collection = rest[0]
    if len(rest) == 1:
        return Route(project, location, collection, operation_id=route.operation_id, verb=verb)
    if len(rest) != 2:
        raise ApiError("NOT_FOUND", f"No API at /v1/{path}.")
    resource_id, version = _split_resource(rest[1], collection)
    return Route(project, location, collection, resource_id, version, route.operation_id, verb)


def parse_resource(name: str, collection: str) -> tuple[str, str | None]:
    """A full or short resource name (``projects/.../models/12@3`` or ``12``) -> (id, version)."""
    short = name.rsplit(f"{collection}/", 1)[-1] if f"{collection}/" in name else name
    if "/" in short:
        raise ApiError("INVALID_ARGUMENT", f"Invalid {collection[:-1]} resource name {name!r}.")
    return _split_resource(short, collection)


def _split_resource(segment: str, collection: str) -> tuple[str, str | None]:
    """``12``, ``my_model@3``, ``my_model@prod`` -> (id, version reference or None)."""
    resource, at, version = segment.partition("@")
    if collection == POOLS and not at:
        return check_pool_id(resource), None
    if collection != "models":
        if at:
            raise ApiError("INVALID_ARGUMENT", f"Invalid {collection[:-1]} id {segment!r}: only models have versions.")
        return _check_id(resource, collection[:-1]), None
    if not (_ID.match(resource) or _MODEL_ID.match(resource)):
        raise ApiError("INVALID_ARGUMENT", f"Invalid model id {resource!r}: a model id is a number, or up to 63 "
                       "characters of [a-z0-9_-] starting with a letter or an underscore.")
    if not at or version == "-":  # models/{id}@- names the model itself
        return resource, None
    if not (_VERSION_ID.match(version) or _ALIAS.match(version)):
        raise ApiError("INVALID_ARGUMENT", f"Invalid model version {version!r} in {segment!r}: a version id "
                       "(a number) or an alias ([a-z][a-zA-Z0-9-]{0,126}[a-z0-9]).")
    return resource, version


def check_model_id(value: object) -> str:
    """A model id chosen at upload (``UploadModelRequest.model_id``), checked by Vertex AI's rule."""
    if not isinstance(value, str) or not _MODEL_ID.match(value):
        raise ApiError("INVALID_ARGUMENT", f"Invalid model_id {value!r}: up to 63 characters of [a-z0-9_-], "
                       "the first a lowercase letter or an underscore (not a digit nor a hyphen).")
    return value


def check_pool_id(value: object) -> str:
    """A deployment resource pool's id (chosen at create), checked by Vertex AI's rule."""
    if not isinstance(value, str) or not _POOL_ID.match(value):
        raise ApiError("INVALID_ARGUMENT", f"Invalid deployment_resource_pool_id {value!r}: 1 to 63 characters of "
                       "[a-z0-9-], starting with a letter and not ending with a hyphen.")
    return value


def check_alias(value: object) -> str:
    """A version alias, checked by Vertex AI's rule (so it can never be mistaken for a version id)."""
    if not isinstance(value, str) or not _ALIAS.match(value):
        raise ApiError("INVALID_ARGUMENT", f"Invalid version alias {value!r}: an alias matches "
                       "[a-z][a-zA-Z0-9-]{0,126}[a-z0-9] (2 to 128 characters, starting with a letter).")
    return value


def is_version_id(ref: str) -> bool:
    """Whether a version reference is a version number (else it is an alias)."""
    return bool(_VERSION_ID.match(ref))


def _check_id(value: str, kind: str) -> str:
    if not _ID.match(value):
        raise ApiError("INVALID_ARGUMENT", f"Invalid {kind} id {value!r}: ids are decimal numbers.")
    return value


def new_id() -> str:
    """A fresh numeric id, random so that several control planes on one database never collide."""
    return str(secrets.randbelow(9 * 10**17) + 10**17)


def model_name(parent: str, model_id: str, version_id: str | None = None) -> str:
    return f"{parent}/models/{model_id}" + (f"@{version_id}" if version_id else "")


def endpoint_name(parent: str, endpoint_id: str) -> str:
    return f"{parent}/endpoints/{endpoint_id}"


def pool_name(parent: str, pool_id: str) -> str:
    return f"{parent}/{POOLS}/{pool_id}"


def operation_name(parent: str, collection: str | None, resource_id: str | None, op_id: str) -> str:
    if collection and resource_id:
        return f"{parent}/{collection}/{resource_id}/operations/{op_id}"
    return f"{parent}/operations/{op_id}"
