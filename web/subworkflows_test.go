package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// TestSubworkflowsOverHTTP: a node's workflow in the body of POST
// /workflows runs as a sub-workflow; the workflow and the sub-workflow
// name each other; a bad sub-workflow is refused naming its field.
func TestSubworkflowsOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	echo := web.SubmitBody{Behavior: "demo.echo", Params: json.RawMessage(`{"text":"hi"}`)}
	body := web.WorkflowBody{ID: "wf-outer", Nodes: []web.WorkflowNodeBody{
		{Name: "inner", Workflow: &web.WorkflowBody{Nodes: []web.WorkflowNodeBody{{Name: "a", Task: echo}, {Name: "b", Task: echo, DependsOn: []string{"a"}}}}},
		{Name: "after", Task: echo, DependsOn: []string{"inner"}},
	}}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken, body, http.StatusCreated, nil)

	var wf api.Workflow
	e.waitFor("the workflow to end", func() bool {
		wf = api.Workflow{}
		e.json(http.MethodGet, "/api/v1/workflows/wf-outer", readToken, nil, http.StatusOK, &wf)
		return wf.Ended()
	})
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
