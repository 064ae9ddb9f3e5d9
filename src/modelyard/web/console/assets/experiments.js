// The Experiments page (platform_experiments.py): with an --auth-token, the fragment is fetched with the
// token the console keeps for this tab; then each time-series chart is drawn, one line per run.
'use strict';

const COLORS = ['#1a73e8', '#d93025', '#188038', '#f29900', '#9334e6', '#12b5cb', '#e52592', '#5f6368'];

function drawCharts() {
  document.querySelectorAll('canvas[data-series]').forEach((canvas) => {
    const runs = JSON.parse(canvas.dataset.series);
    const all = runs.flatMap((r) => r.points.map((p) => p[1]));
    const low = Math.min(0, ...all), scale = Math.max(...all);
    const longest = Math.max(...runs.map((r) => r.points.length));
    drawSeries(canvas, runs.map((r, i) => ({values: r.points.map((p) => p[1]), color: COLORS[i % COLORS.length],
                                            label: r.label, scale, low})), undefined, longest);
  });
}

// "open in TensorBoard": the platform starts TensorBoard over the experiment's TensorBoard resource, then we go there.
async function openTensorboard(button) {
  const token = sessionStorage.getItem('modelyard-platform-token') || '';
  button.disabled = true;
  button.textContent = 'starting TensorBoard…';
  const answer = await fetch('/console/experiments/tensorboard', {
    method: 'POST', body: JSON.stringify({tensorboard: button.dataset.tensorboard}),
    headers: {'Content-Type': 'application/json', ...(token ? {Authorization: `Bearer ${token}`} : {})}});
  const body = await answer.json();
  if (!answer.ok) {
    button.disabled = false;
    button.textContent = `TensorBoard failed: ${body.error ? body.error.message : answer.status}`;
    return;
  }
  window.location.href = body.url;
}

async function start() {
  if (document.body.dataset.locked === '1') {
    const token = sessionStorage.getItem('modelyard-platform-token') || '';
    if (!token) return;
    const answer = await fetch('/console/experiments/live', {headers: {Authorization: `Bearer ${token}`}});
    if (!answer.ok) return;
    document.getElementById('live').innerHTML = await answer.text();  // rendered and escaped by the server
  }
  drawCharts();
  document.querySelectorAll('button.open-tb').forEach((b) => b.addEventListener('click', () => openTensorboard(b)));
}

window.addEventListener('load', start);
