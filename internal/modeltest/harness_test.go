package modeltest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// Settings the bounds of the test follow from.
const (
	lease        = 2 * time.Second
	pollInterval = 100 * time.Millisecond
	maxWorkers   = 4
	// settleBound is how long the system may take to reach the state the
	// model predicts after a step: a run is claimed within a poll
	// interval of becoming due (sooner when notified), a removed run sees
	// its lease gone within a renewal (a third of a lease), and a claim
	// or completion is a few statements. Twice a lease plus ten polls
	// leaves room for a busy machine without hiding a task that waits
	// for a lease to expire.
	settleBound  = 2*lease + 10*pollInterval
	shortBackoff = 10 * time.Millisecond
)

// Params are the params of the test behaviors: none. The test decides
// what a run does.
type Params struct{}

// Result is the result of a test behavior.
type Result struct {
	Attempt int `json:"attempt"`
}

// behavior is one of the test behaviors on one node. Its runs log their
// start in model_run in the run's own transaction, fenced by CheckpointTx,
// then wait for the test to say how they end.
type behavior struct {
	spec behaviorSpec
	node string
	h    *harness
}

func (b *behavior) Kind() api.Kind[Params, Result] { return api.Kind[Params, Result]{ID: b.spec.id} }

func (b *behavior) TaskID(ids spi.IDs, _ Params) api.TaskID { return ids.Unique() }

func (b *behavior) Policy() spi.Policy {
	p := spi.Policy{Lease: lease, MaxAttempts: b.spec.maxAttempts, BackoffMin: shortBackoff, BackoffMax: shortBackoff,
		GroupConcurrency: b.spec.groupCap, MaxConcurrency: b.spec.nodeCap}
	if b.spec.longBackoff {
		p.BackoffMin, p.BackoffMax = time.Hour, time.Hour
	}
	if b.spec.share {
		p.Dedup = spi.DedupShare
	}
	return p
}

