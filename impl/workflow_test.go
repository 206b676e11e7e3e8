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
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// allEdges is every edge of the workflows (task_id runs after depends_on):
// the edge rows and the single dependencies nodes keep in their column.
const allEdges = `(SELECT task_id, depends_on FROM stint_dependency
    UNION ALL SELECT id, depends_on FROM stint_task WHERE depends_on IS NOT NULL)`

// spanNode is a workflow node of test.plain that records its run in
// test_span and sleeps ms.
func spanNode(name string, ms int, deps ...string) api.WorkflowNode {
	return api.WorkflowNode{Name: name, Task: flowReq(plainKind, FlowParams{ID: name, SleepMS: ms}), DependsOn: deps}
}

// failNode is a workflow node of test.work that fails for good.
func failNode(name string, deps ...string) api.WorkflowNode {
	return api.WorkflowNode{Name: name, Task: workReq(workKind, WorkParams{Key: name, FailUntil: 9, Permanent: true}), DependsOn: deps}
}

// TestWorkflowRunsEachNodeAfterItsDependencies runs a diamond with a
// finally node and checks, by the database's clock, that no node started
// before its dependencies ended.
func TestWorkflowRunsEachNodeAfterItsDependencies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	fin := spanNode("notify", 0)
	fin.Finally = true
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-diamond", Nodes: []api.WorkflowNode{
		spanNode("fetch", 20),
		spanNode("left", 10, "fetch"),
		spanNode("right", 30, "fetch"),
		spanNode("merge", 0, "left", "right"),
		fin,
	}})
	require.NoError(t, err)
	require.True(t, sub.Created)
	require.Equal(t, api.TaskID("wf-diamond/merge"), sub.Nodes["merge"])

	w, err := c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.Equal(t, map[api.Status]int{api.StatusSuccess: 5}, w.Counts)
	merge, ok := w.Node("merge")
	require.True(t, ok)
	require.Equal(t, []string{"left", "right"}, merge.DependsOn)

	edges := map[string][]string{"left": {"fetch"}, "right": {"fetch"}, "merge": {"left", "right"},
		"notify": {"fetch", "left", "right", "merge"}}
	for node, deps := range edges {
		for _, d := range deps {
			require.Zero(t, e.count(`SELECT count(*) FROM test_span n, test_span d
				WHERE n.task_id = $1 AND d.task_id = $2 AND n.started < d.ended`, "wf-diamond/"+node, "wf-diamond/"+d),
				"%s started before %s ended", node, d)
		}
	}
	task, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status, "the workflow's own task records its outcome")

	again, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-diamond", Nodes: []api.WorkflowNode{spanNode("other", 0)}})
	require.NoError(t, err)
	require.False(t, again.Created, "a second submit of the id shares the first")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE id = 'wf-diamond/other'`))
}

// TestWorkflowFailureRules fails one node and checks each rule's answer:
// dependents by default are skipped transitively, naming the dependency;
// all_ended and none_failed (over a skipped dependency) decide as their
// rules say; finally runs whatever happened.
func TestWorkflowFailureRules(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	rule := func(n api.WorkflowNode, r api.Rule) api.WorkflowNode { n.Rule = r; return n }
	fin := spanNode("finally", 0)
	fin.Finally = true
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-rules", Nodes: []api.WorkflowNode{
		spanNode("ok", 0),
		failNode("bad"),
		spanNode("after-bad", 0, "bad"),
		spanNode("after-skipped", 0, "after-bad"),
		rule(spanNode("cleanup", 0, "bad", "ok"), api.RuleAllEnded),
		rule(spanNode("any", 0, "bad", "ok"), api.RuleAnySucceeded),
		rule(spanNode("none-failed-skip", 0, "after-bad", "ok"), api.RuleNoneFailed),
		rule(spanNode("none-failed-fail", 0, "bad"), api.RuleNoneFailed),
		fin,
	}})
	require.NoError(t, err)
	w, err := c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowFailed, w.State)

	want := map[string]string{
		"ok": "success", "bad": "failure", "after-bad": api.CodeSkipped, "after-skipped": api.CodeSkipped,
		"cleanup": "success", "any": "success", "none-failed-skip": "success", "none-failed-fail": api.CodeSkipped,
		"finally": "success",
	}
	for name, outcome := range want {
		n, ok := w.Node(name)
		require.True(t, ok, name)
		require.True(t, n.Task.Finished(), name)
		got := string(n.Task.Status)
		if n.Task.Error != nil && n.Task.Error.Code == api.CodeSkipped {
			got = api.CodeSkipped
		}
		require.Equal(t, outcome, got, name)
	}
	skipped, _ := w.Node("after-bad")
	require.Contains(t, skipped.Task.Error.Message, "bad")
	transitive, _ := w.Node("after-skipped")
	require.Contains(t, transitive.Task.Error.Message, "after-bad")
	require.Equal(t, 3, w.Skipped)
	require.Zero(t, e.count(`SELECT count(*) FROM test_span WHERE task_id IN ('wf-rules/after-bad', 'wf-rules/after-skipped', 'wf-rules/none-failed-fail')`),
		"a skipped node never runs")
	task, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusFailure, task.Status)
}

// TestWorkflowNodeWaitsOnItsDependencies checks the waiting state and
// its reason, read through Get and GetWorkflow, on a workflow no server
// runs.
func TestWorkflowNodeWaitsOnItsDependencies(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{Nodes: []api.WorkflowNode{
		spanNode("a", 0), spanNode("b", 0), spanNode("c", 0, "b", "a"),
	}})
	require.NoError(t, err)
	task, err := c.Get(e.ctx, sub.Nodes["c"])
	require.NoError(t, err)
	require.Equal(t, api.StatusWaiting, task.Status)
	require.Nil(t, task.ScheduleNotBefore)
	require.Equal(t, &api.Wait{Reason: api.WaitDependencies, Dependencies: []string{"a", "b"}}, task.Waiting)
	w, err := c.GetWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowRunning, w.State)
	require.Equal(t, map[api.Status]int{api.StatusScheduled: 2, api.StatusWaiting: 1}, w.Counts)
	node, ok := w.Node("c")
	require.True(t, ok)
	require.Equal(t, task.Waiting, node.Task.Waiting, "the workflow's node waits as the task does")
	require.Equal(t, []string{"a", "b"}, node.DependsOn)

	require.NoError(t, c.CancelWorkflow(e.ctx, sub.ID))
	w, err = c.GetWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowCancelled, w.State)
	for _, n := range w.Nodes {
		require.True(t, n.Task.Finished(), n.Name)
		require.Equal(t, api.CodeCancelled, n.Task.Error.Code, n.Name)
	}
	_, err = c.GetWorkflow(e.ctx, sub.Nodes["a"])
	require.ErrorIs(t, err, api.ErrNotFound, "a node is not a workflow")
	require.ErrorIs(t, c.CancelWorkflow(e.ctx, "no-such-workflow"), api.ErrNotFound)
}

// TestWorkflowRefusesBadGraphs submits each kind of bad workflow and
// checks that it is refused as invalid, naming the problem, with nothing
// stored.
func TestWorkflowRefusesBadGraphs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	n := func(name string, deps ...string) api.WorkflowNode { return spanNode(name, 0, deps...) }
	withFinally := func(name string, deps ...string) api.WorkflowNode { x := n(name, deps...); x.Finally = true; return x }
	tooMany := make([]api.WorkflowNode, api.MaxWorkflowNodes+1)
	for i := range tooMany {
		tooMany[i] = n(fmt.Sprint("n", i))
	}
	cases := map[string]struct {
		req  api.WorkflowRequest
		want string
	}{
		"empty":          {api.WorkflowRequest{}, "at least one node"},
		"too many":       {api.WorkflowRequest{Nodes: tooMany}, "over the limit of 100000"},
		"cycle":          {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a", "c"), n("b", "a"), n("c", "b"), n("d")}}, `cycle: "a" -> "c" -> "b" -> "a"`},
		"unknown dep":    {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a", "ghost")}}, `"a" depends on "ghost"`},
		"self":           {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a", "a")}}, `"a" depends on itself`},
		"duplicate":      {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a"), n("a")}}, `"a" appears twice`},
		"dep twice":      {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a"), n("b", "a", "a")}}, `names "a" twice`},
		"bad name":       {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a b")}}, `node name "a b"`},
		"bad id":         {api.WorkflowRequest{ID: "x/y", Nodes: []api.WorkflowNode{n("a")}}, "without a slash"},
		"long id":        {api.WorkflowRequest{ID: api.TaskID(strings.Repeat("w", 64)), Nodes: []api.WorkflowNode{n("a")}}, "at most 63"},
		"bad rule":       {api.WorkflowRequest{Nodes: []api.WorkflowNode{{Name: "a", Task: n("a").Task, Rule: "sometimes"}}}, `rule "sometimes"`},
		"node task id":   {api.WorkflowRequest{Nodes: []api.WorkflowNode{{Name: "a", Task: api.SubmitRequest{Behavior: plainKind.ID, ID: "mine"}}}}, "task.id must be empty"},
		"two finally":    {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a"), withFinally("f1"), withFinally("f2")}}, "both finally"},
		"finally deps":   {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a"), withFinally("f", "a")}}, "takes no depends_on"},
		"on finally":     {api.WorkflowRequest{Nodes: []api.WorkflowNode{withFinally("f"), n("a", "f")}}, "the finally node"},
		"unknown kind":   {api.WorkflowRequest{Nodes: []api.WorkflowNode{{Name: "x", Task: api.SubmitRequest{Behavior: "no.such"}}}}, `invalid nodes[0].task.behavior: "no.such" is not registered (node "x")`},
		"bad params":     {api.WorkflowRequest{Nodes: []api.WorkflowNode{n("a"), {Name: "w", Task: api.SubmitRequest{Behavior: workKind.ID, Params: json.RawMessage(`{"key":""}`)}}}}, `invalid nodes[1].task.params`},
		"bad priority":   {api.WorkflowRequest{Nodes: []api.WorkflowNode{{Name: "p", Task: api.SubmitRequest{Behavior: plainKind.ID, Priority: new(int(-1))}}}}, `invalid nodes[0].task.priority: -1 is outside 0..32767 (node "p")`},
		"bad json":       {api.WorkflowRequest{Nodes: []api.WorkflowNode{{Name: "j", Task: api.SubmitRequest{Behavior: plainKind.ID, Params: json.RawMessage(`{`)}}}}, `(node "j")`},
		"bad trace":      {api.WorkflowRequest{Trace: "bad\x00trace", Nodes: []api.WorkflowNode{n("a")}}, "trace"},
		"negative delay": {api.WorkflowRequest{Nodes: []api.WorkflowNode{{Name: "d", Task: api.SubmitRequest{Behavior: plainKind.ID, Delay: -time.Second}}}}, `invalid nodes[0].task.delay`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := c.SubmitWorkflow(e.ctx, tc.req)
			require.ErrorIs(t, err, api.ErrInvalid)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`))
	require.Zero(t, e.count(`SELECT count(*) FROM `+allEdges+` e`))
}

