// The classifier page: a picture (file, camera, drop, paste) or, for a small grey input, a drawing
// becomes the model's input as model.json's `preprocess` says; LiteRT.js (wasm, on this device)
// runs the model; the top class, the top five probabilities as bars, the inference time and the
// input the model saw are shown. A service worker (sw.js) keeps everything for offline starts.
// Optionally the same input goes to a `modelyard serve` REST endpoint and both latencies show.
// `window.modelyard` exposes predict(), classifyBlob() and the load timings to tests and benchmarks.
const VERSION = new URL(import.meta.url).searchParams.get('v') || '';
const TYPED = {float32: Float32Array, int32: Int32Array, uint8: Uint8Array};
const RANGES = {int32: [-2147483648, 2147483647], uint8: [0, 255]};
const $ = (id) => document.getElementById(id);
const timings = {};
let info, model, Tensor;

function setStatus(text) { $('status').textContent = text; }

// ---- pixels -> the model's tensor ---------------------------------------------------------
// `pixels` are 0..255 integers, H*W*C (C = the input's channels); the model's values are
// LO + (HI - LO) * pixel / 255, quantized with the input's scale and zero point when it has them.
function modelValues(pixels) {
  const [lo, hi] = info.preprocess.range;
  return Float64Array.from(pixels, (p) => lo + (hi - lo) * p / 255);
}

function toTensorData(values) {
  const p = info.preprocess;
  const data = new TYPED[p.dtype](values.length);
  const range = RANGES[p.dtype];
  for (let i = 0; i < values.length; i++) {
    let v = p.quant_scale ? values[i] / p.quant_scale + p.quant_zero_point : values[i];
    if (range) v = Math.min(range[1], Math.max(range[0], Math.round(v)));
    data[i] = v;
  }
  return data;
}

