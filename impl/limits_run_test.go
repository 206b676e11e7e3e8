package impl_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// waitStatus waits up to timeout for task id to have status.
func waitStatus(t *testing.T, c api.Tasks, id api.TaskID, status api.Status, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("task %s to be %s", id, status), func() bool {
		task, err := c.Get(context.Background(), id)
		require.NoError(t, err)
		return task.Status == status
	})
}

// maxOverlap returns the most spans of test_span (of behavior's tasks)
// that overlapped, in all and per key.
func (e *env) maxOverlap(prefix string) (int, map[string]int) {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT key, started, ended FROM test_span WHERE task_id LIKE $1 || '%'`, prefix)
	require.NoError(e.t, err)
	type edge struct {
		at    time.Time
		key   string
		delta int
	}
	var edges []edge
	for rows.Next() {
		var key string
		var s, en time.Time
		require.NoError(e.t, rows.Scan(&key, &s, &en))
		edges = append(edges, edge{s, key, 1}, edge{en, key, -1})
	}
	require.NoError(e.t, rows.Err())
	// Ends before starts at the same instant: a slot freed may be reused.
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].delta < edges[j].delta
	})
	total, most := 0, 0
	per, perMost := map[string]int{}, map[string]int{}
	for _, ed := range edges {
		total += ed.delta
		per[ed.key] += ed.delta
		most = max(most, total)
		perMost[ed.key] = max(perMost[ed.key], per[ed.key])
	}
	return most, perMost
}

// checkRateRule checks the starts (executed_at) of the tasks of behavior
// using limit l on key: over every window between two starts, no more
// than l.Limit + l.Limit*w/l.Period units (each task one unit).
func (e *env) checkRateRule(behavior api.BehaviorID, l api.RateLimit) int {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT executed_at FROM stint_task WHERE behavior = $1 AND executed_at IS NOT NULL ORDER BY executed_at`, string(behavior))
	require.NoError(e.t, err)
	var starts []time.Time
	for rows.Next() {
		var at time.Time
		require.NoError(e.t, rows.Scan(&at))
		starts = append(starts, at)
	}
	require.NoError(e.t, rows.Err())
	for i := range starts {
		for j := i; j < len(starts); j++ {
			w := starts[j].Sub(starts[i])
			allowed := float64(l.Limit) + float64(l.Limit)*w.Seconds()/l.Period.Seconds()
			require.LessOrEqual(e.t, float64(j-i+1), allowed+1e-9,
				"%d starts within %s, over the rule's %.2f", j-i+1, w, allowed)
		}
	}
	return len(starts)
}

// TestRateLimitHoldsTasksBackWithoutFailing runs tasks of one key over a
// rate limit of 2 per 500 ms on two nodes: they all succeed on their first
// attempt, a waiting one says what it waits on, and the starts keep to the
// rule.
func TestRateLimitHoldsTasksBackWithoutFailing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	l := api.RateLimit{Name: "test.rate", Limit: 2, Period: 500 * time.Millisecond}
	require.NoError(t, c.SetRateLimit(e.ctx, l))
	e.server("n1", time.Minute)
	e.server("n2", time.Minute)
	var reqs []api.SubmitRequest
	for i := range 8 {
		reqs = append(reqs, flowReq(ratedKind, FlowParams{ID: fmt.Sprintf("r%d", i), Customer: "acme", Limit: l.Name}))
	}
	subs, err := c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	sawWait := false
	waitFor(t, time.Minute, "every task to succeed", func() bool {
		done := 0
		for _, s := range subs {
			task, err := c.Get(e.ctx, s.ID)
			require.NoError(t, err)
			if w := task.Waiting; w != nil {
				require.Equal(t, api.WaitRateLimit, w.Reason)
				require.Equal(t, l.Name, w.Limit)
				require.Equal(t, "acme", w.Key)
				require.NotNil(t, w.Until)
				sawWait = true
			}
			if task.Status == api.StatusSuccess {
				require.Equal(t, 1, task.Attempt, "waiting counted no attempt")
				require.Nil(t, task.Waiting)
				done++
			}
		}
		return done == len(subs)
	})
	require.True(t, sawWait, "a task held back said so")
	require.Equal(t, len(subs), e.checkRateRule(ratedKind.ID, l))
	rl, err := c.RateLimits(e.ctx)
	require.NoError(t, err)
	require.Len(t, rl, 1)
	require.Zero(t, rl[0].Waiting)
}

