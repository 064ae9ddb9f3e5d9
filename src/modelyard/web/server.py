"""``modelyard web SITE``: serve a site folder with the headers LiteRT.js needs, gzip-compressed.

- ``application/wasm`` so the browser compiles the runtime while it streams in;
- cross-origin isolation (COOP/COEP), which threaded wasm builds require;
- gzip for every text and wasm file when the client accepts it (a 9.4 MB wasm build
  travels as ~2.8 MB): a ``FILE.gz`` written beside it at convert time when there is
  one, else compressed once per file version and kept in memory;
- an ETag per file version, so a revalidation (``Cache-Control: no-cache``) of an unchanged
  file is a bodiless 304; the manifest as ``application/manifest+json``.

Only files inside the site folder are served; the browser asks for the one wasm build
it runs, so that is the only one transferred.
"""
from __future__ import annotations

import gzip
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".wasm": "application/wasm",
    ".tflite": "application/octet-stream",
    ".png": "image/png",
    ".webmanifest": "application/manifest+json",
}
COMPRESSIBLE = {".html", ".js", ".css", ".json", ".wasm", ".tflite", ".webmanifest"}
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
}


class _GzipCache:
    """Compressed bodies keyed by path, size and mtime: a rewritten site is recompressed."""

    def __init__(self):
        self._items: dict[Path, tuple[tuple[int, int], bytes]] = {}
        self._lock = threading.Lock()  # held while compressing: one thread compresses a file, once

    def get(self, path: Path, stat) -> bytes:
        key = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            item = self._items.get(path)
            if item is None or item[0] != key:
                item = self._items[path] = (key, self._compressed(path, stat))
            return item[1]

    @staticmethod
    def _compressed(path: Path, stat) -> bytes:
        ready = path.with_name(path.name + ".gz")
        try:
            if ready.stat().st_mtime_ns >= stat.st_mtime_ns:
                return ready.read_bytes()
        except FileNotFoundError:
            pass
        return gzip.compress(path.read_bytes(), compresslevel=6, mtime=0)


class SiteServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, address: tuple[str, int]):
        self.root = Path(root).resolve()
        self.gzip_cache = _GzipCache()
        self.bytes_sent = 0  # body bytes, for benchmarks
        self.count_lock = threading.Lock()
        super().__init__(address, _Handler)

    def warm(self) -> None:
        """Compress the files in the background before the first visitor asks for them."""

        def run() -> None:
            for path in sorted(self.root.rglob("*")):
                if path.is_file() and path.suffix in COMPRESSIBLE:
                    self.gzip_cache.get(path, path.stat())

        threading.Thread(target=run, name="gzip-warm", daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    server: SiteServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass  # a page load is dozens of requests; errors still reach the client

    def _resolve(self) -> Path | None:
        path = unquote(urlsplit(self.path).path)
        if path.endswith("/"):
            path += "index.html"
        target = (self.server.root / path.lstrip("/")).resolve()
        if not target.is_relative_to(self.server.root) or not target.is_file():
            return None
        return target

    def _send(self, head_only: bool) -> None:
        target = self._resolve()
        if target is None:
            body = b"not found\n"
            self.send_response(HTTPStatus.NOT_FOUND)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head_only:
                self.wfile.write(body)
            return
        stat = target.stat()
        gzipped = target.suffix in COMPRESSIBLE and "gzip" in self.headers.get("Accept-Encoding", "")
        etag = f'W/"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
        if etag in [t.strip() for t in self.headers.get("If-None-Match", "").split(",")]:
            self.send_response(HTTPStatus.NOT_MODIFIED)
            self._common_headers(etag)
            self.end_headers()
            return
        body = self.server.gzip_cache.get(target, stat) if gzipped else target.read_bytes()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", CONTENT_TYPES.get(target.suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(len(body)))
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self._common_headers(etag)
        self.end_headers()
        if not head_only:
            self.wfile.write(body)
            with self.server.count_lock:
                self.server.bytes_sent += len(body)

    def _common_headers(self, etag: str) -> None:
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Vary", "Accept-Encoding")
        self.send_header("ETag", etag)
        for name, value in ISOLATION_HEADERS.items():
            self.send_header(name, value)

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._send(head_only=False)

    def do_HEAD(self):  # noqa: N802
        self._send(head_only=True)


def make_server(site: Path, host: str = "127.0.0.1", port: int = 8080) -> SiteServer:
    site = Path(site)
    if not (site / "index.html").is_file():
        raise FileNotFoundError(f"{site} holds no index.html: write a site with `modelyard convert SRC --to web -o {site}`")
    return SiteServer(site, (host, port))
