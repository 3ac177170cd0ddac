// Small canvas charts: a time-series line chart, a bar chart and sparklines.
//
// Every chart remembers its data on the canvas so it can redraw itself when the canvas is
// resized (window resize, layout change, HiDPI) and when the mouse moves over it (hover readout).

import {
  DAY, MIN, niceTicks, formatTick, formatValue, timeTicks, formatDate, formatTimeTick, formatTimeFull,
} from './scale.js';

export { parseTime } from './scale.js';

/** Series colours, chosen to stay distinguishable next to each other and on white. */
export const PALETTE = ['#2563eb', '#e8590c', '#16a34a', '#9333ea', '#0891b2', '#db2777', '#ca8a04', '#64748b'];

const FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
const FONT_BOLD = '600 11px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
const MONO = '11px ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace';
const AXIS_TEXT = '#6b7280';
const GRID = '#edf0f4';
const AXIS_LINE = '#cfd6e0';

// ---------------------------------------------------------------------------------------------
// Canvas plumbing

const charts = new Set();
const resizeObserver =
  typeof ResizeObserver === 'undefined' ? null : new ResizeObserver((entries) => entries.forEach((e) => schedule(e.target)));

if (typeof window !== 'undefined') {
  // ResizeObserver misses devicePixelRatio changes (zoom, moving to another screen).
  window.addEventListener('resize', () => {
    for (const c of charts) {
      if (c.isConnected) schedule(c);
      else forget(c);
    }
  });
}

function forget(canvas) {
  charts.delete(canvas);
  if (resizeObserver) resizeObserver.unobserve(canvas);
  canvas.__chart = null; // a removed chart may hold 100,000 points: let them go
}

function schedule(canvas) {
  const st = canvas.__chart;
  if (!st || st.pending) return;
  st.pending = true;
  requestAnimationFrame(() => {
    st.pending = false;
    if (!canvas.isConnected) return forget(canvas);
    render(canvas);
  });
}

/** Stores what to draw on the canvas, hooks up resize and hover once, and draws now. */
function attach(canvas, kind, data, opts) {
  // Charts of pages or results no longer shown would otherwise stay referenced here.
  for (const c of charts) if (!c.isConnected && c !== canvas) forget(c);
  const prev = canvas.__chart;
  canvas.__chart = { kind, data, opts, hover: prev && prev.kind === kind ? prev.hover : null, pending: false, layout: null };
  if (!charts.has(canvas)) {
    charts.add(canvas);
    if (resizeObserver) resizeObserver.observe(canvas);
  }
  if (kind !== 'spark' && !canvas.__hoverBound) {
    canvas.__hoverBound = true;
    canvas.addEventListener('mousemove', (e) => {
      const st = canvas.__chart;
      if (!st || !st.layout) return;
      const r = canvas.getBoundingClientRect();
      st.hover = { x: e.clientX - r.left, y: e.clientY - r.top };
      schedule(canvas);
    });
    canvas.addEventListener('mouseleave', () => {
      if (canvas.__chart) canvas.__chart.hover = null;
      schedule(canvas);
    });
  }
  render(canvas);
}

/**
 * A 2D context scaled for the device pixel ratio, sized to the canvas's CSS box; null while the
 * canvas is not laid out (hidden).
 */
function setup(canvas) {
  const w = canvas.clientWidth;
  const hgt = canvas.clientHeight;
  if (!w || !hgt) return null;
  // An intrinsic-size canvas would grow with its own backing store: pin its CSS height once.
  if (!canvas.style.height) canvas.style.height = `${hgt}px`;
  const dpr = window.devicePixelRatio || 1;
  const bw = Math.round(w * dpr);
  const bh = Math.round(hgt * dpr);
  if (canvas.width !== bw) canvas.width = bw;
  if (canvas.height !== bh) canvas.height = bh;
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, hgt);
  return { ctx, w, h: hgt };
}

function render(canvas) {
  const st = canvas.__chart;
  if (!st) return;
  const g = setup(canvas);
  if (!g) return;
  if (st.kind === 'line') drawLine(g, st);
  else if (st.kind === 'bar') drawBar(g, st);
  else drawSpark(g, st);
}

function textWidth(ctx, text, font) {
  ctx.font = font;
  return ctx.measureText(text).width;
}

