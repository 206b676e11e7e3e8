package impl_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/syncbuf"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// KeyParams are the params of the behaviors of this file.
type KeyParams struct {
	Key string `json:"key" validate:"required,max=100"`
}

// runLog records the runs of a blocking behavior: how many run at once,
// every start, and how each run ended.
type runLog struct {
	mu      sync.Mutex
	cur     int            // runs inside Run now
	low     int            // lowest cur since watching began, -1 before
	high    int            // highest cur ever
	starts  map[string]int // starts per task
	ends    []error        // the cause of each ended run, in order
	attempt map[int]error  // the cause per attempt, once ended
	watch   bool
}

func newRunLog() *runLog {
	return &runLog{low: -1, starts: map[string]int{}, attempt: map[int]error{}}
}

func (l *runLog) start(id api.TaskID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cur++
	l.high = max(l.high, l.cur)
	l.starts[string(id)]++
}

func (l *runLog) end(attempt int, cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cur--
	if l.watch && (l.low < 0 || l.cur < l.low) {
		l.low = l.cur
	}
	l.ends = append(l.ends, cause)
	l.attempt[attempt] = cause
}

// read calls fn with the log locked.
func (l *runLog) read(fn func(l *runLog)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn(l)
}

// blocker is a behavior whose runs block until their context ends, logged
// in log.
type blocker struct {
	kind   api.Kind[KeyParams, struct{}]
	policy spi.Policy
	log    *runLog
}

func (b *blocker) Kind() api.Kind[KeyParams, struct{}]        { return b.kind }
func (b *blocker) TaskID(ids spi.IDs, p KeyParams) api.TaskID { return ids.Deterministic(p.Key) }
func (b *blocker) Policy() spi.Policy                         { return b.policy }
func (b *blocker) Run(ctx context.Context, rc spi.RunContext, p KeyParams) (struct{}, error) {
	b.log.start(rc.TaskID())
	<-ctx.Done()
	cause := context.Cause(ctx)
	b.log.end(rc.Attempt(), cause)
	return struct{}{}, cause
}

