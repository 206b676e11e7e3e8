package impl_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// reopenParams are the params of test.reopen.
type reopenParams struct {
	Topic string `json:"topic"`
	// Fail fails the run for good when no message of the topic waits.
	Fail bool `json:"fail,omitempty"`
}

var reopenKind = api.Kind[reopenParams, []json.RawMessage]{ID: "test.reopen"}

// reopen is test.reopen, whose policy reopens its finished tasks on a
// signal (spi.Policy.ReopenOnSignal): a run succeeds with the payloads of
// the messages of its topic that wait for it, oldest first, or, with
// Fail, fails for good when none waits.
type reopen struct{}

func (reopen) Kind() api.Kind[reopenParams, []json.RawMessage] { return reopenKind }
func (reopen) TaskID(ids spi.IDs, _ reopenParams) api.TaskID   { return ids.Unique() }
func (reopen) Policy() spi.Policy                              { return spi.Policy{ReopenOnSignal: true} }
func (reopen) Run(ctx context.Context, rc spi.RunContext, p reopenParams) ([]json.RawMessage, error) {
	got := []json.RawMessage{}
	for {
		sg, ok, err := rc.Receive(ctx, p.Topic)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		got = append(got, sg.Payload)
	}
	if len(got) == 0 && p.Fail {
		return nil, api.Permanent("no_message", "no message waits")
	}
	return got, nil
}

// finishedReopen runs a test.reopen of p to its end on srv and returns
// the task.
func (e *env) finishedReopen(srv *impl.Server, p reopenParams) api.Task {
	e.t.Helper()
	f, err := api.Submit(e.ctx, srv, reopenKind, p)
	require.NoError(e.t, err)
	done, err := srv.Await(e.ctx, f.ID())
	require.NoError(e.t, err)
	return done
}

// stop stops srv, so that what a signal does to a task is seen before a
// run follows it.
func (e *env) stop(srv *impl.Server) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	require.NoError(e.t, srv.Stop(ctx))
}

// awaitRerun waits until the reopened task id finished again, and
// returns it.
func (e *env) awaitRerun(c api.Tasks, id api.TaskID) api.Task {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	done, err := c.Await(ctx, id)
	require.NoError(e.t, err)
	return done
}

// TestSignalReopensAFinishedTask: a signal to a task that succeeded, or
// failed for good, of a behavior with ReopenOnSignal schedules it again
// at once, as a resubmit does (attempts and errors reset, executed_at and
// finished_at cleared, its last outcome kept), with a claim hint and a
// change of the feed; the next run receives the message and finishes.
func TestSignalReopensAFinishedTask(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fail   bool
		status api.Status
	}{
		{"success", false, api.StatusSuccess},
		{"failure", true, api.StatusFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			srv := e.server("n1", 5*time.Second)
			c := e.client()
			before := e.finishedReopen(srv, reopenParams{Topic: "again", Fail: tc.fail})
			e.stop(srv)
			id := before.ID
			require.Equal(t, tc.status, before.Status)
			require.Equal(t, 1, before.Attempt)

			require.NoError(t, c.Signal(e.ctx, id, "again", "go"))
			got, err := c.Get(e.ctx, id)
			require.NoError(t, err)
			require.Equal(t, api.StatusScheduled, got.Status)
			require.Zero(t, got.Attempt)
			require.Zero(t, got.Errors)
			require.Nil(t, got.ExecutedAt)
			require.Nil(t, got.FinishedAt)
			require.NotNil(t, got.ScheduleNotBefore)
			require.Equal(t, before.Result, got.Result, "the last outcome is kept until the next run ends")
			require.Equal(t, before.Error, got.Error)
			require.Len(t, got.Signals, 1)
			require.JSONEq(t, `"go"`, string(got.Signals[0].Payload))
			require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_due WHERE id = $1 AND NOT parked`, string(id)), "a claim hint")

			e.server("n2", 5*time.Second)
			done := e.awaitRerun(c, id)
			require.Equal(t, api.StatusSuccess, done.Status, "%+v", done.Error)
			require.Equal(t, `["go"]`, string(done.Result))
			require.Equal(t, 1, done.Attempt)
			require.Empty(t, done.Signals, "the run consumed the message")
			statuses, _ := e.statuses(id)
			require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning, tc.status,
				api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, statuses)
		})
	}
}

// TestSignalReopensOnlyWhatItsPolicyAllows: a finished task of a behavior
// without ReopenOnSignal, a workflow's node, a workflow's own task and a
// child task refuse a signal whatever their behavior's policy, as does a task of a
// behavior with it sent by a client whose registry lacks the behavior;
// nothing is stored, nothing changes. The client that holds the behavior
// reopens that task, in its caller's transaction once it commits.
func TestSignalReopensOnlyWhatItsPolicyAllows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	plain := finishedCollect(t, e, srv)
	wf, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-reopen", Nodes: []api.WorkflowNode{
		{Name: "r", Task: api.SubmitRequest{Behavior: reopenKind.ID, Params: json.RawMessage(`{"topic":"again"}`)}},
	}})
	require.NoError(t, err)
	_, err = srv.Await(e.ctx, wf.ID)
	require.NoError(t, err)
	node := wf.ID + "/r"
	reopenable := e.finishedReopen(srv, reopenParams{Topic: "again"}).ID
	child := e.finishedReopen(srv, reopenParams{Topic: "again"}).ID
	e.stop(srv)
	// A child's end was counted off its parent (here any other task).
	_, err = e.pool.Exec(e.ctx, `UPDATE stint_task SET parent_id = $2 WHERE id = $1`, string(child), string(plain))
	require.NoError(t, err)
	bare, err := impl.NewClient(e.st, impl.ClientConfig{Registry: spi.NewRegistry()})
	require.NoError(t, err)
	t.Cleanup(bare.Close)

	ids := []api.TaskID{plain, node, wf.ID, reopenable, child}
	before := map[api.TaskID]api.Task{}
	for _, id := range ids {
		task, err := c.Get(e.ctx, id)
		require.NoError(t, err)
		require.True(t, task.Finished(), "%s is %s", id, task.Status)
		before[id] = task
	}
	for _, tc := range []struct {
		name string
		c    api.Signals
		id   api.TaskID
	}{
		{"a behavior without the policy", c, plain},
		{"a workflow's node", c, node},
		{"a workflow's own task", c, wf.ID},
		{"a child task", c, child},
		{"a client without the behavior", bare, reopenable},
	} {
		require.ErrorIs(t, tc.c.Signal(e.ctx, tc.id, "again", 1), api.ErrConflict, tc.name)
		require.ErrorIs(t, tc.c.SignalMany(e.ctx, []api.SignalRequest{{ID: tc.id, Topic: "again"}}), api.ErrConflict, tc.name)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM stint_signal`), "nothing was stored")
	for _, id := range ids {
		task, err := c.Get(e.ctx, id)
		require.NoError(t, err)
		require.Equal(t, before[id], task, "task %s changed", id)
	}

	// In the caller's transaction: reopened if and only if it commits.
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	require.NoError(t, c.SignalTx(e.ctx, tx, reopenable, "again", 1))
	require.NoError(t, tx.Rollback(e.ctx))
	task, err := c.Get(e.ctx, reopenable)
	require.NoError(t, err)
	require.Equal(t, before[reopenable], task)
	require.NoError(t, pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		return c.SignalTx(e.ctx, tx, reopenable, "again", 1)
	}))
	task, err = c.Get(e.ctx, reopenable)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status)
	require.Len(t, task.Signals, 1)
}

