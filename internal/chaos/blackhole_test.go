package chaos

import (
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
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
	c := newCluster(t)
	c.nodes = c.nodes[:2]
	p := c.behindProxy()
	for _, n := range c.nodes {
		n.lease = spi.DefaultLease // the lease the bound is stated for
	}
	c.startAll()

	// Tasks are submitted throughout, by the client, which is not behind
	// the proxy.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ids []api.TaskID
	wg.Go(func() {
		next := 0
		every(stop, 0, 100*time.Millisecond, func() {
			ids = append(ids, c.submitFrom(next, 10)...)
			next += 10
		})
	})
	waitRuns := func(node string, after time.Time, bound time.Duration) time.Duration {
		var first time.Time
		require.Eventually(t, func() bool {
			err := c.pool.QueryRow(c.ctx, `SELECT min(ended) FROM chaos_run WHERE node = $1 AND started > $2 AND ended IS NOT NULL`,
				node, after).Scan(&first)
			return err == nil && !first.IsZero()
		}, bound, 50*time.Millisecond, "%s finished no run within %s of %s", node, bound, after.Format("15:04:05.000"))
		return first.Sub(after)
	}
	for _, n := range c.nodes {
		waitRuns(n.name, time.Now().Add(-time.Minute), time.Minute)
	}

	began := time.Now()
	p.blackhole()
	time.Sleep(incidentFor(20 * time.Second)) // the fault's duration
	p.restore(true)                           // the connections of before stay dead, never closed
	ended := time.Now()

	// The bound is a correctness bound; a slow machine stretches every
	// statement, so it gets room for a few slow round trips.
	for _, n := range c.nodes {
		d := waitRuns(n.name, ended, resumeBound+5*time.Second)
		t.Logf("%s finished its first run %s after the path returned", n.name, d.Round(time.Millisecond))
	}
	close(stop)
	wg.Wait()
	r := c.check(ids)
	t.Logf("ledger: %s", r)
	require.Zero(t, r.lost, "lost tasks")
	require.Zero(t, r.duplicated, "duplicated tasks")
	require.Zero(t, r.unexpected, "unexpected results")
	rep := c.checkIncidents(began, ended)
	t.Logf("measured: silent loss for %s:%s", ended.Sub(began).Round(time.Millisecond), rep)
	for _, n := range c.nodes {
		require.Less(t, rep.resume[n.name], resumeBound, "%s: its incidents ended too late or started again after the path returned", n.name)
	}
}
