package impl_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// gatedStore records the submit statements sent through a store (the
// tasks of each, and how many failed) and, when armed, holds the first
// until released.
type gatedStore struct {
	*postgres.Store
	mu     sync.Mutex
	calls  []int
	failed int
	hold   chan struct{} // the first call waits until it is closed
	held   chan struct{} // closed once the first call waits
}

// gate returns e's store, gated.
func (e *env) gate() *gatedStore {
	return &gatedStore{Store: e.st, hold: make(chan struct{}), held: make(chan struct{})}
}

func (g *gatedStore) enter(n int) {
	g.mu.Lock()
	first := len(g.calls) == 0
	g.calls = append(g.calls, n)
	g.mu.Unlock()
	if first {
		close(g.held)
		<-g.hold
	}
}

func (g *gatedStore) leave(err error) {
	if err != nil {
		g.mu.Lock()
		g.failed++
		g.mu.Unlock()
	}
}

func (g *gatedStore) Submit(ctx context.Context, tasks []store.NewTask) ([]api.Submission, error) {
	g.enter(len(tasks))
	subs, err := g.Store.Submit(ctx, tasks)
	g.leave(err)
	return subs, err
}

func (g *gatedStore) SubmitStart(ctx context.Context, node string, tasks []store.NewTask) ([]api.Submission, []store.Claimed, error) {
	g.enter(len(tasks))
	subs, started, err := g.Store.SubmitStart(ctx, node, tasks)
	g.leave(err)
	return subs, started, err
}

// record returns the tasks of each submit call so far and the failed calls.
func (g *gatedStore) record() ([]int, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.calls...), g.failed
}

// gatedClient returns a client on a gated store of e's, and the store.
func (e *env) gatedClient() (*impl.Client, *gatedStore) {
	e.t.Helper()
	g := e.gate()
	c, err := impl.NewClient(g, impl.ClientConfig{Registry: testRegistry(e.pool, "client", time.Second), PollInterval: 100 * time.Millisecond})
	require.NoError(e.t, err)
	e.t.Cleanup(c.Close)
	return c, g
}

// outcome is what one Submit returned.
type outcome struct {
	sub api.Submission
	err error
}

// submitAsync submits req through c in a goroutine and returns where its
// outcome arrives.
func submitAsync(ctx context.Context, c api.Tasks, req api.SubmitRequest) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		sub, err := c.Submit(ctx, req)
		ch <- outcome{sub, err}
	}()
	return ch
}

// submitKeysAsync submits the test.work tasks of keys prefix0 to
// prefix<n-1> through c, each with submitAsync.
func submitKeysAsync(ctx context.Context, c api.Tasks, prefix string, n int) []<-chan outcome {
	outs := make([]<-chan outcome, n)
	for i := range outs {
		outs[i] = submitAsync(ctx, c, workReq(workKind, WorkParams{Key: fmt.Sprint(prefix, i)}))
	}
	return outs
}

// holdFirst gives the test a database and a client on a gated store of
// it, whose first submit, of the task "first", is held in the store: the
// submits that follow wait in batches until the test closes g.hold.
func holdFirst(t *testing.T) (e *env, c *impl.Client, g *gatedStore, first <-chan outcome) {
	t.Helper()
	e = setup(t)
	c, g = e.gatedClient()
	first = submitAsync(e.ctx, c, workReq(workKind, WorkParams{Key: "first"}))
	select {
	case <-g.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the first submit never reached the store")
	}
	return e, c, g, first
}

// TestConcurrentSubmitsShareOneStatement: the single submits that arrive
// while one is in the database go out together, in one statement, once it
// returns; each caller gets its own task's submission.
func TestConcurrentSubmitsShareOneStatement(t *testing.T) {
	e, c, g, first := holdFirst(t)
	const n = 50
	outs := submitKeysAsync(e.ctx, c, "k", n)
	waitFor(t, 20*time.Second, "the submits to wait in a batch", func() bool { return impl.CoalesceWaiting(c) == n })
	close(g.hold)
	require.NoError(t, (<-first).err)
	ids := spi.NewIDs(workKind.ID)
	for i, ch := range outs {
		o := <-ch
		require.NoError(t, o.err)
		require.Equal(t, ids.Deterministic(fmt.Sprint("k", i)), o.sub.ID)
		require.True(t, o.sub.Created)
		require.Equal(t, api.StatusScheduled, o.sub.Status)
	}
	calls, failed := g.record()
	require.Equal(t, []int{1, n}, calls)
	require.Zero(t, failed)
	require.Equal(t, n+1, e.count(`SELECT count(*) FROM stint_task`))
}

