package impl_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// switchParams are the params of test.switch.
type switchParams struct {
	Key string `json:"key"`
}

var switchKind = api.Kind[switchParams, struct{}]{ID: "test.switch"}

// switches are the test.switch tasks that fail, by key.
var switches sync.Map

// switchWork is test.switch: it fails for good while its key is in
// switches, and succeeds otherwise.
type switchWork struct{}

func (switchWork) Kind() api.Kind[switchParams, struct{}]        { return switchKind }
func (switchWork) TaskID(ids spi.IDs, p switchParams) api.TaskID { return ids.Deterministic(p.Key) }
func (switchWork) Run(_ context.Context, _ spi.RunContext, p switchParams) (struct{}, error) {
	if _, fail := switches.Load(p.Key); fail {
		return struct{}{}, api.Permanent("switched", "%s is switched to fail", p.Key)
	}
	return struct{}{}, nil
}

func switchNode(t *testing.T, name, key string, deps ...string) api.WorkflowNode {
	t.Helper()
	raw, err := json.Marshal(switchParams{Key: key})
	require.NoError(t, err)
	return api.WorkflowNode{Name: name, Task: api.SubmitRequest{Behavior: switchKind.ID, Params: raw}, DependsOn: deps}
}

// awaitWorkflowT waits for workflow id to end.
func awaitWorkflowT(t *testing.T, e *env, c api.Workflows, id api.TaskID) api.Workflow {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	w, err := c.AwaitWorkflow(ctx, id)
	require.NoError(t, err)
	return w
}

// TestASubworkflowRunsAsANode: a node runs a whole workflow once its
// dependency ended, holding no worker while it waits, and succeeds with
// its result; its dependent runs after it. The two are linked both ways.
func TestASubworkflowRunsAsANode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	g := newGate(t)
	child := api.WorkflowRequest{Nodes: []api.WorkflowNode{
		{Name: "slow", Task: workReq(workKind, WorkParams{Key: "sub-slow", Gate: g})},
		switchNode(t, "next", "sub-next", "slow"),
	}}
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-parent", Nodes: []api.WorkflowNode{
		switchNode(t, "prep", "prep"),
		{Name: "child", Workflow: &child, DependsOn: []string{"prep"}},
		switchNode(t, "after", "after", "child"),
	}})
	require.NoError(t, err)

	var childID api.TaskID
	waitFor(t, time.Minute, "the sub-workflow to be submitted", func() bool {
		w, err := c.GetWorkflow(e.ctx, "wf-parent")
		require.NoError(t, err)
		n, _ := w.Node("child")
		childID = n.Workflow
		_, err = c.GetWorkflow(e.ctx, childID)
		return err == nil
	})
	sub, err := c.GetWorkflow(e.ctx, childID)
	require.NoError(t, err)
	require.Equal(t, api.TaskID("wf-parent/child"), sub.ParentNode)
	waitFor(t, time.Minute, "the parent node to sleep, holding no worker", func() bool {
		n, err := c.Get(e.ctx, "wf-parent/child")
		require.NoError(t, err)
		return n.Status == api.StatusScheduled && n.Progress != nil && srv.Running() == 1 // sub-slow at its gate
	})

	openGate(g)
	w := awaitWorkflowT(t, e, c, "wf-parent")
	require.Equal(t, api.WorkflowSucceeded, w.State)
	node, _ := w.Node("child")
	require.Equal(t, api.StatusSuccess, node.Task.Status)
	require.Equal(t, childID, node.Workflow)
	require.Equal(t, 1, node.Task.Attempt, "the wait was no attempt")
	require.JSONEq(t, `{"state":"succeeded","counts":{"success":2},"skipped":0}`, string(node.Task.Result))
	after, _ := w.Node("after")
	require.True(t, after.Task.ExecutedAt.After(*node.Task.FinishedAt) || after.Task.ExecutedAt.Equal(*node.Task.FinishedAt))
	sub, err = c.GetWorkflow(e.ctx, childID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, sub.State)
	require.False(t, node.Task.FinishedAt.Before(*sub.FinishedAt), "the node ended after its sub-workflow")
}

// TestAFailedSubworkflowFailsItsNode: a sub-workflow that failed fails
// its node with its error, not retried, and the node's dependents decide
// by their rules; a retry of the parent retries the sub-workflow's failed
// nodes, and the parent succeeds with it.
func TestAFailedSubworkflowFailsItsNode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	switches.Store("sub-bad", true)
	child := api.WorkflowRequest{Nodes: []api.WorkflowNode{
		switchNode(t, "good", "sub-good"),
		switchNode(t, "bad", "sub-bad"),
	}}
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-failing", Nodes: []api.WorkflowNode{
		{Name: "child", Workflow: &child},
		switchNode(t, "after", "after-failing", "child"),
	}})
	require.NoError(t, err)
	w := awaitWorkflowT(t, e, c, "wf-failing")
	require.Equal(t, api.WorkflowFailed, w.State)
	node, _ := w.Node("child")
	require.Equal(t, api.StatusFailure, node.Task.Status)
	require.Equal(t, "workflow_failed", node.Task.Error.Code)
	require.Contains(t, node.Task.Error.Message, string(node.Workflow))
	require.False(t, node.Task.Error.Retryable)
	require.Equal(t, 1, node.Task.Attempt)
	after, _ := w.Node("after")
	require.Equal(t, api.CodeSkipped, after.Task.Error.Code)
	sub, err := c.GetWorkflow(e.ctx, node.Workflow)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowFailed, sub.State)

	switches.Delete("sub-bad")
	require.NoError(t, c.RetryWorkflow(e.ctx, "wf-failing"))
	w = awaitWorkflowT(t, e, c, "wf-failing")
	require.Equal(t, api.WorkflowSucceeded, w.State)
	sub, err = c.GetWorkflow(e.ctx, node.Workflow)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, sub.State, "retried with its parent")
}

