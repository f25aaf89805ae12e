// The walpost console: plain JavaScript, no framework, no build step; served by the admin
// listener with a strict Content-Security-Policy (no inline script or style).
//
// Rules this file keeps:
// - every text from the API is set with textContent (el() below), never as HTML;
// - the token lives in this tab's sessionStorage only and is sent as the bearer header;
//   no cookie is read or written;
// - actions (buttons that POST or DELETE) are shown to operators only, each behind a
//   confirmation; a refusal shows the API's error and hint.
'use strict';

(function () {
  const TOKEN_KEY = 'walpost.console.token';
  const SAMPLE_MS = 10 * 1000;
  const WINDOW_MS = 60 * 60 * 1000;
  const RING_SIZE = WINDOW_MS / SAMPLE_MS;
  const SVG = 'http://www.w3.org/2000/svg';

  const app = {
    token: null,
    who: null, // {name, role}
    mode: null, // 'relay' | 'inbox'
    status: null, // the relay's last status
    samples: [], // the relay's lag, one sample every SAMPLE_MS, the last hour
    timers: [],
  };

  const main = () => document.getElementById('main');
  const canAct = () => app.who && app.who.role === 'operator';

  // An element with properties and children; strings become text nodes.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = String(v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // Replaces a node's children; arrays are flattened, null, undefined and false left out.
  function put(node, ...children) {
    node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function shown(v) {
    if (v === null || v === undefined || v === '') return '—';
    if (typeof v === 'boolean') return v ? 'yes' : 'no';
    if (Array.isArray(v)) return v.map(shown).join(', ');
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  }

  function bytes(n) {
    if (n === null || n === undefined) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = n;
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return i === 0 ? n + ' B' : v.toFixed(1) + ' ' + units[i] + ' (' + n + ' B)';
  }

  function seconds(s) {
    if (s === null || s === undefined) return '—';
    if (s < 120) return s.toFixed(1) + ' s';
    if (s < 7200) return (s / 60).toFixed(1) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }

  // ---- The API ----

  class ApiFailure extends Error {
    constructor(status, error, hint) {
      super(error);
      this.status = status;
      this.hint = hint;
    }
  }

  async function api(method, path, body) {
    const init = { method, headers: { Authorization: 'Bearer ' + app.token }, cache: 'no-store', credentials: 'omit' };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new ApiFailure(0, 'cannot reach walpost (' + e.message + ')', 'check that walpost runs and that this is its [admin] addr');
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!res.ok) {
      const failure = new ApiFailure(res.status, (data && data.error) || 'HTTP ' + res.status, (data && data.hint) || '');
      if (res.status === 401 && app.who) signOut(failure);
      throw failure;
    }
    return data;
  }

  // ---- Messages ----

  function showProblem(failure, doing) {
    const box = document.getElementById('problem');
    const what = (doing ? doing + ': ' : '') + failure.message + (failure.status ? ' (' + failure.status + ')' : '');
    put(box,
      el('strong', { class: 'error', text: what }),
      failure.hint ? el('span', { class: 'hint', text: 'What to do: ' + failure.hint }) : null,
      el('button', { type: 'button', class: 'link', text: 'Dismiss', onclick: clearProblem }),
    );
    box.hidden = false;
  }

  function clearProblem() {
    const box = document.getElementById('problem');
    box.hidden = true;
    put(box);
  }

  function notice(container, text) {
    const n = container.querySelector('.notice') || container.appendChild(el('p', { class: 'notice', role: 'status' }));
    n.textContent = text;
  }

  // A modal confirmation (Escape or Cancel backs out); Cancel has the focus.
  function confirmThen(question, label, run) {
    const back = document.activeElement;
    const dialog = el('dialog', { class: 'confirm', 'aria-labelledby': 'confirm-question' });
    const ok = el('button', { type: 'button', id: 'confirm', class: 'danger', text: label });
    const cancel = el('button', { type: 'button', id: 'cancel', text: 'Cancel' });
    dialog.append(el('p', { id: 'confirm-question', text: question }), el('div', { class: 'row' }, ok, cancel));
    let confirmed = false;
    ok.addEventListener('click', () => { confirmed = true; dialog.close(); });
    cancel.addEventListener('click', () => dialog.close());
    dialog.addEventListener('close', () => {
      dialog.remove();
      if (back && back.isConnected) back.focus();
      if (confirmed) run();
    });
    document.body.append(dialog);
    dialog.showModal();
    cancel.focus();
  }

  // ---- Signing in and out ----

  function signInView() {
    stopTimers();
    put(document.getElementById('nav'));
    put(document.getElementById('who'));
    const input = el('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true });
    const form = el('form', { class: 'signin', id: 'signin' },
      el('h1', { text: 'Sign in' }),
      el('p', { text: 'A token from this walpost\'s [admin] tokens_file. It stays in this browser tab (sessionStorage) and is sent as Authorization: Bearer; closing the tab forgets it.' }),
      el('label', { for: 'token', text: 'Token' }),
      input,
      el('button', { type: 'submit', id: 'sign-in', text: 'Sign in' }));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      signIn(input.value.trim());
    });
    put(main(), form);
    input.focus();
  }

  async function signIn(token) {
    clearProblem();
    app.token = token;
    try {
      app.who = await api('GET', '/api/v1/whoami');
      app.mode = await modeOf();
    } catch (f) {
      app.token = null;
      app.who = null;
      sessionStorage.removeItem(TOKEN_KEY);
      signInView();
      showProblem(f, 'cannot sign in');
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    chrome();
    if (app.mode === 'relay') {
      await seedSamples();
      sample();
      app.timers.push(setInterval(sample, SAMPLE_MS));
    }
    if (routeOf(location.hash)) route();
    else location.hash = app.mode === 'relay' ? '#/overview' : '#/handlers';
  }

  // `walpost run` answers the relay's status; `walpost inbox` has no such route.
  async function modeOf() {
    try {
      app.status = await api('GET', '/api/v1/status');
      return 'relay';
    } catch (f) {
      if (f.status !== 404) throw f;
      await api('GET', '/api/v1/inbox/status');
      return 'inbox';
    }
  }

  function signOut(failure) {
    app.token = null;
    app.who = null;
    app.mode = null;
    app.samples = [];
    sessionStorage.removeItem(TOKEN_KEY);
    signInView();
    if (failure) showProblem(failure, 'signed out');
  }

  function stopTimers() {
    app.timers.forEach(clearInterval);
    app.timers = [];
  }

  function chrome() {
    const pages = app.mode === 'relay'
      ? [['#/overview', 'Overview'], ['#/dead-letters', 'Dead letters'], ['#/replays', 'Replays']]
      : [['#/handlers', 'Handlers']];
    put(document.getElementById('nav'), el('ul', {}, pages.map(([href, text]) => el('li', {}, el('a', { href, text })))));
    put(document.getElementById('who'),
      el('span', { id: 'identity', text: app.who.name + ' (' + app.who.role + ')' }),
      el('button', { type: 'button', id: 'sign-out', class: 'link', text: 'Sign out', onclick: () => signOut() }));
  }

  // ---- Pages ----

  function routeOf(hash) {
    const pages = window.walpostPages;
    if (app.mode === 'relay') {
      if (hash === '#/overview') return () => pages.overview();
      if (hash === '#/dead-letters') return () => pages.deadLetters();
      if (hash === '#/replays') return () => pages.replays();
      const r = /^#\/replays\/([^/]+)$/.exec(hash);
      if (r) return () => pages.replay(decodeURIComponent(r[1]));
    } else if (app.mode === 'inbox') {
      if (hash === '#/handlers') return () => pages.handlers();
      const m = /^#\/handlers\/([^/]+)$/.exec(hash);
      if (m) return () => pages.review(decodeURIComponent(m[1]));
    }
    return null;
  }

  function route() {
    if (!app.who) return;
    const page = routeOf(location.hash);
    if (!page) {
      location.hash = app.mode === 'relay' ? '#/overview' : '#/handlers';
      return;
    }
    for (const a of document.querySelectorAll('#nav a')) {
      if (location.hash.startsWith(a.getAttribute('href'))) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    clearProblem();
    page();
  }

  // The last hour as walpost kept it (GET /api/v1/status/history), so that a reloaded tab
  // has its chart; a walpost without the route leaves it to this tab's own samples.
  async function seedSamples() {
    app.samples = [];
    try {
      const h = await api('GET', '/api/v1/status/history');
      app.samples = (h.points || []).map((p) => ({ t: p.at, bytes: p.lag_bytes, secs: p.lag_seconds }));
    } catch (f) {
      if (f.status !== 404) showProblem(f, 'cannot read the status history');
    }
  }

  // One status sample into the ring; the overview redraws from it.
  async function sample() {
    try {
      app.status = await api('GET', '/api/v1/status');
    } catch (f) {
      if (app.who) showProblem(f, 'cannot read the status');
      return;
    }
    const s = app.status;
    app.samples.push({ t: Date.now(), bytes: s.lag_bytes, secs: s.lag_seconds });
    while (app.samples.length > RING_SIZE + 1) app.samples.shift();
    if (location.hash === '#/overview' && window.walpostPages.updateOverview) window.walpostPages.updateOverview();
  }

  // A line chart of one figure of the samples over the last hour.
  function chart(key, title, format) {
    const w = 640;
    const h = 150;
    const left = 8;
    const bottom = 20;
    const now = Date.now();
    const points = app.samples.filter((p) => p[key] !== null && p[key] !== undefined && now - p.t <= WINDOW_MS);
    const max = Math.max(1, ...points.map((p) => p[key]));
    const latest = points.length ? points[points.length - 1][key] : null;
    const label = title + ' over the last hour: ' + points.length + ' samples, latest ' + format(latest) + ', highest ' + format(points.length ? max : null);
    const g = svg('svg', { viewBox: '0 0 ' + w + ' ' + h, class: 'chart', role: 'img', 'aria-label': label });
    g.append(svg('title', {}, label));
    g.append(svg('line', { x1: left, y1: h - bottom, x2: w, y2: h - bottom, class: 'axis' }));
    g.append(svg('line', { x1: left, y1: 10, x2: w, y2: 10, class: 'grid' }));
    g.append(svg('text', { x: left + 4, y: 22, class: 'tick' }, format(max)));
    [['-60 min', left], ['-30 min', (left + w) / 2], ['now', w - 24]].forEach(([t, x]) => g.append(svg('text', { x, y: h - 4, class: 'tick' }, t)));
    const x = (t) => left + ((t - (now - WINDOW_MS)) / WINDOW_MS) * (w - left);
    const y = (v) => h - bottom - (v / max) * (h - bottom - 10);
    if (points.length) {
      g.append(svg('polyline', { class: 'series', points: points.map((p) => x(p.t).toFixed(1) + ',' + y(p[key]).toFixed(1)).join(' ') }));
      const last = points[points.length - 1];
      g.append(svg('circle', { class: 'series-dot', cx: x(last.t).toFixed(1), cy: y(last[key]).toFixed(1), r: 3 }));
    }
    return el('figure', { class: 'chart-box' }, el('figcaption', { text: title + ' (last hour, a sample every 10 s)' }), g);
  }

  // A table from rows: columns are [header, (row) => text or Node].
  function table(id, columns, rows, caption) {
    return el('table', { id },
      caption ? el('caption', { text: caption }) : null,
      el('thead', {}, el('tr', {}, columns.map(([head]) => el('th', { scope: 'col', text: head })))),
      el('tbody', {}, rows.map((r) => el('tr', {}, columns.map(([, cell]) => {
        const v = cell(r);
        return el('td', {}, v instanceof Node ? v : shown(v));
      })))));
  }

  function fields(list) {
    return el('dl', { class: 'fields' }, list.map(([label, id, value]) => [el('dt', { text: label }), el('dd', { id, text: shown(value) })]));
  }

  function runbookLink(runbook) {
    const m = /^runbooks\/([a-z0-9-]+\.md)$/.exec(runbook || '');
    if (!m) return el('span', { text: shown(runbook) });
    return el('a', { href: '/console/runbooks/' + m[1], target: '_blank', rel: 'noopener noreferrer', text: runbook });
  }

  // What the pages (pages.js) use.
  window.walpostConsole = {
    app, el, put, svg, shown, bytes, seconds, api, ApiFailure, showProblem, clearProblem, notice,
    confirmThen, chart, table, fields, runbookLink, canAct, main, sample,
  };

  window.addEventListener('hashchange', route);
  document.addEventListener('DOMContentLoaded', () => {
    const saved = sessionStorage.getItem(TOKEN_KEY);
    if (saved) signIn(saved);
    else signInView();
  });
})();
