// The Live page: server metrics pushed once a second over server-sent events (/v1/live),
// as number tiles with sparklines over the last two minutes, a throughput chart and bridges.

import * as api from './api.js';
import { h, formatInt, formatBytes, toNumber } from './api.js';
import { lineChart, sparkline, PALETTE } from './chart.js';

const WINDOW = 120; // samples kept: ~120 s at one event per second
const STALE_MS = 5000;

/** Value of a dotted path in an event, or null when any step is missing. */
export function pick(obj, path) {
  let cur = obj;
  for (const key of path.split('.')) {
    if (cur === null || typeof cur !== 'object' || !(key in cur)) return null;
    cur = cur[key];
  }
  return toNumber(cur);
}

/**
 * Per-second rate of a counter between two samples; null when either is missing, time did not
 * advance, or the counter went backwards (the server restarted).
 */
export function rate(prev, cur, dtMs) {
  if (prev === null || cur === null || prev === undefined || cur === undefined) return null;
  if (!(dtMs > 0)) return null;
  const d = cur - prev;
  return d < 0 ? null : d / (dtMs / 1000);
}

const fmtRate = (v) => (v === null ? '-' : v < 10 && v % 1 ? v.toFixed(1) : formatInt(v));
const fmtMs = (v) => (v === null ? '-' : v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : formatInt(v));

// Tiles in display order. `counter` metrics are totals since start shown as rates; `gauge`
// metrics are shown as they are.
const TILES = [
  { id: 'messages-in', label: 'Messages in', unit: '/s', counter: 'mqtt.messages_in', fmt: fmtRate, color: PALETTE[0] },
  { id: 'messages-out', label: 'Messages out', unit: '/s', counter: 'mqtt.messages_out', fmt: fmtRate, color: PALETTE[1] },
  { id: 'rows-stored', label: 'Rows stored', unit: '/s', counter: 'mqtt.rows_stored', fmt: fmtRate, color: PALETTE[2] },
  { id: 'bytes-in', label: 'Bytes in', unit: '', counter: 'mqtt.bytes_in', fmt: (v) => (v === null ? '-' : `${formatBytes(v)}/s`), color: PALETTE[4] },
  { id: 'connections', label: 'Connections', unit: '', gauge: 'mqtt.connections', fmt: formatInt, color: PALETTE[3] },
  { id: 'ack-p50', label: 'Ack latency p50', unit: 'ms', gauge: 'mqtt.ack_p50_ms', fmt: fmtMs, color: PALETTE[4] },
  { id: 'ack-p99', label: 'Ack latency p99', unit: 'ms', gauge: 'mqtt.ack_p99_ms', fmt: fmtMs, color: PALETTE[5] },
  { id: 'buffered-rows', label: 'Buffered rows', unit: '', gauge: 'engine.buffered_rows', fmt: formatInt, color: PALETTE[0], sub: (e) => sub('engine.buffered_bytes', e, formatBytes) },
  {
    id: 'wal-segments', label: 'WAL segments', unit: '', gauge: 'engine.wal_segments', fmt: formatInt, color: PALETTE[6],
    // Flush state: partitions being written to Parquet now, and flushes since start.
    sub: (e) => {
      const flushing = pick(e, 'engine.flushing');
      const flushes = pick(e, 'engine.flushes');
      if (flushes === null) return '';
      return `${formatInt(flushes)} flushes${flushing ? `, ${formatInt(flushing)} flushing` : ''}`;
    },
  },
  { id: 'applied-lsn', label: 'Applied LSN', unit: '', gauge: 'engine.applied_lsn', fmt: formatInt, color: PALETTE[7] },
  {
    id: 'dead-letters',
    label: 'Dead letters',
    unit: '',
    // The engine counts every refused message (MQTT ones included); older servers only the broker.
    value: (e) => pick(e, 'engine.dead_letters') ?? pick(e, 'mqtt.dead_letters'),
    fmt: formatInt,
    color: PALETTE[5],
    warnAbove: 0,
  },
  { id: 'files', label: 'Files', unit: '', gauge: 'engine.files', fmt: formatInt, color: PALETTE[2], sub: (e) => sub('engine.partitions', e, (v) => `${formatInt(v)} partitions`) },
];

