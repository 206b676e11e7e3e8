package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/web"
)

// drawnGraph is what the workflow page drew, read from its SVG: the nodes
// per state (a grouped box counts its nodes), the single nodes' names,
// the boxes, and the edges per state.
type drawnGraph struct {
	Nodes  int            `json:"nodes"`
	States map[string]int `json:"states"`
	Names  []string       `json:"names"`
	Boxes  int            `json:"boxes"`
	Edges  map[string]int `json:"edges"`
}

// readGraphJS reads a drawnGraph from the page.
const readGraphJS = `(() => {
	const svg = document.getElementById('wf-graph');
	if (!svg) return '';
	const g = { nodes: +svg.dataset.nodes, states: {}, names: [], boxes: 0, edges: {} };
	for (const n of svg.querySelectorAll('.wf-node')) {
		g.boxes++;
		g.states[n.dataset.state] = (g.states[n.dataset.state] || 0) + +n.dataset.count;
		if (n.dataset.name) g.names.push(n.dataset.name);
	}
	for (const e of svg.querySelectorAll('.wf-edge'))
		for (const s of ['satisfied', 'waiting', 'failed']) if (+e.dataset[s]) g.edges[s] = (g.edges[s] || 0) + +e.dataset[s];
	g.names.sort();
	return JSON.stringify(g);
})()`

// wantGraph is what the page should draw of w, from the API's answer: a
// node's state is its status, with retried, skipped and cancelled
// failures told apart; an edge is waiting until its dependency ended,
// then satisfied when the dependency's outcome lets the node run by its
// rule, else failed. The finally node's edges come from the sinks alone
// (the nodes no other node depends on), each waiting until its sink and
// every node the sink depends on, however far up, ended.
func wantGraph(w api.Workflow) drawnGraph {
	g := drawnGraph{Nodes: len(w.Nodes), States: map[string]int{}, Edges: map[string]int{}}
	state := func(t api.Task) string {
		switch {
		case t.Retrying():
			return "retrying"
		case t.Status == api.StatusFailure && t.Error != nil && (t.Error.Code == api.CodeSkipped || t.Error.Code == api.CodeCancelled):
			return t.Error.Code
		}
		return string(t.Status)
	}
	depended := map[string]bool{}
	for _, n := range w.Nodes {
		for _, d := range n.DependsOn {
			depended[d] = !n.Finally || depended[d]
		}
	}
	var unended func(name string) bool
	unended = func(name string) bool {
		n, _ := w.Node(name)
		if !n.Task.Finished() {
			return true
		}
		return slices.ContainsFunc(n.DependsOn, unended)
	}
	for _, n := range w.Nodes {
		g.States[state(n.Task)]++
		for _, d := range n.DependsOn {
			dep, _ := w.Node(d)
			switch {
			case n.Finally && depended[d]:
			case n.Finally && unended(d):
				g.Edges["waiting"]++
			case n.Finally:
				g.Edges["satisfied"]++
			case !dep.Task.Finished():
				g.Edges["waiting"]++
			case dep.Task.Status == api.StatusSuccess, n.Rule == api.RuleAllEnded,
				n.Rule == api.RuleNoneFailed && state(dep.Task) == api.CodeSkipped:
				g.Edges["satisfied"]++
			default:
				g.Edges["failed"]++
			}
		}
	}
	return g
}

