package impl_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// The operations on tasks, applied to a workflow's nodes and to its own
// task: each keeps the workflow's rules or is refused with ErrConflict.

// laterRetry is test.later: its first attempt fails, retryably, and its
// retry waits an hour.
type laterRetry struct{}

var laterKind = api.Kind[struct{}, struct{}]{ID: "test.later"}

func (laterRetry) Kind() api.Kind[struct{}, struct{}]        { return laterKind }
func (laterRetry) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (laterRetry) Policy() spi.Policy {
	return spi.Policy{MaxAttempts: 3, BackoffMin: time.Hour, BackoffMax: time.Hour}
}
func (laterRetry) Run(_ context.Context, rc spi.RunContext, _ struct{}) (struct{}, error) {
	if rc.Attempt() == 1 {
		return struct{}{}, &api.TaskError{Retryable: true, Code: "once", Message: "the first attempt fails"}
	}
	return struct{}{}, nil
}

// seamEnv is a server of every test behavior, test.fixable and test.later
// included, and a client of its own that knows them.
func seamEnv(t *testing.T) (*env, *impl.Client) {
	e := setup(t)
	fix := &fixable{pool: e.pool}
	e.server("n1", 5*time.Second, func(c *impl.ServerConfig) {
		spi.MustRegister(c.Registry, fix)
		spi.MustRegister[struct{}, struct{}](c.Registry, laterRetry{})
	})
	reg := testRegistry(e.pool, "client", time.Second)
	spi.MustRegister(reg, fix)
	spi.MustRegister[struct{}, struct{}](reg, laterRetry{})
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return e, c
}

// get reads a task.
func get(t *testing.T, c api.Tasks, id api.TaskID) api.Task {
	t.Helper()
	task, err := c.Get(context.Background(), id)
	require.NoError(t, err)
	return task
}

