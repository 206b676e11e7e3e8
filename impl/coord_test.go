package impl_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// StepParams are the params of test.steps.
type StepParams struct {
	Key string `json:"key" validate:"required"`
	// Steps is how many checkpoints the run makes.
	Steps int `json:"steps"`
	// CrashAt makes the first attempt fail after this step's checkpoint.
	CrashAt int `json:"crash_at,omitempty"`
	// RollbackAt makes the step's CheckpointTx roll back on attempt 1.
	RollbackAt int `json:"rollback_at,omitempty"`
	// SnoozeFirst makes the first run snooze.
	SnoozeFirst bool `json:"snooze_first,omitempty"`
}

type stepProgress struct {
	Done int `json:"done"`
}

var stepsKind = api.Kind[StepParams, stepProgress]{ID: "test.steps"}

// steps is test.steps: it does Steps steps, each writing a test_effect row
// and its checkpoint in one transaction, resuming after the last
// checkpoint.
type steps struct{ pool *pgxpool.Pool }

func (steps) Kind() api.Kind[StepParams, stepProgress]    { return stepsKind }
func (steps) TaskID(ids spi.IDs, p StepParams) api.TaskID { return ids.Deterministic(p.Key) }
func (steps) Policy() spi.Policy                          { return spi.Policy{BackoffMin: 10 * time.Millisecond} }
func (s steps) Run(ctx context.Context, rc spi.RunContext, p StepParams) (stepProgress, error) {
	if p.SnoozeFirst && rc.Attempt() == 1 {
		if _, err := s.pool.Exec(ctx, `INSERT INTO test_run (task_id, attempt) VALUES ($1, $2)`, string(rc.TaskID()), rc.Attempt()); err != nil {
			return stepProgress{}, err
		}
		var done stepProgress
		if ok, _ := rc.Progress(&done); !ok {
			if err := rc.Checkpoint(ctx, stepProgress{Done: 0}); err != nil {
				return stepProgress{}, err
			}
			return stepProgress{}, spi.Snooze(20 * time.Millisecond)
		}
	}
	var prog stepProgress
	if _, err := rc.Progress(&prog); err != nil {
		return prog, err
	}
	for prog.Done < p.Steps {
		step := prog.Done + 1
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO test_effect (task_id, step) VALUES ($1, $2)`, string(rc.TaskID()), step); err != nil {
				return err
			}
			if err := rc.CheckpointTx(ctx, tx, stepProgress{Done: step}); err != nil {
				return err
			}
			if step == p.RollbackAt && rc.Attempt() == 1 {
				return errors.New("planned rollback")
			}
			return nil
		})
		if err != nil {
			return prog, api.Retryable("step", "step %d: %v", step, err)
		}
		prog.Done = step
		if step == p.CrashAt && rc.Attempt() == 1 {
			return prog, api.Retryable("crash", "crash after step %d", step)
		}
	}
	return prog, nil
}

// ParentParams are the params of test.parent.
type ParentParams struct {
	Key      string `json:"key" validate:"required"`
	Children int    `json:"children"`
}

// ParentResult reports the states of the children when the parent woke.
type ParentResult struct {
	Succeeded int `json:"succeeded"`
	Runs      int `json:"runs"`
}

var parentKind = api.Kind[ParentParams, ParentResult]{ID: "test.parent"}

// parent is test.parent: its first run spawns children and waits for them;
// its second counts them.
type parent struct {
	pool *pgxpool.Pool
}

func (parent) Kind() api.Kind[ParentParams, ParentResult]    { return parentKind }
func (parent) TaskID(ids spi.IDs, p ParentParams) api.TaskID { return ids.Deterministic(p.Key) }
func (p parent) Run(ctx context.Context, rc spi.RunContext, params ParentParams) (ParentResult, error) {
	if _, err := p.pool.Exec(ctx, `INSERT INTO test_run (task_id, attempt) VALUES ($1, $2)`, string(rc.TaskID()), rc.Attempt()); err != nil {
		return ParentResult{}, err
	}
	var spawned bool
	if _, err := rc.Progress(&spawned); err != nil {
		return ParentResult{}, err
	}
	if !spawned {
		reqs := make([]api.SubmitRequest, params.Children)
		for i := range reqs {
			reqs[i] = workReq(workKind, WorkParams{Key: fmt.Sprintf("%s-child-%d", params.Key, i), SleepMS: i % 7})
		}
		if _, err := rc.Spawn(ctx, reqs...); err != nil {
			return ParentResult{}, err
		}
		if err := rc.Checkpoint(ctx, true); err != nil {
			return ParentResult{}, err
		}
		return ParentResult{}, spi.WaitForChildren(time.Minute)
	}
	var res ParentResult
	err := p.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'success'), (SELECT count(*) FROM test_run WHERE task_id = $1)
		FROM stint_task WHERE parent_id = $1`, string(rc.TaskID())).Scan(&res.Succeeded, &res.Runs)
	return res, err
}