// One input (0..255 pixels) in, the first output dequantized to floats out.
async function predict(pixels) {
  const input = new Tensor(toTensorData(modelValues(pixels)), info.input.shape);
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

function nested(values) {
  const {height, width, channels, channel_axis: axis} = info.preprocess;
  const rows = [];
  for (let y = 0; y < height; y++) {
    const row = [];
    for (let x = 0; x < width; x++) {
      const at = (y * width + x) * channels;
      row.push(axis ? Array.from(values.slice(at, at + channels)) : values[at]);
    }
    rows.push(row);
  }
  return rows;
}

async function predictOnServer(pixels) {
  const start = performance.now();
  // No Content-Type header: a "simple" cross-origin request, so no CORS preflight round trip.
  const response = await fetch($('serve-url').value.replace(/\/$/, '') + ':predict',
                               {method: 'POST', body: JSON.stringify({instances: [nested(modelValues(pixels))]})});
  const body = await response.json();
  const ms = performance.now() - start;
  if (!response.ok) throw new Error(body.error || response.statusText);
  return {values: body.predictions[0].flat(), ms};
}

// ---- a picture -> pixels ------------------------------------------------------------------
// Resizing is an area average computed here (not the canvas's scaler), so the input is the same
// in every browser and a test can reproduce it: a picture scaled up k times comes back exact.
function weights(from, size, to) {
  // For each of `to` output cells: [first source index, weights...] over [from, from + size).
  const cells = [];
  const step = size / to;
  for (let i = 0; i < to; i++) {
    const a = from + i * step, b = a + step;
    const first = Math.floor(a), last = Math.min(b, from + size) - 1e-9, ws = [];
    for (let s = first; s < last; s++) ws.push(Math.min(b, s + 1) - Math.max(a, s));
    cells.push([first, ws.map((w) => w / step)]);
  }
  return cells;
}

function areaResize(rgba, stride, rect, outW, outH) {
  // rgba: the source's RGBA bytes, `stride` pixels a row; rect: [x, y, w, h] in source pixels.
  const [x0, y0, w, h] = rect;
  const wx = weights(x0, w, outW), wy = weights(y0, h, outH);
  const out = new Float64Array(outW * outH * 3);
  for (let j = 0; j < outH; j++) {
    const [fy, ys] = wy[j];
    for (let i = 0; i < outW; i++) {
      const [fx, xs] = wx[i];
      let r = 0, g = 0, b = 0;
      for (let dy = 0; dy < ys.length; dy++) {
        const row = (fy + dy) * stride;
        for (let dx = 0; dx < xs.length; dx++) {
          const k = (row + fx + dx) * 4, wgt = ys[dy] * xs[dx];
          r += rgba[k] * wgt; g += rgba[k + 1] * wgt; b += rgba[k + 2] * wgt;
        }
      }
      out.set([r, g, b], (j * outW + i) * 3);
    }
  }
  return out;
}

// Where the picture goes: [source rect, destination rect] for the fit (crop, pad or stretch).
function placement(sw, sh, W, H, fit) {
  if (fit === 'stretch') return [[0, 0, sw, sh], [0, 0, W, H]];
  const wide = sw * H > sh * W;  // wider than the input's aspect
  if (fit === 'crop') {
    const cw = wide ? Math.round(sh * W / H) : sw, ch = wide ? sh : Math.round(sw * H / W);
    return [[Math.floor((sw - cw) / 2), Math.floor((sh - ch) / 2), cw, ch], [0, 0, W, H]];
  }
  const dw = wide ? W : Math.max(1, Math.round(sw * H / sh)), dh = wide ? Math.max(1, Math.round(sh * W / sw)) : H;
  return [[0, 0, sw, sh], [Math.floor((W - dw) / 2), Math.floor((H - dh) / 2), dw, dh]];
}

const MAX_SIDE = 2048;  // a bigger photo is first scaled down by the browser (memory on phones)

async function pictureToPixels(blob) {
  const p = info.preprocess;
  let bitmap = await createImageBitmap(blob);
  if (Math.max(bitmap.width, bitmap.height) > MAX_SIDE) {
    const f = MAX_SIDE / Math.max(bitmap.width, bitmap.height);
    const smaller = await createImageBitmap(bitmap, {resizeWidth: Math.round(bitmap.width * f),
                                                     resizeHeight: Math.round(bitmap.height * f), resizeQuality: 'high'});
    bitmap.close();
    bitmap = smaller;
  }
  const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
  const c = canvas.getContext('2d', {willReadFrequently: true});
  c.drawImage(bitmap, 0, 0);
  const rgba = c.getImageData(0, 0, bitmap.width, bitmap.height).data;
  const [src, [dx, dy, dw, dh]] = placement(bitmap.width, bitmap.height, p.width, p.height, p.fit);
  const rgb = areaResize(rgba, bitmap.width, src, dw, dh);
  bitmap.close();
  const pixels = new Uint8Array(p.height * p.width * p.channels);  // padding stays 0 (black)
  for (let y = 0; y < dh; y++) {
    for (let x = 0; x < dw; x++) {
      const k = (y * dw + x) * 3, at = ((dy + y) * p.width + dx + x) * p.channels;
      let px = p.grey ? [0.299 * rgb[k] + 0.587 * rgb[k + 1] + 0.114 * rgb[k + 2]] : [rgb[k], rgb[k + 1], rgb[k + 2]];
      px = px.map((v) => Math.min(255, Math.max(0, Math.round(v))));
      if (p.invert) px = px.map((v) => 255 - v);
      for (let ch = 0; ch < p.channels; ch++) pixels[at + ch] = px[p.grey ? 0 : ch];
    }
  }
  return pixels;
}

// ---- drawing (small grey inputs) ----------------------------------------------------------
const pad = $('pad');
const ctx = pad.getContext('2d', {willReadFrequently: true});
let drawing = false, last = null, pending = false, queued = false, picture = null;

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

// A 28x28 input is taken to be a digits model like the demo's, which learnt scikit-learn's
// digits: 8x8 ink counts of a size-normalised drawing, scaled x3 into a 28x28 frame with a
// 2-pixel border. The drawing is cut to its bounding square, averaged into 8x8 cells and laid
// out the same way. Another small input gets the pad area-averaged to its size.
function drawingToPixels() {
  const {width, height} = pad;
  const rgba = ctx.getImageData(0, 0, width, height).data;
  const p = info.preprocess;
  if (p.height !== 28 || p.width !== 28) {
    const grey = areaResize(rgba, width, [0, 0, width, height], p.width, p.height);
    return Uint8Array.from({length: p.width * p.height}, (_, i) => Math.round(grey[i * 3]));
  }
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
  const {width, height, channels} = info.preprocess;
  const preview = $('preview');
  preview.width = width;
  preview.height = height;
  const image = new ImageData(width, height);
  for (let i = 0; i < width * height; i++) {
    const px = channels === 3 ? pixels.slice(i * 3, i * 3 + 3) : [pixels[i], pixels[i], pixels[i]];
    image.data.set([...px, 255], i * 4);
  }
  preview.getContext('2d').putImageData(image, 0, 0);
}

// ---- results ------------------------------------------------------------------------------
const label = (k) => (info.labels ? info.labels[k] : String(k));

// An empty pad has no class: the model still answers (it warms up and shows its latency), but no
// bar or "top class" is shown for an input with no ink.
function render(page, server, blank) {
  const order = page.map((_, k) => k).sort((a, b) => page[b] - page[a]).slice(0, 5);
  $('bars').replaceChildren(...(blank ? [] : order.map((k, rank) => {
    const row = document.createElement('div');
    row.className = 'bar' + (rank === 0 ? ' top' : '');
    row.dataset.cls = k;
    const name = document.createElement('span');
    name.className = 'name';
    name.textContent = label(k);
    const track = document.createElement('div');
    track.className = 'track';
    const fill = document.createElement('div');
    fill.className = 'fill page';
    fill.style.width = `${(page[k] * 100).toFixed(1)}%`;
    track.append(fill);
    if (server) {
      const sfill = document.createElement('div');
      sfill.className = 'fill server';
      sfill.style.width = `${(server[k] * 100).toFixed(1)}%`;
      track.append(sfill);
    }
    const value = document.createElement('span');
    value.className = 'value';
    value.textContent = page[k].toFixed(3);
    row.append(name, track, value);
    return row;
  })));
  $('top').textContent = blank ? (info.draw ? '– (draw, or give a picture)' : '– (give a picture)') : label(order[0]);
  if (blank) delete $('top').dataset.cls; else $('top').dataset.cls = order[0];
}

async function classify(pixels, blank) {
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
  render(local.values, remote && remote.values, blank);
  if (window.modelyard) window.modelyard.last = {page: local, server: remote, input: Array.from(pixels)};
  document.body.dataset.predictions = String(Number(document.body.dataset.predictions || 0) + 1);
}

async function update() {
  if (pending) { queued = true; return; }  // one prediction in flight; the latest input runs next
  pending = true;
  try {
    if (picture) {
      await classify(await pictureToPixels(picture), false);
    } else {
      const pixels = info.draw ? drawingToPixels() : new Uint8Array(info.preprocess.height * info.preprocess.width *
                                                                    info.preprocess.channels);
      await classify(pixels, !pixels.some((v) => v > 0));
    }
  } catch (error) {
    setStatus(`could not read that picture: ${error.message}`);
    document.body.dataset.pictureError = error.message;
  } finally {
    pending = false;
    if (queued) { queued = false; update(); }
  }
}

function showPicture(blob) {
  if (!blob || !blob.type.startsWith('image/')) return;
  picture = blob;
  delete document.body.dataset.pictureError;
  const img = $('picture');
  if (img.src) URL.revokeObjectURL(img.src);
  img.src = URL.createObjectURL(blob);
  img.hidden = false;
  $('draw-box').hidden = true;
  update();
}

function clearAll() {
  picture = null;
  $('picture').hidden = true;
  $('file').value = '';
  $('draw-box').hidden = !info.draw;
  clearPad();
  update();
}

pad.addEventListener('pointerdown', (e) => { drawing = true; last = null; pad.setPointerCapture(e.pointerId); stroke(point(e)); });
pad.addEventListener('pointermove', (e) => { if (drawing) { stroke(point(e)); update(); } });
const end = () => { if (drawing) { drawing = false; last = null; update(); } };
pad.addEventListener('pointerup', end);
pad.addEventListener('pointercancel', end);
$('clear').addEventListener('click', clearAll);
$('compare').addEventListener('change', update);
$('file').addEventListener('change', () => showPicture($('file').files[0]));
const zone = $('drop-zone');
zone.addEventListener('dragover', (e) => { e.preventDefault(); zone.classList.add('over'); });
zone.addEventListener('dragleave', () => zone.classList.remove('over'));
zone.addEventListener('drop', (e) => {
  e.preventDefault();
  zone.classList.remove('over');
  showPicture([...e.dataTransfer.files].find((f) => f.type.startsWith('image/')));
});
document.addEventListener('paste', (e) => {
  const item = [...(e.clipboardData ? e.clipboardData.items : [])].find((i) => i.type.startsWith('image/'));
  if (item) showPicture(item.getAsFile());
});

// ---- offline: the service worker -----------------------------------------------------------
// Registered once the first prediction is shown, so nothing competes with the first load: on a
// first visit the runtime and the model come straight from the network, then keepOffline() has
// the worker cache them (from the HTTP cache: a 304 each). Later loads are served by the worker.
// A new convert brings a new sw.js: the browser installs it, it replaces the old worker and its
// cache, and keepOffline() runs again against it.
async function registerWorker() {
  if (!('serviceWorker' in navigator)) return;
  let registration;
  try {
    registration = await navigator.serviceWorker.register('sw.js', {updateViaCache: 'none'});
  } catch (error) {
    // Offline, the update check fails and the installed worker goes on serving.
    if (!navigator.serviceWorker.controller) $('offline').textContent = `no service worker: ${error.message}`;
    return;
  }
  const follow = (worker) => worker && worker.addEventListener('statechange', () => {
    if (worker.state === 'activated') keepOffline();
  });
  follow(registration.installing || registration.waiting);  // found by the navigation's update check
  registration.addEventListener('updatefound', () => follow(registration.installing));
  // register() of the same script checks nothing, and the browser's own check after a navigation
  // may come late: ask now whether sw.js changed (a new convert).
  if (navigator.serviceWorker.controller) registration.update().catch(() => {});
  await navigator.serviceWorker.ready;
  keepOffline();
}

function ask(worker, message, ms = 30000) {
  return new Promise((resolve, reject) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = (event) => resolve(event.data);
    worker.postMessage(message, [channel.port2]);
    setTimeout(() => reject(new Error('the service worker did not answer')), ms);
  });
}

