package flow

import (
	"fmt"
	"github.com/stinthq/stint/internal/chaos"
	mrand "math/rand/v2"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
)

// Flow control through faults: the nodes run chaos.limited, whose tasks
// use a rate limit per key and are capped per key and across the cluster
// (one key's cap overridden at runtime), while nodes are killed, frozen
// past their lease or the database restarts. The run log (chaos_flow_run)
// must show no window of a key with more starts than the rate rule allows
// (by the database's start times) and no moment with more runs than a cap.

// pause is a time a node was stopped (killed, or frozen from until to):
// its runs ended there as far as the caps go, since a run's slot is its
// lease's and a stopped node renews none.
type pause struct {
	node     string
	from, to time.Time
}

// flowScenario runs count tasks of kind (chaos.limited or chaos.loose) on
// three node processes with fault going on, then checks the run log.
func flowScenario(t *testing.T, kind api.Kind[chaos.FlowParams, struct{}], count int, fault func(c *chaos.Cluster, pause func(*chaos.Node, func()), stop <-chan struct{})) {
	c := chaos.NewCluster(t)
	c.FlowLog()
	keyCaps := kind.ID == chaos.LimitedKind.ID
	// Two of the three nodes hand the slots of their runs' ends over to
	// the next tasks in the finishes (impl.ServerConfig.HandOver): the
	// caps bind, so their finishes claim under flow control, and the
	// caps hold beside the third node's claims as among their own.
	for _, n := range c.Nodes[:2] {
		n.HandOver = true
	}
	if keyCaps {
		require.NoError(t, c.Client.SetConcurrencyLimit(c.Ctx, api.ConcurrencyLimit{Behavior: chaos.LimitedKind.ID, Key: chaos.FlowBigKey, Max: chaos.FlowBigCap}))
	}
	c.StartAll()
	var mu sync.Mutex
	var pauses []pause
	now := func() time.Time {
		var at time.Time
		require.NoError(t, c.Pool.QueryRow(c.Ctx, `SELECT clock_timestamp()`).Scan(&at))
		return at
	}
	pause := func(n *chaos.Node, fault func()) {
		p := pause{node: n.Name, from: now()}
		fault()
		p.to = now()
		mu.Lock()
		pauses = append(pauses, p)
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { fault(c, pause, stop) })
	ids := c.SubmitFlow(kind, count)
	time.Sleep(5 * time.Second) // let the fault run over the workload: the duration is the test's parameter
	close(stop)
	wg.Wait()
	for _, n := range c.Nodes {
		if n.Cmd == nil {
			c.Start(n)
		}
	}
	c.AwaitSuccess(ids)
	starts, windows, most, lost, overlapped := checkFlowLog(t, c, pauses, keyCaps)
	t.Logf("%s: %d tasks, %d starts (%d ended by the engine, %d outlived their lease), %d rate windows checked, most running at once %d (cap %d), %d pauses",
		t.Name(), len(ids), starts, lost, overlapped, windows, most, chaos.FlowClusterCap, len(pauses))
}

