// Package storetest is the conformance suite of the store.Store contract:
// the behavior the engine relies on, tested through the interface alone,
// so that a second implementation, or a rewrite of the first, knows what
// it must keep. An implementation's tests call Run with a constructor of
// empty, migrated stores.
package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// behavior is the behavior every task of the suite has.
const behavior api.BehaviorID = "conformance.work"

// Run runs the suite. newStore returns an empty, migrated store of its
// own for each test, closed when the test ends.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	for _, tc := range []struct {
		name string
		test func(*suite)
	}{
		{"SubmitAndGet", testSubmitAndGet},
		{"SubmitOfAnExistingIDMerges", testSubmitOfAnExistingIDMerges},
		{"SubmitOfATakenNewIDMerges", testSubmitOfATakenNewIDMerges},
		{"ClaimIssuesALeaseOnce", testClaimIssuesALeaseOnce},
		{"ClaimTakesLowerPriorityFirstAndSkipsDelayed", testClaimOrder},
		{"ClaimKeepsPickupOrderAcrossBehaviors", testClaimOrderAcrossBehaviors},
		{"StaleLeaseWritesChangeNothing", testFencing},
		{"SetPriorityIsFencedAndOrdersTheNextClaim", testSetPriority},
		{"HoldAndRelease", testHoldAndRelease},
		{"GroupHoldAndPause", testGroupHoldAndPause},
		{"RetryOfAFailure", testRetry},
		{"RemoveHaltsTheRun", testRemove},
		{"ExpiredLeaseIsTakenOver", testTakeover},
		{"UnclaimDoesNotCountTheAttempt", testUnclaim},
		{"UnclaimKeepsItsPlace", testUnclaimKeepsItsPlace},
		{"SpawnIsFenced", testSpawn},
		{"RetriedChildIsPendingAgain", testRetriedChild},
		{"RemovedParentsChildrenAreOrphans", testOrphans},
		{"ChangesAreInOrder", testChanges},
		{"SubmitStartRunsANewDueTaskUnderALease", testSubmitStart},
		{"SubmitStartLeavesTheOthersToClaims", testSubmitStartFallsBack},
		{"SubmitStartedTaskIsTakenOver", testSubmitStartTakeover},
		{"FinishThatMakesATaskDueWakesTheClaimers", testFinishWakesClaimers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			t.Cleanup(cancel)
			tc.test(&suite{t: t, ctx: ctx, st: newStore(t)})
		})
	}
}

// suite is one test's store.
type suite struct {
	t   *testing.T
	ctx context.Context
	st  store.Store
}

func (s *suite) submit(id string, mod ...func(*store.NewTask)) api.Submission {
	s.t.Helper()
	nt := store.NewTask{ID: api.TaskID(id), Behavior: behavior, Params: json.RawMessage(fmt.Sprintf(`{"id":%q}`, id)), Priority: 5}
	for _, m := range mod {
		m(&nt)
	}
	subs, err := s.st.Submit(s.ctx, []store.NewTask{nt})
	require.NoError(s.t, err)
	require.Len(s.t, subs, 1)
	return subs[0]
}

func (s *suite) claim(limit int, lease time.Duration) []store.Claimed {
	s.t.Helper()
	got, err := s.st.Claim(s.ctx, store.ClaimRequest{Node: "node", Limit: limit,
		Behaviors: []store.BehaviorLease{{Behavior: behavior, Lease: lease}}})
	require.NoError(s.t, err)
	return got
}

func (s *suite) get(id string) api.Task {
	s.t.Helper()
	task, err := s.st.Get(s.ctx, api.TaskID(id))
	require.NoError(s.t, err)
	return task
}

func (s *suite) finish(c store.Completion) bool {
	s.t.Helper()
	ok, err := s.st.Finish(s.ctx, []store.Completion{c})
	require.NoError(s.t, err)
	require.Len(s.t, ok, 1)
	return ok[0]
}

