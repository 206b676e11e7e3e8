package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// sleepOn is the completion of a run that registered a wait on tasks: it
// sleeps at most max.
func sleepOn(c store.Claimed, max time.Duration) store.Completion {
	return store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusScheduled, Again: true, Delay: max, WaitTasks: true}
}

// waitOf is what the store keeps of a task's wait on tasks.
type waitOf struct {
	// asleep: due more than half an hour from now (the waits here sleep
	// an hour at most).
	asleep bool
	// pending is tasks_pending; -1 for none.
	pending int
	// woken counts the task's claim hints due now: one per wake.
	woken int
	// rows counts its waits stored.
	rows int
}

func waitOfT(t *testing.T, ctx context.Context, st *postgres.Store, id api.TaskID) waitOf {
	t.Helper()
	var w waitOf
	require.NoError(t, st.Pool().QueryRow(ctx, `
		SELECT coalesce(schedule_not_before > now() + interval '30 minutes', false), coalesce(tasks_pending, -1),
			(SELECT count(*) FROM stint_due d WHERE d.id = t.id AND d.due <= now()),
			(SELECT count(*) FROM stint_task_wait v WHERE v.waiter = t.id)
		FROM stint_task t WHERE id = $1`, string(id)).Scan(&w.asleep, &w.pending, &w.woken, &w.rows))
	return w
}

// claimAllT submits tasks of the ids and claims them, by id, each under
// a lease of its own, as runs of different nodes are.
func claimAllT(t *testing.T, ctx context.Context, st *postgres.Store, ids ...api.TaskID) map[api.TaskID]store.Claimed {
	t.Helper()
	out := map[api.TaskID]store.Claimed{}
	for _, id := range ids {
		submitT(t, ctx, st, store.NewTask{ID: id})
		// A claim may take a stale hint (of a removed task) first.
		var cl []store.Claimed
		for try := 0; len(cl) == 0 && try < 10; try++ {
			cl = claimT(t, ctx, st, 1, 0)
		}
		require.Len(t, cl, 1)
		require.Equal(t, id, cl[0].ID)
		out[id] = cl[0]
	}
	return out
}

func finishT(t *testing.T, ctx context.Context, st *postgres.Store, cs ...store.Completion) {
	t.Helper()
	ok, err := st.Finish(ctx, cs)
	require.NoError(t, err)
	for i := range ok {
		require.True(t, ok[i], "completion %d recorded", i)
	}
}

// lockWaitersT waits until n statements of this database wait for a row
// lock.
func lockWaitersT(t *testing.T, ctx context.Context, st *postgres.Store, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting == n
	}, time.Minute, 5*time.Millisecond, "%d statements wait for a lock", n)
}

// A wait counts the tasks that ended already as ended, sleeps until the
// last of the others ended for good (a failure too), and is woken by that
// finish: due at once, with one claim hint. Ids of no task store nothing.
func TestAWaitOnTasksWakesAtTheEndOfTheLast(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := claimAllT(t, ctx, st, "waiter", "aaa", "bbb", "ccc", "old")
	finishT(t, ctx, st, success(cl["old"]))

	pending, missing, err := st.WaitTasks(ctx, cl["waiter"].LeaseRef, []api.TaskID{"aaa", "nope", "zilch"})
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{"nope", "zilch"}, missing)
	require.Zero(t, pending)
	require.Equal(t, waitOf{pending: -1}, waitOfT(t, ctx, st, "waiter"), "nothing stored")

	pending, missing, err = st.WaitTasks(ctx, cl["waiter"].LeaseRef, []api.TaskID{"aaa", "bbb", "ccc", "old"})
	require.NoError(t, err)
	require.Empty(t, missing)
	require.Equal(t, 3, pending, "old ended already")
	finishT(t, ctx, st, sleepOn(cl["waiter"], time.Hour))
	require.Equal(t, waitOf{asleep: true, pending: 3, rows: 3}, waitOfT(t, ctx, st, "waiter"))

	finishT(t, ctx, st, success(cl["aaa"]))
	finishT(t, ctx, st, store.Completion{LeaseRef: cl["bbb"].LeaseRef, Status: api.StatusFailure, Error: &api.TaskError{Message: "no"}})
	require.Equal(t, waitOf{asleep: true, pending: 1, rows: 1}, waitOfT(t, ctx, st, "waiter"))
	finishT(t, ctx, st, success(cl["ccc"]))
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter"), "the last end woke it")
	task, err := st.Get(ctx, "waiter")
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status)
	require.Zero(t, task.Attempt, "the wait is no attempt")

	// Its next run takes it.
	again := claimT(t, ctx, st, 1, 0)
	require.Len(t, again, 1)
	require.Equal(t, api.TaskID("waiter"), again[0].ID)
}