/** A rounded box with lines of text, kept inside the canvas. */
function tooltip(ctx, w, h, x, y, lines) {
  const padX = 8;
  const lineH = 16;
  let width = 0;
  for (const l of lines) {
    const tw = textWidth(ctx, l.text, l.bold ? FONT_BOLD : FONT) + (l.color ? 14 : 0);
    width = Math.max(width, tw);
  }
  const bw = width + padX * 2;
  const bh = lines.length * lineH + 8;
  let bx = x + 12;
  if (bx + bw > w - 4) bx = x - 12 - bw;
  bx = Math.max(4, bx);
  let by = Math.max(4, Math.min(y - bh / 2, h - bh - 4));
  ctx.save();
  ctx.shadowColor = 'rgba(15, 23, 42, 0.18)';
  ctx.shadowBlur = 8;
  ctx.shadowOffsetY = 2;
  ctx.fillStyle = '#ffffff';
  roundRect(ctx, bx, by, bw, bh, 6);
  ctx.fill();
  ctx.restore();
  ctx.strokeStyle = '#d8dee7';
  ctx.lineWidth = 1;
  roundRect(ctx, bx + 0.5, by + 0.5, bw - 1, bh - 1, 6);
  ctx.stroke();
  ctx.textBaseline = 'middle';
  lines.forEach((l, i) => {
    const ly = by + 4 + lineH * i + lineH / 2;
    let lx = bx + padX;
    if (l.color) {
      ctx.fillStyle = l.color;
      ctx.fillRect(lx, ly - 4, 8, 8);
      lx += 14;
    }
    ctx.font = l.bold ? FONT_BOLD : FONT;
    ctx.fillStyle = '#1f2937';
    ctx.textAlign = 'left';
    ctx.fillText(l.text, lx, ly);
  });
}

function roundRect(ctx, x, y, w, h, r) {
  ctx.beginPath();
  ctx.moveTo(x + r, y);
  ctx.arcTo(x + w, y, x + w, y + h, r);
  ctx.arcTo(x + w, y + h, x, y + h, r);
  ctx.arcTo(x, y + h, x, y, r);
  ctx.arcTo(x, y, x + w, y, r);
  ctx.closePath();
}

/** Legend swatches and names in rows from (x, y); returns the height used. */
function legend(ctx, items, x, y, maxWidth) {
  ctx.font = FONT;
  ctx.textBaseline = 'middle';
  ctx.textAlign = 'left';
  let cx = x;
  let cy = y + 8;
  for (const it of items) {
    const label = it.name.length > 40 ? `${it.name.slice(0, 39)}…` : it.name;
    const iw = 18 + ctx.measureText(label).width + 16;
    if (cx > x && cx + iw > x + maxWidth) {
      cx = x;
      cy += 18;
    }
    ctx.strokeStyle = it.color;
    ctx.fillStyle = it.color;
    ctx.lineWidth = 2.5;
    ctx.beginPath();
    ctx.moveTo(cx, cy);
    ctx.lineTo(cx + 12, cy);
    ctx.stroke();
    ctx.fillStyle = '#374151';
    ctx.fillText(label, cx + 18, cy);
    cx += iw;
  }
  return cy - y + 10;
}

// ---------------------------------------------------------------------------------------------
// Line chart

/** Says there is nothing to plot, in the middle of the canvas. */
function noData(ctx, w, h, st) {
  ctx.font = FONT;
  ctx.fillStyle = AXIS_TEXT;
  ctx.textAlign = 'center';
  ctx.textBaseline = 'middle';
  ctx.fillText('No data to plot', w / 2, h / 2);
  st.layout = null;
}

/**
 * Horizontal grid lines at the y ticks with their labels left of the plot; `zeroAxis` draws
 * the line at 0 darker (bar charts grow from it).
 */
function drawYGrid(ctx, ticks, labels, Y, left, pw, zeroAxis) {
  ctx.lineWidth = 1;
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  ticks.forEach((v, i) => {
    const y = Math.round(Y(v)) + 0.5;
    ctx.strokeStyle = zeroAxis && v === 0 ? AXIS_LINE : GRID;
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(left + pw, y);
    ctx.stroke();
    ctx.fillStyle = AXIS_TEXT;
    ctx.font = MONO;
    ctx.fillText(labels[i], left - 6, y);
  });
}

