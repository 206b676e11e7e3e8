package impl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// Environment of a child node process (see runChildNode).
const (
	envChildDSN   = "STINT_TEST_CHILD_DSN"
	envChildNode  = "STINT_TEST_CHILD_NODE"
	envChildLease = "STINT_TEST_CHILD_LEASE_MS"
	// envChildSubmit makes the child submit this many blocking test.work
	// tasks through its own server as it starts (see seed).
	envChildSubmit = "STINT_TEST_CHILD_SUBMIT"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChildDSN) != "" {
		runChildNode()
		return
	}
	pgtest.MainWithExamples(m)
}

// runChildNode runs a server node in this process until it is killed, for
// tests that SIGKILL a real process. It prints "ready" once started.
func runChildNode() {
	childtest.Serve(os.Getenv(envChildDSN), func(st *postgres.Store) (*impl.Server, error) {
		leaseMS, _ := strconv.Atoi(os.Getenv(envChildLease))
		node := os.Getenv(envChildNode)
		reg := testRegistry(st.Pool(), node, time.Duration(leaseMS)*time.Millisecond)
		if n, _ := strconv.Atoi(os.Getenv(envChildSubmit)); n > 0 {
			spi.MustRegister[KeyParams, struct{}](reg, seed{n: n})
		}
		if r := childRelease(); r > 0 {
			registerGreet(reg, r, st.Pool(), node)
		}
		return impl.NewServer(st, impl.ServerConfig{Node: node, Registry: reg, PollInterval: 100 * time.Millisecond})
	})
}

// WorkParams are the params of test.work.
type WorkParams struct {
	Key string `json:"key" validate:"required,max=100"`
	// SleepMS makes the run take this long.
	SleepMS int `json:"sleep_ms,omitempty" validate:"gte=0"`
	// BlockFirst makes the first attempt block until its context ends.
	BlockFirst bool `json:"block_first,omitempty"`
	// FailUntil makes attempts up to this number fail (retryably).
	FailUntil int `json:"fail_until,omitempty"`
	// Permanent makes failures permanent.
	Permanent bool `json:"permanent,omitempty"`
	// Recur makes the task run again after success until it ran this many
	// times.
	Recur int `json:"recur,omitempty"`
	// Gate makes every run wait, once recorded, until the gate of this
	// name is opened (openGate): for tests that act while a run is under
	// way, however slow the machine. Runs in this process only.
	Gate string `json:"gate,omitempty"`
}

// gates are the gates of test.work runs (WorkParams.Gate), by name.
var gates = struct {
	sync.Mutex
	m map[string]chan struct{}
}{m: map[string]chan struct{}{}}

// newGate returns the name of a new gate, closed until openGate. The name
// is t's and a number: a test run again (-count) gets a gate of its own.
func newGate(t *testing.T) string {
	gates.Lock()
	defer gates.Unlock()
	name := fmt.Sprintf("%s#%d", t.Name(), len(gates.m))
	gates.m[name] = make(chan struct{})
	return name
}

// gate returns the gate called name; nil, which never opens, if there is
// none.
func gate(name string) chan struct{} {
	gates.Lock()
	defer gates.Unlock()
	return gates.m[name]
}

// openGate opens the gate called name: the runs that wait for it go on,
// and later ones do not wait.
func openGate(name string) { close(gate(name)) }

// passGate waits until the gate called name opens, or ctx ends: then it
// returns ctx's cause.
func passGate(ctx context.Context, name string) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-gate(name):
		return nil
	}
}

// WorkResult is the result of test.work.
type WorkResult struct {
	Key     string `json:"key"`
	Attempt int    `json:"attempt"`
	Node    string `json:"node"`
}

var (
	workKind  = api.Kind[WorkParams, WorkResult]{ID: "test.work"}
	shareKind = api.Kind[WorkParams, WorkResult]{ID: "test.share"}
)

// work is test.work: it records every run start in test_run, with the node
// and lease, so tests can count runs per task.
type work struct {
	pool  *pgxpool.Pool
	node  string
	lease time.Duration
	kind  api.Kind[WorkParams, WorkResult]
	dedup spi.Dedup
}

func (w *work) Kind() api.Kind[WorkParams, WorkResult] { return w.kind }

func (w *work) TaskID(ids spi.IDs, p WorkParams) api.TaskID { return ids.Deterministic(p.Key) }

func (w *work) Policy() spi.Policy {
	return spi.Policy{Lease: w.lease, MaxAttempts: 3, BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Dedup: w.dedup}
}

func (w *work) Run(ctx context.Context, rc spi.RunContext, p WorkParams) (WorkResult, error) {
	if _, err := w.pool.Exec(ctx, `INSERT INTO test_run (task_id, attempt, node) VALUES ($1, $2, $3)`,
		string(rc.TaskID()), rc.Attempt(), w.node); err != nil {
		return WorkResult{}, err
	}
	if p.Gate != "" {
		if err := passGate(ctx, p.Gate); err != nil {
			return WorkResult{}, err
		}
	}
	if p.BlockFirst && rc.Attempt() == 1 {
		<-ctx.Done()
		return WorkResult{}, context.Cause(ctx)
	}
	if p.SleepMS > 0 {
		select {
		case <-ctx.Done():
			return WorkResult{}, context.Cause(ctx)
		case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
		}
	}
	if rc.Attempt() <= p.FailUntil {
		return WorkResult{}, &api.TaskError{Retryable: !p.Permanent, Code: "planned", Message: fmt.Sprintf("attempt %d fails", rc.Attempt())}
	}
	return WorkResult{Key: p.Key, Attempt: rc.Attempt(), Node: w.node}, nil
}