// SpanParams are the params of test.span.
type SpanParams struct {
	Key     string `json:"key" validate:"required"`
	SleepMS int    `json:"sleep_ms"`
}

var spanKind = api.Kind[SpanParams, struct{}]{ID: "test.span"}

// span is test.span: it records when it ran, to find overlaps; at most one
// runs per group key across all nodes.
type span struct {
	pool *pgxpool.Pool
	node string
}

func (span) Kind() api.Kind[SpanParams, struct{}]        { return spanKind }
func (span) TaskID(ids spi.IDs, p SpanParams) api.TaskID { return ids.Unique() }
func (span) Policy() spi.Policy                          { return spi.Policy{GroupConcurrency: 1} }
func (span) GroupKey(p SpanParams) string                { return p.Key }
func (s span) Run(ctx context.Context, rc spi.RunContext, p SpanParams) (struct{}, error) {
	started := time.Now()
	time.Sleep(time.Duration(p.SleepMS) * time.Millisecond)
	_, err := s.pool.Exec(ctx, `INSERT INTO test_span (task_id, key, node, started, ended) VALUES ($1, $2, $3, $4, $5)`,
		string(rc.TaskID()), p.Key, s.node, started, time.Now())
	return struct{}{}, err
}

var loopKind = api.Kind[SpanParams, struct{}]{ID: "test.loop"}

// loop is test.loop: a continuous task that runs until stopped, recording
// each start; at most two run per node, rotated.
type loop struct{ pool *pgxpool.Pool }

func (loop) Kind() api.Kind[SpanParams, struct{}]        { return loopKind }
func (loop) TaskID(ids spi.IDs, p SpanParams) api.TaskID { return ids.Deterministic(p.Key) }
func (loop) Policy() spi.Policy {
	return spi.Policy{Rotation: &spi.Rotation{MaxRunning: 2, MaxChurn: 10, Interval: 150 * time.Millisecond, MinRunTime: 200 * time.Millisecond}}
}
func (l loop) Run(ctx context.Context, rc spi.RunContext, p SpanParams) (struct{}, error) {
	if _, err := l.pool.Exec(ctx, `INSERT INTO test_run (task_id, attempt) VALUES ($1, $2)`, string(rc.TaskID()), rc.Attempt()); err != nil {
		return struct{}{}, err
	}
	<-ctx.Done()
	return struct{}{}, context.Cause(ctx)
}

func registerCoordBehaviors(reg *spi.Registry, pool *pgxpool.Pool, node string, _ time.Duration) {
	spi.MustRegister[SpanParams, struct{}](reg, loop{pool: pool})
	spi.MustRegister[StepParams, stepProgress](reg, steps{pool: pool})
	spi.MustRegister[ParentParams, ParentResult](reg, parent{pool: pool})
	spi.MustRegister[SpanParams, struct{}](reg, span{pool: pool, node: node})
}

func TestRemove(t *testing.T) {
	t.Parallel()

	t.Run("scheduled task is gone, second remove is not found", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		c := e.client()
		sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "gone"}))
		require.NoError(t, err)
		require.NoError(t, c.Remove(e.ctx, sub.ID))
		_, err = c.Get(e.ctx, sub.ID)
		require.ErrorIs(t, err, api.ErrNotFound)
		require.ErrorIs(t, c.Remove(e.ctx, sub.ID), api.ErrNotFound)
	})

	t.Run("running task halts, awaiters and subscribers learn it", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		srv := e.server("node", time.Minute)
		c := e.client()
		sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "halt", BlockFirst: true}))
		require.NoError(t, err)
		waitFor(t, 10*time.Second, "the run to start", func() bool { return srv.Running() == 1 })
		// The removal reaches the run by notification: one sent before
		// the server listens is lost (1 in 15 runs on a loaded machine).
		waitFor(t, 10*time.Second, "the server to listen", func() bool { return impl.Listening(srv) })
		events, err := c.Subscribe(e.ctx, api.Filter{ID: sub.ID})
		require.NoError(t, err)
		awaited := make(chan error, 1)
		go func() { _, err := c.Await(e.ctx, sub.ID); awaited <- err }()

		require.NoError(t, c.Remove(e.ctx, sub.ID))
		// The notification cancels the run long before the minute-long
		// lease would.
		waitFor(t, 10*time.Second, "the run to stop", func() bool { return srv.Running() == 0 })
		require.ErrorIs(t, <-awaited, api.ErrNotFound)
		var got []api.Status
		for ev := range events {
			got = append(got, ev.Status)
		}
		require.Equal(t, []api.Status{api.StatusRunning, api.StatusRemoved}, got)
		require.Zero(t, e.count(`SELECT count(*) FROM stint_task`), "the halted run's finish must not bring it back")
	})
}

