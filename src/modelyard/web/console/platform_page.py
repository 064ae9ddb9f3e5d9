"""The platform console's HTML, rendered on the server from ``platform_state.collect``.

The page is rendered here only: the script (``assets/platform.js``) fetches the ``live`` fragment
again every second and swaps it in, so escaping happens in one place. Every name, label, URI and
message goes through ``html.escape``, in text and in attributes alike: a model displayed as
``<script>`` is text. Counters are written as ``data-*`` attributes, from which the script
computes rates and latencies and draws the charts.
"""
from __future__ import annotations

import json
from html import escape


def _e(value) -> str:
    return escape(str(value), quote=True)


def _td(value, cls: str = "", label: str = "", html: str | None = None) -> str:
    """A cell of escaped text (or of ``html`` already built from escaped parts); ``label`` names it
    on a phone, where the table's rows are stacked and its header hidden (platform.css)."""
    attrs = (f' class="{_e(cls)}"' if cls else "") + (f' data-label="{_e(label)}"' if label else "")
    return f"<td{attrs}>{_e(value) if html is None else html}</td>"


def _labels(labels: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "–"


def _replica_summary(replicas: list[dict]) -> str:
    serving = sum(1 for r in replicas if r["state"] == "SERVING")
    return f"{serving}/{len(replicas)} serving" if replicas else "none"


def _pooled(dm: dict) -> str:
    """Where a pooled model is loaded (on demand), after its replica count."""
    pool = dm.get("pool")
    if not pool:
        return ""
    where = ", ".join(pool["loadedOn"]) or "not loaded"
    idle = "" if pool["idleSeconds"] is None else f', idle {pool["idleSeconds"]:.0f} s'
    return f' (pool {pool["pool"]}: loaded on {where}; {pool["loads"]} load(s){idle})'


def _shadow(dm: dict) -> str:
    s = dm["shadow"]
    if not dm["shadowTrafficPercentage"]:
        return "–"
    if s is None:
        return f'shadow {dm["shadowTrafficPercentage"]}%, nothing mirrored yet'
    ratio = "–" if s["agreementRatio"] is None else f'{100 * s["agreementRatio"]:.1f}%'
    return (f'shadow {dm["shadowTrafficPercentage"]}%: {s["agreed"]}/{s["mirrored"] - s["failed"]} agree ({ratio}), '
            f'{s["failed"]} failed, max |diff| {s["maxAbsDiff"]:.3g}')


def _dm_row(ep: dict, dm: dict) -> str:
    share = ep["trafficSplit"].get(dm["id"], 0)
    counts = (f'data-dm="{_e(dm["id"])}" data-total="{dm["requests"]["total"]}" data-ok="{dm["requests"]["ok"]}" '
              f'data-lsum="{dm["latencySeconds"]["sum"]:.6f}" data-lcount="{dm["latencySeconds"]["count"]}"')
    return (f'<tr class="dm" {counts}>'
            + _td("", "name", html=f'<b>{_e(dm["displayName"])}</b><br><small>{_e(dm["id"])}</small>')
            + _td("", "", "model@version", f'{_e(dm["modelDisplayName"])}<br><small>'
                  f'{_e(dm["model"].rsplit("/", 1)[-1])}@{_e(dm["modelVersionId"])}</small>')
            + _td(f"{share}%", "share", "traffic") + _td(_replica_summary(dm["replicas"]) + _pooled(dm), "replica-count", "replicas")
            + _td(dm["requests"]["total"], "requests", "requests")
            + _td(dm["requests"]["total"] - dm["requests"]["ok"], "errors", "errors")
            + _td("–", "rate", "rate") + _td("–", "latency", "latency") + _td(_shadow(dm), "shadow", "shadow")
            + "</tr>")


def _replica_rows(ep: dict) -> str:
    rows = []
    for dm in ep["deployedModels"]:
        for r in dm["replicas"]:
            rows.append(f'<tr class="replica" data-replica="{_e(r["id"])}">' + _td(r["id"], "id", "replica")
                        + _td(dm["displayName"], "", "deployed model")
                        + _td(r["state"], f'state {r["state"].lower()}', "state")
                        + _td(r["inFlight"], "in-flight", "in flight") + _td(r["served"], "served", "served") + "</tr>")
    return "".join(rows) or '<tr><td colspan="5">no replicas</td></tr>'


def _split_form(ep: dict) -> str:
    """Inputs for a new split; the script sends it as ``PATCH endpoints/{id}?updateMask=trafficSplit``."""
    dms = [dm for dm in ep["deployedModels"] if not dm["shadowTrafficPercentage"]]
    if not dms:
        return ""
    key = ep["id"] + ":" + ",".join(sorted(dm["id"] for dm in dms))
    inputs = "".join(
        f'<label>{_e(dm["displayName"])} <small>{_e(dm["id"])}</small> '
        f'<input type="number" min="0" max="100" step="1" name="{_e(dm["id"])}" '
        f'value="{ep["trafficSplit"].get(dm["id"], 0)}">%</label>' for dm in dms)
    return (f'<form class="split" data-key="{_e(key)}" data-endpoint-name="{_e(ep["name"])}">{inputs}'
            '<button type="submit">Update traffic</button> <span class="result" role="status"></span></form>')


def _endpoint(ep: dict, can_act: bool) -> str:
    dms = "".join(_dm_row(ep, dm) for dm in ep["deployedModels"]) or '<tr><td colspan="9">nothing deployed</td></tr>'
    split = ", ".join(f"{k}: {v}%" for k, v in sorted(ep["trafficSplit"].items())) or "empty"
    return f"""
<section class="card endpoint" data-endpoint="{_e(ep["id"])}">
  <h3>{_e(ep["displayName"])}</h3>
  <p class="path">{_e(ep["name"])}</p>
  <p class="split-now">traffic split: <span class="split-text">{_e(split)}</span>
    · labels: <span class="labels">{_e(_labels(ep["labels"]))}</span></p>
  <div class="scroll"><table class="deployed stack"><thead><tr><th>deployed model</th><th>model@version</th><th>traffic</th>
  <th>replicas</th><th>requests</th><th>errors</th><th>rate</th><th>latency</th><th>shadow</th></tr></thead>
  <tbody>{dms}</tbody></table></div>
  <canvas class="chart" data-chart="{_e(ep["id"])}" width="600" height="120"
    aria-label="request rate and latency of endpoint {_e(ep["displayName"])}"></canvas>
  <details class="replicas-box" open><summary>replicas</summary><div class="scroll"><table class="replicas stack">
  <thead><tr><th>replica</th><th>deployed model</th><th>state</th><th>in flight</th><th>served</th></tr></thead>
  <tbody>{_replica_rows(ep)}</tbody></table></div></details>
  {_split_form(ep) if can_act else ""}
</section>"""


def _models(models: list[dict]) -> str:
    rows = []
    for m in models:
        for v in m["versions"]:
            rows.append(f'<tr class="version" data-model="{_e(m["id"])}" data-version="{_e(v["versionId"])}">'
                        + _td("", "name", html=f'<b class="model-name">{_e(m["displayName"])}</b><br>'
                              f'<small>{_e(m["id"])}</small>')
                        + _td(v["versionId"], "", "version") + _td(", ".join(v["aliases"]) or "–", "", "aliases")
                        + _td(_labels(m["labels"]), "labels", "labels")
                        + _td(v["artifactUri"], "uri", "artifact URI") + "</tr>")
    if not rows:
        return "<p>No models uploaded.</p>"
    return ('<div class="scroll"><table class="models stack"><thead><tr><th>model</th><th>version</th>'
            f'<th>aliases</th><th>labels</th><th>artifact URI</th></tr></thead><tbody>{"".join(rows)}</tbody>'
            '</table></div>')


def _job(job: dict, can_act: bool) -> str:
    progress = job["progress"]
    bar = ""
    if progress["total"]:
        bar = f'<progress max="{progress["total"]}" value="{progress["done"] or 0}"></progress> '
    curve, c = "", job["curve"]
    if c and c["values"]:
        data = json.dumps({"values": c["values"], "best": c["best"]})
        curve = (f'<canvas class="curve" data-curve="{_e(data)}" data-metric="{_e(c["metric"])}" '
                 f'width="300" height="80" aria-label="{_e(c["metric"])} per trial"></canvas>')
    if c and c.get("learning"):
        curve += (f'<canvas class="curve learning" data-learning="{_e(json.dumps(c["learning"]))}" '
                  f'data-metric="{_e(c["metric"])}" width="300" height="80" '
                  f'aria-label="{_e(c["metric"])} per step of each trial"></canvas>')
    cancel = (f'<button type="button" class="cancel" data-job="{_e(job["name"])}">Cancel</button>'
              if can_act and job["cancellable"] else "")
    error = f'<br><small class="error">{_e(job["error"])}</small>' if job["error"] else ""
    state = job["state"].removeprefix("JOB_STATE_")
    return (f'<tr class="job" data-job="{_e(job["name"])}">'
            + _td("", "name", html=f'<b>{_e(job["displayName"])}</b><br><small>{_e(job["kindLabel"])} '
                  f'{_e(job["name"].rsplit("/", 1)[-1])}</small>')
            + _td("", f"state {state.lower()}", "state", _e(state) + error)
            + _td("", "progress", "progress", f'{bar}<span class="progress-text">{_e(progress["text"])}</span>{curve}')
            + _td("", "action", html=cancel) + "</tr>")


def _jobs(jobs: list[dict], can_act: bool) -> str:
    if not jobs:
        return ""  # no job API on this platform, or no jobs: the section is left out
    rows = "".join(_job(j, can_act) for j in jobs)
    return (f'<section class="card" id="jobs"><h2>Jobs</h2><div class="scroll"><table class="jobs stack"><thead><tr>'
            f'<th>job</th><th>state</th><th>progress</th><th></th></tr></thead><tbody>{rows}</tbody>'
            '</table></div><span class="result" role="status"></span></section>')


def render_live(state: dict) -> str:
    """The part of the page the script refreshes: endpoints, models, jobs."""
    can_act = state["canAct"]
    endpoints = "".join(_endpoint(ep, can_act) for ep in state["endpoints"]) or "<p>No endpoints.</p>"
    # data-time: when the counters were read, so rates divide by the server's interval, not the network's
    return (f'<section id="endpoints" data-time="{state["time"]:.6f}"><h2>Endpoints</h2>{endpoints}</section>'
            f'<section class="card" id="models"><h2>Models</h2>{_models(state["models"])}</section>'
            + _jobs(state["jobs"], can_act))


_TOKEN_FORM = ('<form id="actions" autocomplete="off" onsubmit="return false">'
               '<input id="token" type="password" placeholder="auth token" aria-label="auth token"> '
               '<span class="hint">the platform\'s --auth-token: to see its state, change traffic, cancel jobs</span>'
               '</form>')
_READ_ONLY = ('<p class="readonly">Read-only: start <code>modelyard platform --auth-token ...</code> '
              "to change traffic and cancel jobs here.</p>")


def render_locked() -> str:
    """The page of a platform with an ``--auth-token`` before the token is given: no data at all;
    the script fetches the state with the token once it is typed."""
    return _document('<p class="locked">This platform needs its auth token to show its state: type it above.</p>',
                     _TOKEN_FORM, locked=True)


def render(state: dict) -> str:
    return _document(render_live(state), _TOKEN_FORM if state["canAct"] else _READ_ONLY, locked=False)


def _document(live: str, actions: str, locked: bool) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>modelyard platform console</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/console/console.css">
<link rel="stylesheet" href="/console/platform.css">
<script src="/console/chart.js" defer></script>
<script src="/console/platform.js" defer></script>
</head><body data-locked="{int(locked)}">
<header><h1>modelyard platform console</h1>
<p class="pages"><a href="/console/pipelines">pipelines</a> · <a href="/console/experiments">experiments</a></p><p id="updated">server-rendered; live updates start…</p>{actions}</header>
<main id="live">{live}</main>
</body></html>
"""
