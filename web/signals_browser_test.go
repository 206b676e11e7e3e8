package web_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// fillAndClick fills the inputs of the form sel selects (by their id) and
// clicks its button in one script, once the form is there: a redraw of
// the page between would empty it.
func fillAndClick(sel string, values map[string]string) chromedp.Action[chromedp.Void] {
	raw, _ := json.Marshal(values)
	return void(chromedp.Poll[bool](`(() => { const f = document.querySelector(`+jsString(sel)+`);
		if (!f) return false;
		for (const [id, v] of Object.entries(`+string(raw)+`)) f.querySelector('#' + id).value = v;
		f.querySelector('button').click(); return true })()`, chromedp.WithPollingTimeout(time.Minute)))
}

// TestSignalsInBrowser: a task's page lists the signals no run received
// (topic, key, time, payload) and the events its runs published; a task
// asleep on a signal says so in the list and on its page, whose form sends
// the signal that wakes it (a payload that is not JSON is refused and
// sends nothing); a workflow's node asleep on a signal is named on the
// workflow's page and marked in its graph.
func TestSignalsInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	idle := e.submit(web.SubmitBody{Behavior: idleKind.ID, ID: "browser/signalled"})
	base := "/api/v1/tasks/" + string(idle) + "/signals/"
	e.json(http.MethodPost, base+"bank/paid", submitToken, map[string]int{"amount": 12}, http.StatusAccepted, nil)
	e.json(http.MethodPost, base+"approval?key=hook-1", submitToken, `"yes"`, http.StatusAccepted, nil)
	// As a run's statement sets it.
	_, err := e.st.Pool().Exec(e.ctx, `INSERT INTO stint_event (task_id, key, value, at, created)
		SELECT id, 'preview', '{"url": "/p/1"}', now(), created_at FROM stint_task WHERE id = $1`, string(idle))
	require.NoError(t, err)

	approve := e.submit(web.SubmitBody{Behavior: failKind.ID, ID: "browser-approve", Params: json.RawMessage(`{"note":"approve"}`)})
	gate := web.WorkflowBody{ID: "wf-signal", Nodes: []web.WorkflowNodeBody{
		{Name: "approve", Task: web.SubmitBody{Behavior: failKind.ID, Params: json.RawMessage(`{"note":"approve"}`)}},
	}}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, gate, http.StatusCreated, nil)
	e.waitFor("both to sleep on their signals", func() bool {
		return e.task(approve).Waiting != nil && e.task("wf-signal/approve").Waiting != nil
	})

	p := openPage(t, e)
	p.run("open the signalled task", chromedp.Navigate(e.ts.URL+"/#/tasks/"+string(idle)+"?token="+adminToken),
		chromedp.WaitVisible(css(`#task-signals tr[data-topic="approval"]`)),
		chromedp.WaitVisible(css(`#task-events tr[data-key="preview"]`)))
	require.Equal(t, 2, p.count(`#task-signals tbody tr`))
	require.Contains(t, p.text(`#task-signals tr[data-topic="bank/paid"]`), `{"amount":12}`)
	require.Contains(t, p.text(`#task-signals tr[data-topic="approval"]`), "hook-1")
	require.Contains(t, p.text(`#task-signals tr[data-topic="approval"]`), `"yes"`)
	require.Equal(t, 1, p.count(`#task-signals tr[data-topic="approval"] time`), "the signal shows when it was sent")
	require.Contains(t, p.text(`#task-events tr[data-key="preview"]`), `{"url":"/p/1"}`)
	requireOneTimeFormat(t, p, "the task's page")

	p.run("send a payload that is not JSON", fillAndClick(`#task-signal`, map[string]string{"signal-topic": "note", "signal-payload": "{"}),
		waitText(`.toast.bad`, "the payload is not JSON"))
	require.Len(t, e.task(idle).Signals, 2, "nothing was sent")
	p.run("send a signal", fillAndClick(`#task-signal`, map[string]string{"signal-topic": "note", "signal-payload": `{"n": 1}`}),
		chromedp.WaitVisible(css(`#task-signals tr[data-topic="note"]`)))
	screenshot(t, p.tab, p.shots, "dashboard-task-signals.png")
	got := e.task(idle).Signals
	require.Len(t, got, 3)
	require.JSONEq(t, `{"n": 1}`, string(got[2].Payload))

	p.run("see the sleeping task in the list", goHash("#/tasks?behavior="+string(failKind.ID)),
		waitText(`tr[data-task-id="browser-approve"] [data-field="waiting"]`, "waiting for signal approval"))
	p.run("open it", clickOn(`tr[data-task-id="browser-approve"] a`),
		waitText(`#task-waiting`, "waiting for signal approval"))
	require.Equal(t, "approval", p.attr(`#signal-topic`, "value"), "the form names the topic the task sleeps on")
	p.run("approve it", fillAndClick(`#task-signal`, map[string]string{"signal-payload": `{"by": "ann"}`}),
		chromedp.WaitVisible(css(`#task-status [data-status="success"]`)))
	require.Equal(t, api.StatusSuccess, e.task(approve).Status)
	require.Zero(t, p.count(`#task-signal`), "a finished task takes no signal")

	p.run("open the workflow", goHash("#/workflows/wf-signal"),
		waitText(`#workflow-signals li[data-node="approve"]`, "approve waits for signal approval"),
		chromedp.WaitVisible(css(`#wf-graph g[data-name="approve"][data-signal="approval"]`)))
	sub, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.querySelector('#wf-graph g[data-name="approve"] .wf-sub').textContent`))
	require.NoError(t, err)
	require.Equal(t, "signal approval", sub, "the node's box names its signal")
	screenshot(t, p.tab, p.shots, "dashboard-signals.png")
	require.Empty(t, p.jsErrors(), "the page raised errors")
}
