package impl_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// GrowParams ask a test.grow run to add Add to its workflow. With Tx, it
// adds them in a transaction of its own that also writes a test_effect
// row, and commits it, or rolls it back with Rollback.
type GrowParams struct {
	Add      api.WorkflowGrowth `json:"add"`
	Tx       bool               `json:"tx,omitempty"`
	Rollback bool               `json:"rollback,omitempty"`
}

// GrowResult says how the run's AddNodes ended: "" or its error.
type GrowResult struct {
	Err string `json:"err,omitempty"`
	// Invalid and Conflict say whether the error wrapped api.ErrInvalid
	// or api.ErrConflict.
	Invalid  bool `json:"invalid,omitempty"`
	Conflict bool `json:"conflict,omitempty"`
	// Seen counts the added nodes another connection saw before the
	// run's transaction ended (with Tx).
	Seen int `json:"seen,omitempty"`
}

var growKind = api.Kind[GrowParams, GrowResult]{ID: "test.grow"}

// grow is test.grow: its run records itself in test_run, adds its
// params' nodes to its workflow and succeeds whatever AddNodes said,
// reporting it.
type grow struct{ pool *pgxpool.Pool }

func (grow) Kind() api.Kind[GrowParams, GrowResult]      { return growKind }
func (grow) TaskID(ids spi.IDs, _ GrowParams) api.TaskID { return ids.Unique() }
func (g grow) Run(ctx context.Context, rc spi.RunContext, p GrowParams) (GrowResult, error) {
	if _, err := g.pool.Exec(ctx, `INSERT INTO test_run (task_id, attempt) VALUES ($1, $2)`, string(rc.TaskID()), rc.Attempt()); err != nil {
		return GrowResult{}, err
	}
	if p.Tx {
		return g.growTx(ctx, rc, p)
	}
	err := rc.AddNodes(ctx, p.Add)
	if err == nil {
		return GrowResult{}, nil
	}
	if errors.Is(err, api.ErrHalt) {
		return GrowResult{}, err
	}
	return GrowResult{Err: err.Error(), Invalid: errors.Is(err, api.ErrInvalid), Conflict: errors.Is(err, api.ErrConflict)}, nil
}

// growTx adds p.Add in a transaction that also writes the run's effect,
// and commits or rolls it back.
func (g grow) growTx(ctx context.Context, rc spi.RunContext, p GrowParams) (GrowResult, error) {
	tx, err := g.pool.Begin(ctx)
	if err != nil {
		return GrowResult{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `INSERT INTO test_effect (task_id, step) VALUES ($1, 1)`, string(rc.TaskID())); err != nil {
		return GrowResult{}, err
	}
	if err := rc.AddNodesTx(ctx, tx, p.Add); err != nil {
		return GrowResult{}, err
	}
	var res GrowResult
	id := string(rc.TaskID())
	prefix := id[:strings.LastIndex(id, "/")+1] // the workflow's id and a slash
	for _, n := range p.Add.Nodes {
		var seen int
		if err := g.pool.QueryRow(ctx, `SELECT count(*) FROM stint_task WHERE id = $1`, prefix+n.Name).Scan(&seen); err != nil {
			return GrowResult{}, err
		}
		res.Seen += seen
	}
	if p.Rollback {
		return res, tx.Rollback(ctx)
	}
	return res, tx.Commit(ctx)
}

// mustJSON encodes v.
func mustJSON(v any) json.RawMessage {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return raw
}

// growNode is a workflow node of test.grow that adds add.
func growNode(name string, add api.WorkflowGrowth, deps ...string) api.WorkflowNode {
	return api.WorkflowNode{Name: name, Task: api.SubmitRequest{Behavior: growKind.ID, Params: mustJSON(GrowParams{Add: add})}, DependsOn: deps}
}

// growServer starts a server node that runs test.grow besides the test
// behaviors, and returns it: its own submits know test.grow.
func (e *env) growServer(node ...string) *impl.Server {
	e.t.Helper()
	name := append(node, "n1")[0]
	reg := testRegistry(e.pool, name, 5*time.Second)
	spi.MustRegister[GrowParams, GrowResult](reg, grow{pool: e.pool})
	return e.server(name, 5*time.Second, func(cfg *impl.ServerConfig) { cfg.Registry = reg })
}

// TestWorkflowGrowsWhileItRuns: a manifest node adds a fan-out of jobs
// whose width only its run knows and makes the waiting merge node wait for
// them; the merge and the finally node start only after every job ended,
// and the workflow counts the new nodes.
func TestWorkflowGrowsWhileItRuns(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.growServer()
	const jobs = 5
	add := api.WorkflowGrowth{AddDependencies: map[string][]string{}}
	for i := range jobs {
		name := fmt.Sprintf("job-%d", i)
		add.Nodes = append(add.Nodes, spanNode(name, 10*i, "manifest"))
		add.AddDependencies["merge"] = append(add.AddDependencies["merge"], name)
	}
	// A node added may depend on another new one and on an existing one.
	add.Nodes = append(add.Nodes, spanNode("check", 0, "job-0", "fetch"))
	fin := spanNode("notify", 0)
	fin.Finally = true
	sub, err := srv.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-grow", Nodes: []api.WorkflowNode{
		spanNode("fetch", 0),
		growNode("manifest", add, "fetch"),
		spanNode("merge", 0, "manifest"),
		fin,
	}})
	require.NoError(t, err)
	w, err := srv.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	manifest, _ := w.Node("manifest")
	require.JSONEq(t, `{}`, string(manifest.Task.Result), "AddNodes failed")
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.Equal(t, map[api.Status]int{api.StatusSuccess: 4 + jobs + 1}, w.Counts)

	merge, _ := w.Node("merge")
	require.ElementsMatch(t, []string{"manifest", "job-0", "job-1", "job-2", "job-3", "job-4"}, merge.DependsOn)
	notify, _ := w.Node("notify")
	require.True(t, notify.Finally)
	require.Len(t, notify.DependsOn, 4+jobs, "the finally node waits for the new nodes too")
	check, _ := w.Node("check")
	require.Equal(t, []string{"fetch", "job-0"}, check.DependsOn)
	for i := range jobs {
		job := fmt.Sprintf("wf-grow/job-%d", i)
		for _, after := range []string{"merge", "notify"} {
			require.Zero(t, e.count(`SELECT count(*) FROM test_span n, test_span d
				WHERE n.task_id = $1 AND d.task_id = $2 AND n.started < d.ended`, "wf-grow/"+after, job),
				"%s started before %s ended", after, job)
		}
	}
}

