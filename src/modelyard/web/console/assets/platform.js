// Keeps the platform console live: fetches the server-rendered fragment (/console/api/live) every
// second and swaps it in (the server escapes every name: nothing here builds HTML from data),
// keeps a split the user is editing, turns each deployed model's counters into a request rate
// and mean latency, and draws them. The token typed in the page goes with every request
// (a platform with an --auth-token shows its state only with it); actions call the platform's
// Vertex AI REST API with it: the API checks it.
'use strict';
const POLL_MS = 1000;
const SLOTS = 60;  // one minute of history at one poll a second
const previous = {};  // deployed model id -> {time, total, lsum, lcount}
const history = {};   // endpoint id -> [{rate, latency}]
const messages = {};  // form key or 'jobs' -> text shown after an action, kept across refreshes

function token() {
  const input = document.getElementById('token');
  return input ? input.value : '';
}

function authHeaders() {
  return token() ? {Authorization: `Bearer ${token()}`} : {};
}

async function callApi(method, path, body) {
  const headers = {'Content-Type': 'application/json', ...authHeaders()};
  const response = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  let answer = {};
  try { answer = await response.json(); } catch (e) { /* an empty body */ }
  if (!response.ok) throw new Error((answer.error && answer.error.message) || `HTTP ${response.status}`);
  return answer;
}

function updateRates(now) {
  // Per endpoint: requests per second and mean latency over the last poll, summed over its models.
  for (const section of document.querySelectorAll('section.endpoint')) {
    let rate = 0, lsum = 0, lcount = 0, sampled = false;
    for (const row of section.querySelectorAll('tr.dm')) {
      const c = {time: now, total: Number(row.dataset.total), lsum: Number(row.dataset.lsum), lcount: Number(row.dataset.lcount)};
      const before = previous[row.dataset.dm];
      previous[row.dataset.dm] = c;
      if (!before) continue;
      sampled = true;
      const dt = Math.max(1e-3, c.time - before.time), dc = c.lcount - before.lcount;
      const r = (c.total - before.total) / dt;
      rate += r;
      lsum += c.lsum - before.lsum;
      lcount += dc;
      row.querySelector('.rate').textContent = `${r.toFixed(1)} req/s`;
      row.querySelector('.latency').textContent = dc > 0 ? `${((c.lsum - before.lsum) / dc * 1000).toFixed(2)} ms` : '–';
    }
    const id = section.dataset.endpoint;
    const points = history[id] = history[id] || [];
    if (sampled) {
      points.push({rate, latency: lcount > 0 ? lsum / lcount * 1000 : 0});
      if (points.length > SLOTS) points.shift();
    }
    const canvas = section.querySelector('canvas.chart');
    if (canvas) drawChart(canvas, points, SLOTS);
  }
}

const PALETTE = ['#3b6fd8', '#e08a2c', '#1f9d55', '#c53030', '#805ad5', '#319795', '#b7791f', '#d53f8c'];

function drawCurves() {
  for (const canvas of document.querySelectorAll('canvas.curve.learning')) {
    // Every trial's intermediate values on one axis, as a tuning dashboard draws them.
    const curves = JSON.parse(canvas.dataset.learning);
    const all = curves.flat();
    let low = Math.min(...all), top = Math.max(...all);
    if (top - low < 1e-12) { low -= 0.5; top += 0.5; }
    const longest = Math.max(...curves.map((c) => c.length));
    drawSeries(canvas, curves.map((values, i) => ({
      values, color: PALETTE[i % PALETTE.length], scale: top, low,
      label: i === 0 ? `${canvas.dataset.metric} per step, ${curves.length} trials` : '',
    })), undefined, longest);
  }
  for (const canvas of document.querySelectorAll('canvas.curve:not(.learning)')) {
    const {values, best} = JSON.parse(canvas.dataset.curve);
    // Objectives such as a loss or an accuracy sit in a narrow band: the axis spans just that band.
    let low = Math.min(...values), top = Math.max(...values);
    if (top - low < 1e-12) { low -= 0.5; top += 0.5; }
    drawSeries(canvas, [
      {values, color: '#9aa3b5', scale: top, low, label: `${canvas.dataset.metric} per trial`},
      {values: best, color: '#1f9d55', scale: top, low, label: `best ${best[best.length - 1].toPrecision(4)}`},
    ]);
  }
}

