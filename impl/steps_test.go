package impl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// KeptParams are the params of test.kept.
type KeptParams struct {
	Key string `json:"key" validate:"required"`
	// Steps is how many steps a run goes to, from the step it resumes at.
	Steps int `json:"steps"`
	// FailFresh fails a run that started from no progress, for good,
	// after its steps.
	FailFresh bool `json:"fail_fresh,omitempty"`
	// Gate makes a run wait after its first checkpoint until the gate
	// opens.
	Gate string `json:"gate,omitempty"`
}

// keptProgress is test.kept's progress: the last step done.
type keptProgress struct {
	Done int `json:"done"`
}

// KeptResult says from which step a run of test.kept started.
type KeptResult struct {
	From int `json:"from"`
	Done int `json:"done"`
}

var keptKind = api.Kind[KeptParams, KeptResult]{ID: "test.kept"}

// kept is test.kept, a behavior that keeps its checkpoints as steps: a
// run checkpoints every step from the progress it resumes from up to
// Steps, recording where it started in test_run (its attempt column).
type kept struct{ pool *pgxpool.Pool }

func (kept) Kind() api.Kind[KeptParams, KeptResult]      { return keptKind }
func (kept) TaskID(ids spi.IDs, p KeptParams) api.TaskID { return ids.Deterministic(p.Key) }
func (kept) Policy() spi.Policy {
	return spi.Policy{Lease: 5 * time.Second, MaxAttempts: 1, KeepSteps: true}
}

func (k kept) Run(ctx context.Context, rc spi.RunContext, p KeptParams) (KeptResult, error) {
	var pr keptProgress
	if _, err := rc.Progress(&pr); err != nil {
		return KeptResult{}, err
	}
	from := pr.Done
	if _, err := k.pool.Exec(ctx, `INSERT INTO test_run (task_id, attempt, node) VALUES ($1, $2, 'kept')`,
		string(rc.TaskID()), from); err != nil {
		return KeptResult{}, err
	}
	for i := from + 1; i <= p.Steps; i++ {
		if err := rc.Checkpoint(ctx, keptProgress{Done: i}); err != nil {
			return KeptResult{}, err
		}
		if p.Gate != "" && i == from+1 {
			if err := passGate(ctx, p.Gate); err != nil {
				return KeptResult{}, err
			}
		}
	}
	if p.FailFresh && from == 0 {
		return KeptResult{}, &api.TaskError{Code: "planned", Message: "a run from the start fails"}
	}
	return KeptResult{From: from, Done: p.Steps}, nil
}

// registerKept registers test.kept.
func registerKept(reg *spi.Registry, pool *pgxpool.Pool) {
	spi.MustRegister[KeptParams, KeptResult](reg, kept{pool: pool})
}

// keptReq is a submit of test.kept.
func keptReq(p KeptParams) api.SubmitRequest {
	raw, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return api.SubmitRequest{Behavior: keptKind.ID, Params: raw}
}

// keptID is the id of the test.kept task of key.
func keptID(key string) api.TaskID { return spi.NewIDs(keptKind.ID).Deterministic(key) }