func ids(cs []store.Claimed) []api.TaskID {
	out := make([]api.TaskID, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

func success(ref store.LeaseRef, result string) store.Completion {
	return store.Completion{LeaseRef: ref, Status: api.StatusSuccess, Result: json.RawMessage(result)}
}

func testSubmitAndGet(s *suite) {
	sub := s.submit("t-a")
	require.Equal(s.t, api.Submission{ID: "t-a", Created: true, Status: api.StatusScheduled}, sub)
	task := s.get("t-a")
	require.Equal(s.t, behavior, task.Behavior)
	require.JSONEq(s.t, `{"id":"t-a"}`, string(task.Params))
	require.Equal(s.t, api.StatusScheduled, task.Status)
	require.NotNil(s.t, task.ScheduleNotBefore)
	_, err := s.st.Get(s.ctx, "missing")
	require.ErrorIs(s.t, err, api.ErrNotFound)
}

func testSubmitOfAnExistingIDMerges(s *suite) {
	s.submit("t-a")
	sub := s.submit("t-a", func(t *store.NewTask) { t.Params = json.RawMessage(`{"id":"other"}`) })
	require.False(s.t, sub.Created)
	require.JSONEq(s.t, `{"id":"t-a"}`, string(s.get("t-a").Params), "a scheduled task keeps its params")
	page, err := s.st.List(s.ctx, api.Filter{Behavior: behavior})
	require.NoError(s.t, err)
	require.Len(s.t, page.Tasks, 1)
}

// A task whose id is marked new (store.NewTask.Unique) but exists merges
// with the stored task as any submit does, in a plain submit and in one
// that may start tasks; the other tasks of the batch are created.
func testSubmitOfATakenNewIDMerges(s *suite) {
	s.submit("t-a")
	unique := func(id string) store.NewTask {
		return store.NewTask{ID: api.TaskID(id), Behavior: behavior, Params: json.RawMessage(`{"id":"other"}`), Priority: 5, Unique: true}
	}
	subs, err := s.st.Submit(s.ctx, []store.NewTask{unique("t-b"), unique("t-a")})
	require.NoError(s.t, err)
	require.Equal(s.t, []api.Submission{{ID: "t-b", Created: true, Status: api.StatusScheduled},
		{ID: "t-a", Created: false, Status: api.StatusScheduled}}, subs)
	require.JSONEq(s.t, `{"id":"t-a"}`, string(s.get("t-a").Params), "a scheduled task keeps its params")

	subs, started := s.submitStart(time.Minute, unique("t-c"), unique("t-b"))
	require.Equal(s.t, []api.Submission{{ID: "t-c", Created: true, Status: api.StatusScheduled},
		{ID: "t-b", Created: false, Status: api.StatusScheduled}}, subs)
	require.Empty(s.t, started, "due tasks of the behavior wait for a claim")
	page, err := s.st.List(s.ctx, api.Filter{Behavior: behavior})
	require.NoError(s.t, err)
	require.Len(s.t, page.Tasks, 3)
}

func testClaimIssuesALeaseOnce(s *suite) {
	s.submit("t-a")
	got := s.claim(10, time.Minute)
	require.Equal(s.t, []api.TaskID{"t-a"}, ids(got))
	require.Equal(s.t, 1, got[0].Attempt)
	require.NotEqual(s.t, [16]byte{}, got[0].Lease)
	require.Equal(s.t, api.StatusRunning, s.get("t-a").Status)
	require.Empty(s.t, s.claim(10, time.Minute), "a running task under a live lease is not claimed again")
	renewed, err := s.st.Renew(s.ctx, []store.Renewal{{LeaseRef: got[0].LeaseRef, Duration: time.Minute}})
	require.NoError(s.t, err)
	require.True(s.t, renewed["t-a"])
}

func testClaimOrder(s *suite) {
	s.submit("late", func(t *store.NewTask) { t.Delay = time.Hour })
	s.submit("low", func(t *store.NewTask) { t.Priority = 9 })
	s.submit("high", func(t *store.NewTask) { t.Priority = 1 })
	require.Equal(s.t, []api.TaskID{"high"}, ids(s.claim(1, time.Minute)))
	require.Equal(s.t, []api.TaskID{"low"}, ids(s.claim(10, time.Minute)), "the delayed task is not due")
}

func testClaimOrderAcrossBehaviors(s *suite) {
	const other api.BehaviorID = "conformance.other"
	const unclaimed api.BehaviorID = "conformance.unclaimed"
	s.submit("u-first", func(t *store.NewTask) { t.Behavior, t.Priority = unclaimed, 0 })
	s.submit("w-3", func(t *store.NewTask) { t.Priority = 3 })
	s.submit("o-1", func(t *store.NewTask) { t.Behavior, t.Priority = other, 1 })
	s.submit("w-2", func(t *store.NewTask) { t.Priority = 2 })
	s.submit("o-4", func(t *store.NewTask) { t.Behavior, t.Priority = other, 4 })
	both := []store.BehaviorLease{{Behavior: behavior, Lease: time.Minute}, {Behavior: other, Lease: time.Minute}}
	claim := func(limit int) []store.Claimed {
		got, err := s.st.Claim(s.ctx, store.ClaimRequest{Node: "node", Limit: limit, Behaviors: both})
		require.NoError(s.t, err)
		return got
	}
	got := claim(3)
	require.ElementsMatch(s.t, []api.TaskID{"o-1", "w-2", "w-3"}, ids(got), "the first three in pickup order, of either behavior")
	for _, c := range got {
		want := behavior
		if c.ID == "o-1" {
			want = other
		}
		require.Equal(s.t, want, c.Behavior)
	}
	require.Equal(s.t, []api.TaskID{"o-4"}, ids(claim(10)), "a behavior not asked for is not claimed")
	require.Equal(s.t, api.StatusScheduled, s.get("u-first").Status)
}

func testFencing(s *suite) {
	s.submit("t-a")
	c := s.claim(1, time.Minute)[0]
	forged := c.LeaseRef
	forged.Lease[0] ^= 0xff
	require.False(s.t, s.finish(success(forged, `"forged"`)))
	require.ErrorIs(s.t, s.st.Checkpoint(s.ctx, nil, forged, json.RawMessage(`{"forged":true}`), true, nil), api.ErrHalt)
	renewed, err := s.st.Renew(s.ctx, []store.Renewal{{LeaseRef: forged, Duration: time.Minute}})
	require.NoError(s.t, err)
	require.False(s.t, renewed["t-a"])
	task := s.get("t-a")
	require.Equal(s.t, api.StatusRunning, task.Status)
	require.Empty(s.t, task.Progress)
	steps, err := s.st.Steps(s.ctx, "t-a")
	require.NoError(s.t, err)
	require.Empty(s.t, steps, "a checkpoint under a lost lease keeps no step")

	require.NoError(s.t, s.st.Checkpoint(s.ctx, nil, c.LeaseRef, json.RawMessage(`{"step":1}`), true, nil))
	steps, err = s.st.Steps(s.ctx, "t-a")
	require.NoError(s.t, err)
	require.Len(s.t, steps, 1)
	require.Equal(s.t, 1, steps[0].N)
	require.JSONEq(s.t, `{"step":1}`, string(steps[0].Progress))
	require.True(s.t, s.finish(success(c.LeaseRef, `"done"`)))
	task = s.get("t-a")
	require.Equal(s.t, api.StatusSuccess, task.Status)
	require.JSONEq(s.t, `"done"`, string(task.Result))
	require.JSONEq(s.t, `{"step":1}`, string(task.Progress))
	require.True(s.t, task.Finished())
	require.False(s.t, s.finish(success(c.LeaseRef, `"again"`)), "a run finishes once")
}

func testSetPriority(s *suite) {
	s.submit("t-a", func(t *store.NewTask) { t.Priority = 1 })
	c := s.claim(1, time.Minute)[0]
	forged := c.LeaseRef
	forged.Lease[0] ^= 0xff
	require.ErrorIs(s.t, s.st.SetPriority(s.ctx, forged, 9), api.ErrHalt)
	require.Equal(s.t, 1, s.get("t-a").Priority, "a stale lease changes nothing")
	require.NoError(s.t, s.st.SetPriority(s.ctx, c.LeaseRef, 9))
	require.Equal(s.t, 9, s.get("t-a").Priority)

	// Snoozed, the task is due again with its new priority: a task of
	// priority 5 due later is claimed before it.
	require.True(s.t, s.finish(store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusScheduled, Again: true}))
	s.submit("t-b")
	require.Equal(s.t, []api.TaskID{"t-b"}, ids(s.claim(1, time.Minute)))
	again := s.claim(1, time.Minute)
	require.Equal(s.t, []api.TaskID{"t-a"}, ids(again))
	require.ErrorIs(s.t, s.st.SetPriority(s.ctx, c.LeaseRef, 3), api.ErrHalt, "the lease of an ended run")
	require.Equal(s.t, 9, s.get("t-a").Priority)
}

func testHoldAndRelease(s *suite) {
	s.submit("t-a")
	require.NoError(s.t, s.st.Hold(s.ctx, "t-a"))
	require.Equal(s.t, api.StatusHeld, s.get("t-a").Status)
	require.Empty(s.t, s.claim(10, time.Minute), "a held task is not claimed")
	require.ErrorIs(s.t, s.st.Hold(s.ctx, "t-a"), api.ErrConflict)
	require.ErrorIs(s.t, s.st.Hold(s.ctx, "missing"), api.ErrNotFound)
	require.NoError(s.t, s.st.Release(s.ctx, "t-a"))
	require.ErrorIs(s.t, s.st.Release(s.ctx, "t-a"), api.ErrConflict)
	require.Equal(s.t, []api.TaskID{"t-a"}, ids(s.claim(10, time.Minute)))
}

func testGroupHoldAndPause(s *suite) {
	s.submit("in-group", func(t *store.NewTask) { t.GroupKey = "g" })
	require.NoError(s.t, s.st.HoldGroup(s.ctx, "g"))
	held, err := s.st.HeldGroups(s.ctx)
	require.NoError(s.t, err)
	require.Equal(s.t, []string{"g"}, held)
	s.submit("other")
	require.Equal(s.t, []api.TaskID{"other"}, ids(s.claim(10, time.Minute)))
	require.NoError(s.t, s.st.ReleaseGroup(s.ctx, "g"))
	require.NoError(s.t, s.st.SetBehavior(s.ctx, store.BehaviorSettings{Behavior: behavior, Paused: true}))
	require.Empty(s.t, s.claim(10, time.Minute), "a paused behavior is not claimed")
	require.NoError(s.t, s.st.SetBehavior(s.ctx, store.BehaviorSettings{Behavior: behavior}))
	require.Equal(s.t, []api.TaskID{"in-group"}, ids(s.claim(10, time.Minute)))
}

func testRetry(s *suite) {
	s.submit("t-a")
	require.ErrorIs(s.t, s.st.Retry(s.ctx, "t-a"), api.ErrConflict, "a scheduled task is not retried")
	c := s.claim(1, time.Minute)[0]
	require.True(s.t, s.finish(store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusFailure,
		Error: &api.TaskError{Code: "boom", Message: "it broke"}}))
	task := s.get("t-a")
	require.True(s.t, task.Finished())
	require.Equal(s.t, "boom", task.Error.Code)
	require.NoError(s.t, s.st.Retry(s.ctx, "t-a"))
	again := s.claim(1, time.Minute)
	require.Equal(s.t, []api.TaskID{"t-a"}, ids(again))
	require.Equal(s.t, 1, again[0].Attempt, "a retry starts a fresh count of attempts")
}

