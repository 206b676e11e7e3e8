package modeltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
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
	// its lease gone within a renewal (a third of a lease), the tasks of
	// a killed node are taken over at most a lease after the kill plus a
	// lease-keeper tick, and a claim or completion is a few statements.
	// Twice a lease plus ten polls covers the slowest of these with room
	// for a busy machine.
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
// start in model_run in the run's own transaction, fenced by CheckpointTx
// (which keeps the attempt as the task's next step) and with the event
// "attempt" (SetEventTx), then poll
// model_instruction for the test's word on how they end: the test
// controls runs in child processes the same way as in its own. A run told
// to receive logs the payloads it received, in order (model_run.received).
type behavior struct {
	spec   behaviorSpec
	node   string
	pool   *pgxpool.Pool
	report func(format string, args ...any) // errors a run saw
}

func (b *behavior) Kind() api.Kind[Params, Result] { return api.Kind[Params, Result]{ID: b.spec.id} }

func (b *behavior) TaskID(ids spi.IDs, _ Params) api.TaskID { return ids.Unique() }

func (b *behavior) Policy() spi.Policy {
	p := spi.Policy{Lease: lease, MaxAttempts: b.spec.maxAttempts, BackoffMin: shortBackoff, BackoffMax: shortBackoff,
		GroupConcurrency: b.spec.groupCap, MaxConcurrency: b.spec.nodeCap, KeepSteps: true, ReopenOnSignal: b.spec.reopen}
	if b.spec.longBackoff {
		p.BackoffMin, p.BackoffMax = time.Hour, time.Hour
	}
	if b.spec.share {
		p.Dedup = spi.DedupShare
	}
	return p
}

// instructionPoll is how often a run looks for its instruction.
const instructionPoll = 20 * time.Millisecond

func (b *behavior) Run(ctx context.Context, rc spi.RunContext, _ Params) (Result, error) {
	var runID int64
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO model_run (task_id, attempt, node, behavior, group_key)
			VALUES ($1, $2, $3, $4, (SELECT coalesce(group_key, '') FROM stint_task WHERE id = $1)) RETURNING id`,
			string(rc.TaskID()), rc.Attempt(), b.node, string(b.spec.id)).Scan(&runID); err != nil {
			return err
		}
		if err := rc.SetEventTx(ctx, tx, "attempt", rc.Attempt()); err != nil {
			return err
		}
		return rc.CheckpointTx(ctx, tx, rc.Attempt())
	})
	if err != nil {
		return Result{}, err
	}
	// lost: the engine ended the run before it read its instruction (its
	// lease was lost, or its task removed, or its node stopped).
	lost, instructed := false, false
	defer func() {
		// Before the run returns: its slot is free only after.
		if _, err := b.pool.Exec(context.Background(), `UPDATE model_run SET ended = clock_timestamp(), lost = $2, instructed = $3
			WHERE id = $1 AND ended IS NULL`, runID, lost, instructed); err != nil {
			b.report("log the end of run %d: %v", runID, err)
		}
	}()
	var kind runKind
	var children []string
	for {
		err := b.pool.QueryRow(ctx, `SELECT kind, children FROM model_instruction WHERE run_id = $1`, runID).Scan(&kind, &children)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) && ctx.Err() == nil {
			b.report("read the instruction of run %d: %v", runID, err)
		}
		if err := spi.Sleep(ctx, instructionPoll); err != nil {
			lost = true
			return Result{}, err
		}
	}
	instructed = true
	if kind == runSleep || kind == runReceiveFail {
		received := []int{}
		for {
			sg, ok, err := rc.Receive(ctx, signalTopic)
			if err != nil {
				b.report("receive on %s: %v", rc.TaskID(), err)
				return Result{}, err
			}
			if !ok {
				break
			}
			var p int
			if err := json.Unmarshal(sg.Payload, &p); err != nil {
				b.report("message %d of %s: %v", sg.Seq, rc.TaskID(), err)
			}
			received = append(received, p)
		}
		if _, err := b.pool.Exec(ctx, `UPDATE model_run SET received = $2 WHERE id = $1`, runID, received); err != nil {
			b.report("log what run %d received: %v", runID, err)
			return Result{}, err
		}
	}
	switch kind {
	case runSuccess:
		return Result{Attempt: rc.Attempt()}, nil
	case runFailRetryable, runFailPermanent, runReceiveFail:
		return Result{}, &api.TaskError{Retryable: kind != runFailPermanent, Code: "planned", Message: "the test said so"}
	case runSleep:
		return Result{}, spi.WaitForSignal(signalTopic, time.Hour)
	}
	reqs := make([]api.SubmitRequest, len(children))
	for i, c := range children {
		reqs[i] = api.SubmitRequest{Behavior: behPlain.id, ID: api.TaskID(c)}
	}
	if _, err := rc.Spawn(ctx, reqs...); err != nil {
		b.report("spawn children of %s: %v", rc.TaskID(), err)
		return Result{}, err
	}
	return Result{}, spi.WaitForChildren(time.Hour)
}

// registry holds the test behaviors as node runs them.
func registry(pool *pgxpool.Pool, node string, report func(string, ...any)) *spi.Registry {
	reg := spi.NewRegistry()
	for _, s := range specs {
		spi.MustRegister[Params, Result](reg, &behavior{spec: s, node: node, pool: pool, report: report})
	}
	registerFlow(reg, pool, node)
	return reg
}

// runKey names one run.
type runKey struct {
	id      api.TaskID
	attempt int
	node    string
}

// harness is one sequence's database, nodes and run controller.
type harness struct {
	ctx    context.Context
	dsn    string
	st     *postgres.Store
	pool   *pgxpool.Pool
	client *impl.Client
	log    *slog.Logger
	nodes  map[string]*impl.Server     // in-process nodes
	procs  map[string]*childtest.Child // nodes in child processes
	nextID int

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
		lost bool NOT NULL DEFAULT false, instructed bool NOT NULL DEFAULT false,
		started timestamptz NOT NULL DEFAULT clock_timestamp(), ended timestamptz, received int[]);
		CREATE INDEX ON model_run (id) WHERE ended IS NULL;
		CREATE TABLE model_instruction (run_id bigint PRIMARY KEY, kind int NOT NULL, children text[] NOT NULL)`); err != nil {
		st.Close()
		return nil, err
	}
	out := io.Discard
	if verbose != nil {
		out = verbose
	}
	h := &harness{ctx: ctx, dsn: dsn, st: st, pool: st.Pool(),
		log: slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo})), nodes: map[string]*impl.Server{},
		procs: map[string]*childtest.Child{}}
	h.client, err = impl.NewClient(st, impl.ClientConfig{Registry: registry(h.pool, "client", h.errorf), PollInterval: pollInterval, Logger: h.log})
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

