package chaos

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/internal/faultpoint"
	"github.com/stinthq/stint/migrations"
	"github.com/stinthq/stint/store/postgres"
)

// A node frozen (SIGSTOP, a paused VM) inside a transaction that holds
// what the other nodes wait for stalls them for a bounded time only: the
// server ends the frozen transaction once it idled for the bound, and
// the others go on. Each test freezes a process at a fault point (see
// internal/faultpoint) while it holds one such thing and measures, by
// the database's clock, how long after the freeze another node started
// something.

// Environment of the processes that freeze.
const (
	// envFreezeAt names the fault point at which a node process stops
	// itself, once, the first time it reaches it after a SIGUSR1.
	envFreezeAt = "STINT_CHAOS_FREEZE_AT"
	// envMigrate is the URL of a database that the process migrates,
	// stopping itself inside the first migration.
	envMigrate = "STINT_CHAOS_MIGRATE_DSN"
	// envSetRate is the URL of a database on which the process sets
	// flowRate, stopping itself while it holds the limit's row.
	envSetRate = "STINT_CHAOS_SET_RATE_DSN"
)

// frozenLine is what a process prints on stdout right before it stops
// itself.
const frozenLine = "frozen"

// freezeBound is how long, in these tests, the other nodes may go without
// a start while one process is frozen: the bound the README states (the
// store's 2 s), with room for a loaded machine. The processes' URLs turn
// the session-wide idle_in_transaction_session_timeout off, as an
// operator may, so that only the bound of the transactions themselves
// stands between the others and a wait as long as the freeze.
const freezeBound = 15 * time.Second

// freezeOnSignal makes the process stop itself at point the first time it
// reaches it after a SIGUSR1.
func freezeOnSignal(point string) {
	var armed atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		for range sig {
			armed.Store(true)
		}
	}()
	faultpoint.Set(func(p string) {
		if p == point && armed.CompareAndSwap(true, false) {
			freezeSelf()
		}
	})
}

// freezeAtOnce makes the process stop itself at point the first time it
// reaches it.
func freezeAtOnce(point string) {
	var done atomic.Bool
	faultpoint.Set(func(p string) {
		if p == point && done.CompareAndSwap(false, true) {
			freezeSelf()
		}
	})
}

// freezeSelf prints frozenLine and stops the process until a SIGCONT.
func freezeSelf() {
	fmt.Println(frozenLine)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}

// runFreezing is a process that runs work, stopping itself the first
// time it reaches point; it prints childtest.Ready before. Once let go,
// its transaction was ended by the server, and work fails.
func runFreezing(point string, work func(ctx context.Context) error) {
	freezeAtOnce(point)
	fmt.Println(childtest.Ready)
	if err := work(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(0)
}

// runMigrator is a process that migrates the database at envMigrate and
// stops itself inside the first migration.
func runMigrator() {
	runFreezing(faultpoint.Migrate, func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, os.Getenv(envMigrate))
		if err != nil {
			return err
		}
		return migrations.Up(ctx, conn)
	})
}

// runRateSetter is a process that sets flowRate on the database at
// envSetRate and stops itself while it holds the limit's row.
func runRateSetter() {
	runFreezing(faultpoint.RateLimitSet, func(ctx context.Context) error {
		st, err := postgres.Open(ctx, os.Getenv(envSetRate))
		if err != nil {
			return err
		}
		return st.SetRateLimit(ctx, flowRate)
	})
}

// withoutIdleTimeout returns dsn with idle_in_transaction_session_timeout
// turned off for its sessions.
func withoutIdleTimeout(t *testing.T, dsn string) string {
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("idle_in_transaction_session_timeout", "0")
	u.RawQuery = q.Encode()
	return u.String()
}

// frozenCluster is a cluster of two nodes whose sessions have no
// idle_in_transaction_session_timeout, node-0 set to stop at point once
// armed (see freeze).
func frozenCluster(t *testing.T, point string) *cluster {
	c := newCluster(t)
	c.nodes = c.nodes[:2]
	for _, n := range c.nodes {
		n.dsn = withoutIdleTimeout(t, n.dsn)
	}
	c.nodes[0].freezeAt = point
	return c
}

// freeze arms n to stop at its fault point, waits until it stopped there,
// and returns the database's clock then. n is let go when the test ends,
// if not before (see thaw).
func (c *cluster) freeze(n *node) time.Time {
	require.NoError(c.t, n.cmd.Process.Signal(syscall.SIGUSR1))
	n.child.Expect(c.t, frozenLine)
	c.t.Cleanup(func() { thaw(n.child) })
	return c.clock()
}

// thaw lets a frozen process go.
func thaw(ch *childtest.Child) { _ = ch.Cmd.Process.Signal(syscall.SIGCONT) }

// clock reads the database's clock.
func (c *cluster) clock() time.Time {
	var at time.Time
	require.NoError(c.t, c.pool.QueryRow(c.ctx, `SELECT clock_timestamp()`).Scan(&at))
	return at
}

