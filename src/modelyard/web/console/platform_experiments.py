"""The console's Experiments page (``/console/experiments``): each Vertex AI experiment of the platform,
its runs side by side (state, parameters, summary metrics), a chart of each time-series metric with
one line per run, and each run's artifacts (models, datasets, metrics: the lineage a run records).

Read through the platform's own REST API (ML Metadata and TensorBoard), as the jobs are
(``platform_jobs``), so the page shows what a client of the API sees. With an ``--auth-token`` the
page is a shell until the token is given; its script (``experiments.js``) fetches the fragment with
the token the main console keeps for the tab. Every name and value is escaped here, in one place.
"""
from __future__ import annotations

import asyncio
import json
import re
from html import escape
from importlib import resources

import aiohttp
from aiohttp import web
from sqlalchemy import text

from modelyard.web.console.tensorboard_launch import Launcher

PATH = "/console/experiments"
_TENSORBOARD = re.compile(r"projects/[^/]+/locations/[^/]+/tensorboards/[^/]+")
MAX_RUNS = 50  # per experiment: the page stays small
_TIMEOUT = aiohttp.ClientTimeout(total=5)
_NO_STORE = {"Cache-Control": "no-store"}


def _e(value) -> str:
    return escape(str(value), quote=True)


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def parents(store) -> list[str]:
    """Every project/location holding a metadata store (the table is absent before schema v6)."""
    try:
        with store.engine.connect() as c:
            return sorted(r[0] for r in c.execute(text("SELECT DISTINCT parent FROM md_stores")))
    except Exception:
        return []


async def _get(session: aiohttp.ClientSession, base: str, path: str, headers: dict, **params) -> dict:
    pairs = [(k, v) for k, values in params.items() for v in (values if isinstance(values, list) else [values])]
    async with session.get(f"{base}/v1/{path}", params=pairs, headers=headers) as r:
        return await r.json() if r.status == 200 else {}


async def _run(session, base: str, headers: dict, store: str, run: dict) -> dict:
    """One run: its metadata, its artifacts, and its time series (through its TensorBoard run)."""
    meta = run.get("metadata") or {}
    artifacts = (await _get(session, base, f"{store}/artifacts", headers,
                            filter=f'in_context("{run["name"]}")')).get("artifacts", [])
    series: dict[str, list[list[float]]] = {}
    tb_run = next((a["metadata"].get("resourceName") for a in artifacts
                   if a.get("schemaTitle") == "google.VertexTensorboardRun"), None)
    if tb_run:
        listed = (await _get(session, base, f"{tb_run}/timeSeries", headers)).get("tensorboardTimeSeries", [])
        names = {s["name"]: s["displayName"] for s in listed if s.get("valueType") == "SCALAR"}
        if names:
            board = tb_run.split("/experiments/")[0]
            read = await _get(session, base, f"{board}:batchRead", headers,
                              **{"timeSeries": list(names)[:20]})
            for data in read.get("timeSeriesData", []):
                key = next((v for k, v in names.items() if _short(k) == data["tensorboardTimeSeriesId"]), None)
                if key:
                    series[key] = [[float(p["step"]), float(p["scalar"]["value"])] for p in data.get("values", [])]
    return {"name": _short(run["name"]), "displayName": run.get("displayName") or _short(run["name"]),
            "state": meta.get("_state", ""), "params": meta.get("_params") or {},
            "metrics": meta.get("_metrics") or {}, "series": series,
            "artifacts": [{"name": _short(a["name"]), "schemaTitle": a.get("schemaTitle", ""), "uri": a.get("uri", "")}
                          for a in artifacts if a.get("schemaTitle") != "google.VertexTensorboardRun"]}


