package chaos

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// FlowParams are the params of chaos.limited.
type FlowParams struct {
	N       int    `json:"n"`
	Key     string `json:"key"`
	SleepMS int    `json:"sleep_ms" validate:"gte=0,lte=1000"`
}

// LimitedKind is chaos.limited (see FlowLog): tasks capped per key and
// across the cluster, under a rate limit per key.
var LimitedKind = api.Kind[FlowParams, struct{}]{ID: "chaos.limited"}

// LooseKind is chaos.loose: chaos.limited without caps per key, whose
// claims are tried at once while its limits do not bind (the rate limit
// binds often here, so both the claim tried at once and the careful one
// run).
var LooseKind = api.Kind[FlowParams, struct{}]{ID: "chaos.loose"}

// The limits of chaos.limited.
const (
	FlowKeyCap     = 3
	FlowClusterCap = 10
	FlowBigKey     = "k0"
	FlowBigCap     = 5 // the override of FlowBigKey's cap, set at runtime
)

// FlowRate is the rate limit chaos.limited's tasks use, per key.
var FlowRate = api.RateLimit{Name: "chaos.rate", Limit: 40, Period: 200 * time.Millisecond}

// limited is chaos.limited: each run records its start (with the
// database's start time of its claim) and end in chaos_flow_run.
type limited struct {
	pool *pgxpool.Pool
	node string
}

func (limited) Kind() api.Kind[FlowParams, struct{}]        { return LimitedKind }
func (limited) TaskID(ids spi.IDs, p FlowParams) api.TaskID { return ids.Deterministic(p.N) }
func (limited) GroupKey(p FlowParams) string                { return p.Key }
func (limited) RateUses(p FlowParams) []spi.RateUse {
	return []spi.RateUse{{Limit: FlowRate.Name, Key: p.Key}}
}
func (limited) Policy() spi.Policy {
	return spi.Policy{Lease: Lease, MaxAttempts: 1000, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		GroupConcurrency: FlowKeyCap, ClusterConcurrency: FlowClusterCap}
}

// loose is chaos.loose.
type loose struct{ limited }

func (loose) Kind() api.Kind[FlowParams, struct{}] { return LooseKind }
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

// FlowLog creates the run log of chaos.limited and chaos.loose and
// stores their rate limit.
func (c *Cluster) FlowLog() {
	_, err := c.Pool.Exec(c.Ctx, `CREATE TABLE chaos_flow_run (id bigserial PRIMARY KEY, task_id text NOT NULL, node text NOT NULL,
		key text NOT NULL, executed_at timestamptz NOT NULL, started timestamptz NOT NULL, ended timestamptz,
		lost bool NOT NULL DEFAULT false)`)
	require.NoError(c.T, err)
	require.NoError(c.T, c.Client.SetRateLimit(c.Ctx, FlowRate))
}

// SubmitFlow submits count tasks of kind (chaos.limited or chaos.loose)
// over four keys, retrying each batch of 100 until it is acknowledged, and
// returns their ids.
func (c *Cluster) SubmitFlow(kind api.Kind[FlowParams, struct{}], count int) []string {
	var ids []string
	for start := 0; start < count; start += 100 {
		var reqs []api.SubmitRequest
		for n := start; n < min(start+100, count); n++ {
			reqs = append(reqs, api.SubmitRequest{Behavior: kind.ID,
				Params: fmt.Appendf(nil, `{"n":%d,"key":"k%d","sleep_ms":%d}`, n, n%4, mrand.IntN(40))})
		}
		for {
			subs, err := c.Client.SubmitMany(c.Ctx, reqs)
			if err == nil {
				for _, s := range subs {
					ids = append(ids, string(s.ID))
				}
				break
			}
			require.NoError(c.T, c.Ctx.Err(), "gave up submitting: %v", err)
			time.Sleep(50 * time.Millisecond) // backoff between retries of a failed submit
		}
	}
	return ids
}

// AwaitSuccess waits while the tasks ids make progress (a minute with
// none finishing ends the wait) and fails the test unless all succeeded.
func (c *Cluster) AwaitSuccess(ids []string) {
	done, progressed := 0, time.Now()
	for done < len(ids) && time.Since(progressed) < time.Minute {
		time.Sleep(100 * time.Millisecond) // polling for quiescence, bounded by the progress deadline
		var n int
		require.NoError(c.T, c.Pool.QueryRow(c.Ctx, `SELECT count(*) FROM stint_task WHERE id = ANY($1) AND status = 'success'`, ids).Scan(&n))
		if n > done {
			done, progressed = n, time.Now()
		}
	}
	require.Equal(c.T, len(ids), done, "every task succeeded")
}
