// The digit page: draw on a canvas, turn the drawing into the model's 28x28 input, run the
// model with LiteRT.js (wasm, on this device), draw the probabilities as bars; optionally
// send the same input to a `modelyard serve` REST endpoint and show both latencies.
// `window.modelyard` exposes predict() and the load timings to tests and benchmarks.
import {loadLiteRt, loadAndCompile, Tensor} from './runtime/litertjs/core.js';

const TYPED = {float32: Float32Array, int32: Int32Array, uint8: Uint8Array};
const $ = (id) => document.getElementById(id);
const timings = {};
let info, model;

function setStatus(text) { $('status').textContent = text; }

// One image (784 numbers, 0..255) in, the first output dequantized to floats out.
async function predict(pixels) {
  const spec = info.input;
  const data = new TYPED[spec.dtype](pixels.length);
  data.set(pixels);
  const input = new Tensor(data, spec.shape);
  const start = performance.now();
  const outputs = await model.run([input]);
  const raw = outputs[0].toTypedArray();
  const ms = performance.now() - start;
  const out = info.outputs[0];
  const values = Array.from(raw, (v) => (out.scale ? (v - out.zero_point) * out.scale : v));
  input.delete();
  for (const t of outputs) t.delete();
  return {values, ms};
}

async function predictOnServer(pixels) {
  const rows = [];
  for (let r = 0; r < 28; r++) rows.push(Array.from(pixels.slice(r * 28, r * 28 + 28)));
  const image = info.input.shape.length === 4 ? rows.map((row) => row.map((v) => [v])) : rows;
  const start = performance.now();
  // No Content-Type header: a "simple" cross-origin request, so no CORS preflight round trip.
  const response = await fetch($('serve-url').value.replace(/\/$/, '') + ':predict',
                               {method: 'POST', body: JSON.stringify({instances: [image]})});
  const body = await response.json();
  const ms = performance.now() - start;
  if (!response.ok) throw new Error(body.error || response.statusText);
  return {values: body.predictions[0].flat(), ms};
}

// ---- drawing ----------------------------------------------------------------------------
const pad = $('pad');
const ctx = pad.getContext('2d', {willReadFrequently: true});
let drawing = false, last = null, pending = false, queued = false;

function clearPad() {
  ctx.fillStyle = '#000';
  ctx.fillRect(0, 0, pad.width, pad.height);
}

function point(event) {
  const rect = pad.getBoundingClientRect();
  return [(event.clientX - rect.left) * pad.width / rect.width,
          (event.clientY - rect.top) * pad.height / rect.height];
}

function stroke(to) {
  ctx.strokeStyle = '#fff';
  ctx.lineWidth = 24;
  ctx.lineCap = ctx.lineJoin = 'round';
  ctx.beginPath();
  ctx.moveTo(...(last || to));
  ctx.lineTo(...to);
  ctx.stroke();
  last = to;
}

// The demo model learnt scikit-learn's digits: 8x8 ink counts of a size-normalised
// drawing, scaled x3 into a 28x28 frame with a 2-pixel border. The drawing is cut to its
// bounding square, averaged into 8x8 cells and laid out the same way.
function toInput() {
  const {width, height} = pad;
  const rgba = ctx.getImageData(0, 0, width, height).data;
  let x0 = width, y0 = height, x1 = -1, y1 = -1;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      if (rgba[(y * width + x) * 4] > 32) {
        if (x < x0) x0 = x; if (x > x1) x1 = x; if (y < y0) y0 = y; if (y > y1) y1 = y;
      }
    }
  }
  const pixels = new Uint8Array(784);
  if (x1 < 0) return pixels;
  const side = Math.max(x1 - x0, y1 - y0) + 1;
  const left = (x0 + x1 + 1 - side) / 2, top = (y0 + y1 + 1 - side) / 2;
  const cells = new Float32Array(64);
  const counts = new Float32Array(64);
  for (let y = Math.max(0, Math.floor(top)); y < Math.min(height, top + side); y++) {
    const cy = Math.min(7, Math.floor((y - top) * 8 / side));
    for (let x = Math.max(0, Math.floor(left)); x < Math.min(width, left + side); x++) {
      const cx = Math.min(7, Math.floor((x - left) * 8 / side));
      cells[cy * 8 + cx] += rgba[(y * width + x) * 4];
      counts[cy * 8 + cx] += 1;
    }
  }
  let peak = 0;
  for (let i = 0; i < 64; i++) { cells[i] = counts[i] ? cells[i] / counts[i] : 0; peak = Math.max(peak, cells[i]); }
  for (let i = 0; i < 64; i++) {
    const value = Math.round(Math.min(255, cells[i] * 255 / peak));
    const cy = Math.floor(i / 8), cx = i % 8;
    for (let dy = 0; dy < 3; dy++) for (let dx = 0; dx < 3; dx++) pixels[(2 + cy * 3 + dy) * 28 + 2 + cx * 3 + dx] = value;
  }
  return pixels;
}

