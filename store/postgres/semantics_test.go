package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

const semBehavior = "sem.work"

var semLease = []store.BehaviorLease{{Behavior: semBehavior, Lease: time.Minute}}

// openT opens a store on a fresh database.
func openT(t *testing.T) (context.Context, *postgres.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	st, err := postgres.Open(ctx, pgtest.New(t))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	return ctx, st
}

func submitT(t *testing.T, ctx context.Context, st *postgres.Store, tasks ...store.NewTask) {
	t.Helper()
	for i := range tasks {
		if tasks[i].Behavior == "" {
			tasks[i].Behavior = semBehavior
		}
		if tasks[i].Priority == 0 {
			tasks[i].Priority = 5
		}
	}
	_, err := st.Submit(ctx, tasks)
	require.NoError(t, err)
}

func claimT(t *testing.T, ctx context.Context, st *postgres.Store, limit, perGroup int) []store.Claimed {
	t.Helper()
	cl, err := st.Claim(ctx, store.ClaimRequest{Node: "n1", Behaviors: semLease, Limit: limit, PerGroup: perGroup})
	require.NoError(t, err)
	return cl
}

func success(c store.Claimed) store.Completion {
	return store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`), HasParent: c.ParentID != ""}
}

// A held parent that waits for its children stays held when the last one
// ends, and the child's finish does not take the unrelated completions of
// its batch down with it; released, the parent runs.
func TestHeldWaitingParentDoesNotPoisonCompletions(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "parent"})
	cl := claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)
	_, err := st.Spawn(ctx, cl[0].LeaseRef, []store.NewTask{{ID: "child", Behavior: semBehavior, Priority: 5}})
	require.NoError(t, err)
	ok, err := st.Finish(ctx, []store.Completion{{LeaseRef: cl[0].LeaseRef, Status: api.StatusScheduled,
		WaitChildren: true, Delay: time.Hour}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	require.NoError(t, st.Hold(ctx, "parent"))

	var others []store.NewTask
	for i := range 20 {
		others = append(others, store.NewTask{ID: api.TaskID(fmt.Sprintf("other-%02d", i))})
	}
	submitT(t, ctx, st, others...)
	cl = claimT(t, ctx, st, 100, 0)
	require.Len(t, cl, 21)
	var cs []store.Completion
	for _, c := range cl {
		cs = append(cs, success(c))
	}
	ok, err = st.Finish(ctx, cs)
	require.NoError(t, err)
	for i, c := range cl {
		require.True(t, ok[i], c.ID)
		got, err := st.Get(ctx, c.ID)
		require.NoError(t, err)
		require.Equal(t, api.StatusSuccess, got.Status, c.ID)
	}
	parent, err := st.Get(ctx, "parent")
	require.NoError(t, err)
	require.Equal(t, api.StatusHeld, parent.Status)
	require.Empty(t, claimT(t, ctx, st, 10, 0))

	require.NoError(t, st.Release(ctx, "parent"))
	cl = claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 1)
	require.Equal(t, api.TaskID("parent"), cl[0].ID)
}

// A completion batch isolates a row that cannot be written: the others
// are recorded and the bad one reports an error of its own.
func TestFinishIsolatesARowThatCannotBeWritten(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	var tasks []store.NewTask
	for i := range 10 {
		tasks = append(tasks, store.NewTask{ID: api.TaskID(fmt.Sprintf("t-%02d", i))})
	}
	submitT(t, ctx, st, tasks...)
	cl := claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 10)
	// A trigger makes one row unwritable, as a broken invariant would.
	_, err := st.Pool().Exec(ctx, `
		CREATE FUNCTION sem_reject() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.id = 't-03' AND NEW.status <> 'running' THEN RAISE EXCEPTION 'rejected'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER sem_reject BEFORE UPDATE ON stint_task FOR EACH ROW EXECUTE FUNCTION sem_reject()`)
	require.NoError(t, err)
	var cs []store.Completion
	for _, c := range cl {
		cs = append(cs, success(c))
	}
	ok, err := st.Finish(ctx, cs)
	require.NoError(t, err)
	for i, c := range cl {
		got, err := st.Get(ctx, c.ID)
		require.NoError(t, err)
		if c.ID == "t-03" {
			require.False(t, ok[i])
			require.Equal(t, api.StatusRunning, got.Status)
			continue
		}
		require.True(t, ok[i], c.ID)
		require.Equal(t, api.StatusSuccess, got.Status, c.ID)
	}
}

// Release restores the due time a task had when it was held.
func TestReleaseRestoresDueTime(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "later", Delay: time.Hour}, store.NewTask{ID: "now"})
	before, err := st.Get(ctx, "later")
	require.NoError(t, err)
	require.NoError(t, st.Hold(ctx, "later"))
	require.NoError(t, st.Hold(ctx, "now"))
	require.NoError(t, st.Release(ctx, "later"))
	require.NoError(t, st.Release(ctx, "now"))
	after, err := st.Get(ctx, "later")
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, after.Status)
	require.NotNil(t, after.ScheduleNotBefore)
	require.WithinDuration(t, *before.ScheduleNotBefore, *after.ScheduleNotBefore, time.Millisecond)
	cl := claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 1)
	require.Equal(t, api.TaskID("now"), cl[0].ID)
}

// A resubmit of a task that waits to retry keeps its attempts and errors.
func TestResubmitKeepsPendingRetry(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "flaky"})
	cl := claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)
	_, err := st.Finish(ctx, []store.Completion{{LeaseRef: cl[0].LeaseRef, Status: api.StatusFailure,
		Error: &api.TaskError{Message: "boom"}, Again: true, Delay: time.Hour}})
	require.NoError(t, err)
	submitT(t, ctx, st, store.NewTask{ID: "flaky"})
	got, err := st.Get(ctx, "flaky")
	require.NoError(t, err)
	require.Equal(t, 1, got.Attempt)
	require.Equal(t, 1, got.Errors)
	require.NotNil(t, got.Error)
	// The backoff holds: the task is not due before its retry time.
	require.Empty(t, claimT(t, ctx, st, 1, 0))
}

// A takeover of a resubmitted run clears the resubmit flag: the re-run
// covers the resubmit, so the task runs once more, not twice.
func TestTakeoverAndUnclaimClearResubmit(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "lost"}, store.NewTask{ID: "stopped"})
	cl := claimT(t, ctx, st, 2, 0)
	require.Len(t, cl, 2)
	submitT(t, ctx, st, store.NewTask{ID: "lost"}, store.NewTask{ID: "stopped"})
	_, err := st.Pool().Exec(ctx, `UPDATE stint_lease SET expires_at = now() - interval '1 second'
		WHERE $1 = ANY(task_ids)`, "lost")
	require.NoError(t, err)
	var stopped store.LeaseRef
	for _, c := range cl {
		if c.ID == "stopped" {
			stopped = c.LeaseRef
		}
	}
	require.NoError(t, st.Unclaim(ctx, []store.LeaseRef{stopped}, false))
	_, _, err = st.Takeover(ctx, 10)
	require.NoError(t, err)
	cl = claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 2)
	for _, c := range cl {
		require.True(t, c.Resubmitted, c.ID)
	}
	var cs []store.Completion
	for _, c := range cl {
		cs = append(cs, success(c))
	}
	_, err = st.Finish(ctx, cs)
	require.NoError(t, err)
	for _, id := range []api.TaskID{"lost", "stopped"} {
		got, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.True(t, got.Finished(), "%s: %s", id, got.Status)
	}
}

// A resubmit's requested due time applies when the run ends.
func TestResubmitDueTimeHonoredAtFinish(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "resub"})
	cl := claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)
	require.False(t, cl[0].Resubmitted)
	submitT(t, ctx, st, store.NewTask{ID: "resub", Delay: time.Hour})
	_, err := st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	got, err := st.Get(ctx, "resub")
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, got.Status)
	require.NotNil(t, got.ScheduleNotBefore)
	require.Greater(t, time.Until(*got.ScheduleNotBefore), 50*time.Minute)
	require.Empty(t, claimT(t, ctx, st, 1, 0))
}

// A group at its cap does not keep other groups from starting.
func TestCappedGroupDoesNotStarveOthers(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	var tasks []store.NewTask
	for i := range 40 {
		tasks = append(tasks, store.NewTask{ID: api.TaskID(fmt.Sprintf("a-%02d", i)), GroupKey: "A"})
	}
	submitT(t, ctx, st, tasks...)
	tasks = nil
	for i := range 3 {
		tasks = append(tasks, store.NewTask{ID: api.TaskID(fmt.Sprintf("b-%02d", i)), GroupKey: "B"})
	}
	submitT(t, ctx, st, tasks...)
	// One claim cycle of a node with one free slot at a time.
	first := claimT(t, ctx, st, 1, 1)
	require.Len(t, first, 1)
	require.Equal(t, "A", first[0].GroupKey)
	second := claimT(t, ctx, st, 1, 1)
	require.Len(t, second, 1)
	require.Equal(t, "B", second[0].GroupKey)
	require.Empty(t, claimT(t, ctx, st, 1, 1))

	// A claim reads no hint of a key at its cap, and drops the stale
	// hints it reads of a key with room: a task removed or held while A
	// is capped leaves no hint behind once A has room.
	_, err := st.Remove(ctx, "a-05")
	require.NoError(t, err)
	require.NoError(t, st.Hold(ctx, "a-06"))
	require.Empty(t, claimT(t, ctx, st, 5, 1))
	require.Len(t, claimT(t, ctx, st, 5, 10), 5, "a-01 to a-04 and a-07: A's first tasks, B's after them")
	var stale int
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_due WHERE id IN ('a-05', 'a-06')`).Scan(&stale))
	require.Zero(t, stale)
}

