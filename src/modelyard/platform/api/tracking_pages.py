"""Pages of ML Metadata and TensorBoard lists (AIP-158): ``pageSize`` (default and largest
``MAX_PAGE_SIZE``, as Vertex has for metadata lists) and ``pageToken``, a token bound to the
request's filter and order so that it cannot be replayed against another list."""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Mapping, Sequence, TypeVar

from modelyard.platform.api.errors import invalid

MAX_PAGE_SIZE = 1000
T = TypeVar("T")


def _first(query: Mapping[str, str], *keys: str) -> str | None:
    for key in keys:
        if query.get(key) not in (None, ""):
            return query.get(key)
    return None


def page(items: Sequence[T], query: Mapping[str, str], scope: str) -> tuple[Sequence[T], str]:
    """The page of ``items`` the query asks for and the next page's token ('' after the last)."""
    raw_size = _first(query, "pageSize", "page_size")
    try:
        size = int(raw_size) if raw_size is not None else 0
    except ValueError:
        raise invalid(f"Invalid page_size {raw_size!r}: a whole number.") from None
    if size < 0:
        raise invalid(f"Invalid page_size {size}: it cannot be negative.")
    size = min(size or MAX_PAGE_SIZE, MAX_PAGE_SIZE)
    bound = hashlib.sha256(json.dumps([scope, _first(query, "filter") or "",
                                       _first(query, "orderBy", "order_by") or ""]).encode()).hexdigest()[:16]
    offset = 0
    token = _first(query, "pageToken", "page_token")
    if token:
        try:
            doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            offset = doc["o"]
            if not isinstance(offset, int) or offset < 0 or doc.get("f") != bound:
                raise ValueError
        except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise invalid(f"Invalid page_token {token!r}: pass the next_page_token of the previous page, with "
                          "the same filter and order_by.") from None
    end = offset + size
    nxt = ""
    if end < len(items):
        nxt = base64.urlsafe_b64encode(json.dumps({"o": end, "f": bound}).encode()).decode().rstrip("=")
    return items[offset:end], nxt


def order(rows: list[dict], order_by: str | None, columns: Mapping[str, str]) -> list[dict]:
    """Rows sorted by ``orderBy`` ("create_time desc, display_name"); ``columns``: field -> row key."""
    for part in reversed([p.strip() for p in (order_by or "").split(",") if p.strip()]):
        words = part.split()
        key = columns.get(words[0])
        if key is None or len(words) > 2 or (len(words) == 2 and words[1].lower() not in ("asc", "desc")):
            raise invalid(f"Invalid order_by {part!r}: lists order by {', '.join(columns)}, each optionally "
                          "followed by asc or desc.")
        rows = sorted(rows, key=lambda r: r[key], reverse=len(words) == 2 and words[1].lower() == "desc")
    return rows
