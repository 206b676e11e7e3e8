package impl_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

func TestRoundTripFromClientOnlyProcess(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("node-a", 5*time.Second)
	c := e.client()

	f, err := api.Submit(e.ctx, c, demo.Echo, demo.EchoParams{Text: "hello", Upper: true})
	require.NoError(t, err)
	require.True(t, f.Submission().Created)
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, demo.EchoResult{Text: "HELLO", Attempt: 1}, res)

	task, err := c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status)
	require.Equal(t, "node-a", task.Node)
	require.True(t, task.Finished())
}

func TestClientNeverRuns(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "idle"}))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	defer cancel()
	_, err = c.Await(ctx, sub.ID)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	task, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status)
	require.Zero(t, e.count(`SELECT count(*) FROM test_run`))
	lag, err := e.st.QueueLag(e.ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, lag, 300*time.Millisecond, "the task has waited at least as long as the await")
}

func TestServersRunEachTaskOnce(t *testing.T) {
	t.Parallel()
	for _, nodes := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d servers", nodes), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			for i := range nodes {
				e.server(fmt.Sprintf("node-%d", i), 5*time.Second, func(c *impl.ServerConfig) { c.MaxWorkers = 50 })
			}
			c := e.client()
			const n = 2000
			reqs := make([]api.SubmitRequest, n)
			for i := range reqs {
				reqs[i] = workReq(workKind, WorkParams{Key: fmt.Sprint(i)})
			}
			subs, err := c.SubmitMany(e.ctx, reqs)
			require.NoError(t, err)
			require.Len(t, subs, n)
			waitFor(t, time.Minute, "all tasks to succeed", func() bool {
				return e.count(`SELECT count(*) FROM stint_task WHERE status = 'success'`) == n
			})
			require.Equal(t, n, e.count(`SELECT count(*) FROM test_run`))
			require.Zero(t, e.count(`SELECT count(*) FROM (SELECT task_id FROM test_run GROUP BY task_id HAVING count(*) > 1) d`))
			require.Equal(t, nodes, e.count(`SELECT count(DISTINCT node) FROM test_run`), "every node should have run some tasks")
		})
	}
}