// startNode starts a new in-process node and returns its name.
func (h *harness) startNode() (string, error) {
	h.nextID++
	name := fmt.Sprintf("node%d", h.nextID)
	srv, err := newServer(h.st, name, h.log.With("node", name), h.errorf)
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

// newServer returns a test node.
func newServer(st *postgres.Store, name string, log *slog.Logger, report func(string, ...any)) (*impl.Server, error) {
	return impl.NewServer(st, impl.ServerConfig{Node: name, Registry: registry(st.Pool(), name, report), MaxWorkers: maxWorkers,
		PollInterval: pollInterval, AwaitPollInterval: pollInterval, Logger: log})
}

// Environment of a node in a child process (see TestMain).
const (
	envChildDSN  = "STINT_MODEL_CHILD_DSN"
	envChildNode = "STINT_MODEL_CHILD_NODE"
)

// runChild is the child process's side: a node until it is killed.
func runChild() {
	node := os.Getenv(envChildNode)
	childtest.Serve(os.Getenv(envChildDSN), func(st *postgres.Store) (*impl.Server, error) {
		report := func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "modeltest child %s: %s\n", node, fmt.Sprintf(format, args...))
		}
		return newServer(st, node, slog.New(slog.NewTextHandler(io.Discard, nil)), report)
	})
}

// startChild starts a node in a child process and returns its name.
func (h *harness) startChild(t testing.TB) string {
	h.nextID++
	name := fmt.Sprintf("proc%d", h.nextID)
	h.procs[name] = childtest.Start(t, envChildDSN+"="+h.dsn, envChildNode+"="+name)
	return name
}

// killChild kills a child node with SIGKILL. Its runs end there and then
// (the run log says so); their tasks stay running until their lease
// expires and a takeover gives them back.
func (h *harness) killChild(name string) error {
	c := h.procs[name]
	delete(h.procs, name)
	if err := c.Kill(); err != nil {
		return err
	}
	_, err := h.pool.Exec(h.ctx, `UPDATE model_run SET ended = clock_timestamp() WHERE node = $1 AND ended IS NULL`, name)
	return err
}

// lostRuns returns the runs the engine ended before they read their
// instruction.
func (h *harness) lostRuns(ctx context.Context) (map[runKey]bool, error) {
	rows, err := h.pool.Query(ctx, `SELECT task_id, attempt, node FROM model_run WHERE lost AND NOT removed`)
	if err != nil {
		return nil, err
	}
	out := map[runKey]bool{}
	var k runKey
	_, err = pgx.ForEachRow(rows, []any{&k.id, &k.attempt, &k.node}, func() error {
		out[k] = true
		return nil
	})
	return out, err
}

// openRuns returns the runs that started and did not end, by key, with
// their ids. More than one open run of a key is a duplicate run.
func (h *harness) openRuns(ctx context.Context) (map[runKey][]int64, error) {
	rows, err := h.pool.Query(ctx, `SELECT id, task_id, attempt, node FROM model_run WHERE ended IS NULL`)
	if err != nil {
		return nil, err
	}
	out := map[runKey][]int64{}
	var id int64
	var k runKey
	_, err = pgx.ForEachRow(rows, []any{&id, &k.id, &k.attempt, &k.node}, func() error {
		out[k] = append(out[k], id)
		return nil
	})
	return out, err
}

// instruct tells run id how to end and waits until it did. It reports
// false when the run ended without reading the instruction: the engine
// had ended it (its lease was lost on a machine too slow to renew it).
func (h *harness) instruct(ctx context.Context, id int64, kind runKind, children []api.TaskID) (bool, error) {
	cs := make([]string, len(children))
	for i, c := range children {
		cs[i] = string(c)
	}
	if _, err := h.pool.Exec(ctx, `INSERT INTO model_instruction (run_id, kind, children) VALUES ($1, $2, $3)`, id, int(kind), cs); err != nil {
		return false, err
	}
	deadline := time.Now().Add(settleBound)
	for {
		var ended, instructed bool
		if err := h.pool.QueryRow(ctx, `SELECT ended IS NOT NULL, instructed FROM model_run WHERE id = $1`, id).Scan(&ended, &instructed); err != nil {
			return false, err
		}
		if ended {
			return instructed, nil
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("run %d did not end within %s of its instruction", id, settleBound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *harness) close() {
	for name := range h.procs {
		_ = h.killChild(name)
	}
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
