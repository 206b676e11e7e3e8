package failover

import (
	"context"
	"errors"
	"github.com/stinthq/stint/internal/chaos"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/provision"
)

// Failover by pg_auto_failover, the tool operators run: a monitor and two
// data nodes on this machine, stint's nodes and client on the multi-host
// URL it prints, under load, through a planned switchover and unplanned
// failovers (a data node killed whole: its keeper and its server).

// formationTimeouts are the monitor's failover settings in these tests:
// lower than pg_auto_failover's defaults (health checks every 5 s, a node
// unhealthy after 20 s, a primary given 30 s to demote itself), so that a
// failover takes about 15 s instead of about a minute.
var formationTimeouts = pgcluster.FormationTimeouts{HealthCheckPeriod: time.Second, Unhealthy: 5 * time.Second, Demote: 8 * time.Second}

// formation starts a pg_auto_failover formation of two data nodes with a
// database "stint", migrated; it installs pg_auto_failover first where it
// can, and skips the test where it cannot (fails it in CI).
func formation(t *testing.T) *pgcluster.Formation {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := pgcluster.EnsureBinDir(ctx); err != nil {
		if errors.Is(err, provision.ErrCannotInstall) && !provision.InCI() {
			t.Skipf("skipped: needs the PostgreSQL server: %v", err)
		}
		t.Fatal(err)
	}
	tool, err := pgcluster.AutoFailover()
	if err != nil {
		if !provision.InCI() {
			t.Skipf("skipped: needs pg_auto_failover: %v", err)
		}
		t.Fatal(err)
	}
	provision.Require(t, ctx, tool)
	f, err := pgcluster.StartFormation(ctx, pgtest.TempDir(t), 2, formationTimeouts)
	t.Cleanup(func() {
		if f == nil {
			return
		}
		if t.Failed() {
			for _, n := range append(f.Nodes, f.Monitor) {
				t.Log(n.LogTail(6000))
			}
		}
		if err := f.Stop(); err != nil {
			t.Errorf("stop the formation: %v", err)
		}
	})
	require.NoError(t, err)
	chaos.CreateDatabase(t, ctx, f.Nodes[0].DSN("postgres"), f.URI("stint"))
	return f
}

// settled waits until the formation has a primary and every other data
// node is a secondary, each in the state the monitor assigned it, and
// returns the primary.
func settled(t *testing.T, ctx context.Context, f *pgcluster.Formation, within time.Duration) *pgcluster.FormationNode {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	require.NoError(t, f.WaitState(ctx, func(s map[string]pgcluster.NodeState) bool {
		primaries := 0
		for _, n := range f.Nodes {
			st := s[n.Name]
			switch {
			case st.Reported != st.Assigned:
				return false
			case st.Reported == "primary":
				primaries++
			case st.Reported != "secondary":
				return false
			}
		}
		return primaries == 1
	}))
	p, err := f.Primary(ctx)
	require.NoError(t, err)
	require.NotNil(t, p)
	return p
}

// promotedOtherThan waits until a data node other than old is the primary
// (reported and assigned) and returns it.
func promotedOtherThan(t *testing.T, ctx context.Context, f *pgcluster.Formation, old *pgcluster.FormationNode) *pgcluster.FormationNode {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var p *pgcluster.FormationNode
	require.NoError(t, f.WaitState(ctx, func(s map[string]pgcluster.NodeState) bool {
		for _, n := range f.Nodes {
			if st := s[n.Name]; n != old && (st.Reported == "primary" || st.Reported == "wait_primary") && st.Reported == st.Assigned {
				p = n
				return true
			}
		}
		return false
	}))
	return p
}

// firstFinishAfter returns how long after at (this machine's clock, which
// is the database's in these tests) the first result was written.
func firstFinishAfter(c *chaos.Cluster, at time.Time) time.Duration {
	var first time.Time
	require.Eventually(c.T, func() bool {
		err := c.Pool.QueryRow(c.Ctx, `SELECT min(at) FROM chaos_result WHERE at > $1`, at).Scan(&first)
		return err == nil && !first.IsZero()
	}, 3*time.Minute, 50*time.Millisecond, "no result written after %s", at)
	return first.Sub(at)
}

// nodesFinishingAfter returns how many of the stint nodes ended a run
// after at.
func nodesFinishingAfter(c *chaos.Cluster, at time.Time) int {
	var n int
	require.NoError(c.T, c.Pool.QueryRow(c.Ctx, `SELECT count(DISTINCT node) FROM chaos_run WHERE ended > $1`, at).Scan(&n))
	return n
}

