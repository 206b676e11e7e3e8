package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/internal/provision"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/web"
)

// envScreenshots names a directory where the browser test also copies its
// screenshots, for people and CI artifacts to look at.
const envScreenshots = "STINT_SCREENSHOT_DIR"

// chromiumPath returns Chromium's path, installing it where it can (see
// package provision). Where it cannot, the test is skipped, except under
// CI=true, where a missing browser must not pass silently.
func chromiumPath(t *testing.T) string {
	t.Helper()
	// Its own deadline: an install takes minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	return provision.Require(t, ctx, provision.Chromium)
}

// browser starts a headless Chromium with a fresh profile and returns a
// tab's context, and the JavaScript errors the page raised so far.
//
// A browser that exits before it listens is started again, up to three
// times: on a loaded machine Chromium now and then crashes at start (its
// crash reporter's lines are all it prints), which says nothing of the
// page under test.
func browser(t *testing.T, ctx context.Context) (context.Context, func() []string) {
	t.Helper()
	path := chromiumPath(t)
	var mu sync.Mutex
	var jsErrors []string
	listen := func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			jsErrors = append(jsErrors, "exception: "+msg)
		case *log.EventEntryAdded:
			// Failed requests (a 401 before signing in) are expected;
			// anything else, such as a CSP violation, is not.
			if ev.Entry.Level == log.EntryLevelError && ev.Entry.Source != log.EntrySourceNetwork {
				jsErrors = append(jsErrors, fmt.Sprintf("%s: %s", ev.Entry.Source, ev.Entry.Text))
			}
		}
	}
	var tab context.Context
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		var cancel func()
		tab, cancel = startBrowser(t, ctx, path, listen)
		// Registered after TempDir's cleanup, so it runs before it: the
		// browser is gone before its profile directory is removed.
		t.Cleanup(cancel)
		if err = chromedp.Do(tab); err == nil || !browserDidNotStart(err) {
			break
		}
		t.Logf("Chromium did not start (attempt %d): %v", attempt, err)
		cancel()
	}
	require.NoError(t, err, "start Chromium")
	return tab, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), jsErrors...)
	}
}

// startBrowser allocates a headless Chromium at path with a fresh profile
// and returns a tab's context, which starts the browser on its first use,
// and the function that ends both.
func startBrowser(t *testing.T, ctx context.Context, path string, listen func(any)) (context.Context, func()) {
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-breakpad", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
		// The default 20 s is short for a start on a loaded machine.
		chromedp.WSURLReadTimeout(time.Minute),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	tab, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithListener(listen))
	return tab, func() { cancelTab(); cancelAlloc() }
}

// browserDidNotStart reports whether err says the browser process ended,
// or never printed its address, before a page could be opened.
func browserDidNotStart(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "chrome failed to start") || strings.Contains(msg, "websocket url timeout")
}

// screenshot saves a full-page screenshot as name in dir, and in
// $STINT_SCREENSHOT_DIR when set.
func screenshot(t *testing.T, tab context.Context, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
	if extra := os.Getenv(envScreenshots); extra != "" {
		require.NoError(t, os.MkdirAll(extra, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(extra, name), png, 0o644))
	}
}

// goHash moves the page to another view by its fragment, as a click on a
// link would: a same-document navigation, which chromedp.Navigate would
// wait on for a load that never comes.
func goHash(hash string) chromedp.Action[chromedp.Void] {
	raw, _ := json.Marshal(hash)
	return void(chromedp.Evaluate[string]("location.hash = " + string(raw)))
}

// void drops the value of an action, to run it among others.
func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, t)
		return chromedp.Void{}, err
	}
}

// clickOn clicks the element sel selects once there is one, finding and
// clicking it in one script: the page redraws lists and actions on
// events, and a node found by one call (as chromedp.Click finds it) may be
// gone by the next.
func clickOn(sel string) chromedp.Action[chromedp.Void] {
	return void(chromedp.Poll[bool](`(() => { const el = document.querySelector(`+jsString(sel)+`);
		if (!el) return false; el.click(); return true })()`, chromedp.WithPollingTimeout(time.Minute)))
}