function swapIn(html) {
  const fresh = new DOMParser().parseFromString(`<main>${html}</main>`, 'text/html').querySelector('main');
  const live = document.getElementById('live');
  // A split being edited stays as typed until it is sent (the key changes if deployed models change).
  const editing = new Map();
  for (const form of live.querySelectorAll('form.split')) if (form.dataset.dirty) editing.set(form.dataset.key, form);
  for (const form of fresh.querySelectorAll('form.split')) {
    const kept = editing.get(form.dataset.key);
    if (kept) form.replaceWith(kept);
  }
  live.replaceChildren(...fresh.childNodes);
  for (const form of live.querySelectorAll('form.split')) {
    if (messages[form.dataset.key]) form.querySelector('.result').textContent = messages[form.dataset.key];
  }
  const jobsResult = live.querySelector('#jobs .result');
  if (jobsResult && messages.jobs) jobsResult.textContent = messages.jobs;
}

async function refresh() {
  try {
    const response = await fetch('/console/api/live', {cache: 'no-store', headers: authHeaders()});
    if (!response.ok) {
      let message = `HTTP ${response.status}`;
      try { message = (await response.json()).error.message; } catch (e) { /* not the API's error body */ }
      throw new Error(message);
    }
    swapIn(await response.text());
    updateRates(Number(document.getElementById('endpoints').dataset.time));
    drawCurves();
    document.getElementById('updated').textContent = `live: updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    // The last state stays on screen (stale rates are not recomputed); the next poll tries again.
    document.getElementById('updated').textContent = `update failed: ${error.message}`;
  }
  document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  setTimeout(refresh, POLL_MS);
}

async function updateSplit(form) {
  const split = {};
  for (const input of form.querySelectorAll('input[type=number]')) split[input.name] = Number(input.value);
  const result = form.querySelector('.result');
  result.textContent = messages[form.dataset.key] = 'updating…';
  try {
    const endpoint = await callApi('PATCH', `/v1/${form.dataset.endpointName}?updateMask=trafficSplit`, {trafficSplit: split});
    messages[form.dataset.key] = `updated: ${Object.entries(endpoint.trafficSplit || {}).map(([k, v]) => `${k} ${v}%`).join(', ')}`;
    delete form.dataset.dirty;  // the next refresh shows the split the server now has
  } catch (error) {
    messages[form.dataset.key] = `refused: ${error.message}`;
  }
  result.textContent = messages[form.dataset.key];
}

async function cancelJob(button) {
  try {
    await callApi('POST', `/v1/${button.dataset.job}:cancel`, {});
    messages.jobs = `cancel requested: ${button.dataset.job}`;
  } catch (error) {
    messages.jobs = `refused: ${error.message}`;
  }
  const result = document.querySelector('#jobs .result');
  if (result) result.textContent = messages.jobs;
}

function keepToken() {
  // Kept for this tab only (sessionStorage), so a reload does not ask again.
  const input = document.getElementById('token');
  if (!input) return;
  input.value = input.value || sessionStorage.getItem('modelyard-platform-token') || '';
  input.addEventListener('input', () => sessionStorage.setItem('modelyard-platform-token', input.value));
}

function wireActions() {
  // Delegated from <main>: its content is replaced every second.
  const live = document.getElementById('live');
  live.addEventListener('input', (event) => {
    const form = event.target.closest('form.split');
    if (form) form.dataset.dirty = '1';
  });
  live.addEventListener('submit', (event) => {
    const form = event.target.closest('form.split');
    if (!form) return;
    event.preventDefault();
    updateSplit(form);
  });
  live.addEventListener('click', (event) => {
    const button = event.target.closest('button.cancel');
    if (button) cancelJob(button);
  });
}

document.addEventListener('DOMContentLoaded', () => { keepToken(); wireActions(); refresh(); });
