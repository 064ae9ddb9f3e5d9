"""A Cloud Storage JSON API server that does no storage work: the ceiling a client can reach on this host.

    python3 bench/null_storage.py --port 8700 --objects DIR [--store DIR2]

It knows its answers in advance. At start it reads every file under ``DIR`` into memory with its
CRC32C; an object named ``PREFIX/REL`` (any first path segment) is the file ``DIR/REL``. Then:

- uploads (``uploadType`` media, multipart or resumable) read the body into one reused buffer and
  drop it; the answer is the object's resource with the precomputed ``crc32c`` and ``size`` (what the
  client compares its own checksum with). A resumable session needs no state: its id is the object name.
- downloads (``alt=media``) send the bytes from memory with the headers google-cloud-storage reads
  (``x-goog-hash``, ``x-goog-generation``, ``x-goog-stored-content-length``...), so the client
  checks the CRC32C exactly as it does against a real server.
- listing a prefix lists every file under it; deletes and bucket creation answer and do nothing.

With ``--store DIR2`` it does the least a real store must: each upload body is written to a file in
``DIR2`` (one ``write`` per ``recv_into``) and CRC32C-hashed on the way; a delete removes the file.
That is the floor for any server that keeps the bytes and knows their checksum.

Plain sockets and one thread per connection, HTTP/1.1 keep-alive, ``Content-Length`` bodies only
(what google-cloud-storage and curl send): no framework, so the server's own cost is a few large
``recv_into``/``sendall`` calls. What remains of a transfer's time is the client, the loopback TCP
and the kernel. Anything else is answered 400/404 in Google's JSON error format.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import socketserver
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import google_crc32c

RECV = 1 << 20  # bytes read per recv_into of an upload body


class Objects:
    """The files of one directory in memory, by relative path, with their CRC32C (base64, big-endian)."""

    def __init__(self, root: Path) -> None:
        self.data: dict[str, bytes] = {}
        self.crc: dict[str, str] = {}
        for p in sorted(root.rglob("*")):
            if p.is_file():
                rel = p.relative_to(root).as_posix()
                self.data[rel] = p.read_bytes()
                self.crc[rel] = base64.b64encode(google_crc32c.value(self.data[rel]).to_bytes(4, "big")).decode()

    @staticmethod
    def rel(name: str) -> str:
        return name.split("/", 1)[1] if "/" in name else name

    def resource(self, bucket: str, name: str) -> dict:
        rel = self.rel(name)
        if rel not in self.data:
            raise KeyError(name)
        return {"kind": "storage#object", "bucket": bucket, "name": name, "id": f"{bucket}/{name}/1",
                "size": str(len(self.data[rel])), "crc32c": self.crc[rel], "generation": "1", "metageneration": "1",
                "contentType": "application/octet-stream", "storageClass": "STANDARD",
                "timeCreated": "2026-01-01T00:00:00.000Z", "updated": "2026-01-01T00:00:00.000Z"}


class Handler(socketserver.BaseRequestHandler):
    objects: Objects
    store: Path | None = None  # --store: upload bodies go to files here, hashed

    def setup(self) -> None:
        self.sock: socket.socket = self.request
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sink = bytearray(RECV)

    # ---- HTTP/1.1, just enough ----------------------------------------------------------------
    def handle(self) -> None:
        try:
            while True:
                head = self._read_head()
                if head is None:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    key, _, value = line.partition(":")
                    headers[key.strip().lower()] = value.strip()
                if "chunked" in headers.get("transfer-encoding", ""):
                    self._reply(411, _error(411, "chunked bodies are not taken here: send Content-Length"))
                    return
                if headers.get("expect", "").lower() == "100-continue":  # curl asks before bodies over 1 MiB
                    self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.route(method, target, headers, int(headers.get("content-length") or 0))
        except (ConnectionError, OSError):
            return

    def _read_head(self) -> bytes | None:
        while b"\r\n\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.buf += data
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        return head

    def _read_body(self, length: int, keep: int = 0, into=None) -> bytes:
        """Consume ``length`` body bytes; return the first ``keep`` of them; the rest is dropped, or
        written to the file ``into`` and CRC32C-hashed."""
        kept = bytearray(self.buf[:length])
        taken = len(kept)
        self.buf = self.buf[length:]
        crc = 0
        if into is not None and kept:
            into.write(kept)
            crc = google_crc32c.extend(crc, bytes(kept))
        view = memoryview(self.sink)
        while taken < length:
            if into is not None:  # google_crc32c takes bytes only: a new bytes object per read, as asyncio's
                piece = self.sock.recv(min(RECV, length - taken))
                into.write(piece)
                crc = google_crc32c.extend(crc, piece)
            else:
                piece = view[:self.sock.recv_into(view, min(RECV, length - taken))]
            if not piece:
                raise ConnectionError("body cut off")
            if len(kept) < keep:
                kept += piece[:keep - len(kept)]
            taken += len(piece)
        return bytes(kept[:keep])

    def _take_upload(self, length: int, name: str, append: bool = False, keep: int = 0) -> bytes:
        """An upload's body: dropped, or (``--store``) written to the object's file and hashed."""
        if self.store is None:
            return self._read_body(length, keep)
        with open(self.store / quote(name, safe=""), "ab" if append else "wb", buffering=0) as f:
            return self._read_body(length, keep, into=f)

    def _reply(self, status: int, body: dict | None = None, headers: dict | None = None) -> None:
        payload = json.dumps(body).encode() if body is not None else b""
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}", f"Content-Length: {len(payload)}"]
        if body is not None:
            head.append("Content-Type: application/json; charset=UTF-8")
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)

    # ---- the JSON API calls google-cloud-storage makes for upload_from_filename / download_to_filename
    def route(self, method: str, target: str, headers: dict, length: int) -> None:
        url = urlsplit(target)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        parts = url.path.split("/")
        host = headers.get("host", "127.0.0.1")
        if url.path.startswith("/upload/storage/v1/b/") and len(parts) == 7:
            return self.upload(method, unquote(parts[5]), query, headers, length, host)
        body = self._read_body(length, keep=length) if length else b""
        if url.path == "/storage/v1/b" and method == "GET":  # also the readiness check
            return self._reply(200, {"kind": "storage#buckets", "items": []})
        if url.path == "/storage/v1/b" and method == "POST":
            name = json.loads(body or b"{}").get("name", "bucket")
            return self._reply(200, {"kind": "storage#bucket", "name": name, "id": name})
        if url.path.startswith("/download/storage/v1/b/") and len(parts) >= 8:
            return self.download(unquote(parts[5]), unquote("/".join(parts[7:])), headers)
        if url.path.startswith("/storage/v1/b/") and len(parts) == 5 and method == "GET":
            bucket = unquote(parts[4])
            return self._reply(200, {"kind": "storage#bucket", "name": bucket, "id": bucket})
        if not url.path.startswith("/storage/v1/b/") or len(parts) < 6 or parts[5] != "o":
            return self._reply(404, _error(404, f"Not Found: {url.path}"))
        bucket = unquote(parts[4])
        if len(parts) == 6 and method == "GET":  # list: every file under the prefix, one page
            prefix = query.get("prefix", "")
            first = prefix.split("/", 1)[0]
            items = [self.objects.resource(bucket, f"{first}/{rel}") for rel in self.objects.data]
            return self._reply(200, {"kind": "storage#objects",
                                     "items": [i for i in items if i["name"].startswith(prefix)]})
        name = unquote("/".join(parts[6:]))
        if method == "DELETE":
            if self.store is not None:
                (self.store / quote(name, safe="")).unlink(missing_ok=True)
            return self._reply(204)
        if method == "GET" and query.get("alt") == "media":
            return self.download(bucket, name, headers)
        if method == "GET":
            return self._resource(bucket, name)
        return self._reply(400, _error(400, f"{method} {url.path} is not served here"))

    def _resource(self, bucket: str, name: str, status: int = 200) -> None:
        try:
            return self._reply(status, self.objects.resource(bucket, name))
        except KeyError:
            return self._reply(404, _error(404, f"No such object: {bucket}/{name}"))

    def upload(self, method: str, bucket: str, query: dict, headers: dict, length: int, host: str) -> None:
        kind = query.get("uploadType")
        if "upload_id" in query:  # a resumable chunk: the id is the object name
            name = unquote(query["upload_id"])
            rng = headers.get("content-range", "")  # bytes FIRST-LAST/TOTAL or bytes FIRST-LAST/*
            span, _, total = rng.removeprefix("bytes ").partition("/")
            self._take_upload(length, name, append=not span.startswith("0-"))
            last = int(span.split("-")[1]) if "-" in span else -1
            if total != "*" and total and last + 1 >= int(total):
                return self._resource(bucket, name)
            return self._reply(308, None, {"Range": f"bytes=0-{last}"} if last >= 0 else {})
        if kind == "resumable":
            name = query.get("name") or json.loads(self._read_body(length, keep=length) or b"{}").get("name", "")
            location = (f"http://{host}/upload/storage/v1/b/{bucket}/o?uploadType=resumable"
                        f"&upload_id={quote(name, safe='')}")
            return self._reply(200, None, {"Location": location})
        if kind == "media":
            self._take_upload(length, query.get("name", ""))
            return self._resource(bucket, query.get("name", ""))
        if kind == "multipart":  # the metadata part (with the name) leads the body
            spool = f".multipart-{threading.get_ident()}"
            head = self._take_upload(length, spool, keep=min(length, 65536))
            start = head.find(b"{")
            meta = json.JSONDecoder().raw_decode(head[start:].decode("latin-1"))[0] if start >= 0 else {}
            name = query.get("name") or meta.get("name", "")
            if self.store is not None:  # the whole body kept (headers too: the same work as the media alone)
                os.replace(self.store / spool, self.store / quote(name, safe=""))
            return self._resource(bucket, name)
        self._read_body(length)
        return self._reply(400, _error(400, f"Invalid uploadType: {kind!r}"))

    def download(self, bucket: str, name: str, headers: dict) -> None:
        rel = self.objects.rel(name)
        if rel not in self.objects.data:
            return self._reply(404, _error(404, f"No such object: {bucket}/{name}"))
        if "range" in headers:  # the client sends one only to resume a broken download
            return self._reply(400, _error(400, "ranged downloads are not served here"))
        data = self.objects.data[rel]
        head = (f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\nContent-Type: application/octet-stream\r\n"
                f"x-goog-hash: crc32c={self.objects.crc[rel]}\r\nx-goog-generation: 1\r\n"
                f"x-goog-metageneration: 1\r\nx-goog-stored-content-length: {len(data)}\r\n"
                f"x-goog-stored-content-encoding: identity\r\n\r\n").encode()
        self.sock.sendall(head)
        self.sock.sendall(memoryview(data))


_REASONS = {200: "OK", 204: "No Content", 308: "Resume Incomplete", 400: "Bad Request", 404: "Not Found",
            411: "Length Required"}


def _error(code: int, message: str) -> dict:
    return {"error": {"code": code, "message": message, "errors": [{"message": message, "reason": "invalid"}]}}


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--objects", required=True, type=Path, help="the directory whose files are served")
    ap.add_argument("--store", type=Path, help="write each upload to a file here, CRC32C-hashed (a minimal store)")
    args = ap.parse_args()
    Handler.objects = Objects(args.objects)
    if args.store is not None:
        args.store.mkdir(parents=True, exist_ok=True)
        Handler.store = args.store
    server = Server((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"null storage on http://{args.host}:{args.port}: {len(Handler.objects.data)} files in memory", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