function drawPreview(pixels) {
  const p = $('preview').getContext('2d');
  const image = p.createImageData(28, 28);
  pixels.forEach((v, i) => { image.data.set([v, v, v, 255], i * 4); });
  p.putImageData(image, 0, 0);
}

// ---- results ----------------------------------------------------------------------------
// A blank pad has no class: the model still answers (it warms up and shows its latency), but no
// bar, value or "top class" is shown for an image with no ink.
function renderBars(page, server, blank) {
  const top = blank ? -1 : page.indexOf(Math.max(...page));
  $('bars').replaceChildren(...page.map((p, k) => {
    const row = document.createElement('div');
    row.className = 'bar' + (k === top ? ' top' : '');
    row.dataset.cls = k;
    const label = document.createElement('span');
    label.textContent = k;
    const track = document.createElement('div');
    track.className = 'track';
    const fill = document.createElement('div');
    fill.className = 'fill page';
    fill.style.width = blank ? '0%' : `${(p * 100).toFixed(1)}%`;
    track.append(fill);
    if (server) {
      const sfill = document.createElement('div');
      sfill.className = 'fill server';
      sfill.style.width = blank ? '0%' : `${(server[k] * 100).toFixed(1)}%`;
      track.append(sfill);
    }
    const value = document.createElement('span');
    value.className = 'value';
    value.textContent = blank ? '–' : p.toFixed(3);
    row.append(label, track, value);
    return row;
  }));
  $('top').textContent = blank ? '– (draw a digit)' : String(top);
  if (blank) delete $('top').dataset.cls; else $('top').dataset.cls = top;
}

async function update() {
  if (pending) { queued = true; return; }  // one prediction in flight; the latest drawing runs next
  pending = true;
  try {
    const pixels = toInput();
    drawPreview(pixels);
    const local = await predict(pixels);
    $('page-ms').textContent = `${local.ms.toFixed(2)} ms`;
    let remote = null;
    if ($('compare').checked) {
      try {
        remote = await predictOnServer(pixels);
        $('server-ms').textContent = `${remote.ms.toFixed(2)} ms`;
        $('server-note').textContent = '';
      } catch (error) {
        $('server-ms').textContent = 'error';
        $('server-note').textContent = `server: ${error.message} (is modelyard serve running with --rest_api_enable_cors_support?)`;
      }
    }
    renderBars(local.values, remote && remote.values, !pixels.some((v) => v > 0));
    if (window.modelyard) window.modelyard.last = {page: local, server: remote, input: Array.from(pixels)};
    document.body.dataset.predictions = String(Number(document.body.dataset.predictions || 0) + 1);
  } finally {
    pending = false;
    if (queued) { queued = false; update(); }
  }
}

pad.addEventListener('pointerdown', (e) => { drawing = true; last = null; pad.setPointerCapture(e.pointerId); stroke(point(e)); });
pad.addEventListener('pointermove', (e) => { if (drawing) { stroke(point(e)); update(); } });
const end = () => { if (drawing) { drawing = false; last = null; update(); } };
pad.addEventListener('pointerup', end);
pad.addEventListener('pointercancel', end);
$('clear').addEventListener('click', () => { clearPad(); update(); });
$('compare').addEventListener('change', update);

// ---- start --------------------------------------------------------------------------------
async function start() {
  clearPad();
  info = await (await fetch('model.json')).json();
  const query = new URLSearchParams(location.search);
  $('serve-url').value = query.get('serve') || info.serve_url || '';
  $('compare').checked = query.has('serve');
  const kb = (info.bytes / 1024).toFixed(1);
  $('model-facts').textContent = `${info.quantize}, ${kb} KiB, input ${info.input.dtype}[${info.input.shape}]`;
  // The directory, not a file: LiteRT.js picks the wasm build this browser supports.
  await loadLiteRt(new URL('runtime/litertjs/wasm/', location.href).href);
  timings.runtime_ms = performance.now();
  model = await loadAndCompile(new URL(info.model, location.href).href, {accelerator: 'wasm'});
  timings.model_ms = performance.now();
  await update();
  timings.first_prediction_ms = performance.now();
  setStatus(`ready: LiteRT.js ${info.litertjs} on wasm, first prediction ${timings.first_prediction_ms.toFixed(0)} ms after load`);
  window.modelyard = {info, timings, predict, toInput, idle: () => !pending && !queued, ready: true};
  document.body.dataset.ready = 'true';
}

start().catch((error) => {
  setStatus(`failed: ${error.message}`);
  document.body.dataset.error = error.message;
  window.modelyard = {error: error.message};
});