// blockerServer starts a server that runs only b, on a registry of its own.
func (e *env) blockerServer(node string, b *blocker) *impl.Server {
	e.t.Helper()
	reg := spi.NewRegistry()
	spi.MustRegister[KeyParams, struct{}](reg, b)
	srv := e.server(node, time.Minute, func(cfg *impl.ServerConfig) { cfg.Registry = reg })
	e.t.Cleanup(func() {
		// Blocked runs end only when cancelled: do not wait for them.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return srv
}

func (e *env) submitKeys(srv api.Tasks, behavior api.BehaviorID, keys ...string) []api.TaskID {
	e.t.Helper()
	ids := make([]api.TaskID, len(keys))
	for i, k := range keys {
		sub, err := srv.Submit(e.ctx, api.SubmitRequest{Behavior: behavior, Params: fmt.Appendf(nil, `{"key":%q}`, k)})
		require.NoError(e.t, err)
		ids[i] = sub.ID
	}
	return ids
}

// TestRotationKeepsEverySlotBusy checks the replicator's rule: each
// rotation stops at most MaxChurn runs and starts as many waiting tasks in
// their place, so a node with a backlog runs MaxRunning tasks except in
// the moment between a stop and its start, and every task gets its turn.
func TestRotationKeepsEverySlotBusy(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const maxRunning, maxChurn, tasks = 4, 2, 12
	rot := &spi.Rotation{MaxRunning: maxRunning, MaxChurn: maxChurn, Interval: 400 * time.Millisecond, MinRunTime: time.Millisecond}
	b := &blocker{kind: api.Kind[KeyParams, struct{}]{ID: "test.rotated"}, policy: spi.Policy{Rotation: rot}, log: newRunLog()}
	srv := e.blockerServer("node", b)
	keys := make([]string, tasks)
	for i := range keys {
		keys[i] = fmt.Sprintf("rot-%02d", i)
	}
	e.submitKeys(srv, b.kind.ID, keys...)

	full := func() bool {
		n := 0
		b.log.read(func(l *runLog) { n = l.cur })
		return n == maxRunning
	}
	// The first claim fills the free slots; no rotation is needed for it.
	waitFor(t, 10*time.Second, "MaxRunning runs", full)
	b.log.read(func(l *runLog) { l.watch = true })
	mostInDB := 0
	waitFor(t, 60*time.Second, "every task to get a turn", func() bool {
		mostInDB = max(mostInDB, e.count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND status = 'running'`, b.kind.ID))
		n := 0
		b.log.read(func(l *runLog) { n = len(l.starts) })
		return n == tasks
	})
	// And the rotations go on at MaxRunning: three more of them, each
	// followed by a full node before the next.
	var stops int
	b.log.read(func(l *runLog) { stops = len(l.ends) })
	for range 3 {
		waitFor(t, 10*rot.Interval, "a rotation", func() bool {
			n := 0
			b.log.read(func(l *runLog) { n = len(l.ends) })
			return n > stops
		})
		waitFor(t, 10*rot.Interval, "the stopped runs' slots to be filled again", full)
		b.log.read(func(l *runLog) { stops = len(l.ends) })
	}
	b.log.read(func(l *runLog) {
		require.LessOrEqual(t, l.high, maxRunning, "never more than MaxRunning at once")
		require.GreaterOrEqual(t, l.low, maxRunning-maxChurn, "a rotation stops at most MaxChurn runs before their replacements start")
		for _, cause := range l.ends {
			require.ErrorIs(t, cause, spi.ErrPreempted)
		}
	})
	require.LessOrEqual(t, mostInDB, maxRunning)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND attempt > 1`, b.kind.ID), "a preempted run is not an attempt")
}

// TestTakeoverSkipsTasksLockedByAStalledNode: a node stalled inside its own
// transaction holds a row lock on a task whose lease expired. The healthy
// node keeps renewing its own leases, takes over the other expired tasks,
// and takes over the locked one once the lock is gone.
func TestTakeoverSkipsTasksLockedByAStalledNode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const lease = 2 * time.Second
	srv := e.server("healthy", lease, func(cfg *impl.ServerConfig) { cfg.Behaviors = []api.BehaviorID{workKind.ID} })
	own, err := srv.Submit(e.ctx, workReq(workKind, WorkParams{Key: "own", BlockFirst: true}))
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the healthy node's run", func() bool { return srv.Running() == 1 })

	// Three tasks claimed, one claim each, by a node that then stalls.
	lost := e.submitKeysAs(srv, shareKind, "stalled-a", "stalled-b", "stalled-c")
	refs := make([]store.LeaseRef, len(lost))
	for i := range lost {
		claimed, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: "stalled", Limit: 1,
			Behaviors: []store.BehaviorLease{{Behavior: shareKind.ID, Lease: time.Hour}}})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		refs[i] = claimed[0].LeaseRef
	}
	locked := refs[0].ID
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(e.ctx, `SELECT 1 FROM stint_task WHERE id = $1 FOR UPDATE`, string(locked))
	require.NoError(t, err)
	// Only now do the stalled node's leases expire.
	_, err = e.pool.Exec(e.ctx, `UPDATE stint_lease SET expires_at = now() WHERE node = 'stalled'`)
	require.NoError(t, err)

	status := func(id api.TaskID) api.Status {
		var s api.Status
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT status FROM stint_task WHERE id = $1`, string(id)).Scan(&s))
		return s
	}
	waitFor(t, 10*lease, "the unlocked expired tasks to be taken over", func() bool {
		return status(refs[1].ID) == api.StatusScheduled && status(refs[2].ID) == api.StatusScheduled
	})
	// The healthy node's lease keeps moving while the lock is held: it is
	// renewed past three lease durations from now.
	var start time.Time
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT now()`).Scan(&start))
	waitFor(t, 10*lease, "the healthy node to renew its lease", func() bool {
		var renewed bool
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT l.expires_at > $2::timestamptz + $3 * interval '1 millisecond'
			FROM stint_task t JOIN stint_lease l ON l.lease = t.lease WHERE t.id = $1`,
			string(own.ID), start, 3*lease.Milliseconds()).Scan(&renewed))
		return renewed
	})
	require.Equal(t, api.StatusRunning, status(locked), "a locked task is skipped, not waited for")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(own.ID)), "the healthy run was never lost")
	require.Equal(t, 1, srv.Running())

	require.NoError(t, tx.Rollback(e.ctx))
	waitFor(t, 10*lease, "the formerly locked task to be taken over", func() bool { return status(locked) == api.StatusScheduled })
	require.Zero(t, e.count(`SELECT count(*) FROM stint_lease WHERE node = 'stalled'`), "the stalled node's leases are dropped")
	// Its own run blocks until cancelled: do not wait for it, beyond
	// the half of Stop's time kept for its release (see stopReserve).
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, srv.Stop(ctx))
}

func (e *env) submitKeysAs(tasks api.Tasks, kind api.Kind[WorkParams, WorkResult], keys ...string) []api.TaskID {
	e.t.Helper()
	ids := make([]api.TaskID, len(keys))
	for i, k := range keys {
		sub, err := tasks.Submit(e.ctx, workReq(kind, WorkParams{Key: k}))
		require.NoError(e.t, err)
		ids[i] = sub.ID
	}
	return ids
}

// TestStopIsSafeAfterAFailedOrAbsentStart: `defer srv.Stop(ctx)` must not
// panic when Start failed (database down at boot) or never ran, and Stop
// may be called twice.
func TestStopIsSafeAfterAFailedOrAbsentStart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	newServer := func(st store.Store) *impl.Server {
		srv, err := impl.NewServer(st, impl.ServerConfig{Registry: testRegistry(e.pool, "n", time.Second)})
		require.NoError(t, err)
		return srv
	}
	t.Run("failed start", func(t *testing.T) {
		st, err := postgres.Open(e.ctx, e.dsn)
		require.NoError(t, err)
		st.Close() // the database is gone by the time Start runs
		srv := newServer(st)
		require.Error(t, srv.Start(e.ctx))
		require.NotPanics(t, func() { require.NoError(t, srv.Stop(e.ctx)) })
		require.NotPanics(t, func() { require.NoError(t, srv.Stop(e.ctx)) })
	})
	t.Run("no start", func(t *testing.T) {
		srv := newServer(e.st)
		require.NoError(t, srv.Stop(e.ctx))
		require.NoError(t, srv.Stop(e.ctx))
	})
	t.Run("started, stopped twice", func(t *testing.T) {
		srv := newServer(e.st)
		require.NoError(t, srv.Start(e.ctx))
		require.NoError(t, srv.Stop(e.ctx))
		require.NoError(t, srv.Stop(e.ctx))
		require.Zero(t, e.count(`SELECT count(*) FROM stint_node WHERE id = $1`, srv.Node()))
	})
}

// TestAwaitRidesThroughTerminatedConnections: an Await that loses its
// database connections (backends terminated, as in a PostgreSQL restart)
// keeps waiting and returns the result.
func TestAwaitRidesThroughTerminatedConnections(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const app = "stint_awaiter"
	sep := "?"
	if strings.Contains(e.dsn, "?") {
		sep = "&"
	}
	st, err := postgres.Open(e.ctx, e.dsn+sep+"application_name="+app)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	c, err := impl.NewClient(st, impl.ClientConfig{Registry: testRegistry(st.Pool(), "client", time.Second), PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "awaited"}))
	require.NoError(t, err)
	awaited := make(chan error, 1)
	go func() {
		task, err := c.Await(e.ctx, sub.ID)
		if err == nil && task.Status != api.StatusSuccess {
			err = fmt.Errorf("awaited task is %s", task.Status)
		}
		awaited <- err
	}()

	// Terminate the awaiter's connections until it noticed a few times.
	terminated := 0
	waitFor(t, 30*time.Second, "terminated connections", func() bool {
		var n int
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&n))
		terminated += n
		return terminated >= 5
	})
	select {
	case err := <-awaited:
		t.Fatalf("Await returned before the task ran: %v", err)
	default:
	}
	e.server("node", time.Minute)
	select {
	case err := <-awaited:
		require.NoError(t, err)
	case <-e.ctx.Done():
		t.Fatal("Await did not return")
	}
}

// TestASecondRunOnTheSameNodeCancelsTheFirst: when a node claims a task
// again while its older run of it is still going (the older run's lease
// lapsed and the task was taken over), the older run is cancelled.
func TestASecondRunOnTheSameNodeCancelsTheFirst(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A long lease: renewal would notice the loss only after a third of
	// it, so the cancel must come from the second claim.
	b := &blocker{kind: api.Kind[KeyParams, struct{}]{ID: "test.blocked"}, policy: spi.Policy{Lease: time.Minute}, log: newRunLog()}
	srv := e.blockerServer("node", b)
	ids := e.submitKeys(srv, b.kind.ID, "twice")
	started := func(n int) func() bool {
		return func() bool {
			got := 0
			b.log.read(func(l *runLog) { got = l.starts[string(ids[0])] })
			return got >= n
		}
	}
	waitFor(t, 10*time.Second, "the first run", started(1))
	// The lease lapses (as after a long pause of the node): the node's
	// takeover makes the task due and the node claims it again. A renewal
	// that comes before the takeover saves the lease (the node renews
	// every lease when it first listens, which on a busy machine can be
	// after the first run began): the lapse is made again until the
	// takeover took it.
	var first pgtype.UUID
	require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT lease FROM stint_task WHERE id = $1`, string(ids[0])).Scan(&first))
	waitFor(t, 10*time.Second, "the second run", func() bool {
		_, err := e.pool.Exec(e.ctx, `UPDATE stint_lease SET expires_at = now() - interval '1 second' WHERE lease = $1`, first)
		require.NoError(t, err)
		return started(2)()
	})
	waitFor(t, 10*time.Second, "the first run to be cancelled", func() bool {
		ended := false
		b.log.read(func(l *runLog) { _, ended = l.attempt[1] })
		return ended
	})
	b.log.read(func(l *runLog) {
		require.ErrorIs(t, l.attempt[1], api.ErrHalt)
		require.Equal(t, 1, l.cur, "only the second run goes on")
	})
	require.Equal(t, 1, srv.Running())
	_, err := srv.Get(e.ctx, ids[0])
	require.NoError(t, err)
}