// TestSignalManyReopens: SignalMany stores a message for a finished task
// that reopens with the others of the call, and reopens it; a call that
// holds a finished task that does not reopen refuses every request,
// stores nothing and reopens nothing.
func TestSignalManyReopens(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	plain := finishedCollect(t, e, srv)
	reopenable, err := c.Get(e.ctx, e.finishedReopen(srv, reopenParams{Topic: "again"}).ID)
	require.NoError(t, err)
	e.stop(srv)
	open, err := api.Submit(e.ctx, c, collectKind, collectParams{Topic: "x", N: 1}) // that no server runs
	require.NoError(t, err)

	err = c.SignalMany(e.ctx, []api.SignalRequest{
		{ID: open.ID(), Topic: "x", Payload: 1}, {ID: reopenable.ID, Topic: "again", Payload: 2}, {ID: plain, Topic: "x", Payload: 3},
	})
	require.ErrorIs(t, err, api.ErrConflict)
	require.ErrorContains(t, err, "request 2")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_signal`), "a refused call stores nothing")
	got, err := c.Get(e.ctx, reopenable.ID)
	require.NoError(t, err)
	require.Equal(t, reopenable, got, "a refused call reopens nothing")

	require.NoError(t, c.SignalMany(e.ctx, []api.SignalRequest{
		{ID: open.ID(), Topic: "x", Payload: 1}, {ID: reopenable.ID, Topic: "again", Payload: 2},
	}))
	got, err = c.Get(e.ctx, open.ID())
	require.NoError(t, err)
	require.Len(t, got.Signals, 1)
	got, err = c.Get(e.ctx, reopenable.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, got.Status)
	require.Len(t, got.Signals, 1)
	require.JSONEq(t, `2`, string(got.Signals[0].Payload))
}

// TestSignalKeyReopensOnce: a signal sent twice, at once, under one key
// to a finished task that reopens stores one message and reopens the task
// once; sent again once the task finished again, it stores nothing and
// reopens nothing.
func TestSignalKeyReopensOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	c := e.client()
	id := e.finishedReopen(srv, reopenParams{Topic: "again"}).ID
	e.stop(srv)

	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { errs <- c.Signal(e.ctx, id, "again", "once", api.SignalKey("k")) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	got, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, got.Status)
	require.Len(t, got.Signals, 1)

	e.server("n2", 5*time.Second)
	require.Equal(t, `["once"]`, string(e.awaitRerun(c, id).Result))
	done, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	require.NoError(t, c.Signal(e.ctx, id, "again", "once", api.SignalKey("k")))
	got, err = c.Get(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, done, got, "a key seen reopens nothing")
	statuses, _ := e.statuses(id)
	require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess,
		api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, statuses)
}