func testRemove(s *suite) {
	s.submit("t-a")
	c := s.claim(1, time.Minute)[0]
	removed, err := s.st.Remove(s.ctx, "t-a")
	require.NoError(s.t, err)
	require.Equal(s.t, api.StatusRunning, removed.Status)
	require.False(s.t, s.finish(success(c.LeaseRef, `"late"`)), "the removed task's run is halted")
	_, err = s.st.Get(s.ctx, "t-a")
	require.ErrorIs(s.t, err, api.ErrNotFound)
	_, err = s.st.Remove(s.ctx, "t-a")
	require.ErrorIs(s.t, err, api.ErrNotFound)
}

func testTakeover(s *suite) {
	s.submit("t-a")
	const lease = 200 * time.Millisecond
	c := s.claim(1, lease)[0]
	again := s.takenOver(lease)
	require.False(s.t, s.finish(success(c.LeaseRef, `"stale"`)), "the old holder is fenced out")
	require.True(s.t, s.finish(success(again[0].LeaseRef, `"new"`)))
	require.JSONEq(s.t, `"new"`, string(s.get("t-a").Result))
}

func testUnclaim(s *suite) {
	s.submit("t-a")
	c := s.claim(1, time.Minute)[0]
	require.NoError(s.t, s.st.Unclaim(s.ctx, []store.LeaseRef{c.LeaseRef}, false))
	again := s.claim(1, time.Minute)
	require.Equal(s.t, []api.TaskID{"t-a"}, ids(again))
	require.Equal(s.t, 1, again[0].Attempt)
}

