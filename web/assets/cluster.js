// The Cluster page: the nodes and the raft groups as the server's node sees them (from
// GET /v1/cluster, every two seconds), moving a shard's leadership, adding and removing nodes.

import * as api from './api.js';
import { h, formatInt, toNumber } from './api.js';

const REFRESH_MS = 2000;

const SHARD_COLUMNS = [
  ['shard', 'Group'],
  ['replicas', 'Placed on'],
  ['voters', 'Voters'],
  ['leader', 'Leader'],
  ['preferred_leader', 'Preferred'],
  ['term', 'Term'],
  ['state', 'Here'],
  ['commit_index', 'Commit'],
  ['applied_index', 'Applied'],
  ['snapshot_index', 'Snapshot'],
  ['purged_index', 'Purged'],
  ['lag', 'Lag'],
];

export function mount(root) {
  const status = h('span', { id: 'cluster-status', class: 'muted' });
  const nodesWrap = h('div', { id: 'cluster-nodes', class: 'table-wrap' }, h('div', { class: 'empty' }, 'Loading…'));
  const shardsWrap = h('div', { id: 'cluster-shards', class: 'table-wrap' });
  const message = h('div', { id: 'cluster-message', class: 'muted' });
  const addId = h('input', { id: 'cluster-add-id', type: 'number', min: '1', placeholder: 'node id', class: 'mono' });
  const addAddr = h('input', { id: 'cluster-add-address', type: 'text', placeholder: 'host:port (node-to-node)', class: 'mono', spellcheck: false });
  const addBtn = h('button', { id: 'cluster-add', class: 'btn', type: 'button' }, 'Add node');

  root.append(
    h('section', { class: 'page page-cluster' },
      h('div', { class: 'page-head' }, h('h1', null, 'Cluster'), h('span', { class: 'spacer' }), status),
      h('p', { class: 'page-note' },
        'Nodes and raft groups as this node sees them. A new node starts with ',
        h('code', null, 'join = true'),
        ' and is added here; a shard leader moves to the chosen replica once it has every entry.',
      ),
      h('section', { class: 'card' }, h('h2', null, 'Nodes'), nodesWrap,
        h('div', { class: 'form-actions' }, addId, addAddr, addBtn), message),
      h('section', { class: 'card' }, h('h2', null, 'Groups'), shardsWrap),
    ),
  );

  let busy = false; // a change is under way: its buttons stay disabled

  function say(text, error = false) {
    message.textContent = text;
    message.classList.toggle('text-error', error);
  }

  async function load(live) {
    try {
      const view = await api.getJson('/v1/cluster');
      if (!live()) return;
      renderNodes(view.nodes || []);
      renderShards(view.shards || []);
      status.textContent = `node ${view.node_id} · updated ${new Date().toLocaleTimeString()}`;
      status.classList.remove('text-error');
    } catch (e) {
      if (!live()) return;
      if (e.status === 404) {
        nodesWrap.replaceChildren(h('div', { class: 'empty' }, 'This server is a single node (no [cluster] section).'));
        shardsWrap.replaceChildren();
        status.textContent = '';
      } else {
        status.textContent = `Cannot read the cluster state: ${e.message}`;
        status.classList.add('text-error');
      }
    }
  }

  async function change(what, run) {
    if (busy) return;
    busy = true;
    for (const b of root.querySelectorAll('button')) b.disabled = true;
    say(`${what}…`);
    try {
      const r = await run();
      say(`${what}: ${r}`);
    } catch (e) {
      say(`${what} failed: ${e.message}`, true);
    } finally {
      // A select left focused would hold its table still (see renderShards).
      if (document.activeElement && document.activeElement.tagName === 'SELECT') document.activeElement.blur();
      busy = false;
      for (const b of root.querySelectorAll('button')) b.disabled = false;
      poller.now();
    }
  }

  function renderNodes(nodes) {
    const rows = nodes.map((n) => h('tr', { dataset: { node: String(n.node_id) } },
      h('td', null, String(n.node_id), n.this_node ? h('span', { class: 'muted' }, ' (this node)') : null),
      h('td', null, n.address || ''),
      h('td', { class: `state state-${n.state}` }, n.state || ''),
      h('td', { class: 'num' }, formatInt(n.replicas)),
      h('td', { class: 'num' }, formatInt(n.groups_led)),
      h('td', null, n.state === 'leaving' ? null : h('button', {
        class: 'btn btn-small', type: 'button', dataset: { remove: String(n.node_id) },
        onclick: () => {
          if (!window.confirm(`Remove node ${n.node_id}? Its replicas move to the other nodes.`)) return;
          change(`Removing node ${n.node_id}`, async () => {
            const r = await api.del(`/v1/cluster/nodes/${n.node_id}`);
            return r && r.done === false ? 'committed; replicas still moving' : 'done';
          });
        },
      }, 'Remove')),
    ));
    nodesWrap.replaceChildren(h('table', { class: 'data-table' },
      h('thead', null, h('tr', null, ...['Node', 'Address', 'State', 'Voter of', 'Groups led', ''].map((t) => h('th', null, t)))),
      h('tbody', null, ...rows)));
  }

  function renderShards(shards) {
    const rows = shards.map((s) => {
      const replicas = String(s.replicas || '').split(',').filter(Boolean);
      const pick = h('select', { dataset: { shard: s.shard } },
        ...replicas.map((r) => h('option', { value: r, selected: String(s.preferred_leader) === r }, `node ${r}`)));
      const move = s.shard === 'meta' ? null : h('button', {
        class: 'btn btn-small', type: 'button', dataset: { move: s.shard },
        onclick: () => {
          const n = Number(pick.value);
          const shard = s.shard.replace(/^shard-/, '');
          change(`Moving ${s.shard} to node ${n}`, async () => {
            const r = await api.postJson(`/v1/cluster/shards/${shard}/leader`, { node: n });
            return r.moved ? `led by node ${r.leader}` : 'preferred leader set; not moved yet';
          });
        },
      }, 'Move leader');
      return h('tr', { dataset: { shard: s.shard } },
        ...SHARD_COLUMNS.map(([k]) => h('td', { class: typeof s[k] === 'number' ? 'num' : null, dataset: { col: k } },
          s[k] === null || s[k] === undefined ? '-' : (typeof s[k] === 'number' ? formatInt(toNumber(s[k])) : String(s[k])))),
        h('td', null, s.shard === 'meta' ? null : pick, move));
    });
    // Keep a choice the user is making: only redraw when no select has focus.
    if (shardsWrap.contains(document.activeElement) && document.activeElement.tagName === 'SELECT') return;
    shardsWrap.replaceChildren(h('table', { class: 'data-table' },
      h('thead', null, h('tr', null, ...SHARD_COLUMNS.map(([, t]) => h('th', null, t)), h('th', null, 'Leadership'))),
      h('tbody', null, ...rows)));
  }

  addBtn.addEventListener('click', () => {
    const id = Number(addId.value);
    const address = addAddr.value.trim();
    if (!Number.isInteger(id) || id < 1 || !address) {
      say('A node needs a positive id and its node-to-node host:port.', true);
      return;
    }
    change(`Adding node ${id}`, async () => {
      const r = await api.postJson('/v1/cluster/nodes', { node: id, address });
      return r.done ? 'done' : 'committed; replicas still moving';
    });
  });

  const poller = api.poll(REFRESH_MS, load);
  return {
    unmount() {
      poller.stop();
    },
  };
}
