package main

// The shape matrix (--shapes): tasks of the shapes users meet (run
// durations, per-node caps, several behaviors at once with their own caps
// and priorities, group keys under a cap, a backlog or a stream, one node
// or three), each rated against its ideal: the throughput its limits
// allow.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// shapeKind is one behavior (a River queue) of a shape.
type shapeKind struct {
	name     string        // the behavior's id suffix and River's queue
	dur      time.Duration // how long each run sleeps; 0: a no-op
	cap      int           // Policy.MaxConcurrency, River's queue MaxWorkers (per node); 0: none
	groupCap int           // Policy.GroupConcurrency (across nodes), with keys group keys; River has no such cap
	keys     int
	priority int // stint's Policy.Priority (lower first); River's priority is 1 + priority/3
	n        int // tasks
}

// shape is one row of the matrix.
type shape struct {
	name   string
	kinds  []shapeKind
	nodes  int
	stream bool // the tasks stream in at the ideal rate while the nodes work, instead of waiting in a backlog
}

// workers is the node's MaxWorkers that the ideals assume: stint's default
// and the River queues' default here.
func (c config) shapeWorkers() int {
	if c.stintWorkers > 0 {
		return c.stintWorkers
	}
	return 1000
}

// rate returns the most tasks/s k's limits allow on nodes nodes of
// workers slots, or +Inf for no-op tasks.
func (k shapeKind) rate(nodes, workers int) float64 {
	if k.dur <= 0 {
		return math.Inf(1)
	}
	at := nodes * workers
	if k.cap > 0 {
		at = nodes * min(k.cap, workers)
	}
	if k.groupCap > 0 {
		at = min(at, k.groupCap*k.keys)
	}
	return float64(at) / k.dur.Seconds()
}

// ideal returns the throughput s's limits allow: all its tasks over the
// time its slowest behavior needs at its own limits (they run side by
// side), or 0 when no limit binds below maxIdeal, where the machine, not
// the shape, bounds the rate.
func (s shape) ideal(workers int) float64 {
	total, longest := 0, 0.0
	for _, k := range s.kinds {
		total += k.n
		if r := k.rate(s.nodes, workers); !math.IsInf(r, 1) {
			longest = max(longest, float64(k.n)/r)
		}
	}
	if longest == 0 {
		return 0
	}
	if ideal := float64(total) / longest; ideal <= maxIdeal {
		return ideal
	}
	return 0
}

// maxIdeal is the highest ideal the matrix rates a shape by: above it the
// two shared cores bound the rate before the shape's limits do.
const maxIdeal = 20_000

// riverExpresses reports whether River can run s as stint does: River has
// no cap per group key.
func (s shape) riverExpresses() bool {
	return !slices.ContainsFunc(s.kinds, func(k shapeKind) bool { return k.groupCap > 0 })
}

// shapeMatrix returns the shapes, each sized to take about two seconds at
// its ideal (n tasks of no-op shapes).
func shapeMatrix(n int) []shape {
	sized := func(d time.Duration, c int) int {
		if d <= 0 {
			return n
		}
		perSec := float64(1000)
		if c > 0 {
			perSec = float64(c)
		}
		return max(160, min(n, int(2*perSec/d.Seconds())))
	}
	var out []shape
	for _, d := range []time.Duration{0, 10 * time.Millisecond, 100 * time.Millisecond} {
		for _, c := range []int{0, 8, 64} {
			name := fmt.Sprintf("%s runs, ", shapeDur(d))
			if c == 0 {
				name += "no cap"
			} else {
				name += fmt.Sprintf("MaxConcurrency %d", c)
			}
			out = append(out, shape{name: name + ", backlog, 1 node", nodes: 1,
				kinds: []shapeKind{{name: "a", dur: d, cap: c, n: sized(d, c)}}})
		}
	}
	ms10 := 10 * time.Millisecond
	out = append(out,
		shape{name: "10ms runs, MaxConcurrency 64, streaming, 1 node", nodes: 1, stream: true,
			kinds: []shapeKind{{name: "a", dur: ms10, cap: 64, n: sized(ms10, 64)}}},
		shape{name: "10ms runs, MaxConcurrency 8, backlog, 3 nodes", nodes: 3,
			kinds: []shapeKind{{name: "a", dur: ms10, cap: 8, n: 3 * sized(ms10, 8)}}},
		shape{name: "4 behaviors (10ms cap 8 prio 1, 10ms cap 64 prio 5, no-op prio 3, 100ms cap 16 prio 9), backlog, 1 node", nodes: 1,
			kinds: []shapeKind{
				{name: "a", dur: ms10, cap: 8, priority: 1, n: sized(ms10, 8)},
				{name: "b", dur: ms10, cap: 64, priority: 5, n: sized(ms10, 64)},
				{name: "c", priority: 3, n: n / 4},
				{name: "d", dur: 100 * time.Millisecond, cap: 16, priority: 9, n: sized(100*time.Millisecond, 16)},
			}},
		shape{name: "10ms runs, 16 group keys under GroupConcurrency 4, backlog, 1 node", nodes: 1,
			kinds: []shapeKind{{name: "a", dur: ms10, groupCap: 4, keys: 16, n: sized(ms10, 64)}}},
	)
	return out
}

