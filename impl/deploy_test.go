package impl_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/spi"
)

// envChildRelease makes a child node run test.greet of this release (see
// registerGreet).
const envChildRelease = "STINT_TEST_CHILD_RELEASE"

// Two releases of test.greet: release 1's params are {name}; release 2
// added a field, extra, and raised the behavior's version.
type (
	greetV1 struct {
		Name string `json:"name" validate:"required"`
	}
	greetV2 struct {
		Name  string `json:"name" validate:"required"`
		Extra string `json:"extra,omitempty"`
	}
)

var (
	greetV1Kind = api.Kind[greetV1, string]{ID: "test.greet"}
	greetV2Kind = api.Kind[greetV2, string]{ID: "test.greet"}
)

// greet is test.greet of release 1 or 2: each run records its node in
// test_run.
type greet[P any] struct {
	kind    api.Kind[P, string]
	version int
	pool    *pgxpool.Pool
	node    string
}

func (g greet[P]) Kind() api.Kind[P, string]        { return g.kind }
func (greet[P]) TaskID(ids spi.IDs, _ P) api.TaskID { return ids.Unique() }
func (g greet[P]) Policy() spi.Policy               { return spi.Policy{Version: g.version, Lease: 5 * time.Second} }
func (g greet[P]) Run(ctx context.Context, rc spi.RunContext, _ P) (string, error) {
	_, err := g.pool.Exec(ctx, `INSERT INTO test_run (task_id, attempt, node) VALUES ($1, $2, $3)`, string(rc.TaskID()), rc.Attempt(), g.node)
	return g.node, err
}

// registerGreet registers test.greet of release (1 or 2) in reg.
func registerGreet(reg *spi.Registry, release int, pool *pgxpool.Pool, node string) {
	if release == 1 {
		spi.MustRegister[greetV1, string](reg, greet[greetV1]{kind: greetV1Kind, version: 1, pool: pool, node: node})
		return
	}
	spi.MustRegister[greetV2, string](reg, greet[greetV2]{kind: greetV2Kind, version: 2, pool: pool, node: node})
}

// childRelease is the release of test.greet a child node runs, 0 for none.
func childRelease() int {
	n, _ := strconv.Atoi(os.Getenv(envChildRelease))
	return n
}

// TestARollingDeployLosesNoTask deploys a release whose test.greet params
// gained a field, as teams do: two node processes of the old release run,
// a client of the new release submits, a node of the new release starts,
// and the old nodes stop one by one. Every task ends succeeded, none
// failed with invalid_params, none ran on an old node, and none counted an
// attempt for the old nodes that gave it back.
func TestARollingDeployLosesNoTask(t *testing.T) {
	t.Parallel()
	e := setup(t)
	node := func(name string, release int) *childtest.Child {
		return childtest.Start(t, envChildDSN+"="+e.dsn, envChildNode+"="+name, envChildLease+"=5000",
			envChildRelease+"="+strconv.Itoa(release))
	}
	oldA, oldB := node("old-a", 1), node("old-b", 1)
	reg := spi.NewRegistry()
	registerGreet(reg, 2, e.pool, "client")
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	var futures []*api.Future[string]
	for i := range 50 {
		f, err := api.Submit(e.ctx, c, greetV2Kind, greetV2{Name: fmt.Sprint("n", i), Extra: "new"})
		require.NoError(t, err)
		futures = append(futures, f)
	}
	first := futures[0].ID()
	waitFor(t, time.Minute, "the old nodes leave the new tasks, saying why", func() bool {
		task, err := c.Get(e.ctx, first)
		require.NoError(t, err)
		return task.Waiting != nil && task.Waiting.Detail == "no live node runs test.greet version 2 (nodes run 1)"
	})
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE behavior = 'test.greet' AND status = 'failure'`))

	node("new-a", 2)
	for _, old := range []*childtest.Child{oldA, oldB} {
		require.NoError(t, old.Cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, old.Cmd.Wait())
	}
	for _, f := range futures {
		got, err := f.Await(e.ctx)
		require.NoError(t, err, "task %s", f.ID())
		require.Equal(t, "new-a", got)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM test_run WHERE node <> 'new-a'`), "no task ran on a node of the old release")
	require.Equal(t, 50, e.count(`SELECT count(*) FROM test_run WHERE attempt = 1`), "each ran once, as its first attempt")
}

