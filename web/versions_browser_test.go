package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/web"
)

// TestVersionsInBrowser: a task of a newer version of its behavior than
// the live nodes run shows its version and what it waits for on its page,
// and the Nodes page shows the version of each behavior a node runs.
func TestVersionsInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	require.NoError(t, e.st.RegisterNode(e.ctx, store.Node{ID: "node-old", Host: "h", PID: 1,
		Behaviors: []api.BehaviorID{"test.idle"}, BehaviorVersions: map[api.BehaviorID]int{"test.idle": 1}}))
	id := e.submit(web.SubmitBody{Behavior: "test.idle"})
	_, err := e.st.Pool().Exec(e.ctx, `UPDATE stint_task SET version = 3 WHERE id = $1`, string(id))
	require.NoError(t, err)

	p := openPage(t, e)
	p.run("open the task", chromedp.Navigate(e.ts.URL+"/#/tasks/"+string(id)+"?token="+adminToken),
		chromedp.WaitVisible(css(`[data-field="version"]`)))
	require.Equal(t, "3", p.text(`[data-field="version"] dd`))
	require.Contains(t, p.text(`[data-field="status"] dd`), "no live node runs test.idle version 3 (nodes run 1)")
	p.run("open the nodes", goHash("#/nodes"), chromedp.WaitVisible(css(`#nodes tr[data-node="node-old"]`)))
	require.Equal(t, "test.idle@1", p.text(`#nodes tr[data-node="node-old"] td.behaviors`))
	require.Empty(t, p.jsErrors(), "the page raised errors")
}

// TestAHeldGroupsTaskSaysWhyInBrowser: a due task whose group key is held
// says so on its page, linked to the group's tasks.
func TestAHeldGroupsTaskSaysWhyInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	r := e.do(http.MethodPost, "/api/v1/groups/g-held/hold", adminToken, nil)
	require.Less(t, r.status, 300, "%s", r.body)
	id := e.submit(web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":"held"}`), GroupKey: "g-held"})

	p := openPage(t, e)
	p.run("open the task", chromedp.Navigate(e.ts.URL+"/#/tasks/"+string(id)+"?token="+adminToken),
		chromedp.WaitVisible(css(`[data-field="status"]`)))
	require.Contains(t, p.text(`[data-field="status"] dd`), "waiting: its group g-held is held")
	require.Empty(t, p.jsErrors(), "the page raised errors")
}
