package impl_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// waitOnParams are the params of test.waiton.
type waitOnParams struct {
	Key     string       `json:"key"`
	Targets []api.TaskID `json:"targets"`
	// MaxMS is the longest wait; zero for an hour.
	MaxMS int `json:"max_ms,omitempty"`
}

// waitOnResult is what test.waiton returns.
type waitOnResult struct {
	// Runs counts the task's runs, this one included.
	Runs int `json:"runs"`
	// Unended counts the targets that had not ended for good when the
	// run that succeeded began.
	Unended int `json:"unended"`
}

var waitOnKind = api.Kind[waitOnParams, waitOnResult]{ID: "test.waiton"}

// waitOn is test.waiton: its first run waits on its targets
// (spi.WaitForTasks); the next one counts the targets not ended yet and
// succeeds. Its runs are counted in its progress.
type waitOn struct{ pool *pgxpool.Pool }

func (waitOn) Kind() api.Kind[waitOnParams, waitOnResult]    { return waitOnKind }
func (waitOn) TaskID(ids spi.IDs, p waitOnParams) api.TaskID { return ids.Deterministic(p.Key) }
func (w waitOn) Run(ctx context.Context, rc spi.RunContext, p waitOnParams) (waitOnResult, error) {
	var runs int
	if _, err := rc.Progress(&runs); err != nil {
		return waitOnResult{}, err
	}
	runs++
	if err := rc.Checkpoint(ctx, runs); err != nil {
		return waitOnResult{}, err
	}
	if runs == 1 {
		max := time.Hour
		if p.MaxMS > 0 {
			max = time.Duration(p.MaxMS) * time.Millisecond
		}
		return waitOnResult{}, spi.WaitForTasks(p.Targets, max)
	}
	targets := make([]string, len(p.Targets))
	for i, id := range p.Targets {
		targets[i] = string(id)
	}
	var unended int
	err := w.pool.QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE id = ANY($1)
		AND NOT (status IN ('success', 'failure') AND schedule_not_before IS NULL)`, targets).Scan(&unended)
	return waitOnResult{Runs: runs, Unended: unended}, err
}

// registerWaitBehaviors registers test.waiton and test.switch.
func registerWaitBehaviors(reg *spi.Registry, pool *pgxpool.Pool) {
	spi.MustRegister[waitOnParams, waitOnResult](reg, waitOn{pool: pool})
	spi.MustRegister[switchParams, struct{}](reg, switchWork{})
}

// awaitWaitOn awaits the waiter's result.
func awaitWaitOn(t *testing.T, e *env, f *api.Future[waitOnResult]) waitOnResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	res, err := f.Await(ctx)
	require.NoError(t, err)
	return res
}

// asleepT waits until the waiter sleeps: scheduled after its first run,
// holding no worker.
func asleepT(t *testing.T, e *env, id api.TaskID) {
	t.Helper()
	waitFor(t, time.Minute, "the waiter to sleep", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE id = $1 AND status = 'scheduled' AND progress IS NOT NULL
			AND schedule_not_before > now() + interval '10 minutes'`, string(id)) == 1
	})
}

// TestWaitOnTasksOfAnotherWorkflow: a task waits on nodes of a workflow it
// is no part of, and on a node of another that is cancelled; it sleeps,
// holding no worker, and its next run comes once the last of them ended,
// exactly once.
func TestWaitOnTasksOfAnotherWorkflow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	g := newGate(t)
	_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-other", Nodes: []api.WorkflowNode{
		{Name: "slow", Task: workReq(workKind, WorkParams{Key: "slow", Gate: g})},
		{Name: "after", Task: workReq(workKind, WorkParams{Key: "after"}), DependsOn: []string{"slow"}},
	}})
	require.NoError(t, err)
	g2 := newGate(t)
	_, err = c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-cancelled", Nodes: []api.WorkflowNode{
		{Name: "stuck", Task: workReq(workKind, WorkParams{Key: "stuck", Gate: g2})},
		{Name: "never", Task: workReq(workKind, WorkParams{Key: "never"}), DependsOn: []string{"stuck"}},
	}})
	require.NoError(t, err)
	f, err := api.Submit(e.ctx, c, waitOnKind, waitOnParams{Key: "w",
		Targets: []api.TaskID{"wf-other/after", "wf-other/slow", "wf-cancelled/never"}})
	require.NoError(t, err)
	asleepT(t, e, f.ID())
	waitFor(t, time.Minute, "only the gated nodes to run", func() bool { return srv.Running() == 2 })

	openGate(g)
	waitFor(t, time.Minute, "wf-other to end", func() bool {
		w, err := c.GetWorkflow(e.ctx, "wf-other")
		require.NoError(t, err)
		return w.Ended()
	})
	asleepT(t, e, f.ID())
	require.NoError(t, c.CancelWorkflow(e.ctx, "wf-cancelled"))
	res := awaitWaitOn(t, e, f)
	require.Equal(t, waitOnResult{Runs: 2}, res, "woken once, with every target ended")
	openGate(g2)
	got, err := c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, 1, got.Attempt, "the wait was no attempt")
}