// testUnclaimKeepsItsPlace checks that a task given back is claimed before
// the tasks that became due while it ran, unless it was given back
// behind them.
func testUnclaimKeepsItsPlace(s *suite) {
	s.submit("t-a")
	c := s.claim(1, time.Minute)[0]
	s.submit("t-b")
	require.NoError(s.t, s.st.Unclaim(s.ctx, []store.LeaseRef{c.LeaseRef}, false))
	first := s.claim(1, time.Minute)
	require.Equal(s.t, []api.TaskID{"t-a"}, ids(first), "a task given back keeps its place")
	require.NoError(s.t, s.st.Unclaim(s.ctx, []store.LeaseRef{first[0].LeaseRef}, true))
	require.Equal(s.t, []api.TaskID{"t-b"}, ids(s.claim(1, time.Minute)), "a task given back behind waits for those due before")
	require.Equal(s.t, []api.TaskID{"t-a"}, ids(s.claim(1, time.Minute)))
}

func testSpawn(s *suite) {
	s.submit("parent")
	c := s.claim(1, time.Minute)[0]
	forged := c.LeaseRef
	forged.Lease[0] ^= 0xff
	child := store.NewTask{ID: "child", Behavior: behavior, Params: json.RawMessage(`{}`), Priority: 5, ParentID: "parent"}
	_, err := s.st.Spawn(s.ctx, forged, []store.NewTask{child})
	require.ErrorIs(s.t, err, api.ErrHalt)
	_, err = s.st.Get(s.ctx, "child")
	require.ErrorIs(s.t, err, api.ErrNotFound, "a stale parent spawns nothing")
	subs, err := s.st.Spawn(s.ctx, c.LeaseRef, []store.NewTask{child})
	require.NoError(s.t, err)
	require.Len(s.t, subs, 1)
	require.Equal(s.t, api.TaskID("parent"), s.get("child").ParentID)
	require.Equal(s.t, 1, s.get("parent").ChildrenPending)
}

