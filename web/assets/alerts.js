// The Alerts page: the alert list (refreshed every second) and a form to create alerts.

import * as api from './api.js';
import { h, formatInt, formatAgo, formatLocalTime, toNumber } from './api.js';

const REFRESH_MS = 1000;
const STATES = ['ok', 'firing', 'error', 'pending'];
const OPS = ['>', '>=', '<', '<=', '=', '!='];

/** The condition string the server evaluates: "t > 90", or "any rows". */
export function buildCondition(kind, column, op, threshold) {
  if (kind === 'rows') return 'any rows';
  return `${String(column).trim()} ${op} ${String(threshold).trim()}`;
}

export function mount(root) {
  const listWrap = h('div', { id: 'alerts-list', class: 'table-wrap' });
  const listStatus = h('span', { id: 'alerts-status', class: 'muted' });
  const form = buildForm();

  root.append(
    h('section', { class: 'page page-alerts' },
      h('div', { class: 'page-head' },
        h('h1', null, 'Alerts'),
        h('span', { class: 'spacer' }),
        listStatus,
      ),
      h('p', { class: 'page-note' },
        'An alert runs its query on an interval and checks the condition against the result. Firing alerts publish to MQTT topic ',
        h('code', null, '$alerts/<name>'),
        ' (when publishing is on) and call the webhook if one is set.',
      ),
      h('section', { class: 'card' }, listWrap),
      form.el,
    ),
  );

  let loadedOnce = false;

  async function load(live) {
    try {
      const list = await api.getJson('/v1/alerts');
      if (!live()) return;
      renderList(listWrap, Array.isArray(list) ? list : [], remove);
      listStatus.textContent = `updated ${new Date().toLocaleTimeString()}`;
      listStatus.classList.remove('text-error');
      loadedOnce = true;
    } catch (e) {
      if (!live()) return;
      listStatus.textContent = `Cannot load alerts: ${e.message}`;
      listStatus.classList.add('text-error');
      if (!loadedOnce) listWrap.replaceChildren(h('div', { class: 'empty' }, 'Alerts are not available.'));
    }
  }

  async function remove(name, button) {
    button.disabled = true;
    try {
      await api.del(`/v1/alerts/${encodeURIComponent(name)}`);
      const row = listWrap.querySelector(`tr[data-alert="${CSS.escape(name)}"]`);
      if (row) row.remove();
      poller.now();
    } catch (e) {
      button.disabled = false;
      listStatus.textContent = `Cannot delete ${name}: ${e.message}`;
      listStatus.classList.add('text-error');
    }
  }

  listWrap.append(h('div', { class: 'empty' }, 'Loading…'));
  const poller = api.poll(REFRESH_MS, load);
  form.onCreated = () => poller.now();

  return {
    unmount() {
      poller.stop();
    },
  };
}

// ---------------------------------------------------------------------------------------------
// The list

const COLUMNS = ['Name', 'State', 'Query', 'Condition', 'Last value', 'Last evaluation', 'State since', 'Evaluations', 'Error', ''];

/**
 * Updates the table in place, keyed by alert name, so a row being hovered or a button being
 * clicked is not replaced under the pointer every second.
 */
function renderList(wrap, list, remove) {
  let table = wrap.querySelector('table');
  if (!list.length) {
    wrap.replaceChildren(h('div', { id: 'alerts-empty', class: 'empty' }, 'No alerts yet. Create one with the form below.'));
    return;
  }
  if (!table) {
    table = h('table', { class: 'data-table alerts-table' },
      h('thead', null, h('tr', null, COLUMNS.map((c) => h('th', { class: c === 'Last value' || c === 'Evaluations' ? 'num' : c === '' ? 'actions' : null }, c)))),
      h('tbody'),
    );
    wrap.replaceChildren(table);
  }
  const tbody = table.tBodies[0];
  const existing = new Map([...tbody.rows].map((tr) => [tr.dataset.alert, tr]));
  const now = Date.now();
  let before = tbody.firstChild;
  for (const a of list) {
    if (!a || typeof a !== 'object' || a.name == null) continue;
    const name = String(a.name);
    let tr = existing.get(name);
    if (tr) existing.delete(name);
    else tr = newRow(name, remove);
    updateRow(tr, a, now);
    if (tr !== before) tbody.insertBefore(tr, before);
    else before = before.nextSibling;
  }
  for (const tr of existing.values()) tr.remove();
}

