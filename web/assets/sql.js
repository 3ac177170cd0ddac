// The SQL page: editor with history, paged result table, automatic chart, CSV download.

import * as api from './api.js';
import { h, columnKind, toNumber } from './api.js';
import { lineChart, barChart, parseTime } from './chart.js';

const PAGE_SIZE = 200;
const HISTORY_KEY = 'sluice.sql.history';
const DRAFT_KEY = 'sluice.sql.draft';
const HISTORY_MAX = 50;
const MAX_SERIES = 6;
const MAX_BARS = 50;

const PLACEHOLDER = [
  '-- Write a statement and press Ctrl+Enter (⌘+Enter) to run it. For example:',
  'SELECT * FROM system.tables',
  'SHOW DATABASES',
  'DESCRIBE mydb.readings',
  "SELECT date_trunc('minute', time) AS minute, avg(temp) AS temp, max(temp) AS peak",
  '  FROM mydb.readings GROUP BY 1 ORDER BY 1',
  'SELECT device, count(*) AS n FROM mydb.readings GROUP BY device ORDER BY n DESC',
].join('\n');

// Kept across page switches so coming back to the SQL page shows the same editor and result.
const state = {
  text: readDraft(),
  result: null, // {columns, rows, elapsedMs, truncated, firstBatchUs, sql}
  error: null, // {status, code, message, position, sql, base, elapsedMs}
  page: 0,
  running: null, // AbortController of the statement in flight
  progress: 0,
};

let view = null; // the mounted page's elements; null while another page is shown

/** Puts a statement in the editor (used by other pages' "Query this table" links). */
export function openInEditor(text) {
  state.text = text;
  saveDraft(text);
  if (view) {
    view.editor.value = text;
    view.editor.focus();
  }
}