func shapeDur(d time.Duration) string {
	if d <= 0 {
		return "no-op"
	}
	return d.String()
}

// shapeJobs returns the jobs of the shape matrix: per shape, stint and,
// where it can express the shape, River.
func (b *bench) shapeJobs() [][]job {
	var out [][]job
	for _, s := range shapeMatrix(b.cfg.shapesN) {
		if !strings.Contains(s.name, b.cfg.shapesMatch) {
			continue
		}
		jobs := []job{{"shape: " + s.name, sysStint, func(ctx context.Context) ([]Result, error) { return b.shapeStint(ctx, s) }}}
		if b.cfg.has(sysRiver) && s.riverExpresses() {
			jobs = append(jobs, job{"shape: " + s.name, sysRiver, func(ctx context.Context) ([]Result, error) { return b.shapeRiver(ctx, s) }})
		}
		out = append(out, jobs)
	}
	return out
}

// shapeParams are a shape task's params: its group key.
type shapeParams struct {
	Key string `json:"key,omitempty"`
}

// shapeTask is the behavior of one shapeKind: it sleeps its duration and
// counts its end.
type shapeTask struct {
	k    shapeKind
	ends *atomic.Int64
}

func (t shapeTask) Kind() api.Kind[shapeParams, struct{}] {
	return api.Kind[shapeParams, struct{}]{ID: api.BehaviorID("shape." + t.k.name)}
}
func (shapeTask) TaskID(ids spi.IDs, _ shapeParams) api.TaskID { return ids.Unique() }
func (shapeTask) GroupKey(p shapeParams) string                { return p.Key }
func (t shapeTask) Policy() spi.Policy {
	return spi.Policy{MaxConcurrency: t.k.cap, GroupConcurrency: t.k.groupCap, Priority: t.k.priority}
}
func (t shapeTask) Run(ctx context.Context, _ spi.RunContext, _ shapeParams) (struct{}, error) {
	defer t.ends.Add(1)
	if t.k.dur > 0 {
		return struct{}{}, spi.Sleep(ctx, t.k.dur)
	}
	return struct{}{}, nil
}

// shapeRequests returns the submit requests of k's tasks, its group keys
// in turn.
func shapeRequests(k shapeKind) []api.SubmitRequest {
	reqs := make([]api.SubmitRequest, k.n)
	id := api.BehaviorID("shape." + k.name)
	for i := range reqs {
		reqs[i] = api.SubmitRequest{Behavior: id, Params: []byte("{}")}
		if k.keys > 0 {
			reqs[i].Params = fmt.Appendf(nil, `{"key":"k%d"}`, i%k.keys)
		}
	}
	return reqs
}

// shapeStint runs shape s on stint: s.nodes servers in this process, each
// on a pool of its own, and a client on another that submits.
func (b *bench) shapeStint(ctx context.Context, s shape) ([]Result, error) {
	dsn, err := b.db.newDB(ctx, "shape_stint")
	if err != nil {
		return nil, err
	}
	var ends atomic.Int64
	reg := spi.NewRegistry()
	for _, k := range s.kinds {
		if err := spi.Register(reg, shapeTask{k: k, ends: &ends}); err != nil {
			return nil, fmt.Errorf("register %s: %w", k.name, err)
		}
	}
	var stores []*postgres.Store
	defer func() {
		for _, st := range stores {
			st.Close()
		}
	}()
	open := func(opts ...postgres.Option) (*postgres.Store, error) {
		st, err := postgres.Open(ctx, dsn, opts...)
		if err != nil {
			return nil, fmt.Errorf("stint: %w", err)
		}
		stores = append(stores, st)
		return st, nil
	}
	cst, err := open(postgres.Migrate())
	if err != nil {
		return nil, err
	}
	cli, err := impl.NewClient(cst, impl.ClientConfig{Registry: reg, Logger: b.log})
	if err != nil {
		return nil, fmt.Errorf("stint client: %w", err)
	}
	defer cli.Close()
	var srvs []*impl.Server
	for i := range s.nodes {
		st, err := open()
		if err != nil {
			return nil, err
		}
		sc := impl.ServerConfig{Registry: reg, Logger: b.log, Node: fmt.Sprintf("shape-%d", i),
			MaxWorkers: b.cfg.stintWorkers, PollInterval: b.cfg.stintPoll, FetchCooldown: b.cfg.stintCooldown, ClaimConcurrency: b.cfg.stintClaims}
		srv, err := impl.NewServer(st, sc)
		if err != nil {
			return nil, fmt.Errorf("stint server: %w", err)
		}
		srvs = append(srvs, srv)
	}
	submit := func(ctx context.Context, reqs []api.SubmitRequest) error {
		_, err := cli.SubmitMany(ctx, reqs)
		return err
	}
	start, stop := nodeControls(srvs, "stint server")
	return b.shapeRun(ctx, s, sysStint, shapeSystem{submit: submit, start: start, stop: stop, ends: &ends, dsn: dsn,
		completed: func(ctx context.Context) (int64, error) {
			return countRows(ctx, cst.Pool(), `SELECT count(*) FROM stint_task WHERE status = 'success'`)
		}})
}