function newRow(name, remove) {
  const del = h('button', { type: 'button', class: 'btn btn-small btn-danger alert-delete', title: `Delete alert ${name}` }, 'Delete');
  del.addEventListener('click', () => remove(name, del));
  return h('tr', { dataset: { alert: name } },
    h('td', { class: 'alert-name mono' }, name),
    h('td', { class: 'state' }),
    h('td', { class: 'alert-query mono' }),
    h('td', { class: 'alert-condition mono' }),
    h('td', { class: 'last-value num' }),
    h('td', { class: 'last-evaluation' }),
    h('td', { class: 'last-change' }),
    h('td', { class: 'evaluations num' }),
    h('td', { class: 'error-text' }),
    h('td', { class: 'actions' }, del),
  );
}

function setText(el, text, title) {
  if (el.textContent !== text) el.textContent = text;
  const t = title || '';
  if (el.title !== t) el.title = t;
}

function updateRow(tr, a, now) {
  const c = tr.cells;
  const state = STATES.includes(a.state) ? a.state : String(a.state ?? 'pending');
  // The cell's text is exactly the state word; the badge inside carries the colour.
  const badge = c[1].firstChild || c[1].appendChild(h('span'));
  setText(badge, state);
  badge.className = `badge badge-${STATES.includes(state) ? state : 'unknown'}`;
  c[1].dataset.state = state;
  setText(c[2], a.query == null ? '-' : String(a.query), a.query);
  const every = toNumber(a.interval_ms);
  setText(c[3], a.condition == null ? '-' : String(a.condition), every ? `checked every ${every / 1000} s${a.publish === false ? ', not published to MQTT' : ''}${a.webhook ? `, webhook ${a.webhook}` : ''}` : '');
  setText(c[4], formatValue(a.last_value));
  setText(c[5], a.last_evaluation_ms == null ? '-' : formatAgo(a.last_evaluation_ms, now), a.last_evaluation_ms == null ? '' : formatLocalTime(a.last_evaluation_ms));
  setText(c[6], a.last_change_ms == null ? '-' : formatAgo(a.last_change_ms, now), a.last_change_ms == null ? '' : `state since ${formatLocalTime(a.last_change_ms)}`);
  setText(c[7], formatInt(a.evaluations));
  setText(c[8], a.error ? String(a.error) : '', a.error ? String(a.error) : '');
}

function formatValue(v) {
  if (v === null || v === undefined) return '-';
  const n = toNumber(v);
  if (n === null) return typeof v === 'object' ? JSON.stringify(v) : String(v);
  return Number.isInteger(n) ? n.toLocaleString('en-US') : String(Number(n.toPrecision(8)));
}

// ---------------------------------------------------------------------------------------------
// The create form

