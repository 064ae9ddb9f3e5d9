"""The Cloud Storage JSON API's HTTP side (aiohttp): paths parsed from the raw request target, the
token check, streaming uploads and downloads, and the one mapping of errors to Google's JSON body.

Paths served (what google-cloud-storage, gcsfs and google-cloud-aiplatform call)::

  /storage/v1/b                      GET list, POST create
  /storage/v1/b/B                    GET, PATCH, PUT, DELETE
  /storage/v1/b/B/iam                GET, PUT        .../iam/testPermissions  GET
  /storage/v1/b/B/o                  GET list (prefix, delimiter, pageToken, maxResults, offsets, matchGlob)
  /storage/v1/b/B/o/O                GET (alt=media: the bytes), PATCH, PUT, DELETE
  /storage/v1/b/B/o/O/compose        POST
  /storage/v1/b/B/o/O/copyTo/b/B2/o/O2, .../rewriteTo/b/B2/o/O2   POST
  /storage/v1/b/B/o/O/moveTo/o/O2    POST (a rename inside the bucket)
  /upload/storage/v1/b/B/o           POST uploadType=media|multipart|resumable, PUT/DELETE upload_id=...
  /download/storage/v1/b/B/o/O       GET the bytes (Range)
  /batch/storage/v1                  POST multipart/mixed of the calls above (gcsfs deletes this way)
"""
from __future__ import annotations

import asyncio
import email.parser
import email.policy
import json
import logging
import re
import sqlite3
import time
from urllib.parse import parse_qsl, urlsplit

from aiohttp import web

from modelyard.platform.api import bearer, http_limits, read_grants
from modelyard.platform.storage.bodies import BATCH_BODY_LIMIT, parse_object, read_limited
from modelyard.platform.storage.errors import StorageApiError, invalid, no_object
from modelyard.platform.storage.hashing import READ_CHUNK
from modelyard.platform.storage.multipart import read_multipart
from modelyard.platform.storage.names import decode, object_path
from modelyard.platform.storage.objects import Store, check_preconditions
from modelyard.platform.storage.uploads import Uploads

log = logging.getLogger(__name__)

_CONDITIONS = ("ifGenerationMatch", "ifGenerationNotMatch", "ifMetagenerationMatch", "ifMetagenerationNotMatch")
_SOURCE_CONDITIONS = tuple("ifSource" + c[2:] for c in _CONDITIONS)
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