// jsString quotes s as a JavaScript string.
func jsString(s string) string {
	raw, _ := json.Marshal(s)
	return string(raw)
}

// css is a CSS selector.
type css = chromedp.CSS

// page is a tab of a test's browser, with the test's ways to act on it.
type page struct {
	t     *testing.T
	tab   context.Context
	shots string
	// jsErrors returns the JavaScript errors the page raised so far.
	jsErrors func() []string
}

// openPage starts a browser for e's test. Its deadline is for a stuck
// page, not a measure: on a busy machine a whole walk can take minutes.
func openPage(t *testing.T, e *testEnv) *page {
	t.Helper()
	shots := t.TempDir()
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Minute)
	t.Cleanup(cancel)
	tab, jsErrors := browser(t, ctx)
	return &page{t: t, tab: tab, shots: shots, jsErrors: jsErrors}
}

// run runs actions on the page; an error fails the test, with a
// screenshot when the page got stuck.
func (p *page) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	err := chromedp.Do(p.tab, actions...)
	if errors.Is(err, context.DeadlineExceeded) {
		screenshot(p.t, p.tab, p.shots, "failed.png")
	}
	require.NoError(p.t, err, what)
}

// text reads the text of the element sel selects in one script: the page
// redraws on events, and a node found by one call may be gone by the next.
func (p *page) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`(() => { const el = document.querySelector(`+jsString(sel)+`);
		if (!el) throw new Error('no element ' + `+jsString(sel)+`); return el.innerText })()`))
	require.NoError(p.t, err, "read %s", sel)
	return s
}

// attr reads the attribute name of the element sel selects.
func (p *page) attr(sel, name string) string {
	p.t.Helper()
	v, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`(() => { const el = document.querySelector(`+jsString(sel)+`);
		if (!el) throw new Error('no element ' + `+jsString(sel)+`); return el.getAttribute(`+jsString(name)+`) })()`))
	require.NoError(p.t, err, "read %s of %s", name, sel)
	return v
}

// count counts the elements sel selects.
func (p *page) count(sel string) int {
	p.t.Helper()
	n, err := chromedp.Run(p.tab, chromedp.Evaluate[int](`document.querySelectorAll(`+jsString(sel)+`).length`))
	require.NoError(p.t, err, "count %s", sel)
	return n
}

// signIn returns the actions that sign in with token on the login form
// and wait for the event stream to go live.
func signIn(token string) []chromedp.Action[chromedp.Void] {
	return []chromedp.Action[chromedp.Void]{
		chromedp.WaitVisible(chromedp.ID("token-input")),
		chromedp.SendKeys(chromedp.ID("token-input"), token),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(css(`#live[data-state="on"]`)),
	}
}