// checkFlowLog checks the run log against the caps (those per key when
// keyCaps is set) and the rate rule and returns the starts and windows it
// checked and the most runs at once.
func checkFlowLog(t *testing.T, c *chaos.Cluster, pauses []pause, keyCaps bool) (starts, windows, most, lost, overlapped int) {
	rows, err := c.Pool.Query(c.Ctx, `SELECT task_id, node, key, executed_at, started, coalesce(ended, '9999-01-01'), lost FROM chaos_flow_run ORDER BY executed_at`)
	require.NoError(t, err)
	type run struct {
		task, node, key          string
		executed, started, ended time.Time
		lost                     bool
	}
	var runs []run
	for rows.Next() {
		var r run
		require.NoError(t, rows.Scan(&r.task, &r.node, &r.key, &r.executed, &r.started, &r.ended, &r.lost))
		// A run the engine ended (its lease lost or run out on a machine
		// too slow to renew it) had its slot until its lease ran out,
		// which the log cannot say: the engine cancels it when its lease
		// runs out by the node's clock, but its goroutine may take a
		// moment to see that. It counts at its start only.
		if r.lost {
			r.ended = r.started
			lost++
		}
		// A run's slot ends with its lease at the latest; a paused node
		// renews none, so its runs count until the pause only, and one
		// logged during the pause (its insert sent before) as ended at
		// once. A run with no end was killed: one logged after the
		// pause's record, as the kill came, counts as ended at once too.
		open := r.ended.Year() == 9999
		for _, p := range pauses {
			if p.node != r.node || !r.ended.After(p.from) || r.started.After(p.to) {
				continue
			}
			r.ended = p.from
			if r.started.After(p.from) {
				r.ended = r.started
			}
		}
		if open && r.ended.Year() == 9999 {
			r.ended = r.started
		}
		runs = append(runs, r)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, runs)
	// A run that outlived its lease without noticing (its node too slow
	// to renew it, the run over before the node saw the lease gone) lost
	// its slot when the task was taken over: when the task's next run was
	// claimed, at the latest.
	byTask := map[string][]int{}
	for i, r := range runs {
		byTask[r.task] = append(byTask[r.task], i)
	}
	for _, is := range byTask {
		sort.Slice(is, func(a, b int) bool { return runs[is[a]].executed.Before(runs[is[b]].executed) })
		for k := 0; k+1 < len(is); k++ {
			cur, next := &runs[is[k]], runs[is[k+1]]
			if next.executed.Before(cur.ended) {
				cur.ended = next.executed
				overlapped++
			}
		}
	}

	// Caps: at every start, the runs that overlap it.
	most = 0
	for _, r := range runs {
		all, key := 0, 0
		for _, o := range runs {
			if !o.started.After(r.started) && o.ended.After(r.started) {
				all++
				if o.key == r.key {
					key++
				}
			}
		}
		cap := chaos.FlowKeyCap
		if r.key == chaos.FlowBigKey {
			cap = chaos.FlowBigCap
		}
		if !keyCaps {
			cap = len(runs)
		}
		if key > cap || all > chaos.FlowClusterCap {
			// Say which runs overlapped, for the failure to tell why.
			var at []string
			for _, o := range runs {
				if !o.started.After(r.started) && o.ended.After(r.started) {
					at = append(at, fmt.Sprintf("%s %s on %s claimed %s ran %s..%s", o.key, o.task, o.node,
						o.executed.Format("15:04:05.000000"), o.started.Format("15:04:05.000000"), o.ended.Format("15:04:05.000000")))
				}
			}
			t.Errorf("at %s: %d runs of key %s (cap %d), %d in all (cap %d), pauses %v:\n%s",
				r.started.Format("15:04:05.000000"), key, r.key, cap, all, chaos.FlowClusterCap, pauses, strings.Join(at, "\n"))
			return len(runs), windows, most, lost, overlapped
		}
		most = max(most, all)
	}

	// The rate rule, per key, over every window between two starts.
	byKey := map[string][]time.Time{}
	for _, r := range runs {
		byKey[r.key] = append(byKey[r.key], r.executed)
	}
	windows = 0
	for key, ss := range byKey {
		sort.Slice(ss, func(i, j int) bool { return ss[i].Before(ss[j]) })
		for i := range ss {
			for j := i; j < len(ss); j++ {
				w := ss[j].Sub(ss[i])
				allowed := float64(chaos.FlowRate.Limit) + float64(chaos.FlowRate.Limit)*float64(w)/float64(chaos.FlowRate.Period)
				require.LessOrEqual(t, float64(j-i+1), allowed+1e-9, "key %s: %d starts within %s", key, j-i+1, w)
				windows++
			}
		}
	}
	return len(runs), windows, most, lost, overlapped
}

func TestFlowLimitsThroughSIGKILL(t *testing.T) {
	flowScenario(t, chaos.LimitedKind, 1000, func(c *chaos.Cluster, pause func(*chaos.Node, func()), stop <-chan struct{}) {
		chaos.Every(stop, 700*time.Millisecond, 700*time.Millisecond, func() {
			n := c.Nodes[mrand.IntN(len(c.Nodes))]
			if n.Cmd != nil {
				pause(n, func() { c.Sigkill(n) })
				c.Start(n)
			}
		})
	})
}

func TestFlowLimitsThroughSIGSTOPPastTheLease(t *testing.T) {
	for _, kind := range []api.Kind[chaos.FlowParams, struct{}]{chaos.LimitedKind, chaos.LooseKind} {
		t.Run(string(kind.ID), func(t *testing.T) { sigstopPastTheLease(t, kind) })
	}
}

func sigstopPastTheLease(t *testing.T, kind api.Kind[chaos.FlowParams, struct{}]) {
	flowScenario(t, kind, 1000, func(c *chaos.Cluster, pause func(*chaos.Node, func()), stop <-chan struct{}) {
		n := c.Nodes[0]
		chaos.Every(stop, 300*time.Millisecond, 3*time.Second, func() {
			pause(n, func() {
				require.NoError(t, n.Cmd.Process.Signal(syscall.SIGSTOP))
				time.Sleep(2500 * time.Millisecond) // the fault: frozen for longer than the lease
			})
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGCONT))
		})
	})
}

func TestFlowLimitsThroughPostgresRestart(t *testing.T) {
	cl := pgtest.Cluster()
	if cl == nil {
		t.Skip("the cluster is not this test binary's (STINT_TEST_DATABASE_URL is set)")
	}
	for _, kind := range []api.Kind[chaos.FlowParams, struct{}]{chaos.LimitedKind, chaos.LooseKind} {
		t.Run(string(kind.ID), func(t *testing.T) {
			flowScenario(t, kind, 1000, func(c *chaos.Cluster, _ func(*chaos.Node, func()), stop <-chan struct{}) {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				require.NoError(t, cl.Restart(c.Ctx))
			})
		})
	}
}