// TestWorkflowGrowthRefusesBadGraphs: each bad growth is refused, naming
// the problem, and adds nothing.
func TestWorkflowGrowthRefusesBadGraphs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.growServer()
	one := func(n api.WorkflowNode) []api.WorkflowNode { return []api.WorkflowNode{n} }
	fin := spanNode("fin", 0)
	fin.Finally = true
	cases := []struct {
		name     string
		add      api.WorkflowGrowth
		conflict bool
		want     string
	}{
		{name: "nothing", want: "no nodes to add"},
		{name: "cycle", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0, "merge")), AddDependencies: map[string][]string{"merge": {"x"}}},
			want: `cycle`},
		{name: "taken", add: api.WorkflowGrowth{Nodes: one(spanNode("merge", 0))}, want: `node "merge" exists`},
		{name: "unknown dependency", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0, "nope"))}, want: `"nope", which is not a node`},
		{name: "self", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0, "x"))}, want: "depends on itself"},
		{name: "twice", add: api.WorkflowGrowth{Nodes: []api.WorkflowNode{spanNode("x", 0), spanNode("x", 0)}}, want: "appears twice"},
		{name: "dependency twice", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0, "fetch", "fetch"))}, want: `names "fetch" twice`},
		{name: "gate twice", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0)), AddDependencies: map[string][]string{"merge": {"x", "x"}}},
			want: `names "x" twice`},
		{name: "on the finally node", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0, "fin"))}, want: "the finally node"},
		{name: "finally", add: api.WorkflowGrowth{Nodes: one(fin)}, want: "cannot be finally"},
		{name: "bad params", add: api.WorkflowGrowth{Nodes: one(api.WorkflowNode{Name: "x",
			Task: api.SubmitRequest{Behavior: plainKind.ID, Params: []byte(`{"sleep_ms": "long"}`)}})}, want: `node "x"`},
		{name: "unknown behavior", add: api.WorkflowGrowth{Nodes: one(api.WorkflowNode{Name: "x",
			Task: api.SubmitRequest{Behavior: "test.nope", Params: []byte(`{}`)}})}, want: "test.nope"},
		{name: "gate on an unknown node", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0)), AddDependencies: map[string][]string{"nope": {"x"}}},
			want: `"nope" is not a node`},
		{name: "gate on an old node", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0)), AddDependencies: map[string][]string{"merge": {"fetch"}}},
			want: `"fetch", which is not one of the new nodes`},
		{name: "gate on itself", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0)), AddDependencies: map[string][]string{"grower": {"x"}}},
			want: "it has started"},
		{name: "gate on an ended node", add: api.WorkflowGrowth{Nodes: one(spanNode("x", 0)), AddDependencies: map[string][]string{"fetch": {"x"}}},
			conflict: true, want: `node "fetch" cannot wait for new nodes: it is success`},
	}
	for i, tc := range cases {
		id := api.TaskID(fmt.Sprintf("wf-bad-%d", i))
		sub, err := srv.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: id, Nodes: []api.WorkflowNode{
			spanNode("fetch", 0),
			growNode("grower", tc.add, "fetch"),
			spanNode("merge", 0, "grower"),
			fin,
		}})
		require.NoError(t, err, tc.name)
		w, err := srv.AwaitWorkflow(e.ctx, sub.ID)
		require.NoError(t, err, tc.name)
		grower, _ := w.Node("grower")
		var res GrowResult
		require.NoError(t, json.Unmarshal(grower.Task.Result, &res), tc.name)
		require.Contains(t, res.Err, tc.want, tc.name)
		require.Equal(t, !tc.conflict, res.Invalid, "%s: %s", tc.name, res.Err)
		require.Equal(t, tc.conflict, res.Conflict, "%s: %s", tc.name, res.Err)
		require.Len(t, w.Nodes, 4, "%s: nothing added", tc.name)
		require.Equal(t, api.WorkflowSucceeded, w.State, tc.name)
	}
}