// TestCapsHoldAcrossNodes runs tasks of a behavior capped at 3 across
// nodes and 1 per key on two nodes, then overrides the caps at runtime:
// no more ran at once than the caps in force.
func TestCapsHoldAcrossNodes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	e.server("n1", time.Minute)
	e.server("n2", time.Minute)
	submit := func(prefix string, n int, keys ...string) []api.Submission {
		var reqs []api.SubmitRequest
		for i := range n {
			reqs = append(reqs, flowReq(cappedKind, FlowParams{ID: fmt.Sprintf("%s%d", prefix, i), Customer: keys[i%len(keys)], SleepMS: 60}))
		}
		subs, err := c.SubmitMany(e.ctx, reqs)
		require.NoError(t, err)
		return subs
	}
	await := func(subs []api.Submission) {
		sawWait := false
		waitFor(t, time.Minute, "the tasks to succeed", func() bool {
			for _, s := range subs {
				task, err := c.Get(e.ctx, s.ID)
				require.NoError(t, err)
				if task.Waiting != nil {
					require.Equal(t, api.WaitConcurrency, task.Waiting.Reason)
					sawWait = true
				}
				if task.Status != api.StatusSuccess {
					return false
				}
			}
			return true
		})
		_ = sawWait // a wait is seen only if a Get falls in one
	}
	await(submit("a", 16, "k1", "k2", "k3", "k4", "k5", "k6"))
	most, per := e.maxOverlap("test.capped")
	require.LessOrEqual(t, most, 3)
	for k, n := range per {
		require.LessOrEqual(t, n, 1, "key %s", k)
	}

	_, err := e.pool.Exec(e.ctx, `TRUNCATE test_span`)
	require.NoError(t, err)
	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: cappedKind.ID, Max: 4}))
	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: cappedKind.ID, Key: "big", Max: 3}))
	await(submit("b", 16, "big", "big", "big", "small"))
	most, per = e.maxOverlap("test.capped")
	require.LessOrEqual(t, most, 4)
	require.LessOrEqual(t, per["big"], 3)
	require.LessOrEqual(t, per["small"], 1)
	require.Greater(t, per["big"], 1, "the override let the key run more than the policy's 1")
}

// TestRuntimeCapBindsLocalStartsAndPlainClaims caps a behavior without
// caps of its own at runtime, and submits from a server (whose own due
// tasks would start locally) and a client: no more run at once than the
// cap, whichever path started them.
func TestRuntimeCapBindsLocalStartsAndPlainClaims(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	srv := e.server("n1", time.Minute)
	e.server("n2", time.Minute)
	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: plainKind.ID, Max: 2}))
	require.NoError(t, srv.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: plainKind.ID, Key: "one", Max: 1}))
	var subs []api.Submission
	for i := range 12 {
		var tasks api.Tasks = c
		if i%2 == 0 {
			tasks = srv
		}
		key := []string{"one", "two"}[i%4/2]
		s, err := tasks.Submit(e.ctx, flowReq(plainKind, FlowParams{ID: fmt.Sprintf("p%d", i), Customer: key, SleepMS: 50}))
		require.NoError(t, err)
		subs = append(subs, s)
	}
	waitFor(t, time.Minute, "the tasks to succeed", func() bool {
		for _, s := range subs {
			task, err := c.Get(e.ctx, s.ID)
			require.NoError(t, err)
			if task.Status != api.StatusSuccess {
				return false
			}
		}
		return true
	})
	most, per := e.maxOverlap("test.plain")
	require.LessOrEqual(t, most, 2)
	require.LessOrEqual(t, per["one"], 1)

	// Removed, the caps no longer bind: the behavior runs as before.
	require.NoError(t, c.RemoveConcurrencyLimit(e.ctx, plainKind.ID, ""))
	require.NoError(t, c.RemoveConcurrencyLimit(e.ctx, plainKind.ID, "one"))
	_, err := api.Submit(e.ctx, srv, api.Kind[FlowParams, struct{}](plainKind), FlowParams{ID: "after"})
	require.NoError(t, err)
}

