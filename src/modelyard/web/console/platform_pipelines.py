"""The console's Vertex AI Pipelines pages: ``/console/pipelines`` lists the runs (and the schedules that
start them), ``/console/pipelines/run?name=RUN`` draws a run's graph, each task a node coloured by its
state, its dependencies the edges, and shows the chosen task's details and log (``&task=TASK_ID``).

A group (a nested pipeline, a ``dsl.If`` branch, an ``ExitHandler``) is a node that opens its own graph;
a ``ParallelFor`` loop opens as its iterations, each of which opens as the loop's body with that
iteration's states. The graph's shape is the compiled spec's (``pipelineSpec``: every task, started or
not, with ``dependentTasks`` and the producers of its inputs as edges); the states are ``taskDetails``'.
A task's log is its custom job's (``executorDetail.customJobDetail.job``), read from the platform's
``/modelyard/v1/jobs/{id}/logs``.

Everything is read through the platform's own REST API, as the other pages read it, so the pages show
what a client of the API sees. Laid out by ``dag_layout`` and drawn here as SVG: no script from a CDN.
With an ``--auth-token`` the page is a shell until the token is given; its script (``pipelines.js``)
fetches the fragment with the token the main console keeps for the tab. Every name is escaped here.
"""
from __future__ import annotations

import asyncio
import re
from html import escape
from importlib import resources
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from modelyard.web.console import dag_layout, platform_state

PATH = "/console/pipelines"
MAX_RUNS = 100
LOG_TAIL = 64 * 1024  # bytes of a task's log shown: its end, where a failure is
_TIMEOUT = aiohttp.ClientTimeout(total=5)
_NO_STORE = {"Cache-Control": "no-store"}
# Fill and stroke per task state (Vertex's PipelineTaskDetail.State, and "" for a task not started yet).
COLOURS = {
    "SUCCEEDED": ("#e6f4ea", "#188038"), "SKIPPED": ("#e8f0fe", "#188038"), "FAILED": ("#fce8e6", "#d93025"),
    "RUNNING": ("#e8f0fe", "#1a73e8"), "PENDING": ("#fef7e0", "#f29900"), "CANCELLING": ("#fef7e0", "#b06000"),
    "CANCELLED": ("#f1f3f4", "#b06000"), "NOT_TRIGGERED": ("#f8f9fa", "#9aa0a6"), "": ("#ffffff", "#9aa0a6"),
}
_RUN_NAME = re.compile(r"projects/[^/?#]+/locations/[^/?#]+/pipelineJobs/[a-z][-a-z0-9]{0,127}")
_RUNNING = {"PIPELINE_STATE_QUEUED", "PIPELINE_STATE_PENDING", "PIPELINE_STATE_RUNNING", "PIPELINE_STATE_CANCELLING"}


def _e(value) -> str:
    return escape(str(value), quote=True)


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


# ---- the graph of one scope of a run (pure: spec and taskDetails in, nodes and edges out) --------------

def _dag_tasks(spec: dict, component: str | None) -> dict:
    if component is None:
        return ((spec.get("root") or {}).get("dag") or {}).get("tasks") or {}
    return (((spec.get("components") or {}).get(component) or {}).get("dag") or {}).get("tasks") or {}


def _upstream(task: dict) -> set[str]:
    """The tasks a task waits for: its ``dependentTasks`` and the producers of its inputs."""
    found = set(task.get("dependentTasks") or [])
    inputs = task.get("inputs") or {}
    for kind, key in (("parameters", "taskOutputParameter"), ("artifacts", "taskOutputArtifact")):
        for given in (inputs.get(kind) or {}).values():
            producer = (given.get(key) or {}).get("producerTask") if isinstance(given, dict) else None
            if producer:
                found.add(producer)
    return found


def _is_loop(task: dict) -> bool:
    return "parameterIterator" in task or "artifactIterator" in task


def _iteration(detail: dict) -> int | None:
    index = ((detail.get("execution") or {}).get("metadata") or {}).get("iteration_index")
    return None if index is None else int(index)