// TestATaskOfANewerVersionWaitsForANodeThatRunsIt: a task whose params an
// old node decodes, but of a newer version of its behavior, is left by
// the old node, says what it waits for, and runs once a node of its
// version is up; a task of the old version runs on the old node.
func TestATaskOfANewerVersionWaitsForANodeThatRunsIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	v1 := e.server("v1", 5*time.Second, func(cfg *impl.ServerConfig) { registerGreet(cfg.Registry, 1, e.pool, "v1") })
	reg := spi.NewRegistry()
	registerGreet(reg, 2, e.pool, "client")
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	f, err := api.Submit(e.ctx, c, greetV2Kind, greetV2{Name: "same fields"})
	require.NoError(t, err)
	old, err := api.Submit(e.ctx, v1, greetV1Kind, greetV1{Name: "old"})
	require.NoError(t, err)
	got, err := old.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, "v1", got, "a task of the old version runs on the old node")

	waitFor(t, time.Minute, "the new task says it waits for its version", func() bool {
		page, err := c.List(e.ctx, api.Filter{Behavior: "test.greet"})
		require.NoError(t, err)
		for _, task := range page.Tasks {
			if task.ID == f.ID() {
				return task.Version == 2 && task.Waiting != nil && task.Waiting.Reason == api.WaitNoNode && task.Waiting.Version == 2 &&
					task.Waiting.Detail == "no live node runs test.greet version 2 (nodes run 1)"
			}
		}
		return false
	})
	e.server("v2", 5*time.Second, func(cfg *impl.ServerConfig) { registerGreet(cfg.Registry, 2, e.pool, "v2") })
	got, err = f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, "v2", got)
	task, err := c.Get(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, 1, task.Attempt, "the old node's give-backs counted no attempt")
}

// Two releases of test.report's result: release 2 added a field.
type (
	reportV1 struct {
		Name string `json:"name"`
	}
	reportV2 struct {
		Name  string `json:"name"`
		Extra string `json:"extra"`
	}
)

var (
	reportV1Kind = api.Kind[greetV1, reportV1]{ID: "test.report"}
	reportV2Kind = api.Kind[greetV1, reportV2]{ID: "test.report"}
	readKind     = api.Kind[struct{}, string]{ID: "test.read"}
)

// report is test.report of release 2.
type report struct{}

func (report) Kind() api.Kind[greetV1, reportV2]        { return reportV2Kind }
func (report) TaskID(ids spi.IDs, _ greetV1) api.TaskID { return ids.Unique() }
func (report) Policy() spi.Policy                       { return spi.Policy{Version: 2} }
func (report) Run(_ context.Context, _ spi.RunContext, p greetV1) (reportV2, error) {
	return reportV2{Name: p.Name, Extra: "only release 2 knows"}, nil
}

// read is test.read, of the release before: it reads node report's
// result as release 1 knew it, and then as a number, which it is not.
type read struct{}

func (read) Kind() api.Kind[struct{}, string]          { return readKind }
func (read) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (read) Run(ctx context.Context, rc spi.RunContext, _ struct{}) (string, error) {
	r, err := spi.NodeResult[reportV1](ctx, rc, "report")
	if err != nil {
		return "", err
	}
	_, err = spi.NodeResult[int](ctx, rc, "report")
	return r.Name + "; " + err.Error(), nil
}

// TestResultsOfANewerReleaseDecodeLeniently: a node of an older release
// reads a dependency's result that a newer release wrote, with a field it
// does not know, and an awaiter built against the older release awaits
// one: both decode what they know; a result that does not decode says
// which version wrote it. The workflow's nodes keep their versions.
func TestResultsOfANewerReleaseDecodeLeniently(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second, func(cfg *impl.ServerConfig) {
		spi.MustRegister[greetV1, reportV2](cfg.Registry, report{})
		spi.MustRegister[struct{}, string](cfg.Registry, read{})
	})
	_, err := srv.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-versions", Nodes: []api.WorkflowNode{
		{Name: "report", Task: api.SubmitRequest{Behavior: reportV2Kind.ID, Params: mustJSON(greetV1{Name: "ada"})}},
		{Name: "read", Task: api.SubmitRequest{Behavior: readKind.ID}, DependsOn: []string{"report"}},
	}})
	require.NoError(t, err)
	w, err := srv.AwaitWorkflow(e.ctx, "wf-versions")
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, w.State)
	for _, n := range w.Nodes {
		want := map[string]int{"report": 2, "read": 0}[n.Name]
		require.Equal(t, want, n.Task.Version, "node %s keeps the version it was submitted with", n.Name)
		if n.Name == "read" {
			require.JSONEq(t, `"ada; decode result of workflow node \"report\" (test.report version 2): json: cannot unmarshal object into Go value of type int"`,
				string(n.Task.Result))
		}
	}

	f, err := api.Submit(e.ctx, srv, reportV1Kind, greetV1{Name: "bob"})
	require.NoError(t, err)
	got, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, reportV1{Name: "bob"}, got, "an awaiter of the older release reads what it knows")
}

// TestARunSpanNamesItsTasksVersion: the span of a run of a versioned task
// carries the version as stint.behavior.version.
func TestARunSpanNamesItsTasksVersion(t *testing.T) {
	t.Parallel()
	e := setup(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	srv := e.server("traced", 5*time.Second, func(cfg *impl.ServerConfig) {
		cfg.TracerProvider = tp
		registerGreet(cfg.Registry, 2, e.pool, "traced")
	})
	f, err := api.Submit(e.ctx, srv, greetV2Kind, greetV2{Name: "ada"})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)
	version := func() int64 {
		for _, s := range spans.GetSpans() {
			for _, a := range s.Attributes {
				if s.Name == "stint.run test.greet" && a.Key == "stint.behavior.version" {
					return a.Value.AsInt64()
				}
			}
		}
		return 0
	}
	waitFor(t, 10*time.Second, "the run span", func() bool { return version() != 0 })
	require.EqualValues(t, 2, version())
}