// TestARunRemovedWhileItsNodeDidNotListenHalts: a removal reaches a run by
// notification, and one sent while the node's listening connection was
// down is lost; the node renews every lease once it listens again and
// halts the run then, long before the renewal of its minute-long lease.
func TestARunRemovedWhileItsNodeDidNotListenHalts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", time.Minute)
	c := e.client()
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "unheard", BlockFirst: true}))
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "the run to start", func() bool { return srv.Running() == 1 })
	waitFor(t, 10*time.Second, "the server to listen", func() bool { return impl.Listening(srv) })
	// Cut the listening connections; the node listens again after a
	// second's pause, and the removal falls in it.
	waitFor(t, 10*time.Second, "the server to stop listening", func() bool {
		_, err := e.pool.Exec(e.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()`)
		require.NoError(t, err)
		return !impl.Listening(srv)
	})
	require.NoError(t, c.Remove(e.ctx, sub.ID))
	waitFor(t, 10*time.Second, "the run to stop", func() bool { return srv.Running() == 0 })
}

func TestSubscribersOnTwoNodesSeeTheSameOrderedStates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, b := e.client(), e.client()
	sub, err := a.Submit(e.ctx, workReq(workKind, WorkParams{Key: "watched", FailUntil: 1, SleepMS: 20}))
	require.NoError(t, err)
	collect := func(c api.Tasks) <-chan []api.Status {
		ch, err := c.Subscribe(e.ctx, api.Filter{ID: sub.ID})
		require.NoError(t, err)
		out := make(chan []api.Status, 1)
		go func() {
			var got []api.Status
			for ev := range ch {
				got = append(got, ev.Status)
			}
			out <- got
		}()
		return out
	}
	fromA, fromB := collect(a), collect(b)
	e.server("runner", 5*time.Second)
	want := []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusFailure, api.StatusRunning, api.StatusSuccess}
	require.Equal(t, want, <-fromA)
	require.Equal(t, want, <-fromB)
}

func TestChangeFeedConsumerResumesAfterBeingOffline(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	_, cursor, err := c.Changes(e.ctx, 0, 10)
	require.NoError(t, err)
	require.NoError(t, c.AckChanges(e.ctx, "indexer", cursor))

	// While the consumer is away: 250 tasks run through scheduled, running
	// and success (750 changes), and 250 more are submitted from several
	// goroutines at once, so that transactions interleave. The client
	// submits: a server's own submit would start its tasks running at once.
	e.server("node", 5*time.Second)
	var reqs []api.SubmitRequest
	for i := range 250 {
		reqs = append(reqs, workReq(workKind, WorkParams{Key: fmt.Sprint("run-", i)}))
	}
	_, err = c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 5 {
		wg.Go(func() {
			for i := range 50 {
				req := workReq(workKind, WorkParams{Key: fmt.Sprintf("later-%d-%d", g, i)})
				req.Delay = time.Hour
				_, err := c.Submit(e.ctx, req)
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	waitFor(t, 30*time.Second, "the runs", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE status = 'success'`) == 250
	})

	var events []api.Event
	for {
		got, next, err := c.Changes(e.ctx, cursor, 100)
		require.NoError(t, err)
		events = append(events, got...)
		cursor = next
		if len(got) == 0 {
			break
		}
	}
	require.NoError(t, c.AckChanges(e.ctx, "indexer", cursor))
	require.Len(t, events, 1000)
	perTask := map[api.TaskID][]api.Status{}
	type key struct {
		seq int64
		id  api.TaskID
	}
	seen := map[key]bool{}
	for i, ev := range events {
		k := key{ev.Seq, ev.TaskID}
		require.False(t, seen[k], "event %v delivered twice", k)
		seen[k] = true
		if i > 0 {
			require.GreaterOrEqual(t, ev.Seq, events[i-1].Seq)
		}
		perTask[ev.TaskID] = append(perTask[ev.TaskID], ev.Status)
	}
	require.Len(t, perTask, 500)
	for id, states := range perTask {
		if len(states) == 1 {
			require.Equal(t, []api.Status{api.StatusScheduled}, states, id)
			continue
		}
		require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, states, id)
	}

	// A bad cursor is refused.
	_, _, err = c.Changes(e.ctx, cursor+1000, 10)
	require.ErrorIs(t, err, api.ErrInvalid)
}

