package chaos

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
)

// Flow control through faults: the nodes run chaos.limited, whose tasks
// use a rate limit per key and are capped per key and across the cluster
// (one key's cap overridden at runtime), while nodes are killed, frozen
// past their lease or the database restarts. The run log (chaos_flow_run)
// must show no window of a key with more starts than the rate rule allows
// (by the database's start times) and no moment with more runs than a cap.

// FlowParams are the params of chaos.limited.
type FlowParams struct {
	N       int    `json:"n"`
	Key     string `json:"key"`
	SleepMS int    `json:"sleep_ms" validate:"gte=0,lte=1000"`
}

var limitedKind = api.Kind[FlowParams, struct{}]{ID: "chaos.limited"}

// looseKind is chaos.loose: chaos.limited without caps per key, whose
// claims are tried at once while its limits do not bind (the rate limit
// binds often here, so both the claim tried at once and the careful one
// run).
var looseKind = api.Kind[FlowParams, struct{}]{ID: "chaos.loose"}

// The limits of chaos.limited.
const (
	flowKeyCap     = 3
	flowClusterCap = 10
	flowBigKey     = "k0"
	flowBigCap     = 5 // the override of flowBigKey's cap, set at runtime
)

// flowRate is the rate limit chaos.limited's tasks use, per key.
var flowRate = api.RateLimit{Name: "chaos.rate", Limit: 40, Period: 200 * time.Millisecond}

// limited is chaos.limited: each run records its start (with the
// database's start time of its claim) and end in chaos_flow_run.
type limited struct {
	pool *pgxpool.Pool
	node string
}

func (limited) Kind() api.Kind[FlowParams, struct{}]        { return limitedKind }
func (limited) TaskID(ids spi.IDs, p FlowParams) api.TaskID { return ids.Deterministic(p.N) }
func (limited) GroupKey(p FlowParams) string                { return p.Key }
func (limited) RateUses(p FlowParams) []spi.RateUse {
	return []spi.RateUse{{Limit: flowRate.Name, Key: p.Key}}
}
func (limited) Policy() spi.Policy {
	return spi.Policy{Lease: lease, MaxAttempts: 1000, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		GroupConcurrency: flowKeyCap, ClusterConcurrency: flowClusterCap}
}

// loose is chaos.loose.
type loose struct{ limited }

func (loose) Kind() api.Kind[FlowParams, struct{}] { return looseKind }
func (l loose) Policy() spi.Policy {
	p := l.limited.Policy()
	p.GroupConcurrency = 0
	return p
}

func (l limited) Run(ctx context.Context, rc spi.RunContext, p FlowParams) (struct{}, error) {
	var id int64
	if err := l.pool.QueryRow(ctx, `INSERT INTO chaos_flow_run (task_id, node, key, executed_at, started)
		SELECT $1, $2, $3, executed_at, clock_timestamp() FROM stint_task WHERE id = $1 RETURNING id`,
		string(rc.TaskID()), l.node, p.Key).Scan(&id); err != nil {
		return struct{}{}, api.Retryable("record", "record start: %v", err)
	}
	defer func() { l.ended(id, time.Now(), ctx.Err() != nil) }()
	select {
	case <-ctx.Done():
		return struct{}{}, context.Cause(ctx)
	case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
	}
	return struct{}{}, nil
}

// ended records the end of run id at at, and whether the engine ended it
// (lost: its lease was lost or ran out), retrying while the database is
// away (a restart), so that the log holds every end but those of killed
// nodes.
func (l limited) ended(id int64, at time.Time, lost bool) {
	for try := 0; try < 300; try++ {
		if _, err := l.pool.Exec(context.Background(), `UPDATE chaos_flow_run SET ended = $2, lost = $3 WHERE id = $1`, id, at, lost); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // the database restarts: try again
	}
}

// pause is a time a node was stopped (killed, or frozen from until to):
// its runs ended there as far as the caps go, since a run's slot is its
// lease's and a stopped node renews none.
type pause struct {
	node     string
	from, to time.Time
}

