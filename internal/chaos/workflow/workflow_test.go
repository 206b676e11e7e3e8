package workflow

import (
	"fmt"
	"github.com/stinthq/stint/internal/chaos"
	mrand "math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
)

// randomWorkflow returns workflow w of random shape: 3 to 12 nodes, each
// depending on up to three earlier ones, so chains, fan-outs, fan-ins and
// diamonds all occur.
func randomWorkflow(w int) api.WorkflowRequest {
	rng := mrand.New(mrand.NewPCG(uint64(w), 7))
	req := api.WorkflowRequest{ID: api.TaskID(fmt.Sprintf("wf-%04d", w))}
	n := 3 + rng.IntN(10)
	for i := range n {
		node := api.WorkflowNode{Name: fmt.Sprint("n", i),
			Task: api.SubmitRequest{Behavior: chaos.NodeKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"sleep_ms":%d}`, w*100+i, rng.IntN(100))}}
		for j := range i {
			if len(node.DependsOn) < 3 && rng.IntN(3) == 0 {
				node.DependsOn = append(node.DependsOn, fmt.Sprint("n", j))
			}
		}
		req.Nodes = append(req.Nodes, node)
	}
	return req
}

// Workflows under every fault at once: three node processes run random
// workflows while one of the first two is killed and started again every
// 700 ms, the third is stopped past its lease every 3 s, and PostgreSQL
// restarts once (when the cluster is the test binary's). Every workflow succeeds, every node's effect is written exactly
// once, and no node's effect is written before each of its dependencies'.
func TestWorkflowsUnderFaults(t *testing.T) {
	workflows, faultFor := 60, 5*time.Second
	if *chaos.Long {
		workflows, faultFor = 200, 30*time.Second
	}
	c := chaos.NewCluster(t)
	chaos.CreateEffects(t, c.Ctx, c.Pool)
	c.StartAll()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// One goroutine kills and restarts: a node started while PostgreSQL
	// restarts would fail to start.
	cl := pgtest.Cluster()
	wg.Go(func() {
		tick := 0
		chaos.Every(stop, 700*time.Millisecond, 700*time.Millisecond, func() {
			if tick++; tick == 3 && cl != nil {
				require.NoError(t, cl.Restart(c.Ctx))
				return
			}
			n := c.Nodes[mrand.IntN(2)]
			if n.Cmd != nil {
				c.Sigkill(n)
				c.Start(n)
			}
		})
	})
	wg.Go(func() {
		n := c.Nodes[2]
		chaos.Every(stop, 300*time.Millisecond, 3*time.Second, func() {
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGSTOP))
			time.Sleep(chaos.Lease + chaos.Lease/2) // the fault: frozen past the lease
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGCONT))
		})
	})
	for w := range workflows {
		req := randomWorkflow(w)
		for {
			// A submit a fault failed may have stored the workflow or not:
			// the same id again shares what was stored.
			_, err := c.Client.SubmitWorkflow(c.Ctx, req)
			if err == nil {
				break
			}
			require.NoError(t, c.Ctx.Err(), "gave up submitting %s: %v", req.ID, err)
			time.Sleep(50 * time.Millisecond) // backoff between retries of a failed submit
		}
	}
	time.Sleep(faultFor) // let the faults run over the workflows: the duration is the test's parameter
	close(stop)
	wg.Wait()
	for _, n := range c.Nodes {
		if n.Cmd == nil {
			c.Start(n)
		}
	}

	// Every workflow ends, waiting while nodes keep finishing.
	count := func(q string, args ...any) int {
		var n int
		require.NoError(t, c.Pool.QueryRow(c.Ctx, q, args...).Scan(&n))
		return n
	}
	running, progressed, last := workflows, time.Now(), -1
	for running > 0 && time.Since(progressed) < time.Minute {
		time.Sleep(100 * time.Millisecond) // polling the database for quiescence, bounded by the progress deadline
		running = count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND status NOT IN ('success', 'failure')`, string(api.WorkflowBehavior))
		if done := count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND status = 'success'`, string(chaos.NodeKind.ID)); done != last {
			last, progressed = done, time.Now()
		}
	}
	for w := range workflows {
		wf, err := c.Client.GetWorkflow(c.Ctx, api.TaskID(fmt.Sprintf("wf-%04d", w)))
		require.NoError(t, err)
		require.Equal(t, api.WorkflowSucceeded, wf.State, "workflow %s: %+v", wf.ID, wf.Counts)
	}
	nodes := count(`SELECT count(*) FROM stint_task WHERE behavior = $1`, string(chaos.NodeKind.ID))
	require.Equal(t, nodes, count(`SELECT count(DISTINCT task_id) FROM chaos_effect`), "nodes with an effect")
	require.Zero(t, count(`SELECT count(*) FROM (SELECT task_id FROM chaos_effect GROUP BY task_id HAVING count(*) > 1) x`),
		"nodes whose effect was written more than once")
	require.Zero(t, count(`SELECT count(*) FROM `+chaos.AllEdges+` e
		JOIN chaos_effect dep ON dep.task_id = e.depends_on
		JOIN chaos_effect node ON node.task_id = e.task_id
		WHERE node.at <= dep.at`), "nodes whose effect came before a dependency's")
	t.Logf("%d workflows, %d nodes, %d runs cut and run again", workflows, nodes,
		count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND attempt > 1`, string(chaos.NodeKind.ID)))
}