// The workflow page draws what the API answers: every node in its state,
// every edge in its state, a node linking to its task page, whose page
// names the workflow; a cancel redraws it; a fan-out of 10,000 nodes is
// drawn as a few boxes with counts; the list of workflows shows each with
// its state.
func TestWorkflowGraphInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	echo := func(text string) web.SubmitBody {
		return web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"` + text + `"}`)}
	}
	later := echo("later")
	later.Delay = "1h"
	small := web.WorkflowBody{ID: "wf-small", Nodes: []web.WorkflowNodeBody{
		{Name: "fetch", Task: echo("fetch")},
		{Name: "bad", Task: web.SubmitBody{Behavior: failKind.ID}},
		{Name: "after-bad", Task: echo("x"), DependsOn: []string{"bad"}},
		{Name: "cleanup", Task: echo("x"), DependsOn: []string{"bad", "fetch"}, Rule: api.RuleAllEnded},
		{Name: "later", Task: later},
		{Name: "merge", Task: echo("x"), DependsOn: []string{"fetch", "later"}},
		{Name: "notify", Task: echo("x"), Finally: true},
	}}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, small, http.StatusCreated, nil)
	// getWorkflow reads a workflow afresh (decoding into a used value
	// would keep the fields the new answer leaves out).
	getWorkflow := func(id string) (w api.Workflow) {
		e.json(http.MethodGet, "/api/v1/workflows/"+id, readToken, nil, http.StatusOK, &w)
		return w
	}
	var wf api.Workflow
	e.waitFor("the small workflow's runnable nodes to end", func() bool {
		wf = getWorkflow("wf-small")
		n := 0
		for _, name := range []string{"fetch", "bad", "after-bad", "cleanup"} {
			if node, _ := wf.Node(name); node.Task.Finished() {
				n++
			}
		}
		return n == 4
	})

	wide := api.WorkflowRequest{ID: "wf-wide", Nodes: []api.WorkflowNode{
		{Name: "root", Task: api.SubmitRequest{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"r"}`), Delay: time.Hour}},
	}}
	var names []string
	for i := range 10_000 {
		name := fmt.Sprintf("part-%05d", i)
		names = append(names, name)
		wide.Nodes = append(wide.Nodes, api.WorkflowNode{Name: name, DependsOn: []string{"root"},
			Task: api.SubmitRequest{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"p"}`)}})
	}
	wide.Nodes = append(wide.Nodes, api.WorkflowNode{Name: "merge", DependsOn: names,
		Task: api.SubmitRequest{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"m"}`)}})
	_, err := e.srv.SubmitWorkflow(e.ctx, wide)
	require.NoError(t, err)

	p := openPage(t, e)
	run := p.run
	readGraph := func() drawnGraph {
		t.Helper()
		raw, err := chromedp.Run(p.tab, chromedp.Evaluate[string](readGraphJS))
		require.NoError(t, err)
		require.NotEmpty(t, raw, "no graph drawn")
		var g drawnGraph
		require.NoError(t, json.Unmarshal([]byte(raw), &g))
		return g
	}
	run("open the dashboard", chromedp.Navigate(e.ts.URL+"/"))
	run("sign in", signIn(adminToken)...)
	run("open the workflows", chromedp.Click(css(`a[data-nav="workflows"]`)),
		chromedp.WaitVisible(css(`#workflows tr[data-workflow-id="wf-wide"]`)))
	require.Equal(t, "running", p.text(`#workflows tr[data-workflow-id="wf-wide"] .pill`))
	require.Equal(t, "10002", p.text(`#workflows tr[data-workflow-id="wf-wide"] td.num`))

	run("open the small workflow", clickOn(`#workflows tr[data-workflow-id="wf-small"] a`), chromedp.WaitVisible(chromedp.ID("wf-graph")))
	wf = getWorkflow("wf-small")
	want := wantGraph(wf)
	for _, n := range wf.Nodes {
		want.Names = append(want.Names, n.Name)
	}
	want.Boxes = len(wf.Nodes)
	require.Equal(t, want, readGraph())
	require.Equal(t, map[string]int{"success": 2, "failure": 1, "skipped": 1, "scheduled": 1, "waiting": 2}, want.States,
		"the small workflow has a node in each state")
	require.Equal(t, map[string]int{"satisfied": 5, "waiting": 2, "failed": 1}, want.Edges, "and edges in each state")
	// The finally node's dependence on the six other nodes is drawn once,
	// by an edge from each of the three sinks.
	finallyEdges, err := chromedp.Run(p.tab, chromedp.Evaluate[[]string](`(() => {
		const to = document.querySelector('.wf-node[data-name="notify"]').dataset.box;
		const name = (box) => document.querySelector('.wf-node[data-box="' + box + '"]').dataset.name;
		return [...document.querySelectorAll('.wf-edge[data-finally]')].filter((e) => e.dataset.to === to).map((e) => name(e.dataset.from)).sort();
	})()`))
	require.NoError(t, err)
	require.Equal(t, []string{"after-bad", "cleanup", "merge"}, finallyEdges)
	finallyDeps, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.getElementById('wf-graph').dataset.finallyDependencies`))
	require.NoError(t, err)
	require.Equal(t, "6", finallyDeps)
	screenshot(t, p.tab, p.shots, "dashboard-workflow.png")

	href, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.querySelector('.wf-node[data-name="merge"]').closest('a').getAttribute('href')`))
	require.NoError(t, err)
	require.Equal(t, "#/tasks/wf-small%2Fmerge", href)
	run("open a node's task", goHash(href), chromedp.WaitVisible(css(`#task-workflow a[data-workflow="wf-small"]`)))
	require.Equal(t, "wf-small/merge", p.text("#task-id"))
	require.Equal(t, "node merge of workflow wf-small running", p.text("#task-workflow"))
	// It names the dependency it waits for, linked to its task; it offers
	// no Remove (a node goes only with its workflow, a 409) but a link to
	// the workflow, and no list of children.
	require.Equal(t, "waiting, waiting for its dependency later", p.text(`[data-field="status"] dd`))
	require.Equal(t, "#/tasks/wf-small%2Flater", p.attr(`#task-waiting a[data-dependency="later"]`, "href"))
	require.Equal(t, "#/workflows/wf-small", p.attr(`#task-remove-with a`, "href"))
	require.Zero(t, p.count(`#task-actions [data-action="remove"], [data-field="children"]`))
	run("open the finally node", goHash("#/tasks/wf-small%2Fnotify"), chromedp.WaitVisible(css(`#task-waiting a[data-dependency="merge"]`)))
	require.Equal(t, "waiting for its dependencies later, merge", p.text("#task-waiting"))
	run("open the skipped node", goHash("#/tasks/wf-small%2Fafter-bad"), chromedp.WaitVisible(chromedp.ID("task-error-kind")))
	require.Equal(t, "skipped: its rule can no longer be met", p.text("#task-error-kind"))
	// The workflow's own task waits for its nodes, lists them as its
	// children, and removes them with it.
	run("open the workflow's task", goHash("#/tasks/wf-small"), chromedp.WaitVisible(chromedp.ID("task-waiting")))
	require.Equal(t, "waiting for its 3 nodes to end", p.text("#task-waiting"))
	require.Equal(t, "#/workflows/wf-small", p.attr(`#task-waiting a`, "href"))
	require.Equal(t, "list children (3 pending)", p.text(`[data-field="children"] dd`))
	require.Equal(t, 1, p.count(`#task-actions [data-action="remove"]`))
	require.Equal(t, 1, p.count(`#task-actions [data-action="hold"]`), "holding it holds the workflow")
	require.Zero(t, p.count(`#task-actions [data-action="fail"]`))
	// The list of its waiting nodes says what each waits for.
	run("list its waiting nodes", goHash("#/tasks?parent=wf-small&status=waiting"),
		chromedp.WaitVisible(css(`tr[data-task-id="wf-small/notify"] [data-field="waiting"] a[data-dependency="merge"]`)))
	require.Equal(t, "waiting for its dependency later", p.text(`tr[data-task-id="wf-small/merge"] [data-field="waiting"]`))
	require.Equal(t, "waiting", p.text(`#f-status option:checked`), "the state filter offers waiting")
	run("back to its workflow", goHash(href), chromedp.WaitVisible(css(`#task-workflow a[data-workflow="wf-small"]`)),
		clickOn(`#task-workflow a`), chromedp.WaitVisible(chromedp.ID("wf-graph")))

	run("cancel it", clickOn(`[data-action="cancel-workflow"]`), clickOn(`[data-action="cancel-workflow"]`),
		void(chromedp.Poll[bool](`(() => { const s = document.querySelector('#workflow-state .pill'); return !!s && s.innerText === 'cancelled' })()`,
			chromedp.WithPollingTimeout(2*time.Minute))))
	wf = getWorkflow("wf-small")
	require.Equal(t, api.WorkflowCancelled, wf.State)
	run("see it redrawn", void(chromedp.Poll[bool](`(() => { const s = document.querySelector('.wf-node[data-name="merge"]'); return !!s && s.dataset.state === 'cancelled' })()`,
		chromedp.WithPollingTimeout(2*time.Minute))))
	want = wantGraph(wf)
	want.Names, want.Boxes = nil, len(wf.Nodes)
	for _, n := range wf.Nodes {
		want.Names = append(want.Names, n.Name)
	}
	require.Equal(t, want, readGraph())
	require.Equal(t, 3, want.States["cancelled"], "later, merge and notify")

	// The wide workflow is read whole, 10,002 nodes: on a loaded machine
	// that takes a while.
	run("open the wide workflow", goHash("#/workflows/wf-wide"),
		void(chromedp.Poll[bool](`(() => { const s = document.getElementById('wf-graph'); return !!s && s.dataset.nodes === '10002' })()`,
			chromedp.WithPollingTimeout(4*time.Minute))))
	wf = getWorkflow("wf-wide")
	want = wantGraph(wf)
	want.Names, want.Boxes = []string{"merge", "root"}, 3
	require.Equal(t, want, readGraph(), "the 10,000 nodes of the fan-out are one box")
	require.Equal(t, map[string]int{"scheduled": 1, "waiting": 10_001}, want.States)
	require.Equal(t, map[string]int{"waiting": 20_000}, want.Edges)
	label, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.querySelector('.wf-group[data-count="10000"] .wf-label').textContent`))
	require.NoError(t, err)
	require.Equal(t, "10000 nodes", label)
	screenshot(t, p.tab, p.shots, "dashboard-workflow-wide.png")

	require.Empty(t, p.jsErrors(), "the page raised errors")
}