func TestFeedIsTrimmedPastTheSlowestLiveConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	_, start, err := c.Changes(e.ctx, 0, 10)
	require.NoError(t, err)
	require.NoError(t, c.AckChanges(e.ctx, "slow", start))
	for i := range 10 {
		_, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: fmt.Sprint(i)}))
		require.NoError(t, err)
	}
	keepAll := store.MaintainParams{ConsumerTimeout: time.Hour, NodeTimeout: time.Hour, FeedMaxRetention: time.Hour}
	res, err := e.st.Maintain(e.ctx, keepAll)
	require.NoError(t, err)
	require.Zero(t, res.Changes, "the slow consumer has not read them")
	require.Equal(t, 10, e.count(`SELECT count(*) FROM stint_change`), "one row per submit statement")

	got, cursor, err := c.Changes(e.ctx, start, 100)
	require.NoError(t, err)
	require.Len(t, got, 10)
	require.NoError(t, c.AckChanges(e.ctx, "slow", cursor))
	res, err = e.st.Maintain(e.ctx, keepAll)
	require.NoError(t, err)
	require.Equal(t, 10, res.Changes, "read by every live consumer")

	// A consumer silent past the timeout is dropped, and with it its claim
	// on the feed.
	_, err = c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "late"}))
	require.NoError(t, err)
	_, err = e.pool.Exec(e.ctx, `UPDATE stint_feed_consumer SET heartbeat_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	res, err = e.st.Maintain(e.ctx, keepAll)
	require.NoError(t, err)
	require.Equal(t, store.MaintainResult{Consumers: 1, Changes: 1}, res)
}

func TestCheckpointsResumeAndCommitWithTheBehaviorsWrites(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)

	// Attempt 1 crashes after step 2: attempt 2 resumes at step 3.
	f, err := api.Submit(e.ctx, srv, stepsKind, StepParams{Key: "resume", Steps: 4, CrashAt: 2})
	require.NoError(t, err)
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 4, res.Done)
	require.Equal(t, 4, e.count(`SELECT count(*) FROM test_effect WHERE task_id = $1`, string(f.ID())), "every step once")

	// Attempt 1 rolls back step 2 with its checkpoint: attempt 2 redoes
	// step 2, and the rolled-back write is not there.
	f, err = api.Submit(e.ctx, srv, stepsKind, StepParams{Key: "rollback", Steps: 3, RollbackAt: 2})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, e.count(`SELECT count(*) FROM test_effect WHERE task_id = $1`, string(f.ID())))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_effect WHERE task_id = $1 AND step = 2`, string(f.ID())))
}

func TestSnoozeIsNeitherFailureNorAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	f, err := api.Submit(e.ctx, srv, stepsKind, StepParams{Key: "nap", Steps: 1, SnoozeFirst: true})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, 1, task.Attempt)
	require.Zero(t, task.Errors)
	require.Equal(t, 2, e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(f.ID())), "it ran twice")
}

func TestParentWokenOnceWhenItsChildrenEnd(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("a", 5*time.Second)
	e.server("b", 5*time.Second)
	c := e.client()
	f, err := api.Submit(e.ctx, c, parentKind, ParentParams{Key: "batch", Children: 100})
	require.NoError(t, err)
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, ParentResult{Succeeded: 100, Runs: 2}, res, "woken exactly once, after all children")
	page, err := c.List(e.ctx, api.Filter{ParentID: f.ID(), Limit: 1000})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 100)
	task, err := c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, 1, task.Attempt, "waiting is not an attempt")
}

func TestStaleParentSpawnsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	sub, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: parentKind.ID, Params: []byte(`{"key":"p","children":1}`)})
	require.NoError(t, err)
	claimed, err := e.st.Claim(e.ctx, store.ClaimRequest{Node: "x", Limit: 1, Behaviors: []store.BehaviorLease{{Behavior: parentKind.ID, Lease: time.Minute}}})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	stale := claimed[0].LeaseRef
	stale.Lease[0] ^= 0xff
	_, err = e.st.Spawn(e.ctx, stale, []store.NewTask{{ID: "child-1", Behavior: workKind.ID, Params: []byte(`{"key":"c"}`)}})
	require.ErrorIs(t, err, api.ErrHalt)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task`))
	require.Zero(t, e.count(`SELECT children_pending FROM stint_task WHERE id = $1`, string(sub.ID)))
}

func TestHoldAndRelease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "held"}))
	require.NoError(t, err)
	require.NoError(t, c.Hold(e.ctx, sub.ID))
	require.ErrorIs(t, c.Hold(e.ctx, sub.ID), api.ErrConflict)
	require.ErrorIs(t, c.Hold(e.ctx, "missing"), api.ErrNotFound)
	srv := e.server("node", 5*time.Second)
	count, err := c.PendingCount(e.ctx, workKind.ID, 0)
	require.NoError(t, err)
	require.Zero(t, count)

	// A held task is not claimed: a later task runs, the held one does not.
	f, err := api.Submit(e.ctx, c, workKind, WorkParams{Key: "free"})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	task, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusHeld, task.Status)

	require.NoError(t, c.Release(e.ctx, sub.ID))
	require.ErrorIs(t, c.Release(e.ctx, sub.ID), api.ErrConflict)
	_, err = srv.Await(e.ctx, sub.ID)
	require.NoError(t, err)
}

func TestHeldGroupIsNotClaimedByAnyNode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	require.NoError(t, c.HoldGroup(e.ctx, "collection-a"))
	require.ErrorIs(t, c.HoldGroup(e.ctx, ""), api.ErrInvalid)
	var reqs []api.SubmitRequest
	for i := range 30 {
		req := workReq(workKind, WorkParams{Key: fmt.Sprint(i)})
		req.GroupKey = []string{"collection-a", "collection-b", ""}[i%3]
		reqs = append(reqs, req)
	}
	_, err := c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	for i := range 3 {
		e.server(fmt.Sprint("node-", i), 5*time.Second)
	}
	waitFor(t, 20*time.Second, "the other tasks", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE status = 'success'`) == 20
	})
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE group_key = 'collection-a' AND status <> 'scheduled'`))
	held, err := c.HeldGroups(e.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"collection-a"}, held)
	page, err := c.List(e.ctx, api.Filter{GroupKey: "collection-a", Limit: 1})
	require.NoError(t, err)
	task, err := c.Get(e.ctx, page.Tasks[0].ID)
	require.NoError(t, err)
	require.Equal(t, &api.Wait{Reason: api.WaitGroupHeld, Key: "collection-a"}, task.Waiting, "a held group's task says why it waits")

	require.NoError(t, c.ReleaseGroup(e.ctx, "collection-a"))
	waitFor(t, 20*time.Second, "the released tasks", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE status = 'success'`) == 30
	})
}

func TestPauseAndResumeBehavior(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	require.NoError(t, c.Pause(e.ctx, workKind.ID))
	require.ErrorIs(t, c.Pause(e.ctx, "no.such"), api.ErrUnknownBehavior)
	e.server("node", 5*time.Second)
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "paused"}))
	require.NoError(t, err)
	f, err := api.Submit(e.ctx, c, stepsKind, StepParams{Key: "other", Steps: 1})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err, "other behaviors run on")
	task, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status)
	n, err := c.PendingCount(e.ctx, workKind.ID, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	require.NoError(t, c.Resume(e.ctx, workKind.ID))
	_, err = c.Await(e.ctx, sub.ID)
	require.NoError(t, err)
}