func testChanges(s *suite) {
	head, err := s.st.FeedHead(s.ctx)
	require.NoError(s.t, err)
	s.submit("t-a")
	c := s.claim(1, time.Minute)[0]
	require.True(s.t, s.finish(success(c.LeaseRef, `1`)))
	events, statuses := s.changes(head, "t-a")
	require.Equal(s.t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, statuses)
	require.True(s.t, events[len(events)-1].Final)
	require.True(s.t, slices.IsSortedFunc(events, func(a, b api.Event) int { return int(a.Seq - b.Seq) }))
}

func testRetriedChild(s *suite) {
	s.submit("parent")
	p := s.claim(1, time.Minute)[0]
	child := store.NewTask{ID: "child", Behavior: behavior, Params: json.RawMessage(`{}`), Priority: 5, ParentID: "parent"}
	_, err := s.st.Spawn(s.ctx, p.LeaseRef, []store.NewTask{child})
	require.NoError(s.t, err)
	require.True(s.t, s.finish(store.Completion{LeaseRef: p.LeaseRef, Status: api.StatusScheduled, WaitChildren: true, Delay: time.Hour}))
	c := s.claim(1, time.Minute)[0]
	require.Equal(s.t, api.TaskID("child"), c.ID)
	require.True(s.t, s.finish(store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusFailure, HasParent: true,
		Error: &api.TaskError{Code: "boom", Message: "it broke"}}))
	require.Zero(s.t, s.get("parent").ChildrenPending, "the child's end was counted off its parent")

	require.NoError(s.t, s.st.Retry(s.ctx, "child"))
	require.Equal(s.t, 1, s.get("parent").ChildrenPending, "a retried child is pending again")
	// The parent was woken by the child's first end; it runs again with
	// the retried child, and a wait for children now waits for it.
	both := s.claim(2, time.Minute)
	require.ElementsMatch(s.t, []api.TaskID{"parent", "child"}, ids(both))
	c = both[slices.IndexFunc(both, func(c store.Claimed) bool { return c.ID == "child" })]
	require.True(s.t, s.finish(store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusSuccess, Result: json.RawMessage(`1`), HasParent: true}))
	require.Zero(s.t, s.get("parent").ChildrenPending)
}