class RunGraph:
    """A run's tasks as a tree of scopes: the root DAG, each group's DAG, each loop's iterations."""

    def __init__(self, job: dict) -> None:
        self.spec = job.get("pipelineSpec") or {}
        self.details = ((job.get("jobDetail") or {}).get("taskDetails")) or []
        self.by_id = {d.get("taskId"): d for d in self.details}
        self.root_id = self.details[0].get("taskId") if self.details else None
        self.children: dict[str | None, list[dict]] = {}
        for d in self.details[1:]:
            self.children.setdefault(d.get("parentTaskId"), []).append(d)

    def _component_of(self, task_id: str | None) -> tuple[str | None, dict | None]:
        """(the component whose DAG holds the task's own tasks, the task's spec) for a group, loop or
        iteration instance; (None, None) for the root."""
        if task_id is None or task_id == self.root_id:
            return None, None
        d = self.by_id[task_id]
        if _iteration(d) is not None:  # an iteration: its loop's body
            return self._component_of(d.get("parentTaskId"))
        parent_component, _ = self._component_of(d.get("parentTaskId"))
        task = _dag_tasks(self.spec, parent_component).get(d.get("taskName")) or {}
        return (task.get("componentRef") or {}).get("name"), task

    def path(self, task_id: str | None) -> list[dict]:
        """The task's ancestors from the root's first child down to the task itself (the breadcrumb)."""
        out = []
        while task_id is not None and task_id != self.root_id and task_id in self.by_id:
            out.append(self.by_id[task_id])
            task_id = self.by_id[task_id].get("parentTaskId")
        return out[::-1]

    def is_scope(self, task_id: str) -> bool:
        """Whether a task opens a graph of its own (a group, a loop or an iteration)."""
        component, task = self._component_of(task_id)
        return task is not None and (_is_loop(task) or _iteration(self.by_id[task_id]) is not None
                                     or bool(_dag_tasks(self.spec, component)))

    def scope(self, task_id: str | None) -> tuple[list[dict], list[tuple[str, str]]]:
        """The nodes (``key``, ``label``, ``state``, ``taskId`` or None, ``opens``) and edges of the graph
        that ``task_id`` opens (None: the run's root DAG)."""
        component, task = self._component_of(task_id)
        started = self.children.get(task_id if task_id is not None else self.root_id, [])
        if task is not None and _is_loop(task) and _iteration(self.by_id[task_id]) is None:
            iterations = sorted(started, key=lambda d: _iteration(d) or 0)  # the loop: its iterations
            return [{"key": d["taskId"], "label": f'{d.get("taskName")} #{_iteration(d)}', "state": d.get("state", ""),
                     "taskId": d["taskId"], "opens": True} for d in iterations], []
        tasks = _dag_tasks(self.spec, component)
        instance = {d.get("taskName"): d for d in started}
        nodes, edges = [], []
        for name, t in tasks.items():
            d = instance.get(name)
            sub = (t.get("componentRef") or {}).get("name")
            nodes.append({"key": name, "label": name, "state": (d or {}).get("state", ""),
                          "taskId": (d or {}).get("taskId"),
                          "opens": _is_loop(t) or bool(_dag_tasks(self.spec, sub))})
            edges += [(up, name) for up in sorted(_upstream(t)) if up in tasks]
        return nodes, edges


def render_svg(nodes: list[dict], edges: list[tuple[str, str]], link) -> str:
    """The graph as SVG: ``link(node)`` is a node's href (None: not clickable, a task not started yet)."""
    placed = dag_layout.layout([n["key"] for n in nodes], edges)
    pos = placed.positions
    parts = [f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{placed.width}" height="{placed.height}" '
             f'viewBox="0 0 {placed.width} {placed.height}" role="img" aria-label="the run\'s task graph">',
             '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#9aa0a6"/></marker></defs>']
    for a, b in edges:
        parts.append(f'<path class="edge" data-from="{_e(a)}" data-to="{_e(b)}" d="{dag_layout.edge_path(pos[a], pos[b])}" '
                     'fill="none" stroke="#9aa0a6" stroke-width="1.5" marker-end="url(#arrow)"/>')
    dashed = ' stroke-dasharray="5 3"'  # a node that opens a graph of its own
    for n in nodes:
        x, y = pos[n["key"]]
        fill, stroke = COLOURS.get(n["state"], COLOURS[""])
        label = n["label"] if len(n["label"]) <= 22 else n["label"][:21] + "…"
        state = (n["state"] or "not started").lower().replace("_", " ") + (" ▸" if n["opens"] else "")
        shape = (f'<rect x="{x}" y="{y}" width="{dag_layout.NODE_W}" height="{dag_layout.NODE_H}" rx="8" fill="{fill}" '
                 f'stroke="{stroke}" stroke-width="{2.5 if n.get("selected") else 1.5}"{dashed if n["opens"] else ""}/>'
                 f'<title>{_e(n["label"])}: {_e(n["state"] or "not started")}</title>'
                 f'<text x="{x + 10}" y="{y + 19}" font-size="13" font-weight="600" fill="#1d2330">{_e(label)}</text>'
                 f'<text x="{x + 10}" y="{y + 36}" font-size="11" fill="{stroke}">{_e(state)}</text>')
        href = link(n)
        attrs = f'class="task" data-task="{_e(n["key"])}" data-state="{_e(n["state"])}"'
        parts.append(f'<a {attrs} href="{_e(href)}">{shape}</a>' if href else f'<g {attrs}>{shape}</g>')
    parts.append("</svg>")
    return "".join(parts)