// openGates lets the gated test.plain runs of the names go on.
func (e *env) openGates(names ...string) {
	e.t.Helper()
	for _, n := range names {
		_, err := e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id) VALUES ($1)`, n)
		require.NoError(e.t, err)
	}
}

// awaitWorkflow awaits workflow id for at most a minute.
func awaitWorkflow(t *testing.T, c api.Workflows, id api.TaskID) api.Workflow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, err := c.AwaitWorkflow(ctx, id)
	require.NoError(t, err)
	return w
}

// TestWorkflowHoldHoldsANodeWaitingForItsRetry: a node whose first
// attempt failed and whose retry waits is held with its workflow, keeps
// its retry's due time, and gets it back on release.
func TestWorkflowHoldHoldsANodeWaitingForItsRetry(t *testing.T) {
	t.Parallel()
	e, c := seamEnv(t)
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-hr", Nodes: []api.WorkflowNode{
		gateNode("a", "hr-a"), {Name: "t", Task: api.SubmitRequest{Behavior: laterKind.ID}},
	}})
	require.NoError(t, err)
	waitFor(t, time.Minute, "t waits for its retry", func() bool { return get(t, c, "wf-hr/t").Retrying() })
	due := e.count(`SELECT extract(epoch FROM schedule_not_before)::int FROM stint_task WHERE id = 'wf-hr/t'`)
	require.NoError(t, c.HoldWorkflow(e.ctx, "wf-hr"))
	require.Equal(t, api.StatusHeld, get(t, c, "wf-hr/t").Status, "a node waiting for its retry is held with its workflow")
	require.NoError(t, c.ReleaseWorkflow(e.ctx, "wf-hr"))
	require.Equal(t, due, e.count(`SELECT extract(epoch FROM schedule_not_before)::int FROM stint_task WHERE id = 'wf-hr/t'`),
		"released, it is due when its retry was")
	e.openGates("hr-a")
	require.NoError(t, c.CancelWorkflow(e.ctx, "wf-hr"))
}

// TestCancellingAHeldWorkflowEndsIt: a held workflow cancelled ends
// cancelled, and AwaitWorkflow answers; releasing it then is a conflict.
func TestCancellingAHeldWorkflowEndsIt(t *testing.T) {
	t.Parallel()
	e, c := seamEnv(t)
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-hc", Nodes: []api.WorkflowNode{
		gateNode("x", "hc-x"), spanNode("y", 0, "x"),
	}})
	require.NoError(t, err)
	waitFor(t, time.Minute, "x runs", func() bool { return get(t, c, "wf-hc/x").Status == api.StatusRunning })
	require.NoError(t, c.HoldWorkflow(e.ctx, "wf-hc"))
	require.NoError(t, c.CancelWorkflow(e.ctx, "wf-hc"))
	w := awaitWorkflow(t, c, "wf-hc")
	require.Equal(t, api.WorkflowCancelled, w.State)
	require.True(t, get(t, c, "wf-hc").Finished(), "the workflow's own task recorded the outcome")
	require.ErrorIs(t, c.ReleaseWorkflow(e.ctx, "wf-hc"), api.ErrConflict, "a cancelled workflow is not released")
	require.ErrorIs(t, c.CancelWorkflow(e.ctx, "wf-hc"), api.ErrConflict, "nor cancelled again")
	e.openGates("hc-x")
}

// TestRetryOfANodeCountsItOnce: a failed node retried while its
// workflow runs is forgotten by the dependent that counted its failure,
// and counted once more when it ends again: the dependent still waits
// for its other dependency.
func TestRetryOfANodeCountsItOnce(t *testing.T) {
	t.Parallel()
	e, c := seamEnv(t)
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-rn", Nodes: []api.WorkflowNode{
		{Name: "a", Task: api.SubmitRequest{Behavior: fixableKind.ID}}, gateNode("c", "rn-c"),
		{Name: "b", Task: flowReq(plainKind, FlowParams{ID: "rn-b"}), DependsOn: []string{"a", "c"}, Rule: api.RuleAllEnded},
	}})
	require.NoError(t, err)
	waitFor(t, time.Minute, "a fails", func() bool { return get(t, c, "wf-rn/a").Finished() })
	waitFor(t, time.Minute, "c runs", func() bool { return get(t, c, "wf-rn/c").Status == api.StatusRunning })
	require.NoError(t, c.Retry(e.ctx, "wf-rn/a"))
	waitFor(t, time.Minute, "a fails again", func() bool {
		task := get(t, c, "wf-rn/a")
		return task.Finished() && task.Attempt == 1
	})
	require.Equal(t, api.StatusWaiting, get(t, c, "wf-rn/b").Status, "b waits for c")
	require.Equal(t, []int{1, 0, 1}, []int{
		e.count(`SELECT deps_pending FROM stint_task WHERE id = 'wf-rn/b'`),
		e.count(`SELECT deps_succeeded FROM stint_task WHERE id = 'wf-rn/b'`),
		e.count(`SELECT deps_failed FROM stint_task WHERE id = 'wf-rn/b'`)}, "a's failure is counted once")
	e.openGates("rn-c")
	w := awaitWorkflow(t, c, "wf-rn")
	require.Equal(t, api.WorkflowFailed, w.State)
	require.Zero(t, e.count(`SELECT count(*) FROM test_span b, stint_task c
		WHERE b.task_id = 'wf-rn/b' AND c.id = 'wf-rn/c' AND b.started < c.finished_at`), "b started after c ended")

	// Retried once fixed, from the ended workflow: a runs, and b, which
	// depends on it, keeps its run (it succeeded).
	e.openGates("fixed")
	require.NoError(t, c.Retry(e.ctx, "wf-rn/a"))
	w = awaitWorkflow(t, c, "wf-rn")
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_span WHERE task_id = 'wf-rn/b'`))
	require.ErrorIs(t, c.Retry(e.ctx, "wf-rn/a"), api.ErrConflict, "a succeeded node is not retried")
}

