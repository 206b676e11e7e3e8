// stint dashboard workflows: the list of workflows, a page per workflow
// that draws its graph in SVG, and the workflow a node belongs to on its
// task page. The layout is computed here, from GET /api/v1/workflows/{id}:
// each node in the layer of its longest path from a node without
// dependencies, the nodes of a layer ordered by the mean position of
// their dependencies (fewer crossings), drawn top to bottom.
//
// A layer wider than GROUP_OVER nodes is drawn grouped: its nodes with
// the same state and the same dependencies (as drawn: boxes of the layers
// above) share one box with a count, so a fan-out of 10,000 nodes is a
// few boxes. Every box says what it stands for, for readers and tests
// alike: <g class="wf-node"> has data-state, data-count (the nodes it
// stands for), data-name (a single node's name) and data-layer; every
// <path class="wf-edge"> has data-state (failed when one of its edges is,
// else waiting when one is, else satisfied), data-count (the edges it
// stands for) and data-satisfied, data-waiting, data-failed (how many of
// each). The <svg id="wf-graph"> has data-nodes and data-edges, the totals.
//
// The finally node depends on every other node: its dependence is drawn
// once, by edges from the sinks (the nodes that no other node depends on),
// each waiting until its sink and every node the sink depends on, however
// far up, ended. Its path has data-finally; the <svg> has
// data-finally-dependencies, the dependencies those edges stand for.
'use strict';
(() => {
  const SVG = 'http://www.w3.org/2000/svg';
  const GROUP_OVER = 24; // a wider layer is drawn grouped
  const BOX_W = 168, BOX_H = 40, GAP_X = 16, GAP_Y = 56, PAD = 16;
  const WF_STATES = ['running', 'succeeded', 'failed', 'cancelled'];
  // The node states in the legend's order.
  const NODE_STATES = ['waiting', 'scheduled', 'held', 'running', 'retrying', 'success', 'failure', 'skipped', 'cancelled'];

  function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v != null) el.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c != null) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  // nodeState is a node's state as drawn: its status, with a retried
  // failure, a skipped node and a cancelled one told apart from a failure.
  function nodeState(t) {
    if (t.status === 'failure' && t.schedule_not_before) return 'retrying';
    if (t.status === 'failure' && t.error && (t.error.code === 'skipped' || t.error.code === 'cancelled')) return t.error.code;
    return t.status;
  }

  const ended = (t) => (t.status === 'success' || t.status === 'failure') && !t.schedule_not_before;

  // edgeState is the state of the edge from dep to a node of rule: waiting
  // until dep ended, then satisfied when dep's outcome lets the node run
  // by its rule, else failed.
  function edgeState(dep, rule) {
    if (!ended(dep)) return 'waiting';
    if (dep.status === 'success' || rule === 'all_ended') return 'satisfied';
    if (rule === 'none_failed' && dep.error && dep.error.code === 'skipped') return 'satisfied';
    return 'failed';
  }

  // layout places the nodes of wf: layers, boxes (grouped where a layer is
  // wide), their positions, and the edges between boxes.
  function layout(wf) {
    const nodes = wf.nodes || [];
    const index = new Map(nodes.map((n, i) => [n.name, i]));
    const named = nodes.map((n) => [...new Set((n.depends_on || []).map((d) => index.get(d)).filter((d) => d !== undefined))]);
    // The finally node's dependencies as drawn: the sinks among them.
    const fin = nodes.findIndex((n) => n.finally);
    const deps = named.map((ds, i) => (i === fin ? [] : ds));
    if (fin >= 0) {
      const depended = new Set(deps.flat());
      deps[fin] = named[fin].filter((d) => !depended.has(d));
    }
    // Longest-path layering in topological order (Kahn's).
    const dependents = nodes.map(() => []);
    const pending = deps.map((d) => d.length);
    deps.forEach((ds, i) => ds.forEach((d) => dependents[d].push(i)));
    const layer = new Array(nodes.length).fill(0);
    const queue = [];
    pending.forEach((p, i) => { if (p === 0) queue.push(i); });
    for (let q = 0; q < queue.length; q++) {
      const i = queue[q];
      for (const j of dependents[i]) {
        layer[j] = Math.max(layer[j], layer[i] + 1);
        if (--pending[j] === 0) queue.push(j);
      }
    }
    const layers = [];
    for (const i of queue) (layers[layer[i]] ||= []).push(i);
    // unended: the node, or one it depends on however far up, has not ended.
    const unended = new Array(nodes.length).fill(false);
    for (const i of queue) unended[i] = !ended(nodes[i].task) || deps[i].some((d) => unended[d]);

    const boxOf = new Array(nodes.length);
    const boxes = [];
    const rows = [];
    layers.forEach((members, l) => {
      const row = [];
      const byKey = new Map();
      for (const i of members) {
        const state = nodeState(nodes[i].task);
        let key = 'n' + i;
        if (members.length > GROUP_OVER) {
          key = state + '|' + [...new Set(deps[i].map((d) => boxOf[d].id))].sort((a, b) => a - b).join(',');
        }
        let b = byKey.get(key);
        if (!b) {
          b = { id: boxes.length, layer: l, state, members: [], deps: new Set() };
          boxes.push(b);
          byKey.set(key, b);
          row.push(b);
        }
        b.members.push(i);
        for (const d of deps[i]) b.deps.add(boxOf[d]);
        boxOf[i] = b;
      }
      // Order by the mean position of the boxes depended on, a little
      // against crossings; the first layer keeps the nodes' name order.
      for (const b of row) {
        const ds = [...b.deps];
        b.bary = ds.length ? ds.reduce((s, d) => s + d.cx, 0) / ds.length : b.id;
      }
      if (l > 0) row.sort((a, b) => a.bary - b.bary || a.id - b.id);
      rows.push(row);
      // Centre the layers on the widest so far, so that positions compare.
      const width = row.length * (BOX_W + GAP_X);
      row.forEach((b, k) => { b.cx = -width / 2 + k * (BOX_W + GAP_X) + BOX_W / 2; });
    });
    const widest = Math.max(1, ...rows.map((r) => r.length)) * (BOX_W + GAP_X) - GAP_X;
    for (const b of boxes) {
      b.x = PAD + widest / 2 + b.cx - BOX_W / 2;
      b.y = PAD + b.layer * (BOX_H + GAP_Y);
    }

    const edges = new Map();
    let total = 0;
    nodes.forEach((n, i) => {
      for (const d of deps[i]) {
        const key = boxOf[d].id + '>' + boxOf[i].id;
        let e = edges.get(key);
        if (!e) edges.set(key, e = { from: boxOf[d], to: boxOf[i], finally: i === fin, satisfied: 0, waiting: 0, failed: 0 });
        e[i === fin ? (unended[d] ? 'waiting' : 'satisfied') : edgeState(nodes[d].task, n.rule)]++;
        total++;
      }
    });
    return {
      boxes, edges: [...edges.values()], total, finallyDeps: fin >= 0 ? named[fin].length : 0,
      width: widest + 2 * PAD,
      height: rows.length * (BOX_H + GAP_Y) - GAP_Y + 2 * PAD,
    };
  }

  const edgeStateOf = (e) => (e.failed ? 'failed' : e.waiting ? 'waiting' : 'satisfied');

  function clip(s, n) { return s.length > n ? s.slice(0, n - 1) + '…' : s; }

  // graph draws wf as an <svg>; ctx gives the page's helpers.
  function graph(wf, ctx) {
    const g = layout(wf);
    const el = svg('svg', {
      class: 'wf-graph', id: 'wf-graph', width: g.width, height: Math.max(g.height, BOX_H + 2 * PAD),
      viewBox: `0 0 ${g.width} ${Math.max(g.height, BOX_H + 2 * PAD)}`, role: 'img',
      'aria-label': `Graph of workflow ${wf.id}: ${wf.nodes.length} nodes, ${g.total} edges`,
      'data-nodes': wf.nodes.length, 'data-edges': g.total, 'data-boxes': g.boxes.length,
      'data-finally-dependencies': g.finallyDeps || null,
    });
    const defs = svg('defs', {});
    for (const s of ['satisfied', 'waiting', 'failed']) {
      defs.append(svg('marker', { id: 'wf-arrow-' + s, class: 'wf-arrow', 'data-state': s, viewBox: '0 0 8 8', refX: 7, refY: 4,
        markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' }, svg('path', { d: 'M0,0 L8,4 L0,8 z' })));
    }
    el.append(defs);
    const edgeLayer = svg('g', { class: 'wf-edges' });
    for (const e of g.edges) {
      const x1 = e.from.x + BOX_W / 2, y1 = e.from.y + BOX_H, x2 = e.to.x + BOX_W / 2, y2 = e.to.y - 2;
      const bend = Math.max(GAP_Y / 2, (y2 - y1) / 3);
      const state = edgeStateOf(e);
      const count = e.satisfied + e.waiting + e.failed;
      edgeLayer.append(svg('path', {
        class: 'wf-edge', d: `M${x1},${y1} C${x1},${y1 + bend} ${x2},${y2 - bend} ${x2},${y2}`,
        'marker-end': `url(#wf-arrow-${state})`, 'data-state': state, 'data-count': count,
        'data-satisfied': e.satisfied, 'data-waiting': e.waiting, 'data-failed': e.failed,
        'data-from': e.from.id, 'data-to': e.to.id, 'data-finally': e.finally ? '' : null,
      }, svg('title', {}, (count > 1 ? `${count} edges: ${e.satisfied} satisfied, ${e.waiting} waiting, ${e.failed} failed` : state)
        + (e.finally ? '; the finally node runs once every other node ended' : ''))));
      if (count > 1) {
        edgeLayer.append(svg('text', { class: 'wf-edge-count', x: (x1 + x2) / 2 + 6, y: (y1 + y2) / 2 + 4 }, '×' + count));
      }
    }
    el.append(edgeLayer);
    const nodeLayer = svg('g', { class: 'wf-nodes' });
    for (const b of g.boxes) {
      const first = wf.nodes[b.members[0]];
      const single = b.members.length === 1;
      const href = single ? ctx.taskHref(first.task.id)
        : ctx.listHref({ parent: wf.id, status: first.task.status });
      const label = single ? clip(first.name, 22) : `${b.members.length} nodes`;
      const signal = single ? signalOf(first) : '';
      const sub = single ? (signal ? 'signal ' + clip(signal, 14) : b.state + (first.finally ? ' · finally' : first.workflow ? ' · sub-workflow' : ''))
        : `${b.state} · e.g. ${clip(first.name, 12)}`;
      const waitsFor = first.task.waiting && first.task.waiting.dependencies;
      const title = single ? `${first.name}: ${b.state}` + (first.finally ? ', runs once every other node ended' : '')
        + (waitsFor ? ', waits for ' + (waitsFor.length > 10 ? waitsFor.slice(0, 10).join(', ') + ` and ${waitsFor.length - 10} more` : waitsFor.join(', ')) : '')
        + (signal ? ', waits for signal ' + signal : '')
        : `${b.members.length} nodes, ${b.state}: ${b.members.slice(0, 5).map((i) => wf.nodes[i].name).join(', ')}${b.members.length > 5 ? ', …' : ''}`;
      nodeLayer.append(svg('a', { href, class: 'wf-link' },
        svg('g', {
          class: 'wf-node' + (single ? '' : ' wf-group'), transform: `translate(${b.x},${b.y})`,
          'data-state': b.state, 'data-count': b.members.length, 'data-layer': b.layer, 'data-box': b.id,
          'data-name': single ? first.name : null, 'data-signal': signal || null,
          'data-workflow': single && first.workflow ? first.workflow : null,
        },
        svg('title', {}, title),
        single ? null : svg('rect', { class: 'wf-stack', x: 4, y: -4, width: BOX_W, height: BOX_H, rx: 7 }),
        svg('rect', { class: 'wf-box', width: BOX_W, height: BOX_H, rx: 7 }),
        svg('text', { class: 'wf-label', x: 10, y: 17 }, label),
        svg('text', { class: 'wf-sub', x: 10, y: 32 }, sub))));
    }
    el.append(nodeLayer);
    return el;
  }

  // signalOf returns the topic of the signal node n sleeps on, '' when it
  // sleeps on none.
  const signalOf = (n) => (n.task.waiting && n.task.waiting.reason === 'signal' ? n.task.waiting.key : '');

  // signalsPanel lists the nodes of wf asleep until a signal comes, each
  // linked to its task's page, which sends one; null when none is.
  function signalsPanel(ctx, wf) {
    const { h } = ctx;
    const asleep = wf.nodes.filter(signalOf);
    if (!asleep.length) return null;
    const most = 50;
    return ctx.panel('Waiting for signals', "a node's page lists the signals it has and sends one",
      h('ul', { class: 'panel-body wf-signals', id: 'workflow-signals' },
        asleep.slice(0, most).map((n) => h('li', { dataset: { node: n.name } },
          h('a', { href: ctx.taskHref(n.task.id) }, n.name), ' waits for signal ', h('code', {}, signalOf(n)))),
        asleep.length > most ? h('li', { class: 'muted' }, `and ${asleep.length - most} more`) : null));
  }

  // subworkflowsPanel links the sub-workflows the nodes of wf run, each
  // beside its node; null when no node runs one.
  function subworkflowsPanel(ctx, wf) {
    const { h } = ctx;
    const runs = wf.nodes.filter((n) => n.workflow);
    if (!runs.length) return null;
    const most = 50;
    return ctx.panel('Sub-workflows', 'a node that runs a whole workflow ends with its outcome',
      h('ul', { class: 'panel-body wf-subworkflows', id: 'workflow-subworkflows' },
        runs.slice(0, most).map((n) => h('li', { dataset: { node: n.name } },
          h('a', { href: ctx.taskHref(n.task.id) }, n.name), ' runs ',
          h('a', { href: workflowHref(n.workflow), dataset: { workflow: n.workflow } }, n.workflow), ' ', statePill(ctx, nodeState(n.task)))),
        runs.length > most ? h('li', { class: 'muted' }, `and ${runs.length - most} more`) : null));
  }

  // parentLink names the node, and its workflow, that runs wf as its
  // sub-workflow; null when none does.
  function parentLink(ctx, wf) {
    if (!wf.parent_node) return null;
    const { h } = ctx;
    const cut = wf.parent_node.indexOf('/');
    const parent = wf.parent_node.slice(0, cut);
    return h('span', { class: 'wf-of', id: 'workflow-parent' }, 'sub-workflow of node ',
      h('a', { href: ctx.taskHref(wf.parent_node) }, wf.parent_node.slice(cut + 1)), ' of workflow ',
      h('a', { href: workflowHref(parent), dataset: { workflow: parent } }, parent));
  }

  function legend(ctx, wf) {
    const used = new Set(wf.nodes.map((n) => nodeState(n.task)));
    const { h } = ctx;
    return h('div', { class: 'wf-legend' },
      NODE_STATES.filter((s) => used.has(s)).map((s) => h('span', { class: 'wf-key', dataset: { state: s } }, s)),
      ['satisfied', 'waiting', 'failed'].map((s) => h('span', { class: 'wf-key-edge', dataset: { state: s } }, s)));
  }

  // statePill shows a workflow's state in the colors of a task's.
  function statePill(ctx, state) {
    return ctx.h('span', { class: 'pill', dataset: { status: state } }, state);
  }

  const workflowHref = (id) => '#/workflows/' + encodeURIComponent(id);
  function workflowsHref(state, after) {
    const q = new URLSearchParams();
    if (state) q.set('state', state);
    if (after) q.set('after', after);
    const s = q.toString();
    return '#/workflows' + (s ? '?' + s : '');
  }

  // listView is the page #/workflows: the workflows in id order, a page at
  // a time, optionally of one state.
  function listView(ctx, params) {
    const { h, fill, api } = ctx;
    const wfState = params.get('state') || '';
    const after = params.get('after') || '';
    const body = h('div', { class: 'table-wrap' }, h('div', { class: 'empty' }, 'Loading…'));
    const pager = h('div', { class: 'pager' });
    const sel = h('select', { id: 'f-wf-state' }, h('option', { value: '' }, 'any'),
      WF_STATES.map((s) => h('option', { value: s, selected: s === wfState }, s)));
    const el = h('div', {},
      h('div', { class: 'page-head' }, h('h1', {}, 'Workflows'), after ? h('span', { class: 'muted' }, 'after ', h('code', {}, after)) : null),
      h('section', { class: 'card panel' },
        h('form', { class: 'filters', onsubmit: (ev) => { ev.preventDefault(); location.hash = workflowsHref(sel.value); } },
          h('div', { class: 'field' }, h('label', { for: 'f-wf-state' }, 'State'), sel),
          h('button', { class: 'btn', type: 'submit' }, 'Filter'),
          h('a', { class: 'btn ghost', href: '#/workflows' }, 'Clear')),
        body, pager));
    async function load() {
      const q = new URLSearchParams({ limit: '50' });
      if (wfState) q.set('state', wfState);
      if (after) q.set('after', after);
      let r;
      try { r = await api('GET', '/workflows?' + q.toString()); } catch (e) {
        fill(body, h('p', { class: 'error-text panel-body', id: 'list-error' }, e.message));
        return;
      }
      fill(body, r.workflows.length === 0 ? h('div', { class: 'empty' }, after ? 'No more workflows.' : 'No workflow matches.')
        : h('table', { id: 'workflows' },
          h('thead', {}, h('tr', {}, ['Workflow', 'State', 'Nodes pending', 'Created', 'Finished', 'Error'].map((c) => h('th', {}, c)))),
          h('tbody', {}, r.workflows.map((w) => h('tr', { dataset: { workflowId: w.id, state: w.state } },
            h('td', { class: 'id', title: w.id }, h('a', { href: workflowHref(w.id) }, w.id)),
            h('td', {}, statePill(ctx, w.state)),
            h('td', { class: 'num' }, w.pending),
            h('td', {}, ctx.timeEl(w.created_at)),
            h('td', {}, ctx.timeEl(w.finished_at)),
            h('td', { class: 'err', title: w.error ? w.error.message : null }, w.error ? w.error.message : ''))))));
      pager.hidden = !after && !r.next;
      fill(pager,
        after ? h('a', { class: 'btn', href: workflowsHref(wfState) }, 'First page') : null,
        r.next ? h('a', { class: 'btn', id: 'next-page', href: workflowsHref(wfState, r.next) }, 'Next page →') : null);
    }
    const reload = ctx.throttle(load, 1000);
    load();
    return { name: 'workflows', el, refresh: load, onEvent: (e) => { if (e.behavior === 'stint.workflow') reload(); } };
  }

  // view is the page #/workflows/ID: its state, counts, actions and graph,
  // redrawn as its nodes change.
  function view(ctx, id) {
    const { h, fill, api } = ctx;
    const el = h('div', {}, h('div', { class: 'empty' }, 'Loading…'));
    let wf = null;
    async function load() {
      try {
        wf = await api('GET', '/workflows/' + encodeURIComponent(id));
      } catch (e) {
        fill(el, h('div', { class: 'page-head' }, h('h1', { class: 'mono' }, id)),
          e.status === 404 ? h('div', { class: 'card empty', id: 'workflow-missing' }, 'No workflow with this id.')
            : h('p', { class: 'error-text' }, e.message));
        return;
      }
      render();
    }
    function render() {
      const counts = {};
      for (const n of wf.nodes) { const s = nodeState(n.task); counts[s] = (counts[s] || 0) + 1; }
      const act = async (verb) => { await api('POST', '/workflows/' + encodeURIComponent(id) + '/' + verb); await load(); };
      const admin = ctx.can('admin');
      fill(el,
        h('div', { class: 'page-head' },
          h('h1', { class: 'mono', id: 'workflow-id' }, wf.id),
          h('span', { id: 'workflow-state' }, statePill(ctx, wf.state)),
          h('a', { class: 'btn small', href: ctx.taskHref(wf.id) }, 'Its task'),
          parentLink(ctx, wf),
          h('div', { class: 'spacer' }),
          admin ? h('div', { class: 'actions-bar', id: 'workflow-actions' },
            wf.state === 'running' ? ctx.actionButton('Cancel', 'cancel-workflow', () => act('cancel'), { confirm: 'Cancel all?', danger: true, done: 'Workflow cancelled' }) : null,
            wf.state === 'failed' || wf.state === 'cancelled' ? ctx.actionButton('Retry', 'retry-workflow', () => act('retry'), { done: 'Workflow retried' }) : null,
            ctx.actionButton('Remove', 'remove-workflow', async () => {
              await api('DELETE', '/tasks/' + encodeURIComponent(id));
              location.hash = '#/workflows';
            }, { confirm: `Remove its ${wf.nodes.length} nodes too?`, danger: true, done: 'Removed workflow ' + id })) : null),
        h('section', { class: 'card panel' }, h('div', { class: 'panel-body' },
          h('span', { class: 'chips', id: 'workflow-counts' }, NODE_STATES.filter((s) => counts[s]).map((s) =>
            h('span', { class: 'count-chip', dataset: { status: s } }, s + ' ', h('b', {}, counts[s])))),
          ' ', h('span', { class: 'muted' }, wf.nodes.length + ' nodes · created ', ctx.timeEl(wf.created_at),
            wf.finished_at ? [' · finished ', ctx.timeEl(wf.finished_at)] : null))),
        signalsPanel(ctx, wf),
        subworkflowsPanel(ctx, wf),
        ctx.panel('Graph', 'a node links to its task; a box with a count groups the nodes of a wide layer with the same state and dependencies',
          h('div', { class: 'panel-body' }, legend(ctx, wf), h('div', { class: 'wf-scroll' }, graph(wf, ctx)))));
    }
    // A large workflow is read whole: reread it less often while its
    // nodes change (every 5 s at 10,000 nodes).
    let reload = ctx.throttle(load, 1000);
    load().then(() => { if (wf && wf.nodes.length > 2000) reload = ctx.throttle(load, wf.nodes.length / 2); });
    return { name: 'workflow', el, refresh: load, onEvent: (e) => { if (e.task_id === id || e.parent_id === id) reload(); } };
  }

  // mayBeNode reports whether task t may be a node of a workflow, its
  // parent: its id is the parent's and a name. Only the parent's behavior
  // tells (an ingest job's id is its batch's and a number).
  const mayBeNode = (t) => !!t.parent_id && t.id.startsWith(t.parent_id + '/');

  // nodeOf returns the id of the workflow task t is a node of, given its
  // parent task (null when it has none or it was not read); '' for a task
  // that is no node.
  function nodeOf(t, parent) {
    return mayBeNode(t) && parent && parent.id === t.parent_id && parent.behavior === 'stint.workflow' ? parent.id : '';
  }

  // taskLink returns what a task's page shows of the workflow it is a node
  // of (its parent task, read by the page), with the workflow's state, or
  // of the workflow it stands for; null for a task of neither.
  function taskLink(ctx, t, parent) {
    const { h } = ctx;
    if (t.behavior === 'stint.workflow') {
      return h('a', { class: 'btn small', id: 'task-workflow', href: workflowHref(t.id) }, 'Workflow view');
    }
    if (!nodeOf(t, parent)) return null;
    let state = 'running';
    if (ended(parent)) state = parent.status === 'success' ? 'succeeded' : parent.error && parent.error.code === 'workflow_cancelled' ? 'cancelled' : 'failed';
    const sub = t.behavior === 'stint.subworkflow' && t.params && t.params.workflow ? t.params.workflow.id : '';
    return h('span', { class: 'wf-of', id: 'task-workflow' }, 'node ', h('b', {}, t.id.slice(parent.id.length + 1)), ' of workflow ',
      h('a', { href: workflowHref(parent.id), dataset: { workflow: parent.id } }, parent.id), ' ', statePill(ctx, state),
      sub ? [' · runs sub-workflow ', h('a', { id: 'task-subworkflow', href: workflowHref(sub), dataset: { workflow: sub } }, sub)] : null);
  }

  window.stintWorkflows = { listView, view, taskLink, layout, mayBeNode, nodeOf, workflowHref };
})();
