package web_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/web"
)

// An admin sets limits from the Limits page and sees their use; a task a
// limit holds back says so on its page and in the task list; a reader
// sees the limits but cannot change them.
func TestLimitsInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	e.limitedNode()
	p := openPage(t, e)
	run, text := p.run, p.text
	// setValue replaces an input's value, as typing would.
	setValue := func(id, value string) chromedp.Action[chromedp.Void] {
		return void(chromedp.Evaluate[bool](`(() => { document.getElementById(` + jsString(id) + `).value = ` + jsString(value) + `; return true })()`))
	}
	poll := func(cond string) chromedp.Action[chromedp.Void] {
		return void(chromedp.Poll[bool](cond, chromedp.WithPollingTimeout(time.Minute)))
	}

	run("open the dashboard", chromedp.Navigate(e.ts.URL+"/"))
	run("sign in", signIn(adminToken)...)
	run("open the limits", chromedp.Click(css(`a[data-nav="limits"]`)),
		chromedp.WaitVisible(chromedp.ID("rate-limits-empty")),
		chromedp.WaitVisible(chromedp.ID("concurrency-limits-empty")))

	// A bad limit is refused with the field named, and nothing stored.
	run("set a bad rate limit",
		setValue("rl-name", testRateLimit), setValue("rl-limit", "2"), setValue("rl-period", "0s"),
		chromedp.Click(chromedp.ID("rl-set")),
		poll(`[...document.querySelectorAll('.toast.bad')].some((el) => el.textContent.includes('invalid period'))`))
	require.Empty(t, e.limits().Rate)

	run("set a rate limit",
		setValue("rl-period", "1h"),
		chromedp.Click(chromedp.ID("rl-set")),
		chromedp.WaitVisible(css(`#rate-limits tr[data-limit="`+testRateLimit+`"][data-key=""]`)))
	require.Equal(t, "2 / 1h", text(`#rate-limits tr[data-limit="`+testRateLimit+`"][data-key=""] [data-field="rate"]`))
	require.Equal(t, []api.RateLimit{{Name: testRateLimit, Limit: 2, Period: time.Hour}}, []api.RateLimit{e.limits().Rate[0].RateLimit})

	// The cap form proposes no behavior; one that no live node runs is
	// refused, naming it, unless "not deployed yet" is ticked.
	behaviorValue, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.getElementById('cl-behavior').value`))
	require.NoError(t, err)
	require.Empty(t, behaviorValue, "no behavior is picked for the user")
	run("cap an unknown behavior",
		setValue("cl-behavior", "nope.kind"), setValue("cl-max", "3"),
		chromedp.Click(chromedp.ID("cl-set")),
		poll(`[...document.querySelectorAll('.toast.bad')].some((el) => el.textContent.includes('"nope.kind" is not registered here and no live node runs it'))`))
	require.Empty(t, e.limits().Concurrency)
	run("force it",
		chromedp.Click(chromedp.ID("cl-force")),
		chromedp.Click(chromedp.ID("cl-set")),
		chromedp.WaitVisible(css(`#concurrency-limits tr[data-cap="nope.kind"][data-key=""]`)))
	require.Equal(t, "3", text(`#concurrency-limits tr[data-cap="nope.kind"][data-key=""] [data-field="max"]`))
	require.Equal(t, http.StatusNoContent, e.do(http.MethodDelete, "/api/v1/limits/concurrency/nope.kind", adminToken, nil).status)
	run("untick force", chromedp.Click(chromedp.ID("cl-force")))

	run("set a concurrency cap",
		setValue("cl-behavior", "test.limited"), setValue("cl-key", "acme"), setValue("cl-max", "5"), setValue("cl-weight", "2"),
		chromedp.Click(chromedp.ID("cl-set")),
		chromedp.WaitVisible(css(`#concurrency-limits tr[data-cap="test.limited"][data-key="acme"]`)))
	require.Equal(t, "5", text(`#concurrency-limits tr[data-cap="test.limited"][data-key="acme"] [data-field="max"]`))
	require.Equal(t, "2", text(`#concurrency-limits tr[data-cap="test.limited"][data-key="acme"] [data-field="weight"]`))

	// Three tasks of acme: two start, the third waits; the page shows the
	// key's use.
	var ids []api.TaskID
	for range 3 {
		ids = append(ids, e.submit(web.SubmitBody{Behavior: limitedKind.ID, Params: json.RawMessage(`{"note":"acme"}`)}))
	}
	var waiting api.TaskID
	e.waitFor("one task waiting", func() bool {
		for _, id := range ids {
			if e.task(id).Waiting != nil {
				waiting = id
				return true
			}
		}
		return false
	})
	row := `#rate-limits tr[data-limit="` + testRateLimit + `"][data-key="acme"]`
	run("see the key's use", poll(`(() => { const r = document.querySelector(`+jsString(row)+`);
		return !!r && r.querySelector('[data-field="used"]').innerText === '2 / 2' && r.querySelector('[data-field="waiting"]').innerText === '1' })()`))
	require.Regexp(t, `^in \d+m \d+s$`, text(row+` [data-field="next-free"]`), "the next unit frees in about half an hour")
	screenshot(t, p.tab, p.shots, "dashboard-limits.png")

	waitRE := regexp.MustCompile(`^waiting on rate limit ` + testRateLimit + ` \(key acme\), admitted (in .+|now)$`)
	run("open the waiting task", goHash("#/tasks/"+string(waiting)), chromedp.WaitVisible(chromedp.ID("task-waiting")))
	require.Regexp(t, waitRE, text("#task-waiting"))
	run("see the wait in the list", goHash("#/tasks?behavior=test.limited"),
		chromedp.WaitVisible(css(`tr[data-task-id="`+string(waiting)+`"] [data-field="waiting"]`)))
	require.Regexp(t, waitRE, text(`tr[data-task-id="`+string(waiting)+`"] [data-field="waiting"]`))
	screenshot(t, p.tab, p.shots, "dashboard-task-waiting.png")

	// An admin removes the limit from the page.
	head := `#rate-limits tr[data-limit="` + testRateLimit + `"][data-key=""]`
	run("remove the rate limit", chromedp.Click(css(`a[data-nav="limits"]`)), chromedp.WaitVisible(css(head+` [data-action="remove-limit"]`)),
		void(chromedp.Evaluate[bool](`(() => { const b = document.querySelector(`+jsString(head+` [data-action="remove-limit"]`)+`); b.click(); b.click(); return true })()`)),
		chromedp.WaitVisible(chromedp.ID("rate-limits-empty")))
	require.Empty(t, e.limits().Rate)

	// A fast limit spent whole frees a unit every second: the page says
	// when within the second, never "now" (no unit is free now).
	e.json(http.MethodPut, "/api/v1/limits/rate/"+testRateLimit, adminToken, map[string]any{"limit": 60, "period": "1m"}, http.StatusOK, nil)
	burst := make([]web.SubmitBody, 60)
	for i := range burst {
		burst[i] = web.SubmitBody{Behavior: limitedKind.ID, Params: json.RawMessage(`{"note":"burst"}`)}
	}
	var answers []web.SubmitAnswer
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, burst, http.StatusOK, &answers)
	e.waitFor("the burst to spend the budget", func() bool {
		for _, l := range e.limits().Rate {
			for _, k := range l.Keys {
				if k.Key == "burst" && k.Used >= 50 {
					return true
				}
			}
		}
		return false
	})
	burstRow := `#rate-limits tr[data-limit="` + testRateLimit + `"][data-key="burst"]`
	run("see the spent key", chromedp.Click(css(`a[data-nav="limits"]`)), chromedp.WaitVisible(css(burstRow+` [data-field="next-free"]`)))
	require.Regexp(t, `^(within a second|in \d+(\.\d)?s)$`, text(burstRow+` [data-field="next-free"]`))
	e.json(http.MethodDelete, "/api/v1/limits/rate/"+testRateLimit, adminToken, nil, http.StatusNoContent, nil)

	// A wait that begins while the task's page is open shows without an
	// event: a running blocker, a paused behavior (which the page says),
	// then a cap of one.
	blocker := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"hold the slot","delay_ms":60000}`)})
	e.waitFor("the blocker to run", func() bool { return e.task(blocker).Status == api.StatusRunning })
	require.NoError(t, e.srv.Pause(e.ctx, demo.Echo.ID))
	second := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"wait"}`)})
	run("open a due task", goHash("#/tasks/"+string(second)), chromedp.WaitVisible(css(`#task-status [data-status="scheduled"]`)))
	require.Equal(t, "scheduled, waiting: demo.echo is paused", text(`[data-field="status"] dd`))
	e.json(http.MethodPut, "/api/v1/limits/concurrency/demo.echo", adminToken, map[string]any{"max": 1}, http.StatusOK, nil)
	run("see it wait on the cap", poll(`document.getElementById('task-waiting').innerText === 'waiting on the concurrency cap of demo.echo'`))
	require.NoError(t, e.srv.Remove(e.ctx, blocker))
	require.NoError(t, e.srv.Resume(e.ctx, demo.Echo.ID))

	// A task of a behavior that no live node runs says so, and which
	// nodes run what, linking to the Nodes page.
	idle := e.submit(web.SubmitBody{Behavior: idleKind.ID, Params: json.RawMessage(`{"note":"nobody"}`)})
	run("open a task no node runs", goHash("#/tasks/"+string(idle)), chromedp.WaitVisible(chromedp.ID("task-waiting")))
	require.Regexp(t, `^waiting: no live node runs test\.idle \(node-\S+ runs demo\.echo, test\.fail(; .+)?\)$`, text("#task-waiting"))
	href, err := chromedp.Run(p.tab, chromedp.Evaluate[string](`document.getElementById('task-waiting').getAttribute('href')`))
	require.NoError(t, err)
	require.Equal(t, "#/nodes", href)

	// A reader sees the caps, and no form or button to change them.
	run("sign out", chromedp.Click(chromedp.ID("signout")))
	run("sign in as reader", append(signIn(readToken), goHash("#/limits"),
		chromedp.WaitVisible(css(`#concurrency-limits tr[data-cap="test.limited"][data-key="acme"]`)))...)
	controls, err := chromedp.Run(p.tab, chromedp.Evaluate[int](`document.querySelectorAll('#rl-form, #cl-form, [data-action]').length`))
	require.NoError(t, err)
	require.Zero(t, controls, "a read token sees no way to change limits")

	require.Empty(t, p.jsErrors(), "the page raised errors")
}
