package kill

import (
	"github.com/stinthq/stint/internal/chaos"
	mrand "math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSIGKILL(t *testing.T) {
	tasks, faultFor := chaos.Size()
	r := chaos.Scenario(t, tasks, faultFor, func(c *chaos.Cluster, stop <-chan struct{}) {
		chaos.Every(stop, 700*time.Millisecond, 700*time.Millisecond, func() {
			n := c.Nodes[mrand.IntN(len(c.Nodes))]
			if n.Cmd != nil {
				c.Sigkill(n)
				c.Start(n)
			}
		})
	})
	require.Positive(t, r.Recovered, "the kills should have hit running tasks")
	// About a lease after the kill, with room for the statements between
	// the lease's expiry and the next run (takeover, claim, the run's own
	// writes) on a machine as slow as this run saw it.
	require.Less(t, r.RecoveryMax, 10*chaos.Lease+20*r.SlowestQuery, "takeover should come about a lease after the kill; the slowest: %s", r.SlowestTakeover)
}

func TestSIGSTOPPastTheLease(t *testing.T) {
	tasks, faultFor := chaos.Size()
	r := chaos.Scenario(t, tasks, faultFor, func(c *chaos.Cluster, stop <-chan struct{}) {
		n := c.Nodes[0]
		// The first freeze comes while the workload runs (it takes about a
		// second in the short mode).
		chaos.Every(stop, 300*time.Millisecond, 3*time.Second, func() {
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGSTOP))
			time.Sleep(2500 * time.Millisecond) // the fault: frozen for longer than the lease
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGCONT))
		})
	})
	require.Positive(t, r.Recovered, "the frozen node's tasks should have been taken over")
}
