// The Catalog page: databases and their tables, and for a chosen table its columns and
// partitions. Everything comes from SQL (system.tables, system.partitions, DESCRIBE).

import * as api from './api.js';
import { h, formatInt, formatBytes, formatDuration, quoteIdent, quoteString, toNumber } from './api.js';
import { openInEditor } from './sql.js';

const MAX_PARTITIONS_SHOWN = 500;
const SYSTEM_TABLES = ['tables', 'partitions', 'files', 'dead_letters', 'alerts', 'bridges'];

/** "#/catalog/<db>/<table>" for a table; names are URI-encoded so any character survives. */
export function tableHash(db, table) {
  return `#/catalog/${encodeURIComponent(db)}/${encodeURIComponent(table)}`;
}

/** {db, table} from the part of the hash after "#/catalog/", or null. */
export function parseSub(sub) {
  if (!sub) return null;
  const parts = sub.split('/');
  if (parts.length !== 2 || !parts[0] || !parts[1]) return null;
  try {
    return { db: decodeURIComponent(parts[0]), table: decodeURIComponent(parts[1]) };
  } catch {
    return null;
  }
}

/** "2016-01-01T00:00:00.000000" as "2016-01-01 00:00:00" (whole seconds read better here). */
function shortTime(v) {
  if (v === null || v === undefined) return '-';
  return String(v).replace('T', ' ').replace(/\.0+(?=$|Z|[+-])/, '').replace(/Z$/, '');
}