// A run whose targets all ended before its completion was recorded is due
// at once: ended already at its registration, or ended between the
// registration and the completion.
func TestAWaitWithNothingLeftIsDueAtOnce(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := claimAllT(t, ctx, st, "waiter1", "waiter2", "xxx")
	pending, _, err := st.WaitTasks(ctx, cl["waiter1"].LeaseRef, []api.TaskID{"xxx"})
	require.NoError(t, err)
	require.Equal(t, 1, pending)
	finishT(t, ctx, st, success(cl["xxx"]))
	require.Equal(t, waitOf{pending: 0}, waitOfT(t, ctx, st, "waiter1"), "counted while it runs")
	finishT(t, ctx, st, sleepOn(cl["waiter1"], time.Hour))
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter1"))

	pending, _, err = st.WaitTasks(ctx, cl["waiter2"].LeaseRef, []api.TaskID{"xxx"})
	require.NoError(t, err)
	require.Zero(t, pending)
	finishT(t, ctx, st, sleepOn(cl["waiter2"], time.Hour))
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter2"))
}

// inTurnT holds the row of task held, runs first until it waits for a row
// lock, then second until it waits too, then lets the row go, and
// returns what first and second returned.
func inTurnT(t *testing.T, ctx context.Context, st *postgres.Store, held api.TaskID, first, second func() error) (error, error) {
	t.Helper()
	tx, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM stint_task WHERE id = $1 FOR UPDATE`, string(held))
	require.NoError(t, err)
	var errs [2]chan error
	for i, f := range []func() error{first, second} {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- f() }()
		lockWaitersT(t, ctx, st, i+1)
	}
	require.NoError(t, tx.Rollback(ctx))
	return <-errs[0], <-errs[1]
}

// A registration that commits while the target's finish statement waits
// for the target's row (the finish's snapshot predates it) is counted by
// that finish: the finish finds the new row version's waited_on, and its
// lookup of the waits, with a snapshot of its own, finds the rows.
func TestARegistrationCommittingDuringTheTargetsFinishIsCounted(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := claimAllT(t, ctx, st, "waiter", "xxx")
	// Holding the waiter's row stops the registration after it locked
	// x and stored its row.
	var pending int
	errRegister, errFinish := inTurnT(t, ctx, st, "waiter", func() (err error) {
		pending, _, err = st.WaitTasks(ctx, cl["waiter"].LeaseRef, []api.TaskID{"xxx"})
		return err
	}, func() error {
		_, err := st.Finish(ctx, []store.Completion{success(cl["xxx"])})
		return err
	})
	require.NoError(t, errRegister)
	require.NoError(t, errFinish)
	require.Equal(t, 1, pending)

	require.Equal(t, waitOf{pending: 0}, waitOfT(t, ctx, st, "waiter"), "x's finish counted the wait")
	finishT(t, ctx, st, sleepOn(cl["waiter"], time.Hour))
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter"), "due at once, not after an hour")
}

// A registration that waits for the row of a target whose finish is under
// way finds it ended once the finish committed, and stores no wait on it.
func TestARegistrationAfterTheTargetsFinishFindsItEnded(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := claimAllT(t, ctx, st, "waiter", "waiter-v", "xxx")
	// v waits on x too; holding v's row stops x's finish after it
	// updated x, at the count of v's wait.
	pending, _, err := st.WaitTasks(ctx, cl["waiter-v"].LeaseRef, []api.TaskID{"xxx"})
	require.NoError(t, err)
	require.Equal(t, 1, pending)
	errFinish, errRegister := inTurnT(t, ctx, st, "waiter-v", func() error {
		_, err := st.Finish(ctx, []store.Completion{success(cl["xxx"])})
		return err
	}, func() (err error) {
		pending, _, err = st.WaitTasks(ctx, cl["waiter"].LeaseRef, []api.TaskID{"xxx"})
		return err
	})
	require.NoError(t, errFinish)
	require.NoError(t, errRegister)
	require.Equal(t, 0, pending, "x had ended")

	require.Equal(t, waitOf{pending: 0}, waitOfT(t, ctx, st, "waiter"))
	require.Equal(t, waitOf{pending: 0}, waitOfT(t, ctx, st, "waiter-v"))
	finishT(t, ctx, st, sleepOn(cl["waiter"], time.Hour), sleepOn(cl["waiter-v"], time.Hour))
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter"))
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter-v"))
}

// Of the finishes of a waiter's targets at once, each in its own
// statement, and the waiter's own completion among them, exactly one
// makes it due: it has one claim hint due now.
func TestConcurrentEndsWakeAWaiterExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	const targets = 12
	for round := range 4 {
		w := api.TaskID(fmt.Sprintf("waiter%d", round))
		ids := []api.TaskID{w}
		for i := range targets {
			ids = append(ids, api.TaskID(fmt.Sprintf("x%d.%d", round, i)))
		}
		cl := claimAllT(t, ctx, st, ids...)
		pending, _, err := st.WaitTasks(ctx, cl[w].LeaseRef, ids[1:])
		require.NoError(t, err)
		require.Equal(t, targets, pending)
		if round%2 == 0 {
			finishT(t, ctx, st, sleepOn(cl[w], time.Hour))
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, len(ids))
		for _, id := range ids {
			c := success(cl[id])
			if id == w {
				if round%2 == 0 {
					continue
				}
				c = sleepOn(cl[w], time.Hour)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ok, err := st.Finish(ctx, []store.Completion{c})
				if err == nil && !ok[0] {
					err = fmt.Errorf("%s not recorded", c.ID)
				}
				errs <- err
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, w), "round %d", round)
		_, err = st.Remove(ctx, w) // out of the next round's claim
		require.NoError(t, err)
	}
}

// A waiter's completion recorded in the same batch as the end of its
// target is recorded apart, and is due at once.
func TestAWaitersCompletionInTheBatchOfItsTargetsEnd(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := claimAllT(t, ctx, st, "waiter", "xxx")
	_, _, err := st.WaitTasks(ctx, cl["waiter"].LeaseRef, []api.TaskID{"xxx"})
	require.NoError(t, err)
	finishT(t, ctx, st, sleepOn(cl["waiter"], time.Hour), success(cl["xxx"]))
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter"))
}

// A wait that passed its longest leaves rows of a lease the task no
// longer has: the next run's wait on other tasks is not counted down by
// their ends.
func TestARowOfAnEarlierWaitCountsForNothing(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := claimAllT(t, ctx, st, "waiter", "old", "new")
	_, _, err := st.WaitTasks(ctx, cl["waiter"].LeaseRef, []api.TaskID{"old"})
	require.NoError(t, err)
	finishT(t, ctx, st, sleepOn(cl["waiter"], 0)) // its longest wait passes at once
	again := claimT(t, ctx, st, 1, 0)
	require.Len(t, again, 1)
	require.Equal(t, waitOf{pending: -1, rows: 1}, waitOfT(t, ctx, st, "waiter"), "the claim cleared the count")
	pending, _, err := st.WaitTasks(ctx, again[0].LeaseRef, []api.TaskID{"new"})
	require.NoError(t, err)
	require.Equal(t, 1, pending)
	finishT(t, ctx, st, sleepOn(again[0], time.Hour))

	finishT(t, ctx, st, success(cl["old"]))
	require.Equal(t, waitOf{asleep: true, pending: 1, rows: 1}, waitOfT(t, ctx, st, "waiter"), "old's end is not the wait's")
	finishT(t, ctx, st, success(cl["new"]))
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter"))
}

// Targets that end by hand or go count as ended: failed by an operator,
// removed, cancelled with their workflow. The waits of a task go with it:
// removed, or deleted by the cleanup.
func TestTargetsEndedOrRemovedByHandCount(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "failed", Delay: time.Hour}, store.NewTask{ID: "removed", Delay: time.Hour})
	cl := claimAllT(t, ctx, st, "waiter", "waiter2")
	pending, _, err := st.WaitTasks(ctx, cl["waiter"].LeaseRef, []api.TaskID{"failed", "removed"})
	require.NoError(t, err)
	require.Equal(t, 2, pending)
	finishT(t, ctx, st, sleepOn(cl["waiter"], time.Hour))
	require.NoError(t, st.Fail(ctx, "failed", &api.TaskError{Code: api.FailedByHand, Message: "by hand"}))
	require.Equal(t, waitOf{asleep: true, pending: 1, rows: 1}, waitOfT(t, ctx, st, "waiter"))
	_, err = st.Remove(ctx, "removed")
	require.NoError(t, err)
	require.Equal(t, waitOf{pending: -1, woken: 1}, waitOfT(t, ctx, st, "waiter"))

	// w2 waits on w, then goes: its wait goes with it.
	_, _, err = st.WaitTasks(ctx, cl["waiter2"].LeaseRef, []api.TaskID{"waiter"})
	require.NoError(t, err)
	finishT(t, ctx, st, sleepOn(cl["waiter2"], time.Hour))
	_, err = st.Remove(ctx, "waiter2")
	require.NoError(t, err)
	var rows int
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_task_wait`).Scan(&rows))
	require.Zero(t, rows)
}

