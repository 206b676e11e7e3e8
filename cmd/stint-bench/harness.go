package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
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

// Names of the systems.
const (
	sysStint = "stint"
	sysRiver = "river"
	sysFloor = "floor"
)

// probe counts the runs a process started and, when armed, records when
// each run started, by key (the task id for stint, the sequence number for
// River), on this process's clock.
type probe struct {
	started atomic.Int64
	armed   atomic.Bool
	mu      sync.Mutex
	starts  map[string]time.Time
}

// arm starts recording start times.
func (p *probe) arm() {
	p.mu.Lock()
	p.starts = map[string]time.Time{}
	p.mu.Unlock()
	p.armed.Store(true)
}

// run records the start of a run; key is called only when armed.
func (p *probe) run(key func() string) {
	p.started.Add(1)
	if !p.armed.Load() {
		return
	}
	now := time.Now()
	k := key()
	p.mu.Lock()
	if _, dup := p.starts[k]; !dup {
		p.starts[k] = now
	}
	p.mu.Unlock()
}

// startOf returns when the run of key started.
func (p *probe) startOf(key string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.starts[key]
	return t, ok
}

// queries are the harness's SQL to watch progress: pending says whether any
// task is not done yet, completed counts the done tasks. pendingFrom, where
// set, returns the position (ctid, as text) of a task not done yet found at
// or after the position $1, or no row: the poll resumes where the last one
// found a pending task instead of walking again past every done one.
type queries struct {
	pending     string
	pendingFrom string
	completed   string
}

// harness is one system on one database: a client side that inserts and a
// worker side that runs no-op tasks.
type harness interface {
	// insert submits n no-op tasks with one batch call of the client side.
	insert(ctx context.Context, n int) error
	// insertOwn submits n no-op tasks with one batch call of the worker
	// side itself (stint's server node, River's working client, a Graphile
	// Worker process).
	insertOwn(ctx context.Context, n int) error
	// start starts working tasks.
	start(ctx context.Context) error
	// stop stops working, letting runs finish.
	stop(ctx context.Context) error
	// close releases the connections.
	close()
	probe() *probe
	queries() queries
	// observer is a small pool of its own for the harness's progress
	// queries.
	observer() *pgxpool.Pool
}

// newObserver opens the small pool the progress queries use.
func newObserver(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open the observer pool: %w", err)
	}
	return pool, nil
}

// ---- stint

// noopKind is the no-op behavior of the benchmark.
var noopKind = api.Kind[struct{}, struct{}]{ID: "bench.noop"}

// noop is a behavior that does nothing but tell the probe it ran.
type noop struct{ pr *probe }

func (noop) Kind() api.Kind[struct{}, struct{}]        { return noopKind }
func (noop) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (n noop) Run(_ context.Context, rc spi.RunContext, _ struct{}) (struct{}, error) {
	n.pr.run(func() string { return string(rc.TaskID()) })
	return struct{}{}, nil
}

// stintOptions are how a stint harness is built.
type stintOptions struct {
	server   bool // build a server (worker side)
	client   bool // build a client-only submitter on its own pool
	defaults bool // the server at stint's default ServerConfig, ignoring the --stint flags
	node     string
	flow     bool // register the flow-control behaviors too (cfg.flow)
	// register, if not nil, registers more behaviors.
	register func(*spi.Registry) error
}

// stintHarness runs stint: an impl.Client on its own store submits, an
// impl.Server works.
type stintHarness struct {
	st, cst *postgres.Store
	srv     *impl.Server
	cli     *impl.Client
	obs     *pgxpool.Pool
	pr      *probe
	flow    *flowRecorder // with stintOptions.flow
	reqs    []api.SubmitRequest
	dsn     string // the database, for --sqlprofile
}