// A claim of a behavior with a cap per group key neither reads nor locks
// the hints of a key at its cap: its work is bounded by the keys' rooms,
// not by the backlog of the keys that cannot start anything. A claim that
// walked the backlog in pickup order locked hundreds of A's hints below
// (a row lock leaves its transaction in the row's xmax) to start one of B.
func TestClaimLocksNoHintOfAKeyAtItsCap(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	var tasks []store.NewTask
	for i := range 500 {
		tasks = append(tasks, store.NewTask{ID: api.TaskID(fmt.Sprintf("a-%03d", i)), GroupKey: "A"})
	}
	submitT(t, ctx, st, tasks...)
	submitT(t, ctx, st, store.NewTask{ID: "b-0", GroupKey: "B"}, store.NewTask{ID: "b-1", GroupKey: "B"})
	first := claimT(t, ctx, st, 1, 1)
	require.Len(t, first, 1)
	require.Equal(t, "a-000", string(first[0].ID))
	second := claimT(t, ctx, st, 100, 1)
	require.Len(t, second, 1)
	require.Equal(t, "b-0", string(second[0].ID))
	var locked int
	require.NoError(t, st.Pool().QueryRow(ctx,
		`SELECT count(*) FROM stint_due WHERE group_key = 'A' AND xmax::text <> '0'`).Scan(&locked))
	require.Zero(t, locked, "hints of A, at its cap, that the claim locked")
}

