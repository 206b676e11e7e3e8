// stint dashboard: plain JavaScript on the JSON API, no framework, no build.
//
// The token is kept in sessionStorage (this tab only) and sent as a bearer
// token. Live updates come from GET /api/v1/events, read with fetch rather
// than EventSource so that the token travels in the Authorization header,
// never in a URL. The stream is resumed from its last cursor after a
// disconnect, so no change is missed.
'use strict';
(() => {
  const TOKEN_KEY = 'stint.token';
  const ROLES = { read: 1, submit: 2, admin: 3 };
  const STATUSES = ['waiting', 'scheduled', 'running', 'held', 'success', 'failure'];
  // WORKFLOW is the internal behavior of a workflow's own task, which
  // every server runs and none may pause.
  const WORKFLOW = 'stint.workflow';

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    role: null,
    auth: true,
    behaviors: [],
    features: [],
    maxAttempts: {}, // behavior -> the runs a failing task gets
    stats: null,
    statsAt: 0, // when stats were read, on this browser's clock
    skew: 0, // the database's clock minus this browser's, in ms
    recent: [], // the latest task events, newest first
    cursor: null, // the event stream's cursor
    view: null,
    started: false,
  };

  const $ = (sel, root = document) => root.querySelector(sel);
  const can = (role) => !!state.role && ROLES[state.role] >= ROLES[role];

  // h builds an element: h('a', {href: '#', class: 'x', onclick: fn}, 'text', child).
  // Text is always set as text, never parsed as HTML.
  // fill replaces the children of el, skipping null and false as h does.
  function fill(el, ...children) {
    el.replaceChildren();
    for (const c of children.flat(Infinity)) {
      if (c == null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c == null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  // ---- API ----

  class APIError extends Error {
    constructor(status, body) {
      super(body.message || 'request failed');
      this.status = status;
      this.code = body.code;
      this.field = body.field;
    }
  }

  function authHeaders() {
    return state.token ? { Authorization: 'Bearer ' + state.token } : {};
  }

  async function api(method, path, body) {
    const init = { method, headers: { Accept: 'application/json', ...authHeaders() }, cache: 'no-store' };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch('/api/v1' + path, init);
    if (res.status === 204) return null;
    let data = null;
    try { data = await res.json(); } catch (_) { /* not JSON */ }
    if (!res.ok) {
      const err = new APIError(res.status, (data && data.error) || { code: 'internal', message: res.status + ' ' + res.statusText });
      if (res.status === 401) showLogin(state.token ? 'The token was not accepted: ' + err.message : '');
      throw err;
    }
    return data;
  }

  const taskPath = (id) => '/tasks/' + encodeURIComponent(id);
  const taskHref = (id) => '#/tasks/' + encodeURIComponent(id);
  function listHref(filters) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    const s = q.toString();
    return '#/tasks' + (s ? '?' + s : '');
  }

  // ---- time ----

  const serverNow = () => Date.now() + state.skew;

  // durationMs reads a duration of the API, a Go duration string such as
  // "1h30m0s" or "250ms" (or a number of nanoseconds, as servers of earlier
  // releases send), in milliseconds.
  function durationMs(d) {
    if (typeof d === 'number') return d / 1e6;
    const units = { h: 3600000, m: 60000, s: 1000, ms: 1, us: 1e-3, 'µs': 1e-3, ns: 1e-6 };
    let ms = 0;
    for (const [, n, unit] of String(d).matchAll(/([\d.]+)(h|ms|m|s|us|µs|ns)/g)) ms += Number(n) * units[unit];
    return String(d).startsWith('-') ? -ms : ms;
  }

  function fmtDuration(ms) {
    ms = Math.max(0, Math.round(ms));
    if (ms < 1000) return ms + 'ms';
    const s = Math.floor(ms / 1000);
    if (s < 60) return (ms < 10000 ? (ms / 1000).toFixed(1) : s) + 's';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + (s % 60) + 's';
    const hr = Math.floor(m / 60);
    if (hr < 48) return hr + 'h ' + (m % 60) + 'm';
    return Math.floor(hr / 24) + 'd ' + (hr % 24) + 'h';
  }

  function rel(ts) {
    const d = serverNow() - Date.parse(ts);
    if (Math.abs(d) < 1000) return 'now';
    return d > 0 ? fmtDuration(d) + ' ago' : 'in ' + fmtDuration(-d);
  }

  // dueText says when something is due: "in 3m 5s", or "now" once the
  // time has come.
  function dueText(ts) {
    const d = Date.parse(ts) - serverNow();
    return d >= 1000 ? 'in ' + fmtDuration(d) : 'now';
  }

  // absTime writes a time as its local date and 24-hour time of day,
  // "2026-12-07 21:17:50".
  function absTime(ts) {
    const d = new Date(ts);
    const p2 = (n) => String(n).padStart(2, '0');
    return d.getFullYear() + '-' + p2(d.getMonth() + 1) + '-' + p2(d.getDate()) + ' ' +
      p2(d.getHours()) + ':' + p2(d.getMinutes()) + ':' + p2(d.getSeconds());
  }

  // Every time the page shows is relative and stays current, with its
  // absTime on hover: timeEl ("3m 5s ago", "in 2s") for a time, dueEl
  // ("in 2s", then "now") for when something is due.
  function timeEl(ts) {
    if (!ts) return h('span', { class: 'faint' }, '—');
    return h('time', { datetime: ts, title: absTime(ts), dataset: { rel: ts } }, rel(ts));
  }

  function dueEl(ts) {
    return h('time', { datetime: ts, title: absTime(ts), dataset: { due: ts } }, dueText(ts));
  }

  setInterval(() => {
    for (const el of document.querySelectorAll('[data-rel]')) el.textContent = rel(el.dataset.rel);
    for (const el of document.querySelectorAll('[data-due]')) el.textContent = dueText(el.dataset.due);
  }, 1000);

  // ---- small helpers ----

  function throttle(fn, ms) {
    let last = 0;
    let timer = null;
    return () => {
      if (timer) return;
      const wait = last + ms - Date.now();
      if (wait <= 0) {
        last = Date.now();
        fn();
        return;
      }
      timer = setTimeout(() => { timer = null; last = Date.now(); fn(); }, wait);
    };
  }

  function toast(msg, bad) {
    const el = h('div', { class: 'toast' + (bad ? ' bad' : ''), role: 'status' }, msg);
    $('#toasts').append(el);
    setTimeout(() => el.remove(), bad ? 6000 : 3000);
  }

  const pill = (status) => h('span', { class: 'pill', dataset: { status } }, status);

  // retrying reports whether a task failed or succeeded and is due to run
  // again: a retry after a failure, not its end.
  const retrying = (t) => t.status === 'failure' && !!t.schedule_not_before;

  // taskPill is the state badge of a task: "retrying" (its own color) for
  // a failure that is retried, else the status.
  const taskPill = (t) => pill(retrying(t) ? 'retrying' : t.status);

  // errorKind says how a task's error was decided: retried; failed by
  // hand, skipped or cancelled (a workflow's node, or the workflow's own
  // task), which need no run; else why the task failed for good: no retry
  // was left (a retryable error on the attempt its policy allowed last),
  // or the error was not retryable.
  function errorKind(t) {
    if (retrying(t)) return 'retrying';
    if (t.status !== 'failure') return t.error.retryable ? 'retryable' : 'permanent';
    const after = t.attempt ? ' after attempt ' + t.attempt : '';
    switch (t.error.code) {
      case 'failed_by_hand': return 'failed by hand' + (after || ', no attempt ran');
      case 'skipped': return 'skipped: its rule can no longer be met';
      case 'cancelled': return 'cancelled with its workflow' + (after || ' before it ran');
      case 'workflow_cancelled': return 'the workflow was cancelled';
      case 'workflow_failed': return 'the workflow failed';
    }
    if (!t.attempt) return 'failed for good, no attempt ran';
    return 'failed for good' + after + (t.error.retryable ? ': no retry left' : ': not retryable');
  }

  // retryNote says "retrying (attempt n of m, next in 5s): error".
  function retryNote(t) {
    const max = state.maxAttempts[t.behavior];
    const err = t.error ? t.error.message : 'no error text';
    return ['retrying (attempt ' + t.attempt + (max ? ' of ' + max : '') + ', next ', dueEl(t.schedule_not_before), '): ' + err];
  }

  // zeroTime matches the JSON of Go's zero time, which means "never".
  const zeroTime = /^0001-01-01T00:00:00(\.0+)?(Z|[+-]00:00)$/;

  // withoutZeroTimes returns v without the fields whose value is the zero
  // time.
  function withoutZeroTimes(v) {
    if (Array.isArray(v)) return v.map(withoutZeroTimes);
    if (v && typeof v === 'object') {
      const out = {};
      for (const [k, x] of Object.entries(v)) {
        if (typeof x === 'string' && zeroTime.test(x)) continue;
        out[k] = withoutZeroTimes(x);
      }
      return out;
    }
    return v;
  }

  function pretty(raw) {
    if (raw == null) return null;
    return h('pre', { class: 'json' }, JSON.stringify(withoutZeroTimes(raw), null, 2));
  }

  // finished reports whether task t finished for good: it will not run
  // again unless an operator acts.
  const finished = (t) => (t.status === 'success' || t.status === 'failure') && !t.schedule_not_before;

  // jsonCell shows a JSON value on one line, cut short past 200
  // characters (the whole in its title).
  function jsonCell(v) {
    const s = JSON.stringify(v === undefined ? null : v);
    return h('code', { class: 'json-cell', title: s.length > 200 ? s : null }, s.length > 200 ? s.slice(0, 199) + '…' : s);
  }

  function panel(title, hint, ...body) {
    return h('section', { class: 'card panel' },
      h('div', { class: 'panel-head' }, h('h2', {}, title), hint ? h('span', { class: 'hint' }, hint) : null),
      ...body);
  }

  // actionButton runs an admin action and reports it. A button with
  // confirm needs a second click within 3 seconds.
  function actionButton(label, name, run, opts = {}) {
    const btn = h('button', { type: 'button', class: 'btn small' + (opts.danger ? ' danger' : ''), dataset: { action: name } }, label);
    let armed = false;
    let timer = null;
    const disarm = () => { clearTimeout(timer); armed = false; btn.classList.remove('armed'); btn.textContent = label; };
    btn.addEventListener('click', async () => {
      if (opts.confirm && !armed) {
        armed = true;
        btn.classList.add('armed');
        btn.textContent = opts.confirm;
        timer = setTimeout(disarm, 3000);
        return;
      }
      disarm(); // a confirmed action needs confirming again next time
      btn.disabled = true;
      try {
        await run();
        toast(opts.done || label + ': done');
      } catch (e) {
        toast(label + ' failed: ' + e.message, true);
      } finally {
        btn.disabled = false;
      }
    });
    return btn;
  }

  // ---- login and chrome ----

  function showLogin(msg) {
    stopStream();
    $('#login').hidden = false;
    const err = $('#login-error');
    err.hidden = !msg;
    err.textContent = msg || '';
    $('#token-input').focus();
  }

  async function whoami() {
    const w = await api('GET', '/whoami');
    state.role = w.role;
    state.auth = w.auth;
    state.behaviors = w.behaviors || [];
    state.features = w.features || [];
    state.maxAttempts = w.max_attempts || {};
  }

  function updateChrome() {
    const role = $('#role');
    role.hidden = !state.role;
    role.textContent = state.auth ? state.role : 'no auth';
    role.title = state.auth ? 'Your token\'s role' : 'This server runs without tokens: everyone is admin';
    $('#signout').hidden = !state.auth;
    $('#new-task').hidden = !can('submit') || state.behaviors.length === 0;
    $('#nav-batches').hidden = !state.features.includes('batches');
  }

  $('#login-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    state.token = $('#token-input').value.trim();
    try {
      await whoami();
    } catch (e) {
      if (e.status !== 401) showLogin(e.message);
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, state.token);
    $('#token-input').value = '';
    $('#login').hidden = true;
    start();
  });

  $('#signout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.hash = '#/';
    location.reload();
  });

  $('#goto').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const id = $('#goto-id').value.trim();
    if (id) location.hash = taskHref(id);
    $('#goto-id').value = '';
  });

  // ---- the event stream ----

  let streamCtl = null;
  let retries = 0;

  function setLive(s) {
    const el = $('#live');
    el.dataset.state = s;
    el.textContent = { on: 'live', connecting: 'connecting…', off: 'offline' }[s];
  }

  function stopStream() {
    if (streamCtl) streamCtl.abort();
    streamCtl = null;
    setLive('off');
  }

  async function startStream() {
    if (streamCtl) streamCtl.abort();
    const ctl = new AbortController();
    streamCtl = ctl;
    setLive('connecting');
    const resumed = state.cursor != null;
    try {
      const since = resumed ? state.cursor : 'now';
      const res = await fetch('/api/v1/events?since=' + encodeURIComponent(since), {
        headers: { Accept: 'text/event-stream', ...authHeaders() }, signal: ctl.signal, cache: 'no-store',
      });
      if (res.status === 401) { showLogin('The token was not accepted.'); return; }
      if (res.status === 400 && resumed) {
        // The cursor expired: start afresh and reload what is shown.
        state.cursor = null;
        refreshAll();
      } else if (!res.ok) {
        throw new Error('event stream: ' + res.status);
      } else {
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            handleStreamBlock(block, resumed);
          }
        }
      }
    } catch (_) {
      // reconnect below
    }
    if (ctl.signal.aborted || streamCtl !== ctl) return;
    setLive('connecting');
    const delay = Math.min(15000, 500 * 2 ** retries++);
    setTimeout(() => { if (streamCtl === ctl) startStream(); }, delay);
  }

  function handleStreamBlock(block, resumed) {
    let event = 'message';
    let data = '';
    let id = null;
    for (const line of block.split('\n')) {
      if (line === '' || line.startsWith(':')) continue;
      const c = line.indexOf(':');
      const field = c < 0 ? line : line.slice(0, c);
      let val = c < 0 ? '' : line.slice(c + 1);
      if (val.startsWith(' ')) val = val.slice(1);
      if (field === 'event') event = val;
      else if (field === 'data') data = data ? data + '\n' + val : val;
      else if (field === 'id') id = val;
    }
    if (id != null) state.cursor = id;
    const payload = data ? JSON.parse(data) : null;
    switch (event) {
      case 'ready':
        retries = 0;
        setLive('on');
        if (!resumed && payload && payload.cursor) state.cursor = String(payload.cursor);
        if (resumed) refreshAll();
        seedRecent();
        break;
      case 'task':
        onTaskEvent(payload);
        break;
      case 'error':
        state.cursor = null;
        refreshAll();
        break;
    }
  }

  // The server reuses a statistics snapshot for up to a second: a read
  // this long after an event is sure to count it.
  const STATS_AFTER_EVENT_MS = 1100;
  let statsTimer = null;

  // statsAfterEvent reads the statistics once the changes seen so far are
  // counted: the counters follow the event stream.
  function statsAfterEvent() {
    if (statsTimer) return;
    statsTimer = setTimeout(() => { statsTimer = null; refreshStats(); }, STATS_AFTER_EVENT_MS);
  }

  const eventKey = (e) => e.seq + ' ' + e.task_id + ' ' + e.status;

  // addRecent adds events to the activity list, newest first, once each.
  function addRecent(events) {
    const seen = new Set(state.recent.map(eventKey));
    const fresh = events.filter((e) => !seen.has(eventKey(e)));
    if (fresh.length === 0) return false;
    state.recent = [...fresh, ...state.recent].sort((a, b) => b.seq - a.seq || Date.parse(b.at) - Date.parse(a.at));
    if (state.recent.length > 200) state.recent.length = 200;
    return true;
  }

  // seedRecent loads the latest changes, so that the activity list is not
  // empty until the next change.
  async function seedRecent() {
    try {
      const r = await api('GET', '/changes?limit=60');
      if (addRecent(r.changes || []) && state.view && state.view.onRecent) state.view.onRecent();
    } catch (_) { /* the live events still come */ }
  }

  function onTaskEvent(e) {
    addRecent([e]);
    statsAfterEvent();
    if (state.view && state.view.onEvent) state.view.onEvent(e);
  }

  // ---- statistics ----

  async function refreshStats() {
    try {
      const s = await api('GET', '/stats');
      state.stats = s;
      state.statsAt = Date.now();
      state.skew = Date.parse(s.now) - Date.now();
      if (state.view && state.view.onStats) state.view.onStats();
    } catch (_) { /* shown by the views; retried */ }
  }

  function refreshAll() {
    refreshStats();
    if (state.view && state.view.refresh) state.view.refresh();
  }

  // lagNow is a queue lag read as ms with the last statistics, counted on
  // to now: a due task keeps waiting while nothing happens. The card's
  // lag (the largest) and each behavior's in the table use it, so that
  // they show one number.
  function lagNow(ms) {
    return ms ? ms + (Date.now() - state.statsAt) : 0;
  }

  // queueLag is the queue lag now, of all behaviors.
  function queueLag() {
    return state.stats ? lagNow(state.stats.queue_lag_ms) : 0;
  }

  // ---- views ----

  // historyWindow is the overview's chart window ('15m', '1h', '6h' or
  // '24h'): the one picked, else, until then, the shortest that holds all
  // the history there is, chosen when the overview first loads.
  let historyWindow = null;

  function overviewView() {
    const cards = h('div', { class: 'cards' });
    const queues = h('div', { class: 'table-wrap' });
    const feed = h('ul', { class: 'feed', id: 'activity' });
    const nodesBox = h('div');
    const groupsBox = h('div', { class: 'panel-body' });
    const historyBox = h('div', { id: 'history' });
    const windowPicker = h('div', { class: 'window-picker', id: 'history-window', role: 'group', 'aria-label': 'Chart window' });
    const el = h('div', {},
      h('div', { class: 'page-head' }, h('h1', {}, 'Overview')),
      cards,
      panel('Queues', 'tasks by behavior and state; counts link to the tasks', queues),
      panel('History', 'per behavior, per minute, as the database keeps it', h('div', { class: 'panel-body' }, windowPicker, historyBox)),
      h('div', { class: 'grid2' },
        panel('Activity', 'state changes as they happen', feed),
        h('div', {},
          panel('Nodes', null, nodesBox),
          panel('Held groups', 'no task of a held group is claimed', groupsBox))));

    function metric(label, value, cls, id, title) {
      return h('div', { class: 'card metric', title }, h('div', { class: 'label' }, label),
        h('div', { class: 'value' + (cls ? ' ' + cls : ''), id }, value));
    }

    // count reads a state's count of the statistics, 0 when a server of an
    // earlier release leaves the state out.
    const count = (counts, st) => counts[st] || 0;

    function renderStats() {
      const s = state.stats;
      if (!s) return;
      const t = s.totals;
      fill(cards,
        metric('Running', t.counts.running, null, 'm-running'),
        metric('Due now', t.due_now, t.due_now > 0 ? 'warn' : null, 'm-due'),
        metric('Queue lag', fmtDuration(queueLag()), s.queue_lag_ms > 60000 ? 'bad' : null, 'm-lag'),
        metric('Waiting', count(t.counts, 'waiting'), null, 'm-waiting', 'workflow nodes waiting for their dependencies, and workflows for their nodes'),
        metric('Scheduled', t.counts.scheduled, null, 'm-scheduled'),
        metric('Held', t.counts.held, t.counts.held ? 'warn' : null, 'm-held'),
        metric('Failed', t.counts.failure, t.counts.failure ? 'bad' : null, 'm-failure'),
        metric('Succeeded', t.counts.success, null, 'm-success'));

      const rows = s.behaviors.map((q) => h('tr', { dataset: { behavior: q.behavior } },
        h('td', {}, h('a', { href: listHref({ behavior: q.behavior }) }, q.behavior),
          q.paused ? [' ', pill('paused')] : null),
        STATUSES.map((st) => h('td', { class: 'num' + (count(q.counts, st) ? '' : ' zero'), dataset: { count: st } },
          h('a', { href: listHref({ behavior: q.behavior, status: st }) }, count(q.counts, st).toLocaleString()))),
        h('td', { class: 'num' + (q.due_now ? '' : ' zero') }, q.due_now.toLocaleString()),
        h('td', { class: 'num' + (q.due_now ? '' : ' zero'), dataset: { lag: q.due_now ? q.oldest_due_age_ms : '' } },
          q.due_now ? fmtDuration(lagNow(q.oldest_due_age_ms)) : '—'),
        can('admin') ? h('td', { class: 'actions' }, q.paused
          ? actionButton('Resume', 'resume', async () => { await api('POST', '/behaviors/' + encodeURIComponent(q.behavior) + '/resume'); refreshStats(); })
          : q.behavior === WORKFLOW ? null
            : actionButton('Pause', 'pause', async () => { await api('POST', '/behaviors/' + encodeURIComponent(q.behavior) + '/pause'); refreshStats(); })) : null));
      fill(queues, rows.length === 0
        ? h('div', { class: 'empty' }, 'No behaviors and no tasks yet.')
        : h('table', { id: 'queues' },
          h('thead', {}, h('tr', {}, h('th', {}, 'Behavior'), STATUSES.map((st) => h('th', { class: 'num' }, st)),
            h('th', { class: 'num' }, 'Due now'), h('th', { class: 'num' }, 'Lag'), can('admin') ? h('th', {}) : null)),
          h('tbody', {}, rows)));

      const held = s.held_groups || [];
      fill(groupsBox,
        held.length === 0 ? h('div', { class: 'muted' }, 'None.') : h('div', { class: 'chips' }, held.map((g) => h('span', { class: 'chip' },
          h('a', { href: listHref({ group: g }) }, g),
          can('admin') ? actionButton('Release', 'release-group', async () => {
            await api('POST', '/groups/' + encodeURIComponent(g) + '/release'); refreshStats();
          }) : null))),
        can('admin') ? holdGroupForm() : null);
    }

    function holdGroupForm() {
      const input = h('input', { placeholder: 'group key', 'aria-label': 'Group key to hold', spellcheck: 'false' });
      return h('form', {
        class: 'inline-form', onsubmit: async (ev) => {
          ev.preventDefault();
          const g = input.value.trim();
          if (!g) return;
          try {
            await api('POST', '/groups/' + encodeURIComponent(g) + '/hold');
            toast('Group ' + g + ' held');
            refreshStats();
          } catch (e) { toast('Hold group failed: ' + e.message, true); }
        },
      }, input, h('button', { class: 'btn', type: 'submit' }, 'Hold group'));
    }

    function feedItem(e) {
      // A failure that is not final is retried.
      const status = e.status === 'failure' && !e.final ? 'retrying' : e.status;
      return h('li', { dataset: { task: e.task_id } },
        h('span', { class: 'when' }, timeEl(e.at)),
        h('span', { class: 'what' }, h('a', { href: taskHref(e.task_id) }, e.task_id), h('span', { class: 'b' }, e.behavior)),
        pill(status));
    }

    function renderFeed() {
      const items = state.recent.slice(0, 60).map(feedItem);
      fill(feed, ...(items.length ? items : [h('li', { class: 'empty' }, 'Waiting for changes…')]));
    }

    async function loadNodes() {
      try {
        const r = await api('GET', '/nodes');
        fill(nodesBox, r.nodes.length === 0
          ? h('div', { class: 'empty' }, 'No server node is registered.')
          : h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'Node'), h('th', {}, 'Health'), h('th', { class: 'num' }, 'Running'), h('th', { class: 'num' }, 'Heartbeat'))),
            h('tbody', {}, r.nodes.map((n) => h('tr', {},
              h('td', { class: 'id' }, n.id), h('td', {}, pill(n.health)),
              h('td', { class: 'num' }, n.running + ' / ' + n.max_workers),
              h('td', { class: 'num' }, fmtDuration(n.heartbeat_age_ms) + ' ago'))))));
      } catch (e) {
        fill(nodesBox, h('p', { class: 'error-text panel-body' }, e.message));
      }
    }

    function renderWindowPicker() {
      fill(windowPicker, window.stintCharts.windows.map((w) => h('button', {
        class: 'btn small', type: 'button', dataset: { window: w }, 'aria-pressed': String(w === historyWindow),
        onclick: () => { historyWindow = w; loadHistory(); },
      }, w.replace(/(\d+)([mh])/, (_, n, u) => n + (u === 'm' ? ' min' : ' h')))));
    }

    // The history gains a point a minute: read it twice as often. A read
    // answered after a later one began (a window picked meanwhile) is
    // dropped.
    let historyReads = 0;
    async function loadHistory() {
      const read = ++historyReads;
      try {
        let history;
        if (!historyWindow) {
          history = await api('GET', '/history?window=24h');
          historyWindow = window.stintCharts.pickWindow(history);
        }
        if (!history || historyWindow !== '24h') history = await api('GET', '/history?window=' + historyWindow);
        if (read !== historyReads) return;
        renderWindowPicker();
        window.stintCharts.render(historyBox, history);
      } catch (e) {
        fill(historyBox, h('p', { class: 'error-text' }, e.message));
      }
    }

    const feedSoon = throttle(renderFeed, 250);
    const nodesTimer = setInterval(loadNodes, 5000);
    const historyTimer = setInterval(loadHistory, 30000);
    // The queue lag grows while nothing happens: count it on.
    const lagTimer = setInterval(() => {
      const el = document.getElementById('m-lag');
      if (el && state.stats && state.stats.queue_lag_ms > 0) el.textContent = fmtDuration(queueLag());
      for (const td of document.querySelectorAll('#queues td[data-lag]')) {
        if (td.dataset.lag) td.textContent = fmtDuration(lagNow(Number(td.dataset.lag)));
      }
    }, 1000);
    renderStats();
    renderFeed();
    loadNodes();
    loadHistory();
    return {
      name: 'overview', el,
      onStats: renderStats,
      onEvent: feedSoon,
      onRecent: feedSoon,
      refresh: () => { loadNodes(); loadHistory(); },
      dispose: () => { clearInterval(nodesTimer); clearInterval(lagTimer); clearInterval(historyTimer); },
    };
  }

  function tasksView(params) {
    const filters = {
      behavior: params.get('behavior') || '',
      status: params.get('status') || '',
      parent: params.get('parent') || '',
      group: params.get('group') || '',
    };
    const after = params.get('after') || '';
    const body = h('div', { class: 'table-wrap' }, h('div', { class: 'empty' }, 'Loading…'));
    const pager = h('div', { class: 'pager' });
    const behaviorSel = h('select', { id: 'f-behavior', 'aria-label': 'Behavior' }, h('option', { value: '' }, 'all behaviors'));
    const behaviors = new Set([...state.behaviors, ...((state.stats && state.stats.behaviors) || []).map((q) => q.behavior)]);
    if (filters.behavior) behaviors.add(filters.behavior);
    for (const b of [...behaviors].sort()) behaviorSel.append(h('option', { value: b, selected: b === filters.behavior }, b));
    const statusSel = h('select', { id: 'f-status', 'aria-label': 'Status' }, h('option', { value: '' }, 'all states'),
      STATUSES.map((s) => h('option', { value: s, selected: s === filters.status }, s)));
    const parentIn = h('input', { id: 'f-parent', value: filters.parent, placeholder: 'parent task id', spellcheck: 'false' });
    const groupIn = h('input', { id: 'f-group', value: filters.group, placeholder: 'group key', spellcheck: 'false' });
    const apply = () => {
      location.hash = listHref({ behavior: behaviorSel.value, status: statusSel.value, parent: parentIn.value.trim(), group: groupIn.value.trim() });
    };
    behaviorSel.addEventListener('change', apply);
    statusSel.addEventListener('change', apply);
    const form = h('form', { class: 'filters', onsubmit: (ev) => { ev.preventDefault(); apply(); } },
      h('div', { class: 'field' }, h('label', { for: 'f-behavior' }, 'Behavior'), behaviorSel),
      h('div', { class: 'field' }, h('label', { for: 'f-status' }, 'State'), statusSel),
      h('div', { class: 'field' }, h('label', { for: 'f-parent' }, 'Parent'), parentIn),
      h('div', { class: 'field' }, h('label', { for: 'f-group' }, 'Group'), groupIn),
      h('button', { class: 'btn', type: 'submit' }, 'Filter'),
      h('a', { class: 'btn ghost', href: '#/tasks' }, 'Clear'));
    const el = h('div', {},
      h('div', { class: 'page-head' }, h('h1', {}, 'Tasks'), after ? h('span', { class: 'muted' }, 'after ', h('code', {}, after)) : null),
      h('section', { class: 'card panel' }, form, body, pager));

    let known = null; // id -> status of the rows shown
    async function load() {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
      if (after) q.set('after', after);
      q.set('limit', '50');
      let page;
      try {
        page = await api('GET', '/tasks?' + q.toString());
      } catch (e) {
        fill(body, h('p', { class: 'error-text panel-body', id: 'list-error' }, e.message));
        return;
      }
      const admin = can('admin');
      const prev = known;
      known = new Map(page.tasks.map((t) => [t.id, t.status]));
      const rows = page.tasks.map((t) => h('tr', {
        dataset: { taskId: t.id, status: retrying(t) ? 'retrying' : t.status },
        class: prev && prev.get(t.id) !== t.status ? 'flash' : null,
      },
      h('td', { class: 'id', title: t.id }, h('a', { href: taskHref(t.id) }, t.id)),
      h('td', {}, t.behavior),
      h('td', {}, taskPill(t), waitEl(t, 3, { dataset: { field: 'waiting' } }, true)),
      h('td', { class: 'num' }, t.attempt),
      h('td', { class: 'num' }, t.priority),
      h('td', { class: 'id' }, t.node || ''),
      h('td', {}, t.group_key ? h('a', { href: listHref({ group: t.group_key }) }, t.group_key) : ''),
      h('td', {}, timeEl(t.updated_at)),
      h('td', { class: 'err', dataset: { field: 'error' }, title: t.error ? t.error.message : null },
        t.error && t.status !== 'success' ? t.error.message : ''),
      admin ? h('td', { class: 'actions' }, taskActions(t, load, true)) : null));
      fill(body, rows.length === 0
        ? h('div', { class: 'empty' }, after ? 'No more tasks.' : 'No task matches.')
        : h('table', { id: 'tasks' },
          h('thead', {}, h('tr', {}, h('th', {}, 'Id'), h('th', {}, 'Behavior'), h('th', {}, 'State'), h('th', { class: 'num' }, 'Attempt'),
            h('th', { class: 'num' }, 'Priority'), h('th', {}, 'Node'), h('th', {}, 'Group'), h('th', {}, 'Updated'), h('th', {}, 'Error'), admin ? h('th', {}) : null)),
          h('tbody', {}, rows)));
      pager.hidden = !after && !page.next;
      fill(pager,
        after ? h('a', { class: 'btn', href: listHref(filters) }, 'First page') : null,
        page.next ? h('a', { class: 'btn', id: 'next-page', href: listHref({ ...filters, after: page.next }) }, 'Next page →') : null);
    }

    const reload = throttle(load, 500);
    function onEvent(e) {
      if (filters.behavior && e.behavior !== filters.behavior) return;
      if (filters.parent && e.parent_id !== filters.parent) return;
      if (known && known.has(e.task_id)) return reload();
      if (filters.status && e.status !== filters.status) return;
      reload();
    }
    load();
    return { name: 'tasks', el, onEvent, refresh: load };
  }

  // taskActions returns the admin buttons that the task's state allows;
  // small, those of a row of a list. A node of a workflow (node, the
  // workflow's id) is removed only with its workflow: its page links to
  // the workflow instead, and a workflow's own task removes its nodes.
  function taskActions(t, after, small, node) {
    const act = (verb) => async () => {
      const r = await api('POST', taskPath(t.id) + '/' + verb);
      after(r);
    };
    const out = [];
    // A workflow's own task waits while its nodes run: holding it holds
    // the workflow.
    const workflow = t.behavior === WORKFLOW;
    const holdable = t.status === 'scheduled' || (workflow && t.status === 'waiting') ||
      ((t.status === 'success' || t.status === 'failure') && t.schedule_not_before);
    if (holdable) out.push(actionButton('Hold', 'hold', act('hold'), { done: 'Held ' + t.id }));
    if (t.status === 'held') out.push(actionButton('Release', 'release', act('release'), { done: 'Released ' + t.id }));
    if (t.status === 'failure' && !t.schedule_not_before) out.push(actionButton('Retry', 'retry', act('retry'), { done: 'Retrying ' + t.id }));
    if (!small && !workflow && (holdable || t.status === 'held')) out.push(failForm(t, after));
    if (!small && node) {
      out.push(h('span', { class: 'muted', id: 'task-remove-with' }, 'removed with ',
        h('a', { href: window.stintWorkflows.workflowHref(node) }, 'its workflow')));
    } else if (!small) {
      out.push(actionButton('Remove', 'remove', async () => {
        await api('DELETE', taskPath(t.id));
        location.hash = workflow ? '#/workflows' : listHref({ behavior: t.behavior });
      }, { danger: true, confirm: workflow ? 'Click again to remove it and its nodes' : 'Click again to remove', done: 'Removed ' + t.id }));
    }
    return out;
  }

  // failForm fails a waiting task by hand, with the reason typed next to
  // the button; it needs a second click, as the failure is final.
  function failForm(t, after) {
    const input = h('input', { id: 'fail-reason', placeholder: 'reason to fail', 'aria-label': 'Reason to fail the task', spellcheck: 'false' });
    const btn = actionButton('Fail', 'fail', async () => {
      const reason = input.value.trim();
      if (!reason) throw new Error('give a reason');
      after(await api('POST', taskPath(t.id) + '/fail', { reason }));
    }, { danger: true, confirm: 'Click again to fail', done: 'Failed ' + t.id });
    return h('span', { class: 'inline-form' }, input, btn);
  }

  function taskView(id) {
    const el = h('div', {}, h('div', { class: 'empty' }, 'Loading…'));
    const seen = []; // events of this task seen while the page is open
    for (const e of state.recent) if (e.task_id === id) seen.push(e);
    let task = null;
    let removed = false;
    // parent is the parent task when the task may be a node of a
    // workflow, which only the parent's behavior tells; null otherwise or
    // unread.
    let parent = null;
    // spawned is set once the task is known to have had children: the
    // task says so while some are pending, and a list of them while none
    // is; null until it is known.
    let spawned = null;

    async function load() {
      let t;
      try {
        t = await api('GET', taskPath(id));
      } catch (e) {
        if (e.status === 404) {
          fill(el, h('div', { class: 'page-head' }, h('h1', { class: 'mono' }, id)),
            h('div', { class: 'card empty', id: 'task-missing' }, removed ? 'This task was removed.' : 'No task with this id.'));
        } else {
          fill(el, h('p', { class: 'error-text' }, e.message));
        }
        return;
      }
      const wf = window.stintWorkflows;
      const [p, kids] = await Promise.all([
        wf.mayBeNode(t) ? api('GET', taskPath(t.parent_id)).catch(() => null) : null,
        spawned !== null || mayHaveChildren(t) ? null : api('GET', '/tasks?limit=1&parent=' + encodeURIComponent(id)).catch(() => null),
      ]);
      parent = p;
      if (kids) spawned = kids.tasks.length > 0;
      task = t;
      render();
    }

    // mayHaveChildren reports whether the task says it has or may have
    // children: some are pending, or it is a workflow's own task (its
    // nodes) or an ingest batch (its jobs).
    const mayHaveChildren = (t) => t.children_pending > 0 || t.behavior === WORKFLOW || t.behavior === 'ingest.batch';

    function field(label, value, key) {
      return h('div', { dataset: key ? { field: key } : {} }, h('dt', {}, label), h('dd', {}, value == null || value === '' ? h('span', { class: 'faint' }, '—') : value));
    }

    // stepActions are an admin's actions on step s of task t: Rewind, for
    // a task that finished for good, runs it again from there. A
    // workflow's node (retried as a node) and a running task have none.
    function stepActions(t, s, node) {
      if (!can('admin') || node || !finished(t)) return null;
      return actionButton('Rewind', 'rewind', async () => {
        const r = await api('POST', taskPath(t.id) + '/rewind', { step: s.n });
        if (r) { task = r; render(); }
      }, { confirm: 'Click again to run it from step ' + s.n, done: 'Running ' + t.id + ' again from step ' + s.n });
    }

    // forkForm copies task t from one of its steps to a new task, with the
    // step and the new id typed next to the button, and opens the copy.
    function forkForm(t, node) {
      if (!can('admin') || node || !(t.steps || []).length || t.status === 'running') return null;
      const steps = t.steps.map((s) => s.n);
      const step = h('select', { id: 'fork-step', 'aria-label': 'Step to fork from' },
        steps.map((n) => h('option', { value: String(n), selected: n === steps[steps.length - 1] }, 'step ' + n)));
      const input = h('input', { id: 'fork-id', placeholder: 'new task id', 'aria-label': 'Id of the new task', spellcheck: 'false' });
      const btn = actionButton('Fork', 'fork', async () => {
        const id = input.value.trim();
        if (!id) throw new Error('give the new task an id');
        const sub = await api('POST', taskPath(t.id) + '/fork', { step: Number(step.value), id });
        location.hash = taskHref(sub.id);
      }, { done: 'Forked ' + t.id });
      return h('div', { class: 'panel-body inline-form', id: 'task-fork' }, 'Copy from ', step, ' as ', input, btn);
    }

    // stepLabel is a step's line of the timeline: its number and its
    // progress on one line, cut short.
    function stepLabel(s) {
      const p = JSON.stringify(s.progress);
      return 'Step ' + s.n + ': ' + (p.length > 120 ? p.slice(0, 119) + '…' : p);
    }

    // timeline lists the task's submit, every attempt that failed (from
    // t.attempts, each with its error), its current or last run, its steps
    // (t.steps, each with the admin's actions on it), and the events seen
    // while the page is open.
    function timeline(t, node) {
      // A workflow's task, and its node with dependencies, begin waiting.
      const first = t.status === 'waiting' || t.behavior === WORKFLOW ? 'waiting' : 'scheduled';
      const items = [{ at: t.created_at, status: first, label: 'Submitted' }];
      const same = (a, b) => !!a && !!b && Math.abs(Date.parse(a) - Date.parse(b)) < 2;
      const failedRuns = t.attempts || [];
      for (const a of failedRuns) {
        const where = a.node ? ' on ' + a.node : '';
        if (a.started_at) items.push({ at: a.started_at, status: 'running', label: 'Started attempt ' + a.attempt + where, attempt: a.attempt });
        const last = a.attempt === t.attempt && !retrying(t);
        const err = a.error ? (a.error.code ? a.error.code + ': ' : '') + a.error.message : 'no error text';
        items.push({ at: a.ended_at, status: last ? 'failure' : 'retrying', attempt: a.attempt,
          label: 'Attempt ' + a.attempt + (last ? ' failed' : ' failed, retried') + ': ' + err });
      }
      const recorded = (at) => failedRuns.some((a) => same(a.ended_at, at) || same(a.started_at, at));
      if (t.executed_at && !recorded(t.executed_at)) items.push({ at: t.executed_at, status: 'running', label: 'Started attempt ' + t.attempt + (t.node ? ' on ' + t.node : '') });
      if (t.finished_at && !recorded(t.finished_at)) {
        items.push(retrying(t) ? { at: t.finished_at, status: 'retrying', label: 'Failed; retried' }
          : { at: t.finished_at, status: t.status, label: t.status === 'success' ? 'Succeeded' : 'Failed' });
      }
      if (retrying(t)) items.push({ at: t.schedule_not_before, status: 'retrying', label: 'Retry due' });
      for (const s of t.steps || []) items.push({ at: s.at, status: 'step', step: s.n, label: stepLabel(s), actions: stepActions(t, s, node) });
      for (const e of seen) {
        // The row's times and its events' times come from the same
        // transaction: equal times are the same change.
        const dup = items.some((i) => i.status === e.status && Math.abs(Date.parse(i.at) - Date.parse(e.at)) < 2);
        const status = e.status === 'failure' && !e.final ? 'retrying' : e.status;
        if (!dup) items.push({ at: e.at, status, label: '→ ' + (status === 'retrying' ? 'failure, retrying' : e.status) + (e.final ? ' (final)' : '') });
      }
      items.sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
      const data = (i) => i.attempt ? { status: i.status, attempt: i.attempt } : i.step ? { status: i.status, step: i.step } : { status: i.status };
      return h('ol', { class: 'timeline', id: 'timeline' }, items.map((i) => h('li', { dataset: data(i) },
        h('span', { class: 'when' }, timeEl(i.at)), h('span', {}, i.label, i.actions ? [' ', i.actions] : null))));
    }

    // signalsPanel lists the signals sent to task t that no run consumed
    // yet, oldest first, with a form that sends one for a role that may (the
    // topic the task sleeps on filled in); null for a finished task that
    // has none.
    function signalsPanel(t) {
      const list = t.signals || [];
      const form = can('submit') && !finished(t) ? signalForm(t) : null;
      if (!list.length && !form) return null;
      return panel('Signals', 'sent, not received yet; each run receives them oldest first',
        list.length ? h('div', { class: 'table-wrap' }, h('table', { id: 'task-signals' },
          h('thead', {}, h('tr', {}, ['Topic', 'Key', 'Sent', 'Payload'].map((c) => h('th', {}, c)))),
          h('tbody', {}, list.map((s) => h('tr', { dataset: { seq: s.seq, topic: s.topic } },
            h('td', { class: 'mono' }, s.topic), h('td', { class: 'mono' }, s.key || ''), h('td', {}, timeEl(s.at)),
            h('td', {}, jsonCell(s.payload)))))))
          : h('div', { class: 'empty', id: 'task-no-signals' }, 'No signal waits to be received.'),
        form);
    }

    // signalForm sends a signal to task t: a topic and a payload (JSON;
    // none sends null).
    function signalForm(t) {
      const waitsOn = t.waiting && t.waiting.reason === 'signal' ? t.waiting.key : '';
      const topic = h('input', { id: 'signal-topic', value: waitsOn, placeholder: 'topic', 'aria-label': 'Topic of the signal', spellcheck: 'false' });
      const payload = h('input', { id: 'signal-payload', placeholder: 'payload: JSON, or none', 'aria-label': 'Payload of the signal, as JSON', spellcheck: 'false' });
      const btn = actionButton('Send signal', 'signal', async () => {
        const name = topic.value.trim();
        if (!name) throw new Error('give a topic');
        const raw = payload.value.trim();
        let body;
        try { body = raw ? JSON.parse(raw) : undefined; } catch (e) { throw new Error('the payload is not JSON: ' + e.message); }
        await api('POST', taskPath(t.id) + '/signals/' + encodeURIComponent(name), body);
        await load();
      }, { done: 'Signal sent to ' + t.id });
      return h('div', { class: 'panel-body inline-form', id: 'task-signal' }, topic, payload, btn);
    }

    // eventsPanel lists the events task t published, in key order; null
    // when it has none.
    function eventsPanel(t) {
      const list = t.events || [];
      if (!list.length) return null;
      return panel('Events', 'published by its runs; a later value of a key replaces it',
        h('div', { class: 'table-wrap' }, h('table', { id: 'task-events' },
          h('thead', {}, h('tr', {}, ['Key', 'Set', 'Value'].map((c) => h('th', {}, c)))),
          h('tbody', {}, list.map((e) => h('tr', { dataset: { key: e.key } },
            h('td', { class: 'mono' }, e.key), h('td', {}, timeEl(e.at)), h('td', {}, jsonCell(e.value))))))));
    }

    let groupHeldShown = false;
    function render() {
      const t = task;
      const groupHeld = !!(t.group_key && state.stats && (state.stats.held_groups || []).includes(t.group_key));
      groupHeldShown = groupHeld;
      const admin = can('admin');
      const running = t.status === 'running';
      const node = window.stintWorkflows.nodeOf(t, parent);
      const wait = waitEl(t, 20, { id: 'task-waiting' });
      fill(el,
        h('div', { class: 'page-head' },
          h('h1', { class: 'mono', id: 'task-id' }, t.id),
          h('span', { id: 'task-status' }, taskPill(t)),
          batchLink(t),
          window.stintWorkflows.taskLink(workflowCtx, t, parent),
          t.resubmit ? h('span', { class: 'pill', dataset: { status: 'scheduled' }, title: 'Submitted again while running: it runs again when this run ends' }, 'resubmitted') : null,
          h('div', { class: 'spacer' }),
          admin ? h('div', { class: 'actions-bar', id: 'task-actions' }, taskActions(t, (r) => { if (r) { task = r; render(); } }, false, node)) : null),
        h('section', { class: 'card panel' }, h('dl', { class: 'fields' },
          field('Behavior', h('a', { href: listHref({ behavior: t.behavior }) }, t.behavior), 'behavior'),
          t.version ? field('Version', t.version, 'version') : null,
          field('State', retrying(t) ? h('span', { class: 'retry-note', id: 'task-retrying' }, retryNote(t))
            : wait ? h('span', {}, t.status + ', ', wait) : t.status, 'status'),
          field('Priority', t.priority, 'priority'),
          field('Attempt', t.attempt, 'attempt'),
          field('Consecutive errors', t.errors, 'errors'),
          field('Node', t.node, 'node'),
          t.status === 'running' ? field('Lease', t.lease ? h('code', {}, t.lease) : null, 'lease') : null,
          field(running ? 'Lease expires' : 'Due', running ? timeEl(t.lost_not_before) : (t.schedule_not_before ? timeEl(t.schedule_not_before) : null), 'due'),
          field('Group', t.group_key ? h('span', {}, h('a', { href: listHref({ group: t.group_key }) }, t.group_key),
            groupHeld ? [' ', pill('held')] : null,
            admin ? [' ', actionButton(groupHeld ? 'Release group' : 'Hold group', groupHeld ? 'release-group' : 'hold-group', async () => {
              await api('POST', '/groups/' + encodeURIComponent(t.group_key) + (groupHeld ? '/release' : '/hold'));
              await refreshStats();
              render();
            })] : null) : null, 'group'),
          field('Parent', t.parent_id ? h('a', { href: taskHref(t.parent_id) }, t.parent_id) : null, 'parent'),
          spawned || mayHaveChildren(t) ? field('Children', h('span', {}, h('a', { href: listHref({ parent: t.id }) }, 'list children'),
            t.children_pending ? ' (' + t.children_pending.toLocaleString() + ' pending)' : null), 'children') : null,
          field('Created', timeEl(t.created_at), 'created'),
          field('Updated', timeEl(t.updated_at), 'updated'),
          field('Started', timeEl(t.executed_at), 'started'),
          field('Finished', timeEl(t.finished_at), 'finished'),
          field('Retention', h('span', { id: 'task-retention' }, t.retention ? fmtDuration(durationMs(t.retention)) + ' after it finishes' : "its behavior's"), 'retention'),
          t.trace ? field('Trace', h('code', {}, t.trace), 'trace') : null)),
        h('div', { class: 'grid2' },
          h('div', {},
            t.error ? panel('Error', h('span', { id: 'task-error-kind' }, errorKind(t)), h('div', { class: 'panel-body' },
              h('div', { class: 'error-box', id: 'task-error' }, t.error.code ? h('div', { class: 'code' }, t.error.code) : null, h('div', {}, t.error.message)),
              t.error.properties ? h('div', { class: 'mt' }, pretty(t.error.properties)) : null)) : null,
            t.result != null ? panel('Result', null, h('div', { class: 'panel-body', id: 'task-result' }, pretty(t.result))) : null,
            t.progress != null ? panel('Progress', 'the last checkpoint', h('div', { class: 'panel-body', id: 'task-progress' }, pretty(t.progress))) : null,
            panel('Params', null, h('div', { class: 'panel-body', id: 'task-params' }, pretty(t.params))),
            signalsPanel(t),
            eventsPanel(t)),
          panel('Timeline', 'from the task and the live events', timeline(t, node), forkForm(t, node))));
    }

    const reload = throttle(load, 300);
    // A wait on a limit begins and ends with no event of the task, a
    // waiting node's dependencies (a workflow's nodes) end with events of
    // other tasks, and a signal comes with none: while the task is due or
    // waiting, look again now and then, and redraw only when what it waits
    // on or the signals it has changed (a redraw would reset a
    // half-confirmed action).
    const waitsOn = (t) => JSON.stringify([t.waiting || null, t.status === 'waiting' ? t.children_pending || 0 : 0,
      (t.signals || []).map((s) => s.seq)]);
    const waitTimer = setInterval(async () => {
      if (!task || (task.status !== 'scheduled' && task.status !== 'waiting' && !retrying(task))) return;
      let t;
      try { t = await api('GET', taskPath(id)); } catch (_) { return; }
      if (waitsOn(t) !== waitsOn(task)) { task = t; render(); }
    }, 5000);
    load();
    return {
      name: 'task', el,
      dispose: () => clearInterval(waitTimer),
      onEvent: (e) => {
        if (e.task_id !== id) return;
        seen.push(e);
        if (e.status === 'removed') removed = true;
        reload();
      },
      onStats: () => {
        // Redraw only when what the page shows of the statistics changed,
        // so that a half-confirmed action is not reset.
        const held = !!(task && task.group_key && (state.stats.held_groups || []).includes(task.group_key));
        if (task && held !== groupHeldShown) render();
      },
      refresh: load,
    };
  }

  // dbState shows a node's database incidents as it reported them: those
  // going on (a failing listener lets it report; an unreachable database
  // shows as a late heartbeat instead), else the last one that ended.
  function dbState(n) {
    const open = n.incidents || [];
    if (open.length > 0) {
      return h('span', {}, pill('degraded'), ' ', open.map((i) => i.cause + ' since ').join(''),
        timeEl(open[0].started), h('div', { class: 'faint' }, open[open.length - 1].error));
    }
    const last = n.last_incident;
    if (!last) return h('span', { class: 'faint' }, 'no incident');
    return h('span', { title: last.error, dataset: { last: last.cause } }, 'ok · last: ' + last.cause + ' for ' +
      fmtDuration(Date.parse(last.ended) - Date.parse(last.started)) + ', ended ', timeEl(last.ended));
  }

  function nodesView() {
    const body = h('div', { class: 'table-wrap' }, h('div', { class: 'empty' }, 'Loading…'));
    const el = h('div', {}, h('div', { class: 'page-head' }, h('h1', {}, 'Nodes')),
      panel('Server nodes', 'health from the heartbeat age, by the database\'s clock', body));
    async function load() {
      let r;
      try { r = await api('GET', '/nodes'); } catch (e) {
        fill(body, h('p', { class: 'error-text panel-body' }, e.message));
        return;
      }
      fill(body, r.nodes.length === 0 ? h('div', { class: 'empty' }, 'No server node is registered.')
        : h('table', { id: 'nodes' },
          h('thead', {}, h('tr', {}, ['Node', 'Version', 'Health', 'Database', 'Host', 'PID', 'Running', 'Workers', 'Expired leases', 'Behaviors', 'Started', 'Heartbeat']
            .map((c, i) => h('th', { class: [5, 6, 7, 8].includes(i) ? 'num' : null }, c)))),
          h('tbody', {}, r.nodes.map((n) => h('tr', { dataset: { node: n.id } },
            h('td', { class: 'id' }, n.id), h('td', { class: 'version' + (n.version ? '' : ' faint') }, n.version || 'unknown'),
            h('td', {}, pill(n.health)), h('td', { class: 'db-state' }, dbState(n)), h('td', {}, n.host), h('td', { class: 'num' }, n.pid),
            h('td', { class: 'num' }, h('a', { href: listHref({ status: 'running' }) }, n.running)), h('td', { class: 'num' }, n.max_workers),
            h('td', { class: 'num' + (n.expired_leases ? '' : ' zero') }, n.expired_leases),
            h('td', { class: 'behaviors' }, (n.behaviors || []).map((b) => {
              const v = (n.behavior_versions || {})[b];
              return v ? b + '@' + v : b;
            }).join(', ')), h('td', {}, timeEl(n.started_at)),
            h('td', {}, fmtDuration(n.heartbeat_age_ms) + ' ago'))))));
    }
    const timer = setInterval(load, 5000);
    load();
    return { name: 'nodes', el, refresh: load, dispose: () => clearInterval(timer) };
  }

  function schedulesView() {
    const body = h('div', { class: 'table-wrap' }, h('div', { class: 'empty' }, 'Loading…'));
    const el = h('div', {}, h('div', { class: 'page-head' }, h('h1', {}, 'Schedules')),
      panel('Periodic schedules', 'each tick fires one task, once across all nodes', body));
    async function load() {
      let r;
      try { r = await api('GET', '/schedules'); } catch (e) {
        fill(body, h('p', { class: 'error-text panel-body' }, e.message));
        return;
      }
      fill(body, r.schedules.length === 0 ? h('div', { class: 'empty' }, 'No schedule is defined.')
        : h('table', { id: 'schedules' },
          h('thead', {}, h('tr', {}, ['Name', 'Behavior', 'Spec', 'Time zone', 'Origin', 'Last tick', 'Next tick']
            .map((c) => h('th', {}, c)))),
          h('tbody', {}, r.schedules.map((s) => h('tr', { dataset: { schedule: s.name } },
            h('td', { class: 'id' }, s.name), h('td', {}, s.behavior), h('td', {}, h('code', {}, s.spec)),
            h('td', {}, s.time_zone || 'UTC'), h('td', {}, s.registered ? 'behavior' : 'added'),
            h('td', {}, s.last_tick ? timeEl(s.last_tick) : '–'),
            h('td', { class: 'next-tick' }, s.next_tick && !s.next_tick.startsWith('0001-') ? timeEl(s.next_tick) : '–'))))));
    }
    const timer = setInterval(load, 5000);
    load();
    return { name: 'schedules', el, refresh: load, dispose: () => clearInterval(timer) };
  }

  // ---- limits ----

  // periodText writes a period (see durationMs) as "1h30m", "1m", "2s",
  // "500ms".
  function periodText(period) {
    let ms = Math.round(durationMs(period));
    if (ms < 1000) return ms + 'ms';
    const parts = [];
    for (const [unit, size] of [['h', 3600000], ['m', 60000], ['s', 1000]]) {
      const n = Math.floor(ms / size);
      if (n) parts.push(n + unit);
      ms -= n * size;
    }
    if (ms) parts.push(ms + 'ms');
    return parts.join('');
  }

  const limitsHref = '#/limits';

  // waitNote says what task t waits on, null when nothing: {href, body},
  // where href is the page that shows the cause (null when body has links
  // of its own) and body the text. Each reason of api.Wait has its own:
  // "waiting on rate limit L (key K), admitted in 5s" and "waiting on the
  // concurrency cap of B (key K)" (the Limits page), "waiting: B is
  // paused" (the overview, which resumes it), "waiting: no live node runs
  // B (...)" (or B of version V) and "waiting: every node that runs B is
  // full (...)" (the Nodes page), "waiting for signal T" for a task asleep
  // until a signal of the topic T comes (its page lists the signals and
  // sends one), and "waiting for its dependencies a, b
  // and 3 more" for a workflow's node, each dependency linked to its task
  // (at most `most` of them; the rest link to the workflow). A workflow's
  // own task waits for its nodes, which its page shows.
  function waitNote(t, most) {
    const wfHref = window.stintWorkflows.workflowHref;
    const w = t.waiting;
    if (!w) {
      if (t.behavior !== WORKFLOW || t.status !== 'waiting') return null;
      const n = t.children_pending || 0;
      return { href: null, body: ['waiting for ', h('a', { href: wfHref(t.id) }, n === 1 ? 'its last node' : 'its ' + n.toLocaleString() + ' nodes'), ' to end'] };
    }
    const b = w.behavior || w.limit;
    const key = w.key ? ' (key ' + w.key + ')' : '';
    switch (w.reason) {
      case 'rate_limit': return { href: limitsHref, body: ['waiting on rate limit ' + w.limit + key, w.until ? [', admitted ', dueEl(w.until)] : null] };
      case 'concurrency': return { href: limitsHref, body: ['waiting on the concurrency cap of ' + b + key] };
      case 'paused': return { href: '#/', body: ['waiting: ' + b + ' is paused'] };
      case 'group_held': return { href: listHref({ group: w.key }), body: ['waiting: its group ' + w.key + ' is held'] };
      // A wait for a node of a newer version says all in its detail.
      case 'no_node': return { href: '#/nodes', body: [w.version ? 'waiting: ' + w.detail : 'waiting: no live node runs ' + b + ' (' + w.detail + ')'] };
      case 'nodes_full': return { href: '#/nodes', body: ['waiting: every node that runs ' + b + ' is full (' + w.detail + ')'] };
      case 'signal': return { href: null, body: ['waiting for signal ', h('code', {}, w.key)] };
      case 'dependencies': {
        const deps = w.dependencies || [];
        if (deps.length === 0) return { href: null, body: ['waiting for its dependencies'] };
        const links = deps.slice(0, most).map((name, i) => [i ? ', ' : '',
          h('a', { href: taskHref(t.parent_id + '/' + name), dataset: { dependency: name } }, name)]);
        const more = deps.length - Math.min(most, deps.length);
        return { href: null, body: ['waiting for its ' + (deps.length === 1 ? 'dependency ' : 'dependencies '), links,
          more ? [' and ', h('a', { href: wfHref(t.parent_id), dataset: { more } }, more.toLocaleString() + ' more')] : null] };
      }
    }
    return { href: null, body: ['waiting: ' + w.reason.replaceAll('_', ' ') + (b ? ' of ' + b : '') + key] };
  }

  // waitEl shows waitNote(t, most) as an element with attrs: a <div> in
  // a row of a list (whose task is the row's link), else a link to the
  // cause when it has one; null when t waits on nothing.
  function waitEl(t, most, attrs, inRow) {
    const n = waitNote(t, most);
    if (!n) return null;
    const a = { class: 'wait-note', ...attrs };
    if (inRow) return h('div', a, n.body);
    return n.href ? h('a', { ...a, href: n.href }, n.body) : h('span', a, n.body);
  }

  function limitsView() {
    const rateBody = h('div', { class: 'table-wrap' }, h('div', { class: 'empty' }, 'Loading…'));
    const capBody = h('div', { class: 'table-wrap' }, h('div', { class: 'empty' }, 'Loading…'));
    const admin = can('admin');
    const el = h('div', {}, h('div', { class: 'page-head' }, h('h1', {}, 'Limits')),
      panel('Rate limits', 'each key may start limit units per period, and a full limit after a period idle', rateBody,
        admin ? rateForm() : null),
      panel('Concurrency caps', 'the most tasks of a behavior, or of one group key, running at once on all nodes', capBody,
        admin ? capForm() : null));

    // field returns a labelled input of a form.
    function field(id, label, attrs) {
      const input = h('input', { id, spellcheck: 'false', ...attrs });
      return [h('div', { class: 'field' }, h('label', { for: id }, label), input), input];
    }

    function rateForm() {
      const [nameF, name] = field('rl-name', 'Name', { placeholder: 'partner-api', required: true });
      const [limitF, limit] = field('rl-limit', 'Limit', { type: 'number', min: '1', step: '1', placeholder: '100', required: true });
      const [periodF, period] = field('rl-period', 'Period', { placeholder: '1m', required: true });
      return h('form', {
        class: 'filters', id: 'rl-form', onsubmit: async (ev) => {
          ev.preventDefault();
          const n = name.value.trim();
          try {
            await api('PUT', '/limits/rate/' + encodeURIComponent(n), { limit: Number(limit.value), period: period.value.trim() });
            toast('Rate limit ' + n + ' set');
            load();
          } catch (e) { toast('Set rate limit failed: ' + e.message, true); }
        },
      }, nameF, limitF, periodF, h('button', { class: 'btn primary', type: 'submit', id: 'rl-set' }, 'Set rate limit'));
    }

    // capForm sets a cap. Its behavior has no default: one is typed or
    // picked from the registered ones. A behavior no live node runs needs
    // "not deployed yet" ticked, else the server refuses it.
    function capForm() {
      const [behaviorF, behavior] = field('cl-behavior', 'Behavior', { list: 'cl-behaviors', placeholder: 'behavior', required: true });
      const force = h('input', { id: 'cl-force', type: 'checkbox' });
      const forceF = h('div', { class: 'field check', title: 'set the cap of a behavior whose nodes are not deployed yet' },
        h('label', { for: 'cl-force' }, force, ' Not deployed yet'));
      const [keyF, key] = field('cl-key', 'Group key', { placeholder: 'all keys' });
      const [maxF, max] = field('cl-max', 'Max running', { type: 'number', min: '0', step: '1', placeholder: '4', required: true });
      const [weightF, weight] = field('cl-weight', 'Weight', { type: 'number', min: '0', step: '1', placeholder: '1' });
      return h('form', {
        class: 'filters', id: 'cl-form', onsubmit: async (ev) => {
          ev.preventDefault();
          const body = { max: Number(max.value) };
          if (key.value.trim()) body.key = key.value.trim();
          if (weight.value.trim()) body.weight = Number(weight.value);
          if (force.checked) body.force = true;
          const b = behavior.value.trim();
          try {
            await api('PUT', '/limits/concurrency/' + encodeURIComponent(b), body);
            toast('Concurrency cap of ' + b + ' set');
            load();
          } catch (e) { toast('Set concurrency cap failed: ' + e.message, true); }
        },
      }, behaviorF, h('datalist', { id: 'cl-behaviors' }, state.behaviors.map((b) => h('option', { value: b }))),
      keyF, maxF, weightF, forceF, h('button', { class: 'btn primary', type: 'submit', id: 'cl-set' }, 'Set cap'));
    }

    function removeButton(what, path) {
      return actionButton('Remove', 'remove-limit', async () => { await api('DELETE', path); load(); },
        { danger: true, confirm: 'Click again to remove', done: 'Removed ' + what });
    }

    // nextFree says when a key's next unit frees: never "now", which
    // would read as a unit free while the budget is spent (a unit of a
    // fast limit frees every fraction of a second); "all free" when
    // nothing is spent.
    function nextFree(k) {
      if (!k.next_free) return h('span', { class: 'faint', title: 'no unit of the budget is spent' }, 'all free');
      const ms = Date.parse(k.next_free) - serverNow();
      return h('time', { datetime: k.next_free, title: absTime(k.next_free) }, ms < 1000 ? 'within a second' : 'in ' + fmtDuration(ms));
    }

    function renderRate(list) {
      const rows = [];
      for (const l of list) {
        const keys = l.keys || [];
        rows.push(h('tr', { dataset: { limit: l.name, key: '' }, class: 'limit-head' },
          h('td', { class: 'id' }, l.name),
          h('td', { class: 'num', dataset: { field: 'rate' } }, l.limit.toLocaleString() + ' / ' + periodText(l.period)),
          h('td', { class: 'faint' }, keys.length ? keys.length + (keys.length === 1 ? ' key' : ' keys') : 'no key used lately'),
          h('td', {}), h('td', { class: 'num' + (l.waiting ? '' : ' zero'), dataset: { field: 'waiting' } }, l.waiting), h('td', {}),
          admin ? h('td', { class: 'actions' }, removeButton(l.name, '/limits/rate/' + encodeURIComponent(l.name))) : null));
        for (const k of keys) {
          rows.push(h('tr', { dataset: { limit: l.name, key: k.key } },
            h('td', {}), h('td', {}),
            h('td', { class: 'id' }, k.key || h('span', { class: 'faint' }, '(no key)')),
            h('td', { class: 'num', dataset: { field: 'used' } }, k.used + ' / ' + l.limit),
            h('td', { class: 'num' + (k.waiting ? '' : ' zero'), dataset: { field: 'waiting' } }, k.waiting),
            h('td', { dataset: { field: 'next-free' } }, nextFree(k)),
            admin ? h('td', {}) : null));
        }
      }
      fill(rateBody, list.length === 0 ? h('div', { class: 'empty', id: 'rate-limits-empty' }, 'No rate limit is set.')
        : h('table', { id: 'rate-limits' },
          h('thead', {}, h('tr', {}, ['Name', 'Limit', 'Key', 'Used', 'Waiting', 'Next unit frees']
            .map((c, i) => h('th', { class: [1, 3, 4].includes(i) ? 'num' : null }, c)), admin ? h('th', {}) : null)),
          h('tbody', {}, rows)));
    }

    function renderCaps(list) {
      fill(capBody, list.length === 0 ? h('div', { class: 'empty', id: 'concurrency-limits-empty' }, 'No concurrency cap is set at runtime; the behaviors\' policies apply.')
        : h('table', { id: 'concurrency-limits' },
          h('thead', {}, h('tr', {}, ['Behavior', 'Key', 'Max', 'Weight', 'Running', 'Waiting']
            .map((c, i) => h('th', { class: i >= 2 ? 'num' : null }, c)), admin ? h('th', {}) : null)),
          h('tbody', {}, list.map((c) => h('tr', { dataset: { cap: c.behavior, key: c.key || '' } },
            h('td', {}, h('a', { href: listHref({ behavior: c.behavior }) }, c.behavior)),
            h('td', { class: 'id' }, c.key ? h('a', { href: listHref({ behavior: c.behavior, group: c.key }) }, c.key) : h('span', { class: 'faint' }, 'all')),
            h('td', { class: 'num', dataset: { field: 'max' } }, c.max || h('span', { class: 'faint', title: 'the policy\'s cap' }, 'policy')),
            h('td', { class: 'num', dataset: { field: 'weight' } }, c.key ? c.weight || 1 : h('span', { class: 'faint' }, '—')),
            h('td', { class: 'num' + (c.running ? '' : ' zero'), dataset: { field: 'running' } }, c.running),
            h('td', { class: 'num' + (c.waiting ? '' : ' zero'), dataset: { field: 'waiting' } }, c.waiting),
            admin ? h('td', { class: 'actions' }, removeButton(c.behavior + (c.key ? ' key ' + c.key : ''),
              '/limits/concurrency/' + encodeURIComponent(c.behavior) + (c.key ? '?key=' + encodeURIComponent(c.key) : ''))) : null)))));
    }

    async function load() {
      let r;
      try { r = await api('GET', '/limits'); } catch (e) {
        fill(rateBody, h('p', { class: 'error-text panel-body' }, e.message));
        fill(capBody);
        return;
      }
      renderRate(r.rate);
      renderCaps(r.concurrency);
    }
    const timer = setInterval(load, 3000);
    load();
    return { name: 'limits', el, refresh: load, onEvent: throttle(load, 1000), dispose: () => clearInterval(timer) };
  }

  // ---- ingest batches ----

  // The Merritt states of batches and jobs, by the task state whose color
  // they take.
  const MERRITT = {
    Pending: 'scheduled', Held: 'held', Completed: 'success', Failed: 'failure', Deleted: 'removed',
    Estimating: 'running', Provisioning: 'running', Downloading: 'running', Processing: 'running', Storing: 'running',
    Recording: 'running', Notify: 'running', Reporting: 'running', UpdateReporting: 'running',
  };
  const MERRITT_ORDER = ['Pending', 'Held', 'Estimating', 'Provisioning', 'Downloading', 'Processing', 'Storing',
    'Recording', 'Notify', 'Completed', 'Failed', 'Deleted'];
  const statePill = (st) => h('span', { class: 'pill', dataset: { status: MERRITT[st] || 'removed', state: st } }, st || '—');
  const batchesHref = (profile, after) => '#/batches' + (profile || after
    ? '?' + new URLSearchParams(Object.entries({ profile, after }).filter(([, v]) => v)).toString() : '');
  const batchHref = (id) => '#/batches/' + encodeURIComponent(id);

  // batchLink links a task page to its batch page.
  function batchLink(t) {
    if (!state.features.includes('batches')) return null;
    if (t.behavior === 'ingest.batch') return h('a', { class: 'btn small', href: batchHref(t.id) }, 'Batch view');
    if (t.behavior === 'ingest.job' && t.parent_id) return h('a', { class: 'btn small', href: batchHref(t.parent_id) }, 'Its batch');
    return null;
  }

  function jobCounts(counts) {
    const keys = Object.keys(counts || {}).sort((a, b) => MERRITT_ORDER.indexOf(a) - MERRITT_ORDER.indexOf(b));
    if (keys.length === 0) return h('span', { class: 'faint' }, 'no jobs');
    return h('span', { class: 'chips' }, keys.map((k) => h('span', { class: 'count-chip', dataset: { status: MERRITT[k] || 'removed' } }, k + ' ', h('b', {}, counts[k]))));
  }

  function batchesView(params) {
    const profile = params.get('profile') || '';
    const after = params.get('after') || '';
    const body = h('div', { class: 'table-wrap' }, h('div', { class: 'empty' }, 'Loading…'));
    const pager = h('div', { class: 'pager' });
    const profileIn = h('input', { id: 'f-profile', value: profile, placeholder: 'profile (collection)', spellcheck: 'false' });
    const el = h('div', {},
      h('div', { class: 'page-head' }, h('h1', {}, 'Batches'), after ? h('span', { class: 'muted' }, 'after ', h('code', {}, after)) : null),
      h('section', { class: 'card panel' },
        h('form', { class: 'filters', onsubmit: (ev) => { ev.preventDefault(); location.hash = batchesHref(profileIn.value.trim()); } },
          h('div', { class: 'field' }, h('label', { for: 'f-profile' }, 'Profile'), profileIn),
          h('button', { class: 'btn', type: 'submit' }, 'Filter'),
          h('a', { class: 'btn ghost', href: '#/batches' }, 'Clear')),
        body, pager));
    async function load() {
      const q = new URLSearchParams({ limit: '50' });
      if (profile) q.set('profile', profile);
      if (after) q.set('after', after);
      let r;
      try { r = await api('GET', '/batches?' + q.toString()); } catch (e) {
        fill(body, h('p', { class: 'error-text panel-body' }, e.message));
        return;
      }
      fill(body, r.batches.length === 0 ? h('div', { class: 'empty' }, after ? 'No more batches.' : 'No batch yet.')
        : h('table', { id: 'batches' },
          h('thead', {}, h('tr', {}, ['Batch', 'Profile', 'State', 'Jobs', 'Submitter', 'Created', 'Updated'].map((c) => h('th', {}, c)))),
          h('tbody', {}, r.batches.map((b) => h('tr', { dataset: { batchId: b.id, state: b.status } },
            h('td', { class: 'id', title: b.id }, h('a', { href: batchHref(b.id) }, b.id)),
            h('td', {}, h('a', { href: batchesHref(b.profile) }, b.profile), b.collection_held ? [' ', pill('held')] : null),
            h('td', {}, statePill(b.status)),
            h('td', {}, jobCounts(b.counts)),
            h('td', {}, b.submitter),
            h('td', {}, timeEl(b.created_at)),
            h('td', {}, timeEl(b.updated_at)))))));
      pager.hidden = !after && !r.next;
      fill(pager,
        after ? h('a', { class: 'btn', href: batchesHref(profile) }, 'First page') : null,
        r.next ? h('a', { class: 'btn', href: batchesHref(profile, r.next) }, 'Next page →') : null);
    }
    const reload = throttle(load, 1000);
    load();
    return { name: 'batches', el, refresh: load, onEvent: (e) => { if (e.behavior.startsWith('ingest.')) reload(); } };
  }

  function batchView(id) {
    const el = h('div', {}, h('div', { class: 'empty' }, 'Loading…'));
    function field(label, value) {
      return h('div', {}, h('dt', {}, label), h('dd', {}, value == null || value === '' ? h('span', { class: 'faint' }, '—') : value));
    }
    async function load() {
      let b;
      try { b = await api('GET', '/batches/' + encodeURIComponent(id)); } catch (e) {
        fill(el, h('div', { class: 'page-head' }, h('h1', { class: 'mono' }, id)),
          h('div', { class: 'card empty' }, e.status === 404 ? 'No batch with this id.' : e.message));
        return;
      }
      const rep = b.report;
      fill(el,
        h('div', { class: 'page-head' },
          h('h1', { class: 'mono', id: 'batch-id' }, b.id),
          h('span', { id: 'batch-state' }, statePill(b.status)),
          b.collection_held ? pill('held') : null,
          h('div', { class: 'spacer' }),
          can('admin') ? h('div', { class: 'actions-bar', id: 'batch-actions' }, batchActions(b)) : null,
          h('a', { class: 'btn small', href: taskHref(b.id) }, 'Task view')),
        h('section', { class: 'card panel' }, h('dl', { class: 'fields' },
          field('Profile', h('a', { href: batchesHref(b.profile) }, b.profile)),
          field('Submitter', b.submitter),
          field('Task state', pill(b.task_status)),
          field('Jobs', jobCounts(b.counts)),
          field('Created', timeEl(b.created_at)),
          field('Updated', timeEl(b.updated_at)),
          b.error ? field('Error', h('span', { class: 'error-text' }, b.error)) : null)),
        h('div', { class: 'grid2' },
          panel('Jobs', (b.jobs || []).length + ' jobs', h('div', { class: 'table-wrap' }, (b.jobs || []).length === 0
            ? h('div', { class: 'empty' }, 'No jobs yet: the batch has not run.')
            : h('table', { id: 'jobs' },
              h('thead', {}, h('tr', {}, ['Job', 'State', 'Last done', 'Requeues', 'Attempt', 'Priority', 'Node', 'Local id', 'Identifier', 'Updated'].map((c) => h('th', {}, c)))),
              h('tbody', {}, b.jobs.map((j) => h('tr', { dataset: { taskId: j.id, state: j.status } },
                h('td', { class: 'id', title: j.id }, h('a', { href: taskHref(j.id) }, j.id)),
                h('td', {}, statePill(j.status), j.error ? h('div', { class: 'error-text' }, j.error) : null),
                h('td', {}, j.last_successful_status || ''),
                h('td', { class: 'num' }, j.retry_count),
                h('td', { class: 'num' }, j.attempt),
                h('td', { class: 'num' }, j.priority),
                h('td', { class: 'id' }, j.node || ''),
                h('td', { class: 'id' }, j.local_id || ''),
                h('td', { class: 'id' }, j.identifier || ''),
                h('td', {}, timeEl(j.updated_at)))))))),
          h('div', {},
            rep ? panel('Report', ['made ', timeEl(rep.at)], h('div', { class: 'panel-body', id: 'batch-report' },
              h('p', {}, rep.jobs + ' jobs: ', h('b', {}, (rep.succeeded || []).length), ' succeeded, ',
                h('b', {}, (rep.failed || []).length), ' failed', rep.deleted ? ', ' + rep.deleted + ' deleted' : ''),
              (rep.failed || []).length ? h('div', {}, h('div', { class: 'muted' }, 'Failed:'),
                h('div', { class: 'chips' }, rep.failed.map((f) => h('a', { class: 'chip', href: taskHref(f) }, f)))) : null,
              (rep.recovered || []).length ? h('div', { class: 'mt' }, h('div', { class: 'muted' }, 'Recovered since the last report:'),
                h('div', { class: 'chips' }, rep.recovered.map((f) => h('a', { class: 'chip', href: taskHref(f) }, f)))) : null)) : null,
            (b.notices || []).length ? panel('Notices', 'to the depositors', h('ol', { class: 'timeline', id: 'batch-notices' },
              b.notices.map((n) => h('li', { dataset: { status: n.error ? 'failure' : 'success', kind: n.kind } },
                h('span', { class: 'when' }, timeEl(n.at)),
                h('span', {}, n.kind === 'queued' ? 'Queued notice' : 'Report notice', ': ',
                  n.error ? h('span', { class: 'error-text' }, 'not sent: ' + n.error) : 'sent'))))) : null,
            panel('History', null, (b.history || []).length === 0 ? h('div', { class: 'empty' }, 'No transitions yet.')
              : h('ol', { class: 'timeline' }, b.history.map((tr) => h('li', { dataset: { status: MERRITT[tr.to] || 'removed' } },
                h('span', { class: 'when' }, timeEl(tr.at)), h('span', {}, (tr.from || '∅') + ' → ' + tr.to))))))));
    }
    // batchActions returns the admin actions the batch's state allows:
    // hold a Pending batch, release a Held one, requeue the jobs of a
    // Failed one, delete a Held, Failed or Completed one.
    function batchActions(b) {
      const path = '/batches/' + encodeURIComponent(b.id);
      const act = (verb) => async () => { await api('POST', path + '/' + verb); await load(); };
      const st = b.status;
      return [
        st === 'Pending' ? actionButton('Hold', 'batch-hold', act('hold'), { done: 'Held ' + b.id }) : null,
        st === 'Held' ? actionButton('Release', 'batch-release', act('release'), { done: 'Released ' + b.id }) : null,
        st === 'Failed' ? actionButton('Requeue', 'batch-requeue', act('requeue'), { done: 'Requeued the failed jobs of ' + b.id }) : null,
        ['Held', 'Failed', 'Completed'].includes(st) ? actionButton('Delete', 'batch-delete', async () => {
          await api('DELETE', path);
          location.hash = batchesHref(b.profile);
        }, { danger: true, confirm: 'Click again to delete', done: 'Deleted ' + b.id }) : null,
      ];
    }

    const reload = throttle(load, 500);
    load();
    return {
      name: 'batch', el, refresh: load,
      onEvent: (e) => { if (e.task_id === id || e.parent_id === id) reload(); },
    };
  }

  // workflowCtx is what the workflow pages (workflows.js) use of this page.
  const workflowCtx = { h, fill, api, can, taskHref, listHref, timeEl, throttle, panel, actionButton };

  // ---- routing ----

  function route() {
    if (!state.started) return;
    if (state.view && state.view.dispose) state.view.dispose();
    const hash = location.hash.replace(/^#/, '') || '/';
    const [path, qs] = hash.split('?');
    const params = new URLSearchParams(qs || '');
    let view;
    let nav = 'overview';
    if (path.startsWith('/tasks/')) {
      view = taskView(decodeURIComponent(path.slice('/tasks/'.length)));
      nav = 'tasks';
    } else if (path === '/tasks') {
      view = tasksView(params);
      nav = 'tasks';
    } else if (path.startsWith('/workflows/')) {
      view = window.stintWorkflows.view(workflowCtx, decodeURIComponent(path.slice('/workflows/'.length)));
      nav = 'workflows';
    } else if (path === '/workflows') {
      view = window.stintWorkflows.listView(workflowCtx, params);
      nav = 'workflows';
    } else if (path.startsWith('/batches/') && state.features.includes('batches')) {
      view = batchView(decodeURIComponent(path.slice('/batches/'.length)));
      nav = 'batches';
    } else if (path === '/batches' && state.features.includes('batches')) {
      view = batchesView(params);
      nav = 'batches';
    } else if (path === '/nodes') {
      view = nodesView();
      nav = 'nodes';
    } else if (path === '/schedules') {
      view = schedulesView();
      nav = 'schedules';
    } else if (path === '/limits') {
      view = limitsView();
      nav = 'limits';
    } else {
      view = overviewView();
    }
    state.view = view;
    document.body.dataset.view = view.name;
    for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === nav);
    fill($('#main'), view.el);
    window.scrollTo(0, 0);
  }
  window.addEventListener('hashchange', route);

  // ---- submit ----

  const dialog = $('#submit-dialog');
  $('#new-task').addEventListener('click', () => {
    const sel = $('#submit-behavior');
    fill(sel, ...state.behaviors.map((b) => h('option', { value: b }, b)));
    $('#submit-error').hidden = true;
    dialog.showModal();
  });
  $('#submit-cancel').addEventListener('click', () => dialog.close());
  $('#submit-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const err = $('#submit-error');
    const body = { behavior: $('#submit-behavior').value };
    try {
      body.params = JSON.parse($('#submit-params').value || '{}');
    } catch (e) {
      err.hidden = false;
      err.textContent = 'Params are not valid JSON: ' + e.message;
      return;
    }
    const id = $('#submit-id').value.trim();
    const prio = $('#submit-priority').value.trim();
    const delay = $('#submit-delay').value.trim();
    const group = $('#submit-group').value.trim();
    if (id) body.id = id;
    if (prio) body.priority = Number(prio);
    if (delay) body.delay = delay;
    if (group) body.group_key = group;
    try {
      const sub = await api('POST', '/tasks', body);
      $('#submit-form').reset();
      dialog.close();
      toast((sub.created ? 'Submitted ' : 'Merged into ') + sub.id);
      location.hash = taskHref(sub.id);
    } catch (e) {
      err.hidden = false;
      err.textContent = e.message;
    }
  });

  // ---- start ----

  // start shows the dashboard for the token in state; after a new sign-in
  // it restarts the stream and redraws the view for the new role.
  function start() {
    $('#login').hidden = true;
    updateChrome();
    if (!state.started) {
      state.started = true;
      // The counters follow the event stream; this only catches what a
      // broken stream missed.
      setInterval(refreshStats, 60000);
    }
    startStream();
    refreshStats();
    route();
  }

  // takeToken takes a token from the fragment, which the browser never
  // sends, and drops it from the address bar, keeping the route the link
  // names: "#token=T" (as `stint dev` prints it) opens the overview,
  // "#/tasks/ID?token=T" the task.
  function takeToken() {
    const hash = location.hash.replace(/^#/, '');
    const m = hash.match(/^token=([^&]+)$/);
    if (m) {
      state.token = decodeURIComponent(m[1]);
      sessionStorage.setItem(TOKEN_KEY, state.token);
      history.replaceState(null, '', location.pathname + '#/');
      return;
    }
    const [path, qs] = hash.split('?');
    const params = new URLSearchParams(qs || '');
    if (!params.get('token')) return;
    state.token = params.get('token');
    sessionStorage.setItem(TOKEN_KEY, state.token);
    params.delete('token');
    const rest = params.toString();
    history.replaceState(null, '', location.pathname + '#' + (path || '/') + (rest ? '?' + rest : ''));
  }

  async function boot() {
    takeToken();
    try {
      await whoami();
    } catch (e) {
      if (e.status !== 401) showLogin('Cannot reach the API: ' + e.message);
      return;
    }
    start();
  }

  boot();
})();