// TestWorkflowGrowthDecidesAtOnce: a node added with a dependency that
// failed already is skipped as it is stored, and so is the waiting node
// made to wait for it; the finally node still runs.
func TestWorkflowGrowthDecidesAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.growServer()
	grower := growNode("grower", api.WorkflowGrowth{Nodes: []api.WorkflowNode{spanNode("x", 0, "bad")},
		AddDependencies: map[string][]string{"merge": {"x"}}}, "bad")
	grower.Rule = api.RuleAllEnded
	fin := spanNode("fin", 0)
	fin.Finally = true
	sub, err := srv.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-grow-skip", Nodes: []api.WorkflowNode{
		failNode("bad"), grower, spanNode("merge", 0, "grower"), fin,
	}})
	require.NoError(t, err)
	w, err := srv.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	g, _ := w.Node("grower")
	require.JSONEq(t, `{}`, string(g.Task.Result), "AddNodes failed")
	require.Equal(t, api.WorkflowFailed, w.State)
	require.Equal(t, 2, w.Skipped)
	for _, name := range []string{"x", "merge"} {
		n, ok := w.Node(name)
		require.True(t, ok, name)
		require.Equal(t, api.StatusFailure, n.Task.Status, name)
		require.Equal(t, api.CodeSkipped, n.Task.Error.Code, name)
	}
	x, _ := w.Node("x")
	require.Contains(t, x.Task.Error.Message, "bad")
	f, _ := w.Node("fin")
	require.Equal(t, api.StatusSuccess, f.Task.Status)
	require.Zero(t, e.count(`SELECT count(*) FROM test_span WHERE task_id IN ('wf-grow-skip/x', 'wf-grow-skip/merge')`))
}

// TestWorkflowGrowthInTheRunsTransaction: nodes added with AddNodesTx
// exist once the run's transaction commits, with its own writes, and
// not at all when it rolls back.
func TestWorkflowGrowthInTheRunsTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.growServer()
	for _, rollback := range []bool{false, true} {
		id := api.TaskID(fmt.Sprintf("wf-grow-tx-%t", rollback))
		add := api.WorkflowGrowth{Nodes: []api.WorkflowNode{spanNode("job-0", 0, "grower"), spanNode("job-1", 0, "grower")},
			AddDependencies: map[string][]string{"merge": {"job-0", "job-1"}}}
		grower := api.WorkflowNode{Name: "grower", Task: api.SubmitRequest{Behavior: growKind.ID,
			Params: mustJSON(GrowParams{Add: add, Tx: true, Rollback: rollback})}}
		sub, err := srv.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: id, Nodes: []api.WorkflowNode{grower, spanNode("merge", 0, "grower")}})
		require.NoError(t, err)
		w, err := srv.AwaitWorkflow(e.ctx, sub.ID)
		require.NoError(t, err)
		require.Equal(t, api.WorkflowSucceeded, w.State)
		g, _ := w.Node("grower")
		var res GrowResult
		require.NoError(t, json.Unmarshal(g.Task.Result, &res))
		require.Zero(t, res.Seen, "nodes added in a transaction are invisible before its commit")
		effects := e.count(`SELECT count(*) FROM test_effect WHERE task_id = $1`, string(id)+"/grower")
		merge, _ := w.Node("merge")
		if rollback {
			require.Len(t, w.Nodes, 2, "a rolled-back growth adds nothing")
			require.Zero(t, effects)
			require.Equal(t, []string{"grower"}, merge.DependsOn)
			continue
		}
		require.Len(t, w.Nodes, 4)
		require.Equal(t, 1, effects)
		require.ElementsMatch(t, []string{"grower", "job-0", "job-1"}, merge.DependsOn)
		for _, job := range []string{"job-0", "job-1"} {
			require.Zero(t, e.count(`SELECT count(*) FROM test_span m, test_span j
				WHERE m.task_id = $1 AND j.task_id = $2 AND m.started < j.ended`, string(id)+"/merge", string(id)+"/"+job),
				"merge started before %s ended", job)
		}
	}
}
