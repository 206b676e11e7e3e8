package cleanup

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// WorkParams are the params of the test behaviors.
type WorkParams struct {
	Key  string `json:"key"`
	Fail bool   `json:"fail,omitempty"`
}

// work is a test behavior with its own retention.
type work struct {
	id                api.BehaviorID
	retention, failed time.Duration
}

func (w work) Kind() api.Kind[WorkParams, string]          { return api.Kind[WorkParams, string]{ID: w.id} }
func (w work) TaskID(ids spi.IDs, p WorkParams) api.TaskID { return ids.Deterministic(p.Key) }
func (w work) Policy() spi.Policy {
	return spi.Policy{Retention: w.retention, FailureRetention: w.failed, MaxAttempts: 1}
}
func (w work) Run(_ context.Context, _ spi.RunContext, p WorkParams) (string, error) {
	if p.Fail {
		return "", api.Permanent("planned", "planned failure")
	}
	return p.Key, nil
}

// env is one test's database and store.
type env struct {
	t   *testing.T
	ctx context.Context
	dsn string
	st  *postgres.Store
}

func setup(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	dsn := pgtest.New(t)
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	return &env{t: t, ctx: ctx, dsn: dsn, st: st}
}

// registry holds test.short (successes kept briefly, failures long),
// test.long (the other way round) and test.fast (defaults), and the
// cleanup behavior with cfg when withCleanup.
func (e *env) registry(withCleanup bool, cfg Config) *spi.Registry {
	reg := spi.NewRegistry()
	spi.MustRegister[WorkParams, string](reg, work{id: "test.short", retention: time.Millisecond, failed: time.Hour})
	spi.MustRegister[WorkParams, string](reg, work{id: "test.long", retention: time.Hour, failed: time.Millisecond})
	spi.MustRegister[WorkParams, string](reg, work{id: "test.fast"})
	if withCleanup {
		require.NoError(e.t, Register(reg, e.st, cfg))
	}
	return reg
}

