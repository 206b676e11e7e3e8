package impl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// gateNode is a workflow node of test.plain whose run waits until
// test_effect holds a row for gate.
func gateNode(name, gate string, deps ...string) api.WorkflowNode {
	return api.WorkflowNode{Name: name, Task: flowReq(plainKind, FlowParams{ID: name, Gate: gate}), DependsOn: deps}
}

// TestWorkflowHoldAndRelease: a held workflow's node that becomes ready is
// stored held and runs only once the workflow is released; the running
// node runs on. Holding twice and releasing what is not held do nothing;
// an ended workflow cannot be held.
func TestWorkflowHoldAndRelease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-hold", Nodes: []api.WorkflowNode{
		gateNode("a", "open-a"), spanNode("b", 0, "a"),
	}})
	require.NoError(t, err)
	status := func(id api.TaskID) api.Status {
		task, err := c.Get(e.ctx, id)
		require.NoError(t, err)
		return task.Status
	}
	waitFor(t, time.Minute, "a runs", func() bool { return status("wf-hold/a") == api.StatusRunning })
	require.NoError(t, c.HoldWorkflow(e.ctx, sub.ID))
	require.NoError(t, c.HoldWorkflow(e.ctx, sub.ID), "holding a held workflow does nothing")
	_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id) VALUES ('open-a')`)
	require.NoError(t, err)
	waitFor(t, time.Minute, "a ends", func() bool { return status("wf-hold/a") == api.StatusSuccess })
	require.Equal(t, api.StatusHeld, status("wf-hold/b"), "a node made ready while its workflow is held is held")
	w, err := c.GetWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowRunning, w.State)

	require.NoError(t, c.ReleaseWorkflow(e.ctx, sub.ID))
	w, err = c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.ErrorIs(t, c.HoldWorkflow(e.ctx, sub.ID), api.ErrConflict, "an ended workflow cannot be held")
	require.ErrorIs(t, c.ReleaseWorkflow(e.ctx, sub.ID), api.ErrConflict)
	require.ErrorIs(t, c.HoldWorkflow(e.ctx, "wf-none"), api.ErrNotFound)
	require.ErrorIs(t, c.HoldWorkflow(e.ctx, "wf-hold/a"), api.ErrNotFound, "a node is no workflow")
	require.ErrorIs(t, c.HoldWorkflow(e.ctx, "no spaces"), api.ErrInvalid)

	// A workflow released while nothing is held runs on.
	sub, err = c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-free", Nodes: []api.WorkflowNode{gateNode("a", "open-free")}})
	require.NoError(t, err)
	require.NoError(t, c.ReleaseWorkflow(e.ctx, sub.ID))
	_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id) VALUES ('open-free')`)
	require.NoError(t, err)
	w, err = c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, w.State)
}

// TestWorkflowRemove: a workflow goes whole, its running node halting, its
// waiting ones and its edges gone; a node alone cannot be removed, and a
// plain Remove of the workflow's task removes the workflow.
func TestWorkflowRemove(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	for _, id := range []api.TaskID{"wf-rm", "wf-rm2"} {
		_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: id, Nodes: []api.WorkflowNode{
			gateNode("a", "never"), spanNode("b", 0, "a"),
		}})
		require.NoError(t, err)
	}
	waitFor(t, time.Minute, "a runs", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE id IN ('wf-rm/a', 'wf-rm2/a') AND status = 'running'`) == 2
	})
	require.ErrorIs(t, c.Remove(e.ctx, "wf-rm/b"), api.ErrConflict, "a node goes only with its workflow")

	require.NoError(t, c.RemoveWorkflow(e.ctx, "wf-rm"))
	require.NoError(t, c.Remove(e.ctx, "wf-rm2"))
	for _, id := range []api.TaskID{"wf-rm", "wf-rm2"} {
		_, err := c.GetWorkflow(e.ctx, id)
		require.ErrorIs(t, err, api.ErrNotFound)
		require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE id LIKE $1 || '/%'`, string(id)))
		require.Zero(t, e.count(`SELECT count(*) FROM `+allEdges+` e WHERE task_id LIKE $1 || '/%'`, string(id)))
	}
	require.ErrorIs(t, c.RemoveWorkflow(e.ctx, "wf-rm"), api.ErrNotFound)
}

// TestWorkflowStateChangesAreInTheFeed: the change feed carries a
// workflow's own task from its creation (waiting for its nodes) to its
// outcome, and its nodes' changes, each with the workflow as parent.
func TestWorkflowStateChangesAreInTheFeed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-feed", Nodes: []api.WorkflowNode{
		spanNode("a", 0), spanNode("b", 0, "a"),
	}})
	require.NoError(t, err)
	_, err = c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	events, _, err := c.Changes(e.ctx, 0, 1000)
	require.NoError(t, err)
	var workflow []api.Status
	nodes := map[api.TaskID][]api.Status{}
	for _, ev := range events {
		switch {
		case ev.TaskID == sub.ID:
			require.Equal(t, api.WorkflowBehavior, ev.Behavior)
			workflow = append(workflow, ev.Status)
		case ev.ParentID == sub.ID:
			nodes[ev.TaskID] = append(nodes[ev.TaskID], ev.Status)
		}
	}
	require.Equal(t, []api.Status{api.StatusWaiting, api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, workflow)
	require.Equal(t, []api.Status{api.StatusWaiting, api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, nodes["wf-feed/b"])
}
