"""The storage API's JSON request bodies: read with a size limit, parsed with a nesting limit, so a
client can neither make the process hold a huge body (a 1.5 GB PATCH) nor crash a request with deep
nesting (``RecursionError``, a 500): both are 400-class answers in Google's error format.

Object bytes never come through here: uploads stream into files (``routes``, ``multipart``).
"""
from __future__ import annotations

import json

from modelyard.platform.storage.errors import StorageApiError, invalid

# A request's JSON (object or bucket metadata, an IAM policy, compose's 32 sources) is a few KB; Cloud
# Storage caps custom metadata at 8 KiB. 1 MiB leaves room for large IAM policies.
JSON_BODY_LIMIT = 1 << 20
BATCH_BODY_LIMIT = 16 << 20  # a batch holds up to 100 such calls (gcsfs batches deletes)
MAX_DEPTH = 100  # Google's JSON parser refuses deeper nesting too


def too_large(limit: int) -> StorageApiError:
    return StorageApiError(413, "uploadTooLarge", f"The request body is larger than this API takes ({limit} bytes).")


async def read_limited(request, limit: int = JSON_BODY_LIMIT) -> bytes:
    """The whole body, or a 413 as soon as it is declared or found to be over ``limit``."""
    content = getattr(request, "content", None)
    if content is None:  # a call inside a batch: its body is already in memory, within the batch's limit
        raw = await request.read()
        if len(raw) > limit:
            raise too_large(limit)
        return raw
    declared = request.headers.get("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts, size = [], 0
    while chunk := await content.readany():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def parse_object(raw: bytes, what: str = "Invalid JSON payload received") -> dict:
    """A JSON object (``{}`` for an empty body), or a 400 for bad JSON, a non-object or nesting deeper
    than ``MAX_DEPTH``."""
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise invalid(f"{what}: {reason}") from None
    check_depth(doc, what)
    if not isinstance(doc, dict):
        raise invalid(f"{what}: expected an object.")
    return doc


def check_depth(doc, what: str = "Invalid JSON payload received") -> None:
    """A 400 when lists and objects nest deeper than ``MAX_DEPTH`` (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > MAX_DEPTH:
            raise invalid(f"{what}: nested deeper than {MAX_DEPTH} levels.")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
