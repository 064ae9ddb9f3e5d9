"""What makes a site an installable app that works offline: its version, manifest, icons and worker.

- The version is a content hash of what the page runs (page assets, model, its config, the
  runtime's version): the page asks for ``app.js?v=VERSION``, ``model.tflite?v=VERSION``, ..., so
  a cached copy is never mistaken for a newer convert's, and the service worker's app cache is
  named after it (``modelyard-app-VERSION``): a new convert's worker deletes the old cache.
- The manifest names the app after the model, ``display: standalone``, a theme colour and
  two PNG icons drawn at convert time (``icons``): what Chromium checks before it offers to
  install.
"""
from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

from modelyard.web import icons

MANIFEST = "manifest.webmanifest"
WORKER = "sw.js"


def version_of(parts: list[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:12]


def cache_names(version: str, litertjs: str) -> dict[str, str]:
    """The worker's two caches: the app's (one per convert) and the runtime's (one per LiteRT.js version)."""
    return {"app": f"modelyard-app-{version}", "runtime": f"modelyard-runtime-litertjs-{litertjs}"}


def manifest(name: str, version: str) -> dict:
    return {
        "name": f"{name} (modelyard)",
        "short_name": name[:12] or "modelyard",
        "description": f"Classify an image with {name}, on this device, also offline.",
        "id": "./",
        "start_url": "./",
        "scope": "./",
        "display": "standalone",
        "theme_color": icons.theme_hex(),
        "background_color": "#f4f5f8",
        "icons": [{"src": f"icon-{size}.png?v={version}", "sizes": f"{size}x{size}", "type": "image/png",
                   "purpose": "any maskable"} for size in icons.SIZES],
    }


def write_app_files(target: Path, name: str, version: str, caches: dict[str, str]) -> None:
    """Manifest, icons and service worker into ``target``; index.html's version placeholders filled."""
    (target / MANIFEST).write_text(json.dumps(manifest(name, version), indent=2) + "\n")
    for size in icons.SIZES:
        (target / f"icon-{size}.png").write_bytes(_icon(size))
    worker = (resources.files("modelyard.web") / "assets" / WORKER).read_text()
    worker = worker.replace("__APP_CACHE__", caches["app"]).replace("__RUNTIME_CACHE__", caches["runtime"])
    (target / WORKER).write_text(worker)
    page = target / "index.html"
    page.write_text(page.read_text().replace("__VERSION__", version).replace("__THEME__", icons.theme_hex())
                    .replace("__TITLE__", _html_text(name)))


_ICONS: dict[int, bytes] = {}


def _icon(size: int) -> bytes:
    if size not in _ICONS:  # the same picture for every site: drawn once per process
        _ICONS[size] = icons.icon(size)
    return _ICONS[size]


def _html_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