// The cleanup deletes the waits of the tasks it deletes.
func TestTheCleanupDeletesAWaitersWaits(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "never", Delay: time.Hour})
	cl := claimAllT(t, ctx, st, "waiter")
	_, _, err := st.WaitTasks(ctx, cl["waiter"].LeaseRef, []api.TaskID{"never"})
	require.NoError(t, err)
	finishT(t, ctx, st, sleepOn(cl["waiter"], 0))
	again := claimT(t, ctx, st, 1, 0)
	require.Len(t, again, 1)
	finishT(t, ctx, st, success(again[0]))
	require.Equal(t, 1, waitOfT(t, ctx, st, "waiter").rows)
	n, err := st.DeleteFinished(ctx, store.DeleteFinishedParams{Behavior: semBehavior, Status: api.StatusSuccess, OlderThan: -time.Hour, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	var rows int
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_task_wait`).Scan(&rows))
	require.Zero(t, rows)
}

// A registration of a run that lost its lease stores nothing.
func TestARegistrationIsFenced(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := claimAllT(t, ctx, st, "waiter", "xxx")
	stale := cl["waiter"].LeaseRef
	stale.Lease[0]++
	_, _, err := st.WaitTasks(ctx, stale, []api.TaskID{"xxx"})
	require.ErrorIs(t, err, api.ErrHalt)
	require.Equal(t, waitOf{pending: -1}, waitOfT(t, ctx, st, "waiter"))
	var waited bool
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT waited_on FROM stint_task WHERE id = 'xxx'`).Scan(&waited))
	require.False(t, waited)
}