func TestKilledNodeTasksAreTakenOver(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The doomed node must keep its leases until it is killed: it renews
	// each one when two thirds of it are left, so a lease of a few seconds
	// leaves a busy machine seconds for a renewal, where one second left it
	// two thirds of a second. The survivor's lease does not bound the
	// takeover, only the doomed node's does; a long one keeps the survivor's
	// runs from being taken over from itself on a busy machine.
	const childLease, survivorLease = 5 * time.Second, time.Minute
	child := childtest.Start(t, envChildDSN+"="+e.dsn, envChildNode+"=doomed", envChildLease+"="+fmt.Sprint(childLease.Milliseconds()))

	c := e.client()
	const n = 20
	reqs := make([]api.SubmitRequest, n)
	for i := range reqs {
		reqs[i] = workReq(workKind, WorkParams{Key: fmt.Sprint("k", i), BlockFirst: true})
	}
	_, err := c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the child to run every task", func() bool {
		return e.count(`SELECT count(*) FROM test_run WHERE node = 'doomed'`) >= n
	})
	require.NoError(t, child.Kill())
	killed := time.Now()

	e.server("survivor", survivorLease)
	// Due once the doomed node's leases expire, plus the survivor's start,
	// poll and runs.
	waitFor(t, childLease+30*time.Second, "the survivor to finish every task", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE status = 'success' AND node = 'survivor'`) == n
	})
	t.Logf("takeover of %d tasks took %s after SIGKILL (lease %s)", n, time.Since(killed).Round(time.Millisecond), childLease)
	require.Equal(t, n, e.count(`SELECT count(*) FROM test_run WHERE node = 'doomed'`), "each task ran once on the doomed node")
	require.Equal(t, n, e.count(`SELECT count(*) FROM test_run WHERE node = 'survivor' AND attempt = 2`))
}

func TestStaleLeaseHolderIsFencedOut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "stale"}))
	require.NoError(t, err)

	// Node "old" claims with a one-second lease and never renews it.
	claim := func(node string) store.Claimed {
		got, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: node, Limit: 10,
			Behaviors: []store.BehaviorLease{{Behavior: workKind.ID, Lease: time.Second}}})
		require.NoError(t, err)
		require.Len(t, got, 1)
		return got[0]
	}
	task0, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	old := claim("old")
	got, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: "new", Limit: 10,
		Behaviors: []store.BehaviorLease{{Behavior: workKind.ID, Lease: time.Second}}})
	require.NoError(t, err)
	require.Empty(t, got, "a task under a live lease must not be claimed")
	_, tasks, err := e.st.Takeover(e.ctx, 10)
	require.NoError(t, err)
	require.Zero(t, tasks, "a live lease must not be taken over")

	waitFor(t, 10*time.Second, "the lease to expire", func() bool {
		return e.count(`SELECT count(*) FROM stint_lease WHERE lease = $1 AND expires_at <= now()`, pgtype.UUID{Bytes: old.Lease, Valid: true}) == 1
	})
	_, tasks, err = e.st.Takeover(e.ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, tasks)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE id = $1 AND status = 'scheduled'
		AND schedule_not_before = $2`, string(sub.ID), *task0.ScheduleNotBefore),
		"a lost task is due when it was due before, not behind what became due since")
	fresh := claim("new")
	require.NotEqual(t, old.Lease, fresh.Lease)
	require.Equal(t, 2, fresh.Attempt)

	// Every write of the old holder is refused.
	held, err := e.st.Renew(e.ctx, []store.Renewal{{LeaseRef: old.LeaseRef, Duration: time.Minute}})
	require.NoError(t, err)
	require.False(t, held[sub.ID])
	require.ErrorIs(t, e.st.Checkpoint(e.ctx, nil, old.LeaseRef, []byte(`{"step":1}`), false, nil), api.ErrHalt)
	ok, err := e.st.Finish(e.ctx, []store.Completion{{LeaseRef: old.LeaseRef, Status: api.StatusSuccess, Result: []byte(`{"key":"old"}`)}})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, ok)

	ok, err = e.st.Finish(e.ctx, []store.Completion{{LeaseRef: fresh.LeaseRef, Status: api.StatusSuccess, Result: []byte(`{"key":"new"}`)}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	ok, err = e.st.Finish(e.ctx, []store.Completion{{LeaseRef: old.LeaseRef, Status: api.StatusFailure, Error: &api.TaskError{Message: "late"}}})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, ok)

	task, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status)
	require.JSONEq(t, `{"key":"new"}`, string(task.Result))
	require.Nil(t, task.Progress)
}

func TestRunnerHaltsWhenLeaseIsLost(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("holder", time.Second)
	sub, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "lost", BlockFirst: true}))
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the run to start", func() bool { return srv.Running() == 1 })

	// Another node takes the task over: the lease token changes.
	_, err = e.pool.Exec(e.ctx, `UPDATE stint_task SET lease = gen_random_uuid(), node = 'thief' WHERE id = $1`, string(sub.ID))
	require.NoError(t, err)
	// The holder's next renewal finds the lease gone and cancels the run,
	// whose failure is then fenced out.
	waitFor(t, 10*time.Second, "the run to be cancelled", func() bool { return srv.Running() == 0 })
	task, err := srv.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, task.Status)
	require.Equal(t, "thief", task.Node)
	require.Nil(t, task.Error)
}

