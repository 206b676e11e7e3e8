package impl_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// A submit of an existing id follows couch_jobs' add (DESIGN.md, "The task").
func TestSubmitExistingID(t *testing.T) {
	t.Parallel()

	t.Run("scheduled keeps params and takes the new due time", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		c := e.client()
		req := workReq(workKind, WorkParams{Key: "s", SleepMS: 1})
		req.Delay = time.Hour
		first, err := c.Submit(e.ctx, req)
		require.NoError(t, err)
		require.True(t, first.Created)

		req2 := workReq(workKind, WorkParams{Key: "s", SleepMS: 2})
		again, err := c.Submit(e.ctx, req2)
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, api.StatusScheduled, again.Status)
		task, err := c.Get(e.ctx, first.ID)
		require.NoError(t, err)
		require.JSONEq(t, `{"key":"s","sleep_ms":1}`, string(task.Params), "persisted params are kept")
		require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE schedule_not_before <= now() + interval '1 minute'`), "the due time moved to now")
	})

	t.Run("running sets the resubmit flag, keeps params, runs again", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		srv := e.server("node", 5*time.Second)
		// The run waits at the gate until the second submit is checked: a
		// run that slept for a while instead was over, on a busy machine,
		// before the second submit came.
		gt := newGate(t)
		sub, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "r", Gate: gt}))
		require.NoError(t, err)
		waitFor(t, 10*time.Second, "the run to start", func() bool { return e.count(`SELECT count(*) FROM test_run`) == 1 })
		again, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "r", SleepMS: 1}))
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, api.StatusRunning, again.Status)
		task, err := srv.Get(e.ctx, sub.ID)
		require.NoError(t, err)
		require.True(t, task.Resubmit)
		require.JSONEq(t, `{"key":"r","gate":"`+gt+`"}`, string(task.Params), "a running task's params are kept")

		openGate(gt)
		task, err = srv.Await(e.ctx, sub.ID)
		require.NoError(t, err)
		require.Equal(t, api.StatusSuccess, task.Status)
		require.False(t, task.Resubmit)
		require.Equal(t, 2, e.count(`SELECT count(*) FROM test_run`), "the resubmitted task ran again")
	})

	t.Run("finished is scheduled again with the new params", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		srv := e.server("node", 5*time.Second)
		f, _ := e.run(srv, WorkParams{Key: "f"})
		f2, err := api.Submit(e.ctx, srv, workKind, WorkParams{Key: "f", SleepMS: 5})
		require.NoError(t, err)
		require.Equal(t, f.ID(), f2.ID())
		require.False(t, f2.Submission().Created)
		require.Equal(t, api.StatusScheduled, f2.Submission().Status)
		res, err := f2.Await(e.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, res.Attempt, "attempts restart with the new submission")
		task, err := srv.Get(e.ctx, f.ID())
		require.NoError(t, err)
		require.JSONEq(t, `{"key":"f","sleep_ms":5}`, string(task.Params))
		require.Equal(t, 2, e.count(`SELECT count(*) FROM test_run`))
	})

	t.Run("shared dedup returns the existing result", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		srv := e.server("node", 5*time.Second)
		f, err := api.Submit(e.ctx, srv, shareKind, WorkParams{Key: "once"})
		require.NoError(t, err)
		first, err := f.Await(e.ctx)
		require.NoError(t, err)
		f2, err := api.Submit(e.ctx, srv, shareKind, WorkParams{Key: "once"})
		require.NoError(t, err)
		require.False(t, f2.Submission().Created)
		require.Equal(t, api.StatusSuccess, f2.Submission().Status)
		second, err := f2.Await(e.ctx)
		require.NoError(t, err)
		require.Equal(t, first, second)
		require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run`))
	})
}

// MergeParams are the params of test.merge.
type MergeParams struct {
	Key   string   `json:"key" validate:"required"`
	Items []string `json:"items"`
}

type merge struct{}

var mergeKind = api.Kind[MergeParams, []string]{ID: "test.merge"}

