package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
)

var nodeKind = api.Kind[WorkParams, string]{ID: "chaos.node"}

// wfNode is chaos.node, the workflow nodes' behavior. Its effect is a row
// in chaos_effect, written in the transaction of a fenced checkpoint that
// records the effect's run: a run that finds that checkpoint (a run after
// one that wrote its effect and was cut before its end was recorded)
// returns without writing it again, so each node's effect is written
// exactly once, however often its run is cut.
type wfNode struct{ work }

func (wfNode) Kind() api.Kind[WorkParams, string] { return nodeKind }

func (w wfNode) Run(ctx context.Context, rc spi.RunContext, p WorkParams) (string, error) {
	var done string
	if ok, err := rc.Progress(&done); err != nil {
		return "", err
	} else if ok {
		return done, nil
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	run := hex.EncodeToString(b)
	select {
	case <-ctx.Done():
		return "", context.Cause(ctx)
	case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
	}
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO chaos_effect (task_id, run_id, at) VALUES ($1, $2, clock_timestamp())`, string(rc.TaskID()), run); err != nil {
			return err
		}
		return rc.CheckpointTx(ctx, tx, run)
	})
	if err != nil {
		return "", api.Retryable("effect", "write effect: %v", err)
	}
	return run, nil
}

// createEffects creates chaos_effect, the workflow nodes' effects.
func createEffects(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	_, err := pool.Exec(ctx, `CREATE TABLE chaos_effect (task_id text NOT NULL, run_id text NOT NULL, at timestamptz NOT NULL)`)
	require.NoError(t, err)
}

// randomWorkflow returns workflow w of random shape: 3 to 12 nodes, each
// depending on up to three earlier ones, so chains, fan-outs, fan-ins and
// diamonds all occur.
func randomWorkflow(w int) api.WorkflowRequest {
	rng := mrand.New(mrand.NewPCG(uint64(w), 7))
	req := api.WorkflowRequest{ID: api.TaskID(fmt.Sprintf("wf-%04d", w))}
	n := 3 + rng.IntN(10)
	for i := range n {
		node := api.WorkflowNode{Name: fmt.Sprint("n", i),
			Task: api.SubmitRequest{Behavior: nodeKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"sleep_ms":%d}`, w*100+i, rng.IntN(100))}}
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
	if *long {
		workflows, faultFor = 200, 30*time.Second
	}
	c := newCluster(t)
	createEffects(t, c.ctx, c.pool)
	c.startAll()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// One goroutine kills and restarts: a node started while PostgreSQL
	// restarts would fail to start.
	cl := pgtest.Cluster()
	wg.Go(func() {
		tick := 0
		every(stop, 700*time.Millisecond, 700*time.Millisecond, func() {
			if tick++; tick == 3 && cl != nil {
				require.NoError(t, cl.Restart(c.ctx))
				return
			}
			n := c.nodes[mrand.IntN(2)]
			if n.cmd != nil {
				c.sigkill(n)
				c.start(n)
			}
		})
	})
	wg.Go(func() {
		n := c.nodes[2]
		every(stop, 300*time.Millisecond, 3*time.Second, func() {
			require.NoError(t, n.cmd.Process.Signal(syscall.SIGSTOP))
			time.Sleep(lease + lease/2) // the fault: frozen past the lease
			require.NoError(t, n.cmd.Process.Signal(syscall.SIGCONT))
		})
	})
	for w := range workflows {
		req := randomWorkflow(w)
		for {
			// A submit a fault failed may have stored the workflow or not:
			// the same id again shares what was stored.
			_, err := c.client.SubmitWorkflow(c.ctx, req)
			if err == nil {
				break
			}
			require.NoError(t, c.ctx.Err(), "gave up submitting %s: %v", req.ID, err)
			time.Sleep(50 * time.Millisecond) // backoff between retries of a failed submit
		}
	}
	time.Sleep(faultFor) // let the faults run over the workflows: the duration is the test's parameter
	close(stop)
	wg.Wait()
	for _, n := range c.nodes {
		if n.cmd == nil {
			c.start(n)
		}
	}

	// Every workflow ends, waiting while nodes keep finishing.
	count := func(q string, args ...any) int {
		var n int
		require.NoError(t, c.pool.QueryRow(c.ctx, q, args...).Scan(&n))
		return n
	}
	running, progressed, last := workflows, time.Now(), -1
	for running > 0 && time.Since(progressed) < time.Minute {
		time.Sleep(100 * time.Millisecond) // polling the database for quiescence, bounded by the progress deadline
		running = count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND status NOT IN ('success', 'failure')`, string(api.WorkflowBehavior))
		if done := count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND status = 'success'`, string(nodeKind.ID)); done != last {
			last, progressed = done, time.Now()
		}
	}
	for w := range workflows {
		wf, err := c.client.GetWorkflow(c.ctx, api.TaskID(fmt.Sprintf("wf-%04d", w)))
		require.NoError(t, err)
		require.Equal(t, api.WorkflowSucceeded, wf.State, "workflow %s: %+v", wf.ID, wf.Counts)
	}
	nodes := count(`SELECT count(*) FROM stint_task WHERE behavior = $1`, string(nodeKind.ID))
	require.Equal(t, nodes, count(`SELECT count(DISTINCT task_id) FROM chaos_effect`), "nodes with an effect")
	require.Zero(t, count(`SELECT count(*) FROM (SELECT task_id FROM chaos_effect GROUP BY task_id HAVING count(*) > 1) x`),
		"nodes whose effect was written more than once")
	require.Zero(t, count(`SELECT count(*) FROM stint_dependency e
		JOIN chaos_effect dep ON dep.task_id = e.depends_on
		JOIN chaos_effect node ON node.task_id = e.task_id
		WHERE node.at <= dep.at`), "nodes whose effect came before a dependency's")
	t.Logf("%d workflows, %d nodes, %d runs cut and run again", workflows, nodes,
		count(`SELECT count(*) FROM stint_task WHERE behavior = $1 AND attempt > 1`, string(nodeKind.ID)))
}