// TestWaitOnATaskSubmittedElsewhere: the task waited on is submitted by
// another process, and ends on another node; tasks that ended already
// count as ended at once, so a wait on them alone runs the task again at
// once.
func TestWaitOnATaskSubmittedElsewhere(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	e.server("n2", 5*time.Second)
	c := e.client()
	done, _ := e.run(c, WorkParams{Key: "done"})
	g := newGate(t)
	elsewhere, err := api.Submit(e.ctx, c, workKind, WorkParams{Key: "elsewhere", Gate: g})
	require.NoError(t, err)

	f, err := api.Submit(e.ctx, e.client(), waitOnKind, waitOnParams{Key: "w", Targets: []api.TaskID{elsewhere.ID(), done.ID()}})
	require.NoError(t, err)
	asleepT(t, e, f.ID())
	openGate(g)
	require.Equal(t, waitOnResult{Runs: 2}, awaitWaitOn(t, e, f))

	// Ended already: due at once, though the wait could last an hour.
	f, err = api.Submit(e.ctx, c, waitOnKind, waitOnParams{Key: "ended", Targets: []api.TaskID{elsewhere.ID(), done.ID(), done.ID()}})
	require.NoError(t, err)
	require.Equal(t, waitOnResult{Runs: 2}, awaitWaitOn(t, e, f))
}

// TestWaitOnAMissingTaskFails: an id of no task fails the run at once,
// not retried, and waits on nothing; so does a wait on the run's own
// task.
func TestWaitOnAMissingTaskFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	done, _ := e.run(c, WorkParams{Key: "done"})
	self := spi.NewIDs(waitOnKind.ID).Deterministic("self")
	for _, tc := range []struct {
		key, code string
		targets   []api.TaskID
	}{
		{"missing", spi.CodeWaitNotFound, []api.TaskID{done.ID(), "no-such-task"}},
		{"self", spi.CodeInvalidWait, []api.TaskID{self}},
		{"bad", spi.CodeInvalidWait, []api.TaskID{"a b"}},
	} {
		t.Run(tc.key, func(t *testing.T) {
			f, err := api.Submit(e.ctx, c, waitOnKind, waitOnParams{Key: tc.key, Targets: tc.targets})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
			defer cancel()
			_, err = f.Await(ctx)
			var te *api.TaskError
			require.ErrorAs(t, err, &te)
			require.Equal(t, tc.code, te.Code, te.Message)
			require.False(t, te.Retryable)
			got, err := c.Get(e.ctx, f.ID())
			require.NoError(t, err)
			require.Equal(t, 1, got.Attempt)
			require.Zero(t, e.count(`SELECT count(*) FROM stint_task_wait WHERE waiter = $1`, string(f.ID())))
		})
	}
}

// TestWaitOnTasksPassesItsLongest: a wait whose tasks have not ended runs
// the task again after its longest wait.
func TestWaitOnTasksPassesItsLongest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	g := newGate(t)
	defer openGate(g)
	slow, err := api.Submit(e.ctx, c, workKind, WorkParams{Key: "slow", Gate: g})
	require.NoError(t, err)
	f, err := api.Submit(e.ctx, c, waitOnKind, waitOnParams{Key: "w", Targets: []api.TaskID{slow.ID()}, MaxMS: 200})
	require.NoError(t, err)
	require.Equal(t, waitOnResult{Runs: 2, Unended: 1}, awaitWaitOn(t, e, f))
}

// TestWaitOnTasksEndingAtOnceWakesOnce: tasks that end together on two
// nodes, their ends recorded side by side, wake their waiter once: it
// runs twice in all.
func TestWaitOnTasksEndingAtOnceWakesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second, func(cfg *impl.ServerConfig) { cfg.MaxWorkers = 32 })
	e.server("n2", 5*time.Second, func(cfg *impl.ServerConfig) { cfg.MaxWorkers = 32 })
	c := e.client()
	for round := range 3 {
		g := newGate(t)
		var targets []api.TaskID
		for i := range 40 {
			f, err := api.Submit(e.ctx, c, workKind, WorkParams{Key: fmt.Sprintf("t%d.%d", round, i), Gate: g})
			require.NoError(t, err)
			targets = append(targets, f.ID())
		}
		f, err := api.Submit(e.ctx, c, waitOnKind, waitOnParams{Key: fmt.Sprint("w", round), Targets: targets})
		require.NoError(t, err)
		asleepT(t, e, f.ID())
		openGate(g)
		require.Equal(t, waitOnResult{Runs: 2}, awaitWaitOn(t, e, f), "round %d", round)
	}
}
