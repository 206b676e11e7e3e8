package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// TestListWorkflowsOverHTTP lists workflows by state, a page at a time,
// and refuses bad filters with a 400 naming the parameter.
func TestListWorkflowsOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	later := web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":"x"}`), Delay: "1h"}
	for _, id := range []api.TaskID{"wf-list-a", "wf-list-b", "wf-list-c"} {
		body := web.WorkflowBody{ID: id, Nodes: []web.WorkflowNodeBody{
			{Name: "later", Task: later}, {Name: "after", Task: later, DependsOn: []string{"later"}},
		}}
		e.json(http.MethodPost, "/api/v1/workflows", submitToken, body, http.StatusCreated, nil)
	}
	r := e.do(http.MethodPost, "/api/v1/workflows/wf-list-b/cancel", adminToken, nil)
	require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)

	list := func(query string) (ids []api.TaskID, page api.WorkflowPage) {
		e.json(http.MethodGet, "/api/v1/workflows"+query, readToken, nil, http.StatusOK, &page)
		for _, w := range page.Workflows {
			ids = append(ids, w.ID)
		}
		return ids, page
	}
	ids, page := list("")
	require.Equal(t, []api.TaskID{"wf-list-a", "wf-list-b", "wf-list-c"}, ids)
	require.Equal(t, api.WorkflowRunning, page.Workflows[0].State)
	require.Equal(t, 2, page.Workflows[0].Pending)
	ids, page = list("?limit=2")
	require.Equal(t, []api.TaskID{"wf-list-a", "wf-list-b"}, ids)
	require.Equal(t, api.TaskID("wf-list-b"), page.Next)
	ids, page = list("?limit=2&after=wf-list-b")
	require.Equal(t, []api.TaskID{"wf-list-c"}, ids)
	require.Empty(t, page.Next)
	ids, _ = list("?state=running")
	require.Equal(t, []api.TaskID{"wf-list-a", "wf-list-c"}, ids)
	ids, page = list("?state=cancelled")
	require.Equal(t, []api.TaskID{"wf-list-b"}, ids, "cancelled, whether or not its own task recorded it yet")
	require.Zero(t, page.Workflows[0].Pending)
	ids, _ = list("?state=succeeded")
	require.Empty(t, ids)

	for query, field := range map[string]string{
		"?state=done": "state", "?state=": "state", "?limit=0": "limit", "?limit=1001": "limit", "?limit=x": "limit",
		"?after=x": "after", "?status=running": "status", "?state=running&state=failed": "state",
	} {
		e.requireError(http.MethodGet, "/api/v1/workflows"+query, readToken, nil, http.StatusBadRequest, "invalid", field)
	}
	e.requireError(http.MethodGet, "/api/v1/workflows", "", nil, http.StatusUnauthorized, "unauthorized", "")
}