// flowScenario runs count tasks of kind (chaos.limited or chaos.loose) on
// three node processes with fault going on, then checks the run log.
func flowScenario(t *testing.T, kind api.Kind[FlowParams, struct{}], count int, fault func(c *cluster, pause func(*node, func()), stop <-chan struct{})) {
	c := newCluster(t)
	c.flowLog()
	keyCaps := kind.ID == limitedKind.ID
	if keyCaps {
		require.NoError(t, c.client.SetConcurrencyLimit(c.ctx, api.ConcurrencyLimit{Behavior: limitedKind.ID, Key: flowBigKey, Max: flowBigCap}))
	}
	c.startAll()
	var mu sync.Mutex
	var pauses []pause
	now := func() time.Time {
		var at time.Time
		require.NoError(t, c.pool.QueryRow(c.ctx, `SELECT clock_timestamp()`).Scan(&at))
		return at
	}
	pause := func(n *node, fault func()) {
		p := pause{node: n.name, from: now()}
		fault()
		p.to = now()
		mu.Lock()
		pauses = append(pauses, p)
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { fault(c, pause, stop) })
	ids := c.submitFlow(kind, count)
	time.Sleep(5 * time.Second) // let the fault run over the workload: the duration is the test's parameter
	close(stop)
	wg.Wait()
	for _, n := range c.nodes {
		if n.cmd == nil {
			c.start(n)
		}
	}
	c.awaitSuccess(ids)
	starts, windows, most, lost, overlapped := checkFlowLog(t, c, pauses, keyCaps)
	t.Logf("%s: %d tasks, %d starts (%d ended by the engine, %d outlived their lease), %d rate windows checked, most running at once %d (cap %d), %d pauses",
		t.Name(), len(ids), starts, lost, overlapped, windows, most, flowClusterCap, len(pauses))
}

// flowLog creates the run log of chaos.limited and chaos.loose and
// stores their rate limit.
func (c *cluster) flowLog() {
	_, err := c.pool.Exec(c.ctx, `CREATE TABLE chaos_flow_run (id bigserial PRIMARY KEY, task_id text NOT NULL, node text NOT NULL,
		key text NOT NULL, executed_at timestamptz NOT NULL, started timestamptz NOT NULL, ended timestamptz,
		lost bool NOT NULL DEFAULT false)`)
	require.NoError(c.t, err)
	require.NoError(c.t, c.client.SetRateLimit(c.ctx, flowRate))
}

// submitFlow submits count tasks of kind (chaos.limited or chaos.loose)
// over four keys, retrying each batch of 100 until it is acknowledged, and
// returns their ids.
func (c *cluster) submitFlow(kind api.Kind[FlowParams, struct{}], count int) []string {
	var ids []string
	for start := 0; start < count; start += 100 {
		var reqs []api.SubmitRequest
		for n := start; n < min(start+100, count); n++ {
			reqs = append(reqs, api.SubmitRequest{Behavior: kind.ID,
				Params: fmt.Appendf(nil, `{"n":%d,"key":"k%d","sleep_ms":%d}`, n, n%4, mrand.IntN(40))})
		}
		for {
			subs, err := c.client.SubmitMany(c.ctx, reqs)
			if err == nil {
				for _, s := range subs {
					ids = append(ids, string(s.ID))
				}
				break
			}
			require.NoError(c.t, c.ctx.Err(), "gave up submitting: %v", err)
			time.Sleep(50 * time.Millisecond) // backoff between retries of a failed submit
		}
	}
	return ids
}

// awaitSuccess waits while the tasks ids make progress (a minute with
// none finishing ends the wait) and fails the test unless all succeeded.
func (c *cluster) awaitSuccess(ids []string) {
	done, progressed := 0, time.Now()
	for done < len(ids) && time.Since(progressed) < time.Minute {
		time.Sleep(100 * time.Millisecond) // polling for quiescence, bounded by the progress deadline
		var n int
		require.NoError(c.t, c.pool.QueryRow(c.ctx, `SELECT count(*) FROM stint_task WHERE id = ANY($1) AND status = 'success'`, ids).Scan(&n))
		if n > done {
			done, progressed = n, time.Now()
		}
	}
	require.Equal(c.t, len(ids), done, "every task succeeded")
}