// A task without a group key of a behavior capped per key starts when
// the keys ahead of it are at their cap, even for a claim of one task: the
// look for keyless tasks reaches past the capped keys' tasks, however few
// the claim may take.
func TestAKeylessTaskPassesKeysAtTheirCap(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	var tasks []store.NewTask
	for i := range 5 {
		tasks = append(tasks, store.NewTask{ID: api.TaskID(fmt.Sprintf("a-%d", i)), GroupKey: "A"})
	}
	submitT(t, ctx, st, tasks...)
	submitT(t, ctx, st, store.NewTask{ID: "keyless"})
	first := claimT(t, ctx, st, 1, 1)
	require.Len(t, first, 1)
	require.Equal(t, "a-0", string(first[0].ID))
	second := claimT(t, ctx, st, 1, 1)
	require.Len(t, second, 1, "A is at its cap; the task without a key may start")
	require.Equal(t, "keyless", string(second[0].ID))
}

// Keys with nothing due, or held, take no place among the keys a claim of
// a behavior capped per key reads: a claim of one task, whose first key
// in key order has only a task due later, starts the next key's task.
func TestAKeyWithNothingDueTakesNoClaimsPlace(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "a-later", GroupKey: "A", Delay: time.Hour},
		store.NewTask{ID: "b-held", GroupKey: "B"}, store.NewTask{ID: "c-due", GroupKey: "C"})
	require.NoError(t, st.HoldGroup(ctx, "B"))
	claimed := claimT(t, ctx, st, 1, 1)
	require.Len(t, claimed, 1)
	require.Equal(t, "c-due", string(claimed[0].ID))
}