/**
 * A time-series line chart.
 * data: {x: [epoch ms], series: [{name, values: [number|null]}]} (at most 6 series are drawn).
 * opts: {utc: true (label times in UTC, else local), legend: true, dates: true (date line under
 * intraday ticks), xMin, xMax (a fixed time window instead of the data's extent)}.
 */
export function lineChart(canvas, data, opts = {}) {
  attach(canvas, 'line', prepareLine(data), { utc: true, legend: true, dates: true, ...opts });
}

function prepareLine(data) {
  const x = data.x || [];
  let order = [];
  for (let i = 0; i < x.length; i++) if (Number.isFinite(x[i])) order.push(i);
  let sorted = true;
  for (let k = 1; k < order.length; k++) {
    if (x[order[k]] < x[order[k - 1]]) {
      sorted = false;
      break;
    }
  }
  if (!sorted) order.sort((a, b) => x[a] - x[b]);
  const xs = Float64Array.from(order, (i) => x[i]);
  const series = (data.series || []).slice(0, 6).map((s, k) => {
    const vals = new Float64Array(order.length);
    order.forEach((i, j) => {
      const v = s.values[i];
      vals[j] = v === null || v === undefined || v === '' ? NaN : Number(v);
    });
    return { name: String(s.name), color: s.color || PALETTE[k % PALETTE.length], values: vals };
  });
  return { xs, series };
}

function drawLine({ ctx, w, h }, st) {
  const { xs, series } = st.data;
  const { utc } = st.opts;
  let ymin = Infinity;
  let ymax = -Infinity;
  for (const s of series) {
    for (const v of s.values) {
      if (Number.isFinite(v)) {
        if (v < ymin) ymin = v;
        if (v > ymax) ymax = v;
      }
    }
  }
  if (!xs.length || ymin === Infinity) {
    noData(ctx, w, h, st);
    return;
  }
  const top = st.opts.legend && series.length ? 8 + legend(ctx, series, 8, 6, w - 16) : 12;
  const yt = niceTicks(ymin, ymax, Math.max(2, Math.min(8, Math.floor((h - top - 40) / 36))));
  const scale = Math.max(Math.abs(yt.min), Math.abs(yt.max));
  const ylabels = yt.ticks.map((v) => formatTick(v, yt.step, scale));
  ctx.font = MONO;
  const left = 12 + Math.max(...ylabels.map((l) => ctx.measureText(l).width));
  const right = 16;
  const bottom = st.opts.dates ? 40 : 26;
  const pw = Math.max(10, w - left - right);
  const ph = Math.max(10, h - top - bottom);
  // A fixed window (live charts) keeps the axis steady while data arrives.
  let xmin = Number.isFinite(st.opts.xMin) ? st.opts.xMin : xs[0];
  let xmax = Number.isFinite(st.opts.xMax) ? st.opts.xMax : xs[xs.length - 1];
  if (xmin === xmax) {
    xmin -= MIN;
    xmax += MIN;
  }
  const X = (t) => left + ((t - xmin) / (xmax - xmin)) * pw;
  const Y = (v) => top + ph - ((v - yt.min) / (yt.max - yt.min)) * ph;
  st.layout = { left, top, pw, ph };

  // Grid and y labels.
  drawYGrid(ctx, yt.ticks, ylabels, Y, left, pw, false);

  // X ticks: one label per ~110 px; the date goes on a second line where the day changes.
  const tt = timeTicks(xmin, xmax, Math.max(2, Math.floor(pw / 110)), utc);
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  let lastDate = '';
  for (const t of tt.ticks) {
    const x = Math.round(X(t)) + 0.5;
    ctx.strokeStyle = GRID;
    ctx.beginPath();
    ctx.moveTo(x, top);
    ctx.lineTo(x, top + ph);
    ctx.stroke();
    ctx.strokeStyle = AXIS_LINE;
    ctx.beginPath();
    ctx.moveTo(x, top + ph);
    ctx.lineTo(x, top + ph + 4);
    ctx.stroke();
    ctx.fillStyle = AXIS_TEXT;
    ctx.font = MONO;
    centredText(ctx, formatTimeTick(t, tt.step, utc), x, top + ph + 7, w);
    if (tt.step < DAY && st.opts.dates) {
      const date = formatDate(t, utc);
      if (date !== lastDate) {
        ctx.font = FONT;
        centredText(ctx, date, x, top + ph + 21, w);
        lastDate = date;
      }
    }
  }
  ctx.strokeStyle = AXIS_LINE;
  ctx.beginPath();
  ctx.moveTo(left, Math.round(top + ph) + 0.5);
  ctx.lineTo(left + pw, Math.round(top + ph) + 0.5);
  ctx.stroke();
  if (utc && st.opts.dates) {
    ctx.font = FONT;
    ctx.textAlign = 'right';
    ctx.fillStyle = '#9ca3af';
    ctx.fillText('UTC', w - 4, top + ph + 21);
  }

  // Series, clipped to the plot area.
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top - 2, pw, ph + 4);
  ctx.clip();
  const dots = xs.length <= 60;
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.fillStyle = s.color;
    ctx.lineWidth = 1.75;
    ctx.lineJoin = 'round';
    ctx.lineCap = 'round';
    tracePath(ctx, xs, s.values, X, Y, pw);
    ctx.stroke();
    if (dots) {
      for (let i = 0; i < xs.length; i++) {
        if (!Number.isFinite(s.values[i])) continue;
        ctx.beginPath();
        ctx.arc(X(xs[i]), Y(s.values[i]), 2.5, 0, Math.PI * 2);
        ctx.fill();
      }
    }
  }
  ctx.restore();

  // Hover readout at the nearest time.
  const hv = st.hover;
  if (hv && hv.x >= left - 4 && hv.x <= left + pw + 4 && hv.y >= top - 4 && hv.y <= top + ph + 4) {
    const t = xmin + ((hv.x - left) / pw) * (xmax - xmin);
    const i = nearest(xs, t);
    const x = X(xs[i]);
    ctx.strokeStyle = '#94a3b8';
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    ctx.moveTo(Math.round(x) + 0.5, top);
    ctx.lineTo(Math.round(x) + 0.5, top + ph);
    ctx.stroke();
    ctx.setLineDash([]);
    const lines = [{ text: formatTimeFull(xs[i], utc), bold: true }];
    for (const s of series) {
      const v = s.values[i];
      if (Number.isFinite(v)) {
        ctx.fillStyle = '#fff';
        ctx.strokeStyle = s.color;
        ctx.lineWidth = 2;
        ctx.beginPath();
        ctx.arc(x, Y(v), 3.5, 0, Math.PI * 2);
        ctx.fill();
        ctx.stroke();
      }
      lines.push({ text: `${s.name}: ${formatValue(Number.isFinite(v) ? v : null)}`, color: s.color });
    }
    tooltip(ctx, w, h, x, hv.y, lines);
  }
}