// TestFairShareServesAKeyBehindABacklog queues a backlog of one key on a
// node that runs one task at a time, then one task of another key: the
// other key's task starts after at most one more of the backlog, not
// after the whole backlog.
func TestFairShareServesAKeyBehindABacklog(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	var reqs []api.SubmitRequest
	for i := range 40 {
		reqs = append(reqs, flowReq(fairKind, FlowParams{ID: fmt.Sprintf("big%02d", i), Customer: "big", SleepMS: 20}))
	}
	_, err := c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	e.server("n1", time.Minute, func(cfg *impl.ServerConfig) { cfg.MaxWorkers = 1 })
	waitFor(t, time.Minute, "the backlog to start", func() bool {
		return e.count(`SELECT count(*) FROM test_span`) >= 3
	})
	small, err := c.Submit(e.ctx, flowReq(fairKind, FlowParams{ID: "small", Customer: "small"}))
	require.NoError(t, err)
	before := e.count(`SELECT count(*) FROM test_span`)
	waitStatus(t, c, small.ID, api.StatusSuccess, time.Minute)
	var order []string
	rows, err := e.pool.Query(e.ctx, `SELECT task_id FROM test_span ORDER BY started`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		order = append(order, id)
	}
	require.NoError(t, rows.Err())
	at := slices.Index(order, string(small.ID))
	require.GreaterOrEqual(t, at, 0)
	require.LessOrEqual(t, at, before+1, "the small key waited for %d of the backlog: %v", at-before, order)
	require.Less(t, at, 39, "the backlog had not drained")
}

