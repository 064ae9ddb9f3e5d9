"""The console's HTML, rendered on the server from the state (``state.collect``).

Every name, label, path and error message goes through ``html.escape``: a model called
``<script>`` is text on the page. The script (``assets/console.js``) refreshes the same
table from ``/console/api/state`` and draws the traffic charts.
"""
from __future__ import annotations

from html import escape


def _cell(value) -> str:
    return f"<td>{escape(str(value))}</td>"


def _versions(model: dict) -> str:
    rows = []
    for v in model["versions"]:
        labels = ", ".join(v["labels"])
        rows.append(
            f'<tr data-version="{v["version"]}">' + _cell(v["version"])
            + f'<td class="state {escape(v["state"].lower())}">{escape(v["state"])}</td>'
            + _cell(v["runtime"] or "–") + _cell(labels or "–") + _cell(v["error"] or "") + "</tr>"
        )
    return "".join(rows)


def _model(model: dict) -> str:
    name = escape(model["name"])
    queue = model["queue"]
    queue_text = f'{queue["batches"]} batches, {queue["rows"]} rows' if queue else "no batching"
    return f"""
<section class="model" data-model="{name}">
  <h2>{name}</h2>
  <p class="path">{escape(model["base_path"])}</p>
  <table class="versions"><thead><tr><th>version</th><th>state</th><th>runtime</th><th>labels</th><th>error</th></tr></thead>
  <tbody>{_versions(model)}</tbody></table>
  <dl class="traffic">
    <dt>requests</dt><dd class="requests">{model["requests"]["total"]}</dd>
    <dt>errors</dt><dd class="errors">{model["requests"]["total"] - model["requests"]["ok"]}</dd>
    <dt>rate</dt><dd class="rate">–</dd>
    <dt>mean latency</dt><dd class="latency">–</dd>
    <dt>batching queue</dt><dd class="queue">{escape(queue_text)}</dd>
  </dl>
  <canvas class="chart" width="600" height="120" aria-label="request rate and latency of {name}"></canvas>
</section>"""


def render(state: dict, can_act: bool) -> str:
    models = "".join(_model(m) for m in state["models"]) or "<p>No models are configured.</p>"
    actions = (
        '<form id="actions"><input id="token" type="password" placeholder="console token" autocomplete="off">'
        '<button id="reload" type="button">Reload config</button> <span id="action-result"></span></form>'
        if can_act else '<p class="readonly">Read-only: start the server with a console token to enable actions.</p>'
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>modelyard console</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/console/console.css">
<script src="/console/chart.js" defer></script>
<script src="/console/console.js" defer></script>
</head><body>
<header><h1>modelyard console</h1><p id="updated">server-rendered; live updates start…</p>{actions}</header>
<main id="models">{models}</main>
</body></html>
"""
