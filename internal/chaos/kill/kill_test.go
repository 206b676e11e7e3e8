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
		// Each freeze comes once the node runs tasks: the workload takes
		// about a second in the short mode, less on a quiet machine, and
		// a freeze at a fixed time found the node with none.
		chaos.Every(stop, 0, 3*time.Second, func() {
			for !runsTasks(t, c, n) {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond): // polling the database until stop
				}
			}
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGSTOP))
			time.Sleep(2500 * time.Millisecond) // the fault: frozen for longer than the lease
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGCONT))
		})
	})
	require.Positive(t, r.Recovered, "the frozen node's tasks should have been taken over")
}

// runsTasks reports whether node n is inside a run that sleeps 70 ms or
// more yet: a freeze then stops it mid-run, so that the task runs again
// once taken over. A task the node claimed but has not started, frozen,
// runs once (by the node that takes it over), and a run about to end may
// have sent its end before the freeze.
func runsTasks(t *testing.T, c *chaos.Cluster, n *chaos.Node) bool {
	var running int
	require.NoError(t, c.Pool.QueryRow(c.Ctx, `SELECT count(*) FROM chaos_run r JOIN stint_task t ON t.id = r.task_id
		WHERE r.node = $1 AND r.ended IS NULL AND t.status = 'running'
		  AND (t.params->>'sleep_ms')::int >= 100 AND r.started > clock_timestamp() - interval '30 milliseconds'`, n.Name).Scan(&running))
	return running > 0
}