# ---- reading the platform's REST API ----------------------------------------------------------------------

async def _get(session: aiohttp.ClientSession, url: str, headers: dict, **params) -> tuple[int, dict]:
    try:
        async with session.get(url, params=params, headers=headers) as r:
            return r.status, (await r.json(content_type=None) if r.content_type == "application/json" else {})
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return 0, {}


async def _text(session: aiohttp.ClientSession, url: str, headers: dict) -> str | None:
    try:
        async with session.get(url, headers=headers) as r:
            return await r.text(errors="replace") if r.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


async def list_runs(session, base: str, headers: dict, parents: list[str]) -> tuple[list[dict], list[dict]]:
    """(runs, schedules) of every parent, newest first."""
    pages = await asyncio.gather(*(_get(session, f"{base}/v1/{p}/pipelineJobs", headers, pageSize=str(MAX_RUNS),
                                        orderBy="create_time desc") for p in parents))
    scheds = await asyncio.gather(*(_get(session, f"{base}/v1/{p}/schedules", headers, pageSize=str(MAX_RUNS))
                                    for p in parents))
    runs = [j for status, body in pages if status == 200 for j in body.get("pipelineJobs") or []]
    schedules = [s for status, body in scheds if status == 200 for s in body.get("schedules") or []]
    runs.sort(key=lambda j: j.get("createTime", ""), reverse=True)
    return runs[:MAX_RUNS], schedules


# ---- HTML ---------------------------------------------------------------------------------------------------

def _state_word(state: str) -> str:
    return state.removeprefix("PIPELINE_STATE_").lower()


def _counts(job: dict) -> str:
    details = ((job.get("jobDetail") or {}).get("taskDetails") or [])[1:]
    by: dict[str, int] = {}
    for d in details:
        by[d.get("state", "")] = by.get(d.get("state", ""), 0) + 1
    return ", ".join(f"{v} {k.lower().replace('_', ' ')}" for k, v in sorted(by.items())) or "–"


def render_list(runs: list[dict], schedules: list[dict]) -> str:
    rows = []
    for j in runs:
        href = f"{PATH}/run?{urlencode({'name': j['name']})}"
        state = _state_word(j.get("state", ""))
        rows.append(f'<tr class="pipeline-run" data-run="{_e(_short(j["name"]))}"><td><a href="{_e(href)}">'
                    f'{_e(j.get("displayName") or _short(j["name"]))}</a><br><small>{_e(_short(j["name"]))}</small></td>'
                    f'<td class="state {_e(state)}">{_e(state)}</td><td>{_e(_counts(j))}</td>'
                    f'<td>{_e(j.get("createTime", ""))}</td><td>{_e(j.get("endTime", "–"))}</td>'
                    f'<td>{_e(_short(j.get("scheduleName", "")) or "–")}</td></tr>')
    table = ('<table class="runs"><thead><tr><th>run</th><th>state</th><th>tasks</th><th>created</th><th>ended</th>'
             f'<th>schedule</th></tr></thead><tbody>{"".join(rows)}</tbody></table>' if rows else
             '<p class="empty">No pipeline runs yet: <code>aiplatform.PipelineJob(template_path=...).submit()</code> '
             'starts one.</p>')
    sched_rows = [f'<tr class="schedule" data-schedule="{_e(_short(s["name"]))}"><td>{_e(s.get("displayName", ""))}'
                  f'<br><small>{_e(_short(s["name"]))}</small></td><td><code>{_e(s.get("cron", ""))}</code></td>'
                  f'<td class="state">{_e(s.get("state", "").lower())}</td><td>{_e(s.get("startedRunCount", 0))}'
                  f'{" of " + _e(s["maxRunCount"]) if s.get("maxRunCount") else ""}</td>'
                  f'<td>{_e(s.get("nextRunTime", "–"))}</td></tr>' for s in schedules]
    sched = ('<h2>Schedules</h2><table class="schedules"><thead><tr><th>schedule</th><th>cron</th><th>state</th>'
             f'<th>runs started</th><th>next run</th></tr></thead><tbody>{"".join(sched_rows)}</tbody></table>'
             if sched_rows else "")
    running = any(j.get("state") in _RUNNING for j in runs)
    return f'<section class="card" data-running="{int(running)}"><h2>Runs</h2>{table}{sched}</section>'


