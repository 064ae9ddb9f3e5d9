"""The console's routes on ``modelyard platform`` (aiohttp): the page, the live fragment, the JSON
state, and the assets. Registered by the platform's ``build_app`` unless ``--no-console``.

The console reads; it changes nothing itself. Its actions (a new traffic split, cancelling a
job) are the page calling the platform's own Vertex AI REST API (``PATCH endpoints/{id}``,
``POST {job}:cancel``) with the token the user types, so they run the API's code and its token
check, and are offered only when the platform has an ``--auth-token``.

Reading follows the API's rule: with an ``--auth-token`` the API's GETs need it, so the
console's state does too (``Authorization: Bearer`` on ``/console/api/*``, which the page sends
once the token is typed); ``/console`` itself is then a shell holding no data. Without a token
configured, everything is readable and nothing can be changed here.
"""
from __future__ import annotations

import logging
from importlib import resources

import orjson
from aiohttp import web

from modelyard.web.console import platform_experiments, platform_jobs, platform_page, platform_pipelines, platform_state

PREFIX = "/console"
_ASSETS = {"console.css": "text/css", "platform.css": "text/css", "chart.js": "text/javascript",
           "platform.js": "text/javascript"}
_NO_STORE = {"Cache-Control": "no-store"}

log = logging.getLogger(__name__)


def _error(status: int, name: str, message: str) -> web.Response:
    """Google's error body, as every other answer of the platform."""
    body = {"error": {"code": status, "message": message, "status": name}}
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=_NO_STORE)


def _compressed(response: web.Response) -> web.Response:
    """gzip or deflate when the client accepts it (aiohttp reads Accept-Encoding): the live
    fragment, polled every few seconds, is mostly repeated markup."""
    response.enable_compression()
    return response


class PlatformConsole:
    """``platform`` is the running Platform (duck-typed: store, routing, metrics, config)."""

    def __init__(self, platform) -> None:
        self.p = platform
        folder = resources.files("modelyard.web.console") / "assets"
        self.assets = {name: (folder / name).read_bytes() for name in _ASSETS}
        self._session = None  # aiohttp client for the jobs' REST lists, opened on first use

    async def state(self, request: web.Request) -> dict:
        """The state with the jobs the platform's REST API lists (through its private local port)."""
        if self._session is None:
            self._session = platform_jobs.new_session()
        host, port = request.transport.get_extra_info("sockname")[:2]
        parents = platform_state.parents(self.p.store)
        jobs = await platform_jobs.fetch(self._session, f"http://{host}:{port}", parents, self.p.config.auth_token)
        return platform_state.collect(self.p, jobs)

    def _refusal(self, request: web.Request) -> web.Response | None:
        """None when this request may read the platform's state, else the API's UNAUTHENTICATED answer."""
        refused = self.p.token_refusal(request.headers.get("Authorization"))  # the platform's one rule
        return None if refused is None else _error(refused.http_status, refused.status, refused.message)

    async def _answer(self, request: web.Request, render, content_type: str) -> web.Response:
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            state = await self.state(request)
        except Exception as exc:  # the store unreachable, say: the page says so and keeps polling
            log.exception("console: reading the platform's state failed")
            return _error(503, "UNAVAILABLE", f"the console cannot read the platform's state: {exc}")
        return _compressed(web.Response(body=render(state), content_type=content_type, charset="utf-8",
                                        headers=_NO_STORE))

    async def page(self, request: web.Request) -> web.Response:
        if self._refusal(request) is not None:  # a browser's first visit: the page asks for the token
            return web.Response(text=platform_page.render_locked(), content_type="text/html", charset="utf-8",
                                headers=_NO_STORE)
        return await self._answer(request, lambda s: platform_page.render(s).encode(), "text/html")

    async def live(self, request: web.Request) -> web.Response:
        return await self._answer(request, lambda s: platform_page.render_live(s).encode(), "text/html")

    async def state_json(self, request: web.Request) -> web.Response:
        return await self._answer(request, orjson.dumps, "application/json")

    async def asset(self, request: web.Request) -> web.Response:
        name = request.match_info["asset"]
        if name not in self.assets:
            return _error(404, "NOT_FOUND", f"No console file {name!r}: the console's paths are /console, "
                          "/console/api/state and /console/api/live.")
        return _compressed(web.Response(body=self.assets[name], content_type=_ASSETS[name], charset="utf-8"))

    async def close(self, _app=None) -> None:
        if self._session is not None:
            await self._session.close()


def register(app: web.Application, platform) -> PlatformConsole:
    """Add the console's GET routes to the platform's API app (before its catch-all route)."""
    console = PlatformConsole(platform)
    app.router.add_get(PREFIX, console.page)
    app.router.add_get(PREFIX + "/", console.page)
    app.router.add_get(PREFIX + "/api/state", console.state_json)
    app.router.add_get(PREFIX + "/api/live", console.live)
    platform_experiments.register(app, platform)  # /console/experiments, before the assets' route
    platform_pipelines.register(app, platform)  # /console/pipelines, likewise
    app.router.add_get(PREFIX + "/{asset}", console.asset)
    app.on_cleanup.append(console.close)
    return console
