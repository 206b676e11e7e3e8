package postgres_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// The tests of debounced submits move time forward by moving the stored
// times of the tasks and their claim hints back (elapse): a window of an
// hour passes at once, and the due times the database computes are read
// against its own clock.

// debounced returns a debounced task of semBehavior.
func debounced(id api.TaskID, params string, window, maxWait time.Duration) store.NewTask {
	return store.NewTask{ID: id, Behavior: semBehavior, Priority: 5, Params: json.RawMessage(params),
		Delay: window, Debounce: &api.Debounce{Window: window, MaxWait: maxWait}}
}

// submitDebounced stores t as a debounced submit does, combining its
// params with combine when not nil.
func submitDebounced(t *testing.T, ctx context.Context, st *postgres.Store, nt store.NewTask, combine func(json.RawMessage) (json.RawMessage, error)) api.Submission {
	t.Helper()
	sub, err := st.SubmitCombined(ctx, nt, combine)
	require.NoError(t, err)
	return sub
}

// elapse makes d pass for the stored tasks: their times and claim hints
// move d into the past.
func elapse(t *testing.T, ctx context.Context, st *postgres.Store, d time.Duration) {
	t.Helper()
	_, err := st.Pool().Exec(ctx, `
		UPDATE stint_task SET schedule_not_before = schedule_not_before - $1::interval, resubmit_due = resubmit_due - $1::interval,
			executed_at = executed_at - $1::interval, finished_at = finished_at - $1::interval,
			debounce_since = debounce_since - $1::interval, debounce_deadline = debounce_deadline - $1::interval`, d.String())
	require.NoError(t, err)
	_, err = st.Pool().Exec(ctx, `UPDATE stint_due SET due = due - $1::interval`, d.String())
	require.NoError(t, err)
}

