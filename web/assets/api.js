// Talking to the Sluice server, plus the few formatting and DOM helpers every page shares.
//
// The server embeds a fixed set of asset files, so the small shared helpers live here rather
// than in a module of their own.

/** Rows read from one result at most; beyond this the page would only get slower. */
export const MAX_ROWS = 100000;

// ---------------------------------------------------------------------------------------------
// Errors and the 401 hook

let unauthorizedHook = null;

/** Registers the function called whenever the server answers 401 (session missing or expired). */
export function onUnauthorized(fn) {
  unauthorizedHook = fn;
}

/** Reports a lost session found some other way (an event stream the server refused). */
export function notifyUnauthorized() {
  if (unauthorizedHook) unauthorizedHook();
}

/** A failed API call: HTTP status (0 when the server could not be reached), code, message. */
export class ApiError extends Error {
  constructor(status, code, message, position = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    /** {line, column} (both 1-based) when the message names a place in the SQL text. */
    this.position = position;
  }
}

/**
 * The SQL position named in an error message, if any. The parser spells it
 * "Line: 1, Column: 8" and the planner "line 1, column 30"; both are accepted.
 */
export function parseErrorPosition(message) {
  if (typeof message !== 'string') return null;
  const m = /\bline:?\s*(\d+)\s*,\s*column:?\s*(\d+)/i.exec(message);
  if (!m) return null;
  const line = Number(m[1]);
  const column = Number(m[2]);
  return line >= 1 && column >= 1 ? { line, column } : null;
}

async function errorFrom(response, noAuthHook) {
  let code = `http_${response.status}`;
  let message = response.statusText || `HTTP ${response.status}`;
  let text = '';
  try {
    text = await response.text();
  } catch {
    // The body is only a better message; the status alone still says what happened.
  }
  try {
    const body = JSON.parse(text);
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
    }
  } catch {
    if (text.trim()) message = text.trim().slice(0, 2000);
  }
  if (response.status === 401 && !noAuthHook && unauthorizedHook) unauthorizedHook();
  return new ApiError(response.status, code, message, parseErrorPosition(message));
}

/** fetch with the session cookie, turning HTTP and network failures into ApiError. */
async function request(method, path, { body, headers, signal, noAuthHook = false } = {}) {
  let response;
  try {
    // Marked as the console's, so a 401 comes without a Basic challenge (and no browser dialog).
    headers = { ...(headers || {}), 'X-Sluice-Console': '1' };
    response = await fetch(path, { method, body, headers, signal, credentials: 'same-origin' });
  } catch (e) {
    if (e && e.name === 'AbortError') throw e;
    throw new ApiError(0, 'network', `cannot reach the server (${e && e.message ? e.message : e})`);
  }
  if (!response.ok) throw await errorFrom(response, noAuthHook);
  return response;
}

async function jsonBody(response) {
  if (response.status === 204) return null;
  const text = await response.text();
  if (!text.trim()) return null;
  try {
    return JSON.parse(text);
  } catch {
    throw new ApiError(response.status, 'bad_response', 'the server sent a response that is not JSON');
  }
}

/** GET a JSON document. */
export async function getJson(path, opts = {}) {
  return jsonBody(await request('GET', path, opts));
}

/** POST a JSON body; returns the parsed answer (null for an empty body such as 201/204). */
export async function postJson(path, data, opts = {}) {
  const headers = { 'Content-Type': 'application/json' };
  return jsonBody(await request('POST', path, { ...opts, headers, body: JSON.stringify(data) }));
}

/** DELETE a resource. */
export async function del(path, opts = {}) {
  return jsonBody(await request('DELETE', path, opts));
}

/**
 * Runs `load` now and every `ms` milliseconds until `stop()`, never two at once (a slow
 * answer is not overtaken). `load(live)` gets a function that says whether the poller still
 * runs, so an answer arriving after `stop()` is dropped. `now()` runs it at once.
 */