// Tell the worker every file this page used; it caches what it lacks. "ready" only once the cache
// is this page's own version (after a new convert, the new worker replaces the old one first).
let staleTries = 0, caching = null, cachedBy = null;
function keepOffline() {
  caching = (caching || Promise.resolve()).then(cacheWhatWasUsed);  // one at a time, in order
  return caching;
}

async function cacheWhatWasUsed() {
  const registration = await navigator.serviceWorker.getRegistration();
  const worker = registration && registration.active;
  if (!worker || !info) return retryOffline();  // the worker is still on its way
  // A new worker waits to take over: asking the old one now would keep it busy (each message
  // extends its life) and hold the new one back. follow() asks again once the new one is active.
  if (registration.waiting || registration.installing) return retryOffline();
  if (document.body.dataset.offline === 'ready' && worker === cachedBy) return;
  const here = new URL('./', location.href);
  const urls = [here.href, ...performance.getEntriesByType('resource').map((e) => e.name)
    .filter((u) => u.startsWith(here.origin) && new URL(u).pathname.startsWith(here.pathname) && !u.includes('sw.js'))];
  try {
    const reply = await ask(worker, {type: 'cache', urls: [...new Set(urls)]});
    const own = reply.cached === info.caches.app && !reply.error;
    cachedBy = own ? worker : null;
    $('offline').textContent = own ? 'ready: works with no network' : (reply.error || 'updating…');
    document.body.dataset.offline = own ? 'ready' : 'stale';
    if (!own && !reply.error) {
      // The worker fills an older version's cache: this page came from a newer convert. Ask the
      // browser to fetch sw.js now; its own check after the navigation may wait for the worker to be
      // idle, and these questions keep it busy.
      registration.update().catch(() => {});
    }
    if (!own) retryOffline();  // the new worker is on its way
  } catch (error) {
    $('offline').textContent = error.message;
    retryOffline();  // a busy worker may answer late: ask again rather than stay unready
  }
}