func testOrphans(s *suite) {
	s.submit("parent")
	p := s.claim(1, time.Minute)[0]
	child := store.NewTask{ID: "child-1", Behavior: behavior, Params: json.RawMessage(`{}`), Priority: 5, ParentID: "parent"}
	_, err := s.st.Spawn(s.ctx, p.LeaseRef, []store.NewTask{child})
	require.NoError(s.t, err)
	_, err = s.st.Remove(s.ctx, "parent")
	require.NoError(s.t, err)
	require.Empty(s.t, s.get("child-1").ParentID, "the removed parent's child is an orphan")

	// A new task under the parent's id, waiting for a child of its own:
	// the orphan's end is not counted off it.
	s.submit("parent")
	var np, orphan store.Claimed
	for _, c := range s.claim(2, time.Minute) {
		if c.ID == "parent" {
			np = c
		} else {
			orphan = c
		}
	}
	require.Equal(s.t, api.TaskID("parent"), np.ID)
	require.Equal(s.t, api.TaskID("child-1"), orphan.ID)
	_, err = s.st.Spawn(s.ctx, np.LeaseRef, []store.NewTask{{ID: "child-2", Behavior: behavior, Params: json.RawMessage(`{}`), Priority: 5, ParentID: "parent"}})
	require.NoError(s.t, err)
	require.True(s.t, s.finish(store.Completion{LeaseRef: orphan.LeaseRef, Status: api.StatusSuccess, Result: json.RawMessage(`1`), HasParent: true}))
	require.Equal(s.t, 1, s.get("parent").ChildrenPending, "the new parent waits for its own child only")
}