/** Text centred on x but kept whole inside the canvas (edge ticks would be cut in half). */
function centredText(ctx, text, x, y, w) {
  const half = ctx.measureText(text).width / 2;
  ctx.fillText(text, Math.min(Math.max(x, half + 2), w - half - 2), y);
}

/** Index of the x nearest to t (xs sorted). */
function nearest(xs, t) {
  let lo = 0;
  let hi = xs.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < t) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0 && Math.abs(xs[lo - 1] - t) <= Math.abs(xs[lo] - t)) return lo - 1;
  return lo;
}

/**
 * The path of one series. Nulls break the line. With many more points than pixels, each pixel
 * column is drawn as its min-max range so peaks survive and drawing stays fast.
 */
function tracePath(ctx, xs, vals, X, Y, pw) {
  ctx.beginPath();
  const n = xs.length;
  let pen = false;
  if (n <= pw * 3) {
    for (let i = 0; i < n; i++) {
      const v = vals[i];
      if (!Number.isFinite(v)) {
        pen = false;
        continue;
      }
      const px = X(xs[i]);
      const py = Y(v);
      if (pen) ctx.lineTo(px, py);
      else ctx.moveTo(px, py);
      pen = true;
    }
    return;
  }
  let col = NaN;
  let first = 0;
  let last = 0;
  let lo = 0;
  let hi = 0;
  let has = false;
  const flush = () => {
    if (!has) return;
    if (pen) ctx.lineTo(col, first);
    else ctx.moveTo(col, first);
    ctx.lineTo(col, lo);
    ctx.lineTo(col, hi);
    ctx.lineTo(col, last);
    pen = true;
    has = false;
  };
  for (let i = 0; i < n; i++) {
    const v = vals[i];
    if (!Number.isFinite(v)) {
      flush();
      pen = false;
      continue;
    }
    const c = Math.round(X(xs[i]));
    const py = Y(v);
    if (c !== col) {
      flush();
      col = c;
    }
    if (!has) {
      first = lo = hi = py;
      has = true;
    }
    if (py < lo) lo = py;
    if (py > hi) hi = py;
    last = py;
  }
  flush();
}

