package impl_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// dueNow makes every scheduled task and claim hint due now, as if their
// windows had passed.
func (e *env) dueNow() {
	e.t.Helper()
	// One transaction: the hints' due time must be the tasks' to the
	// microsecond.
	require.NoError(e.t, pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(e.ctx, `UPDATE stint_task SET schedule_not_before = now() WHERE status = 'scheduled'`); err != nil {
			return err
		}
		_, err := tx.Exec(e.ctx, `UPDATE stint_due SET due = now()`)
		return err
	}))
}

// A stream of debounced submits stores one task, due a window after the
// last submit, which runs once with the last submit's params.
func TestDebouncedSubmitsRunOnceWithTheLastParams(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	var f *api.Future[WorkResult]
	for i := range 5 {
		var err error
		f, err = api.Submit(e.ctx, srv, workKind, WorkParams{Key: "deb", SleepMS: i + 1}, api.WithDebounce(time.Hour, 2*time.Hour))
		require.NoError(t, err)
		require.Equal(t, i == 0, f.Submission().Created)
		require.Equal(t, api.StatusScheduled, f.Submission().Status)
	}
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE schedule_not_before BETWEEN now() + interval '59 minutes' AND now() + interval '1 hour'`))
	require.Zero(t, e.count(`SELECT count(*) FROM test_run`))

	e.dueNow()
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Attempt)
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.JSONEq(t, `{"key":"deb","sleep_ms":5}`, string(task.Params))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run`))
}

// Debounced submits of a behavior that combines merge their params;
// SubmitMany and SubmitTx debounce as Submit does.
func TestDebouncedSubmitsCombine(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, _ := e.mergeClient()
	debounce := &api.Debounce{Window: time.Hour, MaxWait: 2 * time.Hour}
	req := func(items ...string) api.SubmitRequest {
		raw, err := json.Marshal(MergeParams{Key: "m", Items: items})
		require.NoError(t, err)
		return api.SubmitRequest{Behavior: mergeKind.ID, Params: raw, Debounce: debounce}
	}
	_, err := c.Submit(e.ctx, req("a", "b"))
	require.NoError(t, err)
	subs, err := c.SubmitMany(e.ctx, []api.SubmitRequest{req("b", "c"), {Behavior: mergeKind.ID, Params: []byte(`{"key":"other"}`)}})
	require.NoError(t, err)
	require.False(t, subs[0].Created)
	require.True(t, subs[1].Created)
	require.NoError(t, pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		_, err := c.SubmitTx(e.ctx, tx, req("d"))
		return err
	}))
	task, err := c.Get(e.ctx, subs[0].ID)
	require.NoError(t, err)
	require.JSONEq(t, `{"key":"m","items":["a","b","c","d"]}`, string(task.Params))
	require.WithinDuration(t, time.Now().Add(time.Hour), *task.ScheduleNotBefore, time.Minute)
}

// Bad debounced submits are refused, naming the field, and store nothing:
// a SubmitMany with one of them stores none of its tasks.
func TestDebouncedSubmitRefusesBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	work := workReq(workKind, WorkParams{Key: "k"})
	with := func(req api.SubmitRequest, window, maxWait time.Duration) api.SubmitRequest {
		req.Debounce = &api.Debounce{Window: window, MaxWait: maxWait}
		return req
	}
	delayed := with(work, time.Second, time.Minute)
	delayed.Delay = time.Second
	echo := api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"hi"}`)}
	for _, tc := range []struct {
		name, field, reason string
		req                 api.SubmitRequest
	}{
		{"no window", "debounce.window", "0s is under 1ms", with(work, 0, time.Minute)},
		{"a window under a millisecond", "debounce.window", "500µs is under 1ms", with(work, 500*time.Microsecond, time.Minute)},
		{"a maximum wait under the window", "debounce.max_wait", "under the window", with(work, time.Minute, time.Second)},
		{"no maximum wait", "debounce.max_wait", "under the window", with(work, time.Minute, 0)},
		{"a maximum wait over the limit", "debounce.max_wait", "over the limit", with(work, time.Minute, api.MaxDebounceWait+time.Second)},
		{"a delay too", "delay", "give a delay or a debounce, not both", delayed},
		{"a behavior that shares its tasks", "debounce", "shares its tasks", with(workReq(shareKind, WorkParams{Key: "k"}), time.Second, time.Minute)},
		{"a behavior of new ids", "debounce", "gives every task a new id", with(echo, time.Second, time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, submit := range []func() error{
				func() error { _, err := c.Submit(e.ctx, tc.req); return err },
				func() error {
					_, err := c.SubmitMany(e.ctx, []api.SubmitRequest{workReq(workKind, WorkParams{Key: "ok"}), tc.req})
					return err
				},
			} {
				err := submit()
				require.ErrorIs(t, err, api.ErrInvalid)
				var ie *api.InvalidError
				require.ErrorAs(t, err, &ie)
				require.Equal(t, tc.field, ie.Field)
				require.Contains(t, ie.Reason, tc.reason)
			}
		})
	}
	// A debounced submit with an explicit id of a behavior of new ids is
	// taken.
	echo.ID = "greeting"
	_, err := c.Submit(e.ctx, with(echo, time.Second, time.Minute))
	require.NoError(t, err)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task`))

	// A workflow's node is not debounced.
	node := api.WorkflowNode{Name: "a", Task: with(workReq(workKind, WorkParams{Key: "n"}), time.Second, time.Minute)}
	_, err = c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-debounce", Nodes: []api.WorkflowNode{node}})
	require.ErrorIs(t, err, api.ErrInvalid)
	require.ErrorContains(t, err, "nodes[0].task.debounce")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task`))
}