// submitStart submits tasks through SubmitStart on node "node", each with
// a start lease, and returns the ids it started.
func (s *suite) submitStart(lease time.Duration, tasks ...store.NewTask) ([]api.Submission, []store.Claimed) {
	s.t.Helper()
	for i := range tasks {
		if tasks[i].Behavior == "" {
			tasks[i].Behavior, tasks[i].Priority = behavior, 5
		}
		tasks[i].StartLease = lease
	}
	subs, started, err := s.st.SubmitStart(s.ctx, "node", tasks)
	require.NoError(s.t, err)
	require.Len(s.t, subs, len(tasks))
	return subs, started
}

func testSubmitStart(s *suite) {
	head, err := s.st.FeedHead(s.ctx)
	require.NoError(s.t, err)
	subs, started := s.submitStart(time.Minute,
		store.NewTask{ID: "t-a", Params: json.RawMessage(`{"n":1}`), Trace: "tr", GroupKey: "g"},
		store.NewTask{ID: "t-b"})
	require.Equal(s.t, []api.Submission{{ID: "t-a", Created: true, Status: api.StatusRunning}, {ID: "t-b", Created: true, Status: api.StatusRunning}}, subs)
	require.Equal(s.t, []api.TaskID{"t-a", "t-b"}, ids(started))
	c := started[0]
	require.Equal(s.t, c.Lease, started[1].Lease, "one lease per behavior and statement, as a claim")
	require.NotEqual(s.t, [16]byte{}, c.Lease)
	require.Equal(s.t, time.Minute, c.LeaseDuration)
	require.Equal(s.t, 1, c.Attempt)
	require.Equal(s.t, behavior, c.Behavior)
	require.JSONEq(s.t, `{"n":1}`, string(c.Params))
	require.Equal(s.t, "g", c.GroupKey)
	require.Equal(s.t, "tr", c.Trace)
	task := s.get("t-a")
	require.Equal(s.t, api.StatusRunning, task.Status)
	require.Equal(s.t, "node", task.Node)
	require.Equal(s.t, 1, task.Attempt)
	require.NotNil(s.t, task.ExecutedAt)
	require.NotNil(s.t, task.LostNotBefore)
	require.Empty(s.t, s.claim(10, time.Minute), "a started task leaves no claim hint")
	held, err := s.st.Renew(s.ctx, []store.Renewal{{LeaseRef: c.LeaseRef, Duration: time.Minute}})
	require.NoError(s.t, err)
	require.True(s.t, held["t-a"], "the lease row was written")
	require.True(s.t, s.finish(success(c.LeaseRef, `1`)))
	events, statuses := s.changes(head, "t-a")
	require.Equal(s.t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, statuses)
	require.Equal(s.t, events[0].Seq, events[1].Seq, "the submit records the task scheduled and running")

	// An operator's lease for the behavior takes precedence, as in a claim.
	require.NoError(s.t, s.st.SetBehavior(s.ctx, store.BehaviorSettings{Behavior: behavior, Lease: 2 * time.Minute}))
	_, started = s.submitStart(time.Minute, store.NewTask{ID: "t-c"})
	require.Len(s.t, started, 1)
	require.Equal(s.t, 2*time.Minute, started[0].LeaseDuration)
}