// doubleParams are the params of test.double: N, or twice the result of
// the workflow node From.
type doubleParams struct {
	N    int    `json:"n"`
	From string `json:"from,omitempty"`
}

// double is test.double: it reads its dependency's result with
// spi.NodeResult.
type double struct{}

var doubleKind = api.Kind[doubleParams, int]{ID: "test.double"}

func (double) Kind() api.Kind[doubleParams, int]             { return doubleKind }
func (double) TaskID(ids spi.IDs, _ doubleParams) api.TaskID { return ids.Unique() }
func (double) Run(ctx context.Context, rc spi.RunContext, p doubleParams) (int, error) {
	if p.From == "" {
		return p.N, nil
	}
	n, err := spi.NodeResult[int](ctx, rc, p.From)
	if errors.Is(err, api.ErrNotFound) {
		return 0, &api.TaskError{Code: "no_node", Message: err.Error()}
	}
	return 2 * n, err
}

// TestWorkflowNodeReadsItsDependencysResult chains three nodes, each
// doubling the result of the one before, and checks that a node outside
// any workflow reads no node.
func TestWorkflowNodeReadsItsDependencysResult(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second, func(c *impl.ServerConfig) { spi.MustRegister(c.Registry, double{}) })
	reg := spi.NewRegistry()
	spi.MustRegister(reg, double{})
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	node := func(name string, p doubleParams, deps ...string) api.WorkflowNode {
		raw, err := json.Marshal(p)
		require.NoError(t, err)
		return api.WorkflowNode{Name: name, Task: api.SubmitRequest{Behavior: doubleKind.ID, Params: raw}, DependsOn: deps}
	}
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{Nodes: []api.WorkflowNode{
		node("a", doubleParams{N: 3}), node("b", doubleParams{From: "a"}, "a"), node("c", doubleParams{From: "b"}, "b"),
		node("lost", doubleParams{From: "nobody"}),
	}})
	require.NoError(t, err)
	w, err := c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	last, _ := w.Node("c")
	require.JSONEq(t, "12", string(last.Task.Result))
	lost, _ := w.Node("lost")
	require.Equal(t, api.StatusFailure, lost.Task.Status)
	require.Contains(t, lost.Task.Error.Message, "not found")

	f, err := api.Submit(e.ctx, c, doubleKind, doubleParams{From: "a"})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.ErrorContains(t, err, "not found", "a task outside any workflow reads no node")
}

