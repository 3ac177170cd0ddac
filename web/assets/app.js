// Entry module: session check, login form, hash routing between the pages.

import * as api from './api.js';
import { h } from './api.js';
import * as sqlPage from './sql.js';
import * as catalogPage from './catalog.js';
import * as livePage from './live.js';
import * as alertsPage from './alerts.js';
import * as clusterPage from './cluster.js';

const ROUTES = {
  sql: { title: 'SQL', page: sqlPage },
  catalog: { title: 'Catalog', page: catalogPage },
  live: { title: 'Live', page: livePage },
  alerts: { title: 'Alerts', page: alertsPage },
  cluster: { title: 'Cluster', page: clusterPage },
};
const DEFAULT_ROUTE = 'sql';

const main = document.getElementById('app');
const userArea = document.getElementById('user-area');

let session = { auth_required: false, user: null };
let current = null; // {name, instance: {unmount?, update?}}
let loginShown = false;

/** "#/catalog/db/t" -> {name: "catalog", sub: "db/t"}. */
export function parseHash(hash) {
  const m = /^#\/([^/?#]*)(?:\/(.*))?$/.exec(hash || '');
  return { name: m ? m[1] : '', sub: m && m[2] ? m[2] : '' };
}

function unmountCurrent() {
  if (current && current.instance && current.instance.unmount) {
    try {
      current.instance.unmount();
    } catch (e) {
      console.error('unmounting the page failed', e);
    }
  }
  current = null;
}

function markNav(name) {
  for (const a of document.querySelectorAll('.nav a[data-route]')) {
    const on = a.dataset.route === name;
    a.classList.toggle('active', on);
    if (on) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

function route() {
  if (loginShown) return;
  let { name, sub } = parseHash(location.hash);
  if (!ROUTES[name]) {
    name = DEFAULT_ROUTE;
    sub = '';
    // replaceState: the bare URL should not leave a history entry to go "back" to.
    history.replaceState(null, '', `#/${name}`);
  }
  markNav(name);
  document.title = `${ROUTES[name].title} · Sluice`;
  if (current && current.name === name && current.instance.update) {
    current.instance.update(sub);
    return;
  }
  unmountCurrent();
  const root = h('div', { class: 'page-root', dataset: { page: name } });
  main.replaceChildren(root);
  let instance = {};
  try {
    instance = ROUTES[name].page.mount(root, sub) || {};
  } catch (e) {
    console.error(e);
    root.append(h('div', { class: 'card error-box' }, `This page failed to load: ${e.message}`));
  }
  current = { name, instance };
}

function renderUser() {
  userArea.replaceChildren();
  if (!session.auth_required || !session.user || loginShown) return;
  userArea.append(
    h('span', { class: 'user-chip', title: 'Logged in' },
      h('span', { class: 'user-avatar', 'aria-hidden': 'true' }, session.user.slice(0, 1).toUpperCase()),
      h('span', { id: 'user-name' }, session.user),
    ),
    h('a', {
      id: 'logout',
      href: '#',
      class: 'logout-link',
      onclick: async (e) => {
        e.preventDefault();
        try {
          await api.logout();
        } catch {
          // Logged out or not, the form is what the user asked to see.
        }
        session = { auth_required: true, user: null };
        showLogin();
      },
    }, 'Log out'),
  );
}

function showLogin(message = '') {
  if (loginShown) return;
  unmountCurrent();
  loginShown = true;
  document.body.classList.add('logged-out');
  renderUser();
  document.title = 'Log in · Sluice';

  const user = h('input', { id: 'login-user', type: 'text', name: 'username', autocomplete: 'username', required: true, spellcheck: false, autocapitalize: 'off' });
  const password = h('input', { id: 'login-password', type: 'password', name: 'password', autocomplete: 'current-password', required: true });
  const submit = h('button', { id: 'login-submit', type: 'submit', class: 'btn btn-primary btn-block' }, 'Log in');
  const error = h('div', { id: 'login-error', class: 'form-error', role: 'alert', hidden: !message }, message);

  const form = h('form', { class: 'login-card card', novalidate: true },
    h('div', { class: 'login-brand' }, h('span', { class: 'logo-mark login-logo', 'aria-hidden': 'true' }), h('span', null, 'Sluice')),
    h('p', { class: 'muted login-sub' }, 'Log in to the console'),
    h('label', { class: 'field' }, h('span', { class: 'field-label' }, 'User'), user),
    h('label', { class: 'field' }, h('span', { class: 'field-label' }, 'Password'), password),
    error,
    submit,
  );
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.hidden = true;
    if (!user.value.trim()) {
      error.textContent = 'Please enter a user name.';
      error.hidden = false;
      return;
    }
    submit.disabled = true;
    try {
      await api.login(user.value.trim(), password.value);
      let s = null;
      try {
        s = await api.getSession();
      } catch {
        // The cookie is set; the name typed is good enough for the header.
      }
      session = s && s.user ? s : { auth_required: true, user: user.value.trim() };
      hideLogin();
    } catch (err) {
      error.textContent = err.status === 401 ? 'wrong user or password' : `Cannot log in: ${err.message}`;
      error.hidden = false;
      password.select();
    } finally {
      submit.disabled = false;
    }
  });
  main.replaceChildren(h('div', { class: 'login-wrap' }, form));
  user.focus();
}

function hideLogin() {
  loginShown = false;
  document.body.classList.remove('logged-out');
  renderUser();
  route();
}

async function start() {
  // Any API call answering 401 means the session is gone: show the form instead of the page.
  api.onUnauthorized(() => {
    session = { auth_required: true, user: null };
    showLogin();
  });
  window.addEventListener('hashchange', route);
  try {
    session = await api.getSession();
  } catch {
    // Server unreachable: show the page anyway; its own calls will say what is wrong.
    session = { auth_required: false, user: null };
  }
  if (session.auth_required && !session.user) showLogin();
  else {
    renderUser();
    route();
  }
}

start();