async def collect(session, base: str, token: str | None, parent_names: list[str]) -> list[dict]:
    """Every experiment of every parent's default store, with its runs (newest ``MAX_RUNS``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    out = []
    for parent in parent_names:
        store = f"{parent}/metadataStores/default"
        exps = (await _get(session, base, f"{store}/contexts", headers,
                           filter='schema_title="system.Experiment"')).get("contexts", [])
        for exp in exps:
            runs = (await _get(session, base, f"{store}/contexts", headers,
                               filter=f'schema_title="system.ExperimentRun" AND parent_contexts:"{exp["name"]}"')
                    ).get("contexts", [])[-MAX_RUNS:]
            details = await asyncio.gather(*(_run(session, base, headers, store, r) for r in runs))
            out.append({"name": _short(exp["name"]), "parent": parent, "description": exp.get("description", ""),
                        "tensorboard": (exp.get("metadata") or {}).get("backing_tensorboard_resource", ""),
                        "runs": list(details)})
    return out


def _number(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def render_live(experiments: list[dict]) -> str:
    if not experiments:
        return '<p class="empty">No experiments yet: <code>aiplatform.init(experiment=...)</code> makes one.</p>'
    parts = []
    for exp in experiments:
        runs = exp["runs"]
        params = sorted({k for r in runs for k in r["params"]})
        metrics = sorted({k for r in runs for k in r["metrics"]})
        head = "".join(f"<th>{_e(h)}</th>" for h in ["run", "state", *(f"param.{p}" for p in params),
                                                       *(f"metric.{m}" for m in metrics), "artifacts"])
        rows = []
        for r in runs:
            cells = [_e(r["displayName"]), _e(r["state"] or "–")]
            cells += [_e(_number(r["params"].get(p, "–"))) for p in params]
            cells += [_e(_number(r["metrics"].get(m, "–"))) for m in metrics]
            cells.append("<br>".join(f'{_e(a["schemaTitle"])} <small>{_e(a["name"])} {_e(a["uri"])}</small>'
                                     for a in r["artifacts"]) or "–")
            rows.append('<tr class="run">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        keys = sorted({k for r in runs for k in r["series"]})
        charts = "".join(
            f'<figure class="series"><figcaption>{_e(k)}</figcaption><canvas height="140" data-series="'
            f'{_e(json.dumps([{"label": r["displayName"], "points": r["series"][k]} for r in runs if k in r["series"]]))}'
            f'"></canvas></figure>' for k in keys)
        board = (f' <button class="open-tb" data-tensorboard="{_e(exp["tensorboard"])}">open in TensorBoard</button>'
                 if _TENSORBOARD.fullmatch(exp.get("tensorboard") or "") else "")
        parts.append(f'<section class="experiment" data-experiment="{_e(exp["name"])}"><h2>{_e(exp["name"])} '
                     f'<small>{_e(exp["parent"])}</small>{board}</h2><p>{_e(exp["description"])}</p>'
                     f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
                     f'<div class="charts">{charts}</div></section>')
    return "".join(parts)


def _document(live: str, locked: bool) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>modelyard experiments</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/console/console.css">
<link rel="stylesheet" href="/console/platform.css">
<script src="/console/chart.js" defer></script>
<script src="{PATH}.js" defer></script>
</head><body data-locked="{int(locked)}">
<header><h1>Experiments</h1><p><a href="/console">platform console</a></p></header>
<main id="live">{live}</main>
</body></html>
"""


def register(app: web.Application, platform) -> None:
    """Adds the page, its fragment and its script (before the console's ``/console/{asset}`` route)."""
    script = (resources.files("modelyard.web.console") / "assets" / "experiments.js").read_bytes()
    state: dict = {}

    async def fragment(request: web.Request) -> str:
        if "session" not in state:
            state["session"] = aiohttp.ClientSession(timeout=_TIMEOUT)
        host, port = request.transport.get_extra_info("sockname")[:2]
        found = await collect(state["session"], f"http://{host}:{port}", platform.config.auth_token,
                              parents(platform.store))
        return render_live(found)

    async def page(request: web.Request) -> web.Response:
        if platform.token_refusal(request.headers.get("Authorization")) is not None:
            body = _document('<p class="locked">This platform needs its auth token: give it on the '
                             '<a href="/console">console</a> first.</p>', locked=True)
        else:
            body = _document(await fragment(request), locked=False)
        return web.Response(text=body, content_type="text/html", charset="utf-8", headers=_NO_STORE)

    async def live(request: web.Request) -> web.Response:
        refused = platform.token_refusal(request.headers.get("Authorization"))
        if refused is not None:
            return web.json_response(refused.to_body(), status=refused.http_status, headers=_NO_STORE)
        return web.Response(text=await fragment(request), content_type="text/html", charset="utf-8",
                            headers=_NO_STORE)

    launcher = Launcher(platform.config.state_dir / "tensorboard-views")

    async def open_tensorboard(request: web.Request) -> web.Response:
        """POST {"tensorboard": NAME}: a TensorBoard showing that resource's scalars, started if need be;
        answers {"url": ...} (the page's script goes there)."""
        refused = platform.token_refusal(request.headers.get("Authorization"))
        if refused is not None:
            return web.json_response(refused.to_body(), status=refused.http_status, headers=_NO_STORE)
        try:
            name = (await request.json()).get("tensorboard")
        except (ValueError, AttributeError):
            name = None
        if not isinstance(name, str) or not _TENSORBOARD.fullmatch(name):
            return web.json_response({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message":
                                                "give {\"tensorboard\": \"projects/P/locations/L/tensorboards/ID\"}"}},
                                     status=400, headers=_NO_STORE)
        if "session" not in state:
            state["session"] = aiohttp.ClientSession(timeout=_TIMEOUT)
        host, port = request.transport.get_extra_info("sockname")[:2]
        token = platform.config.auth_token
        launcher.root.mkdir(parents=True, exist_ok=True)
        try:
            url = await launcher.open(state["session"], f"http://{host}:{port}",
                                      {"Authorization": f"Bearer {token}"} if token else {}, name)
        except RuntimeError as exc:  # the resource is missing, or TensorBoard would not start: said as it is
            code = 404 if ": 404 " in str(exc) else 500
            return web.json_response({"error": {"code": code, "status": "NOT_FOUND" if code == 404 else "INTERNAL",
                                                "message": str(exc)}}, status=code, headers=_NO_STORE)
        return web.json_response({"url": url}, headers=_NO_STORE)

    async def asset(_request: web.Request) -> web.Response:
        return web.Response(body=script, content_type="text/javascript", charset="utf-8")

    async def close(_app) -> None:
        await asyncio.to_thread(launcher.stop)
        if "session" in state:
            await state["session"].close()

    app.router.add_get(PATH, page)
    app.router.add_get(PATH + "/live", live)
    app.router.add_get(PATH + ".js", asset)
    app.router.add_post(PATH + "/tensorboard", open_tensorboard)
    app.on_cleanup.append(close)
