package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// The flow-control scenarios (--flow), each a pair of rows, stint with and
// without the limit it measures:
//
//	limits-cost  --flow-n no-op tasks worked, under a rate limit and a
//	             cluster cap too high to bind, against none: the price of
//	             the claim under flow control
//	global-cap   4 server nodes of 10 workers, --flow-n/5 tasks of 100 ms,
//	             with a cluster cap of 40 against none
//	rate         a limit of 1,000 per second over a backlog of --flow-n
//	             tasks: the achieved rate, after the first second's burst,
//	             and the most starts in any second by the database's start
//	             times (the rule allows 2,000: the burst and a second's
//	             refill)
//	fair         one key with --flow-n due tasks and fair share, worked
//	             alone, then while another key submits 10 per second: the
//	             first key's throughput and the second's submit->start (a
//	             node of 100 workers)
//
// The nodes of global-cap run in this process, each on a store (and pool)
// of its own.

// flowParams are the params of the flow scenarios' behaviors.
type flowParams struct {
	Key     string `json:"k,omitempty"`
	Limit   string `json:"l,omitempty"`
	SleepMS int    `json:"s,omitempty"`
	// Sent is when the task was submitted, in Unix nanoseconds.
	Sent int64 `json:"t,omitempty"`
}

var (
	flowKind = api.Kind[flowParams, struct{}]{ID: "bench.flow"}
	fairKind = api.Kind[flowParams, struct{}]{ID: "bench.fair"}
)

// flowRecorder records the starts of the flow scenarios' tasks.
type flowRecorder struct {
	mu     sync.Mutex
	starts map[string][]time.Time     // by key
	waits  map[string][]time.Duration // submit->start by key
}

func (r *flowRecorder) record(p flowParams) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts[p.Key] = append(r.starts[p.Key], now)
	if p.Sent > 0 {
		r.waits[p.Key] = append(r.waits[p.Key], now.Sub(time.Unix(0, p.Sent)))
	}
}

func (r *flowRecorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.starts[key])
}

// flowBehavior is bench.flow or bench.fair.
type flowBehavior struct {
	kind api.Kind[flowParams, struct{}]
	rec  *flowRecorder
}

func (b flowBehavior) Kind() api.Kind[flowParams, struct{}]      { return b.kind }
func (flowBehavior) TaskID(ids spi.IDs, _ flowParams) api.TaskID { return ids.Unique() }
func (flowBehavior) GroupKey(p flowParams) string                { return p.Key }
func (b flowBehavior) Policy() spi.Policy                        { return spi.Policy{FairShare: b.kind == fairKind} }
func (flowBehavior) RateUses(p flowParams) []spi.RateUse {
	if p.Limit == "" {
		return nil
	}
	return []spi.RateUse{{Limit: p.Limit, Key: p.Key}}
}
func (b flowBehavior) Run(ctx context.Context, _ spi.RunContext, p flowParams) (struct{}, error) {
	b.rec.record(p)
	return struct{}{}, spi.Sleep(ctx, time.Duration(p.SleepMS)*time.Millisecond)
}

// flowEnv is a database with nodes running the flow behaviors.
type flowEnv struct {
	stores []*postgres.Store
	nodes  []*impl.Server
	client *impl.Client
	rec    *flowRecorder
	// timeout bounds a run's wait for its tasks.
	timeout time.Duration
}

