"""Vertex ML Metadata's ``metadataStores``: create, get, list, delete; the ``default`` store is made
on first use, as Vertex does (the SDK and pipelines write into it without creating it)."""
from __future__ import annotations

from typing import Mapping

from modelyard.platform.api import tracking_messages as msg, tracking_pages
from modelyard.platform.api.errors import ApiError
from modelyard.platform.api.timefmt import rfc3339
from modelyard.platform.api.tracking_names import check_chosen_id
from modelyard.platform.state.metadata_db import MetadataDB

DEFAULT = "default"


def render(row: dict) -> dict:
    return {"name": row["name"], "createTime": rfc3339(row["created"]), "updateTime": rfc3339(row["updated"]),
            "description": row["description"], "state": {"diskUtilizationBytes": "0"}}


def resolve(db: MetadataDB, parent: str, store_id: str) -> str:
    """The name of an existing store (``default`` made if missing); NOT_FOUND for another missing one."""
    name = f"{parent}/metadataStores/{store_id}"
    if db.store_seen(name):
        return name
    if store_id == DEFAULT:
        db.ensure_store(name, parent)
    else:
        db.get_store(name)
    return name


def create(db: MetadataDB, parent: str, body: dict, store_id: str | None) -> dict:
    msg.check_message(body, "MetadataStore")
    rid = check_chosen_id(store_id, "metadataStore") if store_id else DEFAULT
    row, made = db.ensure_store(f"{parent}/metadataStores/{rid}", parent, msg.get(body, "description", "") or "")
    if not made:
        raise ApiError("ALREADY_EXISTS", f"MetadataStore {row['name']} already exists.")
    return render(row)


def list_(db: MetadataDB, parent: str, query: Mapping[str, str]) -> dict:
    resolve(db, parent, DEFAULT)
    chunk, token = tracking_pages.page(db.list_stores(parent), query, parent)
    out: dict = {"metadataStores": [render(r) for r in chunk]}
    if token:
        out["nextPageToken"] = token
    return out