function buildForm() {
  const name = h('input', { id: 'alert-name', type: 'text', required: true, placeholder: 'hot', autocomplete: 'off', spellcheck: false });
  const query = h('textarea', { id: 'alert-query', class: 'mono', rows: 3, required: true, spellcheck: false, placeholder: 'SELECT max(temp) AS t FROM plant.readings WHERE PARTS last' });
  const kind = h('select', { id: 'alert-kind' },
    h('option', { value: 'threshold', selected: true }, 'a column crosses a threshold'),
    h('option', { value: 'rows' }, 'the query returns any rows'),
  );
  const column = h('input', { id: 'alert-column', type: 'text', class: 'mono', placeholder: 't', autocomplete: 'off', spellcheck: false });
  const op = h('select', { id: 'alert-op', class: 'mono' }, OPS.map((o) => h('option', { value: o }, o)));
  const threshold = h('input', { id: 'alert-threshold', type: 'number', step: 'any', class: 'mono', placeholder: '90' });
  const interval = h('input', { id: 'alert-interval', type: 'number', min: '0.1', step: 'any', value: '1', class: 'mono' });
  const publish = h('input', { id: 'alert-publish', type: 'checkbox', checked: true });
  const topic = h('code', { id: 'alert-topic' }, '$alerts/<name>');
  const webhook = h('input', { id: 'alert-webhook', type: 'url', placeholder: 'https://example.com/hook', autocomplete: 'off', spellcheck: false });
  const create = h('button', { id: 'alert-create', type: 'submit', class: 'btn btn-primary' }, 'Create alert');
  const message = h('div', { id: 'alert-error', class: 'form-error', role: 'alert', hidden: true });
  const ok = h('span', { id: 'alert-created', class: 'form-ok', 'aria-live': 'polite' });
  const preview = h('code', { id: 'alert-condition-preview' });

  const field = (label, input, hint, cls = '') =>
    h('label', { class: `field ${cls}` }, h('span', { class: 'field-label' }, label), input, hint ? h('span', { class: 'field-hint' }, hint) : null);
  // display: contents, so these are cells of the form grid yet hide together for "any rows".
  const thresholdFields = h('div', { class: 'condition-fields' },
    field('Column', column, 'a column of the query result', 'span-2'),
    field('Operator', op),
    field('Threshold', threshold),
  );

  const form = h('form', { class: 'card alert-form', novalidate: true, 'aria-label': 'Create alert' },
    h('div', { class: 'card-title' }, h('span', null, 'New alert')),
    h('div', { class: 'form-grid' },
      field('Name', name, null, 'span-2'),
      field('Check every (seconds)', interval),
      field('Fire when', kind),
      field('Query', query, null, 'span-4'),
      thresholdFields,
      field('Webhook (optional)', webhook, 'POSTed to when the alert fires', 'span-2'),
      h('label', { class: 'check span-2' }, publish, h('span', null, 'publish to MQTT ', topic)),
    ),
    message,
    h('div', { class: 'form-actions' }, create, h('span', { class: 'muted' }, 'Condition: ', preview), ok),
  );

  const result = { el: form, onCreated: null };

  const sync = () => {
    const n = name.value.trim();
    topic.textContent = `$alerts/${n || '<name>'}`;
    const rows = kind.value === 'rows';
    thresholdFields.hidden = rows;
    preview.textContent = rows ? 'any rows' : buildCondition('threshold', column.value || '<column>', op.value, threshold.value || '<threshold>');
  };
  for (const el of [name, kind, column, op, threshold]) {
    el.addEventListener('input', sync);
    el.addEventListener('change', sync);
  }
  sync();

  const showError = (text) => {
    message.textContent = text;
    message.hidden = !text;
  };

  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    showError('');
    ok.textContent = '';
    const rows = kind.value === 'rows';
    const seconds = Number(interval.value || '1');
    const problems = [];
    if (!name.value.trim()) problems.push('a name');
    if (!query.value.trim()) problems.push('a query');
    if (!rows && !column.value.trim()) problems.push('a column');
    if (!rows && threshold.value.trim() === '') problems.push('a threshold');
    if (problems.length) return showError(`Please give ${problems.join(', ')}.`);
    if (!(seconds > 0)) return showError('The interval must be a positive number of seconds.');
    const body = {
      name: name.value.trim(),
      query: query.value.trim(),
      condition: buildCondition(kind.value, column.value, op.value, threshold.value),
      interval_ms: Math.max(1, Math.round(seconds * 1000)),
      publish: publish.checked,
      webhook: webhook.value.trim() || null,
    };
    create.disabled = true;
    try {
      await api.postJson('/v1/alerts', body);
      ok.textContent = `Created ${body.name}.`;
      name.value = '';
      sync();
      if (result.onCreated) result.onCreated(body.name);
    } catch (err) {
      showError(err.code && err.status ? `${err.message} (${err.code})` : err.message);
    } finally {
      create.disabled = false;
    }
  });

  return result;
}