func testSubmitStartFallsBack(s *suite) {
	s.submit("existing")
	require.NoError(s.t, s.st.HoldGroup(s.ctx, "held"))
	subs, started := s.submitStart(time.Minute,
		store.NewTask{ID: "existing"},
		store.NewTask{ID: "delayed", Delay: time.Hour},
		store.NewTask{ID: "in-held", GroupKey: "held"})
	require.Empty(s.t, started)
	require.False(s.t, subs[0].Created)
	for _, sub := range subs {
		require.Equal(s.t, api.StatusScheduled, sub.Status, sub.ID)
	}
	// "existing" is due and waits at priority 5: a new task of that
	// priority or a lower one (a higher number) does not jump it, one of a
	// higher one does.
	_, started = s.submitStart(time.Minute, store.NewTask{ID: "same", Behavior: behavior, Priority: 5},
		store.NewTask{ID: "lower", Behavior: behavior, Priority: 6})
	require.Empty(s.t, started)
	_, started = s.submitStart(time.Minute, store.NewTask{ID: "higher", Behavior: behavior, Priority: 4})
	require.Equal(s.t, []api.TaskID{"higher"}, ids(started))
	require.Equal(s.t, []api.TaskID{"existing", "same", "lower"}, ids(s.claim(10, time.Minute)),
		"the tasks not started wait for claims, the held key's parked")
	require.NoError(s.t, s.st.ReleaseGroup(s.ctx, "held"))
	require.Equal(s.t, []api.TaskID{"in-held"}, ids(s.claim(10, time.Minute)))

	require.NoError(s.t, s.st.SetBehavior(s.ctx, store.BehaviorSettings{Behavior: behavior, Paused: true}))
	subs, started = s.submitStart(time.Minute, store.NewTask{ID: "paused"})
	require.Empty(s.t, started, "a paused behavior's task does not start")
	require.Equal(s.t, api.StatusScheduled, subs[0].Status)
	require.NoError(s.t, s.st.SetBehavior(s.ctx, store.BehaviorSettings{Behavior: behavior}))
	require.Equal(s.t, []api.TaskID{"paused"}, ids(s.claim(10, time.Minute)))
}

func testSubmitStartTakeover(s *suite) {
	const lease = 200 * time.Millisecond
	_, started := s.submitStart(lease, store.NewTask{ID: "t-a"})
	require.Len(s.t, started, 1)
	again := s.takenOver(lease)
	require.False(s.t, s.finish(success(started[0].LeaseRef, `"stale"`)), "the local run is fenced out")
	require.True(s.t, s.finish(success(again[0].LeaseRef, `"new"`)))
}

// takenOver waits until a takeover made t-a, whose lease lasts lease, due
// again, and claims it: its second attempt.
func (s *suite) takenOver(lease time.Duration) []store.Claimed {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, n, err := s.st.Takeover(s.ctx, 100)
		require.NoError(s.t, err)
		if n == 1 {
			break
		}
		require.True(s.t, time.Now().Before(deadline), "the expired lease was not taken over")
		time.Sleep(lease / 4)
	}
	again := s.claim(1, time.Minute)
	require.Equal(s.t, []api.TaskID{"t-a"}, ids(again))
	require.Equal(s.t, 2, again[0].Attempt)
	return again
}

// changes reads the change feed of task id after the cursor head, and the
// statuses it went through.
func (s *suite) changes(head int64, id api.TaskID) ([]api.Event, []api.Status) {
	s.t.Helper()
	events, _, err := s.st.Changes(s.ctx, store.ChangeFilter{Since: head, TaskID: id})
	require.NoError(s.t, err)
	var statuses []api.Status
	for _, e := range events {
		statuses = append(statuses, e.Status)
	}
	return events, statuses
}

// testFinishWakesClaimers checks that a finish that makes a task due at
// once, here one resubmitted while it ran, notifies ChannelDue.
func testFinishWakesClaimers(s *suite) {
	s.submit("t-w")
	c := s.claim(1, time.Minute)[0]
	require.Equal(s.t, api.StatusRunning, s.submit("t-w").Status, "the submit sets the resubmit flag")

	due := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		_ = s.st.Listen(ctx, []string{store.ChannelDue}, func(string, string) { due <- struct{}{} }, nil)
	}()
	select {
	case <-due: // the call that says the listener is connected
	case <-s.ctx.Done():
		s.t.Fatal("the listener did not connect")
	}
	require.True(s.t, s.finish(success(c.LeaseRef, `{}`)))
	select {
	case <-due:
	case <-s.ctx.Done():
		s.t.Fatal("the finish that made the task due again sent no notification")
	}
	require.Equal(s.t, []api.TaskID{"t-w"}, ids(s.claim(1, time.Minute)), "the task is due again")
}