// TestWorkflowTaskIsNeverSubmittedAlone checks that a plain submit of the
// workflow behavior is refused.
func TestWorkflowTaskIsNeverSubmittedAlone(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second)
	_, err := srv.Submit(e.ctx, api.SubmitRequest{Behavior: api.WorkflowBehavior})
	require.ErrorIs(t, err, api.ErrInvalid)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`))
}

// TestWorkflowNodesLeaveWithTheirWorkflow checks that the cleanup keeps a
// finished node while its workflow runs (a dependent may read it), and
// deletes the nodes and edges of a finished workflow with it.
func TestWorkflowNodesLeaveWithTheirWorkflow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	gated := api.WorkflowNode{Name: "b", Task: flowReq(plainKind, FlowParams{ID: "b", Gate: "open"}), DependsOn: []string{"a"}}
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-clean", Nodes: []api.WorkflowNode{spanNode("a", 0), gated}})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "b to run", func() bool {
		return e.count(`SELECT count(*) FROM stint_task WHERE id = 'wf-clean/b' AND status = 'running'`) == 1
	})
	deleted, err := e.st.DeleteFinished(e.ctx, store.DeleteFinishedParams{Behavior: plainKind.ID, Status: api.StatusSuccess, Limit: 100})
	require.NoError(t, err)
	require.Zero(t, deleted, "a node of a running workflow stays")

	_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id, step) VALUES ('open', 1)`)
	require.NoError(t, err)
	_, err = c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	deleted, err = e.st.DeleteFinished(e.ctx, store.DeleteFinishedParams{Behavior: api.WorkflowBehavior, Status: api.StatusSuccess, Limit: 100})
	require.NoError(t, err)
	require.Equal(t, 1, deleted)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`))
	require.Zero(t, e.count(`SELECT count(*) FROM `+allEdges+` e`))
}

// TestWorkflowRetryRunsTheFailedNodesAgain fails a node once, lets its
// dependents be skipped, and retries the workflow: the failed and skipped
// nodes run, the succeeded one keeps its single run, the finally node
// runs again after them, and the workflow succeeds.
func TestWorkflowRetryRunsTheFailedNodesAgain(t *testing.T) {
	t.Parallel()
	e := setup(t)
	fix := &fixable{pool: e.pool}
	e.server("n1", 5*time.Second, func(c *impl.ServerConfig) { spi.MustRegister(c.Registry, fix) })
	reg := spi.NewRegistry()
	require.NoError(t, reg.Merge(testRegistry(e.pool, "client", time.Second)))
	spi.MustRegister(reg, fix)
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	flaky := api.WorkflowNode{Name: "flaky", Task: api.SubmitRequest{Behavior: fixableKind.ID}}
	fin := spanNode("fin", 0)
	fin.Finally = true
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-retry", Nodes: []api.WorkflowNode{
		spanNode("ok", 0), flaky, spanNode("after", 0, "flaky", "ok"), fin,
	}})
	require.NoError(t, err)
	require.ErrorIs(t, c.RetryWorkflow(e.ctx, sub.ID), api.ErrConflict, "a running workflow is not retried")
	w, err := c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowFailed, w.State)

	_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id, step) VALUES ('fixed', 1)`)
	require.NoError(t, err)
	require.NoError(t, c.RetryWorkflow(e.ctx, sub.ID))
	w, err = c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowSucceeded, w.State)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_span WHERE task_id = 'wf-retry/ok'`), "a succeeded node keeps its result")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM test_span WHERE task_id = 'wf-retry/after'`))
	require.Equal(t, 2, e.count(`SELECT count(*) FROM test_span WHERE task_id = 'wf-retry/fin'`), "the finally node runs after every run of the workflow")
	require.Zero(t, e.count(`SELECT count(*) FROM test_span n, test_span d
		WHERE n.task_id = 'wf-retry/fin' AND d.task_id = 'wf-retry/after' AND n.ended > d.ended AND n.started < d.ended`),
		"the finally node's second run starts after the retried nodes ended")
	require.ErrorIs(t, c.RetryWorkflow(e.ctx, sub.ID), api.ErrConflict, "no node failed")
	require.ErrorIs(t, c.RetryWorkflow(e.ctx, "wf-retry/ok"), api.ErrNotFound)
}