func (e *env) server(node string, reg *spi.Registry) *impl.Server {
	e.t.Helper()
	srv, err := impl.NewServer(e.st, impl.ServerConfig{Node: node, Registry: reg, PollInterval: 50 * time.Millisecond,
		AwaitPollInterval: 50 * time.Millisecond, NodeHeartbeat: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(e.t, err)
	require.NoError(e.t, srv.Start(e.ctx))
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return srv
}

// count counts the tasks matching f through the task API.
func (e *env) count(tasks api.Tasks, f api.Filter) int {
	e.t.Helper()
	n := 0
	f.Limit = 1000
	for {
		page, err := tasks.List(e.ctx, f)
		require.NoError(e.t, err)
		n += len(page.Tasks)
		if page.Next == "" {
			return n
		}
		f.After = page.Next
	}
}

// finished counts the tasks that finished for good.
func (e *env) finished(tasks api.Tasks) int {
	e.t.Helper()
	n := 0
	f := api.Filter{Limit: 1000}
	for {
		page, err := tasks.List(e.ctx, f)
		require.NoError(e.t, err)
		for _, t := range page.Tasks {
			if t.Finished() {
				n++
			}
		}
		if page.Next == "" {
			return n
		}
		f.After = page.Next
	}
}

// waitFor polls cond every 10 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func req(b api.BehaviorID, key string, fail bool) api.SubmitRequest {
	return api.SubmitRequest{Behavior: b, Params: fmt.Appendf(nil, `{"key":%q,"fail":%v}`, key, fail)}
}

func TestRetentionIsHonoredPerBehaviorAndStatus(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := e.registry(false, Config{})
	srv := e.server("node", reg)
	var reqs []api.SubmitRequest
	for i := range 30 {
		for _, b := range []api.BehaviorID{"test.short", "test.long", "test.fast"} {
			reqs = append(reqs, req(b, fmt.Sprint("ok-", i), false), req(b, fmt.Sprint("bad-", i), true))
		}
	}
	_, err := srv.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	// Not finished, so never deleted: a task due in an hour.
	_, err = srv.Submit(e.ctx, api.SubmitRequest{Behavior: "test.short", Params: []byte(`{"key":"later"}`), Delay: time.Hour})
	require.NoError(t, err)
	waitFor(t, time.Minute, "every task to finish", func() bool { return e.finished(srv) == len(reqs) })

	c := New(e.st, reg, Config{BatchSize: 7})
	res, err := c.Run(e.ctx, nil, Params{})
	require.NoError(t, err)
	t.Logf("cleanup: %+v", res)
	require.Equal(t, map[string]int{"test.short/success": 30, "test.long/failure": 30}, res.Deleted)
	require.Equal(t, 60, res.DeletedTotal)
	require.GreaterOrEqual(t, res.Batches, 60/7, "small batches")

	left := func(behavior, status string) int {
		return e.count(srv, api.Filter{Behavior: api.BehaviorID(behavior), Status: api.Status(status)})
	}
	require.Zero(t, left("test.short", "success"))
	require.Equal(t, 30, left("test.short", "failure"), "failures of test.short are kept for an hour")
	require.Equal(t, 30, left("test.long", "success"), "successes of test.long are kept for an hour")
	require.Zero(t, left("test.long", "failure"))
	require.Equal(t, 60, e.count(srv, api.Filter{Behavior: "test.fast"}), "default retention: 7 and 30 days")
	require.Equal(t, 1, left("test.short", "scheduled"), "a task that has not finished is never deleted")

	res, err = c.Run(e.ctx, nil, Params{})
	require.NoError(t, err)
	require.Zero(t, res.DeletedTotal, "a second run finds nothing more")
}

func TestOneCleanupAtATimeAcrossNodes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var running, most, runs atomic.Int32
	cfg := Config{Interval: 100 * time.Millisecond, Lease: time.Second}
	cfg.observe = func(start bool) {
		if !start {
			running.Add(-1)
			runs.Add(1)
			return
		}
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(30 * time.Millisecond) // widen the window a second run would overlap
	}

	var servers []*impl.Server
	for _, node := range []string{"a", "b", "c"} {
		servers = append(servers, e.server(node, e.registry(true, cfg)))
	}
	page, err := servers[0].List(e.ctx, api.Filter{Behavior: BehaviorID})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 1, "three servers submitted one task")
	require.Equal(t, TaskID(), page.Tasks[0].ID)
	deadline := time.Now().Add(time.Minute)
	for runs.Load() < 20 {
		if time.Now().After(deadline) {
			task, err := servers[0].Get(e.ctx, TaskID())
			t.Fatalf("timed out waiting for 20 cleanup runs: %d runs; the task: %+v (%v)", runs.Load(), task, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.EqualValues(t, 1, most.Load(), "never two cleanup runs at once")

	// Between two runs (it runs every 100 ms) the task is a success that is
	// due again.
	var task api.Task
	waitFor(t, 10*time.Second, "the cleanup task between runs", func() bool {
		task, err = servers[0].Get(e.ctx, TaskID())
		require.NoError(t, err)
		return task.Status == api.StatusSuccess
	})
	require.NotNil(t, task.ScheduleNotBefore, "the cleanup reschedules itself")
	require.Zero(t, task.Errors)
}

// finishedTasks submits n tasks of test.short with ids from first, and
// claims and finishes (successfully) tasks of test.short until it claimed
// n or none is left, through the store.
func (e *env) finishedTasks(first, n int) error {
	tasks := make([]store.NewTask, n)
	for j := range tasks {
		tasks[j] = store.NewTask{ID: api.TaskID(fmt.Sprintf("old-%06d", first+j)), Behavior: "test.short", Params: []byte(`{"key":"x"}`), Priority: 5}
	}
	if _, err := e.st.Submit(e.ctx, tasks); err != nil {
		return err
	}
	for left := n; left > 0; {
		claimed, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: "filler", Limit: left,
			Behaviors: []store.BehaviorLease{{Behavior: "test.short", Lease: time.Minute}}})
		if err != nil {
			return err
		}
		if len(claimed) == 0 {
			return nil // the other filler claimed the rest
		}
		comps := make([]store.Completion, len(claimed))
		for j, c := range claimed {
			comps[j] = store.Completion{LeaseRef: c.LeaseRef, Status: api.StatusSuccess, Result: []byte(`"x"`)}
		}
		if _, err := e.st.Finish(e.ctx, comps); err != nil {
			return err
		}
		left -= len(claimed)
	}
	return nil
}

