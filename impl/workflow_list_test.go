package impl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// TestListWorkflows lists workflows in each state, a page at a time,
// leaves out the tasks that are not workflows, and refuses bad filters.
func TestListWorkflows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	later := spanNode("later", 0)
	later.Task.Delay = time.Hour
	for _, req := range []api.WorkflowRequest{
		{ID: "wf-a-ok", Nodes: []api.WorkflowNode{spanNode("one", 0), spanNode("two", 0, "one")}},
		{ID: "wf-b-bad", Nodes: []api.WorkflowNode{failNode("bad"), spanNode("after", 0, "bad")}},
		{ID: "wf-c-cancelled", Nodes: []api.WorkflowNode{later}},
		{ID: "wf-d-running", Nodes: []api.WorkflowNode{later, spanNode("next", 0, "later"), spanNode("other", 0, "later")}},
	} {
		_, err := c.SubmitWorkflow(e.ctx, req)
		require.NoError(t, err)
	}
	_, err := c.Submit(e.ctx, flowReq(plainKind, FlowParams{ID: "plain"}))
	require.NoError(t, err)
	require.NoError(t, c.CancelWorkflow(e.ctx, "wf-c-cancelled"))
	for _, id := range []api.TaskID{"wf-a-ok", "wf-b-bad", "wf-c-cancelled"} {
		_, err := c.AwaitWorkflow(e.ctx, id)
		require.NoError(t, err)
	}

	ids := func(p api.WorkflowPage) []api.TaskID {
		var out []api.TaskID
		for _, w := range p.Workflows {
			out = append(out, w.ID)
		}
		return out
	}
	all, err := c.ListWorkflows(e.ctx, api.WorkflowFilter{})
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{"wf-a-ok", "wf-b-bad", "wf-c-cancelled", "wf-d-running"}, ids(all))
	require.Empty(t, all.Next)
	want := map[api.TaskID]api.WorkflowState{"wf-a-ok": api.WorkflowSucceeded, "wf-b-bad": api.WorkflowFailed,
		"wf-c-cancelled": api.WorkflowCancelled, "wf-d-running": api.WorkflowRunning}
	for _, w := range all.Workflows {
		require.Equal(t, want[w.ID], w.State, w.ID)
		require.False(t, w.CreatedAt.IsZero(), w.ID)
		require.Equal(t, w.State != api.WorkflowRunning, w.FinishedAt != nil, w.ID)
		require.Equal(t, w.State == api.WorkflowFailed || w.State == api.WorkflowCancelled, w.Error != nil, w.ID)
	}
	require.Equal(t, 3, all.Workflows[3].Pending, "no node of the running workflow ended")
	require.Zero(t, all.Workflows[0].Pending)

	for state, id := range map[api.WorkflowState]api.TaskID{api.WorkflowSucceeded: "wf-a-ok", api.WorkflowFailed: "wf-b-bad",
		api.WorkflowCancelled: "wf-c-cancelled", api.WorkflowRunning: "wf-d-running"} {
		p, err := c.ListWorkflows(e.ctx, api.WorkflowFilter{State: state})
		require.NoError(t, err)
		require.Equal(t, []api.TaskID{id}, ids(p), state)
	}

	first, err := c.ListWorkflows(e.ctx, api.WorkflowFilter{Limit: 3})
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{"wf-a-ok", "wf-b-bad", "wf-c-cancelled"}, ids(first))
	require.Equal(t, api.TaskID("wf-c-cancelled"), first.Next)
	second, err := c.ListWorkflows(e.ctx, api.WorkflowFilter{After: first.Next, Limit: 3})
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{"wf-d-running"}, ids(second))
	require.Empty(t, second.Next)

	for _, bad := range []api.WorkflowFilter{
		{State: "done"}, {State: "success"}, {Limit: -1}, {Limit: 1001}, {After: "x"}, {After: "has space"},
	} {
		_, err := c.ListWorkflows(e.ctx, bad)
		require.ErrorIs(t, err, api.ErrInvalid, "%+v", bad)
	}
}

// TestListWorkflowsBeforeTheirTaskRecords lists a workflow whose nodes all
// ended while no server runs its own task: its nodes say its state.
func TestListWorkflowsBeforeTheirTaskRecords(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	later := spanNode("later", 0)
	later.Task.Delay = time.Hour
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-unrecorded", Nodes: []api.WorkflowNode{later, spanNode("next", 0, "later")}})
	require.NoError(t, err)
	running, err := c.ListWorkflows(e.ctx, api.WorkflowFilter{State: api.WorkflowRunning})
	require.NoError(t, err)
	require.Len(t, running.Workflows, 1)
	require.NoError(t, c.CancelWorkflow(e.ctx, "wf-unrecorded"))
	task, err := c.Get(e.ctx, "wf-unrecorded")
	require.NoError(t, err)
	require.False(t, task.Finished(), "no server ran the workflow's own task")
	for state, n := range map[api.WorkflowState]int{api.WorkflowCancelled: 1, api.WorkflowRunning: 0, api.WorkflowFailed: 0, "": 1} {
		p, err := c.ListWorkflows(e.ctx, api.WorkflowFilter{State: state})
		require.NoError(t, err)
		require.Len(t, p.Workflows, n, state)
		for _, w := range p.Workflows {
			require.Equal(t, api.WorkflowCancelled, w.State)
			require.Zero(t, w.Pending)
		}
	}
}
