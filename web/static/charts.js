// stint dashboard charts: SVG line charts drawn by the page itself from
// GET /api/v1/history, no library. Each behavior gets three charts over
// the window: tasks ended per second (succeeded, failed for good, by hand
// included) with the failed runs that are retried as a series of their
// own, the due backlog (the most due at the minute's samples, taken every
// 10 seconds), and the queue lag. The data comes from the database, so
// every dashboard shows the same history, and it outlives the node that
// serves the page. The behaviors with nothing in the window (no run
// ended, nothing due) are folded under <details class="history-idle">.
//
// Every chart's <svg> says how it maps values to the plot, for readers
// and tests alike: data-plot is the plot area "x y width height" in the
// viewBox's units, data-from and data-to the times (ms since the epoch) at
// its left and right edges, data-ymax the value at its top (0 at the
// bottom). Each series is a <polyline data-series=NAME>.
'use strict';
(() => {
  const SVG = 'http://www.w3.org/2000/svg';
  const W = 320, H = 140;
  const PLOT = { x: 46, y: 12, w: W - 46 - 10, h: H - 12 - 24 };

  function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v != null) el.setAttribute(k, String(v));
    }
    for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return el;
  }

  function html(tag, cls, ...children) {
    const el = document.createElement(tag);
    if (cls) el.className = cls;
    for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return el;
  }

  // niceMax rounds a largest value up to 1, 2 or 5 times a power of ten,
  // so that the top label is a round number; 1 when everything is zero.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  function fmtValue(v, unit) {
    if (unit === 'count') return v >= 1e4 ? Math.round(v / 1e3) + 'k' : String(Math.round(v));
    if (unit === 's') {
      if (v >= 3600) return (v / 3600).toFixed(v % 3600 ? 1 : 0) + 'h';
      if (v >= 60) return (v / 60).toFixed(v % 60 ? 1 : 0) + 'm';
      return (v < 10 && v % 1 ? v.toFixed(1) : Math.round(v)) + 's';
    }
    if (v >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (v >= 1e4) return Math.round(v / 1e3) + 'k';
    return v % 1 ? String(+v.toFixed(v < 1 ? 2 : 1)) : String(v);
  }

  // spanText writes a span of the time axis: minutes up to two hours
  // ("7.5 min"), else hours ("12 h").
  function spanText(ms) {
    const m = ms / 60000;
    return m < 120 ? +m.toFixed(1) + ' min' : +(m / 60).toFixed(1) + ' h';
  }

  // WINDOWS are the spans the overview offers, as GET /api/v1/history's
  // window takes them, with their length in ms.
  const WINDOWS = [['15m', 15 * 60000], ['1h', 3600000], ['6h', 6 * 3600000], ['24h', 24 * 3600000]];

  // pickWindow returns the shortest window that holds every point of
  // history (read over 24 hours), so that the charts start at the span
  // that has data; '15m' when there is none.
  function pickWindow(history) {
    const now = Date.parse(history.now);
    const step = history.bucket_seconds * 1000;
    let oldest = now;
    for (const b of history.behaviors) for (const p of b.points) oldest = Math.min(oldest, Date.parse(p.at));
    // A window's first bucket is the one that holds its start, as the
    // server reads it.
    for (const [name, ms] of WINDOWS) if (oldest >= now - ms - ((now - ms) % step)) return name;
    return WINDOWS[WINDOWS.length - 1][0];
  }

  // chart draws series ({name, label, points: [[ms, value]], dots}) from
  // `from` to `to` (ms). A unit of 'count' counts tasks: its axis is
  // labelled with whole numbers only.
  function chart(kind, behavior, title, unit, from, to, series) {
    let top = 0;
    for (const s of series) for (const [, v] of s.points) top = Math.max(top, v);
    // Seconds past a minute round to whole minutes.
    const ymax = unit === 's' && top > 60 ? 60 * niceMax(top / 60) : niceMax(top);
    const x = (t) => PLOT.x + (to > from ? (PLOT.w * (t - from)) / (to - from) : 0);
    const y = (v) => PLOT.y + PLOT.h - (PLOT.h * v) / ymax;
    const r2 = (n) => Math.round(n * 100) / 100;
    const el = svg('svg', {
      class: 'chart-svg', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${title} of ${behavior}`,
      'data-chart': kind, 'data-behavior': behavior, 'data-plot': `${PLOT.x} ${PLOT.y} ${PLOT.w} ${PLOT.h}`,
      'data-from': from, 'data-to': to, 'data-ymax': ymax,
    });
    const ticks = unit === 'count' ? [...new Set([0, Math.round(ymax / 2), ymax])] : [0, ymax / 2, ymax];
    for (const v of ticks) {
      const gy = r2(y(v));
      el.append(svg('line', { class: 'grid', x1: PLOT.x, x2: PLOT.x + PLOT.w, y1: gy, y2: gy }));
      el.append(svg('text', { class: 'tick', x: PLOT.x - 6, y: gy + 4, 'text-anchor': 'end' }, fmtValue(v, unit)));
    }
    for (const [f, label] of [[0, '−' + spanText(to - from)], [0.5, '−' + spanText((to - from) / 2)], [1, 'now']]) {
      el.append(svg('text', { class: 'tick', x: r2(PLOT.x + PLOT.w * f), y: H - 6, 'text-anchor': f === 0 ? 'start' : f === 1 ? 'end' : 'middle' }, label));
    }
    for (const s of series) {
      const pts = s.points.map(([t, v]) => `${r2(x(t))},${r2(y(v))}`).join(' ');
      el.append(svg('polyline', { class: 'line s-' + s.name, 'data-series': s.name, points: pts }));
      if (s.dots) {
        for (const [t, v] of s.points) el.append(svg('circle', { class: 'dot s-' + s.name, cx: r2(x(t)), cy: r2(y(v)), r: 2 }));
      }
    }
    const legend = html('div', 'chart-legend', ...series.map((s) => html('span', 'key s-' + s.name, s.label)));
    return html('figure', 'chart', html('figcaption', null, title), el, legend);
  }

  // render fills container with the charts of history, the answer of GET
  // /api/v1/history.
  function render(container, history) {
    // The idle behaviors stay unfolded across redraws once unfolded.
    const wasOpen = !!container.querySelector('details.history-idle[open]');
    container.replaceChildren();
    const step = history.bucket_seconds * 1000;
    const from = Date.parse(history.from);
    const now = Date.parse(history.now);
    const to = Math.max(from, now - (now % step));
    if (history.behaviors.length === 0) {
      container.append(html('div', 'empty', 'No history yet: server nodes add to it every few seconds.'));
      return;
    }
    // The busiest behaviors first (runs ended and tasks due in the
    // window), those with no data last.
    const load = (b) => b.points.reduce((n, p) => n + (p.succeeded || 0) + (p.failed || 0) + (p.due || 0), 0);
    // Failed counts failed runs and tasks failed by hand; of the runs,
    // those retried did not end their task.
    const endedFailed = (p) => Math.max(0, (p.failed || 0) - (p.retried || 0));
    const behaviors = [...history.behaviors].sort((a, b) => load(b) - load(a) || a.behavior.localeCompare(b.behavior));
    const active = (b) => b.points.some((p) => p.succeeded || p.failed || p.retried || p.due);
    const idle = behaviors.filter((b) => !active(b));
    let into = container;
    if (idle.length === behaviors.length) container.append(html('div', 'empty', 'No task ended and none was due in this window.'));
    for (const b of behaviors) {
      if (!active(b) && into === container) {
        into = html('details', 'history-idle', html('summary', null, `${idle.length} idle ${idle.length === 1 ? 'behavior' : 'behaviors'}`));
        into.open = wasOpen;
        container.append(into);
      }
      const at = new Map(b.points.map((p) => [Date.parse(p.at), p]));
      // The current minute is left out of the rates: it is not over, and
      // its runs are still being added.
      const rate = (count) => {
        const pts = [];
        for (let t = from; t < to; t += step) {
          const p = at.get(t);
          pts.push([t, (p ? count(p) : 0) / history.bucket_seconds]);
        }
        return pts;
      };
      const sampled = b.points.filter((p) => p.sampled);
      into.append(html('div', 'history-row',
        html('h3', 'history-behavior', b.behavior),
        html('div', 'charts',
          chart('finished', b.behavior, 'Tasks ended per second', '', from, to, [
            { name: 'succeeded', label: 'succeeded', points: rate((p) => p.succeeded || 0) },
            { name: 'failed', label: 'failed', points: rate(endedFailed) },
            { name: 'retried', label: 'runs retried', points: rate((p) => p.retried || 0) },
          ]),
          chart('backlog', b.behavior, 'Due backlog', 'count', from, to, [
            { name: 'due', label: 'most due', dots: true, points: sampled.map((p) => [Date.parse(p.at), p.due]) },
          ]),
          chart('lag', b.behavior, 'Queue lag', 's', from, to, [
            { name: 'lag', label: 'oldest due', dots: true, points: sampled.map((p) => [Date.parse(p.at), p.queue_lag_ms / 1000]) },
          ]))));
    }
  }

  window.stintCharts = { render, pickWindow, windows: WINDOWS.map(([name]) => name) };
})();
