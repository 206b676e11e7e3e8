package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/web"
)

// timesJS lists what the page shows of times that is not a relative time
// with its date and 24-hour time in its title: a time of day in the text
// ("9:17:50 PM"), or a <time> without the title or not kept current.
const timesJS = `(() => {
	const bad = document.getElementById('main').innerText.match(/\b\d{1,2}:\d\d(:\d\d)?(\s*[AP]M)?\b/g) || [];
	const times = document.querySelectorAll('#main time');
	for (const el of times) {
		if (!/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$/.test(el.title) || !(el.dataset.rel || el.dataset.due)) bad.push(el.outerHTML);
	}
	return {bad, times: times.length};
})()`

// requireOneTimeFormat checks that every time the page shows is relative,
// with the absolute time in its title.
func requireOneTimeFormat(t *testing.T, p *page, where string) {
	t.Helper()
	got, err := chromedp.Run(p.tab, chromedp.Evaluate[struct {
		Bad   []string
		Times int
	}](timesJS))
	require.NoError(t, err)
	require.Empty(t, got.Bad, "%s: times in another format", where)
	require.Positive(t, got.Times, "%s: no time shown", where)
}

// The overview shows the waiting tasks (a card, a column of the queues)
// as it shows the other states, offers no pause of the internal workflow
// behavior, charts the behaviors that did something and folds the idle
// ones; every time on its pages is relative, the date and time on hover;
// a task lists its children only when it has or may have some.
func TestOverviewShowsWaitingInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	// A workflow whose root runs in an hour: its five other nodes and its
	// own task wait.
	wf := web.WorkflowBody{ID: "wf-pending", Nodes: []web.WorkflowNodeBody{
		{Name: "root", Task: web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"r"}`), Delay: "1h"}},
	}}
	for i := range 5 {
		wf.Nodes = append(wf.Nodes, web.WorkflowNodeBody{Name: fmt.Sprintf("n%d", i), DependsOn: []string{"root"},
			Task: web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"n"}`)}})
	}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, wf, http.StatusCreated, nil)
	done := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"done"}`)})
	_, err := e.srv.Await(e.ctx, done)
	require.NoError(t, err)
	// test.idle did something in the window; test.fail and ingest.job
	// were sampled idle.
	e.seedHistory(idleKind.ID, []seedPoint{{minutesAgo: 3, succeeded: 4, due: ptr(2), lagSeconds: ptr(1)}})
	for _, b := range []api.BehaviorID{failKind.ID, "ingest.job"} {
		e.seedHistory(b, []seedPoint{{minutesAgo: 3, due: ptr(0), lagSeconds: ptr(0)}})
	}

	p := openPage(t, e)
	p.run("open the dashboard", chromedp.Navigate(e.ts.URL+"/"))
	p.run("sign in", append(signIn(adminToken),
		chromedp.WaitVisible(css(`#queues tr[data-behavior="demo.echo"] td[data-count="waiting"] a`)),
		chromedp.WaitVisible(css(`#history svg[data-chart="backlog"][data-behavior="test.idle"]`)))...)
	require.Equal(t, "6", p.text("#m-waiting"), "five nodes and the workflow's task")
	require.Equal(t, "5", p.text(`#queues tr[data-behavior="demo.echo"] td[data-count="waiting"]`))
	require.Equal(t, "1", p.text(`#queues tr[data-behavior="stint.workflow"] td[data-count="waiting"]`))
	require.Equal(t, "#/tasks?behavior=demo.echo&status=waiting", p.attr(`#queues tr[data-behavior="demo.echo"] td[data-count="waiting"] a`, "href"))
	require.Equal(t, "waiting", strings.ToLower(p.text(`#queues thead th:nth-child(2)`)), "a column of its own, first")

	// stint.workflow runs on every server and may not be paused.
	require.Zero(t, p.count(`#queues tr[data-behavior="stint.workflow"] [data-action="pause"]`))
	require.Equal(t, 1, p.count(`#queues tr[data-behavior="demo.echo"] [data-action="pause"]`))

	// Only the behaviors that did something are charted in the open; the
	// idle ones are folded.
	folded, err := chromedp.Run(p.tab, chromedp.Evaluate[struct {
		Open, Folded []string
		Summary      string
		Unfolded     bool
	}](`(() => {
		const names = (sel) => [...document.querySelectorAll(sel)].map((el) => el.textContent);
		const d = document.querySelector('#history details.history-idle');
		return {Open: names('#history > .history-row .history-behavior'), Folded: names('#history details.history-idle .history-behavior'),
			Summary: d ? d.querySelector('summary').textContent : '', Unfolded: !!d && d.open};
	})()`))
	require.NoError(t, err)
	require.Equal(t, []string{"test.idle"}, folded.Open, "the active behavior is charted in the open")
	require.Subset(t, folded.Folded, []string{string(failKind.ID), "ingest.job"})
	require.Equal(t, fmt.Sprintf("%d idle behaviors", len(folded.Folded)), folded.Summary)
	require.False(t, folded.Unfolded, "folded until asked")
	requireOneTimeFormat(t, p, "the overview")
	screenshot(t, p.tab, p.shots, "dashboard-overview-waiting.png")

	// The state filter of the Tasks page offers waiting.
	p.run("filter the waiting tasks", chromedp.Click(css(`a[data-nav="tasks"]`)), chromedp.WaitReady(css(`#f-status option[value="waiting"]`)),
		goHash("#/tasks?status=waiting"), chromedp.WaitVisible(css(`tr[data-task-id="wf-pending/n0"][data-status="waiting"]`)))
	require.Equal(t, 6, p.count(`#tasks tbody tr`))
	require.Equal(t, "waiting for its dependency root", p.text(`tr[data-task-id="wf-pending/n0"] [data-field="waiting"]`))

	// A task that had no children offers no list of them; one whose
	// children all ended does.
	p.run("open a task", goHash("#/tasks/"+string(done)), chromedp.WaitVisible(chromedp.ID("timeline")))
	require.Zero(t, p.count(`[data-field="children"]`))
	requireOneTimeFormat(t, p, "a task's page")
	child := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"child"}`)})
	_, err = e.srv.Await(e.ctx, child)
	require.NoError(t, err)
	_, err = e.st.Pool().Exec(e.ctx, `UPDATE stint_task SET parent_id = $1 WHERE id = $2`, string(done), string(child))
	require.NoError(t, err)
	p.run("open it again", goHash("#/nodes"), goHash("#/tasks/"+string(done)),
		chromedp.WaitVisible(css(`[data-field="children"] a`)))
	require.Equal(t, "#/tasks?parent="+string(done), p.attr(`[data-field="children"] a`, "href"))
	require.Equal(t, "list children", p.text(`[data-field="children"] dd`))

	// A task failed by hand says so, with no attempt that never ran.
	doomed := e.submit(web.SubmitBody{Behavior: idleKind.ID, Params: json.RawMessage(`{"note":"never runs"}`)})
	e.json(http.MethodPost, "/api/v1/tasks/"+string(doomed)+"/fail", adminToken, web.FailBody{Reason: "gone"}, http.StatusOK, nil)
	p.run("open the task failed by hand", goHash("#/tasks/"+string(doomed)), chromedp.WaitVisible(chromedp.ID("task-error-kind")))
	require.Equal(t, "failed by hand, no attempt ran", p.text("#task-error-kind"))
	require.Equal(t, api.StatusFailure, e.task(doomed).Status)

	// The activity list, the timeline and a batch's pages show times alike.
	p.run("back to the overview", chromedp.Click(css(`a[data-nav="overview"]`)), chromedp.WaitVisible(css(`#activity li time`)))
	requireOneTimeFormat(t, p, "the overview's activity")
	title, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.querySelector('#activity li time').title`))
	require.NoError(t, err)
	_, err = time.ParseInLocation("2006-01-02 15:04:05", title, time.Local)
	require.NoError(t, err, "the title is the date and 24-hour time")
	require.Empty(t, p.jsErrors(), "the page raised errors")
}