// TestRetryOfANodeRunsWhatItsFailureEnded: retrying a failed node runs
// the dependents it skipped and the finally node again; a skipped node is
// refused (its dependency decided it), and a retry of the workflow's own
// task retries the workflow.
func TestRetryOfANodeRunsWhatItsFailureEnded(t *testing.T) {
	t.Parallel()
	e, c := seamEnv(t)
	fin := spanNode("fin", 0)
	fin.Finally = true
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-rs", Nodes: []api.WorkflowNode{
		{Name: "a", Task: api.SubmitRequest{Behavior: fixableKind.ID}}, spanNode("b", 0, "a"), spanNode("c", 0, "b"),
		spanNode("other", 0), fin,
	}})
	require.NoError(t, err)
	w := awaitWorkflow(t, c, "wf-rs")
	require.Equal(t, api.WorkflowFailed, w.State)
	require.Equal(t, api.CodeSkipped, get(t, c, "wf-rs/b").Error.Code)

	require.ErrorIs(t, c.Retry(e.ctx, "wf-rs/b"), api.ErrConflict, "a skipped node is not retried alone")
	require.ErrorIs(t, c.Retry(e.ctx, "wf-rs/other"), api.ErrConflict, "nor a succeeded one")
	require.True(t, get(t, c, "wf-rs/b").Finished(), "a refused retry changes nothing")

	e.openGates("fixed")
	require.NoError(t, c.Retry(e.ctx, "wf-rs/a"))
	w = awaitWorkflow(t, c, "wf-rs")
	require.Equal(t, api.WorkflowSucceeded, w.State)
	for id, runs := range map[string]int{"wf-rs/b": 1, "wf-rs/c": 1, "wf-rs/other": 1, "wf-rs/fin": 2} {
		require.Equal(t, runs, e.count(`SELECT count(*) FROM test_span WHERE task_id = $1`, id), id)
	}

	// The workflow's own task: Retry, Hold and Release act on the
	// workflow, Fail is refused.
	require.ErrorIs(t, c.Retry(e.ctx, "wf-rs"), api.ErrConflict, "no node failed")
	require.ErrorIs(t, c.Fail(e.ctx, "wf-rs", "by hand"), api.ErrConflict)
	require.ErrorIs(t, c.Hold(e.ctx, "wf-rs"), api.ErrConflict, "an ended workflow is not held")
}

// TestTheWorkflowsOwnTaskTakesTheWorkflowsOperations: Hold, Release and
// Fail of a running workflow's own task act on the workflow, or are
// refused, and the workflow's task never records an outcome its nodes do
// not have.
func TestTheWorkflowsOwnTaskTakesTheWorkflowsOperations(t *testing.T) {
	t.Parallel()
	e, c := seamEnv(t)
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-own", Nodes: []api.WorkflowNode{
		gateNode("a", "own-a"), spanNode("b", 0, "a"),
	}})
	require.NoError(t, err)
	waitFor(t, time.Minute, "a runs", func() bool { return get(t, c, "wf-own/a").Status == api.StatusRunning })
	require.NoError(t, c.Hold(e.ctx, "wf-own"))
	require.ErrorIs(t, c.Fail(e.ctx, "wf-own", "by hand"), api.ErrConflict, "a held workflow's task is not failed")
	e.openGates("own-a")
	waitFor(t, time.Minute, "b is ready, held", func() bool { return get(t, c, "wf-own/b").Status == api.StatusHeld })
	require.NoError(t, c.Release(e.ctx, "wf-own"), "releasing the workflow's task releases the workflow")
	w := awaitWorkflow(t, c, "wf-own")
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.Equal(t, api.StatusSuccess, get(t, c, "wf-own").Status)
}