// riverShapeArgs are a River shape job's args: how long it sleeps.
type riverShapeArgs struct {
	SleepUS int64 `json:"sleep_us"`
}

func (riverShapeArgs) Kind() string { return "bench_shape" }

// riverShapeWorker sleeps a job's duration and counts its end.
type riverShapeWorker struct {
	river.WorkerDefaults[riverShapeArgs]
	ends *atomic.Int64
}

func (w *riverShapeWorker) Work(ctx context.Context, job *river.Job[riverShapeArgs]) error {
	defer w.ends.Add(1)
	if job.Args.SleepUS > 0 {
		t := time.NewTimer(time.Duration(job.Args.SleepUS) * time.Microsecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// shapeRiver runs shape s on River: s.nodes working clients in this
// process, each on a pool of its own with a queue per behavior (MaxWorkers:
// the behavior's cap, or --river-workers), and an insert-only client.
func (b *bench) shapeRiver(ctx context.Context, s shape) ([]Result, error) {
	dsn, err := b.db.newDB(ctx, "shape_river")
	if err != nil {
		return nil, err
	}
	var pools []*pgxpool.Pool
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	pool := func() (*pgxpool.Pool, error) {
		p, err := riverPool(ctx, dsn, b.cfg.riverMaxConns)
		if err == nil {
			pools = append(pools, p)
		}
		return p, err
	}
	ipool, err := pool()
	if err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(ipool), nil)
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	ins, err := river.NewClient(riverpgxv5.New(ipool), &river.Config{Logger: b.log, FetchCooldown: b.cfg.riverCooldown, FetchPollInterval: b.cfg.riverPoll})
	if err != nil {
		return nil, fmt.Errorf("river insert-only client: %w", err)
	}
	var ends atomic.Int64
	queues := map[string]river.QueueConfig{}
	for _, k := range s.kinds {
		w := b.cfg.riverWorkers
		if k.cap > 0 {
			w = k.cap
		}
		queues[k.name] = river.QueueConfig{MaxWorkers: w}
	}
	var clients []*river.Client[pgx.Tx]
	for range s.nodes {
		p, err := pool()
		if err != nil {
			return nil, err
		}
		workers := river.NewWorkers()
		if err := river.AddWorkerSafely(workers, &riverShapeWorker{ends: &ends}); err != nil {
			return nil, fmt.Errorf("river add worker: %w", err)
		}
		cl, err := river.NewClient(riverpgxv5.New(p), &river.Config{Logger: b.log, Queues: queues, Workers: workers,
			FetchCooldown: b.cfg.riverCooldown, FetchPollInterval: b.cfg.riverPoll})
		if err != nil {
			return nil, fmt.Errorf("river client: %w", err)
		}
		clients = append(clients, cl)
	}
	// A request's behavior names its River queue; its params are unused.
	byBehavior := map[api.BehaviorID]shapeKind{}
	for _, k := range s.kinds {
		byBehavior[api.BehaviorID("shape."+k.name)] = k
	}
	submit := func(ctx context.Context, reqs []api.SubmitRequest) error {
		params := make([]river.InsertManyParams, len(reqs))
		for i, r := range reqs {
			k := byBehavior[r.Behavior]
			params[i] = river.InsertManyParams{Args: riverShapeArgs{SleepUS: k.dur.Microseconds()},
				InsertOpts: &river.InsertOpts{Queue: k.name, Priority: 1 + k.priority/3}}
		}
		_, err := ins.InsertMany(ctx, params)
		return err
	}
	start, stop := nodeControls(clients, "river client")
	return b.shapeRun(ctx, s, sysRiver, shapeSystem{submit: submit, start: start, stop: stop, ends: &ends, dsn: dsn,
		completed: func(ctx context.Context) (int64, error) {
			return countRows(ctx, ipool, `SELECT count(*) FROM river_job WHERE state = 'completed'`)
		}})
}

// node is a working side that starts and stops: stint's server, River's
// working client.
type node interface {
	Start(context.Context) error
	Stop(context.Context) error
}

// nodeControls returns the functions that start nodes in turn and stop
// them all (within 30 s); what names them in errors.
func nodeControls[N node](nodes []N, what string) (start, stop func(context.Context) error) {
	start = func(ctx context.Context) error {
		for _, n := range nodes {
			if err := n.Start(ctx); err != nil {
				return fmt.Errorf("start %s: %w", what, err)
			}
		}
		return nil
	}
	stop = func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var errs []error
		for _, n := range nodes {
			if err := n.Stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", what, err))
			}
		}
		return errors.Join(errs...)
	}
	return start, stop
}

