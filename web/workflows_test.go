package web_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// TestWorkflowsOverHTTP submits a workflow as JSON, reads it back until it
// succeeded, refuses bad workflows with a 400 naming the problem (storing
// nothing), and cancels one that waits.
func TestWorkflowsOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	echo := func(text string) web.SubmitBody {
		return web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":"` + text + `"}`)}
	}
	body := web.WorkflowBody{ID: "wf-http", Retention: "36h", Nodes: []web.WorkflowNodeBody{
		{Name: "first", Task: echo("a")},
		{Name: "second", Task: echo("b"), DependsOn: []string{"first"}},
	}}
	var sub api.WorkflowSubmission
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, body, http.StatusCreated, &sub)
	require.Equal(t, api.TaskID("wf-http/second"), sub.Nodes["second"])
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, body, http.StatusOK, &sub)
	require.False(t, sub.Created)

	deadline := time.Now().Add(30 * time.Second)
	var wf api.Workflow
	get := func(id string) {
		wf = api.Workflow{}
		e.json(http.MethodGet, "/api/v1/workflows/"+id, readToken, nil, http.StatusOK, &wf)
	}
	for get("wf-http"); wf.State == api.WorkflowRunning; get("wf-http") {
		require.True(t, time.Now().Before(deadline), "the workflow did not end: %+v", wf)
		time.Sleep(50 * time.Millisecond) // polling the API, as a user would; the deadline bounds it
	}
	require.Equal(t, api.WorkflowSucceeded, wf.State)
	require.Equal(t, map[api.Status]int{api.StatusSuccess: 2}, wf.Counts)
	var own api.Task
	e.json(http.MethodGet, "/api/v1/tasks/wf-http", readToken, nil, http.StatusOK, &own)
	require.Equal(t, 36*time.Hour, own.Retention, "the workflow's retention")

	bad := []struct {
		name  string
		body  any
		field string
	}{
		{"cycle", web.WorkflowBody{Nodes: []web.WorkflowNodeBody{{Name: "a", Task: echo("a"), DependsOn: []string{"b"}}, {Name: "b", Task: echo("b"), DependsOn: []string{"a"}}}}, "nodes"},
		{"empty", web.WorkflowBody{}, "nodes"},
		{"bad delay", web.WorkflowBody{Nodes: []web.WorkflowNodeBody{{Name: "a", Task: web.SubmitBody{Behavior: "demo.echo", Delay: "soon"}}}}, "nodes[0].task.delay"},
		{"bad retention", web.WorkflowBody{Retention: "soon", Nodes: []web.WorkflowNodeBody{{Name: "a", Task: echo("a")}}}, "retention"},
		{"negative retention", web.WorkflowBody{Retention: "-1h", Nodes: []web.WorkflowNodeBody{{Name: "a", Task: echo("a")}}}, "retention"},
		{"unknown field", map[string]any{"nodes": []any{}, "extra": 1}, "extra"},
		{"bad params", web.WorkflowBody{Nodes: []web.WorkflowNodeBody{{Name: "a", Task: web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":5}`)}}}}, "nodes[0].task.params.text"},
	}
	for _, tc := range bad {
		e.requireError(http.MethodPost, "/api/v1/workflows", submitToken, tc.body, http.StatusBadRequest, "invalid", tc.field)
	}
	e.requireError(http.MethodPost, "/api/v1/workflows", readToken, body, http.StatusForbidden, "forbidden", "")
	e.requireError(http.MethodGet, "/api/v1/workflows/wf-http%2Ffirst", readToken, nil, http.StatusNotFound, "not_found", "")

	wait := web.WorkflowBody{ID: "wf-wait", Nodes: []web.WorkflowNodeBody{
		{Name: "later", Task: web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":"x"}`), Delay: "1h"}},
		{Name: "after", Task: echo("y"), DependsOn: []string{"later"}},
	}}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, wait, http.StatusCreated, &sub)
	e.requireError(http.MethodPost, "/api/v1/workflows/wf-wait/cancel", submitToken, nil, http.StatusForbidden, "forbidden", "")
	r := e.do(http.MethodPost, "/api/v1/workflows/wf-wait/cancel", adminToken, nil)
	require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)
	get("wf-wait")
	require.Equal(t, api.WorkflowCancelled, wf.State)
	e.requireError(http.MethodPost, "/api/v1/workflows/nope-nope/cancel", adminToken, nil, http.StatusNotFound, "not_found", "")

	r = e.do(http.MethodPost, "/api/v1/workflows/wf-wait/retry", adminToken, nil)
	require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)
	get("wf-wait")
	// Its nodes run again at once (the retried one without its delay),
	// and the second starts in the first one's finish: it may have ended.
	require.Contains(t, []api.WorkflowState{api.WorkflowRunning, api.WorkflowSucceeded}, wf.State)
	e.requireError(http.MethodPost, "/api/v1/workflows/wf-http/retry", adminToken, nil, http.StatusConflict, "conflict", "")

	// Hold, release and remove: admin only; an ended workflow cannot be
	// held; a removed one is gone. wf-hold waits on its delayed node.
	wait.ID = "wf-hold"
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, wait, http.StatusCreated, &sub)
	e.requireError(http.MethodPost, "/api/v1/workflows/wf-hold/hold", submitToken, nil, http.StatusForbidden, "forbidden", "")
	for _, verb := range []string{"hold", "hold", "release"} {
		r = e.do(http.MethodPost, "/api/v1/workflows/wf-hold/"+verb, adminToken, nil)
		require.Equal(t, http.StatusNoContent, r.status, "%s: %s", verb, r.body)
	}
	e.requireError(http.MethodPost, "/api/v1/workflows/wf-http/hold", adminToken, nil, http.StatusConflict, "conflict", "")
	e.requireError(http.MethodPost, "/api/v1/workflows/nope-nope/release", adminToken, nil, http.StatusNotFound, "not_found", "")
	e.requireError(http.MethodDelete, "/api/v1/workflows/wf-hold", submitToken, nil, http.StatusForbidden, "forbidden", "")
	r = e.do(http.MethodDelete, "/api/v1/workflows/wf-hold", adminToken, nil)
	require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)
	e.requireError(http.MethodGet, "/api/v1/workflows/wf-hold", readToken, nil, http.StatusNotFound, "not_found", "")
	e.requireError(http.MethodDelete, "/api/v1/workflows/wf-hold", adminToken, nil, http.StatusNotFound, "not_found", "")
}