// A checkpoint of a running task sends a progress event carrying the
// progress, and rapid checkpoints are coalesced.
func TestCheckpointSendsCoalescedProgressEvents(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "prog"})
	cl := claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)
	head, err := st.FeedHead(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Checkpoint(ctx, nil, cl[0].LeaseRef, json.RawMessage(`{"done":1}`), false, nil))
	events, cursor, err := st.Changes(ctx, store.ChangeFilter{Since: head, TaskID: "prog"})
	require.NoError(t, err)
	require.Len(t, events, 1)
	require.Equal(t, api.StatusRunning, events[0].Status)
	require.JSONEq(t, `{"done":1}`, string(events[0].Progress))

	for i := range 1000 {
		require.NoError(t, st.Checkpoint(ctx, nil, cl[0].LeaseRef, json.RawMessage(fmt.Sprintf(`{"done":%d}`, i+2)), false, nil))
	}
	events, _, err = st.Changes(ctx, store.ChangeFilter{Since: cursor, TaskID: "prog", Limit: 100000})
	require.NoError(t, err)
	require.Less(t, len(events), 100)
}

// A finish counts the runs it records off their lease row, and drops the
// row with its last run: the lease then bounds a cap by the runs left, and
// its release has nothing left to check. A stale completion, whose lease
// is not its task's, changes no count.
func TestAFinishDropsTheLeaseOfItsLastRun(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "run-a"}, store.NewTask{ID: "run-b"}, store.NewTask{ID: "run-c"})
	cl := claimT(t, ctx, st, 3, 0)
	require.Len(t, cl, 3)
	left := func() []int {
		var n []int
		require.NoError(t, st.Pool().QueryRow(ctx, `SELECT coalesce(array_agg(task_count), '{}') FROM stint_lease`).Scan(&n))
		return n
	}
	require.Equal(t, []int{3}, left())

	held, err := st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, held)
	require.Equal(t, []int{2}, left(), "one run of three ended")

	stale := success(cl[1])
	stale.Lease = [16]byte{1}
	held, err = st.Finish(ctx, []store.Completion{stale, success(cl[0])})
	require.NoError(t, err)
	require.Equal(t, []bool{false, false}, held)
	require.Equal(t, []int{2}, left(), "completions that were not recorded change no count")

	held, err = st.Finish(ctx, []store.Completion{success(cl[1]), success(cl[2])})
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, held)
	require.Empty(t, left(), "the lease's last run ended")
	require.NoError(t, st.ReleaseLeases(ctx, [][16]byte{cl[0].Lease}), "a release of a dropped lease does nothing")
}