def _artifacts(io: dict) -> str:
    items = [f'<li>{_e(k)}: <span class="uri">{_e(a.get("uri", ""))}</span> <small>{_e(a.get("schemaTitle", ""))}</small></li>'
             for k, v in sorted((io or {}).items()) for a in (v or {}).get("artifacts") or []]
    return f'<ul>{"".join(items)}</ul>' if items else "–"


def _task_panel(d: dict, log: str | None) -> str:
    meta = ((d.get("execution") or {}).get("metadata") or {})
    params = "".join(f"<li>{_e(k)} = {_e(v)}</li>" for k, v in sorted(meta.items())
                     if k.startswith(("input:", "output:")))
    job = ((d.get("executorDetail") or {}).get("customJobDetail") or {}).get("job", "")
    error = (d.get("error") or {}).get("message", "")
    attempts = "".join(f'<li>{_e(a.get("updateTime", ""))}: {_e(a.get("state", ""))} '
                       f'{_e((a.get("error") or {}).get("message", ""))}</li>' for a in d.get("pipelineTaskStatus") or [])
    rows = [("state", f'<span class="state {_e(d.get("state", "").lower())}">{_e(d.get("state", ""))}</span>'),
            ("started", _e(d.get("startTime", "–"))), ("ended", _e(d.get("endTime", "–"))),
            ("custom job", f'<span class="uri">{_e(job)}</span>' if job else "–"),
            ("parameters", f"<ul>{params}</ul>" if params else "–"),
            ("inputs", _artifacts(d.get("inputs"))), ("outputs", _artifacts(d.get("outputs")))]
    if attempts:
        rows.append(("failed attempts", f"<ul>{attempts}</ul>"))
    if error:
        rows.append(("error", f'<span class="error">{_e(error)}</span>'))
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    if log is None:
        log_html = '<p class="hint">No log: this task ran no job.</p>' if not job else \
            '<p class="hint">The log could not be read.</p>'
    else:
        log_html = f'<pre class="log">{_e(log[-LOG_TAIL:]) or "(empty)"}</pre>'
    return (f'<section class="card task-detail" data-task="{_e(d.get("taskName", ""))}"><h2>{_e(d.get("taskName", ""))}'
            f'</h2><table class="kv">{table}</table><h3>log</h3>{log_html}</section>')


def render_run(job: dict, task_id: str | None, log: str | None) -> str:
    """A run: its header, the breadcrumb to the scope shown, the scope's graph, the chosen task's panel."""
    graph = RunGraph(job)
    name = job.get("name", "")
    chosen = graph.by_id.get(task_id) if task_id else None
    scope_id = None
    if chosen is not None:
        scope_id = chosen["taskId"] if graph.is_scope(chosen["taskId"]) else chosen.get("parentTaskId")
        if scope_id == graph.root_id:
            scope_id = None
    nodes, edges = graph.scope(scope_id)
    for n in nodes:
        n["selected"] = chosen is not None and n["taskId"] == chosen["taskId"]

    def link(n: dict) -> str | None:
        return f"{PATH}/run?{urlencode({'name': name, 'task': n['taskId']})}" if n["taskId"] else None

    crumbs = [f'<a href="{_e(PATH)}/run?{_e(urlencode({"name": name}))}">{_e(job.get("displayName") or _short(name))}</a>']
    for d in graph.path(scope_id):
        label = d.get("taskName", "") + (f" #{_iteration(d)}" if _iteration(d) is not None else "")
        crumbs.append(f'<a href="{_e(link({"taskId": d["taskId"]}))}">{_e(label)}</a>')
    state = _state_word(job.get("state", ""))
    error = (job.get("error") or {}).get("message", "")
    head = (f'<section class="card run" data-run="{_e(_short(name))}" data-state="{_e(job.get("state", ""))}" '
            f'data-running="{int(job.get("state") in _RUNNING)}"><h2>{_e(job.get("displayName") or _short(name))} '
            f'<span class="state {_e(state)}">{_e(state)}</span></h2><p class="uri">{_e(name)}</p>'
            f'<p><small>created {_e(job.get("createTime", "–"))}, ended {_e(job.get("endTime", "–"))}'
            f'{", schedule " + _e(_short(job["scheduleName"])) if job.get("scheduleName") else ""}</small></p>'
            + (f'<p class="error">{_e(error)}</p>' if error else "")
            + f'<nav class="crumbs">{" / ".join(crumbs)}</nav><div class="scroll">{render_svg(nodes, edges, link)}</div>'
            '<p class="hint">Click a task for its details and log; a dashed task opens its own graph.</p></section>')
    panel = _task_panel(chosen, log) if chosen is not None and not graph.is_scope(chosen["taskId"]) else ""
    return head + panel


