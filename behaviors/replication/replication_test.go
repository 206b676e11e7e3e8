package replication

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

func TestOneShotCopiesEveryRowWhileTheSourceChanges(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const rows = 100_000
	start := time.Now()
	e.makeTables("items", rows)
	t.Logf("source of %d rows made in %s", rows, time.Since(start).Round(time.Millisecond))
	srv := e.server("node", testConfig(e.st.Pool()))

	p := e.params("items")
	p.BatchSize = 2000
	start = time.Now()
	f := submit(t, e.ctx, srv, p, false)
	w := e.startWriters("items", rows, 3, 2*time.Millisecond)
	time.AfterFunc(time.Second, w.signal)
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	took := time.Since(start)
	w.halt(t)
	t.Logf("one-shot: %+v in %s; writer: %s", res, took.Round(time.Millisecond), w)
	require.GreaterOrEqual(t, res.RowsRead, int64(rows))
	require.NotZero(t, w.updates.Load()+w.inserts.Load())

	if !e.equal("items", "", "items") {
		// The writer outlived the run: a second one-shot run of the same
		// task copies what changed since (it resumes from its checkpoint).
		t.Log("the source changed after the one-shot caught up: running it again")
		f = submit(t, e.ctx, srv, p, false)
		res2, err := f.Await(e.ctx)
		require.NoError(t, err)
		require.GreaterOrEqual(t, res2.Seq, res.Seq)
		require.Less(t, res2.RowsRead-res.RowsRead, int64(rows), "the second run resumed from the first one's checkpoint")
	}
	e.requireEqual("items", "", "items")
	task, err := srv.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, StateCompleted, StateOf(task))
	require.Equal(t, api.StatusSuccess, task.Status)
}

func TestContinuousFollowsTheSourceWithFilterAndTombstones(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const rows = 100_000
	e.makeTables("items", rows, "items", "items_eu")
	srv := e.server("node", testConfig(e.st.Pool()))

	all := e.params("items")
	all.BatchSize = 2000
	eu := all
	eu.Target.Table = "items_eu"
	eu.Filter = &Filter{Column: "region", Value: "eu"}
	fAll := submit(t, e.ctx, srv, all, true)
	fEU := submit(t, e.ctx, srv, eu, true)
	require.NotEqual(t, fAll.ID(), fEU.ID())
	stop := make(chan struct{})
	seenAll := watch(t, e.ctx, srv, fAll.ID(), stop)
	seenEU := watch(t, e.ctx, srv, fEU.ID(), stop)

	w := e.startWriters("items", rows, 3, time.Millisecond)
	time.Sleep(2 * time.Second) // let the writer change the source for a while (not synchronization)
	w.halt(t)
	waitFor(t, time.Minute, "the targets to catch up", func() bool {
		return e.caughtUp(srv, fAll.ID(), "items", "", "items") && e.caughtUp(srv, fEU.ID(), "items", "region = 'eu'", "items_eu")
	})
	close(stop)
	t.Logf("writer: %s; distinct checkpoints seen: all %d, eu %d", w, <-seenAll, <-seenEU)
	e.requireEqual("items", "", "items")
	e.requireEqual("items", "region = 'eu'", "items_eu")

	task, prog := progress(t, e.ctx, srv, fAll.ID())
	require.Equal(t, StateRunning, StateOf(task), "a continuous replication keeps running")
	require.Equal(t, "separate", prog.Layout)
	// A tombstone on a replicated row deletes it from the target.
	var victim int64
	require.NoError(t, e.dst.QueryRow(e.ctx, `SELECT min(id) FROM items`).Scan(&victim))
	_, err := e.src.Exec(e.ctx, `UPDATE items SET deleted = true WHERE id = $1`, victim)
	require.NoError(t, err)
	// The row leaves the target before the checkpoint that counts it is
	// written, and a checkpoint from before the tombstone can already show
	// Seq at the then head of the source: wait for the one that counts it.
	waitFor(t, 10*time.Second, "the tombstoned row to leave the target and a checkpoint counting its delete", func() bool {
		_, prog = progress(t, e.ctx, srv, fAll.ID())
		return countRows(t, e.dst, "items WHERE id = "+fmt.Sprint(victim)) == 0 && prog.RowsDeleted > 0
	})
	info := InfoOf(task)
	require.Equal(t, StateRunning, info.State)
	require.NotContains(t, info.Source.DSN+info.Target.DSN, "password")

	// Removing a continuous replication stops it.
	require.NoError(t, srv.Remove(e.ctx, fAll.ID()))
	require.NoError(t, srv.Remove(e.ctx, fEU.ID()))
	waitFor(t, 10*time.Second, "the runs to stop", func() bool { return srv.Running() == 0 })
}

// TestRowsCommittedOutOfOrderAreNotMissed holds a transaction open that
// took a change value, commits a later one, and checks that the
// replication waits for the first rather than moving past it (which would
// lose its row).
func TestRowsCommittedOutOfOrderAreNotMissed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.makeTables("items", 100)
	var armed atomic.Bool
	waiting := make(chan int64, 1)
	cfg := testConfig(e.st.Pool())
	cfg.hook = func(_ context.Context, event string, _ api.TaskID, n int64) {
		if event == "horizon-wait" && armed.Load() {
			select {
			case waiting <- n:
			default:
			}
		}
	}
	srv := e.server("node", cfg)
	f := submit(t, e.ctx, srv, e.params("items"), true)
	waitFor(t, 30*time.Second, "the replication to catch up", func() bool { return e.equal("items", "", "items") })

	early, err := e.src.Begin(e.ctx)
	require.NoError(t, err)
	defer func() { _ = early.Rollback(e.ctx) }()
	_, err = early.Exec(e.ctx, `UPDATE items SET qty = 1000 WHERE id = 1`) // takes the lower change value
	require.NoError(t, err)
	armed.Store(true)
	_, err = e.src.Exec(e.ctx, `UPDATE items SET qty = 2000 WHERE id = 2`) // a higher one, committed first
	require.NoError(t, err)
	select {
	case n := <-waiting:
		t.Logf("the replication saw the later row and waits for %d running transaction(s)", n)
	case <-time.After(30 * time.Second):
		t.Fatal("the replication did not wait for the open transaction")
	}
	var qty int
	require.NoError(t, e.dst.QueryRow(e.ctx, `SELECT qty FROM items WHERE id = 2`).Scan(&qty))
	require.NotEqual(t, 2000, qty, "the later row is not copied while an earlier change value is uncommitted")
	require.NoError(t, early.Commit(e.ctx))
	waitFor(t, 30*time.Second, "both rows in the target", func() bool { return e.equal("items", "", "items") })
	require.NoError(t, e.dst.QueryRow(e.ctx, `SELECT qty FROM items WHERE id = 1`).Scan(&qty))
	require.Equal(t, 1000, qty)
	require.NoError(t, srv.Remove(e.ctx, f.ID()))
}