def _json(body: dict, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json", headers=headers)


def _error(exc: StorageApiError) -> web.Response:
    if exc.code == 304:
        return web.Response(status=304)
    return _json(exc.to_body(), exc.code)


def _query(raw: str) -> dict:
    """The query string, values decoded as strict UTF-8 (a name that is not UTF-8 is a 400)."""
    try:
        return dict(parse_qsl(raw, keep_blank_values=True, errors="strict"))
    except UnicodeDecodeError:
        raise invalid("Invalid query string: values are UTF-8 (an object name that is not UTF-8?).") from None


def _conditions(query: dict, names=_CONDITIONS) -> dict[str, int]:
    out = {}
    for name in names:
        if name in query:
            try:
                out[name] = int(query[name])
            except ValueError:
                raise invalid(f"Invalid argument for {name}: {query[name]!r}") from None
    return out


def _hash_header(value: str | None) -> tuple[str | None, str | None]:
    """``x-goog-hash: crc32c=...,md5=...`` -> (crc32c, md5)."""
    crc = md5 = None
    for part in (value or "").split(","):
        key, _, val = part.strip().partition("=")
        if key == "crc32c":
            crc = val
        elif key == "md5":
            md5 = val
    return crc, md5


class StorageRoutes:
    def __init__(self, store: Store, token: str | None = None) -> None:
        self.store = store
        self.uploads = Uploads(store)
        self.token = token

    def app(self) -> web.Application:
        # Only JSON is read whole (bodies.read_limited, its own limits); uploads stream into files.
        app = web.Application(client_max_size=BATCH_BODY_LIMIT)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def _check_token(self, request: web.Request, path: str) -> None:
        header = request.headers.get("Authorization")
        read = read_grants.grant(self.token, header)
        if read is not None:  # a replica's or a batch worker's read-only token: reads of its buckets only
            if not read_grants.may_read(read, request.method, path):
                allowed = ", ".join(f"gs://{b}" for b in sorted(read.buckets)) or "nothing"
                raise StorageApiError(403, "forbidden", f"The caller's token is read-only ({allowed}): it does "
                                      f"not have access to {request.method} {path}.")
            return
        why = bearer.refusal(self.token, header)
        if why == bearer.MISSING:
            raise StorageApiError(401, "required", "Anonymous caller does not have access: send "
                                  "'Authorization: Bearer <token>' (the platform's --auth-token).")
        if why == bearer.INVALID:
            raise StorageApiError(401, "authError", "Invalid Credentials")

    def _base_url(self, request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        with http_limits.handling(request.transport):  # never closed for room while it is being answered
            return await self._handle(request)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.store.in_flight += 1  # the background MD5 waits for a quiet moment
        target = urlsplit(request.raw_path)
        try:
            query = _query(target.query)
            if target.path in ("/", "/healthz") and request.method == "GET":
                return _json({"status": "ok"})
            self._check_token(request, target.path)
            return await self.dispatch(request, request.method, target.path, query)
        except StorageApiError as exc:
            return _error(exc)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except sqlite3.OperationalError as exc:  # the metadata's disk is full or failing: retryable, not a bug
            log.warning("storage request %s %s: metadata store: %s", request.method, request.path, exc)
            return _error(StorageApiError(503, "backendError", f"The storage's metadata is unavailable ({exc}). "
                                          "Retry later."))
        except Exception as exc:  # a bug: answered in Google's format and logged; the server keeps serving
            log.exception("storage request %s %s failed", request.method, request.path)
            return _error(StorageApiError(500, "backendError", f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            self.store.in_flight -= 1
            self.store.last_activity = time.monotonic()

    async def dispatch(self, request: web.Request, method: str, path: str, query: dict) -> web.StreamResponse:
        parts = path.split("/")  # raw segments: an object name's %2F stays inside its segment until decoded
        if path.startswith("/batch/storage/v1"):
            return await self.batch(request)
        if path.startswith("/upload/storage/v1/b/") and len(parts) == 7 and parts[6] == "o":
            return await self.upload(request, method, decode(parts[5]), query)
        if path.startswith("/download/storage/v1/b/") and len(parts) >= 8 and parts[6] == "o":
            return await self.download(request, decode(parts[5]), decode("/".join(parts[7:])), query)
        if not path.startswith("/storage/v1/b"):
            raise StorageApiError(404, "notFound", f"Not Found: {path}")
        rest = parts[4:]
        if rest == [] or rest == [""]:  # /storage/v1/b
            if method == "GET":
                buckets = await asyncio.to_thread(self.store.list_buckets, query.get("prefix", ""))
                return _json({"kind": "storage#buckets", "items": buckets})
            if method == "POST":
                return _json(self.store.create_bucket(await self._body(request), query.get("project")))
            raise self._bad_method(method, path)
        bucket = decode(rest[0])
        if len(rest) == 1:
            if method == "GET":
                return _json(self.store.bucket_resource(bucket))
            if method in ("PATCH", "PUT"):
                return _json(self.store.patch_bucket(bucket, await self._body(request)))
            if method == "DELETE":
                await asyncio.to_thread(self.store.delete_bucket, bucket)
                return web.Response(status=204)
            raise self._bad_method(method, path)
        if rest[1] == "iam":
            if len(rest) == 3 and rest[2] == "testPermissions":
                self.store.bucket_path(bucket)
                perms = [v for k, v in parse_qsl(urlsplit(request.raw_path).query) if k == "permissions"]
                return _json({"kind": "storage#testIamPermissionsResponse", "permissions": perms})
            if method == "GET":
                return _json(self.store.iam_policy(bucket))
            if method == "PUT":
                return _json(self.store.set_iam_policy(bucket, await self._body(request)))
            raise self._bad_method(method, path)
        if rest[1] != "o":
            raise StorageApiError(404, "notFound", f"Not Found: {path}")
        if len(rest) == 2:
            if method == "GET":
                return await self.list_objects(request, bucket, query)
            raise self._bad_method(method, path)
        obj_parts = rest[2:]
        for verb in ("copyTo", "rewriteTo"):
            if method == "POST" and verb in obj_parts:
                i = len(obj_parts) - 1 - obj_parts[::-1].index(verb)
                tail = obj_parts[i + 1:]
                if len(tail) >= 4 and tail[0] == "b" and tail[2] == "o":
                    return await self.copy(request, verb, bucket, decode("/".join(obj_parts[:i])),
                                           decode(tail[1]), decode("/".join(tail[3:])), query)
        if method == "POST" and "moveTo" in obj_parts:
            i = len(obj_parts) - 1 - obj_parts[::-1].index("moveTo")
            tail = obj_parts[i + 1:]
            if len(tail) >= 2 and tail[0] == "o":
                rec = await asyncio.to_thread(self.store.move, bucket, decode("/".join(obj_parts[:i])),
                                              decode("/".join(tail[1:])), _conditions(query),
                                              _conditions(query, _SOURCE_CONDITIONS))
                return _json(self.store.resource(rec, self._base_url(request)))
        if method == "POST" and obj_parts[-1] == "compose" and len(obj_parts) > 1:
            return await self.compose(request, bucket, decode("/".join(obj_parts[:-1])), query)
        name = decode("/".join(obj_parts))
        if method == "GET":
            if query.get("alt") == "media":
                return await self.download(request, bucket, name, query)
            rec = await asyncio.to_thread(self.store.record, bucket, name)
            self._generation(rec, query)
            check_preconditions(rec, _conditions(query))
            return _json(self.store.resource(rec, self._base_url(request)))
        if method in ("PATCH", "PUT"):
            rec = self.store.patch(bucket, name, await self._body(request), _conditions(query))
            return _json(self.store.resource(rec, self._base_url(request)))
        if method == "DELETE":
            self.store.delete(bucket, name, _conditions(query))
            return web.Response(status=204)
        raise self._bad_method(method, path)

    @staticmethod
    def _bad_method(method: str, path: str) -> StorageApiError:
        return StorageApiError(405, "methodNotAllowed", f"{method} is not allowed on {path}")

    @staticmethod
    def _generation(rec, query: dict) -> None:
        """Only the live generation is kept: asking for another one is a 404, as for a deleted version."""
        if query.get("generation") and query["generation"] != str(rec.generation):
            raise no_object(rec.bucket, f"{rec.name}#{query['generation']}")

    @staticmethod
    async def _body(request: web.Request) -> dict:
        return parse_object(await read_limited(request))

    # ---- listing ---------------------------------------------------------------------------------
    async def list_objects(self, request: web.Request, bucket: str, query: dict) -> web.Response:
        try:
            max_results = min(int(query.get("maxResults") or 1000), 1000)
        except ValueError:
            raise invalid(f"Invalid maxResults: {query['maxResults']!r}") from None
        if max_results < 1:
            raise invalid("maxResults must be positive")
        try:
            items, prefixes, token = await asyncio.to_thread(
                self.store.list, bucket, query.get("prefix", ""), query.get("delimiter", ""), query.get("pageToken", ""),
                max_results, query.get("startOffset", ""), query.get("endOffset", ""), query.get("matchGlob", ""))
        except (ValueError, UnicodeDecodeError):
            raise invalid(f"Invalid pageToken: {query.get('pageToken')!r}") from None
        base = self._base_url(request)
        body: dict = {"kind": "storage#objects", "items": [self.store.resource(r, base) for r in items]}
        if prefixes:
            body["prefixes"] = prefixes
        if token:
            body["nextPageToken"] = token
        return _json(body)

    # ---- downloads -------------------------------------------------------------------------------
    async def download(self, request: web.Request, bucket: str, name: str, query: dict) -> web.StreamResponse:
        # The row and the open file of one generation: headers and bytes cannot come from two.
        rec, f = await asyncio.to_thread(self.store.open_read, bucket, name)
        try:
            return await self._send(request, rec, f, query)
        finally:
            if f is not None:
                f.close()

    async def _send(self, request: web.Request, rec, f, query: dict) -> web.StreamResponse:
        self._generation(rec, query)
        check_preconditions(rec, _conditions(query))
        size = rec.size
        start, end = 0, size  # [start, end)
        status = 200
        headers = {"Content-Type": rec.extra.get("contentType", "application/octet-stream"),
                   "Accept-Ranges": "bytes", "ETag": f'"{rec.crc32c}"',
                   "x-goog-hash": f"crc32c={rec.crc32c}" + (f",md5={rec.md5}" if rec.md5 else ""),
                   "x-goog-generation": str(rec.generation), "x-goog-metageneration": str(rec.metageneration),
                   "x-goog-stored-content-length": str(size),
                   "x-goog-stored-content-encoding": rec.extra.get("contentEncoding", "identity")}
        if rec.extra.get("contentEncoding"):
            headers["Content-Encoding"] = rec.extra["contentEncoding"]
        rng = request.headers.get("Range")
        if rng and size:
            m = _RANGE.match(rng.strip())
            if not m or (m.group(1) == "" and m.group(2) == ""):
                raise invalid(f"Invalid Range header: {rng!r}")
            if m.group(1) == "":
                start = max(0, size - int(m.group(2)))
            else:
                start = int(m.group(1))
                if m.group(2) != "":
                    end = min(size, int(m.group(2)) + 1)
            if start >= size or start >= end:
                return _json(StorageApiError(416, "requestedRangeNotSatisfiable",
                                             "The requested range cannot be satisfied.").to_body(), 416,
                             {"Content-Range": f"bytes */{size}"})
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = end - start
        if request.method == "HEAD" or f is None:
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        writer = await resp.prepare(request)
        count = end - start
        if count:
            try:
                await asyncio.get_running_loop().sendfile(request.transport, f, start, count)
            except (NotImplementedError, AttributeError, RuntimeError):
                f.seek(start)
                left = count
                while left > 0:
                    chunk = f.read(min(READ_CHUNK, left))
                    if not chunk:
                        break  # truncated in place behind the API: the client sees a short body
                    left -= len(chunk)
                    await writer.write(chunk)
        await resp.write_eof()
        return resp

    # ---- uploads ---------------------------------------------------------------------------------
    async def _stream_into(self, writer, content, offset: int | None = None) -> None:
        """Copy the request body into the writer as it arrives. ``offset``: where the body starts in a
        resumable session; bytes at offsets the session already holds are compared with the held ones and
        never appended again (a chunk sent twice is taken once; different bytes there are a 400)."""
        pos = offset
        while chunk := await content.readany():
            if pos is not None and pos < writer.hasher.size:
                n = min(len(chunk), writer.hasher.size - pos)
                if writer.stored(pos, n) != chunk[:n]:
                    raise invalid(f"The bytes sent at offset {pos} differ from those this upload already holds "
                                  "there; ask for the upload's status and send from its Range.")
                pos += n
                chunk = chunk[n:]
                if not chunk:
                    continue
            writer.write(chunk)
            if pos is not None:
                pos += len(chunk)

    async def upload(self, request: web.Request, method: str, bucket: str, query: dict) -> web.StreamResponse:
        kind = query.get("uploadType", "")
        if "upload_id" in query:
            if method == "DELETE":
                self.uploads.cancel(query["upload_id"])
                return web.Response(status=499)
            if method in ("PUT", "POST"):
                return await self.resumable_chunk(request, query["upload_id"])
            raise self._bad_method(method, request.path)
        if method != "POST":
            raise self._bad_method(method, request.path)
        self.store.bucket_path(bucket)
        cond = _conditions(query)
        if kind == "resumable":
            fields = await self._body(request)
            name = query.get("name") or fields.get("name")
            if not name:
                raise invalid("Required parameter: name")
            total = request.headers.get("X-Upload-Content-Length")
            if "contentType" not in fields and request.headers.get("X-Upload-Content-Type"):
                fields["contentType"] = request.headers["X-Upload-Content-Type"]
            upload_id = self.uploads.start(bucket, str(name), fields, cond, int(total) if total else None)
            location = f"{self._base_url(request)}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={upload_id}"
            return web.Response(status=200, headers={"Location": location, "X-GUploader-UploadID": upload_id})
        if kind == "media":
            name = query.get("name")
            if not name:
                raise invalid("Required parameter: name")
            fields = {"contentType": request.headers.get("Content-Type", "application/octet-stream")}
            crc, md5 = _hash_header(request.headers.get("x-goog-hash"))
            return await self._write_object(request, bucket, name, fields, cond, request.content, crc, md5)
        if kind == "multipart":
            return await self.multipart(request, bucket, query, cond)
        raise invalid(f"Invalid uploadType: {kind!r} (media, multipart or resumable)")

    async def _write_object(self, request, bucket, name, fields, cond, content, crc, md5) -> web.Response:
        object_path(self.store.root, bucket, name)  # a bad name is refused before any byte is written
        if cond:  # fail before the bytes; checked again when the object is put in place
            check_preconditions(await self._existing(bucket, name), cond)
        w = self.store.writer(md5=bool(md5))
        try:
            await self._stream_into(w, content)
        except BaseException:
            w.abort()  # cut off half-way: nothing is left
            raise
        rec = await asyncio.to_thread(self.store.commit, w, bucket, name, fields, cond, crc, md5)
        return _json(self.store.resource(rec, self._base_url(request)))

    async def _existing(self, bucket: str, name: str):
        try:
            return await asyncio.to_thread(self.store.record, bucket, name)
        except StorageApiError as exc:
            if exc.code == 404:
                return None
            raise

    async def multipart(self, request: web.Request, bucket: str, query: dict, cond: dict) -> web.Response:
        if "name" in query:
            object_path(self.store.root, bucket, query["name"])
        w = self.store.writer()

        def wants_md5(metadata: dict) -> None:  # a client's MD5 to check: computed whatever the size
            w.md5_wanted = bool(metadata.get("md5Hash"))

        try:
            fields, media_type = await read_multipart(request.content, request.headers.get("Content-Type", ""),
                                                      w.write, wants_md5)
        except BaseException:
            w.abort()  # a bad or cut-off body: nothing is left
            raise
        name = query.get("name") or fields.get("name")
        if not name:
            w.abort()
            raise invalid("Required parameter: name")
        if "contentType" not in fields and media_type:
            fields["contentType"] = media_type
        rec = await asyncio.to_thread(self.store.commit, w, bucket, str(name), fields, cond,
                                      fields.get("crc32c"), fields.get("md5Hash"))
        return _json(self.store.resource(rec, self._base_url(request)))

    async def resumable_chunk(self, request: web.Request, upload_id: str) -> web.Response:
        # One request at a time per session: a chunk sent again while its first attempt is still arriving
        # waits, then finds those bytes held and is compared with them, never appended twice.
        async with self.uploads.lock(upload_id):
            return await self._resumable_chunk(request, upload_id)

    async def _resumable_chunk(self, request: web.Request, upload_id: str) -> web.Response:
        s = self.uploads.session(upload_id)
        if s.extra.get("done"):
            bucket, name, _gen = s.extra["done"]
            rec = await asyncio.to_thread(self.store.record, bucket, name)
            return _json(self.store.resource(rec, self._base_url(request)))
        first, last, total = self.uploads.parse_range(request.headers.get("Content-Range"))
        if total is None and s.extra.get("total") is not None and first is None:
            total = s.extra["total"]
        if first is not None:
            if first > s.persisted:
                while await request.content.readany():  # a gap: drained, not kept; the client sends from Range
                    pass
                return self._incomplete(s)
            await self._stream_into(s.writer, request.content, offset=first)
            if last is None:  # no Content-Range: the whole object in one PUT
                total = s.persisted
        if total is not None and s.persisted > total:
            self.uploads.fail(s)
            raise invalid(f"The upload got {s.persisted} bytes, more than its declared {total}.")
        if total is None or s.persisted < total:
            return self._incomplete(s)
        crc, md5 = _hash_header(request.headers.get("x-goog-hash"))
        try:
            rec = await asyncio.to_thread(self.uploads.finish, s, crc, md5)
        except StorageApiError as exc:
            if exc.code < 500:  # refused (checksum, precondition, no bucket): the session ends
                self.uploads.fail(s)
            raise  # a 503 (the disk): the session keeps its bytes and the client retries
        return _json(self.store.resource(rec, self._base_url(request)))

    @staticmethod
    def _incomplete(s) -> web.Response:
        headers = {"X-GUploader-UploadID": s.id}
        if s.persisted:
            headers["Range"] = f"bytes=0-{s.persisted - 1}"
        return web.Response(status=308, headers=headers)

    # ---- copy, rewrite, compose ------------------------------------------------------------------
    async def copy(self, request, verb, src_bucket, src_name, bucket, name, query) -> web.Response:
        body = await self._body(request)
        if src_name == "" or name == "":
            raise invalid("copy/rewrite: source and destination object names are required")
        rec = await asyncio.to_thread(self.store.copy, src_bucket, src_name, bucket, name, body,
                                      _conditions(query), _conditions(query, _SOURCE_CONDITIONS))
        resource = self.store.resource(rec, self._base_url(request))
        if verb == "copyTo":
            return _json(resource)
        return _json({"kind": "storage#rewriteResponse", "totalBytesRewritten": str(rec.size),
                      "objectSize": str(rec.size), "done": True, "resource": resource})

    async def compose(self, request, bucket, name, query) -> web.Response:
        body = await self._body(request)
        sources = body.get("sourceObjects")
        if not isinstance(sources, list) or any(not isinstance(s, dict) for s in sources):
            raise invalid("compose needs sourceObjects: [{name, generation?, objectPreconditions?}]")
        rec = await asyncio.to_thread(self.store.compose, bucket, name, sources, body.get("destination") or {},
                                      _conditions(query))
        return _json(self.store.resource(rec, self._base_url(request)))

    # ---- batch -----------------------------------------------------------------------------------
    async def batch(self, request: web.Request) -> web.Response:
        """``multipart/mixed`` of small JSON calls (no uploads): each answered in order in one reply."""
        raw = await read_limited(request, BATCH_BODY_LIMIT)
        ctype = request.headers.get("Content-Type", "")
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + raw)
        if not msg.is_multipart():
            raise invalid("A batch request is multipart/mixed.")
        out = []
        boundary = "batch_modelyard"
        for i, part in enumerate(msg.iter_parts()):
            inner = part.get_payload(decode=True) or b""
            head, _, body = inner.partition(b"\r\n\r\n") if b"\r\n\r\n" in inner else inner.partition(b"\n\n")
            lines = head.decode().splitlines()
            method, target = lines[0].split(" ")[:2]
            t = urlsplit(target)
            try:
                q = _query(t.query)
                if method not in ("GET", "DELETE", "PATCH", "PUT", "POST") or "/upload/" in t.path or "/batch/" in t.path:
                    raise invalid(f"{method} {t.path} cannot be batched")
                resp = await self.dispatch(_BatchRequest(request, method, target, body), method, t.path, q)
            except StorageApiError as exc:
                resp = _error(exc)
            payload = resp.body if isinstance(resp, web.Response) and resp.body is not None else b""
            if not isinstance(payload, bytes):
                payload = bytes(payload._value) if hasattr(payload, "_value") else b""
            cid = part.get("Content-ID", f"<{i}>").strip("<>")
            out.append(f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <response-{cid}>\r\n\r\n"
                       f"HTTP/1.1 {resp.status} {resp.reason}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload + b"\r\n")
        data = b"".join(out) + f"--{boundary}--\r\n".encode()
        return web.Response(body=data, headers={"Content-Type": f"multipart/mixed; boundary={boundary}"})


class _BatchRequest:
    """What ``dispatch`` reads of a request, for one call inside a batch."""

    def __init__(self, outer: web.Request, method: str, target: str, body: bytes) -> None:
        self._outer = outer
        self.method = method
        self.raw_path = target
        self.path = urlsplit(target).path
        self._body = body
        self.headers = outer.headers
        self.scheme = outer.scheme
        self.host = outer.host

    async def read(self) -> bytes:
        return self._body