// newFlowEnv opens a fresh database with nodes servers of workers each
// (0: the --stint-workers default), not started.
func (b *bench) newFlowEnv(ctx context.Context, label string, nodes, workers int) (*flowEnv, error) {
	dsn, err := b.db.newDB(ctx, label)
	if err != nil {
		return nil, err
	}
	e := &flowEnv{rec: &flowRecorder{starts: map[string][]time.Time{}, waits: map[string][]time.Duration{}}, timeout: b.cfg.timeout}
	reg := spi.NewRegistry()
	for _, k := range []api.Kind[flowParams, struct{}]{flowKind, fairKind} {
		if err := spi.Register[flowParams, struct{}](reg, flowBehavior{kind: k, rec: e.rec}); err != nil {
			return nil, err
		}
	}
	if workers == 0 {
		workers = b.cfg.stintWorkers
	}
	for i := range nodes {
		opts := []postgres.Option{}
		if i == 0 {
			opts = append(opts, postgres.Migrate())
		}
		st, err := postgres.Open(ctx, dsn, opts...)
		if err != nil {
			e.close()
			return nil, err
		}
		e.stores = append(e.stores, st)
		srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg, Logger: b.log, Node: fmt.Sprintf("flow-%d", i),
			MaxWorkers: workers, PollInterval: b.cfg.stintPoll, FetchCooldown: b.cfg.stintCooldown, ClaimConcurrency: b.cfg.stintClaims})
		if err != nil {
			e.close()
			return nil, err
		}
		e.nodes = append(e.nodes, srv)
	}
	// The client submits on a pool of its own, as another process would.
	cst, err := postgres.Open(ctx, dsn)
	if err != nil {
		e.close()
		return nil, err
	}
	e.stores = append(e.stores, cst)
	if e.client, err = impl.NewClient(cst, impl.ClientConfig{Registry: reg, Logger: b.log}); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *flowEnv) start(ctx context.Context) error {
	for _, n := range e.nodes {
		if err := n.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (e *flowEnv) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range e.nodes {
		_ = n.Stop(ctx)
	}
	if e.client != nil {
		e.client.Close()
	}
	for _, st := range e.stores {
		st.Close()
	}
}

// submit submits n tasks of kind with p in batches of 1,000.
func (e *flowEnv) submit(ctx context.Context, kind api.Kind[flowParams, struct{}], n int, p flowParams) error {
	raw, err := json.Marshal(p)
	if err != nil {
		return err
	}
	for done := 0; done < n; done += 1000 {
		reqs := make([]api.SubmitRequest, min(1000, n-done))
		for i := range reqs {
			reqs[i] = api.SubmitRequest{Behavior: kind.ID, Params: raw}
		}
		if _, err := e.client.SubmitMany(ctx, reqs); err != nil {
			return err
		}
	}
	return nil
}

// workAll starts the nodes and waits until key has started n tasks; it
// returns the time from the start to the last start.
func (e *flowEnv) workAll(ctx context.Context, key string, n int) (time.Duration, error) {
	start := time.Now()
	if err := e.start(ctx); err != nil {
		return 0, err
	}
	if err := waitFor(ctx, e.timeout, func() bool { return e.rec.count(key) >= n }); err != nil {
		return 0, fmt.Errorf("%d of %d tasks started: %w", e.rec.count(key), n, err)
	}
	return time.Since(start), nil
}

// flowJobs returns the flow scenarios' jobs, each a row with and without
// its limit.
func (b *bench) flowJobs() [][]job {
	n := b.cfg.flowN
	pair := func(scenario string, fn func(ctx context.Context, limited bool) ([]Result, error)) []job {
		return []job{
			{scenario, sysStint, func(ctx context.Context) ([]Result, error) { return fn(ctx, false) }},
			{scenario, sysStint + " (limits)", func(ctx context.Context) ([]Result, error) { return fn(ctx, true) }},
		}
	}
	return [][]job{
		pair("limits-cost", func(ctx context.Context, limited bool) ([]Result, error) { return b.limitsCost(ctx, n, limited) }),
		pair("global-cap", func(ctx context.Context, limited bool) ([]Result, error) {
			return b.globalCap(ctx, max(n/5, 40), limited)
		}),
		{{"rate", sysStint + " (limits)", func(ctx context.Context) ([]Result, error) { return b.rate(ctx, n) }}},
		pair("fair", func(ctx context.Context, limited bool) ([]Result, error) { return b.fair(ctx, n, limited) }),
	}
}

func flowRow(scenario, system, metric string, tasks int, d time.Duration) Result {
	return Result{Scenario: scenario, System: system, Metric: metric, Tasks: int64(tasks), Seconds: d.Seconds(),
		PerSec: float64(tasks) / d.Seconds()}
}

func flowSystem(limited bool) string {
	if limited {
		return sysStint + " (limits)"
	}
	return sysStint
}

// limitsCost works n no-op tasks, with limited under a rate limit and a
// cluster cap too high to bind.
func (b *bench) limitsCost(ctx context.Context, n int, limited bool) ([]Result, error) {
	e, err := b.newFlowEnv(ctx, "flow_cost", 1, 0)
	if err != nil {
		return nil, err
	}
	defer e.close()
	p := flowParams{Key: "k"}
	if limited {
		if err := e.client.SetRateLimit(ctx, api.RateLimit{Name: "cost", Limit: 1 << 40, Period: time.Second}); err != nil {
			return nil, err
		}
		if err := e.client.SetConcurrencyLimit(ctx, api.ConcurrencyLimit{Behavior: flowKind.ID, Max: 1 << 30}); err != nil {
			return nil, err
		}
		p.Limit = "cost"
	}
	if err := e.submit(ctx, flowKind, n, p); err != nil {
		return nil, err
	}
	d, err := e.workAll(ctx, "k", n)
	if err != nil {
		return nil, err
	}
	return []Result{flowRow("limits-cost", flowSystem(limited), "work", n, d)}, nil
}

// globalCap works n tasks of 100 ms on 4 nodes of 10 workers, with limited
// under a cluster cap of 40.
func (b *bench) globalCap(ctx context.Context, n int, limited bool) ([]Result, error) {
	e, err := b.newFlowEnv(ctx, "flow_cap", 4, 10)
	if err != nil {
		return nil, err
	}
	defer e.close()
	if limited {
		if err := e.client.SetConcurrencyLimit(ctx, api.ConcurrencyLimit{Behavior: flowKind.ID, Max: 40}); err != nil {
			return nil, err
		}
	}
	if err := e.submit(ctx, flowKind, n, flowParams{Key: "k", SleepMS: 100}); err != nil {
		return nil, err
	}
	d, err := e.workAll(ctx, "k", n)
	if err != nil {
		return nil, err
	}
	return []Result{flowRow("global-cap", flowSystem(limited), "work", n, d)}, nil
}

// rate works a backlog of n tasks under a limit of 1,000 per second: the
// rate achieved after the first second (the burst), and the most starts
// in a second, as metric "max/s" (the rule allows 2,000).
func (b *bench) rate(ctx context.Context, n int) ([]Result, error) {
	e, err := b.newFlowEnv(ctx, "flow_rate", 1, 0)
	if err != nil {
		return nil, err
	}
	defer e.close()
	const limit = 1000
	if err := e.client.SetRateLimit(ctx, api.RateLimit{Name: "rate", Limit: limit, Period: time.Second}); err != nil {
		return nil, err
	}
	if err := e.submit(ctx, flowKind, n, flowParams{Key: "k", Limit: "rate"}); err != nil {
		return nil, err
	}
	if _, err := e.workAll(ctx, "k", n); err != nil {
		return nil, err
	}
	// The rule holds for the database's start times (the claims' clock).
	rows, err := e.stores[0].Pool().Query(ctx, `SELECT executed_at FROM stint_task WHERE behavior = $1 ORDER BY executed_at`, string(flowKind.ID))
	if err != nil {
		return nil, err
	}
	starts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return nil, err
	}
	most := 0
	for i, j := 0, 0; j < len(starts); j++ {
		for starts[j].Sub(starts[i]) >= time.Second {
			i++
		}
		most = max(most, j-i+1)
	}
	if len(starts) <= limit {
		return nil, fmt.Errorf("rate: %d tasks are within the first burst of %d", len(starts), limit)
	}
	after := starts[limit:]
	span := after[len(after)-1].Sub(starts[limit-1])
	return []Result{
		flowRow("rate", sysStint+" (limits)", "work", len(after), span),
		{Scenario: "rate", System: sysStint + " (limits)", Metric: "max/s", Tasks: int64(most), Seconds: 1, PerSec: float64(most)},
	}, nil
}