// A running task shows the lease expiry as renewals move it, not as of its
// claim. The lease is long enough that a renewal made late by a busy
// machine still comes before it expires (renewals start a third of the way
// in, leaving two thirds of it, 6.7 s, as slack).
func TestRunningTaskShowsItsRenewedLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("holder", 10*time.Second)
	sub, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "renewed", BlockFirst: true}))
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the run to start", func() bool { return srv.Running() == 1 })
	first, err := srv.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.NotNil(t, first.LostNotBefore)
	waitFor(t, 30*time.Second, "a renewal", func() bool {
		task, err := srv.Get(e.ctx, sub.ID)
		require.NoError(t, err)
		require.Equal(t, api.StatusRunning, task.Status)
		require.Equal(t, task.LostNotBefore, task.ScheduleNotBefore, "a running task is due again when its lease expires")
		return task.LostNotBefore.After(*first.LostNotBefore)
	})
}

func TestRetryUntilSuccess(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	f, res := e.run(srv, WorkParams{Key: "flaky", FailUntil: 2})
	require.Equal(t, 3, res.Attempt)
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, 3, task.Attempt)
	require.Zero(t, task.Errors, "a success resets the failure count")
	require.Nil(t, task.Error)
	// Backoff: each retry waited at least 75% of BackoffMin (20 ms).
	require.Equal(t, 2, e.count(`SELECT count(*) FROM (
		SELECT at - lag(at) OVER (ORDER BY attempt) AS gap FROM test_run WHERE task_id = $1) g
		WHERE gap >= interval '15 milliseconds'`, string(f.ID())))
}

func TestPermanentFailureAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	f, err := api.Submit(e.ctx, srv, workKind, WorkParams{Key: "doomed", FailUntil: 99})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	var te *api.TaskError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "planned", te.Code)
	require.Equal(t, "attempt 3 fails", te.Message)
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, api.StatusFailure, task.Status)
	require.Equal(t, 3, task.Attempt)
	require.Equal(t, 3, task.Errors)
	require.Nil(t, task.ScheduleNotBefore)
	require.Equal(t, 3, e.count(`SELECT count(*) FROM test_run`))
}

func TestNonRetryableErrorFailsAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	f, err := api.Submit(e.ctx, srv, workKind, WorkParams{Key: "perm", FailUntil: 1, Permanent: true})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	var te *api.TaskError
	require.ErrorAs(t, err, &te)
	require.False(t, te.Retryable)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run`))
}

func TestRecurringTaskReschedulesAfterSuccess(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	f, err := api.Submit(e.ctx, srv, workKind, WorkParams{Key: "cron", Recur: 3})
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "three runs", func() bool {
		return e.count(`SELECT count(*) FROM test_run`) == 3
	})
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status)
	require.Equal(t, 3, task.Attempt)
	require.Nil(t, task.ScheduleNotBefore)
}

func TestConcurrentSubmitsOfOneIDRunOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("node", 5*time.Second)
	c := e.client()
	const n = 50
	results := make([]WorkResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			f, err := api.Submit(e.ctx, c, shareKind, WorkParams{Key: "once", SleepMS: 50})
			if err != nil {
				errs[i] = err
				return
			}
			results[i], errs[i] = f.Await(e.ctx)
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, results[0], results[i])
	}
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run`))
}

func TestBadInputStoresNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	big := `{"key":"` + strings.Repeat("x", 1<<20) + `"}`
	prio := func(p int) *int { return &p }
	cases := []struct {
		name  string
		req   api.SubmitRequest
		field string
	}{
		{"unknown behavior", api.SubmitRequest{Behavior: "no.such", Params: []byte(`{}`)}, "behavior"},
		{"malformed behavior id", api.SubmitRequest{Behavior: "Bad Behavior!"}, "behavior"},
		{"missing required field", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{}`)}, "params.key"},
		{"field over its max", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"` + strings.Repeat("k", 101) + `"}`)}, "params.key"},
		{"negative field", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a","sleep_ms":-1}`)}, "params.sleep_ms"},
		{"wrong type", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":5}`)}, "params.key"},
		{"unknown field", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a","bogus":1}`)}, "params.bogus"},
		{"malformed JSON", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":`)}, "params"},
		{"trailing data", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"} {}`)}, "params"},
		{"NUL in params", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a\u0000b"}`)}, "params.key"},
		{"invalid UTF-8", api.SubmitRequest{Behavior: workKind.ID, Params: []byte("{\"key\":\"\xff\"}")}, "params"},
		{"params over the size limit", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(big)}, "params"},
		{"deeply nested JSON", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a","sleep_ms":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`)}, "params"},
		{"SQL in a params string", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"x'); DROP TABLE stint_task;--` + strings.Repeat("k", 80) + `"}`)}, "params.key"},
		{"SQL in the group key", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"}`), GroupKey: "a\x00'; DROP TABLE stint_task;--"}, "group_key"},
		{"id too short", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"}`), ID: "ab"}, "id"},
		{"id too long", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"}`), ID: api.TaskID(strings.Repeat("i", 129))}, "id"},
		{"id with bad characters", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"}`), ID: "a b'; DROP TABLE stint_task;--"}, "id"},
		{"negative priority", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"}`), Priority: prio(-1)}, "priority"},
		{"overflowing priority", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"}`), Priority: prio(40000)}, "priority"},
		{"negative delay", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"}`), Delay: -time.Second}, "delay"},
		{"control character in group key", api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"a"}`), GroupKey: "a\nb"}, "group_key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Submit(e.ctx, tc.req)
			require.Error(t, err)
			require.ErrorIs(t, err, api.ErrInvalid)
			var ie *api.InvalidError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tc.field, ie.Field, "error: %v", err)
			if tc.name == "unknown behavior" {
				require.ErrorIs(t, err, api.ErrUnknownBehavior)
			}
			// SubmitMany refuses the whole batch.
			_, err = c.SubmitMany(e.ctx, []api.SubmitRequest{workReq(workKind, WorkParams{Key: "fine"}), tc.req})
			require.ErrorIs(t, err, api.ErrInvalid)
		})
	}
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`))
}

func TestPriorityOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	prios := []int{7, 1, 9, 3, 5, 0, 2}
	for i, p := range prios {
		_, err := api.Submit(e.ctx, c, workKind, WorkParams{Key: fmt.Sprint("p", i)}, api.WithPriority(p))
		require.NoError(t, err)
	}
	e.server("single", 5*time.Second, func(c *impl.ServerConfig) { c.MaxWorkers = 1 })
	waitFor(t, 20*time.Second, "all runs", func() bool { return e.count(`SELECT count(*) FROM test_run`) == len(prios) })
	rows, err := e.pool.Query(e.ctx, `SELECT t.priority FROM test_run r JOIN stint_task t ON t.id = r.task_id ORDER BY r.at`)
	require.NoError(t, err)
	var got []int
	for rows.Next() {
		var p int
		require.NoError(t, rows.Scan(&p))
		got = append(got, p)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int{0, 1, 2, 3, 5, 7, 9}, got)
}

func TestScheduledTaskWaitsForItsTime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	f, err := api.Submit(e.ctx, srv, workKind, WorkParams{Key: "later"}, api.WithDelay(time.Second))
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	// Measured by the database clock, as the claim is.
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task t JOIN test_run r ON r.task_id = t.id
		WHERE t.id = $1 AND r.at >= t.created_at + interval '1 second'`, string(f.ID())))
}

func TestStopReleasesRunningTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("leaving", time.Minute)
	sub, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "long", BlockFirst: true}))
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the run to start", func() bool { return srv.Running() == 1 })
	// Half of Stop's time is kept for the release: see stopReserve.
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, srv.Stop(ctx))
	task, err := e.st.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status)
	require.Zero(t, task.Attempt, "a released run is not counted")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE schedule_not_before <= now()`), "due at once, not after the lease")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_node`))

	// Another node picks it up at once, long before the minute-long lease
	// would have run out.
	e.server("next", time.Minute)
	waitFor(t, 10*time.Second, "the next node to run the task", func() bool {
		return e.count(`SELECT count(*) FROM test_run WHERE node = 'next'`) == 1
	})
}

func TestNodeDroppedAsDeadRegistersAgain(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("comeback", 5*time.Second, func(c *impl.ServerConfig) { c.NodeHeartbeat = 100 * time.Millisecond })
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_node WHERE id = 'comeback'`))
	// Another node's maintenance dropped it (say, after a long pause).
	_, err := e.pool.Exec(e.ctx, `DELETE FROM stint_node`)
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the node to register again", func() bool {
		return e.count(`SELECT count(*) FROM stint_node WHERE id = 'comeback'`) == 1
	})
}