export function mount(root, sub) {
  const summary = h('span', { id: 'catalog-summary', class: 'muted' });
  const refreshBtn = h('button', { id: 'catalog-refresh', class: 'btn', type: 'button' }, '↻ Refresh');
  const list = h('div', { id: 'catalog-tables', class: 'catalog-list' }, h('div', { class: 'card empty' }, 'Loading…'));
  const detail = h('div', { id: 'catalog-detail', class: 'catalog-detail' });

  root.append(
    h('section', { class: 'page page-catalog' },
      h('div', { class: 'page-head' }, h('h1', null, 'Catalog'), summary, h('span', { class: 'spacer' }), refreshBtn),
      h('div', { class: 'catalog-grid' }, list, detail),
    ),
  );

  let stopped = false;
  let selected = parseSub(sub);
  let loadSeq = 0; // answers of an older click must not overwrite a newer one

  async function loadList() {
    refreshBtn.disabled = true;
    const [tablesRes, dbsRes] = await Promise.allSettled([
      api.sql('SELECT * FROM system.tables ORDER BY database_name, table_name'),
      api.sql('SHOW DATABASES'),
    ]);
    refreshBtn.disabled = false;
    if (stopped) return;
    if (tablesRes.status === 'rejected') {
      list.replaceChildren(h('div', { class: 'card error-box' }, `Cannot read system.tables: ${tablesRes.reason.message}`));
      summary.textContent = '';
      return;
    }
    const tables = tablesRes.value.rows;
    const names = new Set(tables.map((t) => String(t.database_name)));
    if (dbsRes.status === 'fulfilled') {
      for (const r of dbsRes.value.rows) {
        const n = r.database_name ?? Object.values(r)[0];
        if (n != null && n !== 'system') names.add(String(n));
      }
    }
    renderList([...names].sort(), tables);
  }

  function renderList(dbs, tables) {
    const totalRows = tables.reduce((s, t) => s + (toNumber(t.rows) || 0), 0);
    const totalBytes = tables.reduce((s, t) => s + (toNumber(t.bytes) || 0), 0);
    summary.textContent = `${dbs.length} ${dbs.length === 1 ? 'database' : 'databases'} · ${tables.length} ${tables.length === 1 ? 'table' : 'tables'} · ${formatInt(totalRows)} rows · ${formatBytes(totalBytes)}`;
    list.replaceChildren();
    if (!dbs.length) {
      list.append(h('div', { class: 'card empty' }, 'No databases yet. Create one on the SQL page, e.g. ', h('code', null, 'CREATE DATABASE plant')));
    }
    for (const db of dbs) {
      const mine = tables.filter((t) => String(t.database_name) === db);
      const rows = mine.reduce((s, t) => s + (toNumber(t.rows) || 0), 0);
      const bytes = mine.reduce((s, t) => s + (toNumber(t.bytes) || 0), 0);
      const body = mine.length
        ? h('table', { class: 'data-table compact' },
            h('thead', null, h('tr', null,
              h('th', null, 'Table'), h('th', { class: 'num' }, 'Rows'), h('th', { class: 'num' }, 'Size'),
              h('th', { class: 'num', title: 'partitions' }, 'Parts'), h('th', { class: 'num' }, 'Files'),
            )),
            h('tbody', null, mine.map((t) => {
              const name = String(t.table_name);
              const full = `${db}.${name}`;
              return h('tr', { class: isSelected(db, name) ? 'selected' : null },
                h('td', null, h('a', { class: 'table-link', href: tableHash(db, name), dataset: { table: full, db, name } }, name)),
                h('td', { class: 'num' }, formatInt(t.rows)),
                h('td', { class: 'num' }, formatBytes(t.bytes)),
                h('td', { class: 'num' }, formatInt(t.partitions)),
                h('td', { class: 'num' }, formatInt(t.files)),
              );
            })),
          )
        : h('div', { class: 'empty empty-small' }, 'No tables.');
      list.append(
        h('section', { class: 'card db-group', dataset: { database: db } },
          h('div', { class: 'card-title' },
            h('span', { class: 'db-name' }, h('span', { class: 'db-icon', 'aria-hidden': 'true' }, '◆'), db),
            h('span', { class: 'card-sub' }, `${mine.length} ${mine.length === 1 ? 'table' : 'tables'} · ${formatInt(rows)} rows · ${formatBytes(bytes)}`),
          ),
          body,
        ),
      );
    }
    list.append(
      h('section', { class: 'card db-group db-system' },
        h('div', { class: 'card-title' },
          h('span', { class: 'db-name' }, h('span', { class: 'db-icon', 'aria-hidden': 'true' }, '◇'), 'system'),
          h('span', { class: 'card-sub' }, 'catalog and storage state as SQL tables'),
        ),
        h('div', { class: 'system-links' },
          SYSTEM_TABLES.map((t) =>
            h('button', { type: 'button', class: 'link-button mono', title: `Query system.${t} on the SQL page`, onclick: () => openSql(`SELECT * FROM system.${t}`) }, `system.${t}`),
          ),
        ),
      ),
    );
  }

  function isSelected(db, table) {
    return !!selected && selected.db === db && selected.table === table;
  }

  function markSelected() {
    for (const tr of list.querySelectorAll('tbody tr')) {
      const a = tr.querySelector('a.table-link');
      tr.classList.toggle('selected', !!a && isSelected(a.dataset.db, a.dataset.name));
    }
  }

  async function loadDetail() {
    const seq = ++loadSeq;
    markSelected();
    if (!selected) {
      detail.replaceChildren(
        h('div', { class: 'card empty detail-placeholder' },
          h('div', { class: 'placeholder-title' }, 'Select a table'),
          h('div', null, 'Its columns and partitions (rows, size, time range, files) are shown here.'),
        ),
      );
      return;
    }
    const { db, table } = selected;
    const full = `${db}.${table}`;
    detail.replaceChildren(h('div', { class: 'card empty' }, `Loading ${full}…`));
    const [infoRes, colsRes, partsRes] = await Promise.allSettled([
      api.sql(`SELECT * FROM system.tables WHERE database_name = ${quoteString(db)} AND table_name = ${quoteString(table)}`),
      api.sql(`DESCRIBE ${quoteIdent(db)}.${quoteIdent(table)}`),
      api.sql(`SELECT * FROM system.partitions WHERE database_name = ${quoteString(db)} AND table_name = ${quoteString(table)} ORDER BY partition DESC`),
    ]);
    if (stopped || seq !== loadSeq) return;
    const info = infoRes.status === 'fulfilled' ? infoRes.value.rows[0] || null : null;
    const queryBtn = h('button', {
      id: 'catalog-query',
      type: 'button',
      class: 'btn btn-primary',
      onclick: () => openSql(`SELECT *\nFROM ${quoteIdent(db)}.${quoteIdent(table)}\nLIMIT 100`),
    }, 'Query in SQL');

    const chips = info
      ? [
          chip('Rows', formatInt(info.rows)),
          chip('Size', formatBytes(info.bytes)),
          chip('Partitions', formatInt(info.partitions)),
          chip('Files', formatInt(info.files)),
          chip('Partition by', info.partition_by ?? '-', true),
          chip('TTL', info.ttl_seconds == null ? 'none' : formatDuration(info.ttl_seconds)),
        ]
      : [];

    detail.replaceChildren(
      h('section', { class: 'card detail-head' },
        h('div', { class: 'detail-title' },
          h('h2', { id: 'catalog-detail-name', class: 'mono' }, h('span', { class: 'muted' }, `${db}.`), table),
          h('span', { class: 'spacer' }),
          queryBtn,
        ),
        chips.length ? h('div', { class: 'chips' }, chips) : null,
      ),
      h('section', { class: 'card' },
        h('div', { class: 'card-title' }, h('span', null, 'Columns')),
        colsRes.status === 'fulfilled' ? columnsTable(colsRes.value) : errorNote(colsRes.reason),
      ),
      h('section', { class: 'card' },
        h('div', { class: 'card-title' },
          h('span', null, 'Partitions'),
          partsRes.status === 'fulfilled' ? h('span', { class: 'card-sub' }, `${partsRes.value.rows.length} with rows, newest first`) : null,
        ),
        partsRes.status === 'fulfilled' ? partitionsTable(partsRes.value.rows) : errorNote(partsRes.reason),
      ),
    );
  }

  function openSql(text) {
    openInEditor(text);
    location.hash = '#/sql';
  }

  refreshBtn.addEventListener('click', () => {
    loadList();
    loadDetail();
  });

  loadList();
  loadDetail();

  return {
    update(newSub) {
      selected = parseSub(newSub);
      loadDetail();
    },
    unmount() {
      stopped = true;
    },
  };
}