func TestLargeCleanupNeverBlocksTheNode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const (
		finished = 200_000
		chunk    = 20_000
	)
	// 200,000 tasks that succeeded, made through the store: submitted,
	// claimed and finished a chunk at a time, two chunks at once.
	start := time.Now()
	var fill sync.WaitGroup
	errs := make(chan error, finished/chunk)
	for w := range 2 {
		fill.Go(func() {
			for i := w * chunk; i < finished; i += 2 * chunk {
				errs <- e.finishedTasks(i, chunk)
			}
		})
	}
	fill.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("made %d finished tasks in %s", finished, time.Since(start).Round(time.Millisecond))
	// Making them left 400,000 dead row versions, also in the claim index:
	// vacuum, so that the claims measured below do not wade through them
	// (autovacuum would, at a time of its choosing).
	_, err := e.st.Pool().Exec(e.ctx, `VACUUM (ANALYZE) stint_task`)
	require.NoError(t, err)

	reg := e.registry(false, Config{})
	srv := e.server("node", reg)
	// latency submits one task at a time and returns the claim latencies
	// (claimed - created) on the database clock, until stop is closed or
	// n were measured.
	measure := func(prefix string, n int, stop <-chan struct{}) []time.Duration {
		var out []time.Duration
		for i := 0; i < n; i++ {
			select {
			case <-stop:
				return out
			default:
			}
			id := api.TaskID(fmt.Sprintf("%s-%d", prefix, i))
			_, err := srv.Submit(e.ctx, api.SubmitRequest{Behavior: "test.fast", ID: id, Params: fmt.Appendf(nil, `{"key":%q}`, id)})
			require.NoError(t, err)
			task, err := srv.Await(e.ctx, id)
			require.NoError(t, err)
			require.NotNil(t, task.ExecutedAt)
			out = append(out, task.ExecutedAt.Sub(task.CreatedAt))
		}
		return out
	}
	before := measure("before", 60, nil)

	// Batches of 250 (the default is 1,000): more, shorter statements,
	// and a cleanup long enough to measure claims during it.
	c := New(e.st, reg, Config{BatchSize: 250})
	stop := make(chan struct{})
	var during []time.Duration
	var blocked []string
	var wg sync.WaitGroup
	wg.Go(func() { during = measure("during", 1_000_000, stop) })
	wg.Go(func() { blocked = blockedByDeletes(e.ctx, e.st, stop) })
	cleanStart := time.Now()
	res, err := c.Run(e.ctx, nil, Params{})
	took := time.Since(cleanStart)
	close(stop)
	wg.Wait()
	require.NoError(t, err)
	require.Equal(t, finished, res.Deleted["test.short/success"])
	require.Zero(t, e.count(srv, api.Filter{Behavior: "test.short"}))
	after := measure("after", 60, nil)

	p := func(ds []time.Duration, q float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(int(float64(len(s))*q), len(s)-1)]
	}
	t.Logf("cleanup deleted %d tasks in %d batches in %s; the longest delete statement took %s",
		res.DeletedTotal, res.Batches, took.Round(time.Millisecond), res.LongestBatch.Round(time.Millisecond))
	t.Logf("claim latency before the cleanup: p50 %s p95 %s max %s (%d tasks)", p(before, .5), p(before, .95), p(before, 1), len(before))
	t.Logf("claim latency during the cleanup: p50 %s p95 %s max %s (%d tasks)", p(during, .5), p(during, .95), p(during, 1), len(during))
	t.Logf("claim latency after the cleanup:  p50 %s p95 %s max %s (%d tasks)", p(after, .5), p(after, .95), p(after, 1), len(after))
	require.GreaterOrEqual(t, len(during), 10, "tasks ran while the cleanup deleted")
	// No statement of the node (submit, claim, finish, renew) ever waited
	// for a lock a delete held. Latencies are logged above, not asserted:
	// on a shared machine they measure the machine as much as the locks.
	require.Empty(t, blocked, "statements that waited for a cleanup delete's locks")
}

// blockedByDeletes watches the database until stop is closed and returns
// the statements it saw waiting for a lock held by a statement deleting
// from stint_task.
func blockedByDeletes(ctx context.Context, st *postgres.Store, stop <-chan struct{}) []string {
	var out []string
	for {
		select {
		case <-stop:
			return out
		case <-ctx.Done():
			return out
		default:
		}
		// One snapshot of pg_stat_activity says w waited for a lock while b
		// ran a delete; pg_blocking_pids, read live, that b held it. The
		// pattern is built in the statement so that this statement's own
		// text (the last of an idle pooled connection) never matches it.
		rows, err := st.Pool().Query(ctx, `
			SELECT w.query FROM pg_stat_activity w JOIN pg_stat_activity b ON b.pid = ANY(pg_blocking_pids(w.pid))
			WHERE w.state = 'active' AND w.wait_event_type = 'Lock' AND b.state = 'active'
			  AND b.query ~ ('DELETE FROM ' || 'stint_task') AND w.query !~ ('DELETE FROM ' || 'stint_task')`)
		if err != nil {
			return append(out, "watching locks: "+err.Error())
		}
		waiting, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return append(out, "watching locks: "+err.Error())
		}
		out = append(out, waiting...)
	}
}
