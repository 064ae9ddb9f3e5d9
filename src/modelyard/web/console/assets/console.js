// Keeps the server-rendered console live: polls /console/api/state, rewrites each model's
// table with textContent (names are never parsed as HTML), turns counter deltas into a
// request rate and mean latency, and draws the last minutes of both on a canvas (``el`` and
// ``drawChart`` come from chart.js, shared with the platform's console).
'use strict';
const POLL_MS = 1000;
const HISTORY = 60;  // one minute at one poll a second
const previous = {};  // model -> {time, total, sum, count}
const history = {};   // model -> [{rate, latency}]

function section(model) {
  for (const s of document.querySelectorAll('section.model')) if (s.dataset.model === model.name) return s;
  const s = el('section', {class: 'model', 'data-model': model.name});
  s.append(el('h2', {}, model.name), el('p', {class: 'path'}, model.base_path));
  const table = el('table', {class: 'versions'});
  const head = el('tr');
  for (const h of ['version', 'state', 'runtime', 'labels', 'error']) head.append(el('th', {}, h));
  table.append(el('thead'), el('tbody'));
  table.tHead.append(head);
  const dl = el('dl', {class: 'traffic'});
  for (const [k, cls] of [['requests', 'requests'], ['errors', 'errors'], ['rate', 'rate'],
                          ['mean latency', 'latency'], ['batching queue', 'queue']]) {
    dl.append(el('dt', {}, k), el('dd', {class: cls}, '–'));
  }
  s.append(table, dl, el('canvas', {class: 'chart', width: 600, height: 120}));
  document.getElementById('models').append(s);
  return s;
}

function renderVersions(s, model) {
  const rows = model.versions.map((v) => {
    const tr = el('tr', {'data-version': String(v.version)});
    tr.append(el('td', {}, String(v.version)), el('td', {class: `state ${v.state.toLowerCase()}`}, v.state),
              el('td', {}, v.runtime || '–'), el('td', {}, v.labels.join(', ') || '–'), el('td', {}, v.error));
    return tr;
  });
  s.querySelector('tbody').replaceChildren(...rows);
}

function renderModel(model) {
  const s = section(model);
  renderVersions(s, model);
  const {total, ok} = model.requests;
  const now = {time: window.performance.now() / 1000, total, sum: model.latency_us.sum, count: model.latency_us.count};
  const before = previous[model.name];
  const points = history[model.name] = history[model.name] || [];
  if (before) {
    const dt = Math.max(1e-3, now.time - before.time);
    const dc = now.count - before.count;
    points.push({rate: (now.total - before.total) / dt, latency: dc > 0 ? (now.sum - before.sum) / dc / 1000 : 0});
    if (points.length > HISTORY) points.shift();
    const last = points[points.length - 1];
    s.querySelector('.rate').textContent = `${last.rate.toFixed(1)} req/s`;
    s.querySelector('.latency').textContent = dc > 0 ? `${last.latency.toFixed(2)} ms` : '–';
  }
  previous[model.name] = now;
  s.querySelector('.requests').textContent = String(total);
  s.querySelector('.errors').textContent = String(total - ok);
  const q = model.queue;
  s.querySelector('.queue').textContent = q ? `${q.batches} batches, ${q.rows} rows` : 'no batching';
  drawChart(s.querySelector('canvas'), points, HISTORY);
}

async function poll() {
  try {
    const response = await fetch('/console/api/state', {cache: 'no-store'});
    const state = await response.json();
    const names = new Set(state.models.map((m) => m.name));
    for (const s of document.querySelectorAll('section.model')) if (!names.has(s.dataset.model)) s.remove();
    state.models.forEach(renderModel);
    const updated = document.getElementById('updated');
    updated.textContent = `live: updated ${new Date(state.time * 1000).toLocaleTimeString()}`;
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (error) {
    document.getElementById('updated').textContent = `update failed: ${error.message}`;
  }
  setTimeout(poll, POLL_MS);
}

function wireActions() {
  const button = document.getElementById('reload');
  if (!button) return;
  button.addEventListener('click', async () => {
    const result = document.getElementById('action-result');
    result.textContent = 'reloading…';
    const response = await fetch('/console/api/reload', {
      method: 'POST', body: JSON.stringify({token: document.getElementById('token').value})});
    const body = await response.json();
    result.textContent = response.ok ? `reloaded ${body.models.join(', ')}` : body.error;
  });
}

document.addEventListener('DOMContentLoaded', () => { wireActions(); poll(); });