// The failover scenarios, one after the other on one formation under one
// load: the primary's node killed whole; in the long mode, a planned
// switchover first, then that failover, the killed node back as a
// secondary and the new primary's node killed whole too (two failovers in
// a row), then the primary's server alone killed (its keeper restarts it,
// and the monitor may fail over all the same). The short mode needs no
// node to rejoin as a standby: pg_autoctl connects to the new primary
// with a fixed 2 s timeout, which a machine loaded past its cores can
// miss for minutes.
func TestPgAutoFailover(t *testing.T) {
	t.Parallel() // on clusters of its own: beside the other failover tests, once the shared cluster's are done
	began := time.Now()
	f := formation(t)
	t.Logf("the formation started in %s", time.Since(began).Round(time.Millisecond))
	c := chaos.NewClusterAt(t, f.URI("stint"))
	for _, n := range c.Nodes {
		// The lease: at the suite's 1 s, a machine loaded past
		// its cores lost most leases to slow statements, and the
		// backlog then took longer than the test to burn down.
		n.Lease = 3 * time.Second
	}
	c.StartAll()
	ctx := c.Ctx
	l := chaos.NewLedger()
	stop := make(chan struct{})
	waited := make(chan func(), 1)
	go func() { waited <- c.Load(l, 0, stop) }()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop) // a failure: the awaiters end with the test
		}
	}()
	acks := func(more int) {
		before := len(l.Acked())
		require.Eventually(t, func() bool { return len(l.Acked()) >= before+more }, 3*time.Minute, 50*time.Millisecond,
			"submits should be acknowledged")
	}
	acks(200)

	// A planned switchover.
	switchover := func() {
		old := settled(t, ctx, f, 3*time.Minute)
		at := time.Now()
		require.NoError(t, f.Switchover(ctx))
		done := time.Now()
		p := settled(t, ctx, f, 3*time.Minute)
		require.NotEqual(t, old.Name, p.Name, "the switchover should move the primary")
		t.Logf("measured: switchover %s -> %s: the monitor took it in %s, the old primary was a secondary %s after; first finish %s after it began",
			old.Name, p.Name, done.Sub(at).Round(time.Millisecond), time.Since(done).Round(time.Millisecond),
			firstFinishAfter(c, at).Round(time.Millisecond))
		acks(100)
	}
	// The primary's node killed whole: the monitor promotes the other
	// once it finds the primary unhealthy and gives it time to demote.
	failover := func(what string) *pgcluster.FormationNode {
		old := settled(t, ctx, f, 3*time.Minute)
		at := time.Now()
		require.NoError(t, old.Kill())
		p := promotedOtherThan(t, ctx, f, old)
		promoted := time.Now()
		// Results written after the promotion was seen: the killed
		// server's last commits may have reached the standby with times
		// after the kill (its processes die as the kernel gets to them).
		t.Logf("measured: %s (%s killed whole): %s seen promoted %s after the kill; first finish %s after the kill",
			what, old.Name, p.Name, promoted.Sub(at).Round(time.Millisecond), (promoted.Sub(at) + firstFinishAfter(c, promoted)).Round(time.Millisecond))
		acks(100)
		return old
	}
	if *chaos.Long {
		switchover()
	}
	killed := failover("failover")
	if *chaos.Long {
		// Back as a secondary, then the new primary's node killed: two
		// failovers in a row.
		require.NoError(t, killed.Start(ctx))
		killed = failover("second failover")
		// The primary's server alone killed: its keeper restarts it.
		require.NoError(t, killed.Start(ctx))
		old := settled(t, ctx, f, 3*time.Minute)
		at := time.Now()
		require.NoError(t, old.KillServer())
		time.Sleep(30 * time.Second) // the keeper's restart, and the monitor's failover if it comes
		t.Logf("measured: the primary's server killed alone (%s): first finish %s after the kill", old.Name,
			firstFinishAfter(c, at).Round(time.Millisecond))
		settled(t, ctx, f, 3*time.Minute)
	}
	// Every node resumes: the load goes on until each has finished a run
	// since the last failover (a node still backing off may find the
	// first hundred tasks taken by the others), or 3 minutes pass.
	last := time.Now()
	acks(100)
	for deadline := time.Now().Add(3 * time.Minute); nodesFinishingAfter(c, last) < len(c.Nodes) && time.Now().Before(deadline); {
		acks(20)
	}
	close(stop)
	wait := <-waited

	stored := c.Stored()
	var lost []api.TaskID
	for _, id := range l.Acked() {
		if !stored[id] {
			lost = append(lost, id)
		}
	}
	checked := time.Now()
	r := c.Check(chaos.Keys(stored))
	wait()
	t.Logf("the check took %s", time.Since(checked).Round(time.Millisecond))
	told := c.ToldThenLost(l)
	resumed := nodesFinishingAfter(c, last)
	t.Logf("measured: pg_auto_failover: acknowledged=%d lost=%d stored=%d %s; awaited=%d told a result then lost=%d; nodes finishing after the last failover=%d",
		len(l.Acked()), len(lost), len(stored), r, len(l.Awaited), len(told), resumed)
	require.Empty(t, lost, "acknowledged tasks lost")
	require.Zero(t, r.Lost, "stored tasks that did not finish")
	require.Zero(t, r.Duplicated, "duplicated effects")
	require.Zero(t, r.Unexpected, "unexpected results")
	if !*chaos.Long {
		// The server killed alone may show an awaiter a finish that the
		// failover then drops (see the database page): only the nodes
		// killed whole are held to it.
		require.Empty(t, told, "awaiters told of results then lost")
	}
	require.Equal(t, len(c.Nodes), resumed, "every node should finish runs after the last failover")
}
