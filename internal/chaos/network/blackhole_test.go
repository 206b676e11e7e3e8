package network

import (
	"flag"
	"fmt"
	"github.com/stinthq/stint/internal/chaos"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

var reps = flag.Int("chaos.reps", 1, "how many times TestEveryNodeResumesAfterASilentLoss repeats its blackhole")

// resumeBound is how soon after a silent loss ends every node must claim
// and finish tasks again, at the default lease: the README's bound for a
// claim in flight on a dead connection (its deadline, 5 s) plus the
// poll interval, with room for the dead connections to be replaced.
const resumeBound = 10 * time.Second

// TestEveryNodeResumesAfterASilentLoss blackholes the path between two
// nodes and PostgreSQL for 20 s while tasks are submitted throughout,
// then forwards new connections only (the old ones stay silent, never
// closed), and checks that each node starts and finishes tasks within
// resumeBound, that each node's incidents end within it and none starts
// again after, with nothing lost or duplicated; -chaos.reps repeats it.
func TestEveryNodeResumesAfterASilentLoss(t *testing.T) {
	for rep := range *reps {
		t.Run(fmt.Sprint("rep-", rep), func(t *testing.T) { silentLossOnce(t) })
	}
}

func silentLossOnce(t *testing.T) {
	c := chaos.NewCluster(t)
	c.Nodes = c.Nodes[:2]
	p := c.BehindProxy()
	for _, n := range c.Nodes {
		n.Lease = spi.DefaultLease // the lease the bound is stated for
	}
	c.StartAll()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What each node was doing: the goroutine dump goes to the
		// test's stderr.
		for _, n := range c.Nodes {
			if n.Cmd != nil {
				_ = n.Cmd.Process.Signal(syscall.SIGQUIT)
				_ = n.Cmd.Wait()
				n.Cmd = nil
			}
		}
	})

	// Tasks are submitted throughout, by the client, which is not behind
	// the proxy.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ids []api.TaskID
	wg.Go(func() {
		next := 0
		chaos.Every(stop, 0, 100*time.Millisecond, func() {
			ids = append(ids, c.SubmitFrom(next, 10)...)
			next += 10
		})
	})
	waitRuns := func(node string, after time.Time, bound time.Duration) time.Duration {
		var first time.Time
		require.Eventually(t, func() bool {
			err := c.Pool.QueryRow(c.Ctx, `SELECT min(ended) FROM chaos_run WHERE node = $1 AND started > $2 AND ended IS NOT NULL`,
				node, after).Scan(&first)
			return err == nil && !first.IsZero()
		}, bound, 50*time.Millisecond, "%s finished no run within %s of %s", node, bound, after.Format("15:04:05.000"))
		return first.Sub(after)
	}
	for _, n := range c.Nodes {
		waitRuns(n.Name, time.Now().Add(-time.Minute), time.Minute)
	}

	began := time.Now()
	p.Blackhole()
	time.Sleep(chaos.IncidentFor(20 * time.Second)) // the fault's duration
	p.Restore(true)                                 // the connections of before stay dead, never closed
	ended := time.Now()

	// The bound is a correctness bound; a slow machine stretches every
	// statement, so it gets room for a few slow round trips.
	for _, n := range c.Nodes {
		d := waitRuns(n.Name, ended, resumeBound+5*time.Second)
		t.Logf("%s finished its first run %s after the path returned", n.Name, d.Round(time.Millisecond))
	}
	close(stop)
	wg.Wait()
	r := c.Check(ids)
	t.Logf("ledger: %s", r)
	if r.Lost > 0 {
		rows, err := c.Pool.Query(c.Ctx, `SELECT status || coalesce(' on ' || node, ''), count(*) FROM stint_task GROUP BY 1`)
		require.NoError(t, err)
		counts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
			Status string
			N      int
		}])
		require.NoError(t, err)
		t.Logf("tasks by status: %v", counts)
		rows, err = c.Pool.Query(c.Ctx, `SELECT format('%s %s %s/%s xact=%s %s', pid, state, wait_event_type, wait_event,
			now() - xact_start, left(regexp_replace(query, '\s+', ' ', 'g'), 100))
			FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY xact_start`)
		require.NoError(t, err)
		sessions, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		for _, s := range sessions {
			t.Logf("session: %s", s)
		}
	}
	require.Zero(t, r.Lost, "lost tasks")
	require.Zero(t, r.Duplicated, "duplicated tasks")
	require.Zero(t, r.Unexpected, "unexpected results")
	rep := c.CheckIncidents(began, ended)
	t.Logf("measured: silent loss for %s:%s", ended.Sub(began).Round(time.Millisecond), rep)
	for _, n := range c.Nodes {
		require.Less(t, rep.Resume[n.Name], resumeBound, "%s: its incidents ended too late or started again after the path returned", n.Name)
	}
}

// serverDropBound is how soon PostgreSQL must drop the session of a
// client that vanished: the session's keepalives (10 s idle, then 3 probes
// 5 s apart) that store/postgres sets, with room for a slow machine.
const serverDropBound = 25*time.Second + 10*time.Second

// TestServerDropsTheSessionsOfAVanishedNode opens a store behind a proxy,
// then blackholes the path and makes the proxy forget the connections to
// PostgreSQL without a word, as a lost NAT state would, and checks that
// PostgreSQL drops the store's sessions from pg_stat_activity within
// serverDropBound rather than after its default TCP keepalive time (two
// hours on Linux).
func TestServerDropsTheSessionsOfAVanishedNode(t *testing.T) {
	c := chaos.NewCluster(t)
	p := c.BehindProxy()
	st, err := postgres.Open(c.Ctx, c.Nodes[0].DSN)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	// A few sessions, idle in the pool.
	var pids []int64
	var conns []*pgxpool.Conn
	for range 5 {
		conn, err := st.Pool().Acquire(c.Ctx)
		require.NoError(t, err)
		conns = append(conns, conn)
		pids = append(pids, int64(conn.Conn().PgConn().PID()))
	}
	for _, conn := range conns {
		conn.Release()
	}
	sessions := func() int {
		var n int
		require.NoError(t, c.Pool.QueryRow(c.Ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n))
		return n
	}
	require.Equal(t, len(pids), sessions())
	p.Blackhole()
	p.Restore(true)
	if err := p.Vanish(); err != nil {
		t.Skipf("the proxy cannot drop a connection silently (it needs CAP_NET_ADMIN): %v", err)
	}
	began := time.Now()
	require.Eventually(t, func() bool { return sessions() == 0 }, serverDropBound, 100*time.Millisecond,
		"PostgreSQL kept the sessions of a vanished client")
	t.Logf("measured: PostgreSQL dropped the %d sessions of the vanished client after %s", len(pids), time.Since(began).Round(time.Millisecond))
}