// shapeSystem is what shapeRun needs of a system.
type shapeSystem struct {
	submit      func(context.Context, []api.SubmitRequest) error
	start, stop func(context.Context) error
	ends        *atomic.Int64 // runs that returned
	completed   func(context.Context) (int64, error)
	dsn         string // the database, for --sqlprofile
}

// shapeRun runs s on sys: with a backlog, every task submitted first and
// the time from the nodes' start until the last run returned; streaming,
// the nodes started first and each behavior's tasks submitted every 10 ms
// at its ideal rate, the time from the first submit until the last run
// returned.
func (b *bench) shapeRun(ctx context.Context, s shape, system string, sys shapeSystem) ([]Result, error) {
	total := 0
	for _, k := range s.kinds {
		total += k.n
	}
	if !s.stream {
		for _, k := range s.kinds {
			reqs := shapeRequests(k)
			for len(reqs) > 0 {
				n := min(len(reqs), 5000)
				if err := sys.submit(ctx, reqs[:n]); err != nil {
					return nil, fmt.Errorf("submit: %w", err)
				}
				reqs = reqs[n:]
			}
		}
	}
	stopProf := b.profile(system, "shape-"+sanitize(s.name))
	b.resetStatements(ctx)
	win := begin()
	if err := sys.start(ctx); err != nil {
		stopProf()
		return nil, err
	}
	var err error
	if s.stream {
		err = b.shapeStream(ctx, s, sys.submit)
	}
	if err == nil {
		err = waitFor(ctx, b.cfg.timeout, func() bool { return sys.ends.Load() >= int64(total) })
	}
	secs := time.Since(win.start).Seconds()
	cpu := win.usage()
	stopProf()
	b.collectStatements(ctx, system+" shape: "+s.name, sys.dsn, time.Since(win.start))
	stopErr := sys.stop(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	if stopErr != nil {
		return nil, stopErr
	}
	done, err := sys.completed(ctx)
	if err != nil {
		return nil, err
	}
	if done != int64(total) {
		return nil, fmt.Errorf("%d tasks completed, want %d", done, total)
	}
	return []Result{{Scenario: "shape: " + s.name, Metric: "work", System: system, Tasks: int64(total), Seconds: secs,
		Bound: s.ideal(b.cfg.shapeWorkers()), CPU: cpu}}, nil
}

// shapeStream submits s's tasks every 10 ms, each behavior's at its ideal
// rate, until all are submitted.
func (b *bench) shapeStream(ctx context.Context, s shape, submit func(context.Context, []api.SubmitRequest) error) error {
	const tick = 10 * time.Millisecond
	pending := make([][]api.SubmitRequest, len(s.kinds))
	for i, k := range s.kinds {
		pending[i] = shapeRequests(k)
	}
	start := time.Now()
	for i := 0; ; i++ {
		left := false
		for j, k := range s.kinds {
			per := max(1, int(math.Round(k.rate(s.nodes, b.cfg.shapeWorkers())*tick.Seconds())))
			n := min(per, len(pending[j]))
			if n == 0 {
				continue
			}
			if err := submit(ctx, pending[j][:n]); err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			pending[j] = pending[j][n:]
			left = left || len(pending[j]) > 0
		}
		if !left {
			return nil
		}
		sleep(ctx, time.Until(start.Add(time.Duration(i+1)*tick)))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// countRows runs a count query.
func countRows(ctx context.Context, pool *pgxpool.Pool, sql string) (int64, error) {
	var n int64
	if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", strings.Fields(sql)[0], err)
	}
	return n, nil
}
