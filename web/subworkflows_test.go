package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// runOuterT submits over HTTP the workflow id, whose node inner runs a
// sub-workflow of two demo.echo nodes and whose node after depends on it,
// and returns it once it ended.
func runOuterT(e *testEnv, id string) api.Workflow {
	echo := web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":"hi"}`)}
	body := web.WorkflowBody{ID: api.TaskID(id), Nodes: []web.WorkflowNodeBody{
		{Name: "inner", Workflow: &web.WorkflowBody{Nodes: []web.WorkflowNodeBody{{Name: "a", Task: echo}, {Name: "b", Task: echo, DependsOn: []string{"a"}}}}},
		{Name: "after", Task: echo, DependsOn: []string{"inner"}},
	}}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, body, http.StatusCreated, nil)
	var wf api.Workflow
	e.waitFor("the workflow to end", func() bool {
		wf = api.Workflow{}
		e.json(http.MethodGet, "/api/v1/workflows/"+id, readToken, nil, http.StatusOK, &wf)
		return wf.Ended()
	})
	return wf
}

// TestSubworkflowsOverHTTP: a node's workflow in the body of POST
// /workflows runs as a sub-workflow; the workflow and the sub-workflow
// name each other; a bad sub-workflow is refused naming its field.
func TestSubworkflowsOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	wf := runOuterT(e, "wf-outer")
	require.Equal(t, api.WorkflowSucceeded, wf.State)
	inner, ok := wf.Node("inner")
	require.True(t, ok)
	require.NotEmpty(t, inner.Workflow)
	require.Equal(t, api.SubworkflowBehavior, inner.Task.Behavior)
	var sub api.Workflow
	e.json(http.MethodGet, "/api/v1/workflows/"+string(inner.Workflow), readToken, nil, http.StatusOK, &sub)
	require.Equal(t, api.TaskID("wf-outer/inner"), sub.ParentNode)
	require.Equal(t, api.WorkflowSucceeded, sub.State)
	require.Len(t, sub.Nodes, 2)

	bad := web.WorkflowBody{Nodes: []web.WorkflowNodeBody{{Name: "inner", Workflow: &web.WorkflowBody{Nodes: []web.WorkflowNodeBody{
		{Name: "a", Task: web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":5}`)}},
		{Name: "b", Task: web.SubmitBody{Behavior: "demo.echo", Delay: "soon"}},
	}}}}}
	e.requireError(http.MethodPost, "/api/v1/workflows", submitToken, bad, http.StatusBadRequest, "invalid", "nodes[0].workflow.nodes[1].task.delay")
	bad.Nodes[0].Workflow.Nodes = bad.Nodes[0].Workflow.Nodes[:1]
	e.requireError(http.MethodPost, "/api/v1/workflows", submitToken, bad, http.StatusBadRequest, "invalid", "nodes[0].workflow.nodes[0].task.params.text")
}