// fixable is test.fixable: it fails for good until test_effect holds a row
// of task id "fixed".
type fixable struct{ pool *pgxpool.Pool }

var fixableKind = api.Kind[struct{}, struct{}]{ID: "test.fixable"}

func (*fixable) Kind() api.Kind[struct{}, struct{}]        { return fixableKind }
func (*fixable) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (f *fixable) Run(ctx context.Context, _ spi.RunContext, _ struct{}) (struct{}, error) {
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM test_effect WHERE task_id = 'fixed'`).Scan(&n); err != nil {
		return struct{}{}, err
	}
	if n == 0 {
		return struct{}{}, &api.TaskError{Code: "broken", Message: "not fixed yet"}
	}
	return struct{}{}, nil
}

// TestWorkflowUnderTheRoles submits and retries a workflow as the client
// role and runs it as the node role.
func TestWorkflowUnderTheRoles(t *testing.T) {
	t.Parallel()
	e := setup(t)
	nodeStore, err := postgres.Open(e.ctx, e.asRole("stint_node"))
	require.NoError(t, err)
	t.Cleanup(nodeStore.Close)
	srv, err := impl.NewServer(nodeStore, impl.ServerConfig{Node: "role-node", Registry: testRegistry(e.pool, "role-node", 5*time.Second),
		PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, srv.Start(e.ctx))
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	clientStore, err := postgres.Open(e.ctx, e.asRole("stint_client"))
	require.NoError(t, err)
	t.Cleanup(clientStore.Close)
	c, err := impl.NewClient(clientStore, impl.ClientConfig{Registry: testRegistry(e.pool, "client", time.Second)})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	sub, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{Nodes: []api.WorkflowNode{
		failNode("bad"), spanNode("after", 0, "bad"),
	}})
	require.NoError(t, err)
	w, err := c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowFailed, w.State)
	require.NoError(t, c.RetryWorkflow(e.ctx, sub.ID))
	w, err = c.AwaitWorkflow(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.WorkflowFailed, w.State, "the node fails again, for good")
}

// TestAFinishStartsTheNodesItMakesReadyHere: the transaction that records
// a node's end starts its dependents that became ready on the same node
// (a local start), in the statement that makes them ready, with no claim
// in between; with local starts off, the claimers start them.
func TestAFinishStartsTheNodesItMakesReadyHere(t *testing.T) {
	t.Parallel()
	for _, local := range []bool{true, false} {
		t.Run(fmt.Sprint("local=", local), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			srv := e.server("n1", 5*time.Second, func(c *impl.ServerConfig) {
				c.NoLocalStart = !local
				if local {
					// Once it claimed the root, the claimer sleeps:
					// every other node must start in the finish of
					// its dependency, or it never starts.
					c.PollInterval, c.FetchCooldown = time.Hour, time.Hour
				}
			})
			c := e.client()
			// The root waits at a gate until no claim is in flight: a
			// claim under way holds the node's free slots (a trailing
			// due notification of the submit starts one), and a finish
			// then has none to offer.
			root := flowReq(plainKind, FlowParams{ID: "root", Gate: "wf-local/root"})
			nodes := []api.WorkflowNode{{Name: "root", Task: root}}
			for i := range 4 {
				prev := "root"
				if i > 0 {
					prev = fmt.Sprint("chain", i-1)
				}
				nodes = append(nodes, spanNode(fmt.Sprint("chain", i), 0, prev))
			}
			for i := range 10 {
				nodes = append(nodes, spanNode(fmt.Sprint("leaf", i), 0, "root"))
			}
			_, err := c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-local", Nodes: nodes})
			require.NoError(t, err)
			impl.FlushKicks(c)
			waitFor(t, time.Minute, "the root runs and no claim is in flight", func() bool {
				return e.count(`SELECT count(*) FROM stint_task WHERE id = 'wf-local/root' AND status = 'running'`) == 1 &&
					impl.ClaimsInFlight(srv) == 0
			})
			_, err = e.pool.Exec(e.ctx, `INSERT INTO test_effect (task_id) VALUES ('wf-local/root')`)
			require.NoError(t, err)
			// The nodes, not the workflow's own task: with the claimer
			// asleep, nothing claims that one.
			waitFor(t, time.Minute, "every node succeeded", func() bool {
				return e.count(`SELECT count(*) FROM stint_task WHERE parent_id = 'wf-local' AND status = 'success'`) == len(nodes)
			})

			// A node started by the statement that made it ready has
			// both events, scheduled and running, in that statement's
			// row of the change feed; one a claim started has them in
			// two rows.
			dependents := e.count(`SELECT count(*) FROM stint_task WHERE parent_id = 'wf-local' AND id <> 'wf-local/root'`)
			require.Equal(t, 14, dependents)
			here := e.count(`SELECT count(DISTINCT n.id) FROM stint_task n, stint_change c
				WHERE n.parent_id = 'wf-local' AND n.id = ANY(c.task_ids)
				  AND (SELECT count(*) FROM unnest(c.task_ids, c.statuses) AS x(id, status)
				       WHERE x.id = n.id AND x.status IN ('scheduled', 'running')) = 2`)
			if local {
				require.Equal(t, dependents, here, "every dependent started in its dependency's finish")
			} else {
				require.Zero(t, here, "no dependent starts in its dependency's finish without local starts")
			}
		})
	}
}

// TestAWorkflowCarriesItsOwnRetention: a workflow submitted with a
// retention leaves with its nodes and edges once that passed after it
// ended, while another without one stays; a bad retention is refused.
func TestAWorkflowCarriesItsOwnRetention(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("n1", 5*time.Second)
	c := e.client()
	for _, req := range []api.WorkflowRequest{
		{ID: "wf-brief", Retention: time.Nanosecond, Nodes: []api.WorkflowNode{spanNode("a", 0), spanNode("b", 0, "a")}},
		{ID: "wf-kept", Nodes: []api.WorkflowNode{spanNode("a", 0)}},
	} {
		_, err := c.SubmitWorkflow(e.ctx, req)
		require.NoError(t, err)
		_, err = c.AwaitWorkflow(e.ctx, req.ID)
		require.NoError(t, err)
	}
	w, err := c.Get(e.ctx, "wf-brief")
	require.NoError(t, err)
	require.Equal(t, time.Microsecond, w.Retention)
	waitFor(t, 30*time.Second, "the brief workflow to expire", func() bool {
		n, err := e.st.DeleteExpired(e.ctx, 100)
		require.NoError(t, err)
		return len(n) > 0
	})
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE id = 'wf-brief' OR parent_id = 'wf-brief'`))
	require.Zero(t, e.count(`SELECT count(*) FROM `+allEdges+` e WHERE task_id LIKE 'wf-brief/%'`))
	require.Equal(t, 2, e.count(`SELECT count(*) FROM stint_task WHERE id = 'wf-kept' OR parent_id = 'wf-kept'`))

	_, err = c.SubmitWorkflow(e.ctx, api.WorkflowRequest{ID: "wf-bad", Retention: -time.Second, Nodes: []api.WorkflowNode{spanNode("a", 0)}})
	require.ErrorIs(t, err, api.ErrInvalid)
	_, err = c.GetWorkflow(e.ctx, "wf-bad")
	require.ErrorIs(t, err, api.ErrNotFound)
}
