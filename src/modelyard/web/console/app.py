"""The console's routes inside the REST app: the page, its assets, its state, and actions.

GETs are answered on the event loop (they only read the manager and metrics); the one
action, reloading the model config file, runs on the REST thread pool because it waits
for models to load. Actions need the token the server was started with; without one
configured the console is read-only.
"""
from __future__ import annotations

import hmac
from importlib import resources
from pathlib import Path

import orjson

from modelyard.web.console import page, state

PREFIX = "/console"
_JSON = [(b"content-type", b"application/json")]
_ASSETS = {"console.js": b"text/javascript; charset=utf-8", "chart.js": b"text/javascript; charset=utf-8",
           "console.css": b"text/css; charset=utf-8"}
_NO_STORE = (b"cache-control", b"no-store")


class Console:
    """``server`` is the ModelServer: its manager, metrics, options and ``reload_config``."""

    def __init__(self, server, token: str | None = None):
        self.server = server
        self.token = token or None
        folder = resources.files("modelyard.web.console") / "assets"
        self.assets = {name: (folder / name).read_bytes() for name in _ASSETS}

    def owns(self, path: str) -> bool:
        return path == PREFIX or path.startswith(PREFIX + "/")

    def state(self) -> dict:
        peers = self.server.group.peer_metrics() if getattr(self.server, "group", None) else []
        return state.collect(self.server.manager, self.server.metrics, peers)

    def immediate(self, method: str, path: str) -> tuple[int, list, bytes] | None:
        """The answer to a GET; None for a POST (its body is needed: see ``handle``)."""
        if method == "POST" and path.startswith(PREFIX + "/api/"):
            return None
        if method not in ("GET", "HEAD") or path == PREFIX + "/api/reload":
            return 405, _JSON, orjson.dumps({"error": f"{method} is not allowed on {path}"})
        if path in (PREFIX, PREFIX + "/"):
            body = page.render(self.state(), self.token is not None).encode()
            return 200, [(b"content-type", b"text/html; charset=utf-8"), _NO_STORE], body
        if path == PREFIX + "/api/state":
            return 200, _JSON + [_NO_STORE], orjson.dumps(self.state())
        name = path[len(PREFIX) + 1:]
        if name in _ASSETS:
            return 200, [(b"content-type", _ASSETS[name])], self.assets[name]
        return 404, _JSON, orjson.dumps({"error": f"Not found: {path}"})

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        """A POST action (JSON answer): ``/console/api/reload`` with ``{"token": ...}``."""
        if path != PREFIX + "/api/reload":
            return 404, orjson.dumps({"error": f"Not found: {path}"})
        if self.token is None:
            return 403, orjson.dumps({"error": "the console is read-only: start modelyard serve with "
                                               "--console_token_file FILE to allow actions"})
        try:
            given = orjson.loads(body or b"{}").get("token", "")
        except (orjson.JSONDecodeError, AttributeError):
            return 400, orjson.dumps({"error": 'send a JSON object: {"token": "..."}'})
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.token.encode()):
            return 401, orjson.dumps({"error": "wrong or missing console token"})
        return self._reload()

    def _reload(self) -> tuple[int, bytes]:
        from modelyard.serving.manager import config as config_files

        path: Path | None = self.server.options.model_config_file
        if path is None:
            return 400, orjson.dumps({"error": "this server was started without --model_config_file: nothing to reload"})
        try:
            self.server.reload_config(config_files.read_model_server_config(path))
        except Exception as exc:  # a bad file or a model that fails: the console says why, serving goes on
            message = getattr(exc, "message", None) or str(exc)
            return 400, orjson.dumps({"error": f"reload failed: {message}"})
        return 200, orjson.dumps({"reloaded": str(path), "models": sorted(self.server.manager.model_names())})