func TestRuntimeLeaseAndLookAhead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	require.ErrorIs(t, c.SetLease(e.ctx, workKind.ID, time.Millisecond), api.ErrInvalid)
	require.NoError(t, c.SetLease(e.ctx, workKind.ID, 7*time.Second))
	req := workReq(workKind, WorkParams{Key: "early", BlockFirst: true})
	req.Delay = 30 * time.Second
	sub, err := c.Submit(e.ctx, req)
	require.NoError(t, err)
	srv := e.server("node", time.Minute, func(cfg *impl.ServerConfig) { cfg.LookAhead = time.Minute })
	waitFor(t, 10*time.Second, "the early run", func() bool { return srv.Running() == 1 })
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE id = $1
		AND lost_not_before - executed_at = interval '7 seconds'`, string(sub.ID)), "the operator's lease, not the policy's")
}

func TestGroupLimitOfOneHoldsAcrossNodes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 3 {
		e.server(fmt.Sprint("node-", i), 5*time.Second)
	}
	c := e.client()
	var reqs []api.SubmitRequest
	for i := range 60 {
		// The group key comes from the params (spi.GroupKeyer).
		reqs = append(reqs, api.SubmitRequest{Behavior: spanKind.ID, Params: fmt.Appendf(nil, `{"key":"k%d","sleep_ms":10}`, i%3)})
	}
	_, err := c.SubmitMany(e.ctx, reqs)
	require.NoError(t, err)
	waitFor(t, 60*time.Second, "all spans", func() bool { return e.count(`SELECT count(*) FROM test_span`) == 60 })
	require.Zero(t, e.count(`SELECT count(*) FROM test_span a JOIN test_span b
		ON a.key = b.key AND a.task_id < b.task_id AND a.started < b.ended AND b.started < a.ended`), "runs of one key overlapped")
	require.Greater(t, e.count(`SELECT count(DISTINCT node) FROM test_span`), 1)
	require.Equal(t, 60, e.count(`SELECT count(*) FROM stint_task WHERE group_key = params->>'key'`))
}

func TestFewNotificationsForManySubmits(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("node", 5*time.Second)
	c := e.client()
	const n, workers = 20000, 20
	began := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range n / workers {
				_, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: stepsKind.ID, Params: fmt.Appendf(nil, `{"key":"%d-%d"}`, w, i)})
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	took := time.Since(began)
	waitFor(t, 2*time.Minute, "all tasks", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE status = 'success'`) == n
	})
	sent := c.Stats().Notifications
	// The client sends at most one notification per window and one more at
	// its end (the last one, at most a window after the last submit): the
	// bound follows from how long the submits took, which a busy machine
	// stretches, not from a guess at that time. A notification per submit
	// exceeds it as soon as the 20 workers submit more than 2 per window.
	window := impl.KickWindow(c)
	bound := 2 * (int64(took/window) + 2)
	t.Logf("%d fire-and-forget submits in %s sent %d notifications (at most %d: 2 per %s window)",
		n, took.Round(time.Millisecond), sent, bound, window)
	require.LessOrEqual(t, sent, bound)
}

func TestRotationSharesSlotsAmongWaitingTasks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	c := e.client()
	for i := range 5 {
		_, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: loopKind.ID, Params: fmt.Appendf(nil, `{"key":"loop-%d"}`, i)})
		require.NoError(t, err)
	}
	most := 0
	waitFor(t, 30*time.Second, "every task to get a turn", func() bool {
		most = max(most, e.count(`SELECT count(*) FROM stint_task WHERE behavior = 'test.loop' AND status = 'running'`))
		return e.count(`SELECT count(DISTINCT task_id) FROM test_run`) == 5
	})
	require.LessOrEqual(t, most, 2, "at most MaxRunning at once")
	require.LessOrEqual(t, srv.Running(), 2)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE behavior = 'test.loop' AND attempt > 1`), "a preempted run is not an attempt")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE status = 'failure'`))
}

// TestDelayedSubmitsWakeNobody: tasks that are not due yet send no due
// notification, alone or in a batch; a task due now does.
func TestDelayedSubmitsWakeNobody(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	later := func(key string) api.SubmitRequest {
		return api.SubmitRequest{Behavior: stepsKind.ID, Params: fmt.Appendf(nil, `{"key":%q}`, key), Delay: time.Hour}
	}
	_, err := c.Submit(e.ctx, later("one"))
	require.NoError(t, err)
	_, err = c.SubmitMany(e.ctx, []api.SubmitRequest{later("a"), later("b")})
	require.NoError(t, err)
	impl.FlushKicks(c)
	require.Zero(t, c.Stats().Notifications, "delayed submits notified")
	_, err = c.SubmitMany(e.ctx, []api.SubmitRequest{later("c"), {Behavior: stepsKind.ID, Params: []byte(`{"key":"now"}`)}})
	require.NoError(t, err)
	impl.FlushKicks(c)
	require.NotZero(t, c.Stats().Notifications, "a batch with a task due now did not notify")
}
