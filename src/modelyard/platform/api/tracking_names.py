"""Resource names of Vertex ML Metadata and of the TensorBoard API, parsed in one place.

A request path below ``/v1/projects/{p}/locations/{l}/`` names one of:

    metadataStores[/{store}[/{artifacts|contexts|executions|metadataSchemas}[/{id}]]][:verb]
    tensorboards[/{tb}[/experiments[/{exp}[/runs[/{run}[/timeSeries[/{ts}]]]]]]][:verb]

Ids chosen by a client (stores, nodes, schemas, TensorBoard experiments and runs) are Vertex's
``[a-z0-9][a-z0-9-]{0,127}`` (time series too, numeric when the platform picks); TensorBoards have
numeric ids.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from modelyard.platform.api.errors import ApiError

METADATA_COLLECTIONS = ("artifacts", "contexts", "executions", "metadataSchemas")
TENSORBOARD_CHAIN = ("tensorboards", "experiments", "runs", "timeSeries")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
CHOSEN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
_NUMERIC = re.compile(r"^[0-9]{1,30}$")


@dataclass(frozen=True)
class TrackingRoute:
    """What a path names: ``ids`` maps each collection of the path to its id (None: the collection
    itself, for a list, a create or a collection verb); ``leaf`` is the last collection."""

    project: str
    location: str
    ids: tuple[tuple[str, str | None], ...]
    verb: str | None = None

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    @property
    def leaf(self) -> str:
        return self.ids[-1][0]

    @property
    def leaf_id(self) -> str | None:
        return self.ids[-1][1]

    def id_of(self, collection: str) -> str | None:
        return dict(self.ids).get(collection)

    def name(self, upto: int | None = None) -> str:
        """The resource name of the path's first ``upto`` levels (all by default)."""
        parts = [self.parent]
        for collection, rid in self.ids[:upto]:
            parts.append(collection if rid is None else f"{collection}/{rid}")
        return "/".join(parts)


def check_chosen_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not CHOSEN_ID.match(value):
        raise ApiError("INVALID_ARGUMENT", f"Invalid {what} id {value!r}: up to 128 characters of [a-z0-9-], "
                       "starting with a letter or a digit.")
    return value


def _check(collection: str, rid: str) -> str:
    numeric = collection == "tensorboards"
    if not (_NUMERIC if numeric else CHOSEN_ID).match(rid):
        what = "a decimal number" if numeric else "up to 128 characters of [a-z0-9-]"
        raise ApiError("INVALID_ARGUMENT", f"Invalid {collection[:-1]} id {rid!r}: it is {what}.")
    return rid


def parse_tracking_path(path: str) -> TrackingRoute:
    """``projects/p/locations/l/metadataStores/...`` or ``.../tensorboards/...`` -> TrackingRoute."""
    verb = None
    head, colon, tail = path.rpartition(":")
    if colon and "/" not in tail:
        path, verb = head, tail
    parts = path.strip("/").split("/")
    if len(parts) < 5 or parts[0] != "projects" or parts[2] != "locations":
        raise ApiError("NOT_FOUND", f"No API at /v1/{path}.")
    project, location, rest = parts[1], parts[3], parts[4:]
    for segment in (project, location):
        if not _SEGMENT.match(segment):
            raise ApiError("INVALID_ARGUMENT", f"Invalid project or location {segment!r}.")
    if rest[0] == "metadataStores":
        allowed = [("metadataStores",), METADATA_COLLECTIONS]
    elif rest[0] == "tensorboards":
        allowed = [(c,) for c in TENSORBOARD_CHAIN]
    else:
        raise ApiError("NOT_FOUND", f"No API at /v1/{path}.")
    ids: list[tuple[str, str | None]] = []
    for level in range(0, len(rest), 2):
        collection = rest[level]
        if level // 2 >= len(allowed) or collection not in allowed[level // 2]:
            raise ApiError("NOT_FOUND", f"No API at /v1/{path}.")
        rid = rest[level + 1] if level + 1 < len(rest) else None
        ids.append((collection, None if rid is None else _check(collection, rid)))
    return TrackingRoute(project, location, tuple(ids), verb)


def split_name(name: object, collection: str, what: str) -> tuple[str, str]:
    """A full resource name ``.../{collection}/{id}`` -> (the part before, id); INVALID_ARGUMENT otherwise."""
    if not isinstance(name, str) or f"/{collection}/" not in name:
        raise ApiError("INVALID_ARGUMENT", f"Invalid {what} name {name!r}: expected "
                       f"projects/{{p}}/locations/{{l}}/.../{collection}/{{id}}.")
    head, _, rid = name.rpartition(f"/{collection}/")
    return head, _check(collection, rid)