// TestNewServerNamesTheMissingRegistry: a server without a registry is
// refused with the name of the field the caller set, not the client's.
func TestNewServerNamesTheMissingRegistry(t *testing.T) {
	t.Parallel()
	_, err := impl.NewServer(nil, impl.ServerConfig{})
	require.ErrorContains(t, err, "ServerConfig.Registry is required")
	_, err = impl.NewClient(nil, impl.ClientConfig{})
	require.ErrorContains(t, err, "ClientConfig.Registry is required")
}

// TestAClaimBackAfterItsLeaseRunsNothing: a claim that returns after its
// leases ran out (its node or the database stalled in between; here, three
// leases after its transaction began) runs none of its tasks: each may be
// another node's by then, and its slot under a cap across nodes too. The
// tasks are given back, due at once, and run once.
func TestAClaimBackAfterItsLeaseRunsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const lease = time.Second // the shortest a policy may have
	f, err := api.Submit(e.ctx, e.client(), workKind, WorkParams{Key: "late"})
	require.NoError(t, err)
	// The lock holds the claim's update of the task, after the claim's
	// transaction (and its lease) began. The claim is found by its text's
	// start: pg_stat_activity keeps the first kilobyte only.
	tx, err := e.pool.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(e.ctx, `SELECT 1 FROM stint_task WHERE id = $1 FOR UPDATE`, string(f.ID()))
	require.NoError(t, err)
	var logged syncbuf.Buffer
	e.server("stalled", lease, func(cfg *impl.ServerConfig) {
		cfg.Behaviors = []api.BehaviorID{workKind.ID}
		cfg.Logger = slog.New(slog.NewTextHandler(&logged, nil))
	})
	waitFor(t, 10*time.Second, "the claim to wait three leases", func() bool {
		var past bool
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT coalesce(bool_or(clock_timestamp() > xact_start + $1 * interval '3 millisecond'), false)
			FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%coalesce(w.lease, gen_random_uuid()) AS lease%'`, lease.Milliseconds()).Scan(&past))
		return past
	})
	require.NoError(t, tx.Commit(e.ctx))

	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	// The late claim's lease had run out when it committed: the node's
	// takeover may find it before the node gives the task back, and a
	// task taken over counts the attempt (the database cannot tell that
	// its run never began).
	if !strings.Contains(logged.String(), "took over the tasks of expired leases") {
		require.Equal(t, 1, res.Attempt, "a run given back unbegun is not an attempt")
	}
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(f.ID())), "the task ran once")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_run r JOIN stint_task t ON t.id = r.task_id
		WHERE r.task_id = $1 AND r.at < t.executed_at + $2 * interval '2 millisecond'`, string(f.ID()), lease.Milliseconds()),
		"its run began soon after the claim that started it (a later claim's), not three leases after (the late one's)")
	require.Contains(t, logged.String(), "given back unrun")
}