// A node releases a lease once the ends of its runs are recorded, but after
// a failover the database may have lost a recorded end: the promoted
// standby shows the task running under the lease still. The release keeps
// that lease row, so that it expires and the task is taken over; a lease
// whose tasks all ended is deleted.
func TestReleaseKeepsALeaseATaskStillRunsUnder(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "kept"}, store.NewTask{ID: "ended"})
	cl := claimT(t, ctx, st, 2, 0)
	require.Len(t, cl, 2)
	require.Equal(t, cl[0].Lease, cl[1].Lease, "one claim, one lease")
	held, err := st.Finish(ctx, []store.Completion{success(cl[1])})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, held)
	// What the standby received: the claim and the first finish, not the
	// second, which drops the lease row with its last run.
	_, err = st.Pool().Exec(ctx, `CREATE TABLE standby_task AS SELECT * FROM stint_task WHERE id = 'kept';
		CREATE TABLE standby_lease AS SELECT * FROM stint_lease`)
	require.NoError(t, err)
	held, err = st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, held)
	// The failover: the promoted standby's rows.
	_, err = st.Pool().Exec(ctx, `DELETE FROM stint_task WHERE id = 'kept';
		INSERT INTO stint_task SELECT * FROM standby_task;
		INSERT INTO stint_lease SELECT * FROM standby_lease`)
	require.NoError(t, err)
	leases := func() int {
		var n int
		require.NoError(t, st.Pool().QueryRow(ctx, `SELECT count(*) FROM stint_lease`).Scan(&n))
		return n
	}

	require.NoError(t, st.ReleaseLeases(ctx, [][16]byte{cl[0].Lease}))
	require.Equal(t, 1, leases(), "the lease a task still runs under is kept")
	_, err = st.Pool().Exec(ctx, `UPDATE stint_lease SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	_, tasks, err := st.Takeover(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, tasks, "the task is taken over")
	require.Zero(t, leases())
	cl = claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 1)
	require.Equal(t, api.TaskID("kept"), cl[0].ID)
	_, err = st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	require.NoError(t, st.ReleaseLeases(ctx, [][16]byte{cl[0].Lease}))
	require.Zero(t, leases(), "a lease whose tasks all ended is deleted")
	for _, id := range []api.TaskID{"kept", "ended"} {
		got, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, api.StatusSuccess, got.Status, id)
	}
}

// A feed row names each task's behavior, status and parent, whether the
// statement's tasks share them (written as one value repeated) or not
// (aggregated task by task): a submit of tasks of two behaviors, some with
// a parent and some without, then a claim and a finish of them all.
func TestTheFeedNamesEachTasksBehaviorAndParent(t *testing.T) {
	t.Parallel()
	cases := map[string][]store.NewTask{
		"one behavior, no parent":  {{ID: "feed-a1"}, {ID: "feed-a2"}, {ID: "feed-a3"}},
		"one behavior, one parent": {{ID: "feed-b1", ParentID: "parent-p"}, {ID: "feed-b2", ParentID: "parent-p"}},
		"some with a parent":       {{ID: "feed-c1", ParentID: "parent-p"}, {ID: "feed-c2"}, {ID: "feed-c3", ParentID: "parent-q"}},
		"two behaviors":            {{ID: "feed-d1", Behavior: "sem.other"}, {ID: "feed-d2"}, {ID: "feed-d3", Behavior: "sem.other", ParentID: "parent-p"}},
	}
	for name, tasks := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, st := openT(t)
			head, err := st.FeedHead(ctx)
			require.NoError(t, err)
			submitT(t, ctx, st, tasks...)
			cl, err := st.Claim(ctx, store.ClaimRequest{Node: "n1", Limit: len(tasks),
				Behaviors: append(slices.Clone(semLease), store.BehaviorLease{Behavior: "sem.other", Lease: time.Minute})})
			require.NoError(t, err)
			require.Len(t, cl, len(tasks))
			var cs []store.Completion
			for _, c := range cl {
				cs = append(cs, success(c))
			}
			_, err = st.Finish(ctx, cs)
			require.NoError(t, err)

			events, _, err := st.Changes(ctx, store.ChangeFilter{Since: head})
			require.NoError(t, err)
			type seen struct {
				behavior api.BehaviorID
				parent   api.TaskID
				statuses []api.Status
			}
			got := map[api.TaskID]*seen{}
			for _, e := range events {
				s := got[e.TaskID]
				if s == nil {
					s = &seen{behavior: e.Behavior, parent: e.ParentID}
					got[e.TaskID] = s
				}
				require.Equal(t, s.behavior, e.Behavior, "task %s", e.TaskID)
				require.Equal(t, s.parent, e.ParentID, "task %s", e.TaskID)
				s.statuses = append(s.statuses, e.Status)
			}
			require.Len(t, got, len(tasks))
			for _, task := range tasks {
				s := got[task.ID]
				require.NotNil(t, s, "task %s", task.ID)
				require.Equal(t, task.Behavior, s.behavior, "task %s", task.ID)
				require.Equal(t, task.ParentID, s.parent, "task %s", task.ID)
				require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, s.statuses, "task %s", task.ID)
			}
		})
	}
}

// A parent's next run that spawns the same children again (a takeover
// of the run that spawned them) resubmits those that ended, which run
// again: the parent waits for them once more, and runs only after every
// child's last end, not when a child that ran twice ends the second time.
func TestARespawnedChildThatEndedIsWaitedForAgain(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "parent"})
	cl := claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)
	first := cl[0].LeaseRef
	children := []store.NewTask{{ID: "child-a", Behavior: semBehavior, Priority: 5}, {ID: "child-b", Behavior: semBehavior, Priority: 5}}
	_, err := st.Spawn(ctx, first, children)
	require.NoError(t, err)
	cl = claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 2)
	if cl[0].ID != "child-a" {
		cl[0], cl[1] = cl[1], cl[0]
	}
	ok, err := st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)

	// The parent's first run and child-b's are given back; the parent's
	// second run spawns the same children (child-b is due, child-a ended)
	// and waits for them.
	require.NoError(t, st.Unclaim(ctx, []store.LeaseRef{first, cl[1].LeaseRef}, false))
	cl = claimT(t, ctx, st, 10, 0)
	ids := make([]api.TaskID, len(cl))
	for i, c := range cl {
		ids[i] = c.ID
	}
	require.ElementsMatch(t, []api.TaskID{"parent", "child-b"}, ids)
	byID := map[api.TaskID]store.Claimed{cl[0].ID: cl[0], cl[1].ID: cl[1]}
	_, err = st.Spawn(ctx, byID["parent"].LeaseRef, children)
	require.NoError(t, err)
	ok, err = st.Finish(ctx, []store.Completion{{LeaseRef: byID["parent"].LeaseRef, Status: api.StatusScheduled, WaitChildren: true, Delay: time.Hour}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	parent, err := st.Get(ctx, "parent")
	require.NoError(t, err)
	require.Equal(t, 2, parent.ChildrenPending, "child-b runs, child-a runs again")

	// child-a's second end leaves the parent waiting for child-b.
	cl = claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 1)
	require.Equal(t, api.TaskID("child-a"), cl[0].ID)
	_, err = st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	require.Empty(t, claimT(t, ctx, st, 10, 0), "the parent waits for child-b")

	// child-b, resubmitted while it ran, runs once more; its last end
	// wakes the parent.
	_, err = st.Finish(ctx, []store.Completion{success(byID["child-b"])})
	require.NoError(t, err)
	cl = claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 1)
	require.Equal(t, api.TaskID("child-b"), cl[0].ID)
	_, err = st.Finish(ctx, []store.Completion{success(cl[0])})
	require.NoError(t, err)
	cl = claimT(t, ctx, st, 10, 0)
	require.Len(t, cl, 1)
	require.Equal(t, api.TaskID("parent"), cl[0].ID)
}

// A submit of a child that ended for good, other than its parent's spawn,
// is refused: its end was counted off its parent, which would count its
// next end off again. Retry runs a failed one again, and the parent waits
// for it.
func TestASubmitOfAnEndedChildIsRefused(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	submitT(t, ctx, st, store.NewTask{ID: "parent"})
	cl := claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)
	parent := cl[0].LeaseRef
	_, err := st.Spawn(ctx, parent, []store.NewTask{{ID: "child", Behavior: semBehavior, Priority: 5}})
	require.NoError(t, err)
	cl = claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)
	_, err = st.Finish(ctx, []store.Completion{{LeaseRef: cl[0].LeaseRef, Status: api.StatusFailure, HasParent: true,
		Error: &api.TaskError{Code: "bad", Message: "bad"}}})
	require.NoError(t, err)

	_, err = st.Submit(ctx, []store.NewTask{{ID: "child", Behavior: semBehavior, Priority: 5}})
	require.ErrorIs(t, err, api.ErrConflict)
	require.ErrorContains(t, err, "task child is a child of task parent and has ended, which its parent counted: retry it")
	child, err := st.Get(ctx, "child")
	require.NoError(t, err)
	require.Equal(t, api.StatusFailure, child.Status, "the refused submit changed nothing")

	require.NoError(t, st.Retry(ctx, "child"))
	p, err := st.Get(ctx, "parent")
	require.NoError(t, err)
	require.Equal(t, 1, p.ChildrenPending, "the parent waits for the child again")
}