function retryOffline() {
  if (++staleTries < 60) setTimeout(keepOffline, 1000);
}

// ---- start --------------------------------------------------------------------------------
async function start() {
  clearPad();
  // The runtime loads while the config is fetched: neither needs the other.
  const runtime = import('./runtime/litertjs/core.js').then(async (module) => {
    // loadLiteRt() also opens a WebGPU device for its default environment (tens of ms here, more
    // where a GPU must wake up) that this page, on the wasm CPU path, never uses: it is hidden
    // from the runtime while it loads, and LiteRT.js goes on without it.
    const gpu = 'gpu' in navigator;
    if (gpu) Object.defineProperty(navigator, 'gpu', {value: undefined, configurable: true});
    try {
      // The directory, not a file: LiteRT.js picks the wasm build this browser supports.
      await module.loadLiteRt(new URL('runtime/litertjs/wasm/', location.href).href);
    } finally {
      if (gpu) delete navigator.gpu;
    }
    timings.runtime_ms = performance.now();
    return module;
  });
  info = await (await fetch(`model.json?v=${VERSION}`)).json();
  const query = new URLSearchParams(location.search);
  $('serve-url').value = query.get('serve') || info.serve_url || '';
  $('compare').checked = query.has('serve');
  const kb = (info.bytes / 1024).toFixed(1);
  const p = info.preprocess;
  $('model-facts').textContent = `${info.quantize}, ${kb} KiB, input ${info.input.dtype}[${info.input.shape}], ` +
    `${p.grey ? 'grey' : 'RGB'} ${p.width}x${p.height}, ${p.fit}${p.invert ? ', inverted' : ''}`;
  $('title').textContent = info.draw ? `Draw or show: ${info.model_name || 'model'}` : `Classify with ${info.model_name || 'model'}`;
  $('draw-box').hidden = !info.draw;
  $('hint').textContent = info.draw ? '…or draw above, drop a picture here, or paste one.' : '…or drop a picture here, or paste one.';
  const {loadAndCompile, Tensor: T} = await runtime;
  Tensor = T;
  model = await loadAndCompile(new URL(`${info.model}?v=${VERSION}`, location.href).href, {accelerator: 'wasm'});
  timings.model_ms = performance.now();
  await update();
  timings.first_prediction_ms = performance.now();
  setStatus(`ready: LiteRT.js ${info.litertjs} on wasm, first prediction ${timings.first_prediction_ms.toFixed(0)} ms after load`);
  window.modelyard = {info, timings, predict, pictureToPixels, drawingToPixels, toInput: drawingToPixels,
                      classifyBlob: showPicture, keepOffline, idle: () => !pending && !queued, ready: true};
  document.body.dataset.ready = 'true';
  registerWorker();
}

start().catch((error) => {
  setStatus(`failed: ${error.message}`);
  document.body.dataset.error = error.message;
  window.modelyard = {error: error.message};
});