// dueIn returns how long from the database's now task id is due (its run
// again's due time while it runs), rounded to the second.
func dueIn(t *testing.T, ctx context.Context, st *postgres.Store, id api.TaskID) time.Duration {
	t.Helper()
	var us int64
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT (extract(epoch FROM coalesce(resubmit_due, schedule_not_before) - now()) * 1e6)::bigint
		FROM stint_task WHERE id = $1`, string(id)).Scan(&us))
	return (time.Duration(us) * time.Microsecond).Round(time.Second)
}

// paramsOf returns the stored params of task id.
func paramsOf(t *testing.T, ctx context.Context, st *postgres.Store, id api.TaskID) string {
	t.Helper()
	got, err := st.Get(ctx, id)
	require.NoError(t, err)
	return string(got.Params)
}

// A debounced submit stores a task due in its window; another of the same
// id pushes its due time to a window after it, and its params win.
func TestDebounceWindowPushesDueTimeAndLastParamsWin(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	sub := submitDebounced(t, ctx, st, debounced("deb", `{"v":1}`, time.Hour, 3*time.Hour), nil)
	require.True(t, sub.Created)
	require.Equal(t, api.StatusScheduled, sub.Status)
	require.Equal(t, time.Hour, dueIn(t, ctx, st, "deb"))

	elapse(t, ctx, st, 30*time.Minute)
	require.Equal(t, 30*time.Minute, dueIn(t, ctx, st, "deb"))
	sub = submitDebounced(t, ctx, st, debounced("deb", `{"v":2}`, time.Hour, 3*time.Hour), nil)
	require.False(t, sub.Created)
	require.Equal(t, time.Hour, dueIn(t, ctx, st, "deb"), "the window counts from the last submit")
	require.JSONEq(t, `{"v":2}`, paramsOf(t, ctx, st, "deb"))
	require.Empty(t, claimT(t, ctx, st, 10, 0))

	// A plain submit leaves the params of a scheduled task as they are.
	submitT(t, ctx, st, store.NewTask{ID: "deb", Params: json.RawMessage(`{"v":3}`), Delay: time.Hour})
	require.JSONEq(t, `{"v":2}`, paramsOf(t, ctx, st, "deb"))
}

// Under a stream of debounced submits every half window, the task is due
// at the deadline of the stream's first submit plus MaxWait, and runs
// then, though the window alone would postpone it for ever.
func TestDebounceMaxWaitCapsAStream(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	const window, maxWait, every = time.Hour, 3 * time.Hour, 30 * time.Minute
	var ranAt time.Duration
	for elapsed := time.Duration(0); elapsed <= 2*maxWait && ranAt == 0; elapsed += every {
		submitDebounced(t, ctx, st, debounced("stream", `{}`, window, maxWait), nil)
		// The deadline was set at the first submit, on the real clock:
		// the loop's own time, seconds on a busy machine, comes off it.
		require.InDelta(t, min(window, maxWait-elapsed).Seconds(), dueIn(t, ctx, st, "stream").Seconds(), 10, "after %s", elapsed)
		if cl := claimT(t, ctx, st, 10, 0); len(cl) > 0 {
			require.Equal(t, api.TaskID("stream"), cl[0].ID)
			ranAt = elapsed
		}
		elapse(t, ctx, st, every)
	}
	require.Equal(t, maxWait, ranAt)
}

// A debounced submit of a running task flags its run again, due a window
// after it, and begins the next cycle: the cycle of the submits before
// the run ended when it started, and the one begun during the run counts
// from its first submit, not from the run's end. Once the task finished
// for good, a debounced submit schedules it again, as a new cycle.
func TestDebounceDuringARunBeginsTheNextCycle(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	const window, maxWait, every = time.Hour, 3 * time.Hour, 30 * time.Minute
	submitDebounced(t, ctx, st, debounced("run", `{"v":1}`, window, maxWait), nil)
	elapse(t, ctx, st, window)
	cl := claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 1)

	// The first cycle's deadline is 2h away; the new one's 3h.
	sub := submitDebounced(t, ctx, st, debounced("run", `{"v":2}`, window, maxWait), nil)
	require.Equal(t, api.StatusRunning, sub.Status)
	got, err := st.Get(ctx, "run")
	require.NoError(t, err)
	require.True(t, got.Resubmit)
	require.JSONEq(t, `{"v":1}`, string(got.Params), "a run keeps its params")
	require.Equal(t, window, dueIn(t, ctx, st, "run"))
	elapse(t, ctx, st, every)
	submitDebounced(t, ctx, st, debounced("run", `{"v":2}`, window, maxWait), nil)
	require.Equal(t, window, dueIn(t, ctx, st, "run"))
	ok, err := st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	require.Equal(t, window, dueIn(t, ctx, st, "run"), "due a window after the last submit, not after the run's end")

	var ranAt time.Duration
	for elapsed := every; elapsed <= 2*maxWait && ranAt == 0; elapsed += every {
		elapse(t, ctx, st, every)
		submitDebounced(t, ctx, st, debounced("run", `{"v":3}`, window, maxWait), nil)
		if cl = claimT(t, ctx, st, 10, 0); len(cl) > 0 {
			ranAt = elapsed + every
		}
	}
	require.Equal(t, maxWait, ranAt, "the cycle counts from the first submit during the run")
	ok, err = st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	got, err = st.Get(ctx, "run")
	require.NoError(t, err)
	require.True(t, got.Finished())

	elapse(t, ctx, st, 10*time.Hour)
	sub = submitDebounced(t, ctx, st, debounced("run", `{"v":4}`, window, maxWait), nil)
	require.False(t, sub.Created)
	require.Equal(t, api.StatusScheduled, sub.Status)
	require.Equal(t, window, dueIn(t, ctx, st, "run"))
	got, err = st.Get(ctx, "run")
	require.NoError(t, err)
	require.Zero(t, got.Attempt)
	require.JSONEq(t, `{"v":4}`, string(got.Params))
}

// A debounced submit of a behavior that combines merges its params into
// those of the waiting task; a held task keeps its params and due time; a
// task of another behavior refuses the submit whole.
func TestDebounceCombinesAndKeepsHeldAndForeignTasks(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	appendItems := func(submitted json.RawMessage) func(json.RawMessage) (json.RawMessage, error) {
		return func(persisted json.RawMessage) (json.RawMessage, error) {
			var a, b struct{ Items []int }
			if err := json.Unmarshal(persisted, &a); err != nil {
				return nil, err
			}
			if err := json.Unmarshal(submitted, &b); err != nil {
				return nil, err
			}
			return json.Marshal(struct{ Items []int }{append(a.Items, b.Items...)})
		}
	}
	for _, p := range []string{`{"Items":[1]}`, `{"Items":[2]}`, `{"Items":[3]}`} {
		submitDebounced(t, ctx, st, debounced("comb", p, time.Hour, 3*time.Hour), appendItems(json.RawMessage(p)))
	}
	require.JSONEq(t, `{"Items":[1,2,3]}`, paramsOf(t, ctx, st, "comb"))

	submitDebounced(t, ctx, st, debounced("held", `{"v":1}`, time.Hour, 3*time.Hour), nil)
	require.NoError(t, st.Hold(ctx, "held"))
	sub := submitDebounced(t, ctx, st, debounced("held", `{"v":2}`, time.Minute, time.Minute), nil)
	require.Equal(t, api.StatusHeld, sub.Status)
	require.JSONEq(t, `{"v":1}`, paramsOf(t, ctx, st, "held"))
	require.NoError(t, st.Release(ctx, "held"))
	require.Equal(t, time.Hour, dueIn(t, ctx, st, "held"), "released at the due time it had")

	other := debounced("held", `{"v":3}`, time.Minute, time.Minute)
	other.Behavior = "sem.other"
	_, err := st.SubmitCombined(ctx, other, nil)
	require.ErrorIs(t, err, api.ErrConflict)
	require.JSONEq(t, `{"v":1}`, paramsOf(t, ctx, st, "held"))
	require.Equal(t, time.Hour, dueIn(t, ctx, st, "held"))
}
