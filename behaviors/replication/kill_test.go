package replication

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/spi"
)

// TestKilledNodeMidBatchLosesAndDuplicatesNothing runs a continuous
// replication on a child process, SIGKILLs it while a batch's transaction
// is open (rows written, not committed), and lets an in-process node take
// the task over while the source keeps changing. The target is the stint
// database (the shared layout: checkpoints commit with the rows).
func TestKilledNodeMidBatchLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The target is the stint database.
	e.dstDSN, e.dst = e.dsn, e.st.Pool()
	const rows = 20_000
	e.makeTables("items", rows)

	child := childtest.Start(t, envChildDSN+"="+e.dsn, envChildBlockAt+"=25")
	expect := func(want string) { t.Helper(); child.Expect(t, want) }

	// Submit from a client-only process: nothing runs here yet.
	reg := spi.NewRegistry()
	require.NoError(t, Register(reg, testConfig(e.st.Pool())))
	client, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	p := e.params("items")
	f := submit(t, e.ctx, client, p, true)
	stop := make(chan struct{})
	seen := watch(t, e.ctx, client, f.ID(), stop)
	w := e.startWriters("items", rows, 3, time.Millisecond)

	expect("mid-batch")
	_, atKill := progress(t, e.ctx, client, f.ID())
	committed := countRows(t, e.dst, "items")
	require.NoError(t, child.Kill())
	killed := time.Now()
	t.Logf("killed the child inside batch 25: %d rows committed to the target, the last checkpoint at change %d (%d checkpoints, layout %s)",
		committed, atKill.Seq, atKill.Checkpoints, atKill.Layout)
	require.Equal(t, "shared", atKill.Layout)
	require.Less(t, atKill.Seq, int64(rows), "the kill came before the replication caught up")

	srv := e.server("survivor", testConfig(e.st.Pool()))
	waitFor(t, 30*time.Second, "the survivor to take the task over", func() bool {
		task, _ := progress(t, e.ctx, srv, f.ID())
		return task.Node == "survivor" && StateOf(task) == StateRunning
	})
	t.Logf("takeover %s after the kill", time.Since(killed).Round(time.Millisecond))
	time.Sleep(time.Second) // the source keeps changing under the new node (not synchronization)
	w.halt(t)
	waitFor(t, time.Minute, "the target to catch up", func() bool { return e.caughtUp(srv, f.ID(), "items", "", "items") })
	close(stop)
	n := <-seen
	e.requireEqual("items", "", "items")
	task, prog := progress(t, e.ctx, srv, f.ID())
	require.Equal(t, 1, task.Attempt-1, "one takeover")
	require.Greater(t, prog.Checkpoints, atKill.Checkpoints)
	t.Logf("writer: %s; %d distinct checkpoints seen, all moving forward; final %+v", w, n, prog.Result)
	require.NoError(t, srv.Remove(e.ctx, f.ID()))
}

func countRows(t *testing.T, p *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, p.QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n))
	return n
}