// TestGetSaysATaskWaitsOnACap fills a cap set at runtime with a running
// task and checks that a due task of the behavior says it waits on the
// cap, in Get and List, until the cap frees.
func TestGetSaysATaskWaitsOnACap(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	e.server("n1", time.Minute)
	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: plainKind.ID, Key: "k", Max: 1}))
	first, err := c.Submit(e.ctx, flowReq(plainKind, FlowParams{ID: "first", Customer: "k", Gate: "open"}))
	require.NoError(t, err)
	waitStatus(t, c, first.ID, api.StatusRunning, time.Minute)
	second, err := c.Submit(e.ctx, flowReq(plainKind, FlowParams{ID: "second", Customer: "k"}))
	require.NoError(t, err)
	task, err := c.Get(e.ctx, second.ID)
	require.NoError(t, err)
	require.Equal(t, &api.Wait{Reason: api.WaitConcurrency, Limit: string(plainKind.ID), Key: "k"}, task.Waiting)
	page, err := c.List(e.ctx, api.Filter{Behavior: plainKind.ID})
	require.NoError(t, err)
	waits := 0
	for _, task := range page.Tasks {
		if task.Waiting != nil {
			waits++
			require.Equal(t, second.ID, task.ID)
		}
	}
	require.Equal(t, 1, waits)
	_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id) VALUES ('open')`)
	require.NoError(t, err)
	waitFor(t, time.Minute, "the second task to succeed", func() bool {
		task, err := c.Get(e.ctx, second.ID)
		require.NoError(t, err)
		return task.Status == api.StatusSuccess && task.Waiting == nil
	})
}

// TestTelemetryCountsStartsDelayedByALimit runs tasks over a rate limit of
// 1 per 200 ms on a node with a meter: every task after the first was
// delayed at least once, and the counter says so.
func TestTelemetryCountsStartsDelayedByALimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	require.NoError(t, c.SetRateLimit(e.ctx, api.RateLimit{Name: "slow", Limit: 1, Period: 200 * time.Millisecond}))
	var reqs []api.SubmitRequest
	for i := range 4 {
		reqs = append(reqs, flowReq(ratedKind, FlowParams{ID: fmt.Sprintf("d%d", i), Customer: "x", Limit: "slow"}))
	}
	subs, err := c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	e.server("n1", time.Minute, func(cfg *impl.ServerConfig) { cfg.MeterProvider = mp })
	for _, s := range subs {
		_, err := c.Await(e.ctx, s.ID)
		require.NoError(t, err)
	}
	sums, _ := collectMetrics(t, reader)
	require.GreaterOrEqual(t, sums["stint.task.delays"], int64(3))
}

// TestRolesOperateAndEnforceLimits sets, lists and removes limits and
// submits a rate-limited task as the stint_client role, and runs it on a
// node connected as the stint_node role.
func TestRolesOperateAndEnforceLimits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.pool.Exec(e.ctx, `GRANT SELECT, INSERT, UPDATE ON test_span TO stint_node`)
	require.NoError(t, err)
	_, c := e.clientAs("stint_client")

	require.NoError(t, c.SetRateLimit(e.ctx, api.RateLimit{Name: "roles", Limit: 2, Period: time.Second}))
	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: ratedKind.ID, Max: 2}))
	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: ratedKind.ID, Key: "k", Max: 1, Weight: 2}))
	sub, err := c.Submit(e.ctx, flowReq(ratedKind, FlowParams{ID: "roles", Customer: "k", Limit: "roles"}))
	require.NoError(t, err)
	_, err = c.Submit(e.ctx, flowReq(ratedKind, FlowParams{ID: "declared", Customer: "k", Limit: declaredLimit.Name}))
	require.NoError(t, err, "the client role stores a declared limit")

	nodeStore, err := postgres.Open(e.ctx, e.asRole("stint_node"))
	require.NoError(t, err)
	t.Cleanup(nodeStore.Close)
	srv, err := impl.NewServer(nodeStore, impl.ServerConfig{Node: "roles", Registry: testRegistry(nodeStore.Pool(), "roles", time.Minute),
		PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, srv.Start(e.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	_, err = c.Await(e.ctx, sub.ID)
	require.NoError(t, err)

	rl, err := c.RateLimits(e.ctx)
	require.NoError(t, err)
	require.Len(t, rl, 2)
	cl, err := c.ConcurrencyLimits(e.ctx)
	require.NoError(t, err)
	require.Len(t, cl, 2)
	require.NoError(t, c.RemoveRateLimit(e.ctx, "roles"))
	require.NoError(t, c.RemoveConcurrencyLimit(e.ctx, ratedKind.ID, ""))
	require.NoError(t, c.RemoveConcurrencyLimit(e.ctx, ratedKind.ID, "k"))
}

// TestChangedRateLimitFreesItsWaitingTasks holds tasks back under a limit
// of one an hour, then raises the limit (the tasks start under the new
// rule) and removes another (its tasks start unlimited): a change applies
// at once, not when the old rule would have admitted the task.
func TestChangedRateLimitFreesItsWaitingTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	e.server("n1", time.Hour)
	for _, change := range []struct {
		name  string
		apply func(name string) error
	}{
		{"raised", func(name string) error {
			return c.SetRateLimit(e.ctx, api.RateLimit{Name: name, Limit: 1000, Period: time.Second})
		}},
		{"removed", func(name string) error { return c.RemoveRateLimit(e.ctx, name) }},
	} {
		l := api.RateLimit{Name: "test." + change.name, Limit: 1, Period: time.Hour}
		require.NoError(t, c.SetRateLimit(e.ctx, l))
		subs, err := c.SubmitMany(e.ctx, []api.SubmitRequest{
			flowReq(ratedKind, FlowParams{ID: change.name + "-1", Customer: "acme", Limit: l.Name}),
			flowReq(ratedKind, FlowParams{ID: change.name + "-2", Customer: "acme", Limit: l.Name}),
		})
		require.NoError(t, err)
		var waiting api.TaskID
		waitFor(t, time.Minute, "one task to run and the other to wait", func() bool {
			done := 0
			for _, s := range subs {
				task, err := c.Get(e.ctx, s.ID)
				require.NoError(t, err)
				if task.Status == api.StatusSuccess {
					done++
				} else if task.Waiting != nil {
					waiting = s.ID
				}
			}
			return done == 1 && waiting != ""
		})
		require.NoError(t, change.apply(l.Name))
		waitStatus(t, c, waiting, api.StatusSuccess, time.Minute)
	}
}

// TestAFullCapFreedOnOneNodeWakesAnother holds a key at its cap with a
// run on n1, has n2's claim find the key full, stops n1's claimers and
// lets the run end: n1, told by n2 that the cap held its claim back, wakes
// the claimers of every node, and n2 starts the waiting task at once. Both
// nodes poll once a minute, so without the wake the task would wait for
// n2's poll. (A node wakes the others only for caps that claims found
// full lately: a cap that never binds costs no notification per batch.)
func TestAFullCapFreedOnOneNodeWakesAnother(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	slow := func(cfg *impl.ServerConfig) { cfg.PollInterval = time.Minute }
	n1 := e.server("n1", time.Minute, slow, func(cfg *impl.ServerConfig) { cfg.MaxWorkers = 1 })
	first, err := c.Submit(e.ctx, flowReq(cappedKind, FlowParams{ID: "first", Customer: "k", Gate: "open"}))
	require.NoError(t, err)
	waitStatus(t, c, first.ID, api.StatusRunning, time.Minute)

	listener, err := e.pool.Acquire(e.ctx)
	require.NoError(t, err)
	defer listener.Release()
	_, err = listener.Exec(e.ctx, `LISTEN `+store.ChannelCapped)
	require.NoError(t, err)
	e.server("n2", time.Minute, slow)
	second, err := c.Submit(e.ctx, flowReq(cappedKind, FlowParams{ID: "second", Customer: "k"}))
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	n, err := listener.Conn().WaitForNotification(wctx)
	require.NoError(t, err, "n2's claim finds the key at its cap and says so")
	require.Equal(t, string(cappedKind.ID), n.Payload)

	stopped := make(chan error, 1)
	go func() { stopped <- n1.Stop(e.ctx) }()
	select {
	case <-impl.ClaimersDone(n1):
	case <-wctx.Done():
		t.Fatal("n1's claimers did not stop")
	}
	_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id, step) VALUES ('open', 1)`)
	require.NoError(t, err)
	require.NoError(t, <-stopped)
	waitStatus(t, c, second.ID, api.StatusSuccess, 20*time.Second) // well before n2's poll
	var node string
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT node FROM test_span WHERE task_id = $1`, string(second.ID)).Scan(&node))
	require.Equal(t, "n2", node)
}

// TestAReturnedRunFreesItsKeyBeforeItsFinishIsRecorded: once a claim
// found a group key at its cap, the return of a run of that key starts
// the next task of the key on its node without waiting for the run's end
// to be recorded (here held back by a lock on its task's row), or for a
// poll.
func TestAReturnedRunFreesItsKeyBeforeItsFinishIsRecorded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	// Both wait before the node starts: its first claim takes the first
	// (the second's priority comes later) and finds the key at its cap.
	first, err := c.Submit(e.ctx, flowReq(cappedKind, FlowParams{ID: "first", Customer: "k", Gate: "open"}))
	require.NoError(t, err)
	later := flowReq(cappedKind, FlowParams{ID: "second", Customer: "k"})
	api.WithPriority(9)(&later)
	second, err := c.Submit(e.ctx, later)
	require.NoError(t, err)
	srv := e.server("n1", time.Minute, func(cfg *impl.ServerConfig) { cfg.PollInterval = time.Minute })
	waitStatus(t, c, first.ID, api.StatusRunning, time.Minute)
	// Listening, the node wakes its claimers (it may have missed
	// notifications): the claim that follows finds the key full too.
	waitFor(t, 10*time.Second, "the server to listen", func() bool { return impl.Listening(srv) })

	lock, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer lock.Rollback(e.ctx) //nolint:errcheck // released below; a no-op then
	_, err = lock.Exec(e.ctx, `SET LOCAL idle_in_transaction_session_timeout = 0`)
	require.NoError(t, err)
	_, err = lock.Exec(e.ctx, `SELECT 1 FROM stint_task WHERE id = $1 FOR UPDATE`, string(first.ID))
	require.NoError(t, err)
	task, err := c.Get(e.ctx, second.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status, "the key's cap holds the second back")
	_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id, step) VALUES ('open', 1)`)
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the second task to run before the first's end is recorded", func() bool {
		var ran int
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT count(*) FROM test_span WHERE task_id = $1`, string(second.ID)).Scan(&ran))
		return ran > 0
	})
	task, err = c.Get(e.ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, task.Status, "the first's end is not recorded yet")
	require.NoError(t, lock.Rollback(e.ctx))
	waitStatus(t, c, first.ID, api.StatusSuccess, time.Minute)
	waitStatus(t, c, second.ID, api.StatusSuccess, time.Minute)
}