def first_failed(job: dict) -> str | None:
    """The task shown when none is chosen: the first failed task that is not a group (its log says why)."""
    graph = RunGraph(job)
    for d in graph.details[1:]:
        if d.get("state") == "FAILED" and not graph.is_scope(d["taskId"]):
            return d["taskId"]
    return None


def _document(title: str, live: str, locked: bool) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/console/console.css">
<link rel="stylesheet" href="/console/platform.css">
<style>svg.dag {{ display: block; background: #fff; }} svg.dag a {{ cursor: pointer; }}
pre.log {{ background: #1d2330; color: #e8eaed; padding: 8px; max-height: 420px; overflow: auto; white-space: pre-wrap;
font-size: .8rem; }} table.kv th {{ width: 9em; vertical-align: top; }} .crumbs {{ margin: 6px 0; }}
.task-detail .error {{ white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: .8rem; }}</style>
<script src="{PATH}.js" defer></script>
</head><body data-locked="{int(locked)}">
<header><h1>Pipelines</h1><p><a href="{PATH}">runs</a> · <a href="/console">platform console</a></p></header>
<main id="live">{live}</main>
</body></html>
"""


def register(app: web.Application, platform) -> None:
    """Adds the pages, their fragment and their script (before the console's ``/console/{asset}`` route)."""
    script = (resources.files("modelyard.web.console") / "assets" / "pipelines.js").read_bytes()
    state: dict = {}

    def session() -> aiohttp.ClientSession:
        if "session" not in state:
            state["session"] = aiohttp.ClientSession(timeout=_TIMEOUT)
        return state["session"]

    async def fragment(request: web.Request, run_page: bool) -> str:
        host, port = request.transport.get_extra_info("sockname")[:2]
        base = f"http://{host}:{port}"
        token = platform.config.auth_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if not run_page:
            return render_list(*await list_runs(session(), base, headers, platform_state.parents(platform.store)))
        name = request.query.get("name", "")
        status, job = await _get(session(), f"{base}/v1/{name}", headers) if _RUN_NAME.fullmatch(name) else (404, {})
        if status != 200:
            return f'<p class="error">No pipeline run {_e(name)}: {_e((job.get("error") or {}).get("message", status))}</p>'
        task_id = request.query.get("task") or first_failed(job)
        chosen = RunGraph(job).by_id.get(task_id)
        log = None
        custom_job = ((chosen or {}).get("executorDetail") or {}).get("customJobDetail", {}).get("job")
        if custom_job:
            log = await _text(session(), f"{base}/modelyard/v1/jobs/{_short(custom_job)}/logs", headers)
        return render_run(job, task_id, log)

    def page(run_page: bool):
        async def handler(request: web.Request) -> web.Response:
            if platform.token_refusal(request.headers.get("Authorization")) is not None:
                body = _document("modelyard pipelines", '<p class="locked">This platform needs its auth token: give it '
                                 'on the <a href="/console">console</a> first.</p>', locked=True)
            else:
                body = _document("modelyard pipelines", await fragment(request, run_page), locked=False)
            return web.Response(text=body, content_type="text/html", charset="utf-8", headers=_NO_STORE)
        return handler

    async def live(request: web.Request) -> web.Response:
        refused = platform.token_refusal(request.headers.get("Authorization"))
        if refused is not None:
            return web.json_response(refused.to_body(), status=refused.http_status, headers=_NO_STORE)
        return web.Response(text=await fragment(request, "name" in request.query), content_type="text/html",
                            charset="utf-8", headers=_NO_STORE)

    async def asset(_request: web.Request) -> web.Response:
        return web.Response(body=script, content_type="text/javascript", charset="utf-8")

    async def close(_app) -> None:
        if "session" in state:
            await state["session"].close()

    app.router.add_get(PATH, page(False))
    app.router.add_get(PATH + "/run", page(True))
    app.router.add_get(PATH + "/live", live)
    app.router.add_get(PATH + ".js", asset)
    app.on_cleanup.append(close)
