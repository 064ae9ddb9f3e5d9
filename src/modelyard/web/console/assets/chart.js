// Shared by both consoles (serve and platform): building nodes with text only (names are never
// parsed as HTML) and drawing small line charts on a canvas, with no library.
'use strict';

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Each series: {values, color, label, scale?, low?} (the y axis runs from low, default 0, to scale,
// default the largest value); ``slots`` points span the width (the newest at the right), else
// ``points`` points do (default: the series' own length), from the left.
// Drawn at the canvas's displayed size times the pixel ratio: crisp on phones, never stretched.
function drawSeries(canvas, series, slots, points) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width, height = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(width * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
  }
  const ctx = canvas.getContext('2d');
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.fillStyle = '#f6f7fa';
  ctx.fillRect(0, 0, width, height);
  let labelX = 8;
  series.forEach(({values, color, label, scale, low = 0}) => {
    const top = scale || Math.max(1e-9, ...values.map(Math.abs));
    const range = Math.max(1e-9, top - low);
    const step = width / Math.max(1, (slots || values.length) - 1);
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    values.forEach((v, k) => {
      const x = slots ? width - (values.length - 1 - k) * step : 4 + k * ((width - 8) / Math.max(1, (points || values.length) - 1));
      const y = height - 6 - ((v - low) / range) * (height - 24);
      if (k === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
    ctx.fillStyle = color;
    ctx.font = '12px system-ui, sans-serif';
    if (!label) return;
    ctx.fillText(label, labelX, 14);
    labelX += ctx.measureText(label).width + 16;
  });
}

// Request rate and mean latency over the last ``slots`` polls: points are {rate, latency (ms)}.
function drawChart(canvas, points, slots = 60) {
  const series = [['rate', '#3b6fd8', 'req/s', 1], ['latency', '#e08a2c', 'ms', 2]].map(([key, color, unit, digits]) => {
    const values = points.map((p) => p[key]);
    const top = Math.max(1e-9, ...values);
    return {values, color, scale: top, label: `${key} max ${top.toFixed(digits)} ${unit}`};
  });
  drawSeries(canvas, series, slots);
}