// ---------------------------------------------------------------------------------------------
// Bar chart

/** A bar chart of one value per label. data: {labels, values, name}; at most 50 bars. */
export function barChart(canvas, data, opts = {}) {
  const labels = (data.labels || []).slice(0, 50).map((l) => (l === null || l === undefined ? '(null)' : String(l)));
  const values = (data.values || []).slice(0, labels.length).map((v) => (v === null || v === undefined || v === '' ? NaN : Number(v)));
  attach(canvas, 'bar', { labels, values, name: data.name || '' }, { color: PALETTE[0], ...opts });
}

function drawBar({ ctx, w, h }, st) {
  const { labels, values, name } = st.data;
  const finite = values.filter(Number.isFinite);
  if (!labels.length || !finite.length) {
    noData(ctx, w, h, st);
    return;
  }
  const color = st.opts.color;
  const top = name ? 8 + legend(ctx, [{ name, color }], 8, 6, w - 16) : 12;
  const yt = niceTicks(Math.min(0, ...finite), Math.max(0, ...finite), 5);
  const scale = Math.max(Math.abs(yt.min), Math.abs(yt.max));
  const ylabels = yt.ticks.map((v) => formatTick(v, yt.step, scale));
  ctx.font = MONO;
  const left = 12 + Math.max(...ylabels.map((l) => ctx.measureText(l).width));
  const right = 12;
  const n = labels.length;

  // Labels lie flat when they fit under their bar, else slant; very dense axes skip some.
  ctx.font = FONT;
  const shown = labels.map((l) => (l.length > 18 ? `${l.slice(0, 17)}…` : l));
  const widest = Math.max(...shown.map((l) => ctx.measureText(l).width));
  // Few bars stay slim and centred rather than stretching across the whole width.
  const slot = Math.min(90, (w - left - right) / n);
  const x0 = left + ((w - left - right) - slot * n) / 2;
  const slant = widest + 6 > slot;
  const bottom = slant ? Math.min(110, 16 + widest * 0.72) : 28;
  const every = slant ? Math.max(1, Math.ceil(13 / slot)) : 1;
  const pw = Math.max(10, w - left - right);
  const ph = Math.max(10, h - top - bottom);
  const Y = (v) => top + ph - ((v - yt.min) / (yt.max - yt.min)) * ph;
  st.layout = { left, top, pw, ph };

  drawYGrid(ctx, yt.ticks, ylabels, Y, left, pw, true);

  const hv = st.hover;
  let hoverIndex = -1;
  if (hv && hv.x >= left && hv.x <= left + pw && hv.y >= top - 4 && hv.y <= top + ph + bottom) {
    const i = Math.floor((hv.x - x0) / slot);
    if (i >= 0 && i < n) hoverIndex = i;
  }
  const gap = Math.min(12, slot * 0.22);
  const y0 = Y(0);
  for (let i = 0; i < n; i++) {
    const v = values[i];
    const x = x0 + i * slot + gap / 2;
    if (Number.isFinite(v)) {
      const y = Y(v);
      ctx.fillStyle = i === hoverIndex ? '#1d4ed8' : color;
      const bh = Math.max(1, Math.abs(y0 - y));
      roundTop(ctx, x, Math.min(y, y0), Math.max(1, slot - gap), bh, v >= 0, Math.min(3, (slot - gap) / 3));
    }
    if (i % every === 0) {
      ctx.fillStyle = AXIS_TEXT;
      ctx.font = FONT;
      const cx = x0 + i * slot + slot / 2;
      if (slant) {
        ctx.save();
        ctx.translate(cx, top + ph + 6);
        ctx.rotate(-Math.PI / 4);
        ctx.textAlign = 'right';
        ctx.textBaseline = 'middle';
        ctx.fillText(shown[i], 0, 0);
        ctx.restore();
      } else {
        ctx.textAlign = 'center';
        ctx.textBaseline = 'top';
        ctx.fillText(shown[i], cx, top + ph + 7);
      }
    }
  }
  if (hoverIndex >= 0) {
    tooltip(ctx, w, h, x0 + hoverIndex * slot + slot / 2, hv.y, [
      { text: labels[hoverIndex], bold: true },
      { text: `${name || 'value'}: ${formatValue(Number.isFinite(values[hoverIndex]) ? values[hoverIndex] : null)}`, color },
    ]);
  }
}