// runStarts returns where each run of task id started (test.kept).
func (e *env) runStarts(id api.TaskID) []int {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT attempt FROM test_run WHERE task_id = $1 ORDER BY at`, string(id))
	require.NoError(e.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(e.t, err)
	return out
}

// stepProgresses returns the progress of each step, by number.
func stepProgresses(steps []api.Step) []int {
	out := make([]int, len(steps))
	for i, s := range steps {
		var p keptProgress
		if err := json.Unmarshal(s.Progress, &p); err != nil {
			panic(err)
		}
		out[i] = p.Done
		if s.N != i+1 {
			panic(fmt.Sprintf("step %d is numbered %d", i+1, s.N))
		}
	}
	return out
}

// TestStepsRewindAndFork keeps the checkpoints of a behavior as steps,
// lists them with their times, runs a task that failed again from its
// step 2 (the run resumes there, and numbers its steps from 3), and forks
// it from step 1 to a new task that runs from there. A run that resumes
// from a step says which on its span.
func TestStepsRewindAndFork(t *testing.T) {
	t.Parallel()
	e := setup(t)
	spans := tracetest.NewInMemoryExporter()
	e.server("node", 5*time.Second, func(c *impl.ServerConfig) {
		c.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	})
	c := e.client()

	sub, err := c.Submit(e.ctx, keptReq(KeptParams{Key: "a", Steps: 3, FailFresh: true}))
	require.NoError(t, err)
	id := sub.ID
	first, err := c.Await(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, api.StatusFailure, first.Status)
	first, err = c.Get(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3}, stepProgresses(first.Steps), "every checkpoint is kept")
	for i, s := range first.Steps {
		require.False(t, s.At.Before(first.CreatedAt), "step %d", s.N)
		require.False(t, s.At.After(*first.FinishedAt), "step %d", s.N)
		if i > 0 {
			require.False(t, s.At.Before(first.Steps[i-1].At), "step %d", s.N)
		}
	}

	require.NoError(t, c.Rewind(e.ctx, id, 2))
	again, err := c.Await(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, again.Status, "the run from step 2 succeeds: %s", again.Error)
	var res KeptResult
	require.NoError(t, json.Unmarshal(again.Result, &res))
	require.Equal(t, KeptResult{From: 2, Done: 3}, res, "the run resumed from step 2's progress")
	require.Equal(t, []int{0, 2}, e.runStarts(id))
	require.Equal(t, 1, again.Attempt, "a rewind starts a fresh count of attempts")
	again, err = c.Get(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3}, stepProgresses(again.Steps))
	require.Equal(t, first.Steps[:2], again.Steps[:2], "the steps up to 2 are kept as they were")
	require.True(t, again.Steps[2].At.After(first.Steps[2].At), "step 3 is the new run's")

	fork, err := c.Fork(e.ctx, id, 1, "a-fork")
	require.NoError(t, err)
	require.Equal(t, api.Submission{ID: "a-fork", Created: true, Status: api.StatusScheduled}, fork)
	forked, err := c.Await(e.ctx, "a-fork")
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, forked.Status)
	require.NoError(t, json.Unmarshal(forked.Result, &res))
	require.Equal(t, KeptResult{From: 1, Done: 3}, res, "the fork ran from step 1's progress")
	require.JSONEq(t, string(again.Params), string(forked.Params))
	require.Equal(t, keptKind.ID, forked.Behavior)
	require.Empty(t, forked.ParentID)
	forked, err = c.Get(e.ctx, "a-fork")
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3}, stepProgresses(forked.Steps))
	require.Equal(t, again.Steps[0], forked.Steps[0], "step 1 is copied with its time")
	source, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, again.Steps, source.Steps, "the source is left as it is")
	require.Equal(t, again.UpdatedAt, source.UpdatedAt)

	// The runs that resumed from a step say so on their spans.
	resumed := map[api.TaskID][]int64{}
	waitFor(t, 10*time.Second, "the run spans", func() bool { return len(spans.GetSpans()) >= 3 })
	for _, s := range spans.GetSpans() {
		var task api.TaskID
		step := int64(0)
		for _, a := range s.Attributes {
			switch a.Key {
			case "stint.task_id":
				task = api.TaskID(a.Value.AsString())
			case attribute.Key("stint.step"):
				step = a.Value.AsInt64()
			}
		}
		resumed[task] = append(resumed[task], step)
	}
	require.Equal(t, map[api.TaskID][]int64{id: {0, 2}, "a-fork": {1}}, resumed)
}

// TestRewindAndForkRefusals checks each refusal of a rewind and a fork:
// a running task, one that waits to run, a task or step that does not
// exist, a bad id or step, a new id that exists, a workflow's node and a
// workflow's own task. None changes anything.
func TestRewindAndForkRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("node", 5*time.Second)
	c := e.client()

	done, err := api.Submit(e.ctx, c, keptKind, KeptParams{Key: "done", Steps: 2})
	require.NoError(t, err)
	_, err = done.Await(e.ctx)
	require.NoError(t, err)
	waiting, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: keptKind.ID, Params: []byte(`{"key":"waiting","steps":1}`), Delay: time.Hour})
	require.NoError(t, err)
	held, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: keptKind.ID, Params: []byte(`{"key":"held","steps":1}`), Delay: time.Hour})
	require.NoError(t, err)
	require.NoError(t, c.Hold(e.ctx, held.ID))
	g := newGate(t)
	running, err := c.Submit(e.ctx, keptReq(KeptParams{Key: "running", Steps: 2, Gate: g}))
	require.NoError(t, err)
	waitFor(t, time.Minute, "the running task's first step", func() bool {
		return e.count(`SELECT count(*) FROM stint_step WHERE task_id = $1`, string(running.ID)) == 1
	})
	wf, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-kept", Nodes: []api.WorkflowNode{
		{Name: "n", Task: keptReq(KeptParams{Key: "n", Steps: 1})}}})
	require.NoError(t, err)
	_, err = c.AwaitWorkflow(e.ctx, wf.ID)
	require.NoError(t, err)
	node := wf.Nodes["n"]
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_step WHERE task_id = $1`, string(node)), "a node keeps its steps")

	state := func() string {
		return e.dump(`SELECT id, status, progress, step, updated_at FROM stint_task ORDER BY id`) +
			e.dump(`SELECT task_id, step, progress, at FROM stint_step ORDER BY task_id, step`)
	}
	before := state()
	for _, tc := range []struct {
		name string
		op   func() error
		want error
	}{
		{"rewind a running task", func() error { return c.Rewind(e.ctx, running.ID, 1) }, api.ErrConflict},
		{"fork a running task", func() error { _, err := c.Fork(e.ctx, running.ID, 1, "new-1"); return err }, api.ErrConflict},
		{"rewind a task that waits to run", func() error { return c.Rewind(e.ctx, waiting.ID, 1) }, api.ErrConflict},
		{"rewind a held task", func() error { return c.Rewind(e.ctx, held.ID, 1) }, api.ErrConflict},
		{"fork a task without steps", func() error { _, err := c.Fork(e.ctx, waiting.ID, 1, "new-2"); return err }, api.ErrNotFound},
		{"rewind to an unknown step", func() error { return c.Rewind(e.ctx, done.ID(), 3) }, api.ErrNotFound},
		{"fork from an unknown step", func() error { _, err := c.Fork(e.ctx, done.ID(), 9, "new-3"); return err }, api.ErrNotFound},
		{"rewind an unknown task", func() error { return c.Rewind(e.ctx, "no-such-task", 1) }, api.ErrNotFound},
		{"fork an unknown task", func() error { _, err := c.Fork(e.ctx, "no-such-task", 1, "new-4"); return err }, api.ErrNotFound},
		{"rewind to step 0", func() error { return c.Rewind(e.ctx, done.ID(), 0) }, api.ErrInvalid},
		{"fork from step -1", func() error { _, err := c.Fork(e.ctx, done.ID(), -1, "new-5"); return err }, api.ErrInvalid},
		{"rewind a bad id", func() error { return c.Rewind(e.ctx, "a b", 1) }, api.ErrInvalid},
		{"fork to a bad id", func() error { _, err := c.Fork(e.ctx, done.ID(), 1, "a b"); return err }, api.ErrInvalid},
		{"fork to an id that exists", func() error { _, err := c.Fork(e.ctx, done.ID(), 1, waiting.ID); return err }, api.ErrConflict},
		{"fork onto itself", func() error { _, err := c.Fork(e.ctx, done.ID(), 1, done.ID()); return err }, api.ErrConflict},
		{"rewind a workflow's node", func() error { return c.Rewind(e.ctx, node, 1) }, api.ErrConflict},
		{"fork a workflow's node", func() error { _, err := c.Fork(e.ctx, node, 1, "new-6"); return err }, api.ErrConflict},
		{"rewind a workflow", func() error { return c.Rewind(e.ctx, wf.ID, 1) }, api.ErrConflict},
	} {
		err := tc.op()
		require.ErrorIs(t, err, tc.want, tc.name)
	}
	require.ErrorContains(t, c.Rewind(e.ctx, node, 1), "retry the node")
	require.Equal(t, before, state(), "the refusals changed nothing")

	openGate(g)
	_, err = c.Await(e.ctx, running.ID)
	require.NoError(t, err)
}