// A claim hint made stale by a later change is dropped where a claim finds
// it: a task whose due time moved later is not run at the old time, and
// one moved earlier runs at the new time.
func TestStaleClaimHintsAreDropped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	claim := func() []store.Claimed {
		got, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: "n", Limit: 10,
			Behaviors: []store.BehaviorLease{{Behavior: workKind.ID, Lease: time.Minute}}})
		require.NoError(t, err)
		return got
	}
	c := e.client()
	later, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "later"}))
	require.NoError(t, err)
	req := workReq(workKind, WorkParams{Key: "later"})
	req.Delay = time.Hour
	_, err = c.Submit(e.ctx, req)
	require.NoError(t, err)
	require.Equal(t, 2, e.count(`SELECT count(*) FROM stint_due WHERE id = $1`, string(later.ID)), "a hint per time it became due")

	require.Empty(t, claim(), "the task moved an hour later")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_due WHERE id = $1 AND due > now()`, string(later.ID)),
		"the stale hint is gone, the current one stays")

	// Held, then released: the hint of the held time is stale, the one of
	// the release is not.
	held, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "held"}))
	require.NoError(t, err)
	require.NoError(t, c.Hold(e.ctx, held.ID))
	require.Empty(t, claim(), "a held task is not claimed")
	require.NoError(t, c.Release(e.ctx, held.ID))
	got := claim()
	require.Len(t, got, 1)
	require.Equal(t, held.ID, got[0].ID)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_due WHERE due <= now()`), "every due hint was taken")
}

// failingFinish is the PostgreSQL store with every Finish failing, as when
// the database is unreachable from one node only.
type failingFinish struct{ *postgres.Store }

func (failingFinish) Finish(context.Context, []store.Completion) ([]bool, error) {
	return nil, errors.New("finish: connection refused")
}

// A run whose end could not be recorded leaves its task running under its
// lease: the node must not drop that lease, so that it expires and another
// node takes the task over. The lease (10 s) outlasts the completer's
// retries, even with the renewals a loaded machine delays, so that the
// broken node does not take its own task over first.
func TestUnrecordedRunIsTakenOverAfterItsLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	broken, err := impl.NewServer(failingFinish{e.st}, impl.ServerConfig{Node: "broken", Registry: testRegistry(e.pool, "broken", 10*time.Second),
		PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	require.NoError(t, err)
	require.NoError(t, broken.Start(e.ctx))
	sub, err := broken.Submit(e.ctx, workReq(workKind, WorkParams{Key: "unrecorded"}))
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the run on the broken node", func() bool {
		return e.count(`SELECT count(*) FROM test_run WHERE node = 'broken'`) == 1
	})
	stop, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, broken.Stop(stop), "stop waits until the completer gives the run up")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE id = $1 AND status = 'running'`, string(sub.ID)))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_lease WHERE $1 = ANY(task_ids)`, string(sub.ID)), "the lease stays")

	srv := e.server("healthy", time.Second)
	task, err := srv.Await(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status)
	require.Equal(t, 2, task.Attempt, "the lost run counts")
}