// TestARetriedSubworkflowNodeSubmitsOnce: a node whose run failed after it
// submitted its sub-workflow finds it at its next run, and submits none.
func TestARetriedSubworkflowNodeSubmitsOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	var submits, created atomic.Int32
	defer impl.OnSubworkflowSubmitted(func(node api.TaskID, isNew bool) error {
		if !strings.HasPrefix(string(node), "wf-retried/") {
			return nil
		}
		submits.Add(1)
		if isNew {
			created.Add(1)
		}
		if submits.Load() == 1 {
			return api.Retryable("lost", "the run fails after its submit")
		}
		return nil
	})()
	child := api.WorkflowRequest{Nodes: []api.WorkflowNode{switchNode(t, "only", "retried-only")}}
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-retried", Nodes: []api.WorkflowNode{
		{Name: "child", Workflow: &child},
	}})
	require.NoError(t, err)
	w := awaitWorkflowT(t, e, c, "wf-retried")
	require.Equal(t, api.WorkflowSucceeded, w.State)
	node, _ := w.Node("child")
	require.Equal(t, 2, node.Task.Attempt, "a failed run and the one that found the sub-workflow")
	require.Equal(t, int32(1), submits.Load(), "the second run submitted nothing")
	require.Equal(t, int32(1), created.Load())
}

// TestSubworkflowNodesAreCheckedAtSubmit: a sub-workflow is validated
// with its parent, which stores nothing when it is bad.
func TestSubworkflowNodesAreCheckedAtSubmit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	good := api.WorkflowRequest{Nodes: []api.WorkflowNode{switchNode(t, "a", "a")}}
	named := good
	named.ID = "wf-named"
	for _, tc := range []struct {
		name string
		node api.WorkflowNode
		want string
	}{
		{"bad node", api.WorkflowNode{Name: "child", Workflow: &api.WorkflowRequest{Nodes: []api.WorkflowNode{
			{Name: "x", Task: api.SubmitRequest{Behavior: "no.such"}}}}}, "nodes[0].workflow.nodes[0].task.behavior"},
		{"no nodes", api.WorkflowNode{Name: "child", Workflow: &api.WorkflowRequest{}}, "nodes[0].workflow.nodes"},
		{"own id", api.WorkflowNode{Name: "child", Workflow: &named}, "workflow.id must be empty"},
		{"and a gate", api.WorkflowNode{Name: "child", Workflow: &good, Gate: &api.Gate{Topic: "t", Timeout: time.Hour}}, "not both"},
		{"and a behavior", api.WorkflowNode{Name: "child", Workflow: &good, Task: workReq(workKind, WorkParams{Key: "k"})}, "runs no behavior"},
	} {
		_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-bad", Nodes: []api.WorkflowNode{tc.node}})
		require.ErrorIs(t, err, api.ErrInvalid, tc.name)
		require.Contains(t, err.Error(), tc.want, tc.name)
	}
	_, err := c.GetWorkflow(e.ctx, "wf-bad")
	require.ErrorIs(t, err, api.ErrNotFound)
}

// TestARemovedSubworkflowFailsItsNode: the removal of a sub-workflow wakes
// the node that waits for it, which fails: nothing is left to end with.
func TestARemovedSubworkflowFailsItsNode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	g := newGate(t)
	defer openGate(g)
	child := api.WorkflowRequest{Nodes: []api.WorkflowNode{{Name: "stuck", Task: workReq(workKind, WorkParams{Key: "removed-stuck", Gate: g})}}}
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-removing", Nodes: []api.WorkflowNode{{Name: "child", Workflow: &child}}})
	require.NoError(t, err)
	var childID api.TaskID
	waitFor(t, time.Minute, "the node to sleep on its sub-workflow", func() bool {
		w, err := c.GetWorkflow(e.ctx, "wf-removing")
		require.NoError(t, err)
		n, _ := w.Node("child")
		childID = n.Workflow
		return e.count(`SELECT count(*) FROM stint_task_wait WHERE waiter = 'wf-removing/child'`) == 1
	})
	require.NoError(t, c.RemoveWorkflow(e.ctx, childID))
	w := awaitWorkflowT(t, e, c, "wf-removing")
	require.Equal(t, api.WorkflowFailed, w.State)
	n, _ := w.Node("child")
	require.Equal(t, "workflow_removed", n.Task.Error.Code)
}
