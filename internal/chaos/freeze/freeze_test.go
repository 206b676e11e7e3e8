package freeze

import (
	"context"
	"github.com/stinthq/stint/internal/chaos"
	"net/url"
	"os"
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
	// envMigrate is the URL of a database that the process migrates,
	// stopping itself inside the first migration.
	envMigrate = "STINT_CHAOS_MIGRATE_DSN"
	// envSetRate is the URL of a database on which the process sets
	// flowRate, stopping itself while it holds the limit's row.
	envSetRate = "STINT_CHAOS_SET_RATE_DSN"
)

// freezeBound is how long, in these tests, the other nodes may go without
// a start while one process is frozen: the bound the README states (the
// store's 2 s), with room for a loaded machine. The processes' URLs turn
// the session-wide idle_in_transaction_session_timeout off, as an
// operator may, so that only the bound of the transactions themselves
// stands between the others and a wait as long as the freeze.
const freezeBound = 15 * time.Second

// runMigrator is a process that migrates the database at envMigrate and
// stops itself inside the first migration.
func runMigrator() {
	chaos.RunFreezing(faultpoint.Migrate, func(ctx context.Context) error {
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
	chaos.RunFreezing(faultpoint.RateLimitSet, func(ctx context.Context) error {
		st, err := postgres.Open(ctx, os.Getenv(envSetRate))
		if err != nil {
			return err
		}
		return st.SetRateLimit(ctx, chaos.FlowRate)
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
func frozenCluster(t *testing.T, point string) *chaos.Cluster {
	c := chaos.NewCluster(t)
	c.Nodes = c.Nodes[:2]
	for _, n := range c.Nodes {
		n.DSN = withoutIdleTimeout(t, n.DSN)
	}
	c.Nodes[0].FreezeAt = point
	return c
}

// freeze arms n to stop at its fault point, waits until it stopped there,
// and returns the database's clock then. n is let go when the test ends,
// if not before (see thaw).
func freeze(c *chaos.Cluster, n *chaos.Node) time.Time {
	require.NoError(c.T, n.Cmd.Process.Signal(syscall.SIGUSR1))
	n.Child.Expect(c.T, chaos.FrozenLine)
	c.T.Cleanup(func() { thaw(n.Child) })
	return c.Clock()
}

// thaw lets a frozen process go.
func thaw(ch *childtest.Child) { _ = ch.Cmd.Process.Signal(syscall.SIGCONT) }

// stall waits up to a minute for the query q, the earliest start after
// $1 that the frozen process did not make (NULL while there is none), to
// find one after from, and returns how long after from it came.
func stall(c *chaos.Cluster, from time.Time, q string) time.Duration {
	deadline := time.Now().Add(time.Minute)
	for {
		var first *time.Time
		require.NoError(c.T, c.Pool.QueryRow(c.Ctx, q, from).Scan(&first))
		if first != nil {
			d := first.Sub(from)
			c.T.Logf("%s: the first start after the freeze came %s after it", c.T.Name(), d.Round(time.Millisecond))
			return d
		}
		require.True(c.T, time.Now().Before(deadline), "nothing started within a minute of the freeze")
		time.Sleep(50 * time.Millisecond) // polling the database for the first start, bounded by the deadline
	}
}

func TestAFrozenNodeStallsNoOther(t *testing.T) {
	t.Run("flow claim's turn", func(t *testing.T) {
		// node-0 stops inside a claim of chaos.limited (capped across the
		// cluster) while it holds the behavior's turn.
		c := frozenCluster(t, faultpoint.FlowClaim)
		c.FlowLog()
		c.StartAll()
		ids := c.SubmitFlow(chaos.LimitedKind, 600)
		from := freeze(c, c.Nodes[0])
		d := stall(c, from, `SELECT min(executed_at) FROM chaos_flow_run WHERE node <> 'node-0' AND executed_at > $1`)
		require.Less(t, d, freezeBound, "the other node's claims waited on the frozen one")
		thaw(c.Nodes[0].Child)
		c.AwaitSuccess(ids)
	})
	t.Run("plain claim", func(t *testing.T) {
		// node-0 stops right after sending a claim of chaos.work: the
		// claim is one round trip, so the server runs it to its commit
		// and the frozen node holds nothing.
		c := frozenCluster(t, faultpoint.PlainClaim)
		c.StartAll()
		ids := c.Submit(600)
		from := freeze(c, c.Nodes[0])
		d := stall(c, from, `SELECT min(started) FROM chaos_run WHERE node <> 'node-0' AND started > $1`)
		require.Less(t, d, freezeBound, "the other node's claims waited on the frozen one")
		thaw(c.Nodes[0].Child)
		r := c.Check(ids)
		require.Zero(t, r.Lost, "lost tasks")
		require.Zero(t, r.Duplicated, "duplicated tasks")
	})
	t.Run("schedule's row", func(t *testing.T) {
		// node-0 stops inside the firing of a tick, holding the
		// schedule's row: the other node fires the next ticks.
		c := frozenCluster(t, faultpoint.ScheduleFire)
		require.NoError(t, c.Client.AddSchedule(c.Ctx, api.Schedule{Name: "every-second", Behavior: chaos.WorkKind.ID,
			Spec: "@every 1s", Params: []byte(`{"n":1,"sleep_ms":0}`)}))
		c.StartAll()
		from := freeze(c, c.Nodes[0])
		d := stall(c, from, `SELECT min(created_at) FROM stint_task WHERE behavior = 'chaos.work' AND created_at > $1`)
		// The next tick is due up to a second after the freeze.
		require.Less(t, d, freezeBound+time.Second, "the other node's ticks waited on the frozen one")
	})
	t.Run("rate limit's row", func(t *testing.T) {
		// A process stops while it sets chaos.limited's rate limit,
		// holding the limit's row, which the claims share-lock.
		c := chaos.NewCluster(t)
		c.Nodes = c.Nodes[:2]
		c.FlowLog()
		c.StartAll()
		ids := c.SubmitFlow(chaos.LimitedKind, 600)
		setter := childtest.Start(t, envSetRate+"="+withoutIdleTimeout(t, c.DSN))
		setter.Expect(t, chaos.FrozenLine)
		from := c.Clock()
		d := stall(c, from, `SELECT min(executed_at) FROM chaos_flow_run WHERE executed_at > $1`)
		require.Less(t, d, freezeBound, "the nodes' claims waited on the frozen process")
		thaw(setter)
		c.AwaitSuccess(ids)
	})
	t.Run("migration", func(t *testing.T) {
		// A migrator stops inside the first migration of an empty
		// database, holding the migration lock and the locks of the
		// migration's statements: another migrates it.
		c := chaos.NewCluster(t)
		_, err := c.Pool.Exec(c.Ctx, `CREATE DATABASE chaos_migrate`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = c.Pool.Exec(context.Background(), `DROP DATABASE chaos_migrate WITH (FORCE)`)
		})
		u, err := url.Parse(withoutIdleTimeout(t, c.DSN))
		require.NoError(t, err)
		u.Path = "/chaos_migrate"
		migrator := childtest.Start(t, envMigrate+"="+u.String())
		migrator.Expect(t, chaos.FrozenLine)
		start := time.Now()
		conn, err := pgx.Connect(c.Ctx, u.String())
		require.NoError(t, err)
		defer conn.Close(context.Background())
		ctx, cancel := context.WithTimeout(c.Ctx, time.Minute)
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