// checkFlowLog checks the run log against the caps (those per key when
// keyCaps is set) and the rate rule and returns the starts and windows it
// checked and the most runs at once.
func checkFlowLog(t *testing.T, c *cluster, pauses []pause, keyCaps bool) (starts, windows, most, lost, overlapped int) {
	rows, err := c.pool.Query(c.ctx, `SELECT task_id, node, key, executed_at, started, coalesce(ended, '9999-01-01'), lost FROM chaos_flow_run ORDER BY executed_at`)
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
		cap := flowKeyCap
		if r.key == flowBigKey {
			cap = flowBigCap
		}
		if !keyCaps {
			cap = len(runs)
		}
		if key > cap || all > flowClusterCap {
			// Say which runs overlapped, for the failure to tell why.
			var at []string
			for _, o := range runs {
				if !o.started.After(r.started) && o.ended.After(r.started) {
					at = append(at, fmt.Sprintf("%s %s on %s claimed %s ran %s..%s", o.key, o.task, o.node,
						o.executed.Format("15:04:05.000000"), o.started.Format("15:04:05.000000"), o.ended.Format("15:04:05.000000")))
				}
			}
			t.Errorf("at %s: %d runs of key %s (cap %d), %d in all (cap %d), pauses %v:\n%s",
				r.started.Format("15:04:05.000000"), key, r.key, cap, all, flowClusterCap, pauses, strings.Join(at, "\n"))
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
				allowed := float64(flowRate.Limit) + float64(flowRate.Limit)*float64(w)/float64(flowRate.Period)
				require.LessOrEqual(t, float64(j-i+1), allowed+1e-9, "key %s: %d starts within %s", key, j-i+1, w)
				windows++
			}
		}
	}
	return len(runs), windows, most, lost, overlapped
}

func TestFlowLimitsThroughSIGKILL(t *testing.T) {
	flowScenario(t, limitedKind, 1000, func(c *cluster, pause func(*node, func()), stop <-chan struct{}) {
		every(stop, 700*time.Millisecond, 700*time.Millisecond, func() {
			n := c.nodes[mrand.IntN(len(c.nodes))]
			if n.cmd != nil {
				pause(n, func() { c.sigkill(n) })
				c.start(n)
			}
		})
	})
}

func TestFlowLimitsThroughSIGSTOPPastTheLease(t *testing.T) {
	for _, kind := range []api.Kind[FlowParams, struct{}]{limitedKind, looseKind} {
		t.Run(string(kind.ID), func(t *testing.T) { sigstopPastTheLease(t, kind) })
	}
}

func sigstopPastTheLease(t *testing.T, kind api.Kind[FlowParams, struct{}]) {
	flowScenario(t, kind, 1000, func(c *cluster, pause func(*node, func()), stop <-chan struct{}) {
		n := c.nodes[0]
		every(stop, 300*time.Millisecond, 3*time.Second, func() {
			pause(n, func() {
				require.NoError(t, n.cmd.Process.Signal(syscall.SIGSTOP))
				time.Sleep(2500 * time.Millisecond) // the fault: frozen for longer than the lease
			})
			require.NoError(t, n.cmd.Process.Signal(syscall.SIGCONT))
		})
	})
}

func TestFlowLimitsThroughPostgresRestart(t *testing.T) {
	cl := pgtest.Cluster()
	if cl == nil {
		t.Skip("the cluster is not this test binary's (STINT_TEST_DATABASE_URL is set)")
	}
	for _, kind := range []api.Kind[FlowParams, struct{}]{limitedKind, looseKind} {
		t.Run(string(kind.ID), func(t *testing.T) {
			flowScenario(t, kind, 1000, func(c *cluster, _ func(*node, func()), stop <-chan struct{}) {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				require.NoError(t, cl.Restart(c.ctx))
			})
		})
	}
}