function sub(path, ev, fmt) {
  const v = pick(ev, path);
  return v === null ? '' : fmt(v);
}

export function mount(root) {
  const dot = h('span', { class: 'live-dot connecting', 'aria-hidden': 'true' });
  const statusText = h('span', { id: 'live-status' }, 'Connecting…');
  const updated = h('span', { id: 'live-updated', class: 'muted mono' });
  const alertChips = h('a', { id: 'live-alerts', class: 'alert-chips', href: '#/alerts', title: 'Alerts' });

  const tiles = TILES.map((t) => {
    const value = h('span', { class: 'tile-value mono' }, '-');
    const unit = h('span', { class: 'tile-unit' }, t.unit);
    const subEl = h('div', { class: 'tile-sub' });
    const canvas = h('canvas', { class: 'sparkline', 'aria-hidden': 'true' });
    const el = h('div', { id: `live-${t.id}`, class: 'tile', dataset: { metric: t.id } },
      h('div', { class: 'tile-label' }, t.label),
      h('div', { class: 'tile-number' }, value, unit),
      subEl,
      canvas,
    );
    return { def: t, el, value, subEl, canvas };
  });

  const throughput = h('canvas', { id: 'live-throughput', class: 'chart-canvas chart-short', role: 'img', 'aria-label': 'messages per second, last two minutes' });
  const bridgesBody = h('div', { id: 'live-bridges', class: 'table-wrap' });

  root.append(
    h('section', { class: 'page page-live' },
      h('div', { class: 'page-head' },
        h('h1', null, 'Live'),
        h('div', { class: 'live-state' }, dot, statusText, updated),
        h('span', { class: 'spacer' }),
        alertChips,
      ),
      h('div', { class: 'tiles' }, tiles.map((t) => t.el)),
      h('section', { class: 'card' },
        h('div', { class: 'card-title' }, h('span', null, 'Throughput'), h('span', { class: 'card-sub' }, 'MQTT messages per second, last 2 minutes')),
        throughput,
      ),
      h('section', { class: 'card' },
        h('div', { class: 'card-title' }, h('span', null, 'Bridges')),
        bridgesBody,
      ),
    ),
  );

  // Per-page state: history restarts when the page is shown again (a gap would mislead).
  const hist = { t: [], values: Object.fromEntries(TILES.map((t) => [t.id, []])) };
  let prev = null; // previous event, for rates
  let lastAt = 0;
  let source = null;
  let retryTimer = 0;
  let closed = false;

  const setStatus = (kind, text) => {
    dot.className = `live-dot ${kind}`;
    statusText.textContent = text;
  };

  function onEvent(ev) {
    lastAt = Date.now();
    const t = toNumber(ev.time_ms) ?? lastAt;
    const dt = prev ? t - prev.t : 0;
    hist.t.push(t);
    for (const tile of tiles) {
      const d = tile.def;
      let v;
      if (d.counter) v = prev ? rate(pick(prev.ev, d.counter), pick(ev, d.counter), dt) : null;
      else if (d.value) v = d.value(ev);
      else v = pick(ev, d.gauge);
      const series = hist.values[d.id];
      series.push(v);
      if (series.length > WINDOW) series.shift();
      tile.value.textContent = d.fmt(v);
      tile.subEl.textContent = d.sub ? d.sub(ev) : '';
      tile.el.classList.toggle('tile-warn', d.warnAbove !== undefined && v !== null && v > d.warnAbove);
      // A strip chart fills from the right; 30 s minimum so early seconds are not one flat blob.
      sparkline(tile.canvas, series, { color: d.color, capacity: Math.max(30, series.length) });
    }
    if (hist.t.length > WINDOW) hist.t.shift();
    prev = { t, ev };
    setStatus('ok', 'Connected');
    updated.textContent = `updated ${new Date(t).toLocaleTimeString()}`;
    lineChart(throughput, {
      x: hist.t,
      series: [
        { name: 'messages in/s', values: hist.values['messages-in'] },
        { name: 'messages out/s', values: hist.values['messages-out'] },
      ],
    }, { utc: false, dates: false, xMin: t - WINDOW * 1000, xMax: t });
    renderAlerts(ev.alerts);
    renderBridges(ev.bridges);
  }

  function renderAlerts(a) {
    alertChips.replaceChildren();
    if (!a || typeof a !== 'object') return;
    alertChips.append(h('span', { class: 'muted' }, 'Alerts'));
    for (const s of ['firing', 'error', 'pending', 'ok']) {
      const n = toNumber(a[s]);
      alertChips.append(h('span', { class: `badge badge-${s}${n ? '' : ' badge-zero'}`, dataset: { state: s } }, `${n === null ? '-' : n} ${s}`));
    }
  }

  function renderBridges(list) {
    bridgesBody.replaceChildren();
    if (!Array.isArray(list) || !list.length) {
      const text = Array.isArray(list) ? 'No bridges configured.' : prev ? 'No bridge data from the server.' : 'Waiting for data…';
      bridgesBody.append(h('div', { class: 'empty empty-small' }, text));
      return;
    }
    const num = (v) => h('td', { class: 'num' }, formatInt(v));
    bridgesBody.append(
      h('table', { class: 'data-table' },
        h('thead', null, h('tr', null,
          h('th', null, 'Name'), h('th', null, 'Status'),
          ['Msgs/s', 'Received', 'Stored', 'Duplicates', 'Dead letters', 'Reconnects'].map((t) => h('th', { class: 'num' }, t)),
          h('th', null, 'Last error'),
        )),
        h('tbody', null, list.map((b) => {
          b = b && typeof b === 'object' ? b : {};
          const connected = b.connected === true ? 'connected' : b.connected === false ? 'disconnected' : '-';
          return h('tr', { dataset: { bridge: String(b.name ?? '') } },
            h('td', { class: 'mono' }, b.name == null ? '-' : String(b.name)),
            h('td', null, h('span', { class: `badge ${b.connected === true ? 'badge-ok' : b.connected === false ? 'badge-firing' : 'badge-pending'}` }, connected)),
            h('td', { class: 'num' }, fmtRate(toNumber(b.messages_per_second))),
            num(b.received), num(b.stored), num(b.duplicates), num(b.dead_letters), num(b.reconnects),
            h('td', { class: 'error-text', title: b.last_error || '' }, b.last_error ? String(b.last_error) : '-'),
          );
        })),
      ),
    );
  }

  function connect() {
    if (closed) return;
    setStatus('connecting', prev ? 'Reconnecting…' : 'Connecting…');
    source = new EventSource('/v1/live');
    source.onmessage = (msg) => {
      let ev;
      try {
        ev = JSON.parse(msg.data);
      } catch {
        return; // one malformed event should not stop the page
      }
      if (ev && typeof ev === 'object') onEvent(ev);
    };
    source.onerror = () => {
      if (closed) return;
      // EventSource retries by itself unless the server refused the stream (e.g. 401):
      // then it closes, and the session decides whether to log in again or retry later.
      setStatus('error', 'Disconnected, retrying…');
      if (source.readyState === EventSource.CLOSED) {
        source = null;
        api.getSession().then((s) => {
          if (closed) return;
          if (s.auth_required && !s.user) api.notifyUnauthorized();
          else retryTimer = setTimeout(connect, 3000);
        }, () => {
          if (!closed) retryTimer = setTimeout(connect, 3000);
        });
      }
    };
  }

  // Flags a stream that went quiet without an error (proxy buffering, a stuck server).
  const staleTimer = setInterval(() => {
    if (lastAt && Date.now() - lastAt > STALE_MS && source && source.readyState === EventSource.OPEN) {
      setStatus('stale', `No update for ${Math.round((Date.now() - lastAt) / 1000)} s`);
    }
  }, 1000);

  renderBridges(undefined);
  connect();

  return {
    unmount() {
      closed = true;
      clearTimeout(retryTimer);
      clearInterval(staleTimer);
      if (source) source.close();
      source = null;
    },
  };
}