func (b *behavior) Run(ctx context.Context, rc spi.RunContext, _ Params) (Result, error) {
	h := b.h
	var runID int64
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO model_run (task_id, attempt, node, behavior, group_key)
			VALUES ($1, $2, $3, $4, $5) RETURNING id`,
			string(rc.TaskID()), rc.Attempt(), b.node, string(b.spec.id), h.groupOf(rc.TaskID())).Scan(&runID); err != nil {
			return err
		}
		return rc.CheckpointTx(ctx, tx, rc.Attempt())
	})
	if err != nil {
		return Result{}, err
	}
	defer func() {
		// Before the run returns: its slot is free only after.
		if _, err := h.pool.Exec(context.Background(), `UPDATE model_run SET ended = clock_timestamp() WHERE id = $1`, runID); err != nil {
			h.errorf("log the end of run %d: %v", runID, err)
		}
	}()
	lr := h.ctl.arrive(runKey{id: rc.TaskID(), attempt: rc.Attempt(), node: b.node})
	defer h.ctl.leave(lr)
	var ins instruction
	select {
	case <-ctx.Done():
		return Result{}, context.Cause(ctx)
	case ins = <-lr.in:
	}
	switch ins.kind {
	case runSuccess:
		return Result{Attempt: rc.Attempt()}, nil
	case runFailRetryable, runFailPermanent:
		return Result{}, &api.TaskError{Retryable: ins.kind == runFailRetryable, Code: "planned", Message: "the test said so"}
	}
	reqs := make([]api.SubmitRequest, len(ins.children))
	for i, c := range ins.children {
		reqs[i] = api.SubmitRequest{Behavior: behPlain.id, ID: c}
	}
	if _, err := rc.Spawn(ctx, reqs...); err != nil {
		h.errorf("spawn children of %s: %v", rc.TaskID(), err)
		return Result{}, err
	}
	return Result{}, spi.WaitForChildren(time.Hour)
}

// runKey names one run.
type runKey struct {
	id      api.TaskID
	attempt int
	node    string
}

// instruction says how a run ends.
type instruction struct {
	kind     runKind
	children []api.TaskID
}

// liveRun is a run waiting for its instruction.
type liveRun struct {
	key  runKey
	in   chan instruction
	done chan struct{} // closed when the run returns
}

// controller holds the runs that wait for the test.
type controller struct {
	mu   sync.Mutex
	runs map[runKey]*liveRun
}

func (c *controller) arrive(k runKey) *liveRun {
	lr := &liveRun{key: k, in: make(chan instruction, 1), done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs[k] != nil {
		// Two runs of one task, attempt and node at once: a duplicate
		// run. Keep both visible to the checks under distinct keys.
		k.node += "#dup"
		lr.key = k
	}
	c.runs[k] = lr
	return lr
}

func (c *controller) leave(lr *liveRun) {
	c.mu.Lock()
	if c.runs[lr.key] == lr {
		delete(c.runs, lr.key)
	}
	c.mu.Unlock()
	close(lr.done)
}

func (c *controller) snapshot() map[runKey]*liveRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[runKey]*liveRun, len(c.runs))
	for k, v := range c.runs {
		out[k] = v
	}
	return out
}

// harness is one sequence's database, nodes and run controller.
type harness struct {
	ctx    context.Context
	dsn    string
	st     *postgres.Store
	pool   *pgxpool.Pool
	client *impl.Client
	ctl    *controller
	log    *slog.Logger
	nodes  map[string]*impl.Server
	nextID int
	groups map[api.TaskID]string

	errMu sync.Mutex
	errs  []string // errors seen by runs, reported by the checks
}

func newHarness(ctx context.Context, dsn string, verbose io.Writer) (*harness, error) {
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := st.Pool().Exec(ctx, `CREATE TABLE model_run (
		id bigserial PRIMARY KEY, task_id text NOT NULL, attempt int NOT NULL, node text NOT NULL,
		behavior text NOT NULL, group_key text NOT NULL, removed bool NOT NULL DEFAULT false,
		started timestamptz NOT NULL DEFAULT clock_timestamp(), ended timestamptz)`); err != nil {
		st.Close()
		return nil, err
	}
	out := io.Discard
	if verbose != nil {
		out = verbose
	}
	h := &harness{ctx: ctx, dsn: dsn, st: st, pool: st.Pool(), ctl: &controller{runs: map[runKey]*liveRun{}},
		log: slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo})), nodes: map[string]*impl.Server{},
		groups: map[api.TaskID]string{}}
	h.client, err = impl.NewClient(st, impl.ClientConfig{Registry: h.registry("client"), PollInterval: pollInterval, Logger: h.log})
	if err != nil {
		st.Close()
		return nil, err
	}
	return h, nil
}

func (h *harness) errorf(format string, args ...any) {
	h.errMu.Lock()
	defer h.errMu.Unlock()
	h.errs = append(h.errs, fmt.Sprintf(format, args...))
}

func (h *harness) takeErrors() []string {
	h.errMu.Lock()
	defer h.errMu.Unlock()
	e := h.errs
	h.errs = nil
	return e
}

func (h *harness) groupOf(id api.TaskID) string {
	h.errMu.Lock()
	defer h.errMu.Unlock()
	return h.groups[id]
}

func (h *harness) setGroup(id api.TaskID, g string) {
	h.errMu.Lock()
	defer h.errMu.Unlock()
	h.groups[id] = g
}

func (h *harness) registry(node string) *spi.Registry {
	reg := spi.NewRegistry()
	for _, s := range specs {
		spi.MustRegister[Params, Result](reg, &behavior{spec: s, node: node, h: h})
	}
	return reg
}

// startNode starts a new in-process node and returns its name.
func (h *harness) startNode() (string, error) {
	h.nextID++
	name := fmt.Sprintf("node%d", h.nextID)
	srv, err := impl.NewServer(h.st, impl.ServerConfig{Node: name, Registry: h.registry(name), MaxWorkers: maxWorkers,
		PollInterval: pollInterval, AwaitPollInterval: pollInterval, Logger: h.log.With("node", name)})
	if err != nil {
		return "", err
	}
	if err := srv.Start(h.ctx); err != nil {
		return "", err
	}
	h.nodes[name] = srv
	return name, nil
}

// abandonNode stops a node without waiting for its runs: they are
// cancelled and their tasks given back.
func (h *harness) abandonNode(name string) error {
	srv := h.nodes[name]
	delete(h.nodes, name)
	ctx, cancel := context.WithCancel(h.ctx)
	cancel()
	return srv.Stop(ctx)
}

func (h *harness) close() {
	for name := range h.nodes {
		_ = h.abandonNode(name)
	}
	h.client.Close()
	h.st.Close()
}

// tasks lists every stored task.
func (h *harness) tasks(ctx context.Context) (map[api.TaskID]api.Task, error) {
	out := map[api.TaskID]api.Task{}
	var after api.TaskID
	for {
		page, err := h.client.List(ctx, api.Filter{After: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		for _, t := range page.Tasks {
			out[t.ID] = t
		}
		if page.Next == "" {
			return out, nil
		}
		after = page.Next
	}
}