/** A bar with its value end rounded. */
function roundTop(ctx, x, y, w, h, up, r) {
  r = Math.max(0, Math.min(r, h, w / 2));
  ctx.beginPath();
  if (up) {
    ctx.moveTo(x, y + h);
    ctx.lineTo(x, y + r);
    ctx.arcTo(x, y, x + r, y, r);
    ctx.arcTo(x + w, y, x + w, y + r, r);
    ctx.lineTo(x + w, y + h);
  } else {
    ctx.moveTo(x, y);
    ctx.lineTo(x, y + h - r);
    ctx.arcTo(x, y + h, x + r, y + h, r);
    ctx.arcTo(x + w, y + h, x + w, y + h - r, r);
    ctx.lineTo(x + w, y);
  }
  ctx.closePath();
  ctx.fill();
}

// ---------------------------------------------------------------------------------------------
// Sparkline

/**
 * A small line without axes over recent values (nulls leave gaps). opts: {color, zero (start
 * the scale at 0 for non-negative data, default true), capacity (values the width holds: fewer
 * values are drawn from the right, like a strip chart)}.
 */
export function sparkline(canvas, values, opts = {}) {
  const vals = Float64Array.from(values || [], (v) => (v === null || v === undefined ? NaN : Number(v)));
  attach(canvas, 'spark', vals, { color: PALETTE[0], ...opts });
}

function drawSpark({ ctx, w, h }, st) {
  const vals = st.data;
  const color = st.opts.color;
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of vals) {
    if (Number.isFinite(v)) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  // Baseline at the bottom of the box.
  ctx.strokeStyle = GRID;
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(0, h - 0.5);
  ctx.lineTo(w, h - 0.5);
  ctx.stroke();
  if (lo === Infinity) return;
  // Counts and rates read best against zero; a flat line sits in the middle.
  if (st.opts.zero !== false && lo >= 0) lo = 0;
  if (hi === lo) {
    hi += 1;
    lo -= lo === 0 ? 0 : 1;
  }
  const n = Math.max(vals.length, st.opts.capacity || 0);
  const padY = 3;
  const X = (i) => (n <= 1 ? w - 2 : 1 + (i + (n - vals.length)) * ((w - 3) / (n - 1)));
  const Y = (v) => padY + (h - padY * 2) * (1 - (v - lo) / (hi - lo));

  // Area under each unbroken run, then the line on top.
  ctx.fillStyle = hexAlpha(color, 0.12);
  let start = -1;
  for (let i = 0; i <= vals.length; i++) {
    const ok = i < vals.length && Number.isFinite(vals[i]);
    if (ok && start < 0) start = i;
    if (!ok && start >= 0) {
      ctx.beginPath();
      ctx.moveTo(X(start), h);
      for (let j = start; j < i; j++) ctx.lineTo(X(j), Y(vals[j]));
      ctx.lineTo(X(i - 1), h);
      ctx.closePath();
      ctx.fill();
      start = -1;
    }
  }
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.lineJoin = 'round';
  ctx.beginPath();
  let pen = false;
  for (let i = 0; i < vals.length; i++) {
    if (!Number.isFinite(vals[i])) {
      pen = false;
      continue;
    }
    if (pen) ctx.lineTo(X(i), Y(vals[i]));
    else ctx.moveTo(X(i), Y(vals[i]));
    pen = true;
  }
  ctx.stroke();
  const li = vals.length - 1;
  if (li >= 0 && Number.isFinite(vals[li])) {
    ctx.fillStyle = color;
    ctx.beginPath();
    ctx.arc(X(li), Y(vals[li]), 2.5, 0, Math.PI * 2);
    ctx.fill();
  }
}

function hexAlpha(hex, a) {
  const m = /^#([0-9a-f]{6})$/i.exec(hex);
  if (!m) return hex;
  const n = parseInt(m[1], 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}
