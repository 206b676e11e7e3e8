package impl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// TestWorkflowNodesCarryTheirOwnRetention: a node with a retention of its
// own stays while its workflow runs (its dependents and their runs read
// it), and leaves with its own edges once that retention passed after the
// workflow ended; the nodes without one stay with the workflow, their
// edges still naming the node that left. A retry of a workflow that lost
// a node another depends on is refused.
func TestWorkflowNodesCarryTheirOwnRetention(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	brief := func(n api.WorkflowNode) api.WorkflowNode { n.Task.Retention = time.Microsecond; return n }
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-own", Nodes: []api.WorkflowNode{
		brief(spanNode("a", 0)), brief(gateNode("b", "open-own", "a")), spanNode("c", 0, "a"), failNode("d", "a"),
	}})
	require.NoError(t, err)
	status := func(id api.TaskID) api.Status {
		task, err := c.Get(e.ctx, id)
		require.NoError(t, err)
		return task.Status
	}
	expire := func() map[string]int {
		n, err := e.st.DeleteExpired(e.ctx, 100)
		require.NoError(t, err)
		return n
	}
	waitFor(t, time.Minute, "b to run after a", func() bool { return status("wf-own/b") == api.StatusRunning })
	require.Equal(t, api.StatusSuccess, status("wf-own/a"))
	require.Empty(t, expire(), "a node stays while its workflow runs, past its retention")
	require.Equal(t, api.StatusSuccess, status("wf-own/a"))

	_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id) VALUES ('open-own')`)
	require.NoError(t, err)
	w, err := c.AwaitWorkflow(e.ctx, "wf-own")
	require.NoError(t, err)
	require.Equal(t, api.WorkflowFailed, w.State)
	var gone map[string]int
	waitFor(t, 30*time.Second, "the brief nodes to leave", func() bool { gone = expire(); return len(gone) > 0 })
	require.Equal(t, map[string]int{string(plainKind.ID) + "/success": 2}, gone)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE id IN ('wf-own/a', 'wf-own/b')`))
	require.Zero(t, e.count(`SELECT count(*) FROM `+allEdges+` e WHERE task_id = 'wf-own/b'`), "the node's edges went with it")
	w, err = c.GetWorkflow(e.ctx, "wf-own")
	require.NoError(t, err)
	var names []string
	for _, n := range w.Nodes {
		names = append(names, n.Name)
		require.Equal(t, []string{"a"}, n.DependsOn, "node %s still names its dependency", n.Name)
	}
	require.Equal(t, []string{"c", "d"}, names, "the nodes without a retention of their own stay with the workflow")

	err = c.RetryWorkflow(e.ctx, "wf-own")
	require.ErrorIs(t, err, api.ErrConflict)
	require.ErrorContains(t, err, "wf-own/a")
	require.Equal(t, api.StatusFailure, status("wf-own/d"), "the refused retry changed nothing")
}
