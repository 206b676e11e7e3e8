package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// The finish of a failed run records it, with its node, times and error,
// in the finish's statement; a success records nothing; deleting the task
// (remove, cleanup) deletes its records.
func TestFailedRunsAreRecorded(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "flaky"}, store.NewTask{ID: "doomed"})
	fail := func(c store.Claimed, msg string, again bool) store.Completion {
		return store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusFailure, Error: &api.TaskError{Code: "flaky", Message: msg, Retryable: again}, Again: again}
	}
	cl := claimT(t, ctx, st, 2, 0)
	require.Len(t, cl, 2)
	_, err := st.Finish(ctx, []store.Completion{fail(cl[0], "first", true), fail(cl[1], "first", true)})
	require.NoError(t, err)
	cl = claimT(t, ctx, st, 2, 0)
	require.Len(t, cl, 2)
	byID := map[api.TaskID]store.Claimed{cl[0].ID: cl[0], cl[1].ID: cl[1]}
	_, err = st.Finish(ctx, []store.Completion{fail(byID["flaky"], "second", true), fail(byID["doomed"], "for good", false)})
	require.NoError(t, err)
	cl = claimT(t, ctx, st, 2, 0)
	require.Len(t, cl, 1)
	_, err = st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)

	flaky, err := st.Attempts(ctx, "flaky")
	require.NoError(t, err)
	require.Len(t, flaky, 2, "two failed runs; the success is the task itself")
	task, err := st.Get(ctx, "flaky")
	require.NoError(t, err)
	for i, a := range flaky {
		require.Equal(t, i+1, a.Attempt)
		require.Equal(t, "n1", a.Node)
		require.NotNil(t, a.StartedAt)
		require.False(t, a.EndedAt.Before(*a.StartedAt))
		require.True(t, a.EndedAt.Before(*task.ExecutedAt) || a.EndedAt.Equal(*task.ExecutedAt), "before the last run began")
		require.Equal(t, []string{"first", "second"}[i], a.Error.Message)
		require.True(t, a.Error.Retryable)
	}
	doomed, err := st.Attempts(ctx, "doomed")
	require.NoError(t, err)
	require.Len(t, doomed, 2)
	require.Equal(t, "for good", doomed[1].Error.Message)
	task, err = st.Get(ctx, "doomed")
	require.NoError(t, err)
	require.True(t, doomed[1].EndedAt.Equal(*task.FinishedAt), "its last run is the task's end")

	_, err = st.Remove(ctx, "flaky")
	require.NoError(t, err)
	flaky, err = st.Attempts(ctx, "flaky")
	require.NoError(t, err)
	require.Empty(t, flaky, "removed with its task")
	n, err := st.DeleteFinished(ctx, store.DeleteFinishedParams{Behavior: semBehavior, Status: api.StatusFailure, OlderThan: -time.Hour, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	doomed, err = st.Attempts(ctx, "doomed")
	require.NoError(t, err)
	require.Empty(t, doomed, "deleted with its task by the cleanup")
	none, err := st.Attempts(ctx, "no-such-task")
	require.NoError(t, err)
	require.Empty(t, none)
}
