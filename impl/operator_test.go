package impl_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// TestSetProgressIsACompareAndSetOnWaitingTasks changes the progress of a
// held task from a client-only process, and checks each way it refuses.
func TestSetProgressIsACompareAndSetOnWaitingTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	sub, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: workKind.ID, Params: json.RawMessage(`{"key":"p"}`), Delay: time.Hour})
	require.NoError(t, err)
	id := sub.ID
	require.NoError(t, c.Hold(e.ctx, id))

	one := json.RawMessage(`{"stage":1}`)
	require.NoError(t, c.SetProgress(e.ctx, id, nil, one, api.StatusHeld))
	task, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	require.JSONEq(t, `{"stage":1}`, string(task.Progress))

	cases := []struct {
		name     string
		id       api.TaskID
		old      json.RawMessage
		progress json.RawMessage
		statuses []api.Status
		want     error
	}{
		{"old progress differs", id, json.RawMessage(`{"stage":0}`), json.RawMessage(`{"stage":2}`), []api.Status{api.StatusHeld}, api.ErrConflict},
		{"old progress was none", id, nil, json.RawMessage(`{"stage":2}`), []api.Status{api.StatusHeld}, api.ErrConflict},
		{"status not allowed", id, one, json.RawMessage(`{"stage":2}`), []api.Status{api.StatusScheduled}, api.ErrConflict},
		{"no such task", "no-such-task", nil, json.RawMessage(`{}`), []api.Status{api.StatusHeld}, api.ErrNotFound},
		{"bad id", "x", nil, json.RawMessage(`{}`), []api.Status{api.StatusHeld}, api.ErrInvalid},
		{"bad JSON", id, one, json.RawMessage(`{"stage":`), []api.Status{api.StatusHeld}, api.ErrInvalid},
		{"no status", id, one, json.RawMessage(`{}`), nil, api.ErrInvalid},
	}
	for _, tc := range cases {
		err := c.SetProgress(e.ctx, tc.id, tc.old, tc.progress, tc.statuses...)
		require.ErrorIs(t, err, tc.want, tc.name)
	}
	task, err = c.Get(e.ctx, id)
	require.NoError(t, err)
	require.JSONEq(t, `{"stage":1}`, string(task.Progress), "refused changes changed nothing")
	require.Equal(t, api.StatusHeld, task.Status)
}

// TestSetProgressLeavesARunningTaskAlone checks that a run's progress is
// the run's own: SetProgress on a running task is a conflict.
func TestSetProgressLeavesARunningTaskAlone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", time.Minute)
	f, err := api.Submit(e.ctx, srv, workKind, WorkParams{Key: "running", BlockFirst: true})
	require.NoError(t, err)
	waitFor(t, time.Minute, "the task to run", func() bool {
		task, err := srv.Get(e.ctx, f.ID())
		return err == nil && task.Status == api.StatusRunning
	})
	err = srv.SetProgress(e.ctx, f.ID(), nil, json.RawMessage(`{"forged":true}`), api.StatusRunning, api.StatusScheduled)
	require.ErrorIs(t, err, api.ErrConflict)
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Empty(t, task.Progress)
}