// newStint opens stint on dsn, migrating it.
func newStint(ctx context.Context, dsn string, cfg config, log *slog.Logger, o stintOptions) (h *stintHarness, err error) {
	h = &stintHarness{pr: &probe{}, dsn: dsn}
	// A failed return sets h to nil: close what was opened through its
	// own pointer.
	opened := h
	defer func() {
		if err != nil {
			opened.close()
		}
	}()
	reg := spi.NewRegistry()
	if err := spi.Register[struct{}, struct{}](reg, noop{pr: h.pr}); err != nil {
		return nil, fmt.Errorf("register the no-op behavior: %w", err)
	}
	if o.flow {
		h.flow = newFlowRecorder()
		if err := registerFlow(reg, cfg.flow, h.flow); err != nil {
			return nil, err
		}
	}
	if o.register != nil {
		if err := o.register(reg); err != nil {
			return nil, fmt.Errorf("register the behaviors: %w", err)
		}
	}
	var opts []postgres.Option
	if cfg.stintMaxConns > 0 && !o.defaults {
		opts = append(opts, postgres.MaxConns(cfg.stintMaxConns))
	}
	if h.st, err = postgres.Open(ctx, dsn, append(opts, postgres.Migrate())...); err != nil {
		return nil, fmt.Errorf("stint: %w", err)
	}
	if o.client {
		if h.cst, err = postgres.Open(ctx, dsn); err != nil {
			return nil, fmt.Errorf("stint client: %w", err)
		}
		if h.cli, err = impl.NewClient(h.cst, impl.ClientConfig{Registry: reg, Logger: log}); err != nil {
			return nil, fmt.Errorf("stint client: %w", err)
		}
	}
	if o.server {
		sc := impl.ServerConfig{Registry: reg, Logger: log, Node: o.node}
		if !o.defaults {
			sc.MaxWorkers, sc.PollInterval, sc.FetchCooldown = cfg.stintWorkers, cfg.stintPoll, cfg.stintCooldown
			sc.ClaimConcurrency = cfg.stintClaims
		}
		sc.NoLocalStart = cfg.stintNoLocal
		if h.srv, err = impl.NewServer(h.st, sc); err != nil {
			return nil, fmt.Errorf("stint server: %w", err)
		}
	}
	if h.obs, err = newObserver(ctx, dsn); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *stintHarness) insert(ctx context.Context, n int) error {
	if _, err := h.cli.SubmitMany(ctx, h.requests(n)); err != nil {
		return fmt.Errorf("stint submit %d tasks: %w", n, err)
	}
	return nil
}

func (h *stintHarness) insertOwn(ctx context.Context, n int) error {
	if _, err := h.srv.SubmitMany(ctx, h.requests(n)); err != nil {
		return fmt.Errorf("stint server submit %d tasks: %w", n, err)
	}
	return nil
}

// requests returns n no-op submit requests.
func (h *stintHarness) requests(n int) []api.SubmitRequest {
	if len(h.reqs) < n {
		h.reqs = make([]api.SubmitRequest, n)
		for i := range h.reqs {
			h.reqs[i] = api.SubmitRequest{Behavior: noopKind.ID}
		}
	}
	return h.reqs[:n]
}

func (h *stintHarness) start(ctx context.Context) error {
	if err := h.srv.Start(ctx); err != nil {
		return fmt.Errorf("start stint server: %w", err)
	}
	return nil
}

func (h *stintHarness) stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := h.srv.Stop(ctx); err != nil {
		return fmt.Errorf("stop stint server: %w", err)
	}
	return nil
}

func (h *stintHarness) close() {
	if h.cli != nil {
		h.cli.Close()
	}
	for _, st := range []*postgres.Store{h.cst, h.st} {
		if st != nil {
			st.Close()
		}
	}
	if h.obs != nil {
		h.obs.Close()
	}
}

func (h *stintHarness) probe() *probe           { return h.pr }
func (h *stintHarness) observer() *pgxpool.Pool { return h.obs }
func (h *stintHarness) queries() queries {
	return queries{
		// Exactly the tasks not done yet (scheduled or running) have a due
		// time. No index covers it (the claim hints are in stint_due), so
		// the poll resumes at the last pending task it found: a TID range
		// scan from there.
		pending:     `SELECT EXISTS (SELECT 1 FROM stint_task WHERE schedule_not_before IS NOT NULL)`,
		pendingFrom: `SELECT ctid::text FROM stint_task WHERE ctid >= $1::tid AND schedule_not_before IS NOT NULL LIMIT 1`,
		completed:   `SELECT count(*) FROM stint_task WHERE status = 'success'`,
	}
}

// ---- River

// riverArgs are the args of River's no-op job.
type riverArgs struct {
	Seq int `json:"seq"`
}

// Kind is the River job kind.
func (riverArgs) Kind() string { return "bench_noop" }

// riverWorker is River's no-op worker.
type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	pr *probe
}

// Work does nothing but tell the probe it ran.
func (w *riverWorker) Work(_ context.Context, job *river.Job[riverArgs]) error {
	w.pr.run(func() string { return strconv.Itoa(job.Args.Seq) })
	return nil
}

// riverOptions are how a River harness is built.
type riverOptions struct {
	worker   bool // build a working client
	inserter bool // build an insert-only client on its own pool
	defaults bool // River's default fetch timing instead of the tuned one
}

