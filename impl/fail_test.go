package impl_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// TestFailByHandEndsWaitingTasks fails a scheduled and a held task by
// hand: each ends failed for good with an error that says so, its
// awaiter and subscriber see the end, and Retry runs it again.
func TestFailByHandEndsWaitingTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	later, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"later"}`), Delay: time.Hour})
	require.NoError(t, err)
	held, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"held"}`), Delay: time.Hour})
	require.NoError(t, err)
	require.NoError(t, c.Hold(e.ctx, held.ID))

	events, err := c.Subscribe(e.ctx, api.Filter{ID: later.ID})
	require.NoError(t, err)
	first := <-events
	require.Equal(t, api.StatusScheduled, first.Status)
	awaited := make(chan error, 1)
	go func() {
		_, err := api.NewFuture(c, workKind, later.ID).Await(e.ctx)
		awaited <- err
	}()

	for _, id := range []api.TaskID{later.ID, held.ID} {
		require.NoError(t, c.Fail(e.ctx, id, "  the input is known bad  "))
		task, err := c.Get(e.ctx, id)
		require.NoError(t, err)
		require.Equal(t, api.StatusFailure, task.Status)
		require.True(t, task.Finished(), "failed for good, not retrying")
		require.Equal(t, &api.TaskError{Code: api.FailedByHand, Message: "failed by hand: the input is known bad"}, task.Error)
		require.NotNil(t, task.FinishedAt)
	}

	ev, ok := <-events
	require.True(t, ok)
	require.Equal(t, api.Event{TaskID: later.ID, Behavior: workKind.ID, Status: api.StatusFailure, Final: true}, api.Event{TaskID: ev.TaskID, Behavior: ev.Behavior, Status: ev.Status, Final: ev.Final})
	_, ok = <-events
	require.False(t, ok, "the subscription ends at the final event")
	var te *api.TaskError
	require.ErrorAs(t, <-awaited, &te)
	require.Equal(t, api.FailedByHand, te.Code)

	// A task failed by hand is not claimed; Retry runs it again.
	e.server("node", 5*time.Second)
	require.NoError(t, c.Retry(e.ctx, held.ID))
	task, err := c.Await(e.ctx, held.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status)
	require.Zero(t, e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(later.ID)), "the failed task never ran")
}

// TestFailByHandRefusesWhatItMustNotChange checks each refusal: a running
// task (its run owns its outcome), a task that finished for good, a
// missing task, a bad id and a bad reason. None changes the task.
func TestFailByHandRefusesWhatItMustNotChange(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	e.server("node", 5*time.Second)
	running, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "running", BlockFirst: true}))
	require.NoError(t, err)
	waitFor(t, time.Minute, "the task to run", func() bool {
		return e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(running.ID)) > 0
	})
	done, _ := e.run(c, WorkParams{Key: "done"})
	waiting, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"waiting"}`), Delay: time.Hour})
	require.NoError(t, err)

	err = c.Fail(e.ctx, running.ID, "stuck")
	require.ErrorIs(t, err, api.ErrConflict)
	require.Contains(t, err.Error(), "it is running")
	err = c.Fail(e.ctx, done.ID(), "too late")
	require.ErrorIs(t, err, api.ErrConflict)
	require.Contains(t, err.Error(), "finished for good")
	require.ErrorIs(t, c.Fail(e.ctx, "no-such-task", "gone"), api.ErrNotFound)

	for _, tc := range []struct {
		name   string
		id     api.TaskID
		reason string
	}{
		{"bad id", "x", "reason"},
		{"no reason", waiting.ID, ""},
		{"blank reason", waiting.ID, " \t "},
		{"control character", waiting.ID, "line\nbreak"},
		{"invalid UTF-8", waiting.ID, "\xff"},
		{"too long", waiting.ID, strings.Repeat("x", 1001)},
	} {
		err := c.Fail(e.ctx, tc.id, tc.reason)
		require.ErrorIs(t, err, api.ErrInvalid, tc.name)
	}
	for id, want := range map[api.TaskID]api.Status{running.ID: api.StatusRunning, done.ID(): api.StatusSuccess, waiting.ID: api.StatusScheduled} {
		task, err := c.Get(e.ctx, id)
		require.NoError(t, err)
		require.Equal(t, want, task.Status, "the refusals changed nothing")
		if id != running.ID {
			require.Nil(t, task.Error)
		}
	}
	require.NoError(t, c.Remove(e.ctx, running.ID))
}

// TestFailByHandEndsAChildForItsParent fails the last pending child of a
// parent that waits for its children: the parent is due at once, as after
// any child's end.
func TestFailByHandEndsAChildForItsParent(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	parent, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: parentKind.ID, Params: []byte(`{"key":"p","children":1}`)})
	require.NoError(t, err)
	claimed, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: "x", Limit: 1, Behaviors: []store.BehaviorLease{{Behavior: parentKind.ID, Lease: time.Minute}}})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	ref := claimed[0].LeaseRef
	_, err = e.st.Spawn(e.ctx, ref, []store.NewTask{{ID: "child-1", Behavior: workKind.ID, Params: []byte(`{"key":"c"}`), Delay: time.Hour}})
	require.NoError(t, err)
	ok, err := e.st.Finish(e.ctx, []store.Completion{{LeaseRef: ref, Status: api.StatusScheduled, WaitChildren: true, Delay: time.Hour}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE id = $1 AND waiting_children AND children_pending = 1
		AND schedule_not_before > now() + interval '30 minutes'`, string(parent.ID)), "the parent waits for its child")

	require.NoError(t, c.Fail(e.ctx, "child-1", "not needed"))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE id = $1 AND NOT waiting_children AND children_pending = 0
		AND status = 'scheduled' AND schedule_not_before <= now()`, string(parent.ID)), "the parent is due at once")
	err = c.Fail(e.ctx, "child-1", "again")
	require.ErrorIs(t, err, api.ErrConflict, "a second fail is refused")
	require.Zero(t, e.count(`SELECT children_pending FROM stint_task WHERE id = $1`, string(parent.ID)))
	require.False(t, errors.Is(err, api.ErrNotFound))
}
