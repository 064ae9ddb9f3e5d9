"""Vertex AI resource names, parsed and formatted in one place.

A request path below ``/v1/`` names one of:

    projects/{p}/locations/{l}/models:upload           (a verb on a collection)
    projects/{p}/locations/{l}/models/{id}[@{version}]  (a resource)
    projects/{p}/locations/{l}/endpoints/{id}:predict   (a verb on a resource)
    projects/{p}/locations/{l}/batchPredictionJobs/{id}:cancel  (jobs: customJobs, hyperparameterTuningJobs too)
    projects/{p}/locations/{l}[/{collection}/{id}]/operations/{op}

Ids are decimal strings, as Vertex AI hands out.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from modelyard.platform.errors import ApiError

COLLECTIONS = ("models", "endpoints", "batchPredictionJobs", "customJobs", "hyperparameterTuningJobs")
JOB_COLLECTIONS = COLLECTIONS[2:]
_ID = re.compile(r"^[0-9]{1,30}$")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


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
    resource, _, version = rest[1].partition("@")
    kind = collection[:-1]
    return Route(project, location, collection, _check_id(resource, kind), version or None,
                 route.operation_id, verb)


def parse_resource(name: str, collection: str) -> tuple[str, str | None]:
    """A full or short resource name (``projects/.../models/12@3`` or ``12``) -> (id, version)."""
    short = name.rsplit(f"{collection}/", 1)[-1] if f"{collection}/" in name else name
    if "/" in short:
        raise ApiError("INVALID_ARGUMENT", f"Invalid {collection[:-1]} resource name {name!r}.")
    resource, _, version = short.partition("@")
    return _check_id(resource, collection[:-1]), version or None


def _check_id(value: str, kind: str) -> str:
    if not _ID.match(value):
        raise ApiError("INVALID_ARGUMENT", f"Invalid {kind} id {value!r}: ids are decimal numbers.")
    return value


def new_id() -> str:
    """A fresh numeric id, random so that several control planes on one database never collide."""
    return str(secrets.randbelow(9 * 10**17) + 10**17)


def model_name(parent: str, model_id: str) -> str:
    return f"{parent}/models/{model_id}"


def endpoint_name(parent: str, endpoint_id: str) -> str:
    return f"{parent}/endpoints/{endpoint_id}"


def operation_name(parent: str, collection: str | None, resource_id: str | None, op_id: str) -> str:
    if collection and resource_id:
        return f"{parent}/{collection}/{resource_id}/operations/{op_id}"
    return f"{parent}/operations/{op_id}"