// riverHarness runs River: an insert-only client on its own pool inserts, a
// client with a no-op worker works.
type riverHarness struct {
	pool, ipool *pgxpool.Pool
	cl, ins     *river.Client[pgx.Tx]
	obs         *pgxpool.Pool
	pr          *probe
	params      []river.InsertManyParams
}

// newRiver opens River on dsn, migrating it with rivermigrate.
func newRiver(ctx context.Context, dsn string, cfg config, log *slog.Logger, o riverOptions) (h *riverHarness, err error) {
	h = &riverHarness{pr: &probe{}}
	// A failed return sets h to nil: close what was opened through its
	// own pointer.
	opened := h
	defer func() {
		if err != nil {
			opened.close()
		}
	}()
	if h.pool, err = riverPool(ctx, dsn, cfg.riverMaxConns); err != nil {
		return nil, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(h.pool), nil)
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	if o.worker {
		workers := river.NewWorkers()
		if err := river.AddWorkerSafely(workers, &riverWorker{pr: h.pr}); err != nil {
			return nil, fmt.Errorf("river add worker: %w", err)
		}
		rc := &river.Config{
			Logger:  log,
			Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.riverWorkers}},
			Workers: workers,
		}
		if !o.defaults {
			rc.FetchCooldown, rc.FetchPollInterval = cfg.riverCooldown, cfg.riverPoll
		}
		if h.cl, err = river.NewClient(riverpgxv5.New(h.pool), rc); err != nil {
			return nil, fmt.Errorf("river client: %w", err)
		}
	}
	if o.inserter {
		if h.ipool, err = riverPool(ctx, dsn, cfg.riverMaxConns); err != nil {
			return nil, err
		}
		// The inserting client's FetchCooldown also paces its insert
		// notifications: give it the workers' fetch timing.
		ic := &river.Config{Logger: log}
		if !o.defaults {
			ic.FetchCooldown, ic.FetchPollInterval = cfg.riverCooldown, cfg.riverPoll
		}
		if h.ins, err = river.NewClient(riverpgxv5.New(h.ipool), ic); err != nil {
			return nil, fmt.Errorf("river insert-only client: %w", err)
		}
	}
	if h.obs, err = newObserver(ctx, dsn); err != nil {
		return nil, err
	}
	return h, nil
}

// riverPool opens a pool for River; maxConns 0 keeps pgxpool's default, as
// River's own benchmark does.
func riverPool(ctx context.Context, dsn string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open River's pool: %w", err)
	}
	return pool, nil
}

func (h *riverHarness) insert(ctx context.Context, n int) error {
	if _, err := h.ins.InsertMany(ctx, h.jobs(n)); err != nil {
		return fmt.Errorf("river insert %d jobs: %w", n, err)
	}
	return nil
}

func (h *riverHarness) insertOwn(ctx context.Context, n int) error {
	if _, err := h.cl.InsertMany(ctx, h.jobs(n)); err != nil {
		return fmt.Errorf("river worker insert %d jobs: %w", n, err)
	}
	return nil
}

// jobs returns the insert parameters of n no-op jobs.
func (h *riverHarness) jobs(n int) []river.InsertManyParams {
	if len(h.params) < n {
		h.params = make([]river.InsertManyParams, n)
		for i := range h.params {
			h.params[i] = river.InsertManyParams{Args: riverArgs{}}
		}
	}
	return h.params[:n]
}

func (h *riverHarness) start(ctx context.Context) error {
	if err := h.cl.Start(ctx); err != nil {
		return fmt.Errorf("start river client: %w", err)
	}
	return nil
}

func (h *riverHarness) stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := h.cl.Stop(ctx); err != nil {
		return fmt.Errorf("stop river client: %w", err)
	}
	return nil
}

func (h *riverHarness) close() {
	for _, p := range []*pgxpool.Pool{h.ipool, h.pool, h.obs} {
		if p != nil {
			p.Close()
		}
	}
}

func (h *riverHarness) probe() *probe           { return h.pr }
func (h *riverHarness) observer() *pgxpool.Pool { return h.obs }
func (h *riverHarness) queries() queries {
	return queries{
		// river_job_prioritized_fetching_index leads with state.
		// Through river_job_prioritized_fetching_index.
		pending:   `SELECT EXISTS (SELECT 1 FROM river_job WHERE state IN ('available', 'running', 'retryable', 'scheduled', 'pending'))`,
		completed: `SELECT count(*) FROM river_job WHERE state = 'completed'`,
	}
}