function chip(label, value, mono = false) {
  return h('span', { class: 'chip' }, h('span', { class: 'chip-label' }, label), h('span', { class: mono ? 'chip-value mono' : 'chip-value' }, String(value)));
}

function errorNote(e) {
  return h('div', { class: 'error-box inline' }, e && e.message ? e.message : String(e));
}

function columnsTable(result) {
  const rows = result.rows;
  if (!rows.length) return h('div', { class: 'empty empty-small' }, 'No columns.');
  return h('div', { class: 'table-wrap' },
    h('table', { id: 'catalog-columns', class: 'data-table compact' },
      h('thead', null, h('tr', null, h('th', null, 'Column'), h('th', null, 'Type'), h('th', null, 'Nullable'), h('th', null, 'Partition key'))),
      h('tbody', null, rows.map((r) => {
        const nullable = r.nullable === true || r.nullable === 'true' || r.nullable === 'YES';
        const key = r.partition_key;
        return h('tr', null,
          h('td', { class: 'mono' }, String(r.column_name ?? '-')),
          h('td', { class: 'mono type-cell' }, String(r.data_type ?? '-')),
          h('td', null, nullable ? 'yes' : 'no'),
          h('td', { class: 'mono' }, key === true ? 'yes' : key ? String(key) : ''),
        );
      })),
    ),
  );
}

function partitionsTable(rows) {
  if (!rows.length) return h('div', { class: 'empty empty-small' }, 'No partitions: the table holds no rows yet.');
  const shown = rows.slice(0, MAX_PARTITIONS_SHOWN);
  return h('div', null,
    h('div', { class: 'table-wrap tall' },
      h('table', { id: 'catalog-partitions', class: 'data-table compact' },
        h('thead', null, h('tr', null,
          h('th', { class: 'num' }, 'Partition'),
          h('th', { class: 'num' }, 'Rows'),
          h('th', { class: 'num', title: 'rows still in memory, not yet in Parquet files' }, 'Buffered'),
          h('th', { class: 'num' }, 'Size'),
          h('th', { class: 'num' }, 'Files'),
          h('th', null, 'From'),
          h('th', null, 'To'),
        )),
        h('tbody', null, shown.map((p) =>
          h('tr', null,
            h('td', { class: 'num' }, p.partition == null ? '-' : String(p.partition)),
            h('td', { class: 'num' }, formatInt(p.rows)),
            h('td', { class: 'num' }, formatInt(p.buffered_rows)),
            h('td', { class: 'num' }, formatBytes(p.bytes)),
            h('td', { class: 'num' }, formatInt(p.files)),
            h('td', { class: 'time' }, shortTime(p.min_time)),
            h('td', { class: 'time' }, shortTime(p.max_time)),
          ),
        )),
      ),
    ),
    rows.length > shown.length ? h('div', { class: 'note' }, `first ${MAX_PARTITIONS_SHOWN} of ${rows.length} partitions shown`) : null,
  );
}
