package web_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/web"
)

// waitText waits until the text of the element sel selects contains want.
func waitText(sel, want string) chromedp.Action[chromedp.Void] {
	return void(chromedp.Poll[bool](`(() => { const el = document.querySelector(`+jsString(sel)+`);
		return !!el && el.innerText.includes(`+jsString(want)+`) })()`, chromedp.WithPollingTimeout(time.Minute)))
}

// confirmOn clicks the element sel selects twice in one script, once
// there is one: an action that asks to be confirmed runs, and no redraw
// of the page (on an event) comes between the clicks to undo the first.
func confirmOn(sel string) chromedp.Action[chromedp.Void] {
	return void(chromedp.Poll[bool](`(() => { const el = document.querySelector(`+jsString(sel)+`);
		if (!el) return false; el.click(); el.click(); return true })()`, chromedp.WithPollingTimeout(time.Minute)))
}

// TestStepsInBrowser: a task's page lists its steps in its timeline with
// their times; an admin rewinds the finished task to step 2 from there
// (it runs again from step 2), and forks it from step 1 to a new task,
// whose page opens.
func TestStepsInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"hi","steps":3}`)})
	_, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)

	p := openPage(t, e)
	p.run("open the task", chromedp.Navigate(e.ts.URL+"/#/tasks/"+string(id)+"?token="+adminToken),
		chromedp.WaitVisible(css(`#timeline li[data-step="3"]`)))
	require.Equal(t, 3, p.count(`#timeline li[data-status="step"]`))
	require.Contains(t, p.text(`#timeline li[data-step="2"]`), `Step 2: {"done":2}`)
	require.Equal(t, 1, p.count(`#timeline li[data-step="2"] time`), "the step shows when it was stored")
	requireOneTimeFormat(t, p, "the task's page")

	p.run("see Rewind ask to be confirmed", clickOn(`#timeline li[data-step="2"] [data-action="rewind"]`),
		waitText(`#timeline li[data-step="2"] [data-action="rewind"]`, "Click again to run it from step 2"))
	p.run("rewind to step 2", confirmOn(`#timeline li[data-step="2"] [data-action="rewind"]:not(.armed)`),
		waitText(`#task-result`, `"from": 2`))
	require.Equal(t, 3, p.count(`#timeline li[data-status="step"]`), "the run from step 2 kept its step 3")

	// The form is filled and sent in one script: a redraw of the page (on
	// an event of the rewound run) would empty it.
	p.run("fork from step 1", void(chromedp.Poll[bool](`(() => { const f = document.getElementById('task-fork');
		if (!f) return false;
		f.querySelector('#fork-step').value = '1'; f.querySelector('#fork-id').value = 'echo-copy';
		f.querySelector('[data-action="fork"]').click(); return true })()`, chromedp.WithPollingTimeout(time.Minute))),
		waitText(`#task-id`, "echo-copy"),
		waitText(`#task-result`, `"from": 1`),
		chromedp.WaitVisible(css(`#timeline li[data-step="3"]`)))
	hash, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`location.hash`))
	require.NoError(t, err)
	require.Equal(t, "#/tasks/echo-copy", hash, "the copy's page opened")
	require.Empty(t, p.jsErrors(), "the page raised errors")
}