// TestARefusedCoalescedSubmitLeavesTheOthers: of the submits waiting
// together, one naming an unknown rate limit is refused before it joins,
// one whose caller gives up is dropped, and one whose row the database
// refuses fails alone: the others are stored.
func TestARefusedCoalescedSubmitLeavesTheOthers(t *testing.T) {
	e, c, g, first := holdFirst(t)
	_, err := e.pool.Exec(e.ctx, `
		CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		    IF NEW.params->>'key' = 'bad' THEN RAISE EXCEPTION 'test refuses %', NEW.id; END IF;
		    RETURN NEW;
		END $$;
		CREATE TRIGGER test_refuse BEFORE INSERT ON stint_task FOR EACH ROW EXECUTE FUNCTION test_refuse()`)
	require.NoError(t, err)
	const n = 20
	good := submitKeysAsync(e.ctx, c, "good", n)
	bad := submitAsync(e.ctx, c, workReq(workKind, WorkParams{Key: "bad"}))
	cctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	gaveUp := submitAsync(cctx, c, workReq(workKind, WorkParams{Key: "gave-up"}))
	waitFor(t, 20*time.Second, "the submits to wait in a batch", func() bool { return impl.CoalesceWaiting(c) == n+2 })
	unknown := <-submitAsync(e.ctx, c, flowReq(ratedKind, FlowParams{ID: "unknown", Limit: "no-such-limit"}))
	require.ErrorIs(t, unknown.err, api.ErrInvalid)
	cancel()
	o := <-gaveUp
	require.ErrorIs(t, o.err, context.Canceled)
	require.Equal(t, n+1, impl.CoalesceWaiting(c), "the caller that gave up left its batch")
	close(g.hold)

	require.NoError(t, (<-first).err)
	for _, ch := range good {
		require.NoError(t, (<-ch).err)
	}
	o = <-bad
	require.ErrorContains(t, o.err, "test refuses")
	var pgErr interface{ SQLState() string }
	require.True(t, errors.As(o.err, &pgErr), "the database's own error: %v", o.err)
	require.Equal(t, n+1, e.count(`SELECT count(*) FROM stint_task`))
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE params->>'key' IN ('bad', 'gave-up') OR params->>'id' = 'unknown'`))
	calls, failed := g.record()
	require.Equal(t, n+1, calls[1], "the good submits and the bad one went out together first: %v", calls)
	require.Positive(t, failed)
}

// TestSubmitsOfOneIDWaitingTogetherDeduplicateInTurn: two submits of one
// id that wait together go out in two batches, one after the other, so
// that they deduplicate as two submits in turn do (one creates the task,
// the other finds it), for both dedup modes, without a failed statement.
func TestSubmitsOfOneIDWaitingTogetherDeduplicateInTurn(t *testing.T) {
	e, c, g, first := holdFirst(t)
	var outs []<-chan outcome
	for range 2 {
		for _, kind := range []api.Kind[WorkParams, WorkResult]{workKind, shareKind} {
			outs = append(outs, submitAsync(e.ctx, c, workReq(kind, WorkParams{Key: "same"})))
		}
	}
	waitFor(t, 20*time.Second, "the submits to wait", func() bool { return impl.CoalesceWaiting(c) == len(outs) })
	close(g.hold)
	require.NoError(t, (<-first).err)
	created := map[api.TaskID]int{}
	for _, ch := range outs {
		o := <-ch
		require.NoError(t, o.err)
		require.Equal(t, api.StatusScheduled, o.sub.Status)
		if o.sub.Created {
			created[o.sub.ID]++
		}
	}
	require.Equal(t, map[api.TaskID]int{
		spi.NewIDs(workKind.ID).Deterministic("same"):  1,
		spi.NewIDs(shareKind.ID).Deterministic("same"): 1,
	}, created)
	calls, failed := g.record()
	require.Equal(t, []int{1, 2, 2}, calls)
	require.Zero(t, failed)
}

// TestNoCoalescedSubmitReturnsBeforeItsCommit: while the commits of the
// submits' statements wait (a deferred trigger waits for a lock the test
// holds), no Submit returns; each that returns finds its task committed.
func TestNoCoalescedSubmitReturnsBeforeItsCommit(t *testing.T) {
	e := setup(t)
	_, err := e.pool.Exec(e.ctx, `
		CREATE FUNCTION test_commit_gate() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER test_commit_gate AFTER INSERT ON stint_task
		    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_commit_gate()`)
	require.NoError(t, err)
	conn, err := e.pool.Acquire(e.ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(e.ctx) }()
	_, err = tx.Exec(e.ctx, `SELECT pg_advisory_xact_lock(4242)`)
	require.NoError(t, err)

	c := e.client()
	const n = 30
	var returned atomic.Int32
	visible := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: fmt.Sprint("k", i)}))
			returned.Add(1)
			if errs[i] = err; err == nil {
				var found bool
				errs[i] = e.pool.QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM stint_task WHERE id = $1)`, string(sub.ID)).Scan(&found)
				visible[i] = found
			}
		}()
	}
	waitFor(t, 20*time.Second, "a commit to wait for the lock", func() bool {
		return e.count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`) > 0
	})
	waitFor(t, 20*time.Second, "the other submits to wait", func() bool {
		return impl.CoalesceWaiting(c)+e.count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`) >= n
	})
	require.Zero(t, returned.Load(), "a submit returned before its commit")
	require.NoError(t, tx.Commit(e.ctx))
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.True(t, visible[i], "task %d was not committed when its submit returned", i)
	}
}

// TestAFullBatchGoesOutAtOnce: while a submit is in the database, the
// submits that fill a batch (1,000) go out at once, side by side, and only
// the rest wait for the statements in the database to return.
func TestAFullBatchGoesOutAtOnce(t *testing.T) {
	e, c, g, first := holdFirst(t)
	const n = 2500
	outs := submitKeysAsync(e.ctx, c, "k", n)
	waitFor(t, 20*time.Second, "two full batches to go out", func() bool {
		calls, _ := g.record()
		return len(calls) == 3
	})
	waitFor(t, 20*time.Second, "the rest to wait", func() bool { return impl.CoalesceWaiting(c) == n-2000 })
	close(g.hold)
	require.NoError(t, (<-first).err)
	for _, ch := range outs {
		require.NoError(t, (<-ch).err)
	}
	calls, failed := g.record()
	require.Equal(t, []int{1, 1000, 1000, n - 2000}, calls)
	require.Zero(t, failed)
	require.Equal(t, n+1, e.count(`SELECT count(*) FROM stint_task`))
}