// TestStepsGoWithTheirTask deletes tasks with steps every way a task is
// deleted: Remove, RemoveWorkflow with its nodes, and the cleanup's
// deletes of finished tasks (a workflow's with its nodes) and of tasks
// past their own retention. Their steps go with them.
func TestStepsGoWithTheirTask(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("node", 5*time.Second)
	c := e.client()
	steps := func(id api.TaskID) int {
		return e.count(`SELECT count(*) FROM stint_step WHERE task_id = $1`, string(id))
	}
	run := func(p KeptParams, retention time.Duration) api.TaskID {
		req := keptReq(p)
		req.Retention = retention
		sub, err := c.Submit(e.ctx, req)
		require.NoError(t, err)
		_, err = c.Await(e.ctx, sub.ID)
		require.NoError(t, err)
		require.Equal(t, p.Steps, steps(sub.ID))
		return sub.ID
	}
	workflow := func(id api.TaskID) api.TaskID {
		wf, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: id, Nodes: []api.WorkflowNode{
			{Name: "n", Task: keptReq(KeptParams{Key: string(id), Steps: 2})}}})
		require.NoError(t, err)
		_, err = c.AwaitWorkflow(e.ctx, wf.ID)
		require.NoError(t, err)
		require.Equal(t, 2, steps(wf.Nodes["n"]))
		return wf.Nodes["n"]
	}

	removed := run(KeptParams{Key: "removed", Steps: 2}, 0)
	require.NoError(t, c.Remove(e.ctx, removed))
	require.Zero(t, steps(removed), "Remove")

	node := workflow("wf-removed")
	require.NoError(t, c.RemoveWorkflow(e.ctx, "wf-removed"))
	require.Zero(t, steps(node), "RemoveWorkflow")

	expired := run(KeptParams{Key: "expired", Steps: 2}, time.Millisecond)
	waitFor(t, 10*time.Second, "the task to expire", func() bool {
		n, err := e.st.DeleteExpired(e.ctx, 10)
		require.NoError(t, err)
		return n[string(keptKind.ID)+"/success"] == 1
	})
	require.Zero(t, steps(expired), "the cleanup of tasks past their own retention")

	old := run(KeptParams{Key: "old", Steps: 3}, 0)
	oldNode := workflow("wf-old")
	for _, b := range []api.BehaviorID{keptKind.ID, api.WorkflowBehavior} {
		n, err := e.st.DeleteFinished(e.ctx, store.DeleteFinishedParams{Behavior: b, Status: api.StatusSuccess, Limit: 10})
		require.NoError(t, err)
		require.Equal(t, 1, n, b)
	}
	require.Zero(t, steps(old), "the cleanup of finished tasks")
	require.Zero(t, steps(oldNode), "the cleanup of a finished workflow's nodes")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_step`))
}