// TestASubmitNeverChangesAnotherBehaviorsTask: a submit whose id is a
// task of another behavior, a workflow's own task or (resubmitting) a
// node is refused with ErrConflict naming what the id holds, and stores
// nothing; a sharing submit of a node's own behavior shares it.
func TestASubmitNeverChangesAnotherBehaviorsTask(t *testing.T) {
	t.Parallel()
	e, c := seamEnv(t)
	echo, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"x"}`), ID: "plain-echo"})
	require.NoError(t, err)
	_, err = c.Await(e.ctx, echo.ID)
	require.NoError(t, err)
	_, err = c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-sub", Nodes: []api.WorkflowNode{
		{Name: "a", Task: workReq(workKind, WorkParams{Key: "sub-a"})},
		{Name: "s", Task: workReq(shareKind, WorkParams{Key: "sub-s"})},
		gateNode("c", "sub-c"),
		{Name: "b", Task: flowReq(plainKind, FlowParams{ID: "sub-b"}), DependsOn: []string{"a", "c"}, Rule: api.RuleAllEnded},
	}})
	require.NoError(t, err)
	// The state compared below is one nothing else changes: a and s ended,
	// b waits for the gate c.
	waitFor(t, time.Minute, "a and s succeed", func() bool {
		return get(t, c, "wf-sub/a").Status == api.StatusSuccess && get(t, c, "wf-sub/s").Status == api.StatusSuccess
	})
	before := e.dump(`SELECT id, status, behavior, params, attempt, deps_pending FROM stint_task ORDER BY id`)
	cases := []struct {
		name string
		req  api.SubmitRequest
		says string
	}{
		{"another behavior's task", workReq(workKind, WorkParams{Key: "x"}), "is of behavior demo.echo, not test.work"},
		{"a workflow", api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"x"}`)}, "is a workflow"},
		{"a node, resubmitted", workReq(workKind, WorkParams{Key: "sub-a"}), "is node a of workflow wf-sub"},
		{"a node of another behavior", api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"x"}`)}, "is of behavior test.work"},
		{"a node, shared by another behavior", workReq(shareKind, WorkParams{Key: "x"}), "is of behavior test.work, not test.share"},
	}
	ids := []api.TaskID{"plain-echo", "wf-sub", "wf-sub/a", "wf-sub/a", "wf-sub/a"}
	for i, tc := range cases {
		req := tc.req
		req.ID = ids[i]
		_, err := c.Submit(e.ctx, req)
		require.ErrorIs(t, err, api.ErrConflict, tc.name)
		require.ErrorContains(t, err, tc.says, tc.name)
		// In a batch with a new task: the whole batch is refused.
		_, err = c.SubmitMany(e.ctx, []api.SubmitRequest{workReq(workKind, WorkParams{Key: fmt.Sprint("new-", i)}), req})
		require.ErrorIs(t, err, api.ErrConflict, tc.name)
	}
	require.Equal(t, before, e.dump(`SELECT id, status, behavior, params, attempt, deps_pending FROM stint_task ORDER BY id`),
		"refused submits changed nothing")

	sub, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: shareKind.ID, Params: mustJSON(WorkParams{Key: "sub-s"}), ID: "wf-sub/s"})
	require.NoError(t, err, "a sharing submit of a node's own behavior shares it")
	require.False(t, sub.Created)
	require.Equal(t, before, e.dump(`SELECT id, status, behavior, params, attempt, deps_pending FROM stint_task ORDER BY id`))

	// A workflow whose id a plain task holds, or one of whose node ids is
	// taken, is refused.
	_, err = c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "plain-echo", Nodes: []api.WorkflowNode{spanNode("a", 0)}})
	require.ErrorIs(t, err, api.ErrConflict)
	require.ErrorContains(t, err, "is of behavior demo.echo, not a workflow")
	_, err = c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "taken", Nodes: []api.WorkflowNode{spanNode("a", 0)}})
	require.NoError(t, err)
	_, err = c.Submit(e.ctx, api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"x"}`), ID: "wf2/a"})
	require.NoError(t, err)
	_, err = c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf2", Nodes: []api.WorkflowNode{spanNode("a", 0)}})
	require.ErrorIs(t, err, api.ErrInvalid, "a node id taken by another task")
	_, err = c.GetWorkflow(e.ctx, "wf2")
	require.ErrorIs(t, err, api.ErrNotFound, "nothing was stored")

	e.openGates("sub-c")
	w := awaitWorkflow(t, c, "wf-sub")
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run WHERE task_id = 'wf-sub/a'`), "a ran once")
}

// TestRetryOfANodeLeavesWhatOthersRuledOut: after a cancel, retrying one
// cancelled node runs it and the finally node again, but not a dependent
// that another cancelled node rules out: that one keeps its outcome, and
// the workflow ends and answers AwaitWorkflow.
func TestRetryOfANodeLeavesWhatOthersRuledOut(t *testing.T) {
	t.Parallel()
	e, c := seamEnv(t)
	fin := spanNode("fin", 0)
	fin.Finally = true
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-ro", Nodes: []api.WorkflowNode{
		gateNode("p", "ro-p"), gateNode("q", "ro-q"), spanNode("d", 0, "p", "q"), fin,
	}})
	require.NoError(t, err)
	waitFor(t, time.Minute, "p and q run", func() bool {
		return get(t, c, "wf-ro/p").Status == api.StatusRunning && get(t, c, "wf-ro/q").Status == api.StatusRunning
	})
	require.NoError(t, c.CancelWorkflow(e.ctx, "wf-ro"))
	require.Equal(t, api.WorkflowCancelled, awaitWorkflow(t, c, "wf-ro").State)

	e.openGates("ro-p")
	require.NoError(t, c.Retry(e.ctx, "wf-ro/p"))
	require.Equal(t, api.CodeCancelled, get(t, c, "wf-ro/d").Error.Code, "d, ruled out by q, keeps its outcome")
	w := awaitWorkflow(t, c, "wf-ro")
	require.Equal(t, api.WorkflowCancelled, w.State, "q and d are still cancelled")
	require.Equal(t, api.StatusSuccess, get(t, c, "wf-ro/p").Status)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_span WHERE task_id = 'wf-ro/fin'`), "the finally node ran after the retry")
	e.openGates("ro-q")
}