func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	p := openPage(t, e)
	run, tab, shots, jsErrors := p.run, p.tab, p.shots, p.jsErrors
	text := func(id string) string {
		t.Helper()
		return p.text("#" + id)
	}

	// Some history to show: a success and a failure.
	done := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"first"}`), ID: "browser-first"})
	failed := e.submit(web.SubmitBody{Behavior: failKind.ID, ID: "browser-failed", Retention: "72h"})
	for _, id := range []api.TaskID{done, failed} {
		_, err := e.srv.Await(e.ctx, id)
		require.NoError(t, err)
	}

	// Sign in with the admin token; the stream goes live.
	run("open the dashboard", chromedp.Navigate(e.ts.URL+"/"))
	run("sign in", append(signIn(adminToken),
		chromedp.WaitVisible(css(`#queues tr[data-behavior="demo.echo"] td[data-count="success"]`)),
		void(chromedp.Evaluate[bool](`window.__notReloaded = true`)))...)
	require.Equal(t, "admin", text("role"))

	// The activity list shows the changes made before the page loaded.
	run("see the earlier changes in the activity list",
		chromedp.WaitVisible(css(`#activity li[data-task="browser-first"] [data-status="success"]`)),
		chromedp.WaitVisible(css(`#activity li[data-task="browser-failed"] [data-status="failure"]`)),
	)

	// A counter follows a submit without a reload, from the event stream:
	// well before the page's one-minute fallback refresh.
	run("see the success count", chromedp.WaitVisible(css(`#m-success`)))
	before := text("m-success")
	counted := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"count me"}`), ID: "browser-counted"})
	_, err := e.srv.Await(e.ctx, counted)
	require.NoError(t, err)
	run("see the success count change",
		void(chromedp.Poll[bool](`document.getElementById('m-success').textContent !== `+jsString(before),
			chromedp.WithPollingTimeout(30*time.Second))))
	require.Equal(t, "2", text("m-success"), "was %s", before)

	// A task submitted now appears in the list and finishes there,
	// without a reload.
	run("open the task list", chromedp.Click(css(`a[data-nav="tasks"]`)), chromedp.WaitVisible(css(`tr[data-task-id="browser-first"]`)))
	live := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"watch me","delay_ms":300}`), ID: "browser-live"})
	run("see the new task appear", chromedp.WaitVisible(css(`tr[data-task-id="browser-live"]`)))
	run("see it finish", chromedp.WaitVisible(css(`tr[data-task-id="browser-live"][data-status="success"]`)))
	task, err := e.srv.Get(e.ctx, live)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status)
	screenshot(t, tab, shots, "dashboard-tasks.png")

	// The overview's counts follow too.
	run("see the counts", chromedp.Click(css(`a[data-nav="overview"]`)),
		chromedp.WaitVisible(css(`#queues tr[data-behavior="demo.echo"] td[data-count="success"] a`)),
		void(chromedp.Poll[bool](`document.querySelector('#queues tr[data-behavior="demo.echo"] td[data-count="success"] a').textContent === "3"`)),
		chromedp.WaitVisible(css(`#activity li[data-task="browser-live"]`)),
	)
	screenshot(t, tab, shots, "dashboard-overview.png")

	// Hold and release a scheduled task from its page, as admin.
	idle := e.submit(web.SubmitBody{Behavior: idleKind.ID, ID: "browser-idle", GroupKey: "collection-a", Params: json.RawMessage(`{"note":"waits for ever"}`)})
	run("open the task page",
		chromedp.Click(css(`a[data-nav="tasks"]`)),
		chromedp.WaitVisible(css(`tr[data-task-id="browser-idle"] a`)),
		clickOn(`tr[data-task-id="browser-idle"] a`),
		chromedp.WaitVisible(css(`#task-status [data-status="scheduled"]`)),
		chromedp.WaitVisible(chromedp.ID("task-params")),
	)
	run("hold", clickOn(`#task-actions [data-action="hold"]`), chromedp.WaitVisible(css(`#task-status [data-status="held"]`)))
	task, err = e.srv.Get(e.ctx, idle)
	require.NoError(t, err)
	require.Equal(t, api.StatusHeld, task.Status)
	run("see the hold in the timeline", chromedp.WaitVisible(css(`#timeline li[data-status="held"]`)))
	run("release", clickOn(`#task-actions [data-action="release"]`), chromedp.WaitVisible(css(`#task-status [data-status="scheduled"]`)))
	task, err = e.srv.Get(e.ctx, idle)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status)

	// The idle task waits, due: the queue lag shows how long.
	var stats web.StatsResponse
	e.json(http.MethodGet, "/api/v1/stats", readToken, nil, http.StatusOK, &stats)
	require.Positive(t, stats.QueueLagMS, "a due task waits")
	run("see the queue lag", chromedp.Click(css(`a[data-nav="overview"]`)), chromedp.WaitVisible(chromedp.ID("m-lag")),
		void(chromedp.Poll[bool](`/^[0-9.]+(ms|s)$|^[0-9]+[mhd] [0-9]+[smh]$/.test(document.getElementById('m-lag').textContent)`,
			chromedp.WithPollingTimeout(30*time.Second))))

	// Fail a held task by hand from its page: a reason is needed, and a
	// second click.
	doomed := e.submit(web.SubmitBody{Behavior: idleKind.ID, ID: "browser-doomed", Params: json.RawMessage(`{"note":"never runs"}`)})
	require.NoError(t, e.srv.Hold(e.ctx, doomed))
	run("open the held task", goHash("#/tasks/"+string(doomed)),
		chromedp.WaitVisible(css(`#task-status [data-status="held"]`)), chromedp.WaitVisible(chromedp.ID("fail-reason")))
	// The reason is typed and the button clicked twice (the confirming
	// click must come within 3 seconds) in one script: the page redraws on
	// the task's events, and a busy machine could part the steps around a
	// redraw or past the confirm window.
	failWith := func(reason string) chromedp.Action[chromedp.Void] {
		return void(chromedp.Evaluate[bool](`(() => { document.getElementById('fail-reason').value = ` + jsString(reason) + `;
			const b = document.querySelector('#task-actions [data-action="fail"]'); b.click(); b.click(); return true })()`))
	}
	run("fail without a reason", chromedp.WaitVisible(css(`#task-actions [data-action="fail"]`)), failWith(""),
		void(chromedp.Poll[bool](`[...document.querySelectorAll('.toast.bad')].some((el) => el.textContent.includes('give a reason'))`,
			chromedp.WithPollingTimeout(30*time.Second))))
	task, err = e.srv.Get(e.ctx, doomed)
	require.NoError(t, err)
	require.Equal(t, api.StatusHeld, task.Status, "no reason, no failure")
	run("fail with a reason", failWith("the source is gone"),
		chromedp.WaitVisible(css(`#task-status [data-status="failure"]`)),
		chromedp.WaitVisible(chromedp.ID("task-error")),
		chromedp.WaitVisible(css(`#task-actions [data-action="retry"]`)))
	require.Contains(t, text("task-error"), "failed by hand: the source is gone")
	require.Equal(t, "failed by hand, no attempt ran", text("task-error-kind"), "no attempt ran: none failed for good")
	task, err = e.srv.Get(e.ctx, doomed)
	require.NoError(t, err)
	require.Equal(t, api.StatusFailure, task.Status)
	require.Equal(t, api.FailedByHand, task.Error.Code)
	screenshot(t, tab, shots, "dashboard-failed-by-hand.png")

	// A retried failure has its own badge, says when it runs again and
	// why it failed.
	retried := e.submit(web.SubmitBody{Behavior: failKind.ID, ID: "browser-retry", Params: json.RawMessage(`{"note":"retry"}`)})
	run("see the retrying task", goHash("#/tasks/"+string(retried)),
		chromedp.WaitVisible(css(`#task-status [data-status="retrying"]`)), chromedp.WaitVisible(chromedp.ID("task-retrying")))
	retryNote := text("task-retrying")
	require.Regexp(t, `^retrying \(attempt [0-9]+ of 10, next (in .+|now)\): flaky on purpose$`, retryNote)
	// Every attempt shows, each with its error, not only the last.
	e.waitFor("two failed runs", func() bool { return len(e.task(retried).Attempts) >= 2 })
	attempts := e.task(retried).Attempts
	require.Equal(t, []int{1, 2}, []int{attempts[0].Attempt, attempts[1].Attempt})
	require.Equal(t, "flaky on purpose", attempts[0].Error.Message)
	run("see every attempt", goHash("#/nodes"), goHash("#/tasks/"+string(retried)),
		chromedp.WaitVisible(css(`#timeline li[data-attempt="2"][data-status="retrying"]`)))
	require.Equal(t, "Attempt 1 failed, retried: flaky: flaky on purpose", p.text(`#timeline li[data-attempt="1"][data-status="retrying"] span:last-child`))
	screenshot(t, tab, shots, "dashboard-retrying.png")

	// The failures list has the errors.
	run("see the failures with their errors", goHash("#/tasks?status=failure"),
		chromedp.WaitVisible(css(`tr[data-task-id="browser-failed"] td[data-field="error"]`)))
	failedErr, err := chromedp.Run(tab, chromedp.Text(css(`tr[data-task-id="browser-failed"] td[data-field="error"]`)))
	require.NoError(t, err)
	require.Equal(t, "failed on purpose", failedErr)

	// A progress that holds a zero time does not show it.
	progressed := e.submit(web.SubmitBody{Behavior: failKind.ID, ID: "browser-progress", Params: json.RawMessage(`{"note":"progress"}`)})
	task, err = e.srv.Await(e.ctx, progressed)
	require.NoError(t, err)
	require.Equal(t, api.StatusFailure, task.Status)
	require.Contains(t, string(task.Progress), `"0001-01-01T00:00:00Z"`, "the progress holds a zero time")
	run("see the progress", goHash("#/tasks/"+string(progressed)), chromedp.WaitVisible(chromedp.ID("task-progress")))
	progressText := text("task-progress")
	require.Contains(t, progressText, `"rows": 3`)
	require.NotContains(t, progressText, "0001-01-01")
	require.NotContains(t, progressText, "checkpointed_at")

	// The failed task's page shows its error and offers a retry.
	run("open the failed task",
		goHash("#/tasks/browser-failed"),
		chromedp.WaitVisible(chromedp.ID("task-error")),
		chromedp.WaitVisible(css(`#task-actions [data-action="retry"]`)),
	)
	require.Contains(t, text("task-error"), "failed on purpose")
	require.Equal(t, "failed for good after attempt 1: not retryable", text("task-error-kind"), "the error's kind as it was decided")
	require.Equal(t, "3d 0h after it finishes", text("task-retention"), "the task's own retention")
	leases, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('[data-field="lease"]').length`))
	require.NoError(t, err)
	require.Zero(t, leases, "a finished task shows no lease")
	// A retryable error on the last attempt its policy allows is stored as
	// it was returned: the page says no retry was left, not "retryable".
	_, err = e.st.Pool().Exec(e.ctx, `UPDATE stint_task SET error = jsonb_set(error, '{retryable}', 'true') WHERE id = 'browser-failed'`)
	require.NoError(t, err)
	run("see a failure with no retry left", goHash("#/nodes"), goHash("#/tasks/browser-failed"),
		chromedp.WaitVisible(chromedp.ID("task-error-kind")))
	require.Equal(t, "failed for good after attempt 1: no retry left", text("task-error-kind"))
	run("back to the held-and-released task", goHash("#/tasks/browser-idle"), chromedp.WaitVisible(css(`#timeline li[data-status="held"]`)))
	screenshot(t, tab, shots, "dashboard-task.png")

	// Submit from the dashboard's form; the page moves to the new task,
	// which runs to success.
	run("submit from the form",
		chromedp.Click(chromedp.ID("new-task")),
		chromedp.WaitVisible(chromedp.ID("submit-params")),
		chromedp.SetValue(chromedp.ID("submit-behavior"), "demo.echo"),
		chromedp.SetValue(chromedp.ID("submit-params"), `{"text":"from the form"}`),
		chromedp.SetValue(chromedp.ID("submit-id"), "browser-form"),
	)
	screenshot(t, tab, shots, "dashboard-submit.png")
	run("see the submitted task",
		chromedp.Click(chromedp.ID("submit-go")),
		chromedp.WaitVisible(css(`#task-status [data-status="success"]`)),
		chromedp.WaitVisible(chromedp.ID("task-result")),
	)
	require.Equal(t, "browser-form", text("task-id"))
	require.Contains(t, text("task-result"), `"text": "from the form"`)

	// The Nodes page shows a node's database incidents as it reported
	// them: one going on, and the last one that ended.
	require.NoError(t, e.st.RegisterNode(e.ctx, store.Node{ID: "browser-node", Host: "h", PID: 1, Version: "v0.9.1 (1a2b3c4d5e6f)"}))
	began := time.Now().Add(-time.Minute)
	require.NoError(t, e.st.HeartbeatNode(e.ctx, "browser-node", store.NodeHealth{
		Incidents: []store.NodeIncident{{Cause: "listener", Started: began, Failures: 3, Err: "listen: connection reset"}},
		Last:      &store.NodeIncident{Cause: "read_only", Started: began.Add(-time.Hour), Ended: began.Add(-50 * time.Minute), Failures: 9}}))
	run("see a node's incident", chromedp.Click(css(`a[data-nav="nodes"]`)),
		chromedp.WaitVisible(css(`#nodes tr[data-node="browser-node"] td.db-state [data-status="degraded"]`)))
	require.Contains(t, text("nodes"), "listener since")
	require.Contains(t, text("nodes"), "listen: connection reset")
	require.Equal(t, "v0.9.1 (1a2b3c4d5e6f)", p.text(`#nodes tr[data-node="browser-node"] td.version`), "each node's version")
	require.NoError(t, e.st.HeartbeatNode(e.ctx, "browser-node", store.NodeHealth{
		Last: &store.NodeIncident{Cause: "listener", Started: began, Ended: began.Add(90 * time.Second), Failures: 3}}))
	run("see it end", goHash("#/schedules"), goHash("#/nodes"),
		chromedp.WaitVisible(css(`#nodes tr[data-node="browser-node"] td.db-state [data-last="listener"]`)))
	require.Contains(t, text("nodes"), "ok · last: listener for 1m 30s")

	// Schedules have their page, with the next tick.
	require.NoError(t, e.srv.AddSchedule(e.ctx, api.Schedule{Name: "browser-hourly", Behavior: demo.Echo.ID, Spec: "@hourly",
		Params: json.RawMessage(`{"text":"tick"}`)}))
	run("open the schedules", chromedp.Click(css(`a[data-nav="schedules"]`)),
		chromedp.WaitVisible(css(`#schedules tr[data-schedule="browser-hourly"] td.next-tick time`)))

	// Batches have their pages: a list, and a batch with its jobs.
	batch := e.submitBatch("coll-browser", "carol")
	row := css(`tr[data-batch-id="` + string(batch) + `"]`)
	run("open the batches",
		chromedp.Click(css(`a[data-nav="batches"]`)),
		chromedp.WaitVisible(row),
		clickOn(string(row)+" a"),
		chromedp.WaitVisible(css(`#batch-state [data-state="Pending"]`)),
	)
	screenshot(t, tab, shots, "dashboard-batch.png")

	// An admin acts on the batch from its page.
	run("hold the batch", clickOn(`#batch-actions [data-action="batch-hold"]`),
		chromedp.WaitVisible(css(`#batch-state [data-state="Held"]`)),
		chromedp.WaitVisible(css(`#batch-actions [data-action="batch-release"]`)),
		chromedp.WaitVisible(css(`#batch-actions [data-action="batch-delete"]`)))
	held, err := e.srv.Get(e.ctx, batch)
	require.NoError(t, err)
	require.Equal(t, api.StatusHeld, held.Status)

	// A batch's notices to its depositors show on its page, a failed one
	// with its error.
	notified := e.submitBatch("coll-browser", "dora")
	require.NoError(t, e.srv.SetProgress(e.ctx, notified, nil, json.RawMessage(`{"status":"Processing","jobs":1,
		"notices":[{"kind":"queued","at":"2026-01-02T03:04:05Z"},
		{"kind":"report","at":"2026-01-02T03:05:05Z","error":"mail the report notice: 550 no such mailbox"}]}`), api.StatusScheduled))
	run("open the notified batch", goHash("#/batches/"+string(notified)),
		chromedp.WaitVisible(css(`#batch-notices li[data-kind="queued"][data-status="success"]`)),
		chromedp.WaitVisible(css(`#batch-notices li[data-kind="report"][data-status="failure"]`)))
	notices, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('#batch-notices').textContent`))
	require.NoError(t, err)
	require.Contains(t, notices, "Queued notice: sent")
	require.Contains(t, notices, "Report notice: not sent: mail the report notice: 550 no such mailbox")

	notReloaded, err := chromedp.Run(tab, chromedp.Evaluate[bool](`window.__notReloaded === true`))
	require.NoError(t, err)
	require.True(t, notReloaded, "the page was reloaded")

	// A read token sees no admin actions.
	run("sign out", chromedp.Click(chromedp.ID("signout")))
	run("sign in as reader", append(signIn(readToken),
		goHash("#/tasks/browser-idle"),
		chromedp.WaitVisible(css(`#task-status [data-status="scheduled"]`)))...)
	adminButtons, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('[data-action]').length`))
	require.NoError(t, err)
	require.Zero(t, adminButtons)
	require.Equal(t, "read", text("role"))
	run("open the batch as reader", goHash("#/batches/"+string(batch)), chromedp.WaitVisible(css(`#batch-state [data-state="Held"]`)))
	batchButtons, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('#batch-actions, [data-action]').length`))
	require.NoError(t, err)
	require.Zero(t, batchButtons, "a read token sees no batch actions")

	require.Empty(t, jsErrors(), "the page raised errors")
}

// A link with a token in its fragment signs in and opens the route it
// names, the token dropped from the address bar: a task's page, or a
// filtered list; the bare "#token=" of `stint dev` opens the overview.
func TestTokenLinkKeepsItsRoute(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	p := openPage(t, e)
	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"linked"}`), ID: "browser-linked"})
	_, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)
	hash := func() string {
		t.Helper()
		h, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`location.hash`))
		require.NoError(t, err)
		return h
	}
	// fresh forgets the token, as a new tab would not have it.
	fresh := void(chromedp.Evaluate[bool](`(() => { sessionStorage.clear(); return true })()`))

	p.run("open a task's link", chromedp.Navigate(e.ts.URL+"/#/tasks/"+string(id)+"?token="+adminToken),
		chromedp.WaitVisible(chromedp.ID("task-id")))
	require.Equal(t, string(id), p.text("#task-id"))
	require.Equal(t, "#/tasks/"+string(id), hash(), "the token is dropped, the route kept")

	p.run("open a list's link", fresh, chromedp.Navigate("about:blank"),
		chromedp.Navigate(e.ts.URL+"/#/tasks?behavior=demo.echo&token="+adminToken),
		chromedp.WaitVisible(css(`tr[data-task-id="`+string(id)+`"]`)))
	require.Equal(t, "#/tasks?behavior=demo.echo", hash())

	p.run("open the dev link", fresh, chromedp.Navigate("about:blank"),
		chromedp.Navigate(e.ts.URL+"/#token="+adminToken),
		chromedp.WaitVisible(css(`#live[data-state="on"]`)))
	require.Equal(t, "#/", hash())
	view, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.body.dataset.view`))
	require.NoError(t, err)
	require.Equal(t, "overview", view)
	require.Empty(t, p.jsErrors(), "the page raised errors")
}

// The overview's queue-lag card and its table's lag of the behavior that
// waits longest are one number, and both count on while nothing happens.
func TestQueueLagIsOneNumber(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	p := openPage(t, e)
	// test.idle runs on no node: its task waits, and its lag grows. Signed
	// in as admin, a row ends with the lag and the actions.
	e.submit(web.SubmitBody{Behavior: idleKind.ID, Params: json.RawMessage(`{"note":"waits"}`)})
	p.run("open the dashboard", chromedp.Navigate(e.ts.URL+"/"))
	p.run("sign in", signIn(adminToken)...)
	p.run("see the lag grow past 5s", void(chromedp.Poll[bool](`(() => { const el = document.getElementById('m-lag');
		return !!el && /^(\d\d+s|[5-9]\.\ds|\d+m .*)$/.test(el.innerText) })()`, chromedp.WithPollingTimeout(time.Minute))))
	texts, err := chromedp.Run(p.tab, chromedp.Evaluate[[]string](`[document.getElementById('m-lag').innerText,
		document.querySelector('#queues tr[data-behavior="test.idle"] td:nth-last-child(2)').innerText]`))
	require.NoError(t, err)
	card, table := parseLag(t, texts[0]), parseLag(t, texts[1])
	require.InDelta(t, card.Seconds(), table.Seconds(), 1, "the card says %s, the table %s", texts[0], texts[1])
	require.Empty(t, p.jsErrors(), "the page raised errors")
}

// parseLag reads a duration as the dashboard writes one: "3.4s", "12s",
// "1m 5s".
func parseLag(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(strings.ReplaceAll(s, " ", ""))
	require.NoError(t, err, "lag %q", s)
	return d
}
