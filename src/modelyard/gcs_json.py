"""Cloud Storage's JSON API over plain HTTP, for the per-object calls a batch job makes many of: an
object's metadata, a ranged read of its bytes (of one generation), a whole small object; and the
listing of a prefix that ``modelyard serve`` makes each poll of a ``gs://`` base path.

Used for the storage that ``STORAGE_EMULATOR_HOST`` names (the platform's own, or an emulator), which
needs no credential discovery: no token, or the platform's (``MODELYARD_STORAGE_TOKEN``). gcsfs does
the same calls, but importing it (with aiohttp and Google's storage-control client) costs about 0.8
CPU-seconds in every process that reads, before the first byte: most of the extra start of a batch
job over a ``gs://`` input on a small machine. Real Cloud Storage stays on gcsfs (``objstore``), which
finds its credentials and retries as Google documents.

A leaf module: the standard library only. Failures are Python exceptions (``FileNotFoundError`` for
an absent bucket, object or generation; ``OSError`` otherwise) that ``objstore`` words once for all.
"""
from __future__ import annotations

import http.client
import json
import os
import threading
from urllib.parse import quote, urlsplit

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
TOKEN_ENV = "MODELYARD_STORAGE_TOKEN"
TIMEOUT_S = 60.0

_local = threading.local()  # one kept-alive connection per thread and endpoint


def endpoint() -> str | None:
    """The storage this module talks to (``STORAGE_EMULATOR_HOST``), None for real Cloud Storage."""
    host = os.environ.get(EMULATOR_ENV)
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def _split(uri: str) -> tuple[str, str]:
    bucket, _, name = uri.split("://", 1)[1].partition("/")
    return bucket, name


def _request(path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    base = urlsplit(endpoint() or "")
    if base.scheme not in ("http", "https") or not base.netloc:
        raise OSError(f"{EMULATOR_ENV}={os.environ.get(EMULATOR_ENV)!r} is not an http(s) address")
    token = os.environ.get(TOKEN_ENV)
    if token:
        headers = {**headers, "Authorization": f"Bearer {token}"}
    key = (base.scheme, base.netloc)
    for attempt in (1, 2):
        conns = getattr(_local, "conns", None)
        if conns is None:
            conns = _local.conns = {}
        conn = conns.get(key)
        if conn is None:
            kind = http.client.HTTPSConnection if base.scheme == "https" else http.client.HTTPConnection
            conn = conns[key] = kind(base.netloc, timeout=TIMEOUT_S)
        try:
            conn.request("GET", base.path.rstrip("/") + path, headers=headers)
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            conn.close()
            conns.pop(key, None)
            if attempt == 2:  # a kept-alive connection the server had closed is retried once, fresh
                raise
    raise AssertionError("unreachable")


def _failed(uri: str, status: int, body: bytes) -> OSError:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace")
    if status == 404:
        return FileNotFoundError(f"{uri}: {message}")
    return OSError(f"{uri}: HTTP {status}: {message}")


def metadata(uri: str) -> dict:
    """The object resource of ``gs://bucket/name`` (``size`` as an int, ``generation``, ``updated`` ...)."""
    bucket, name = _split(uri)
    status, _headers, body = _request(f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}", {})
    if status != 200:
        raise _failed(uri, status, body)
    info = json.loads(body)
    info["size"] = int(info.get("size") or 0)
    return info


def list_objects(uri: str) -> list[dict]:
    """The object resources of every object whose name starts with ``gs://bucket/prefix``'s prefix (all
    pages). An absent bucket is a FileNotFoundError, as for one object."""
    bucket, prefix = _split(uri)
    items: list[dict] = []
    token = ""
    while True:
        query = f"prefix={quote(prefix, safe='')}" + (f"&pageToken={quote(token, safe='')}" if token else "")
        status, _headers, body = _request(f"/storage/v1/b/{quote(bucket, safe='')}/o?{query}", {})
        if status != 200:
            raise _failed(uri, status, body)
        page = json.loads(body)
        items.extend(page.get("items", []))
        token = page.get("nextPageToken") or ""
        if not token:
            return items


def read_range(uri: str, start: int, end: int, generation: str = "") -> bytes:
    """Bytes ``[start, end)`` of ``gs://bucket/name`` (of ``generation`` when given: a generation no
    longer there is a FileNotFoundError, as Cloud Storage answers 404)."""
    if end <= start:
        return b""
    status, body = _media(uri, generation, {"Range": f"bytes={start}-{end - 1}"})
    return body[start:end] if status == 200 else body  # 200: the whole object (a server ignoring Range)


def read(uri: str) -> bytes:
    """The whole of ``gs://bucket/name``."""
    return _media(uri, "", {})[1]


def _media(uri: str, generation: str, headers: dict[str, str]) -> tuple[int, bytes]:
    bucket, name = _split(uri)
    query = "alt=media" + (f"&generation={quote(generation)}" if generation else "")
    status, _headers, body = _request(f"/download/storage/v1/b/{quote(bucket, safe='')}/o/"
                                      f"{quote(name, safe='')}?{query}", headers)
    if status not in (200, 206):
        raise _failed(uri, status, body)
    return status, body