// stall waits up to a minute for the query q, the earliest start after
// $1 that the frozen process did not make (NULL while there is none), to
// find one after from, and returns how long after from it came.
func (c *cluster) stall(from time.Time, q string) time.Duration {
	deadline := time.Now().Add(time.Minute)
	for {
		var first *time.Time
		require.NoError(c.t, c.pool.QueryRow(c.ctx, q, from).Scan(&first))
		if first != nil {
			d := first.Sub(from)
			c.t.Logf("%s: the first start after the freeze came %s after it", c.t.Name(), d.Round(time.Millisecond))
			return d
		}
		require.True(c.t, time.Now().Before(deadline), "nothing started within a minute of the freeze")
		time.Sleep(50 * time.Millisecond) // polling the database for the first start, bounded by the deadline
	}
}

func TestAFrozenNodeStallsNoOther(t *testing.T) {
	t.Run("flow claim's turn", func(t *testing.T) {
		// node-0 stops inside a claim of chaos.limited (capped across the
		// cluster) while it holds the behavior's turn.
		c := frozenCluster(t, faultpoint.FlowClaim)
		c.flowLog()
		c.startAll()
		ids := c.submitFlow(limitedKind, 600)
		from := c.freeze(c.nodes[0])
		d := c.stall(from, `SELECT min(executed_at) FROM chaos_flow_run WHERE node <> 'node-0' AND executed_at > $1`)
		require.Less(t, d, freezeBound, "the other node's claims waited on the frozen one")
		thaw(c.nodes[0].child)
		c.awaitSuccess(ids)
	})
	t.Run("plain claim", func(t *testing.T) {
		// node-0 stops right after sending a claim of chaos.work: the
		// claim is one round trip, so the server runs it to its commit
		// and the frozen node holds nothing.
		c := frozenCluster(t, faultpoint.PlainClaim)
		c.startAll()
		ids := c.submit(600)
		from := c.freeze(c.nodes[0])
		d := c.stall(from, `SELECT min(started) FROM chaos_run WHERE node <> 'node-0' AND started > $1`)
		require.Less(t, d, freezeBound, "the other node's claims waited on the frozen one")
		thaw(c.nodes[0].child)
		r := c.check(ids)
		require.Zero(t, r.lost, "lost tasks")
		require.Zero(t, r.duplicated, "duplicated tasks")
	})
	t.Run("schedule's row", func(t *testing.T) {
		// node-0 stops inside the firing of a tick, holding the
		// schedule's row: the other node fires the next ticks.
		c := frozenCluster(t, faultpoint.ScheduleFire)
		require.NoError(t, c.client.AddSchedule(c.ctx, api.Schedule{Name: "every-second", Behavior: workKind.ID,
			Spec: "@every 1s", Params: []byte(`{"n":1,"sleep_ms":0}`)}))
		c.startAll()
		from := c.freeze(c.nodes[0])
		d := c.stall(from, `SELECT min(created_at) FROM stint_task WHERE behavior = 'chaos.work' AND created_at > $1`)
		// The next tick is due up to a second after the freeze.
		require.Less(t, d, freezeBound+time.Second, "the other node's ticks waited on the frozen one")
	})
	t.Run("rate limit's row", func(t *testing.T) {
		// A process stops while it sets chaos.limited's rate limit,
		// holding the limit's row, which the claims share-lock.
		c := newCluster(t)
		c.nodes = c.nodes[:2]
		c.flowLog()
		c.startAll()
		ids := c.submitFlow(limitedKind, 600)
		setter := childtest.Start(t, envSetRate+"="+withoutIdleTimeout(t, c.dsn))
		setter.Expect(t, frozenLine)
		from := c.clock()
		d := c.stall(from, `SELECT min(executed_at) FROM chaos_flow_run WHERE executed_at > $1`)
		require.Less(t, d, freezeBound, "the nodes' claims waited on the frozen process")
		thaw(setter)
		c.awaitSuccess(ids)
	})
	t.Run("migration", func(t *testing.T) {
		// A migrator stops inside the first migration of an empty
		// database, holding the migration lock and the locks of the
		// migration's statements: another migrates it.
		c := newCluster(t)
		_, err := c.pool.Exec(c.ctx, `CREATE DATABASE chaos_migrate`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = c.pool.Exec(context.Background(), `DROP DATABASE chaos_migrate WITH (FORCE)`)
		})
		u, err := url.Parse(withoutIdleTimeout(t, c.dsn))
		require.NoError(t, err)
		u.Path = "/chaos_migrate"
		migrator := childtest.Start(t, envMigrate+"="+u.String())
		migrator.Expect(t, frozenLine)
		start := time.Now()
		conn, err := pgx.Connect(c.ctx, u.String())
		require.NoError(t, err)
		defer conn.Close(context.Background())
		ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
		defer cancel()
		require.NoError(t, migrations.Up(ctx, conn))
		d := time.Since(start)
		t.Logf("%s: migrated %s after the freeze", t.Name(), d.Round(time.Millisecond))
		require.Less(t, d, freezeBound, "the migration waited on the frozen migrator")
		list, err := migrations.List(ctx, conn)
		require.NoError(t, err)
		for _, m := range list {
			require.False(t, m.AppliedAt.IsZero(), "migration %s applied", m.Migration)
		}
		thaw(migrator)
	})
}
