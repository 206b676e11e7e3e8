package impl_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/spi"
)

var localKind = api.Kind[KeyParams, struct{}]{ID: "test.local"}

// localEnv is a test's database with a server that runs only a blocking
// behavior, its runs logged.
type localEnv struct {
	*env
	srv *impl.Server
	log *runLog
}

func setupLocal(t *testing.T, mod ...func(*impl.ServerConfig)) *localEnv {
	t.Helper()
	e := setup(t)
	log := newRunLog()
	b := &blocker{kind: localKind, policy: spi.Policy{Lease: time.Minute}, log: log}
	reg := spi.NewRegistry()
	spi.MustRegister[KeyParams, struct{}](reg, b)
	srv := e.server("local", time.Minute, append([]func(*impl.ServerConfig){func(cfg *impl.ServerConfig) { cfg.Registry = reg }}, mod...)...)
	e.t.Cleanup(func() {
		// Blocked runs end only when cancelled: do not wait for them.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return &localEnv{env: e, srv: srv, log: log}
}

// submit submits the blocking task key through the server.
func (e *localEnv) submit(key string, opts ...api.SubmitOption) api.Submission {
	e.t.Helper()
	f, err := api.Submit(e.ctx, e.srv, localKind, KeyParams{Key: key}, opts...)
	require.NoError(e.t, err)
	return f.Submission()
}

// statuses returns the states the change feed recorded for task id, and
// whether its first two (scheduled, then running) came from one statement:
// a submit that started the task, not a claim after it.
func (e *env) statuses(id api.TaskID) ([]api.Status, bool) {
	e.t.Helper()
	events, _, err := e.st.Changes(e.ctx, api.ChangeFilter{TaskID: id})
	require.NoError(e.t, err)
	var out []api.Status
	for _, ev := range events {
		out = append(out, ev.Status)
	}
	return out, len(events) >= 2 && events[0].Seq == events[1].Seq
}

// waitStarted waits until task id's run started on the server.
func (e *localEnv) waitStarted(id api.TaskID) {
	e.t.Helper()
	waitFor(e.t, 20*time.Second, "the run of "+string(id), func() bool {
		started := false
		e.log.read(func(l *runLog) { started = l.starts[string(id)] > 0 })
		return started
	})
}

// requireHint checks that task id has a claim hint, parked or not.
func (e *localEnv) requireHint(id api.TaskID, parked bool) {
	e.t.Helper()
	require.Equal(e.t, 1, e.count(`SELECT count(*) FROM stint_due WHERE id = $1 AND parked = $2`, string(id), parked))
}

// requireClaimed checks that task id was left to the claimers: it was
// stored scheduled, and a claim (which records running apart from the
// submit) started it once unblock let it through.
func (e *localEnv) requireClaimed(sub api.Submission, unblock func()) {
	e.t.Helper()
	require.Equal(e.t, api.StatusScheduled, sub.Status)
	unblock()
	e.waitStarted(sub.ID)
	statuses, submitted := e.statuses(sub.ID)
	require.Equal(e.t, []api.Status{api.StatusScheduled, api.StatusRunning}, statuses)
	require.False(e.t, submitted, "running was recorded by the submit, not by a claim")
}

// submitLocal submits blocking tasks through the server until one starts
// at once, and returns its key and submission. A claim statement in flight (at the server's
// start, or a poll) holds every free slot, and a submit meanwhile leaves
// its task to the claimers: a few tries see one that does not.
func (e *localEnv) submitLocal(prefix string) (string, api.Submission) {
	e.t.Helper()
	for i := range 5 {
		key := prefix + "-" + strconv.Itoa(i)
		sub := e.submit(key)
		if sub.Status == api.StatusRunning {
			return key, sub
		}
		e.waitStarted(sub.ID)
	}
	e.t.Fatal("no submit started its task at once")
	return "", api.Submission{}
}

func TestLocalStartRunsASubmitWithoutAClaim(t *testing.T) {
	t.Parallel()
	e := setupLocal(t)
	key, sub := e.submitLocal("a")
	require.True(t, sub.Created)
	running := e.srv.Running()
	require.GreaterOrEqual(t, running, 1, "its run started with the submit")
	e.waitStarted(sub.ID)
	task, err := e.srv.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, "local", task.Node)
	require.Equal(t, 1, task.Attempt)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_lease WHERE node = 'local' AND $1 = ANY(task_ids)`, string(sub.ID)))
	require.Zero(t, e.count(`SELECT count(*) FROM stint_due`), "no claim hint")
	statuses, submitted := e.statuses(sub.ID)
	require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning}, statuses)
	require.True(t, submitted, "running was recorded by a claim, not by the submit")

	// A submit of the running task's id follows the resubmit rule: no
	// second run now, one after this one.
	again := e.submit(key)
	require.Equal(t, sub.ID, again.ID)
	require.False(t, again.Created)
	require.Equal(t, api.StatusRunning, again.Status)
	task, err = e.srv.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.True(t, task.Resubmit)
	require.Equal(t, running, e.srv.Running())
}

func TestLocalStartLeavesTheOthersToClaims(t *testing.T) {
	t.Parallel()
	t.Run("InACallersTransaction", func(t *testing.T) {
		t.Parallel()
		e := setupLocal(t)
		tx, err := e.pool.Begin(e.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(e.ctx) }()
		sub, err := e.srv.SubmitTx(e.ctx, tx, api.SubmitRequest{Behavior: localKind.ID, Params: []byte(`{"key":"tx"}`)})
		require.NoError(t, err)
		e.requireClaimed(sub, func() { require.NoError(t, tx.Commit(e.ctx)) })
	})
	t.Run("Delayed", func(t *testing.T) {
		t.Parallel()
		e := setupLocal(t)
		sub := e.submit("later", api.WithDelay(time.Hour))
		e.requireHint(sub.ID, false)
		e.requireClaimed(sub, func() {
			_, err := e.pool.Exec(e.ctx, `WITH t AS (UPDATE stint_task SET schedule_not_before = now() WHERE id = $1)
				UPDATE stint_due SET due = now() WHERE id = $1`, string(sub.ID))
			require.NoError(t, err)
		})
	})
	t.Run("PausedBehavior", func(t *testing.T) {
		t.Parallel()
		e := setupLocal(t)
		require.NoError(t, e.srv.Pause(e.ctx, localKind.ID))
		sub := e.submit("paused")
		e.requireHint(sub.ID, true)
		e.requireClaimed(sub, func() { require.NoError(t, e.srv.Resume(e.ctx, localKind.ID)) })
	})
	t.Run("HeldGroupKey", func(t *testing.T) {
		t.Parallel()
		e := setupLocal(t)
		require.NoError(t, e.srv.HoldGroup(e.ctx, "g"))
		sub := e.submit("held", api.WithGroupKey("g"))
		e.requireHint(sub.ID, true)
		e.requireClaimed(sub, func() { require.NoError(t, e.srv.ReleaseGroup(e.ctx, "g")) })
	})
	t.Run("FullNode", func(t *testing.T) {
		t.Parallel()
		e := setupLocal(t, func(cfg *impl.ServerConfig) { cfg.MaxWorkers = 1 })
		first := e.submit("first")
		e.waitStarted(first.ID)
		sub := e.submit("second")
		e.requireHint(sub.ID, false)
		// The removal halts the first run through the server's listener.
		waitFor(t, 10*time.Second, "the server to listen", func() bool { return impl.Listening(e.srv) })
		e.requireClaimed(sub, func() { require.NoError(t, e.srv.Remove(e.ctx, first.ID)) })
	})
	t.Run("Off", func(t *testing.T) {
		t.Parallel()
		e := setupLocal(t, func(cfg *impl.ServerConfig) { cfg.NoLocalStart = true })
		sub := e.submit("off")
		e.requireClaimed(sub, func() {})
	})
}

// seed is a behavior that runs nothing: as its server starts, it submits
// test.work tasks that block on their first attempt through that server,
// as a node's own submits, one by one until n of them started at once
// (see submitLocal for those that do not: each is waited for until a
// claim started it).
type seed struct{ n int }

func (seed) Kind() api.Kind[KeyParams, struct{}] {
	return api.Kind[KeyParams, struct{}]{ID: "test.seed"}
}
func (seed) TaskID(ids spi.IDs, p KeyParams) api.TaskID { return ids.Deterministic(p.Key) }
func (seed) Run(context.Context, spi.RunContext, KeyParams) (struct{}, error) {
	return struct{}{}, nil
}

func (s seed) Start(ctx context.Context, tasks api.Tasks) error {
	for i, started := 0, 0; started < s.n; i++ {
		if i == 10*s.n {
			return fmt.Errorf("%d of %d submits started their task at once", started, i)
		}
		sub, err := tasks.Submit(ctx, workReq(workKind, WorkParams{Key: fmt.Sprint("k", i), BlockFirst: true}))
		if err != nil {
			return err
		}
		if sub.Status == api.StatusRunning {
			started++
			continue
		}
		// Left to the claimers: the claim it woke holds the free slots
		// while in the database, and a submit meanwhile would be left to
		// them too. Wait for that claim to start it.
		deadline := time.Now().Add(30 * time.Second)
		for {
			task, err := tasks.Get(ctx, sub.ID)
			if err != nil {
				return err
			}
			if task.Status == api.StatusRunning {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("task %s left to the claimers did not start in 30 s", sub.ID)
			}
			if err := spi.Sleep(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

func TestLocalRunsAreRenewedAndTakenOverFromAKilledNode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// See TestKilledNodeTasksAreTakenOver for the leases.
	const childLease, survivorLease = 5 * time.Second, time.Minute
	const n = 5
	child := childtest.Start(t, envChildDSN+"="+e.dsn, envChildNode+"=doomed", envChildLease+"="+fmt.Sprint(childLease.Milliseconds()),
		envChildSubmit+"="+fmt.Sprint(n)) // returns once the child started, its submits done
	total := e.count(`SELECT count(*) FROM stint_task WHERE behavior = $1`, string(workKind.ID))
	waitFor(t, 30*time.Second, "the child to run every task", func() bool {
		return e.count(`SELECT count(*) FROM test_run WHERE node = 'doomed'`) >= total
	})
	require.Equal(t, n, e.count(`SELECT count(*) FROM stint_task t WHERE t.behavior = $1 AND t.node = 'doomed'
		AND EXISTS (SELECT 1 FROM stint_change c WHERE t.id = ANY(c.task_ids)
		    AND (SELECT count(*) FROM unnest(c.task_ids, c.statuses) AS e(id, status) WHERE e.id = t.id) = 2)`, string(workKind.ID)),
		"the tasks started with their submit: one statement recorded them scheduled and running")
	var expires time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT min(expires_at) FROM stint_lease WHERE node = 'doomed'`).Scan(&expires))
	waitFor(t, childLease, "a renewal of the child's leases", func() bool {
		return e.count(`SELECT count(*) FROM stint_lease WHERE node = 'doomed' AND expires_at <= $1`, expires) == 0
	})
	require.NoError(t, child.Kill())

	e.server("survivor", survivorLease)
	waitFor(t, childLease+30*time.Second, "the survivor to finish every task", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE status = 'success' AND node = 'survivor'`) == total
	})
	require.Equal(t, total, e.count(`SELECT count(*) FROM test_run WHERE node = 'doomed'`), "each task ran once on the doomed node")
	require.Equal(t, total, e.count(`SELECT count(*) FROM test_run WHERE node = 'survivor' AND attempt = 2`))
}
