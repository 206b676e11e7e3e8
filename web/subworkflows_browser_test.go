package web_test

import (
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestSubworkflowsInBrowser: the workflow page lists the sub-workflows its
// nodes run, linked, and marks their boxes; the sub-workflow's page names
// the node that runs it and its workflow; the node's page links its
// sub-workflow.
func TestSubworkflowsInBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	wf := runOuterT(e, "wf-browser-outer")
	inner, _ := wf.Node("inner")
	sub := string(inner.Workflow)
	require.NotEmpty(t, sub)

	p := openPage(t, e)
	p.run("open the workflow", chromedp.Navigate(e.ts.URL+"/#/workflows/wf-browser-outer?token="+adminToken),
		chromedp.WaitVisible(css(`#workflow-subworkflows li[data-node="inner"]`)))
	require.Equal(t, sub, p.attr(`#workflow-subworkflows li[data-node="inner"] a[data-workflow]`, "data-workflow"))
	require.Contains(t, p.text(`#workflow-subworkflows li[data-node="inner"]`), "inner runs "+sub)
	require.Equal(t, 1, p.count(`#wf-graph .wf-node[data-workflow="`+sub+`"]`))

	p.run("open the sub-workflow", clickOn(`#workflow-subworkflows li[data-node="inner"] a[data-workflow]`),
		chromedp.WaitVisible(chromedp.ID("workflow-parent")))
	require.Equal(t, sub, p.text("#workflow-id"))
	require.Equal(t, "sub-workflow of node inner of workflow wf-browser-outer", p.text("#workflow-parent"))

	p.run("open the node's task", chromedp.Navigate(e.ts.URL+"/#/tasks/wf-browser-outer%2Finner?token="+adminToken),
		chromedp.WaitVisible(chromedp.ID("task-subworkflow")))
	require.Equal(t, sub, p.text("#task-subworkflow"))
}
