package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// Every record adds its counts to the bucket's row; only the first sample
// of a sampling slot is taken, and taking one trims points past the
// retention.
func TestHistoryAddsCountsAndSamplesOncePerSlot(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "due-a"}, store.NewTask{ID: "due-b"}, store.NewTask{ID: "due-c"})
	_, err := st.Pool().Exec(ctx, `INSERT INTO stint_history (bucket, behavior, succeeded) VALUES (now() - interval '25 hours', $1, 7)`, semBehavior)
	require.NoError(t, err)

	rec := store.HistoryRecord{
		Counts:    []store.HistoryCount{{Behavior: semBehavior, Succeeded: 2, Failed: 1, Retried: 1}},
		Sample:    true,
		Behaviors: []api.BehaviorID{semBehavior, "sem.idle"},
	}
	sampled, err := st.RecordHistory(ctx, rec)
	require.NoError(t, err)
	// The slot may have turned between the two records: then the second
	// one takes the new slot's sample.
	again, err := st.RecordHistory(ctx, rec)
	require.NoError(t, err)
	require.True(t, sampled)

	h, err := st.History(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, api.HistoryBucket, h.Bucket)
	var work, idle api.HistoryPoint
	var buckets int
	for _, p := range h.Points {
		require.False(t, p.At.Before(h.From), "a point before the window")
		require.Equal(t, p.At, p.At.Truncate(api.HistoryBucket), "a point at a bucket's start")
		switch p.Behavior {
		case semBehavior:
			work.Succeeded, work.Failed, work.Retried = work.Succeeded+p.Succeeded, work.Failed+p.Failed, work.Retried+p.Retried
			if p.Sampled {
				work.Due, work.Sampled = p.Due, true
			}
			buckets++
		case "sem.idle":
			idle = p
		}
	}
	require.Equal(t, []int64{4, 2, 2}, []int64{work.Succeeded, work.Failed, work.Retried}, "both records' counts")
	require.True(t, work.Sampled)
	require.Equal(t, int64(3), work.Due, "the three due tasks")
	require.True(t, idle.Sampled, "a behavior with nothing due is sampled as zero")
	require.Zero(t, idle.Due)
	var slots int
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_history_sample`).Scan(&slots))
	if slots == 1 {
		require.False(t, again, "one sample per slot")
	}
	require.LessOrEqual(t, buckets, 2)

	var old int
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_history WHERE bucket < now() - interval '24 hours'`).Scan(&old))
	require.Zero(t, old, "the point past the retention was trimmed")

	for _, w := range []time.Duration{0, -time.Minute, api.HistoryRetention + time.Minute} {
		_, err := st.History(ctx, w)
		require.ErrorIs(t, err, api.ErrInvalid, "window %s", w)
	}
}

// A bucket keeps the largest backlog of its samples: a backlog that came
// and went between two samples of a minute still shows in its point.
func TestHistoryKeepsTheLargestSampleOfABucket(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	rec := store.HistoryRecord{Sample: true, Behaviors: []api.BehaviorID{semBehavior}}
	// sample takes a sample whatever slot it is: the slots sampled before
	// are forgotten, as when the next slot begins.
	sample := func() {
		t.Helper()
		_, err := st.Pool().Exec(ctx, `DELETE FROM stint_history_sample`)
		require.NoError(t, err)
		sampled, err := st.RecordHistory(ctx, rec)
		require.NoError(t, err)
		require.True(t, sampled)
	}
	var ids []api.TaskID
	for i := range 5 {
		ids = append(ids, api.TaskID(fmt.Sprintf("peak-%d", i)))
		submitT(t, ctx, st, store.NewTask{ID: ids[i]})
	}
	sample()
	// Four are claimed: a claim deletes their hints.
	_, err := st.Pool().Exec(ctx, `DELETE FROM stint_due WHERE id = ANY($1)`, ids[1:])
	require.NoError(t, err)
	sample()

	h, err := st.History(ctx, time.Hour)
	require.NoError(t, err)
	var dues []int64
	for _, p := range h.Points {
		if p.Behavior == semBehavior && p.Sampled {
			dues = append(dues, p.Due)
		}
	}
	if len(dues) == 2 {
		require.Equal(t, []int64{5, 1}, dues, "the minute turned between the samples: each has its own")
		return
	}
	require.Equal(t, []int64{5}, dues, "5 due, then 1: the minute's point keeps 5")
}

// A task failed by hand counts in the history's bucket as a failure that
// is not retried; a task that cannot be failed adds nothing.
func TestHistoryCountsTasksFailedByHand(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "fail-a"}, store.NewTask{ID: "fail-b"})
	for _, id := range []api.TaskID{"fail-a", "fail-b"} {
		require.NoError(t, st.Fail(ctx, id, &api.TaskError{Code: api.FailedByHand, Message: "failed by hand: test"}))
	}
	require.ErrorIs(t, st.Fail(ctx, "fail-a", &api.TaskError{Code: api.FailedByHand, Message: "again"}), api.ErrConflict)
	h, err := st.History(ctx, time.Hour)
	require.NoError(t, err)
	var failed, retried, succeeded int64
	for _, p := range h.Points {
		if p.Behavior == semBehavior {
			failed, retried, succeeded = failed+p.Failed, retried+p.Retried, succeeded+p.Succeeded
		}
	}
	require.Equal(t, []int64{2, 0, 0}, []int64{failed, retried, succeeded})
}