func (w *work) RescheduleAfterSuccess(p WorkParams, r WorkResult) (time.Duration, bool) {
	var runs int
	// The run was recorded before the result, so this counts it.
	err := w.pool.QueryRow(context.Background(), `SELECT count(*) FROM test_run WHERE task_id = $1`,
		string(spi.NewIDs(w.kind.ID).Deterministic(p.Key))).Scan(&runs)
	if err != nil || runs >= p.Recur {
		return 0, false
	}
	return 10 * time.Millisecond, true
}

// testRegistry holds demo.echo, test.work and test.share (test.work with
// Polaris dedup), and the behaviors of the tests of coordination, flow
// control, steps and signals.
func testRegistry(pool *pgxpool.Pool, node string, lease time.Duration) *spi.Registry {
	reg := spi.NewRegistry()
	if err := demo.Register(reg); err != nil {
		panic(err)
	}
	spi.MustRegister[WorkParams, WorkResult](reg, &work{pool: pool, node: node, lease: lease, kind: workKind})
	spi.MustRegister[WorkParams, WorkResult](reg, &work{pool: pool, node: node, lease: lease, kind: shareKind, dedup: spi.DedupShare})
	registerCoordBehaviors(reg, pool, node, lease)
	registerFlowBehaviors(reg, pool, node)
	registerKept(reg, pool)
	spi.MustRegister[collectParams, []json.RawMessage](reg, collect{pool: pool})
	spi.MustRegister[reopenParams, []json.RawMessage](reg, reopen{})
	registerWaitBehaviors(reg, pool)
	return reg
}

// env is one test's database, store and registry.
type env struct {
	t    *testing.T
	ctx  context.Context
	dsn  string
	st   *postgres.Store
	pool *pgxpool.Pool
}

// setup gives the test a fresh database with the test_run table.
func setup(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dsn := pgtest.New(t)
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	_, err = st.Pool().Exec(ctx, `
		CREATE TABLE test_run (task_id text, attempt int, node text, at timestamptz DEFAULT clock_timestamp());
		CREATE TABLE test_span (task_id text, key text, node text, started timestamptz, ended timestamptz);
		CREATE TABLE test_effect (task_id text, step int)`)
	require.NoError(t, err)
	return &env{t: t, ctx: ctx, dsn: dsn, st: st, pool: st.Pool()}
}

// server starts an in-process server node with lease for test.work.
func (e *env) server(node string, lease time.Duration, mod ...func(*impl.ServerConfig)) *impl.Server {
	e.t.Helper()
	cfg := impl.ServerConfig{Node: node, Registry: testRegistry(e.pool, node, lease),
		PollInterval: 100 * time.Millisecond, AwaitPollInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(e.t.Output(), nil))}
	for _, m := range mod {
		m(&cfg)
	}
	srv, err := impl.NewServer(e.st, cfg)
	require.NoError(e.t, err)
	require.NoError(e.t, srv.Start(e.ctx))
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return srv
}

// client returns a client-only Tasks on its own store (own pool), as a
// separate process would have.
func (e *env) client() *impl.Client {
	e.t.Helper()
	st, err := postgres.Open(e.ctx, e.dsn)
	require.NoError(e.t, err)
	e.t.Cleanup(st.Close)
	c, err := impl.NewClient(st, impl.ClientConfig{Registry: testRegistry(st.Pool(), "client", time.Second), PollInterval: 100 * time.Millisecond})
	require.NoError(e.t, err)
	e.t.Cleanup(c.Close)
	return c
}

// run submits p to tasks and awaits a successful result.
func (e *env) run(tasks api.Tasks, p WorkParams) (*api.Future[WorkResult], WorkResult) {
	e.t.Helper()
	f, err := api.Submit(e.ctx, tasks, workKind, p)
	require.NoError(e.t, err)
	res, err := f.Await(e.ctx)
	require.NoError(e.t, err)
	return f, res
}

// count runs a count(*) query.
func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(e.ctx, query, args...).Scan(&n))
	return n
}

// waitFor polls cond every 10 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func workReq(kind api.Kind[WorkParams, WorkResult], p WorkParams) api.SubmitRequest {
	raw, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return api.SubmitRequest{Behavior: kind.ID, Params: raw}
}

// dump returns the rows of query as text, one line each, for a failure's
// message.
func (e *env) dump(query string, args ...any) string {
	rows, err := e.pool.Query(e.ctx, query, args...)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return err.Error()
		}
		fmt.Fprintln(&b, vals...)
	}
	return b.String()
}