// fair works n due tasks of one key under fair share, alone or (limited)
// while a second key submits 10 tasks per second: the first key's
// throughput and the second's submit->start.
func (b *bench) fair(ctx context.Context, n int, limited bool) ([]Result, error) {
	// 100 workers: a node's runs start in the order they were claimed, so
	// a node that holds a thousand claimed no-op runs at a time starts the
	// second key's task after them, whatever order the claim chose.
	e, err := b.newFlowEnv(ctx, "flow_fair", 1, 100)
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.submit(ctx, fairKind, n, flowParams{Key: "big"}); err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var submitErr error
	if limited {
		wg.Go(func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-t.C:
					if err := e.submit(ctx, fairKind, 1, flowParams{Key: "small", Sent: time.Now().UnixNano()}); err != nil {
						submitErr = err
						return
					}
				}
			}
		})
	}
	d, err := e.workAll(ctx, "big", n)
	close(stop)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if submitErr != nil {
		return nil, submitErr
	}
	out := []Result{flowRow("fair", flowSystem(limited), "work", n, d)}
	if limited {
		e.rec.mu.Lock()
		waits := append([]time.Duration(nil), e.rec.waits["small"]...)
		e.rec.mu.Unlock()
		if len(waits) > 0 {
			out = append(out, Result{Scenario: "fair", System: sysStint + " (limits)", Metric: "submit->start",
				Tasks: int64(len(waits)), Latency: summarize(waits)})
		}
	}
	return out, nil
}