export function poll(ms, load) {
  let stopped = false;
  let inFlight = false;
  const live = () => !stopped;
  const now = async () => {
    if (stopped || inFlight) return;
    inFlight = true;
    try {
      await load(live);
    } finally {
      inFlight = false;
    }
  };
  const timer = setInterval(now, ms);
  now();
  return {
    now,
    stop() {
      stopped = true;
      clearInterval(timer);
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Session

/**
 * {auth_required, user}. A server without the session endpoint (404) is taken as one that
 * needs no login, so the console still works against it.
 */
export async function getSession() {
  try {
    const s = await getJson('/v1/session', { noAuthHook: true });
    return { auth_required: !!(s && s.auth_required), user: (s && s.user) || null };
  } catch (e) {
    if (e.status === 404 || e.status === 405) return { auth_required: false, user: null };
    if (e.status === 401) return { auth_required: true, user: null };
    throw e;
  }
}

/** Logs in; a wrong password rejects with an ApiError of status 401 (without the 401 hook). */
export function login(user, password) {
  return postJson('/v1/session', { user, password }, { noAuthHook: true });
}

export function logout() {
  return del('/v1/session', { noAuthHook: true });
}

// ---------------------------------------------------------------------------------------------
// SQL

/** A statement as {columns, rows, elapsedMs, truncated}, read from the JSON-lines encoding. */
export async function sql(text, { maxRows = MAX_ROWS, signal, onProgress } = {}) {
  const started = performance.now();
  const response = await request('POST', '/v1/sql?format=jsonl', {
    body: text,
    headers: { 'Content-Type': 'text/plain; charset=utf-8' },
    signal,
  });
  let columns = parseColumnsHeader(response.headers.get('x-sluice-columns'));
  const firstBatchUs = Number(response.headers.get('x-sluice-first-batch-us')) || null;
  const { rows, truncated } = await readJsonLines(response, maxRows, signal, onProgress);
  const elapsedMs = performance.now() - started;
  // Without the header (an older server) the names come from the rows and the types are guessed.
  if (!columns) columns = inferColumns(rows);
  return { columns, rows, elapsedMs, truncated, firstBatchUs };
}

/** A statement's result in another encoding (csv, json, parquet...) as a Blob. */
export async function sqlBlob(text, format = 'csv', { signal } = {}) {
  const response = await request('POST', `/v1/sql?format=${encodeURIComponent(format)}`, {
    body: text,
    headers: { 'Content-Type': 'text/plain; charset=utf-8' },
    signal,
  });
  return response.blob();
}

/**
 * Reads JSON lines incrementally so a large result never sits in memory as one string, and so
 * reading can stop at maxRows: the reader is cancelled, which closes the connection.
 */
async function readJsonLines(response, maxRows, signal, onProgress) {
  const rows = [];
  let truncated = false;
  const parseLine = (line) => {
    try {
      rows.push(JSON.parse(line));
    } catch {
      throw new ApiError(response.status, 'bad_response', `row ${rows.length + 1} is not valid JSON`);
    }
  };
  if (!response.body || !response.body.getReader) {
    for (const line of (await response.text()).split('\n')) {
      if (!line.trim()) continue;
      if (rows.length >= maxRows) {
        truncated = true;
        break;
      }
      parseLine(line);
    }
    return { rows, truncated };
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let lastProgress = 0;
  try {
    reading: for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        if ((e && e.name === 'AbortError') || (signal && signal.aborted)) throw e;
        // The server can only cut the body short once rows have been sent (a failure mid-query).
        throw new ApiError(0, 'stream_cut', `the result was cut short after ${rows.length} rows; the query failed while streaming (see the server log)`);
      }
      const { done, value } = chunk;
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let start = 0;
      let nl;
      while ((nl = buffer.indexOf('\n', start)) !== -1) {
        const line = buffer.slice(start, nl);
        start = nl + 1;
        if (!line.trim()) continue;
        // One more row than allowed proves there is more: only then is the result "truncated".
        if (rows.length >= maxRows) {
          truncated = true;
          break reading;
        }
        parseLine(line);
      }
      buffer = buffer.slice(start);
      if (done) {
        if (buffer.trim()) {
          if (rows.length >= maxRows) truncated = true;
          else parseLine(buffer);
        }
        break;
      }
      if (onProgress && rows.length - lastProgress >= 1000) {
        lastProgress = rows.length;
        onProgress(rows.length);
      }
    }
  } finally {
    if (truncated) reader.cancel().catch(() => {});
  }
  return { rows, truncated };
}

/**
 * The x-sluice-columns header: a JSON array of {name, type}. Browsers read header bytes as
 * Latin-1, so a UTF-8 type name such as "Timestamp(µs, ...)" arrives garbled; it is decoded
 * again as UTF-8 when that works.
 */
export function parseColumnsHeader(value) {
  if (value == null || value === '') return null;
  let text = value;
  if (/[\u0080-\u00ff]/.test(text) && !/[^\u0000-\u00ff]/.test(text)) {
    try {
      const bytes = Uint8Array.from(text, (c) => c.charCodeAt(0));
      text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    } catch {
      // Not UTF-8 after all: keep the text as the browser gave it.
    }
  }
  try {
    const cols = JSON.parse(text);
    if (!Array.isArray(cols)) return null;
    return cols.map((c) =>
      typeof c === 'string' ? { name: c, type: '' } : { name: String(c.name), type: String(c.type ?? c.data_type ?? '') },
    );
  } catch {
    return null;
  }
}

const TIME_TEXT = /^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?$/;

/** Column names and guessed Arrow type names from the rows themselves. */
export function inferColumns(rows) {
  if (!rows.length) return [];
  const names = Object.keys(rows[0]);
  return names.map((name) => {
    let type = 'Null';
    for (let i = 0; i < rows.length && i < 200; i++) {
      const v = rows[i][name];
      if (v === null || v === undefined) continue;
      if (typeof v === 'number') type = Number.isInteger(v) ? 'Int64' : 'Float64';
      else if (typeof v === 'boolean') type = 'Boolean';
      else if (typeof v === 'string') type = TIME_TEXT.test(v) ? (v.length === 10 ? 'Date32' : 'Timestamp') : 'Utf8';
      else type = 'Struct';
      if (type !== 'Int64') break; // a later float would otherwise be missed
    }
    return { name, type };
  });
}

/** What a column holds, from its Arrow type name: time, number, string, bool or other. */
export function columnKind(type) {
  const t = String(type || '').trim();
  if (/^(timestamp|date)/i.test(t)) return 'time';
  if (/^(u?int\d*|float\d*|decimal|double|real)/i.test(t)) return 'number';
  if (/^(utf8|largeutf8|utf8view|string|dictionary\(.*utf8)/i.test(t)) return 'string';
  if (/^bool/i.test(t)) return 'bool';
  return 'other';
}

// ---------------------------------------------------------------------------------------------
// SQL text helpers

/** An identifier quoted for SQL: "my ""odd"" name". */
export function quoteIdent(name) {
  return `"${String(name).replace(/"/g, '""')}"`;
}

/** A string literal for SQL: 'it''s'. */
export function quoteString(value) {
  return `'${String(value).replace(/'/g, "''")}'`;
}

// ---------------------------------------------------------------------------------------------
// Values

/** A number from a JSON value: numbers as they are, numeric strings parsed, anything else null. */
export function toNumber(v) {
  if (typeof v === 'number') return Number.isFinite(v) ? v : null;
  if (typeof v === 'string' && v.trim() !== '') {
    const n = Number(v);
    return Number.isFinite(n) ? n : null;
  }
  if (typeof v === 'bigint') return Number(v);
  return null;
}

/** 12,345 (or "-" when there is no number). */
export function formatInt(v) {
  const n = toNumber(v);
  if (n === null) return '-';
  return Math.round(n).toLocaleString('en-US');
}

/** 1.5 KiB, 12.3 MiB (binary units, as storage sizes are). */
export function formatBytes(v) {
  const n = toNumber(v);
  if (n === null) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let x = Math.abs(n);
  let u = 0;
  while (x >= 1024 && u < units.length - 1) {
    x /= 1024;
    u++;
  }
  const text = u === 0 ? String(Math.round(x)) : x >= 100 ? x.toFixed(0) : x.toFixed(1);
  return `${n < 0 ? '-' : ''}${text} ${units[u]}`;
}

/** 45 s, 12 min, 3 h, 2 d: a duration in seconds, short. */
export function formatDuration(seconds) {
  const s = toNumber(seconds);
  if (s === null) return '-';
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

const pad2 = (n) => String(n).padStart(2, '0');

/** Local wall-clock time of an epoch-ms value, "2024-05-01 13:04:05". */
export function formatLocalTime(ms) {
  const n = toNumber(ms);
  if (n === null) return '-';
  const d = new Date(n);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

/** "3 s ago", "5 min ago" relative to now. */
export function formatAgo(ms, now = Date.now()) {
  const n = toNumber(ms);
  if (n === null) return '-';
  const s = Math.max(0, (now - n) / 1000);
  if (s < 1) return 'just now';
  return `${formatDuration(s)} ago`;
}

// ---------------------------------------------------------------------------------------------
// DOM

const PROPS = new Set(['value', 'checked', 'disabled', 'hidden', 'selected', 'readOnly', 'spellcheck', 'type', 'htmlFor']);

/**
 * Builds an element. Text is always set as text (never parsed as HTML) because most of what
 * the console shows (names, SQL, error messages) comes from users.
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined) continue;
    if (PROPS.has(k)) el[k] = v; // before the `false` check: spellcheck=false must be set
    else if (v === false) continue;
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  appendChildren(el, children);
  return el;
}

function appendChildren(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) appendChildren(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}