func (merge) Kind() api.Kind[MergeParams, []string]        { return mergeKind }
func (merge) TaskID(ids spi.IDs, p MergeParams) api.TaskID { return ids.Deterministic(p.Key) }
func (merge) Combine(persisted, submitted MergeParams) MergeParams {
	for _, it := range submitted.Items {
		if !slices.Contains(persisted.Items, it) {
			persisted.Items = append(persisted.Items, it)
		}
	}
	return persisted
}
func (merge) Run(_ context.Context, _ spi.RunContext, p MergeParams) ([]string, error) {
	return p.Items, nil
}

// mergeClient returns a client on e's store whose registry, also
// returned, holds test.merge alone.
func (e *env) mergeClient() (*impl.Client, *spi.Registry) {
	e.t.Helper()
	reg := spi.NewRegistry()
	spi.MustRegister[MergeParams, []string](reg, merge{})
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(e.t, err)
	e.t.Cleanup(c.Close)
	return c, reg
}

func TestCombineMergesParamsOfScheduledTask(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, reg := e.mergeClient()

	var id api.TaskID
	for _, items := range [][]string{{"a", "b"}, {"b", "c"}, {"d"}} {
		f, err := api.Submit(e.ctx, c, mergeKind, MergeParams{Key: "m", Items: items}, api.WithDelay(time.Hour))
		require.NoError(t, err)
		id = f.ID()
	}
	task, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	var p MergeParams
	require.NoError(t, json.Unmarshal(task.Params, &p))
	require.Equal(t, []string{"a", "b", "c", "d"}, p.Items)

	srv, err := impl.NewServer(e.st, impl.ServerConfig{Registry: reg, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	// Make it due now, then run it.
	_, err = c.Submit(e.ctx, api.SubmitRequest{Behavior: mergeKind.ID, Params: []byte(`{"key":"m","items":["e"]}`)})
	require.NoError(t, err)
	require.NoError(t, srv.Start(e.ctx))
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	res, err := api.NewFuture(c, mergeKind, id).Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c", "d", "e"}, res)
}

func TestAwaitUnknownTask(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	_, err := c.Await(e.ctx, "no-such-task")
	require.ErrorIs(t, err, api.ErrNotFound)
	_, err = c.Get(e.ctx, "bad id!")
	require.ErrorIs(t, err, api.ErrInvalid)
}

func TestListPagesWithFilters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	var reqs []api.SubmitRequest
	for i := range 25 {
		req := workReq(workKind, WorkParams{Key: string(rune('a' + i))})
		if i%5 == 0 {
			req.GroupKey = "five"
		}
		reqs = append(reqs, req)
	}
	_, err := c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)

	var all []api.Task
	f := api.Filter{Behavior: workKind.ID, Limit: 10}
	for {
		page, err := c.List(e.ctx, f)
		require.NoError(t, err)
		all = append(all, page.Tasks...)
		if page.Next == "" {
			break
		}
		f.After = page.Next
	}
	require.Len(t, all, 25)
	require.True(t, slices.IsSortedFunc(all, func(a, b api.Task) int { return compare(a.ID, b.ID) }))

	page, err := c.List(e.ctx, api.Filter{GroupKey: "five"})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 5)
	page, err = c.List(e.ctx, api.Filter{GroupKey: "x' OR '1'='1"})
	require.NoError(t, err)
	require.Empty(t, page.Tasks)
	_, err = c.List(e.ctx, api.Filter{Status: "bogus"})
	require.ErrorIs(t, err, api.ErrInvalid)
}

func compare(a, b api.TaskID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestTaskAFinishMakesDueWakesTheClaimers checks that a task that a
// completion makes due at once, here resubmitted while it ran, runs again
// at once: the finish wakes the claimers, whose poll comes once an hour.
func TestTaskAFinishMakesDueWakesTheClaimers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second, func(c *impl.ServerConfig) { c.PollInterval = time.Hour })
	sub, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "r", SleepMS: 3000}))
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the run to start", func() bool { return e.count(`SELECT count(*) FROM test_run`) == 1 })
	again, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "r", SleepMS: 3000}))
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, again.Status, "the resubmit found the task running")
	waitFor(t, 30*time.Second, "the second run", func() bool { return e.count(`SELECT count(*) FROM test_run`) == 2 })
	task, err := srv.Await(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status)
}
