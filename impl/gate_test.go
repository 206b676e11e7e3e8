package impl_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// signalGate is a workflow node that waits for a signal of topic.
func signalGate(name, topic string, timeout time.Duration, deps ...string) api.WorkflowNode {
	return api.WorkflowNode{Name: name, Gate: &api.Gate{Topic: topic, Timeout: timeout}, DependsOn: deps}
}

// TestGateWaitsForItsSignal: a gate node waits, holding no worker, with
// the reason "signal approval", until a signal to its id comes; it
// succeeds with the payload as its result, and its dependents run. A
// signal sent before the gate starts waits for it.
func TestGateWaitsForItsSignal(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-gate", Nodes: []api.WorkflowNode{
		spanNode("prepare", 0),
		signalGate("approve", "approval", 72*time.Hour, "prepare"),
		signalGate("early", "go", time.Hour, "approve"),
		spanNode("ship", 0, "approve", "early"),
	}})
	require.NoError(t, err)
	require.NoError(t, c.Signal(e.ctx, sub.Nodes["early"], "go", "already", api.SignalKey("early-1")),
		"a node waiting on its dependencies takes a signal")

	awaitSleep(t, c, sub.Nodes["approve"], "approval")
	w, err := c.GetWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	approve, _ := w.Node("approve")
	require.Equal(t, api.WaitSignal, approve.Task.Waiting.Reason, "the workflow's view shows the wait")
	require.Equal(t, api.GateBehavior, approve.Task.Behavior)
	require.Equal(t, 0, srv.Running(), "a waiting gate holds no worker")

	require.NoError(t, c.Signal(e.ctx, sub.Nodes["approve"], "approval", map[string]string{"by": "ana"}))
	w, err = c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, w.State)
	approve, _ = w.Node("approve")
	require.JSONEq(t, `{"by":"ana"}`, string(approve.Task.Result))
	early, _ := w.Node("early")
	require.JSONEq(t, `"already"`, string(early.Task.Result))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_span WHERE task_id = 'wf-gate/ship'`))
}

// TestGateTimesOut: a gate no signal reaches fails with the code timeout
// once its timeout passes; its dependents decide by their rules.
func TestGateTimesOut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	cleanup := spanNode("cleanup", 0, "approve")
	cleanup.Rule = api.RuleAllEnded
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-gate-timeout", Nodes: []api.WorkflowNode{
		signalGate("approve", "approval", 300*time.Millisecond),
		spanNode("ship", 0, "approve"),
		cleanup,
	}})
	require.NoError(t, err)
	w, err := c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowFailed, w.State)
	approve, _ := w.Node("approve")
	require.Equal(t, api.StatusFailure, approve.Task.Status)
	require.Equal(t, "timeout", approve.Task.Error.Code)
	require.Contains(t, approve.Task.Error.Message, "approval")
	ship, _ := w.Node("ship")
	require.Equal(t, api.CodeSkipped, ship.Task.Error.Code)
	done, _ := w.Node("cleanup")
	require.Equal(t, api.StatusSuccess, done.Task.Status)
	require.ErrorIs(t, c.Signal(e.ctx, sub.Nodes["approve"], "approval", "late"), api.ErrConflict,
		"a gate that ended takes no signal")
}

// TestGateRefusesBadGates: a gate with a task, a bad topic or a timeout
// out of range is refused whole, storing nothing.
func TestGateRefusesBadGates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	withTask := signalGate("g", "approval", time.Hour)
	withTask.Task = api.SubmitRequest{Behavior: "demo.echo", Params: json.RawMessage(`{}`)}
	for name, n := range map[string]api.WorkflowNode{
		"a task too":     withTask,
		"empty topic":    signalGate("g", "", time.Hour),
		"bad topic":      signalGate("g", "a b", time.Hour),
		"no timeout":     signalGate("g", "approval", 0),
		"negative":       signalGate("g", "approval", -time.Second),
		"over 100 years": signalGate("g", "approval", 101*365*24*time.Hour),
	} {
		_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-bad-gate", Nodes: []api.WorkflowNode{n}})
		require.ErrorIs(t, err, api.ErrInvalid, name)
		require.ErrorContains(t, err, `"g"`, name)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`))
}

// TestGateInJSON: a gate's timeout is a duration string in JSON.
func TestGateInJSON(t *testing.T) {
	t.Parallel()
	raw, err := json.Marshal(api.Gate{Topic: "approval", Timeout: 72 * time.Hour})
	require.NoError(t, err)
	require.JSONEq(t, `{"topic":"approval","timeout":"72h0m0s"}`, string(raw))
	var g api.Gate
	require.NoError(t, json.Unmarshal([]byte(`{"topic":"a","timeout":"1h30m"}`), &g))
	require.Equal(t, api.Gate{Topic: "a", Timeout: 90 * time.Minute}, g)
}