export function mount(root) {
  const editor = h('textarea', {
    id: 'sql-editor',
    class: 'sql-editor',
    spellcheck: false,
    autocomplete: 'off',
    autocapitalize: 'off',
    autocorrect: 'off',
    rows: 8,
    'aria-label': 'SQL statement',
  });
  editor.placeholder = PLACEHOLDER;
  editor.value = state.text;

  const runBtn = h('button', { id: 'run-sql', class: 'btn btn-primary', type: 'button', title: 'Run (Ctrl+Enter)' }, h('span', { class: 'btn-icon', 'aria-hidden': 'true' }, '▶'), ' Run');
  const cancelBtn = h('button', { id: 'sql-cancel', class: 'btn', type: 'button', hidden: true }, 'Cancel');
  const historyBtn = h('button', { id: 'sql-history-toggle', class: 'btn', type: 'button', 'aria-haspopup': 'true', 'aria-expanded': 'false' }, 'History ', h('span', { class: 'caret', 'aria-hidden': 'true' }, '▾'));
  const historyMenu = h('div', { id: 'sql-history', class: 'menu history-menu', role: 'menu', hidden: true });
  const downloadBtn = h('button', { id: 'sql-download', class: 'btn', type: 'button', title: 'Run the statement again and save the result as CSV' }, '⤓ Download CSV');
  const status = h('span', { id: 'sql-status', class: 'status-text', 'aria-live': 'polite' });

  const errorBox = h('div', { id: 'sql-error', class: 'error-box', role: 'alert', hidden: true });
  const rowCount = h('span', { id: 'sql-row-count', class: 'stat' });
  const elapsed = h('span', { id: 'sql-elapsed', class: 'stat mono' });
  const truncatedNote = h('span', { id: 'sql-truncated', class: 'note-warn', hidden: true }, 'first 100,000 rows shown');
  const prevBtn = h('button', { id: 'sql-prev', class: 'btn btn-small', type: 'button', disabled: true }, '‹ Prev');
  const nextBtn = h('button', { id: 'sql-next', class: 'btn btn-small', type: 'button', disabled: true }, 'Next ›');
  const pageInfo = h('span', { id: 'sql-page-info', class: 'page-info mono' });
  const pager = h('div', { class: 'pager', hidden: true }, prevBtn, pageInfo, nextBtn);
  const results = h('div', { id: 'sql-results', class: 'table-wrap results' });
  const chartTitle = h('div', { class: 'card-title' });
  const resultsBar = h('div', { class: 'results-bar', hidden: true }, rowCount, elapsed, truncatedNote, h('span', { class: 'spacer' }), pager);
  const resultsCard = h('section', { class: 'card results-card' }, resultsBar, results);
  const chartCard = h('section', { id: 'sql-chart-card', class: 'card chart-card', hidden: true }, chartTitle);

  root.append(
    h('section', { class: 'page page-sql' },
      h('div', { class: 'card editor-card' },
        h('div', { class: 'toolbar' },
          runBtn,
          cancelBtn,
          h('span', { class: 'kbd-hint' }, h('kbd', null, 'Ctrl'), '+', h('kbd', null, 'Enter')),
          h('div', { class: 'menu-wrap' }, historyBtn, historyMenu),
          status,
          h('span', { class: 'spacer' }),
          downloadBtn,
        ),
        editor,
      ),
      errorBox,
      resultsCard,
      chartCard,
    ),
  );

  view = { resultsBar, resultsCard, editor, runBtn, cancelBtn, historyBtn, historyMenu, downloadBtn, status, errorBox, rowCount, elapsed, truncatedNote, prevBtn, nextBtn, pageInfo, pager, results, chartCard, chartTitle, historyPos: -1, historyDraft: '' };
  const v = view;

  runBtn.addEventListener('click', () => run());
  cancelBtn.addEventListener('click', () => state.running && state.running.abort());
  downloadBtn.addEventListener('click', () => downloadCsv());
  prevBtn.addEventListener('click', () => goPage(state.page - 1));
  nextBtn.addEventListener('click', () => goPage(state.page + 1));
  historyBtn.addEventListener('click', (e) => {
    e.stopPropagation();
    toggleHistory(v.historyMenu.hidden);
  });
  const closeMenu = (e) => {
    if (!v.historyMenu.hidden && !v.historyMenu.contains(e.target)) toggleHistory(false);
  };
  document.addEventListener('click', closeMenu);

  let draftTimer = 0;
  editor.addEventListener('input', () => {
    state.text = editor.value;
    v.historyPos = -1;
    clearTimeout(draftTimer);
    draftTimer = setTimeout(() => saveDraft(editor.value), 300);
  });
  editor.addEventListener('keydown', onEditorKey);
  // Ctrl+Enter also works when focus is on a button of the page, not only in the editor.
  const onPageKey = (e) => {
    if (e.key === 'Escape' && !v.historyMenu.hidden) {
      toggleHistory(false);
      historyBtn.focus();
    } else if (e.key === 'Enter' && (e.ctrlKey || e.metaKey) && e.target !== editor && root.contains(e.target)) {
      e.preventDefault();
      run();
    }
  };
  document.addEventListener('keydown', onPageKey);

  renderAll();
  if (!state.running) editor.focus();

  return {
    unmount() {
      clearTimeout(draftTimer);
      saveDraft(editor.value);
      document.removeEventListener('click', closeMenu);
      document.removeEventListener('keydown', onPageKey);
      view = null; // a statement still running finishes into `state` and shows on return
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Editor keys

function onEditorKey(e) {
  const v = view;
  const ed = v.editor;
  if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
    e.preventDefault();
    run();
  } else if (e.key === 'Tab' && !e.ctrlKey && !e.altKey && !e.metaKey) {
    e.preventDefault();
    indent(ed, e.shiftKey);
  } else if (e.altKey && (e.key === 'ArrowUp' || e.key === 'ArrowDown')) {
    e.preventDefault();
    walkHistory(e.key === 'ArrowUp' ? 1 : -1);
  }
}

/** Inserts text at the selection, through the browser's editing so Undo still works. */
function insertText(ed, text) {
  ed.focus();
  let done = false;
  try {
    done = document.execCommand('insertText', false, text);
  } catch {
    done = false;
  }
  if (!done) {
    ed.setRangeText(text, ed.selectionStart, ed.selectionEnd, 'end');
    ed.dispatchEvent(new Event('input', { bubbles: true }));
  }
}

/** Tab inserts two spaces; on a multi-line selection Tab/Shift+Tab indent or outdent the lines. */
function indent(ed, outdent) {
  const { value, selectionStart: s, selectionEnd: e } = ed;
  const multi = value.slice(s, e).includes('\n');
  if (!multi && !outdent) {
    insertText(ed, '  ');
    return;
  }
  const lineStart = value.lastIndexOf('\n', s - 1) + 1;
  const block = value.slice(lineStart, e);
  const changed = outdent ? block.replace(/^ {1,2}/gm, '') : block.replace(/^/gm, '  ');
  if (changed === block) return;
  ed.setSelectionRange(lineStart, e);
  insertText(ed, changed);
  if (multi) ed.setSelectionRange(lineStart, lineStart + changed.length);
}

// ---------------------------------------------------------------------------------------------
// History

function readHistory() {
  try {
    const list = JSON.parse(localStorage.getItem(HISTORY_KEY) || '[]');
    return Array.isArray(list) ? list.filter((s) => typeof s === 'string') : [];
  } catch {
    return [];
  }
}

function addHistory(text) {
  const list = readHistory().filter((s) => s !== text);
  list.unshift(text);
  try {
    localStorage.setItem(HISTORY_KEY, JSON.stringify(list.slice(0, HISTORY_MAX)));
  } catch {
    // Storage full or disabled: history is a convenience only.
  }
}

function readDraft() {
  try {
    return localStorage.getItem(DRAFT_KEY) || '';
  } catch {
    return '';
  }
}

function saveDraft(text) {
  try {
    localStorage.setItem(DRAFT_KEY, text);
  } catch {
    // As above.
  }
}

/** Alt+Up walks to older statements, Alt+Down back towards what was being typed. */
function walkHistory(dir) {
  const v = view;
  const list = readHistory();
  const pos = v.historyPos + dir;
  if (pos < -1 || pos >= list.length) return;
  if (v.historyPos === -1) v.historyDraft = v.editor.value;
  v.historyPos = pos;
  const text = pos === -1 ? v.historyDraft : list[pos];
  v.editor.value = text;
  state.text = text;
  v.editor.setSelectionRange(text.length, text.length);
}

function toggleHistory(open) {
  const v = view;
  v.historyMenu.hidden = !open;
  v.historyBtn.setAttribute('aria-expanded', String(open));
  if (!open) return;
  const list = readHistory();
  v.historyMenu.replaceChildren();
  if (!list.length) {
    v.historyMenu.append(h('div', { class: 'menu-empty' }, 'No statements run yet.'));
    return;
  }
  list.forEach((text, i) => {
    const oneLine = text.replace(/\s+/g, ' ').trim();
    v.historyMenu.append(
      h('button', {
        type: 'button',
        class: 'menu-item history-item mono',
        role: 'menuitem',
        title: text,
        dataset: { index: String(i) },
        onclick: () => {
          v.editor.value = text;
          state.text = text;
          saveDraft(text);
          v.historyPos = -1;
          toggleHistory(false);
          v.editor.focus();
        },
      }, oneLine.length > 110 ? `${oneLine.slice(0, 109)}…` : oneLine),
    );
  });
  v.historyMenu.append(
    h('button', {
      type: 'button',
      class: 'menu-item menu-danger',
      onclick: () => {
        try {
          localStorage.removeItem(HISTORY_KEY);
        } catch {
          // Nothing to clear.
        }
        toggleHistory(false);
      },
    }, 'Clear history'),
  );
}

// ---------------------------------------------------------------------------------------------
// Running

/** The statement to run: the selection when there is one, else the whole editor. */
function statementText() {
  const ed = view.editor;
  if (ed.selectionStart !== ed.selectionEnd) {
    return { text: ed.value.slice(ed.selectionStart, ed.selectionEnd), base: ed.selectionStart };
  }
  return { text: ed.value, base: 0 };
}

async function run() {
  if (!view) return;
  const { text, base } = statementText();
  if (!text.trim()) {
    state.error = { code: 'empty', message: 'Nothing to run: write a statement first.', position: null, sql: text, base };
    state.result = null;
    renderAll();
    return;
  }
  if (state.running) state.running.abort();
  const controller = new AbortController();
  state.running = controller;
  state.progress = 0;
  state.error = null;
  state.result = null;
  state.page = 0;
  addHistory(text.trim());
  if (view) view.historyPos = -1;
  renderAll();
  const started = performance.now();
  try {
    const r = await api.sql(text, {
      signal: controller.signal,
      onProgress: (n) => {
        state.progress = n;
        if (view && state.running === controller) view.status.textContent = `Running… ${n.toLocaleString('en-US')} rows received`;
      },
    });
    if (state.running !== controller) return; // a newer run replaced this one
    state.result = { ...r, sql: text };
  } catch (e) {
    if (state.running !== controller) return;
    if (e && e.name === 'AbortError') {
      state.error = { code: 'cancelled', message: 'Cancelled.', position: null, sql: text, base };
    } else {
      state.error = {
        status: e.status,
        code: e.code || 'error',
        message: e.message || String(e),
        position: e.position || null,
        sql: text,
        base,
        elapsedMs: performance.now() - started,
      };
    }
  } finally {
    if (state.running === controller) state.running = null;
  }
  renderAll();
  if (state.error && state.error.position && view) moveCursor(state.error);
}

async function downloadCsv() {
  const v = view;
  const { text } = statementText();
  const sqlText = text.trim() ? text : state.result ? state.result.sql : '';
  if (!sqlText.trim()) return;
  v.downloadBtn.disabled = true;
  v.status.textContent = 'Preparing CSV…';
  try {
    const blob = await api.sqlBlob(sqlText, 'csv');
    const url = URL.createObjectURL(blob);
    const a = h('a', { href: url, download: 'result.csv', hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    // Revoking at once can cancel the download in some browsers.
    setTimeout(() => URL.revokeObjectURL(url), 30000);
    if (view) view.status.textContent = '';
  } catch (e) {
    state.error = { status: e.status, code: e.code || 'error', message: e.message || String(e), position: e.position || null, sql: sqlText, base: 0 };
    if (view) {
      view.status.textContent = '';
      renderError();
    }
  } finally {
    if (view) view.downloadBtn.disabled = false;
  }
}

// ---------------------------------------------------------------------------------------------
// Rendering

function renderAll() {
  if (!view) return;
  const v = view;
  const running = !!state.running;
  v.runBtn.disabled = running;
  v.cancelBtn.hidden = !running;
  v.status.textContent = running
    ? state.progress
      ? `Running… ${state.progress.toLocaleString('en-US')} rows received`
      : 'Running…'
    : '';
  renderError();
  const r = state.result;
  // An error replaces the result: the error box says it all.
  v.resultsCard.hidden = !!state.error && !r;
  v.resultsBar.hidden = !r;
  v.rowCount.textContent = r ? `${r.rows.length} ${r.rows.length === 1 ? 'row' : 'rows'}` : '';
  v.truncatedNote.hidden = !(r && r.truncated);
  const ms = r ? r.elapsedMs : state.error && state.error.elapsedMs;
  v.elapsed.textContent = typeof ms === 'number' ? formatElapsed(ms) : '';
  v.elapsed.title = r && r.firstBatchUs ? `server: first batch after ${formatElapsed(r.firstBatchUs / 1000)}` : '';
  renderTable();
  renderChart();
}

/** "12.3 ms" (client-side, request to last row); whole seconds read better past 10 s. */
export function formatElapsed(ms) {
  return ms < 10000 ? `${ms.toFixed(1)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

function renderError() {
  const v = view;
  const err = state.error;
  v.errorBox.replaceChildren();
  v.errorBox.hidden = !err;
  if (!err) return;
  const head = h('div', { class: 'error-head' },
    h('span', { class: 'error-title' }, err.code === 'cancelled' ? 'Cancelled' : 'Error'),
    err.code && err.code !== 'cancelled' ? h('span', { class: 'error-code mono' }, err.code) : null,
    err.position ? h('span', { class: 'error-pos' }, `line ${err.position.line}, column ${err.position.column}`) : null,
  );
  v.errorBox.append(head, h('div', { class: 'error-message' }, err.message));
  if (err.position && err.sql) {
    const lines = errorExcerpt(err.sql, err.position.line, err.position.column).split('\n');
    const caret = lines.pop();
    v.errorBox.append(
      h('pre', { class: 'error-excerpt mono', 'aria-label': 'where the error is' },
        lines.map((l, i) => h('span', { class: i === lines.length - 1 ? 'excerpt-line excerpt-hit' : 'excerpt-line' }, `${l}\n`)),
        h('span', { class: 'excerpt-line' }, caret.slice(0, caret.indexOf('|') + 1)),
        h('span', { class: 'excerpt-caret' }, caret.slice(caret.indexOf('|') + 1)),
      ),
    );
  }
}

/**
 * A few lines of the SQL around the error with a caret under the column:
 *   1 | SELEC 1
 *     | ^
 * Long lines are windowed around the column; tabs become one space so the caret lines up
 * (the parser counts a tab as one column).
 */
export function errorExcerpt(sql, line, column) {
  const lines = sql.split('\n');
  const li = Math.min(Math.max(1, line), lines.length) - 1;
  const width = String(li + 1).length;
  const out = [];
  const windowed = (text) => {
    const clean = text.replace(/\t/g, ' ').replace(/\r$/, '');
    let start = 0;
    if (clean.length > 100 && column > 60) start = column - 50;
    const shown = (start > 0 ? '…' : '') + clean.slice(start, start + 100) + (clean.length > start + 100 ? '…' : '');
    return { shown, shift: start > 0 ? start - 1 : 0 };
  };
  const target = windowed(lines[li]);
  if (li > 0) out.push(`${String(li).padStart(width)} | ${windowed(lines[li - 1]).shown}`);
  out.push(`${String(li + 1).padStart(width)} | ${target.shown}`);
  const col = Math.max(1, column - target.shift);
  out.push(`${' '.repeat(width)} | ${' '.repeat(col - 1)}^`);
  return out.join('\n');
}

/** Character offset of (line, column), both 1-based, clamped into the text. */
export function offsetOf(text, line, column) {
  const lines = text.split('\n');
  const li = Math.min(Math.max(1, line), lines.length) - 1;
  let off = 0;
  for (let i = 0; i < li; i++) off += lines[i].length + 1;
  return off + Math.min(Math.max(0, column - 1), lines[li].length);
}

function moveCursor(err) {
  const ed = view.editor;
  const off = (err.base || 0) + offsetOf(err.sql, err.position.line, err.position.column);
  if (off > ed.value.length) return;
  ed.focus();
  // Select the token at the error so it stands out, leaving the cursor at its start otherwise.
  const m = /^[\w$]+/.exec(ed.value.slice(off));
  ed.setSelectionRange(off, m ? off + m[0].length : off);
}

function goPage(p) {
  const r = state.result;
  if (!r) return;
  const last = Math.max(0, Math.ceil(r.rows.length / PAGE_SIZE) - 1);
  state.page = Math.min(Math.max(0, p), last);
  renderTable();
  view.results.scrollTop = 0;
}

function renderTable() {
  const v = view;
  const r = state.result;
  v.results.replaceChildren();
  if (!r) {
    v.pager.hidden = true;
    v.results.append(
      h('div', { class: 'empty' }, state.running ? 'Running…' : state.error ? 'No result.' : 'Run a statement to see its result here.'),
    );
    return;
  }
  if (!r.columns.length) {
    v.pager.hidden = true;
    v.results.append(h('div', { class: 'empty' }, 'Statement executed. It returns no rows.'));
    return;
  }
  const total = r.rows.length;
  const start = state.page * PAGE_SIZE;
  const end = Math.min(total, start + PAGE_SIZE);
  v.pager.hidden = total === 0;
  v.pageInfo.textContent = total ? `rows ${start + 1}-${end} of ${total}` : '';
  v.prevBtn.disabled = state.page === 0;
  v.nextBtn.disabled = end >= total;

  const kinds = r.columns.map((c) => columnKind(c.type));
  const thead = h('thead', null,
    h('tr', null, r.columns.map((c, i) =>
      h('th', { class: kinds[i] === 'number' ? 'num' : null, scope: 'col', title: c.type ? `${c.name}: ${c.type}` : c.name },
        h('div', { class: 'col-name' }, c.name),
        h('div', { class: 'col-type' }, c.type || ''),
      ),
    )),
  );
  // Only the current page is ever built: results can hold 100,000 rows.
  const tbody = document.createElement('tbody');
  for (let i = start; i < end; i++) {
    const row = r.rows[i];
    const tr = document.createElement('tr');
    for (let j = 0; j < r.columns.length; j++) tr.append(cell(row[r.columns[j].name], kinds[j]));
    tbody.append(tr);
  }
  const table = h('table', { class: 'data-table' }, thead, tbody);
  v.results.append(table);
  if (total === 0) v.results.append(h('div', { class: 'empty empty-small' }, 'No rows.'));
}

function cell(value, kind) {
  const td = document.createElement('td');
  if (value === null || value === undefined) {
    td.className = 'null';
    td.textContent = 'NULL';
    return td;
  }
  let text;
  if (typeof value === 'object') text = JSON.stringify(value);
  else text = String(value);
  if (kind === 'number' || typeof value === 'number') td.className = 'num';
  else if (kind === 'time') td.className = 'time';
  else if (typeof value === 'boolean') td.className = 'bool';
  td.textContent = text;
  if (text.length > 60) td.title = text;
  return td;
}

// ---------------------------------------------------------------------------------------------
// Chart

/**
 * What to chart for a result, or null: a line per numeric column over the first time column,
 * else bars of the first numeric column per value of the first text column.
 */
export function chartSpec(columns, rows) {
  if (!columns || !rows || !rows.length) return null;
  const kinds = columns.map((c) => columnKind(c.type));
  const timeIdx = kinds.indexOf('time');
  const numIdx = kinds.map((k, i) => (k === 'number' ? i : -1)).filter((i) => i >= 0);
  if (!numIdx.length) return null;
  if (timeIdx >= 0) {
    const tname = columns[timeIdx].name;
    const x = rows.map((r) => parseTime(r[tname]));
    if (x.some(Number.isFinite)) {
      const used = numIdx.slice(0, MAX_SERIES).map((i) => columns[i].name);
      return {
        kind: 'line',
        title: `${used.join(', ')} by ${tname}`,
        note: numIdx.length > MAX_SERIES ? `first ${MAX_SERIES} of ${numIdx.length} numeric columns` : '',
        data: { x, series: used.map((name) => ({ name, values: rows.map((r) => toNumber(r[name])) })) },
      };
    }
  }
  const catIdx = kinds.indexOf('string');
  if (catIdx >= 0) {
    const cname = columns[catIdx].name;
    const vname = columns[numIdx[0]].name;
    const shown = rows.slice(0, MAX_BARS);
    return {
      kind: 'bar',
      title: `${vname} by ${cname}`,
      note: rows.length > MAX_BARS ? `first ${MAX_BARS} of ${rows.length} rows` : '',
      data: { labels: shown.map((r) => r[cname]), values: shown.map((r) => toNumber(r[vname])), name: vname },
    };
  }
  return null;
}

function renderChart() {
  const v = view;
  const r = state.result;
  const spec = r ? chartSpec(r.columns, r.rows) : null;
  const old = v.chartCard.querySelector('canvas');
  if (old) old.remove();
  v.chartCard.hidden = !spec;
  if (!spec) return;
  v.chartTitle.replaceChildren(
    h('span', null, spec.kind === 'line' ? 'Line chart' : 'Bar chart'),
    h('span', { class: 'card-sub' }, spec.title),
  );
  if (spec.note) v.chartTitle.append(h('span', { class: 'card-note' }, spec.note));
  // A fresh canvas per result: the id only exists while a chart applies.
  const canvas = h('canvas', { id: 'sql-chart', class: 'chart-canvas', role: 'img', 'aria-label': `${spec.kind} chart of ${spec.title}` });
  v.chartCard.append(canvas);
  if (spec.kind === 'line') lineChart(canvas, spec.data, { utc: true });
  else barChart(canvas, spec.data);
}
